"""`topo up --engine core`: the testbed's topology as a CORE session on this machine, measured
as `topo check` measures it, and taken down without a trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from c2dtn.errors import ConfigError
from c2dtn.topologies import core_engine, netns, probe, testbed

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(core_engine.missing() is not None, reason=f"CORE: {core_engine.missing()}"),
]


def c2(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "c2dtn.cli", *args], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"c2dtn {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {l.split(":")[1].strip().split("@")[0] for l in out.splitlines()}


@pytest.fixture
def clean():
    testbed.down()
    yield
    testbed.down()


def test_nps_chain_on_core_has_the_profile_and_leaves_nothing(clean):
    before = root_links()
    up = c2("topo", "up", "nps-chain", "--engine", "core", "--profile", "cnr-tactical-2", "--seed", "2026")
    assert "engine: core (session" in up.stdout
    st = testbed.read_state()
    c = st["core"]
    assert st["engine"] == "core" and st["backend"] == "userspace"
    session_dir = Path(c["dir"])
    assert session_dir.is_dir()
    # every node is a CORE node (its vnoded) under the testbed's name
    for pid in c["pids"].values():
        assert "vnoded" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert set(netns.list_ns(testbed.NS_PREFIXES)) == {n["netns"] for n in st["nodes"].values()} | {
        f"c2e-{l}" for l, ls in st["links"].items() if ls["emulate"]
    }
    # nothing crosses an emulated link until something is sent (CORE's host-side ends of each
    # node's interface and its bridges come up with IPv6: the testbed silences them)
    time.sleep(3)
    for name, ls in testbed.status()["links"].items():
        if ls["emulate"]:
            assert (ls["live"]["ab"]["offered"], ls["live"]["ba"]["offered"]) == (0, 0), name
    # what `topo check h1 h4` measures: the profile reached CORE's wiring. The emulator's own
    # fidelity is the namespaces engine's live test (600 probes, tests/test_testbed_live.py);
    # here 400 probes, the loss window three of their standard deviations wide (0.10 +- 0.05)
    res = probe.check(st, "h1", "h4", probes=400, saturate_s=8)
    print(json.dumps({k: v for k, v in res.items() if isinstance(v, (int, float, str))}, indent=1))
    assert res["probes_sent"] == 400
    assert 0.05 <= res["loss"] <= 0.15
    assert abs(res["delay_median_s"] - res["expected_delay_s"]) <= 0.015
    assert 0.9 <= res["rate_bps"] / res["expected_rate_bps"] <= 1.1
    # a link cut and restored on CORE as on namespaces
    testbed.change_link("r2", "r3", "down")
    cut = probe.send_stream(st, "h1", "h4", count=20, interval_s=0.05, payload=12, drain_s=1.0)
    assert cut.loss() == 1.0
    testbed.change_link("r2", "r3", "up")
    back = probe.send_stream(st, "h1", "h4", count=20, interval_s=0.1, payload=12, drain_s=1.5)
    assert back.loss() < 0.5
    down = c2("topo", "down")
    assert f"CORE session {c['session']} deleted" in down.stdout
    assert netns.list_ns(testbed.NS_PREFIXES) == []
    assert not session_dir.exists()
    for pid in [*c["pids"].values(), c["daemon_pid"]]:
        assert not netns._alive(pid), f"pid {pid} still runs"
    assert root_links() == before
    assert not (testbed.run_dir() / core_engine.DAEMON_PIDFILE).exists()
    assert not session_dir.parent.exists()  # the daemon's fresh folder for its sessions


def test_down_after_a_crash_of_the_controlling_process_removes_the_session(clean):
    """The state file lost (a crash mid-build): `topo down` still stops the testbed's CORE
    daemon (its pid file), whose own shutdown removes the session, and the named namespaces."""
    before = root_links()
    st = testbed.up("nps-chain", engine="core")
    daemon = st["core"]["daemon_pid"]
    testbed.state_path().unlink()
    testbed.down()
    assert not netns._alive(daemon)
    assert netns.list_ns(testbed.NS_PREFIXES) == []
    assert root_links() == before


def test_a_build_that_fails_after_core_made_the_session_leaves_nothing(clean, monkeypatch):
    """CORE made the session, then configuring a node fails: the session is deleted, the
    daemon stopped, the names removed, and the error names the node."""
    from c2dtn.topologies import core_plan

    real = core_plan.node_commands

    def broken(topo, plan):
        cmds = real(topo, plan)
        cmds["c2-r3"].append(["ip", "route", "replace", "10.99.0.0/16", "via", "10.99.0.1"])  # no such next hop
        return cmds

    monkeypatch.setattr(core_plan, "node_commands", broken)
    before = root_links()
    with pytest.raises(testbed.TestbedError, match="c2-r3"):
        testbed.up("nps-chain", engine="core")
    assert testbed.read_state() is None
    assert netns.list_ns(testbed.NS_PREFIXES) == []
    assert root_links() == before
    pidfile = testbed.run_dir() / core_engine.DAEMON_PIDFILE
    assert not pidfile.exists() and not core_engine.daemon_dir(testbed.run_dir()).exists()
    out = subprocess.run(["ps", "-eo", "comm"], capture_output=True, text=True).stdout.split()
    assert "c2core-daemon" not in out


def test_core_address_elsewhere_is_refused_naming_it(clean):
    with pytest.raises(ConfigError, match="10.1.2.3:50051"):
        testbed.up("nps-chain", engine="core", core_address="10.1.2.3:50051")


def test_a_server_without_root_ssh_is_named_before_anything_is_torn_down(clean, tmp_path):
    testbed.up("nps-chain", engine="core")
    f = tmp_path / "servers.toml"  # a loopback address where no root SSH answers
    f.write_text('controller = "127.0.0.1"\n[[server]]\nname = "core-deu"\nhost = "127.0.0.2"\nnodes = ["deu-*"]\n')
    with pytest.raises(core_engine.CoreError, match=r"core-deu \(127.0.0.2\): root SSH"):
        testbed.up("fmn-4nations", engine="core", servers=str(f))
    assert testbed.read_state()["topology"] == "nps-chain"  # what was up is still up


def test_engine_core_without_core_built_names_the_build(monkeypatch, tmp_path, clean):
    monkeypatch.setenv("C2DTN_CORE", str(tmp_path / "nowhere"))
    with pytest.raises(testbed.TestbedError, match="no core-daemon or vnoded"):
        testbed.up("nps-chain", engine="core")
    assert os.path.exists(testbed.state_path()) is False
