"""Live testbed: real namespaces, veths and emulators (userspace backend on these machines).

Each test asserts what a user of the testbed sees: traffic between nodes, the
link's rate, delay and loss, outages, and what `topo down` leaves behind.
"""

from __future__ import annotations

import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

from c2dtn.topologies import netns, probe, testbed

pytestmark = pytest.mark.netns

PROBE_FRAME = 12 + probe.FRAME_OVERHEAD  # 54-byte frames: 12-byte payload + UDP/IP/Ethernet


def c2(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "c2dtn.cli", *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"c2dtn {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def leftovers() -> dict[str, list]:
    ns = netns.list_ns(testbed.NS_PREFIXES)
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    root_c2 = [l.split(":")[1].strip() for l in root_links.splitlines() if l.split(":")[1].strip().startswith("c2")]
    return {"namespaces": ns, "root_interfaces": root_c2}


@pytest.fixture
def clean():
    testbed.down()
    yield
    testbed.down()


def stream_with_actions(st, src, dst, seconds, interval, actions):
    """Stream probes while `actions` [(t, fn)] run at their offsets; returns the run and action times."""
    done = {}

    def actor():
        t0 = time.monotonic()
        for at, fn in actions:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            fn()
            done[at] = time.monotonic()

    th = threading.Thread(target=actor)
    th.start()
    run = probe.send_stream(st, src, dst, duration_s=seconds, interval_s=interval, drain_s=1.5)
    th.join()
    return run, done


def test_cnr_tactical_2_rate_delay_and_loss(clean):
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=2026)
    ser = PROBE_FRAME * 8 / 9800
    # delay and loss: 600 paced probes, spaced wider than their serialization time; the loss
    # window is three of their standard deviations wide (0.10 +- 0.037)
    run = probe.send_stream(st, "h1", "h4", count=600, interval_s=1.3 * ser, payload=12, drain_s=1.5)
    loss = run.loss()
    med = statistics.median(probe.delays(run))
    print(
        f"loss {loss:.3f} over {len(run.sent)}; delay median {med * 1000:.1f} ms (expected {100 + ser * 1000:.1f} ms)"
    )
    assert len(run.sent) == 600
    assert 0.063 <= loss <= 0.137
    assert abs(med - (0.100 + ser)) <= 0.015
    assert run.duplicates == 0
    # rate: saturate at 1.5x the link rate; frame bits per second at the receiver
    sat = probe.send_stream(
        st, "h1", "h4", duration_s=15, interval_s=242 * 8 / (1.5 * 9800), payload=200, drain_s=0.5, port=probe.PORT + 1
    )
    rate = probe.goodput_bps(sat)
    print(f"goodput at saturation {rate:.0f} bit/s")
    assert 0.9 * 9800 <= rate <= 1.1 * 9800


def test_scheduled_outage_passes_nothing_and_traffic_resumes(clean, tmp_path):
    sched = tmp_path / "outage.toml"
    sched.write_text(
        '[[schedule]]\nat = "4s"\nlink = "r2-r3"\naction = "down"\n'
        '[[schedule]]\nat = "14s"\nlink = "r2-r3"\naction = "up"\n'
    )
    c2("topo", "up", "nps-chain", "--profile", "cnr-tactical-1", "--schedule", str(sched))
    st = testbed.read_state()
    run = probe.send_stream(
        st, "h1", "h4", duration_s=22 - (time.monotonic() - st["started_monotonic"]), interval_s=0.1, drain_s=1.5
    )
    applied = testbed.read_state()["events_applied"]
    assert [e["action"] for e in applied] == ["down", "up"]
    t_down, t_up = applied[0]["at_monotonic"], applied[1]["at_monotonic"]
    assert t_up - t_down == pytest.approx(10, abs=0.5)
    inside = [a for a in run.arrivals if t_down + 0.05 < a.received < t_up]
    before = [a for a in run.arrivals if a.received <= t_down]
    after = [a for a in run.arrivals if a.received >= t_up]
    print(f"before {len(before)}, inside {len(inside)}, after {len(after)}")
    assert inside == []
    assert len(before) > 20
    sent_after = [s for s, t in run.sent.items() if t > t_up + 0.5]
    got_after = {a.seq for a in after}
    assert len(got_after & set(sent_after)) >= 0.9 * len(sent_after) > 30


