"""Seed 001's baseline on the testbed: 8 units publish MQTT-SN over the radio (nps-chain's
r2-r3, cnr-tactical-2) to the Paho MQTT-SN gateway beside h4's broker, in the same `perf bft`
run as the overlay; what a subscriber at h4 gets, and what the radio carried per report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from c2dtn.perf.mqtt_sn import gateway_missing
from c2dtn.topologies.broker import mosquitto_missing
from c2dtn.topologies.nodes import agent_missing

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(gateway_missing() is not None, reason=str(gateway_missing())),
    pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing())),
    pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing())),
]


def test_mqtt_sn_units_reach_the_broker_across_the_radio_and_cost_more_per_report_than_the_overlay(tmp_path):
    args = ["--modes", "mqtt-sn,overlay", "--duration", "20", "--drain", "30", "--outage", "none"]
    p = subprocess.run(
        [sys.executable, "-m", "c2dtn.cli", "perf", "bft", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (out,) = (tmp_path / "results").iterdir()
    rows = {r["mode"]: r for r in json.loads((out / "summary.json").read_text())["modes"]}
    sn, ov = rows["mqtt-sn"], rows["overlay"]
    print({m: (r["delivered"], r["sent"], round(r["link_bytes_per_delivery"] or 0)) for m, r in rows.items()})
    assert sn["sent"] == 80 and sn["delivered"] >= 60  # a PUBLISH lost is resent after 10 s
    # MQTT-SN's 7-byte header, the report whole, a PUBACK back: more than the overlay's
    assert sn["link_bytes_per_delivery"] > 230 and ov["link_bytes_per_delivery"] < sn["link_bytes_per_delivery"]
