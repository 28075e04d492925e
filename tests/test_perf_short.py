"""Short forms of `c2dtn perf gateway` and `c2dtn perf overlay`, run as a user runs them
(about a minute each).  Timing stays in the benchmarks: these check that what the report
says is the run's own -- each figure recomputed from the run's raw rows, the plot drawing
the same numbers, run.json naming the command and the code -- not what the figures are."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from c2dtn.perf import runs
from c2dtn.topologies.broker import mosquitto_missing
from c2dtn.topologies.nodes import agent_missing

pytestmark = [pytest.mark.netns, pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing()))]


def _run(tmp_path: Path, *args: str) -> tuple[Path, str]:
    p = subprocess.run(
        [sys.executable, "-m", "c2dtn.cli", "perf", *args], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (out,) = (tmp_path / "results").iterdir()
    meta = json.loads((out / "run.json").read_text())
    assert meta["command"] == "c2dtn perf " + " ".join(args)
    head = runs.commit()
    assert meta["commit"] == head and (head is None or len(head.split("+")[0]) == 40)
    return out, p.stdout


@pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing()))
def test_perf_gateway_short_reports_its_own_runs(tmp_path):
    out, stdout = _run(tmp_path, "gateway", "--count", "400", "--runs", "2", "--qos", "1")
    data = json.loads((out / "summary.json").read_text())
    for s in data["summary"]:
        rs = [r for r in data["runs"] if r["mode"] == s["mode"] and r["qos"] == s["qos"]]
        assert len(rs) == s["runs"] == 2 and s["delivered_min"] == min(r["delivered"] for r in rs) == 400
        assert s["delivery_rate"] == statistics.median(r["count"] / r["deliver_s"] for r in rs)
        if s["mode"] == "c2dtn":  # messages per CPU-second of gw1, from the CPU time the run read
            per = [r["count"] / r["gw1_cpu_s"] for r in rs]
            assert s["gw1_per_core_s"] == pytest.approx(statistics.median(per))
            assert f"{s['gw1_per_core_s']:.0f}" in stdout
    drawn = json.loads((out / "plot.json").read_text())
    bars = {x["label"]: x["y"] for x in drawn[0]["series"]}
    assert bars["c2dtn"] == [s["delivery_rate"] for s in data["summary"] if s["mode"] == "c2dtn"]
    per_cpu = next(x for x in drawn[1]["series"] if x["label"] == "gw1 msgs per CPU-s")
    assert per_cpu["y"] == [s["gw1_per_core_s"] for s in data["summary"] if s["mode"] == "c2dtn"]


def test_perf_overlay_short_reports_its_own_runs(tmp_path):
    out, stdout = _run(tmp_path, "overlay", "--sizes", "1k", "--runs", "1", "--tactical-bytes", "3000")
    data = json.loads((out / "summary.json").read_text())
    (row,) = data["lan_runs"]
    assert row["bare_rtt_s"] == statistics.median(row["bare_rtts"]) and len(row["overlay_rtts"]) >= 30
    assert row["overlay_rtt_s"] == statistics.median(row["overlay_rtts"])
    (s,) = list(csv.DictReader(open(out / "summary.csv")))
    assert float(s["rtt_ratio"]) == pytest.approx(row["overlay_rtt_s"] / row["bare_rtt_s"])
    assert float(s["throughput_ratio"]) == pytest.approx(row["overlay_bps"] / row["bare_bps"])
    assert f"{float(s['rtt_ratio']):.2f}" in stdout
    tp, rtt = json.loads((out / "plot.json").read_text())
    assert next(x for x in rtt["series"] if x["label"] == "c2dtn overlay")["y"] == [
        pytest.approx(row["overlay_rtt_s"] * 1000)
    ]
    tac = data["tactical"]  # across the radio link, the CLA the topology names (nps-chain: udphc)
    assert tac["cla"] == "udphc" and "over udphc" in stdout
    assert tac["payload_bytes"] == 3000 and tac["fraction"] == pytest.approx(tac["goodput_bps"] / tac["link_bps"])
