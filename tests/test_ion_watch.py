"""ion-run.sh, the keeper of an ION node, watches the daemons the node started: one that ends
(as ipnfw did after ionunlock's in-place restart, or one of a relay's two udpclo) ends the
node, so that its supervisor starts it again; on an empty SDR only when ION said its SDR was
damaged.  Run here on fake ION programs, in PID and mount namespaces of their own (root)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_agents import _node

from c2dtn.overlay.agents.ion import NAMESPACES, _children, _comm, ion_files

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (PID and mount namespaces)"
)

DAEMONS = ("rfxclock", "bpclock", "ipnfw", "udpclo", "bpclm")  # each a copy of sleep: a binary, as pidof wants
# the admin programs start daemons in the background and return, as ION's do
ADMIN = {
    "ionadmin": '[ "$1" = . ] && exit 0\nrfxclock 600 &\n',
    "bpadmin": '[ "$1" = . ] && exit 0\nbpclock 600 &\nipnfw 600 &\nudpclo 600 &\nudpclo 600 &\nbpclm 600 &\n',
    "ipnadmin": "exit 0\n",
}


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    cfg = _node(tmp_path, "ion")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in ADMIN.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + text)
        (bin_dir / name).chmod(0o755)
    for name in DAEMONS:
        shutil.copy(shutil.which("sleep"), bin_dir / name)
    d = cfg.agent_dir
    d.mkdir(parents=True, exist_ok=True)
    for name, text in ion_files(cfg, bin_dir).items():
        (d / name).write_text(text)
    (d / "ion-run.sh").chmod(0o755)
    (d / "ion.sdr").write_text("the SDR")
    (d / "ion.log").write_text("")
    proc = subprocess.Popen(
        [*NAMESPACES, d / "ion-run.sh"],
        cwd=d,
        start_new_session=True,
    )
    deadline = time.monotonic() + 15
    while "watching" not in _admin(d):
        assert proc.poll() is None and time.monotonic() < deadline, _admin(d)
        time.sleep(0.2)
    return proc, d


def _admin(d: Path) -> str:
    try:
        return (d / "admin.log").read_text()
    except FileNotFoundError:
        return ""


def _daemons(proc: subprocess.Popen) -> list[tuple[int, str]]:
    keeper = _children(proc.pid)[0]
    return [(k, _comm(k)) for k in _children(keeper)]


@pytest.fixture
def ion_node(tmp_path):
    proc, d = _start(tmp_path)
    try:
        yield proc, d
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_keeper_watches_each_daemon_and_runs_on_while_all_run(ion_node):
    proc, d = ion_node
    assert _admin(d).count("watching bpclm bpclock ipnfw rfxclock udpclo udpclo") == 1, _admin(d)
    time.sleep(3)
    assert proc.poll() is None  # nothing ended: the node runs on
    os.kill(_children(proc.pid)[0], signal.SIGTERM)  # a stop: the admin programs, then "clean"
    assert proc.wait(10) == 0 and (d / "clean").exists()


def test_one_of_two_daemons_of_a_name_ending_ends_the_node_on_its_sdr(ion_node):
    proc, d = ion_node
    os.kill(next(k for k, c in _daemons(proc) if c == "udpclo"), signal.SIGKILL)  # the other udpclo runs on
    assert proc.wait(10) == 4
    assert "ION's udpclo ended; stopping the node, the next start on the same SDR" in _admin(d), _admin(d)
    assert (d / "ion.sdr").read_text() == "the SDR"


def test_a_daemon_ending_after_ion_said_its_sdr_is_damaged_ends_the_node_with_an_empty_sdr(ion_node):
    proc, d = ion_node
    with open(d / "ion.log", "a") as f:
        f.write("at line 531 of ici/sdr/sdrlist.c, Assertion failed. (sdrFetchSafe(sdrv))\n")
    os.kill(next(k for k, c in _daemons(proc) if c == "ipnfw"), signal.SIGKILL)
    assert proc.wait(10) == 4
    assert "ION's ipnfw ended; stopping the node, the next start with an empty SDR" in _admin(d), _admin(d)
    assert not (d / "ion.sdr").exists()
