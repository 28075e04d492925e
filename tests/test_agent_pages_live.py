"""Each agent page's two-box config, as the page prints it, carries MQTT across the radio:
the testbed's `two-box` topology has the addresses the pages use; only the storage folder,
the namespace and the keys (made by `c2dtn keys`, as the page says) are this run's own."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_docs import BLOCK, DOCS
from test_gateway_live import lines

from c2dtn.cli import cli
from c2dtn.overlay.agents import agent_class
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import mosquitto_missing, start_mosquitto
from c2dtn.topologies.nodes import AGENTS, Nodes

pytestmark = [pytest.mark.netns, pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing()))]
BOXES = ["gw1", "gw4"]


def page_configs(kind: str, tmp: Path, st: dict) -> dict[str, Path]:
    """The page's two configs, with this run's storage, namespace and keys."""
    r = CliRunner().invoke(cli, ["keys", str(tmp), *BOXES])
    assert r.exit_code == 0, r.output
    out = {}
    for m in BLOCK.finditer((DOCS / "agents" / f"{kind}.md").read_text()):
        if m.group(1) != "toml":  # the page's configs; other blocks are commands or excerpts
            continue
        text = m.group(2)
        node = re.search(r'^id = "([^"]+)"', text, re.M).group(1)
        text = re.sub(
            r'^storage = "[^"]*"',
            f'storage = "{tmp / node / "state"}"\nnetns = "{testbed.node_netns(st, node)}"',
            text,
            count=1,
            flags=re.M,
        )
        (tmp / node).mkdir(exist_ok=True)
        out[node] = tmp / f"{node}.toml"
        out[node].write_text(text)
        out[node].chmod(0o600)
    assert sorted(out) == BOXES
    return out


@pytest.fixture(params=AGENTS)
def two_boxes(request, tmp_path):
    kind = request.param
    why = agent_class(kind).missing()
    if why:
        pytest.skip(f"{kind}: {why}")
    testbed.down()
    st = testbed.up("two-box", seed=21)
    h4 = testbed.node_address(st, "h4")
    broker = start_mosquitto("c2-h4", tmp_path / "broker4", h4)
    nodes = Nodes(st, BOXES, BOXES, tmp_path, gateways={n: "" for n in BOXES}, configs=page_configs(kind, tmp_path, st))
    try:
        nodes.start_all(BOXES)
        yield nodes, h4
    finally:
        nodes.stop_all()
        broker.terminate()
        broker.wait(10)
        testbed.down()


def mqtt(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "c2dtn.perf.mqtt_clients", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_agent_pages_two_box_config_carries_orders_across_the_radio(two_boxes):
    nodes, h4 = two_boxes
    sub = mqtt(
        "h4", "sub", "--host", h4, "--topic", "orders/#", "--count", "5", "--timeout", "90", "--client-id", "c2-fob-sub"
    )
    time.sleep(2)  # the subscriber is in before the first order
    pub = mqtt("h1", "pub", "--host", h4, "--topic", "orders/alpha/", "--count", "5", "--client-id", "c2-vehicle")
    sent = lines(pub, 60)[-1]
    got = lines(sub, 100)
    assert sent["acked"] == 5, sent
    msgs = [r for r in got if "topic" in r]
    assert sorted(int(r["payload"].split()[0]) for r in msgs) == list(range(5)), got  # each once
    assert {r["topic"] for r in msgs} == {"orders/alpha/"}
    # they crossed as bundles through the gateways (TPROXY on gw1), not as MQTT over IP
    assert nodes.status("gw1")["mqtt"]["counters"]["published"] == 5
    assert nodes.status("gw4")["mqtt"]["counters"]["to_broker"] >= 1  # (publishes read together share an envelope)
