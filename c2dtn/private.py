"""Files that hold orders and keys: their owner's alone (0600 in a 0700 folder), whatever the
umask, and put right when an older version left them readable by others."""

from __future__ import annotations

import os
from pathlib import Path

SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def private_dir(path: str | Path) -> Path:
    """Make `path` (and missing parents) a folder only its owner can enter."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(p, 0o700)
    return p


def private_file(path: str | Path) -> Path:
    """Create `path` empty if it is missing; either way, readable and writable by its owner alone."""
    p = Path(path)
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(p, 0o600)
    return p


def private_sqlite(path: str | Path) -> None:
    """Before SQLite opens `path`: its folder 0700, the file 0600 (SQLite gives its WAL and
    shared-memory files the database file's mode), and any side files left by an older run 0600."""
    p = Path(path)
    private_dir(p.parent)
    private_file(p)
    for suffix in SQLITE_SIDE_FILES[1:]:
        side = Path(str(p) + suffix)
        if side.exists():
            os.chmod(side, 0o600)
