"""Where `make bpas` puts the agents it builds from source, and why one is missing.

Each is built once per machine into the cache beside the default agent ($C2DTN_CACHE, by
default ~/.cache/c2dtn), in a folder keyed by the version its build fragment (make/<name>.mk)
names.  A failed build leaves <folder>.failed with the build's own error line: a driver or test
that needs the agent says that line instead of a bare "not found".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from c2dtn.errors import C2Error

MAKE_DIR = Path(__file__).parent / "make"


def version(name: str, make_dir: Path = MAKE_DIR) -> str:
    """The version the agent's build fragment builds (make/<name>.mk: <NAME>_VERSION := ...);
    make_dir: where the fragment is (topologies/make for the testbed's CORE)."""
    text = (make_dir / f"{name}.mk").read_text()
    m = re.search(rf"^{name.upper()}_VERSION\s*:=\s*(\S+)", text, re.M)
    if m is None:
        raise C2Error(f"make/{name}.mk names no {name.upper()}_VERSION")
    return m.group(1)


class NotBuilt(C2Error):
    pass


def cache_dir() -> Path:
    """The agents' build cache (dtn7-rs's too): $C2DTN_CACHE, else ~/.cache/c2dtn."""
    return Path(os.environ.get("C2DTN_CACHE", Path.home() / ".cache" / "c2dtn"))


def built(name: str, make_dir: Path = MAKE_DIR) -> Path:
    """The install folder of a BPA built by `make bpas`; NotBuilt says why it is not there."""
    folder = cache_dir() / f"{name}-{version(name, make_dir)}"
    if (folder / ".built").exists():
        return folder
    failed = folder.with_name(folder.name + ".failed")
    if failed.exists():
        raise NotBuilt(
            f"{name} {version(name, make_dir)} did not build: {failed.read_text().strip()} "
            f"(log: {folder}.log; `BPA_RETRY=1 make bpas` tries again)"
        )
    raise NotBuilt(f"{name} {version(name, make_dir)} is not built: run `make bpas` (from ../shared/bpa-src/)")


def not_built(name: str) -> str | None:
    """Why a BPA `make bpas` builds is not there (its build's own error line), else None."""
    try:
        built(name)
        return None
    except NotBuilt as e:
        return str(e)
