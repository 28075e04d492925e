"""Two agent islands joined by a relay, on real daemons: nps-chain with dtn7-rs on gw1 and
r2 (BPv7), IBR-DTN on gw4 (BPv6), and the relay on r3 running one of each.  The r2=r3
radio link (cnr-tactical-2) is cut; the relay is SIGKILLed while it is."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from test_overlay_live import collect, outage, running

from c2dtn.overlay.agents import agent_class
from c2dtn.topologies import testbed
from c2dtn.topologies.nodes import Nodes

KINDS = {"gw1": "dtn7", "r2": "dtn7", "gw4": "ibrdtn"}
BPA = ["gw1", "r2", "r3", "gw4"]
_why = next((f"{k}: {w}" for k in ("dtn7", "ibrdtn") if (w := agent_class(k).missing())), None)

pytestmark = [pytest.mark.netns, pytest.mark.skipif(_why is not None, reason=str(_why))]


@pytest.fixture
def islands(tmp_path):
    testbed.down()
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=12)
    nodes = Nodes(st, BPA, ["gw1", "gw4"], tmp_path / "nodes", agent=KINDS, relay="r3")
    cfg = nodes.paths["r3"]  # the relay serves metrics too, inside its namespace
    cfg.write_text(cfg.read_text().replace("[relay]\n", '[relay]\nmetrics = "127.0.0.1:9465"\n', 1))
    yield from running(nodes)


def _send(nodes: Nodes, src: str, dst: str, n: int) -> list[int]:
    out = []
    for i in range(n):
        out.append(nodes.send(src, dst, f"{src} order {i:03d} ".encode() + bytes(24)))
        if i % 20 == 19:
            time.sleep(1)
    return out


def _assert_once_in_order(nodes: Nodes, at: str, sent: list[int]) -> None:
    got = collect(nodes, at, len(sent), timeout=300, progress=f"at {at}")
    seqs = [d["seq"] for d in got]
    assert len(seqs) == len(set(seqs)), f"something reached {at} twice"
    assert sorted(seqs) == sorted(sent), f"{at} misses {sorted(set(sent) - set(seqs))[:10]}"
    assert seqs == sorted(seqs), f"out of order at {at}"


def test_both_ways_across_the_relay_through_an_outage_and_a_relay_killed_in_it(islands):
    nodes = islands
    cut = outage(2, 30)
    to_gw4 = _send(nodes, "gw1", "gw4", 100)  # BPv7 -> relay -> BPv6, into the cut
    to_gw1 = _send(nodes, "gw4", "gw1", 60)  # BPv6 -> relay (its bundles wait there) -> BPv7
    time.sleep(3)
    nodes.kill("r3")  # the relay and both its agents, as a power cut would, while the link is down
    time.sleep(2)
    nodes.start("r3")
    cut.join()
    _assert_once_in_order(nodes, "gw4", to_gw4)
    _assert_once_in_order(nodes, "gw1", to_gw1)
    relay_log = nodes.log("r3")
    assert relay_log.count("relay r3 up: dtn7 island (gw1, r2); ibrdtn island (gw4)") == 2
    assert "dropped" not in relay_log
    # its metrics since the restart: both agents up, what it forwarded, nothing held or dropped
    r = subprocess.run(
        ["ip", "netns", "exec", "c2-r3", sys.executable, "-c", "import urllib.request as u; "
         "print(u.urlopen('http://127.0.0.1:9465/metrics', timeout=10).read().decode())"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in r.stdout.splitlines()
        if line and line[0] != "#"
    }
    assert m['c2dtn_relay_agent_up{island="dtn7"}'] == 1 and m['c2dtn_relay_agent_up{island="ibrdtn"}'] == 1
    assert m.get("c2dtn_relay_forwarded_total", 0) >= 1 and m["c2dtn_relay_held_bytes"] == 0
    assert m.get("c2dtn_relay_dropped_full_total", 0) == 0
