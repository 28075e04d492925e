"""The MQTT gateway's outage test over every agent other than dtn7 (whose run is in
test_gateway_live.py): the same nps-chain, brokers and gateways, every BPA of one kind."""

from __future__ import annotations

import os

import pytest
from test_gateway_live import _300_across_an_outage, _mqtt_chain, assert_300_once_unseen

from c2dtn.overlay.agents import agent_class
from c2dtn.topologies.broker import mosquitto_missing
from c2dtn.topologies.nodes import AGENTS

pytestmark = [pytest.mark.netns, pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing()))]


# Over HDTN and IBR-DTN left out of `make test` to keep the suite within its 35-minute budget
# (the fixture says where each passed); C2DTN_ALL_AGENT_TESTS=1 runs them
EVERY_AGENT = os.environ.get("C2DTN_ALL_AGENT_TESTS") == "1"


@pytest.fixture(params=[a for a in AGENTS if a != "dtn7"])
def mqtt_agent_chain(request, tmp_path):
    why = agent_class(request.param).missing()
    if why:
        pytest.skip(f"{request.param}: {why}")
    if request.param in ("hdtn", "ibrdtn") and not EVERY_AGENT:
        # the gateway talks to its node alone, whatever the agent: make test runs this over ION
        # only (over dtn7, tests/test_gateway_live.py's copy waits for C2DTN_ALL_AGENT_TESTS=1);
        # IBR-DTN's agent is in make test through tests/test_relay_live.py
        passed = {"hdtn": "2026-11-23", "ibrdtn": "in CI on 2026-11-25"}
        pytest.skip(
            f"{request.param}: left out of make test for the suite's 35-minute budget (passed "
            f"{passed[request.param]}); C2DTN_ALL_AGENT_TESTS=1 runs it"
        )
    yield from _mqtt_chain(tmp_path, request.param)


# 35 s of outage (40 s for dtn7 in test_gateway_live.py) still covers every publish after the
# 5th second, and saves CI half a minute per agent
def test_300_qos1_publishes_across_a_35s_outage_all_arrive_once_over_the_agent(mqtt_agent_chain):
    nodes, h1, h4 = mqtt_agent_chain
    assert_300_once_unseen(*_300_across_an_outage(nodes, h4, "agents", seconds=35))
