"""The overlay on real dtnd daemons: nps-chain, one BPA on each gateway and router,
the overlay on gw1 and gw4, the r2=r3 radio link on cnr-tactical-2."""

from __future__ import annotations

import os
import threading
import time

import pytest

from c2dtn.overlay.agents import agent_class
from c2dtn.topologies import testbed
from c2dtn.topologies.nodes import AGENTS, Nodes, agent_missing

pytestmark = [pytest.mark.netns, pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing()))]

BPA = ["gw1", "r2", "r3", "gw4"]


def _chain(tmp_path, agent: str = "dtn7", engine: str = "namespaces"):
    testbed.down()
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=11, engine=engine)
    yield from running(Nodes(st, BPA, ["gw1", "gw4"], tmp_path / "nodes", agent=agent))


def running(nodes: Nodes):
    """Start every node of `nodes` side by side, yield them once all answer, stop them and the
    testbed after."""
    try:
        for n in nodes.paths:
            nodes.start(n, wait=False)
        for n in nodes.paths:
            nodes.wait_ready(n, timeout=60)
        yield nodes
    finally:
        nodes.stop_all()
        testbed.down()


@pytest.fixture
def chain(tmp_path):
    yield from _chain(tmp_path)


@pytest.fixture(params=AGENTS)
def agent_chain(request, tmp_path):
    why = agent_class(request.param).missing()
    if why:
        pytest.skip(f"{request.param}: {why}")
    # make test keeps dtn7 and ion (IBR-DTN is live in it through tests/test_relay_live.py)
    if request.param in ("ibrdtn", "hdtn") and os.environ.get("C2DTN_ALL_AGENT_TESTS") != "1":
        pytest.skip(
            f"{request.param}: left out of make test for the suite's 35 minutes (passed in CI on 2026-11-25, "
            "and with a 60 s outage: docs/results/20261125-outage60-kill); C2DTN_ALL_AGENT_TESTS=1 runs it"
        )
    if request.param == "dtn7" and os.environ.get("C2DTN_ALL_AGENT_TESTS") != "1":
        from c2dtn.topologies import core_engine

        if core_engine.missing() is None:
            pytest.skip(
                "dtn7 on namespaces: make test runs this kill test over dtn7 on the CORE engine instead "
                "(test_on_core_...: the same agent and emulator, CORE's nodes), for the suite's 35 minutes; "
                "C2DTN_ALL_AGENT_TESTS=1 runs both"
            )
    yield from _chain(tmp_path, request.param)


def collect(nodes: Nodes, n: str, want: int, timeout: float, progress: str = "", cbor: bool = True) -> list[dict]:
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    last = 0.0
    while len(got) < want and time.monotonic() < deadline:
        got += nodes.recv(n, wait=2.0, cbor=cbor)
        if time.monotonic() - last > 15:
            last = time.monotonic()
            print(f"{progress} {len(got)}/{want} after {timeout - (deadline - time.monotonic()):.0f} s", flush=True)
    return got


def outage(start_s: float, length_s: float) -> threading.Thread:
    def run():
        time.sleep(start_s)
        testbed.change_link("r2", "r3", "down")
        time.sleep(length_s)
        testbed.change_link("r2", "r3", "up")

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def send_orders(nodes: Nodes, first: int, last: int, pause_every: int = 0, pause_s: float = 0) -> list[int]:
    sent = []
    for i in range(first, last):
        sent.append(nodes.send("gw1", "gw4", f"order {i:03d} ".encode() + bytes(24)))
        if pause_every and i % pause_every == pause_every - 1:
            time.sleep(pause_s)
    return sent


def assert_all_once_in_order(nodes: Nodes, sent: list[int]) -> None:
    got = collect(nodes, "gw4", len(sent), timeout=600, progress="delivered")
    seqs = [d["seq"] for d in got]
    print("gw1:", nodes.status("gw1")["counters"], "gw4:", nodes.status("gw4")["counters"])
    assert len(seqs) == len(set(seqs)), "something was delivered twice"
    assert sorted(seqs) == sorted(sent), f"missing {sorted(set(sent) - set(seqs))[:10]}"
    assert seqs == sorted(seqs), "out of order within the class"


