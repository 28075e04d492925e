"""Conformance: MQTT clients get through the gateway what they get from their broker alone.
nps-chain on the lan profile; two Mosquitto brokers on h4 (1883 behind gw1's explicit
listener, carried by the overlay to gw4; 1884 reached direct, the reference); the scenarios
of tests/mqtt_scenarios.py (after the Eclipse Paho interoperability client tests) run from
h1 against each, MQTT 5.0 and 3.1.1, and every observation must be the same."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path

import pytest

from c2dtn.perf import paho_interop
from c2dtn.topologies.broker import mosquitto_missing
from c2dtn.topologies.nodes import agent_missing

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing())),
    pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing())),
]

SCENARIOS = Path(__file__).with_name("mqtt_scenarios.py")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    with paho_interop.broker_pair(tmp_path_factory.mktemp("mqtt-conf"), "c2conf/#", 19) as pair:
        yield pair


def observe(host: str, port: int, version: int) -> dict:
    p = subprocess.run(
        ["ip", "netns", "exec", "c2-h1", sys.executable, str(SCENARIOS), host, str(port), "c2conf/", str(version)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("version", [5, 4])
def test_mqtt_clients_get_through_the_gateway_what_they_get_from_the_broker_alone(chain, version):
    gw1, h4, nodes = chain
    # the two brokers share nothing, so both observations run at once (half the test's time)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ref_f, through_f = pool.submit(observe, h4, 1884, version), pool.submit(observe, gw1, 1883, version)
        ref, through = ref_f.result(), through_f.result()
    differ = [
        f"{k}:\n  broker alone        {ref[k]}\n  through the gateway {through.get(k)}"
        for k in ref
        if through.get(k) != ref[k]
    ]
    assert not differ, "\n".join(differ) + "\n" + nodes.log("gw1")[-1500:] + nodes.log("gw4")[-1500:]
    # the reference behaved as MQTT says, so agreeing with it means something
    assert [(r["t"], r["q"]) for r in ref["basic"]] == [
        ("c2conf/basic/0", 0),
        ("c2conf/basic/1", 1),
        ("c2conf/basic/2", 2),
    ]
    assert [r["q"] for r in ref["downgrade"]] == [0, 1, 1] and ref["unsubscribed"] == []
    assert [(r["p"], r["r"]) for r in ref["retained"]] == [("r0", 1), ("r1", 1), ("r2", 1)]
    assert ref["retained cleared"] == [] and [r["p"] for r in ref["will"]] == ["client died"]
    assert ref["offline session present"] is True and [r["p"] for r in ref["offline"]] == ["o1", "o2"]
    if version == 5:
        assert ref["properties"][0]["UserProperty"] == [["a", "2"], ["c", "3"], ["a", "1"]]
        assert [r["p"] for r in ref["subscribe options"]] == ["kept flag", "other"]
