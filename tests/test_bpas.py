"""The agents `make bpas` builds from source: each one's programs run and say what they
are, or the test skips with the build's own error line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from c2dtn.overlay.agents import builds

ROOT = Path(__file__).resolve().parent.parent


def _home(name: str) -> Path:
    try:
        return builds.built(name)
    except builds.NotBuilt as e:
        pytest.skip(str(e))


def test_the_makefile_builds_the_versions_the_drivers_look_for():
    mk = (ROOT / "Makefile").read_text()
    for name, var in (("ion", "ION_VERSION"), ("ibrdtn", "IBRDTN_VERSION")):
        assert re.search(rf"^{var} := {re.escape(builds.VERSIONS[name])}$", mk, re.M), var


def test_ion_was_built_with_bundle_protocol_7_and_its_admin_programs():
    home = _home("ion")
    for prog in ("ionadmin", "bpadmin", "ipnadmin", "bpversion", "ionunlock", "udpcli", "tcpcli"):
        assert (home / "bin" / prog).exists(), prog
    out = subprocess.run([home / "bin" / "bpversion"], capture_output=True, text=True, timeout=10)
    assert "bpv7" in out.stdout + out.stderr
    assert (home / "include" / "bp.h").exists() and list((home / "lib").glob("libbp.so*"))


def test_ibrdtn_was_built_with_its_daemon_and_sqlite_storage():
    home = _home("ibrdtn")
    out = subprocess.run([home / "sbin" / "dtnd", "--version"], capture_output=True, text=True, timeout=10)
    assert "IBR-DTN" in out.stdout + out.stderr, out.stdout + out.stderr
