"""Seed 001's baseline on the testbed: 8 units publish MQTT-SN over the radio (nps-chain's
r2-r3, cnr-tactical-2) to the Paho MQTT-SN gateway beside h4's broker, in the same `perf bft`
run as the overlay; what a subscriber at h4 gets, and what the radio carried per report."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--modes", "mqtt-sn,overlay", "--duration", "20", "--drain", "30", "--outage", "none", "--view", str(port)]
    log = open(tmp_path / "bft.log", "w+")
    p = subprocess.Popen(
        [sys.executable, "-m", "c2dtn.cli", "perf", "bft", *args], stdout=log, stderr=log, cwd=tmp_path
    )
    seen: dict[str, list] = {}  # mode -> the AoI rows the drill view showed during it
    deadline = time.monotonic() + 600
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(2)
        with contextlib.suppress(OSError, ValueError):
            st = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=5).read())
            if st["drill"] and st["drill"]["aoi"]["units"]:
                seen.setdefault(st["drill"]["aoi"]["mode"], []).append(st["drill"]["aoi"]["units"])
    if p.poll() is None:
        p.kill()
    p.wait()
    log.seek(0)
    assert p.returncode == 0, log.read()[-5000:]
    # the drill view followed each mode live: its 8 units, and their age at h4's subscriber
    for mode in ("mqtt-sn", "overlay"):
        last = seen[mode][-1]
        assert len(last) == 8 and any(isinstance(u["aoi_s"].get("h4-sub"), float) for u in last), last
    (out,) = (tmp_path / "results").iterdir()
    rows = {r["mode"]: r for r in json.loads((out / "summary.json").read_text())["modes"]}
    sn, ov = rows["mqtt-sn"], rows["overlay"]
    print({m: (r["delivered"], r["sent"], round(r["link_bytes_per_delivery"] or 0)) for m, r in rows.items()})
    assert sn["sent"] == 80 and sn["delivered"] >= 60  # a PUBLISH lost is resent after 10 s
    # MQTT-SN's 7-byte header, the report whole, a PUBACK back: more than the overlay's
    assert sn["link_bytes_per_delivery"] > 230 and ov["link_bytes_per_delivery"] < sn["link_bytes_per_delivery"]
    # the radio hop's capture, read by tshark (Debian's) as a second opinion: the bytes of the
    # frames it carried agree with the report's link bytes, and the emulator's losses are in it,
    # marked; the report splits the bytes by layer
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed (`make apt-test` installs it)")
    for mode, row in rows.items():
        (pcap,) = out.glob(f"{mode}-*.pcapng")
        fields = ("frame.interface_name", "frame.len", "frame.comment", "udp.length", "data.len")
        r = subprocess.run(
            ["tshark", "-r", str(pcap), "-T", "fields", "-E", "occurrence=f", *[x for f in fields for x in ("-e", f)]],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        frames = [(line.split("\t") + [""] * 5)[:5] for line in r.stdout.splitlines()]
        carried = sum(int(f[1]) for f in frames if not f[2].startswith("dropped"))
        dropped = [f for f in frames if f[2].startswith("dropped")]
        assert abs(carried - row["link_bytes"]) <= 0.02 * row["link_bytes"], (mode, carried, row["link_bytes"])
        assert {f[0] for f in frames} == {"r2-r3 ab", "r2-r3 ba"}
        assert len(dropped) >= 1 and all(f[2] in ("dropped: lost", "dropped: link down") for f in dropped)
        assert row["layers"]["dropped"] == len(dropped)
        if mode == "overlay":  # tshark dissects the bundles (BPv7 over UDP): the same split at its seams
            kept = [f for f in frames if not f[2].startswith("dropped")]
            layers = row["layers"]["bytes"]
            assert sum(int(f[1]) - int(f[3]) + 8 for f in kept if f[3]) == layers["headers"]
            inner = sum(v for k, v in layers.items() if k not in ("headers", "primary", "blocks"))
            assert sum(int(f[4] or 0) for f in kept) == inner  # the bundles' payloads: our containers
    report = (out / "report.md").read_text()
    assert "## Where the link bytes go" in report and "dropped by the emulator" in report