# One test per agent: a steady stream of 500 envelopes into a 35 s outage of the radio link,
# all delivered once and in order, with the sending node and its agent SIGKILLed in the outage
# on top (the same stream without the kill, run on dtn7-rs until 2026-11-23, asserted a subset
# of this and cost CI two minutes).  The outage was 60 s until 2026-11-24; 35 s still holds
# the first 300 sends, the kill and the restart inside it and saves CI two minutes over 4 agents.
# C2DTN_OUTAGE_S=60 runs it with issue 15's 60 s outage (README: the run of 2026-11-25).
OUTAGE_S = float(os.environ.get("C2DTN_OUTAGE_S", "35"))


def test_sender_killed_mid_outage_and_restarted_still_all_500(agent_chain):
    killed_mid_outage(agent_chain)


@pytest.fixture
def core_chain(tmp_path):
    from c2dtn.topologies import core_engine

    why = core_engine.missing()
    if why:
        pytest.skip(f"CORE: {why}")
    yield from _chain(tmp_path, "dtn7", engine="core")


def test_on_core_sender_killed_mid_outage_and_restarted_still_all_500(core_chain):
    """The same kill test on a CORE session (topo up --engine core): CORE's nodes and links,
    the radio link in an emulator node, cut and restored through it."""
    assert testbed.read_state()["engine"] == "core"
    killed_mid_outage(core_chain)


def killed_mid_outage(nodes: Nodes) -> None:
    cut = outage(5, OUTAGE_S)
    sent = send_orders(nodes, 0, 300, pause_every=50, pause_s=1)
    time.sleep(20)  # well inside the outage
    nodes.kill("gw1")  # overlay process and its dtnd, SIGKILL
    time.sleep(3)
    nodes.start("gw1")
    sent += send_orders(nodes, 300, 500)
    cut.join()
    assert_all_once_in_order(nodes, sent)


def test_supersession_during_an_outage_newest_position_of_each_unit_goes_first(chain):
    nodes = chain
    # the path is warm: a few orders go through and are acked
    for i in range(5):
        nodes.send("gw1", "gw4", f"warm {i}".encode())
    assert len(collect(nodes, "gw4", 5, timeout=120)) == 5
    testbed.change_link("r2", "r3", "down")
    # routine traffic fills the window during the outage (it waits in the BPAs) ...
    routine = [nodes.send("gw1", "gw4", f"routine {i:02d} ".encode() + bytes(400)) for i in range(40)]
    time.sleep(2)
    # ... then every unit reports its position 25 times
    newest = {}
    for rnd in range(25):
        for u in range(8):
            body = f'{{"unit": "NOR-S00{u}", "round": {rnd}}}'.encode()
            newest[f"NOR-S00{u}"] = nodes.send("gw1", "gw4", body, priority="priority", supersede=f"NOR-S00{u}")
    st = nodes.status("gw1")
    queues = {q["priority"]: q for q in st["queues"]}
    assert queues["priority"]["queued"] == 8 and queues["priority"]["in_flight"] == 0
    routine_queued = queues["routine"]["queued"]
    assert st["counters"]["superseded"] == 25 * 8 - 8
    assert routine_queued > 0  # the window held some routine traffic back in the overlay
    testbed.change_link("r2", "r3", "up")
    got = collect(nodes, "gw4", 40 + 8, timeout=600, progress="delivered")
    pos = [d for d in got if d["supersede"]]
    assert {d["supersede"]: d["seq"] for d in pos} == newest and len(pos) == 8
    last_position = max(i for i, d in enumerate(got) if d["supersede"])
    # the routine envelopes still queued in the overlay when the positions came all arrive after them
    later_routine = [d for d in got[last_position + 1 :] if not d["supersede"]]
    assert len(later_routine) >= routine_queued
    assert sorted(d["seq"] for d in got if not d["supersede"]) == routine


