"""The node's malloc thresholds (overlay/malloc.py, tune_malloc): a megabyte body copied and freed
again and again must not come in fresh pages each time (issue 14: ~945 page faults per 1 MB
round trip through two cores, a fifth of their work)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from c2dtn.overlay.malloc import TRIM_BYTES

BURSTS = """
import os, resource, sys
if sys.argv[1] == "tuned":
    from c2dtn.overlay.malloc import tune_malloc
    if not tune_malloc():
        print("not glibc"); sys.exit(0)
body = os.urandom(1 << 20)
def burst():  # four copies alive at once, then freed: as sealing and opening do
    blocks = [b"x" + body for _ in range(4)]
    del blocks
burst(); burst()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    burst()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 80)
"""


def faults_per_block(mode: str) -> float | None:
    out = subprocess.run([sys.executable, "-c", BURSTS, mode], capture_output=True, text=True, check=True).stdout
    return None if out.startswith("not glibc") else float(out)


def test_megabyte_copies_reuse_the_heap_once_tuned():
    tuned = faults_per_block("tuned")
    if tuned is None:
        pytest.skip("the C library is not glibc: mallopt's thresholds do not apply")
    untuned = faults_per_block("default")
    assert untuned > 100, f"glibc's defaults fault in a megabyte block's pages ({untuned:.0f} per block)"
    assert tuned < 5, f"tuned: {tuned:.1f} page faults per megabyte block, expected none"
    assert 4 << 20 < TRIM_BYTES  # the burst's four blocks stay with the process
