"""glibc's malloc thresholds for the node process.

glibc serves blocks of 128 kB and up with mmap and trims freed heap past 128 kB, so every
megabyte body the node copies came in fresh pages (decision 0006).  Blocks up to the largest
container come from the heap, and up to TRIM_BYTES of freed heap stay with the process.  No
library sets them: mallopt(3) via ctypes.
"""

from __future__ import annotations

MMAP_THRESHOLD_BYTES = (8 << 20) + (64 << 10)
TRIM_BYTES = 32 << 20


def tune_malloc() -> bool:
    """Set glibc's thresholds (above); False where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES) and mallopt(m_trim_threshold, TRIM_BYTES))
