"""The MQTT gateway on real daemons: nps-chain, r2=r3 on cnr-tactical-2, mosquitto on
h4 behind gw4, paho-mqtt clients on h1 whose traffic gw1 intercepts (TPROXY)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ip_gateway.broker import mosquitto_missing, start_mosquitto
from overlay.testbed_nodes import Nodes, dtnd_missing
from topologies import testbed

pytestmark = [pytest.mark.netns, pytest.mark.skipif(dtnd_missing() is not None, reason=str(dtnd_missing())),
              pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing()))]

BPA = ["gw1", "r2", "r3", "gw4"]


def gateway_tables(h4: str) -> dict[str, str]:
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    topics = ('[[gateway.topic]]\nfilter = "c2/#"\npriority = "immediate"\nlifetime = 3600\n')
    return {"gw1": f'[gateway]\ntproxy = true\n\n[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n\n{topics}',
            "gw4": f"[gateway]\n\n{topics}"}


@pytest.fixture
def mqtt_chain(tmp_path):
    testbed.down()
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=13)
    h4 = testbed.node_address(st, "h4")
    nodes = Nodes(st, BPA, ["gw1", "gw4"], tmp_path / "nodes", gateways=gateway_tables(h4))
    broker = start_mosquitto("c2-h4", tmp_path / "broker", "127.0.0.1")
    for n in BPA:
        nodes.start(n, wait=False)
    for n in BPA:
        nodes.wait_ready(n)
    yield nodes, h4
    nodes.stop_all()
    broker.terminate()
    broker.wait(10)
    testbed.down()


def client(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "perf.mqtt_clients", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(p: subprocess.Popen, timeout: float) -> list[dict]:
    out, err = p.communicate(timeout=timeout)
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert rows, f"client printed nothing: {err[-1500:]}"
    return rows


def test_300_qos1_publishes_across_a_60s_outage_all_arrive_once_no_disconnect(mqtt_chain):
    nodes, h4 = mqtt_chain
    sub = client("h4", "sub", "--host", "127.0.0.1", "--topic", "c2/#", "--qos", "1", "--count", "300",
                 "--timeout", "420", "--client-id", "c2sub")
    time.sleep(1.0)
    pub = client("h1", "pub", "--host", h4, "--topic", "c2/orders/{n}", "--qos", "1", "--count", "300",
                 "--interval", "0.1", "--timeout", "400", "--client-id", "c2pub")
    time.sleep(5)
    testbed.change_link("r2", "r3", "down")
    t_down = time.monotonic()
    time.sleep(60)
    testbed.change_link("r2", "r3", "up")
    print(f"link was down {time.monotonic() - t_down:.0f} s", flush=True)
    p = lines(pub, 480)[-1]
    got = lines(sub, 480)
    msgs = [r for r in got if "topic" in r]
    ids = [int(r["payload"].split()[0]) for r in msgs]
    print("publisher:", p, "subscriber got", len(ids), "gw1:", nodes.status("gw1").get("mqtt"), flush=True)
    assert p["acked"] == 300 and p["disconnects"] == [], "the publisher saw the outage"
    assert len(ids) == len(set(ids)), "a message arrived twice"
    assert sorted(ids) == list(range(300)), f"missing {sorted(set(range(300)) - set(ids))[:10]}"
    # the intercepting rules go with the gateway
    nodes.stop_all()
    rules = subprocess.run(["ip", "netns", "exec", "c2-gw1", "nft", "list", "ruleset"], capture_output=True, text=True)
    assert "c2dtn_tproxy" not in rules.stdout