def test_malformed_bundles_from_a_peer_are_counted_and_dropped(chain):
    nodes = chain
    import subprocess

    from c2dtn.overlay.agents import make_agent
    from c2dtn.overlay.config import load_node_config

    gw4 = make_agent(load_node_config(nodes.paths["gw4"]))
    dst = gw4.eid("gw4", gw4.endpoint)  # ipn:N.1 as the testbed names dtn7's nodes
    garbage = [b"", b"\xff" * 50, b"\x83\x01", b"\x83\x01cgw1\x81\x82Dabcd" + bytes(16), bytes(70000)]
    for g in garbage:  # r3 is a neighbour; its BPA sends straight to gw4's overlay endpoint
        r = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                "c2-r3",
                "curl",
                "-s",
                "-X",
                "POST",
                "--data-binary",
                "@-",
                f"http://127.0.0.1:3000/send?dst={dst}&lifetime=60s",
            ],
            input=g,
            capture_output=True,
        )
        assert r.returncode == 0, r.stderr
    sent = [nodes.send("gw1", "gw4", f"after garbage {i}".encode()) for i in range(20)]
    got = collect(nodes, "gw4", 20, timeout=300)  # the API's CBOR answer: bodies as bytes
    assert sorted(d["seq"] for d in got) == sorted(sent)
    assert sorted(d["body"] for d in got) == sorted(f"after garbage {i}".encode() for i in range(20))
    counters = nodes.status("gw4")["counters"]
    rejected = {k: v for k, v in counters.items() if k.startswith("rejected:")}
    assert sum(rejected.values()) == len(garbage), rejected
    lines = [l for l in nodes.log("gw4").splitlines() if "rejected" in l]
    assert len(lines) == len(garbage)
    assert nodes.procs["gw4"].poll() is None  # still running
    # and still answers: c2dtn ping through the radio link, each round trip printed
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "c2dtn.cli",
            "ping",
            str(nodes.paths["gw1"]),
            "gw4",
            "--count",
            "3",
            "--interval",
            "0",
            "--size",
            "500",
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("500 bytes from gw4") == 3 and "3/3 answered" in r.stdout


