"""The agents `make bpas` builds from source: each one's programs run and say what they
are, or the test skips with the build's own error line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from c2dtn.overlay.agents import builds

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.bpa


def _home(name: str) -> Path:
    try:
        return builds.built(name)
    except builds.NotBuilt as e:
        pytest.skip(str(e))


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


def test_hdtn_was_built_with_its_one_process_daemon():
    home = _home("hdtn")
    out = subprocess.run([home / "bin" / "hdtn-one-process", "--help"], capture_output=True, text=True, timeout=20)
    text = out.stdout + out.stderr
    assert "This is HDTN version 1.3.1" in text and "--contact-plan-file" in text, text[-2000:]


def test_the_ion_helper_says_in_a_frame_when_there_is_no_node_to_attach_to(tmp_path):
    """c2dtn-ionbp (overlay/agents/ion_bp.c) keeps ION's own messages off its frame channel.
    Run in an IPC namespace of its own with a private /dev/shm: ION's global semaphore table
    and working memory are made for it and go with it, whatever else runs on the host."""
    _home("ion")
    helper = ROOT / ".tools" / "c2dtn-ionbp"
    if not helper.exists():
        pytest.skip("c2dtn-ionbp is not built: run `make bpas`")
    p = subprocess.run(
        ["unshare", "--ipc", "--mount", "sh", "-c", f"mount -t tmpfs c2-ionshm /dev/shm && exec {helper} ipn:9.1"],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        env={"ION_NODE_LIST_DIR": str(tmp_path)},
    )
    if p.returncode and b"unshare" in p.stderr and b"Operation not permitted" in p.stderr:
        pytest.skip("needs root for an IPC namespace: " + p.stderr.decode().strip())
    n = int.from_bytes(p.stdout[:4], "big")
    assert p.stdout[4:5] == b"X" and n == len(p.stdout) - 4, p.stdout[:200]
    assert b"cannot attach to ION" in p.stdout and p.returncode == 1
