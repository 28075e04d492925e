"""Where `make bpas` puts the agents it builds from source, and why one is missing.

Each is built once per machine into the cache beside dtn7-rs ($C2DTN_CACHE, by default
~/.cache/c2dtn), in a folder keyed by version; the Makefile builds the same versions.  A
failed build leaves <folder>.failed with the build's own error line: a driver or test that
needs the agent says that line instead of a bare "not found".
"""

from __future__ import annotations

import os
from pathlib import Path

from c2dtn.errors import C2Error

VERSIONS = {
    "ion": "4.1.3",
    "ibrdtn": "103bab3d",
    "hdtn": "1.3.1",
}  # the Makefile's ION_VERSION, IBRDTN_VERSION, HDTN_VERSION


class NotBuilt(C2Error):
    pass


def cache_dir() -> Path:
    """The agents' build cache (dtn7-rs's too): $C2DTN_CACHE, else ~/.cache/c2dtn."""
    return Path(os.environ.get("C2DTN_CACHE", Path.home() / ".cache" / "c2dtn"))


def built(name: str) -> Path:
    """The install folder of a BPA built by `make bpas`; NotBuilt says why it is not there."""
    folder = cache_dir() / f"{name}-{VERSIONS[name]}"
    if (folder / ".built").exists():
        return folder
    failed = folder.with_name(folder.name + ".failed")
    if failed.exists():
        raise NotBuilt(
            f"{name} {VERSIONS[name]} did not build: {failed.read_text().strip()} "
            f"(log: {folder}.log; `BPA_RETRY=1 make bpas` tries again)"
        )
    raise NotBuilt(f"{name} {VERSIONS[name]} is not built: run `make bpas` (from ../shared/bpa-src/)")


def not_built(name: str) -> str | None:
    """Why a BPA `make bpas` builds is not there (its build's own error line), else None."""
    try:
        built(name)
        return None
    except NotBuilt as e:
        return str(e)
