"""A box's install and service: `c2dtn node init` writes a config that loads, keys mode 0600
and a unit systemd-analyze accepts; `node check` says what the node would do and fails on what
would stop it; under a service manager the node says READY=1 only once its agent answers, and
WATCHDOG=1 while it runs.  These machines run no systemd as PID 1: the manager's side is a
datagram socket the test reads, as systemd's is (sd_notify(3))."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from c2dtn.cli import cli
from c2dtn.overlay import sdnotify
from c2dtn.overlay.agents.dtn7 import find_dtnd
from c2dtn.overlay.box import unit_text
from c2dtn.overlay.config import load_node_config
from c2dtn.topologies.nodes import agent_missing

ROOT = Path(__file__).resolve().parent.parent
C2DTN = str(Path(sys.executable).parent / "c2dtn")


def _init(tmp_path, *args: str):
    return CliRunner().invoke(
        cli,
        [
            "node",
            "init",
            *args,
            "--config-dir",
            str(tmp_path / "etc"),
            "--state-dir",
            str(tmp_path / "var"),
            "--unit-dir",
            str(tmp_path / "units"),
        ],
    )


def test_node_init_writes_a_config_that_loads_its_keys_private_and_the_unit(tmp_path):
    r = _init(tmp_path, "gw1", "--agent", "dtn7", "--peer", "gw4=tcpcl://10.0.0.4:4556", "--metrics", "127.0.0.1:9464")
    assert r.exit_code in (0, 3), r.output  # (3: this machine lacks dtnd)
    cfg_path, keys = tmp_path / "etc" / "gw1.toml", tmp_path / "etc" / "gw1.keys.toml"
    assert {p.name: p.stat().st_mode & 0o777 for p in (cfg_path, keys)} == {"gw1.toml": 0o600, "gw1.keys.toml": 0o600}
    assert (tmp_path / "etc").stat().st_mode & 0o777 == 0o700
    cfg = load_node_config(cfg_path)
    assert (cfg.id, cfg.agent, cfg.storage) == ("gw1", "dtn7", tmp_path / "var" / "gw1")
    assert [p.node for p in cfg.peers] == ["gw4"] and len(cfg.keys["gw4"]) == 32
    assert cfg.metrics_listen == ("127.0.0.1", 9464)
    assert "gw4's box must hold the same pair key" in r.output and cfg.keys["gw4"].hex() not in r.output
    unit = (tmp_path / "units" / "c2dtn@.service").read_text()
    assert f"ExecStart={C2DTN} node run --gateways {tmp_path / 'etc'}/%i.toml" in unit
    # a second init refuses to replace the keys a peer may already hold
    r = _init(tmp_path, "gw1")
    assert r.exit_code != 0 and "already set up here" in str(r.exception or r.output)
    # keys from `c2dtn keys`, copied as they are
    CliRunner().invoke(cli, ["keys", str(tmp_path / "k"), "gw1", "gw4"])
    r = _init(tmp_path, "gw1", "--force", "--keys-file", str(tmp_path / "k" / "gw1.keys.toml"))
    assert r.exit_code in (0, 3), r.output
    assert keys.read_text() == (tmp_path / "k" / "gw1.keys.toml").read_text()


def test_node_init_refuses_bad_values_by_name(tmp_path):
    for args, want in (
        (["gw 1"], "ID"),
        (["gw1", "--peer", "gw4"], "a peer is NODE=CLA"),
        (["gw1", "--listen", "tcp://x"], "--listen"),
        (["gw1", "--metrics", "localhost:9464"], "metrics.listen"),
        (["gw1", "--agent", "bogus"], "agent.kind"),
    ):
        r = _init(tmp_path, *args)
        assert r.exit_code != 0 and want in str(r.exception) + r.output, (args, r.output, r.exception)
        assert not (tmp_path / "etc" / "gw1.toml").exists()


def test_node_init_names_nodes_by_number_where_the_agent_can(tmp_path):
    r = _init(
        tmp_path,
        "gw1",
        "--agent",
        "dtn7",
        "--peer",
        "gw4=udp://10.0.0.4:4556",
        "--number",
        "gw1=1",
        "--number",
        "gw4=4",
    )
    assert r.exit_code in (0, 3), r.output
    cfg = load_node_config(tmp_path / "etc" / "gw1.toml")
    o = cfg.agent_options
    assert (o["naming"], o["numbers"]) == ("ipn", {"gw1": 1, "gw4": 4})
    from c2dtn.overlay.agents import make_agent

    assert make_agent(cfg).eid("gw4", "1") == "ipn:4.1"  # what the node's bundles go to
    for args, want in (
        (["--agent", "ibrdtn", "--number", "gw1=1", "--number", "gw4=4"], "does not name nodes by number"),
        (["--agent", "dtn7", "--number", "gw1"], "a number is NODE=N"),
        (["--agent", "dtn7", "--number", "gw1=0"], "a number is NODE=N"),
        (["--agent", "dtn7", "--number", "gw1=1", "--number", "gw1=2"], "numbered 1 already"),
        (["--agent", "dtn7", "--number", "gw1=1", "--number", "gw4=1"], "--number"),  # two nodes, one number
        (["--agent", "dtn7", "--number", "gw1=1"], "no number for gw4"),  # a peer left out: derived, unknown elsewhere
        (["--agent", "dtn7", "--number", "GW1=1", "--number", "gw1=2", "--number", "gw4=4"], "gw1 is"),
    ):
        r = _init(tmp_path / "bad", "gw1", "--peer", "gw4=udp://10.0.0.4:4556", *args)
        assert r.exit_code != 0 and want in str(r.exception) + r.output, (args, r.output, r.exception)
        assert not (tmp_path / "bad" / "etc" / "gw1.toml").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze on this machine")
@pytest.mark.parametrize("dirs", [("/etc/c2dtn", "/var/lib/c2dtn"), ("/srv/c2/etc", "/srv/c2/state")])
def test_systemd_analyze_verify_passes_the_unit(tmp_path, dirs):
    unit = tmp_path / "c2dtn@gw1.service"  # an instance of the template
    unit.write_text(unit_text(C2DTN, *dirs))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "c2dtn@gw1" not in r.stderr, r.stderr
    text = unit.read_text()
    assert "Type=notify" in text and "Restart=on-failure" in text and "NoNewPrivileges=yes" in text
    assert "ProtectSystem=strict" in text and "WatchdogSec=" in text
    assert ("StateDirectory=c2dtn/%i" in text) == (dirs[1] == "/var/lib/c2dtn")


def test_node_check_fails_on_keys_others_can_read_and_names_the_fix(tmp_path):
    _init(tmp_path, "gw1", "--agent", "dtn7", "--peer", "gw4=tcpcl://10.0.0.4:4556")
    keys = tmp_path / "etc" / "gw1.keys.toml"
    keys.chmod(0o644)
    r = CliRunner().invoke(cli, ["node", "check", str(tmp_path / "etc" / "gw1.toml")])
    assert r.exit_code != 0 and "chmod 600" in str(r.exception) + r.output


def test_node_check_says_when_this_machine_lacks_the_agent(tmp_path, monkeypatch):
    from c2dtn.errors import C2Error
    from c2dtn.overlay.agents import dtn7

    _init(tmp_path, "gw1", "--agent", "dtn7")

    def no_dtnd():
        raise C2Error("dtnd is not installed")

    monkeypatch.setattr(dtn7, "find_dtnd", no_dtnd)
    r = CliRunner().invoke(cli, ["node", "check", str(tmp_path / "etc" / "gw1.toml")])
    assert r.exit_code == 3 and "NOT USABLE HERE" in r.output, r.output


def test_sd_notify_reaches_a_path_or_abstract_socket_and_the_watchdog_interval_is_half():
    for abstract in (False, True):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"\0c2-notify-{os.getpid()}" if abstract else f"/tmp/c2-notify-{os.getpid()}"
        if not abstract and os.path.exists(name):
            os.unlink(name)
        s.bind(name)
        try:
            env = {"NOTIFY_SOCKET": "@" + name[1:] if abstract else name}
            assert sdnotify.notify("READY=1", env)
            assert s.recv(100) == b"READY=1"
        finally:
            s.close()
            if not abstract:
                os.unlink(name)
    assert not sdnotify.notify("READY=1", {})
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "bogus"}) is None


def _heard(mgr: socket.socket, t0: float) -> tuple[float, str]:
    data = mgr.recv(4096)  # (then the time: it arrived when recv returned)
    return time.monotonic() - t0, data.decode()


@pytest.mark.bpa
@pytest.mark.skipif(agent_missing() is not None, reason=f"{agent_missing()}")
def test_ready_comes_only_once_the_agent_answers_and_the_watchdog_beats(tmp_path):
    """The node under a manager's notify socket, its dtnd slowed by 2 s at start: READY=1 comes
    after that, when `node status` already answers with the agent's pid; WATCHDOG=1 about
    every half WATCHDOG_USEC; STOPPING=1 at SIGTERM, and exit status 0."""
    r = _init(tmp_path, "gwsvc", "--agent", "dtn7", "--listen", "tcpcl://127.0.0.1:4992")
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "etc" / "gwsvc.toml"
    with cfg.open("a") as f:
        f.write('\n[agent.dtn7]\nweb_port = 3992\nstore = "mem"\n')
    slow = tmp_path / "slow-dtnd"
    slow.write_text(f'#!/bin/sh\nsleep 2\nexec {find_dtnd()} "$@"\n')
    slow.chmod(0o755)
    sock_path = tmp_path / "notify.sock"
    mgr = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    mgr.bind(str(sock_path))
    mgr.settimeout(30)
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "NOTIFY_SOCKET": str(sock_path),
        "WATCHDOG_USEC": "1000000",
        "C2DTN_DTND": str(slow),
    }
    log = open(tmp_path / "node.log", "wb")
    t0 = time.monotonic()
    p = subprocess.Popen([C2DTN, "node", "run", "--gateways", str(cfg)], stdout=log, stderr=subprocess.STDOUT, env=env)
    msgs: list[tuple[float, str]] = []
    try:
        while not any(m.startswith("READY=1") for _, m in msgs):
            msgs.append(_heard(mgr, t0))
        ready_at = msgs[-1][0]
        st = subprocess.run([C2DTN, "node", "status", "--json", str(cfg)], capture_output=True, text=True, timeout=30)
        assert st.returncode == 0 and '"agent_pid": ' in st.stdout and '"agent_pid": null' not in st.stdout, st.stdout
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            msgs.append(_heard(mgr, t0))
        p.send_signal(signal.SIGTERM)
        while not msgs[-1][1].startswith("STOPPING=1"):
            msgs.append(_heard(mgr, t0))
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        mgr.close()
    out = (tmp_path / "node.log").read_text(errors="replace")
    assert ready_at >= 2.0, (msgs, out[-2000:])  # not before the slowed agent could answer
    assert not any(m == "WATCHDOG=1" and t < ready_at for t, m in msgs)
    beats = [t for t, m in msgs if m == "WATCHDOG=1"]
    assert len(beats) >= 4, msgs  # every 0.5 s for 2.5 s
    assert p.returncode == 0, out[-2000:]


def test_node_init_refuses_a_shared_config_folder_and_leaves_nothing_on_a_bad_value(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = CliRunner().invoke(cli, ["node", "init", "gw1", "--config-dir", str(shared), "--unit-dir", ""])
    assert r.exit_code != 0 and "others could replace the keys" in str(r.exception)
    assert list(shared.iterdir()) == []
    r = _init(tmp_path, "gw1", "--metrics", "localhost:1")
    assert r.exit_code != 0 and str(tmp_path / "etc" / "gw1.toml") in str(r.exception)  # named where it would go
    assert not (tmp_path / "etc").exists() and not (tmp_path / "var").exists()


def test_node_init_writes_absolute_paths_and_escapes_specifiers_in_the_unit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(
        cli, ["node", "init", "gw1", "--config-dir", "c2%h/etc", "--state-dir", "var", "--unit-dir", "units"]
    )
    assert r.exit_code in (0, 3), r.output
    unit = (tmp_path / "units" / "c2dtn@.service").read_text()
    assert f"node run --gateways {tmp_path}/c2%%h/etc/%i.toml" in unit and f"ReadWritePaths={tmp_path}/var" in unit
    assert load_node_config(tmp_path / "c2%h" / "etc" / "gw1.toml").storage == tmp_path / "var" / "gw1"
    r = CliRunner().invoke(cli, ["node", "init", "gw2", "--config-dir", "a b", "--unit-dir", "units"])
    assert r.exit_code != 0 and "without spaces" in str(r.exception)


def test_a_unit_link_planted_in_the_unit_folder_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "c2dtn@.service").symlink_to(victim)
    r = _init(tmp_path, "gw1")
    assert r.exit_code in (0, 3), r.output
    assert victim.read_text() == "secret" and victim.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "units" / "c2dtn@.service").is_symlink()


def test_node_check_names_storage_under_a_file_and_keys_someone_else_owns(tmp_path):
    _init(tmp_path, "gw1", "--peer", "gw4=tcpcl://10.0.0.4:4556")
    cfg = tmp_path / "etc" / "gw1.toml"
    (tmp_path / "var").rmdir()
    (tmp_path / "var").write_text("a file")
    r = CliRunner().invoke(cli, ["node", "check", str(cfg)])
    assert r.exit_code != 0 and "node.storage" in str(r.exception) and "a file, not a folder" in str(r.exception)
    (tmp_path / "var").unlink()
    os.chown(tmp_path / "etc" / "gw1.keys.toml", 65534, -1)
    r = CliRunner().invoke(cli, ["node", "check", str(cfg)])
    assert r.exit_code != 0 and "must belong to the user the node runs as" in str(r.exception)


def test_node_init_takes_the_id_as_argument_or_option_once(tmp_path):
    r = _init(tmp_path, "--id", "gw7", "--agent", "dtn7")
    assert r.exit_code in (0, 3) and load_node_config(tmp_path / "etc" / "gw7.toml").id == "gw7", r.output
    for args in ([], ["gw8", "--id", "gw8"]):
        r = _init(tmp_path, *args)
        assert r.exit_code != 0 and "give the node's id once" in r.output


def test_node_check_shows_the_naming_and_refuses_numbers_that_would_misroute(tmp_path):
    """An operator reads each box's numbers off `node check` to compare them across boxes, and a
    naming mistake is refused there, not first when the node starts (decision 0021)."""
    _init(tmp_path, "gw1", "--agent", "dtn7", "--peer", "gw4=udp://10.0.0.4:4556")
    conf = tmp_path / "etc" / "gw1.toml"
    text = conf.read_text()
    conf.write_text(text + '\n[agent.dtn7]\nnaming = "ipn"\nnumbers = { gw1 = 1 }\n')
    r = CliRunner().invoke(cli, ["node", "check", str(conf)])
    assert "ipn: this node ipn:1.0" in r.output and "derived, not in numbers: gw4" in r.output, r.output
    for bad, field in (
        ("[agent.dtn7]\nnumber = 1\n", "agent.dtn7.number"),  # without naming = "ipn"
        ('[agent.dtn7]\nnaming = "ipn"\nnumber = 4\nnumbers = { gw1 = 1 }\n', "agent.dtn7.number"),
        ('[agent.dtn7]\nnaming = "ipn"\nnumbers = { gw1 = 1, gw4 = 1 }\n', "agent.dtn7.numbers"),
    ):
        conf.write_text(text + "\n" + bad)
        r = CliRunner().invoke(cli, ["node", "check", str(conf)])
        assert r.exit_code != 0 and field in str(r.exception) + r.output, (bad, r.output, r.exception)