def test_live_link_down_up_and_carrier(clean):
    st = testbed.up("nps-chain", profile="cnr-tactical-1")
    run, times = stream_with_actions(
        st,
        "h1",
        "h4",
        14,
        0.1,
        [
            (3, lambda: c2("topo", "link", "r2", "r3", "down")),
            (9, lambda: c2("topo", "link", "r2", "r3", "up")),
        ],
    )
    inside = [a for a in run.arrivals if times[3] + 0.05 < a.received < times[9] - 0.5]
    assert inside == []
    assert any(a.received > times[9] for a in run.arrivals)
    assert any(a.received < times[3] for a in run.arrivals)

    # carrier-down: the routers see their radio interface lose carrier, then regain it
    def operstate() -> str:
        out = subprocess.run(["ip", "-n", "c2-r2", "-o", "link", "show", "c2-r3"], capture_output=True, text=True)
        return out.stdout

    c2("topo", "link", "r2", "r3", "down", "--carrier")
    assert "NO-CARRIER" in operstate() or "LOWERLAYERDOWN" in operstate()
    gone = probe.send_stream(st, "h1", "h4", count=20, interval_s=0.1, drain_s=1.0)
    assert gone.arrivals == []
    status = c2("topo", "status").stdout
    assert "down (carrier)" in status or "down (carri" in status
    c2("topo", "link", "r2", "r3", "up")
    assert "NO-CARRIER" not in operstate()
    back = probe.send_stream(st, "h1", "h4", count=20, interval_s=0.1, drain_s=1.5)
    assert len(back.arrivals) >= 15


def test_fmn_4nations_every_unit_reaches_every_broker_and_down_leaves_nothing(clean):
    st = testbed.up("fmn-4nations")
    units = [n for n in st["nodes"] if "-u" in n]
    brokers = [n for n in st["nodes"] if n.endswith("-broker")]
    assert len(units) == 32 and len(brokers) == 4
    servers = {}
    for b in brokers:
        s = netns.socket_in(st["nodes"][b]["netns"])
        s.bind(("0.0.0.0", 47200))
        s.setblocking(False)
        servers[b] = s
    stop = threading.Event()

    def echo():
        while not stop.is_set():
            r, _, _ = select.select(list(servers.values()), [], [], 0.1)
            for s in r:
                data, peer = s.recvfrom(2048)
                s.sendto(data, peer)

    th = threading.Thread(target=echo, daemon=True)
    th.start()
    clients = {}
    for u in units:
        c = netns.socket_in(st["nodes"][u]["netns"])
        c.setblocking(False)
        clients[u] = c
    missing = {(u, b) for u in units for b in brokers}
    try:
        for _ in range(8):  # retries: the uplinks lose 1 % and run at 9.8 kbit/s
            for u, b in missing:
                clients[u].sendto(f"{u}>{b}".encode(), (testbed.node_address(st, b), 47200))
            deadline = time.monotonic() + 4
            while missing and time.monotonic() < deadline:
                r, _, _ = select.select(list(clients.values()), [], [], 0.2)
                for c in r:
                    data = c.recv(2048).decode()
                    u, b = data.split(">")
                    missing.discard((u, b))
            if not missing:
                break
    finally:
        stop.set()
        th.join()
        for s in list(servers.values()) + list(clients.values()):
            s.close()
    assert missing == set()

    emulator_pids = [ls["pid"] for ls in st["links"].values() if ls["pid"]]
    assert len(emulator_pids) == 4 and all(netns._alive(p) for p in emulator_pids)
    c2("topo", "down")
    assert leftovers() == {"namespaces": [], "root_interfaces": []}
    assert not any(netns._alive(p) for p in emulator_pids)
    assert not testbed.state_path().exists()
    again = c2("topo", "down")
    assert "nothing was up" in again.stdout


def test_up_over_the_leftovers_of_a_crash(clean):
    st = testbed.up("nps-chain", profile="cnr-tactical-1")
    pid = st["links"]["r2-r3"]["pid"]
    os.kill(pid, signal.SIGKILL)  # an emulator dies ...
    testbed.state_path().unlink()  # ... and the state is lost with it
    assert netns.list_ns(testbed.NS_PREFIXES)
    c2("topo", "up", "nps-chain", "--profile", "lan")
    st = testbed.read_state()
    run = probe.send_stream(st, "h1", "h4", count=20, interval_s=0.05, drain_s=1.0)
    assert len(run.arrivals) == 20
    c2("topo", "down")
    assert leftovers() == {"namespaces": [], "root_interfaces": []}