def test_supervisor_restarts_a_dead_agent_and_delivery_resumes(chain):
    nodes = chain
    import signal

    from c2dtn.topologies import netns

    pid = int((nodes.cfg("gw4").storage / "agent.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # gw4's dtnd dies; its node process lives on
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = nodes.status("gw4")
        if st["agent_restarts"] >= 1 and st["agent_pid"] != pid and "agent_error" not in st:
            break
        time.sleep(0.5)
    assert st["agent_restarts"] == 1 and netns._alive(st["agent_pid"]) and not netns._alive(pid)
    sent = [nodes.send("gw1", "gw4", f"after restart {i}".encode()) for i in range(10)]
    got = collect(nodes, "gw4", 10, timeout=300, cbor=False)  # the API's JSON answer: bodies in base64
    assert sorted(d["seq"] for d in got) == sorted(sent)
    assert sorted(d["body"] for d in got) == sorted(f"after restart {i}".encode() for i in range(10))


# A client of ION that dies inside an SDR transaction leaves the node's transaction semaphore
# taken: every daemon and client of the node waits on it for ever.  This client takes it
# through ION's own libraries (bp_attach, sdr_begin_xn) and is SIGKILLed there, every time.
LOCKER = """import ctypes, time
bp, ici = ctypes.CDLL("libbp.so.0"), ctypes.CDLL("libici.so.0")
bp.bp_get_sdr.restype = ctypes.c_void_p
ici.sdr_begin_xn.argtypes = [ctypes.c_void_p]
assert bp.bp_attach() == 0, "cannot attach"
assert ici.sdr_begin_xn(bp.bp_get_sdr()) == 1, "cannot begin a transaction"
print("in a transaction", flush=True)
time.sleep(600)
"""


@pytest.fixture
def ion_chain(tmp_path):
    why = agent_class("ion").missing()
    if why:
        pytest.skip(f"ion: {why}")
    yield from _chain(tmp_path, "ion")


def test_an_ion_node_locked_by_a_killed_client_is_unlocked_and_delivery_resumes(ion_chain):
    import signal
    import subprocess
    import sys

    from c2dtn.overlay.agents.builds import built
    from c2dtn.overlay.agents.ion import _children as ion_children
    from c2dtn.overlay.agents.ion import _comm as ion_comm

    nodes = ion_chain
    sent = send_orders(nodes, 0, 10)
    assert len(collect(nodes, "gw4", 10, timeout=120)) == 10
    assert [nodes.status(n)["agent_restarts"] for n in ("gw1", "gw4")] == [0, 0]  # ION runs steadily
    gw1 = agent_class("ion")(nodes.cfg("gw1"))
    locker = subprocess.Popen(
        ["nsenter", "-t", str(gw1._keeper()), "--ipc", "--mount", "--pid", "--", sys.executable, "-c", LOCKER],
        stdout=subprocess.PIPE,
        text=True,
        cwd=nodes.cfg("gw1").agent_dir,
        env={**os.environ, "LD_LIBRARY_PATH": str(built("ion") / "lib")},
    )
    assert locker.stdout.readline() == "in a transaction\n"
    client = ion_children(locker.pid)[0]  # nsenter's child: the client itself
    os.kill(client, signal.SIGKILL)  # inside its transaction
    locker.wait(10)
    sent += send_orders(nodes, 10, 30)
    got = collect(nodes, "gw4", 20, timeout=300, progress="after the lock")
    if sorted(d["seq"] for d in got) != sorted(sent[10:]):  # what the driver and ION said, for the failure
        gw1_log = [l for l in nodes.log("gw1").splitlines() if " DEBUG " not in l]
        admin = (nodes.cfg("gw1").agent_dir / "admin.log").read_text(errors="replace")
        print("gw1's node log:", *gw1_log[-40:], "gw1's ION admin.log:", admin[-4000:], sep="\n")
    assert sorted(d["seq"] for d in got) == sorted(sent[10:]), "lost or repeated after the lock"
    log = nodes.log("gw1")
    assert "the node is locked? running ionunlock" in log, log[-3000:]
    # a daemon of the node ends (as ipnfw did after an in-place restart, asserting on a damaged SDR):
    # the node restarts, and what is sent then arrives
    deadline = time.monotonic() + 30
    while not (ipnfw := [k for k in ion_children(gw1._keeper()) if ion_comm(k) == "ipnfw"]):
        assert time.monotonic() < deadline, "gw1's ION runs no ipnfw"
        time.sleep(0.5)
    restarts = nodes.status("gw1")["agent_restarts"]
    admin = nodes.cfg("gw1").agent_dir / "admin.log"
    seen = len(admin.read_bytes())
    os.kill(ipnfw[0], signal.SIGKILL)
    later = send_orders(nodes, 30, 35)
    got = collect(nodes, "gw4", 5, timeout=180, progress="after ipnfw ended")
    assert sorted(d["seq"] for d in got) == sorted(later), "lost or repeated after ipnfw ended"
    assert nodes.status("gw1")["agent_restarts"] == restarts + 1
    after = admin.read_bytes()[seen:].decode(errors="replace")
    # on the same SDR; or on an empty one where the node's watcher saw the lock's ionrestart (ION
    # 4.1.3 leaves daemons to end on an SDR it restarted in place: overlay/agents/ion.py)
    assert (
        "ION's ipnfw ended; stopping the node, the next start on the same SDR" in after
        or "ION's ipnfw ended; stopping the node, the next start with an empty SDR" in after
    ), after