def test_demo_prints_measured_next_to_profile(clean):
    r = c2("topo", "demo", "--probes", "150")
    out = r.stdout
    assert "rate (frame bits)" in out and "one-way delay" in out and "loss" in out
    assert "9.8 kbit/s" in out
    assert leftovers()["namespaces"] == []


def test_gilbert_elliott_bursts_and_independent_directions(clean, tmp_path):
    topo = tmp_path / "pair.toml"
    topo.write_text("""
name = "ge-pair"
[[nodes]]
name = "ga"
[[nodes]]
name = "gb"
[[links]]
a = "ga"
b = "gb"
profile = { delay = "5ms", gilbert_elliott = { p = "4%", r = "25%" } }
reverse_profile = "lan"
""")
    st = testbed.up(str(topo), seed=7)
    fwd = probe.send_stream(st, "ga", "gb", count=5000, interval_s=0.001, drain_s=0.5)
    got = sorted(fwd.received_seqs())
    bursts, prev = [], -1
    for s in got + [len(fwd.sent)]:
        if s - prev > 1:
            bursts.append(s - prev - 1)
        prev = s
    mean_burst = statistics.mean(bursts)
    print(f"{len(bursts)} loss bursts, mean length {mean_burst:.2f} (configured 1/r = 4)")
    assert len(bursts) > 50
    assert mean_burst == pytest.approx(4.0, rel=0.30)
    rev = probe.send_stream(st, "gb", "ga", count=2000, interval_s=0.001, drain_s=0.5, port=probe.PORT + 2)
    assert rev.loss() == 0.0  # the reverse direction has its own (lan) profile


def test_capture_holds_what_the_link_delivered(clean, tmp_path):
    """`testbed.capture`: the pcapng of a lossy link holds the frames it delivered, once each, and
    the ones it lost marked as dropped (a comment), on the interface of their direction."""
    from scapy.utils import RawPcapReader

    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=7)
    paths = testbed.capture(["r2-r3"], tmp_path)
    run = probe.send_stream(st, "h1", "h4", count=200, interval_s=0.1, payload=12, drain_s=1.5)
    testbed.capture(["r2-r3"], None)
    live = testbed.status()["links"]["r2-r3"]["live"]
    frames = [(f, m.comments or [], m.ifname) for f, m in RawPcapReader(paths["r2-r3"])]
    carried = [(f, i) for f, c, i in frames if not c]
    dropped = [(f, c[0].decode(), i) for f, c, i in frames if c]
    got = len(run.arrivals)
    print(f"{len(carried)} frames carried, {len(dropped)} dropped; {got} probes received")
    probes = [i for f, i in carried if len(f) == PROBE_FRAME]
    assert len(probes) == got and set(probes) == {b"r2-r3 ab"}  # each probe that arrived, once, h1 -> h4
    assert len(carried) == live["ab"]["delivered"] + live["ba"]["delivered"]
    lost = [d for d in dropped if len(d[0]) == PROBE_FRAME]
    assert len(lost) == 200 - got and {d[1] for d in lost} <= {"dropped: lost"}  # the rest, marked
    assert paths["r2-r3"].endswith(".pcapng") and os.stat(paths["r2-r3"]).st_mode & 0o777 == 0o600
    assert testbed.capture(["r2-r3"], None) == {}  # stopping twice is harmless
    with pytest.raises(testbed.ConfigError, match="no-such-link"):
        testbed.capture(["no-such-link"], tmp_path)


def test_no_arp_crosses_an_emulated_link(clean, tmp_path):
    """Both ends of an emulated link know each other's MAC: the radio carries no ARP, and
    the ends' neighbour entries are permanent."""
    from scapy.layers.l2 import ARP
    from scapy.utils import rdpcap

    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=11)
    paths = testbed.capture(["r2-r3"], tmp_path)
    run = probe.send_stream(st, "h1", "h4", count=30, interval_s=0.1, payload=12, drain_s=1.5)
    testbed.capture(["r2-r3"], None)
    frames = rdpcap(str(paths["r2-r3"]))
    print(f"{len(frames)} frames captured, {len(run.arrivals)} probes received")
    assert run.arrivals, "no probe crossed the link"
    assert not [f for f in frames if ARP in f]
    neigh = netns.run_in("c2-r2", ["ip", "neigh", "show", "dev", "c2-r3"]).stdout
    assert "PERMANENT" in neigh, neigh
