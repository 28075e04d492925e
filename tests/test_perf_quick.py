"""`c2dtn perf matrix --quick`, run as a user runs it but with 12 s of reports and a 6 s
drain (its 20 s and 10 s take a minute more, and the suite has a time budget): fmn-4nations,
a report every 2 s, on cnr-tactical-1 and cnr-tactical-2, overlay and Mosquitto bridge in
each run.  Checks what a user reads: the table rows, that each figure is the run's own
summary (itself computed from its events.jsonl), and the plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from c2dtn.perf import bft
from c2dtn.topologies.broker import mosquitto_missing
from c2dtn.topologies.nodes import agent_missing

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing())),
    pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing())),
]


def test_quick_matrix_reports_every_run_and_the_overlay_keeps_positions_fresh(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "c2dtn.cli", "perf", "matrix", "--quick", "--duration", "12", "--drain", "6"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = next((tmp_path / "results").glob("*-matrix-quick"))
    rows = json.loads((out / "matrix.json").read_text())
    assert [(r["profile"], r["mode"]) for r in rows] == [
        ("cnr-tactical-1", "overlay"),
        ("cnr-tactical-1", "mqtt-bridge"),
        ("cnr-tactical-2", "overlay"),
        ("cnr-tactical-2", "mqtt-bridge"),
    ]
    for r in rows:
        run = Path(r["run"]) if Path(r["run"]).is_absolute() else tmp_path / r["run"]
        summary = json.loads((run / "summary.json").read_text())
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        info = next(m for m in summary["modes"] if m["mode"] == r["mode"])
        again = bft.summarize(
            events,
            r["mode"],
            {
                "supersedes": r["mode"] == "overlay",
                "receivers": [tuple(x) for x in _receivers()],
                "link_bytes": info["link_bytes"],
            },
            2.0,
        )
        assert (again["delivered"], again["lost"]) == (r["delivered"], r["lost"])  # traces back to events.jsonl
        assert r["expected"] == sum(1 for e in events if e["mode"] == r["mode"] and e.get("ev") == "sent") * 24
    o2, b2 = rows[2], rows[3]
    # 10 % loss, reports beyond what the links carry: the overlay keeps every unit's position
    # fresh at every other nation; plain MQTT falls behind (its ages grow with the run: at
    # least twice the overlay's within 12 s)
    assert o2["lost_pct"] < b2["lost_pct"] and o2["aoi_p95_s"] < 5 and 2 * o2["aoi_p95_s"] < b2["aoi_p95_s"], (o2, b2)
    assert "| fmn-4nations | cnr-tactical-2 | 2 s | overlay |" in (out / "report.md").read_text()
    import matplotlib.image as mpimg

    for png in ("delivery_vs_loss.png", "aoi.png"):
        img = mpimg.imread(out / png)
        assert img.shape[0] > 300 and img.shape[1] > 500 and img.std() > 0.01  # drawn, not blank
    # the plots show the table's own figures (plots.save_figure writes what each one draws)
    dl = json.loads((out / "delivery_vs_loss.json").read_text())[0]
    assert dl["title"] == "Delivery ratio against link loss"
    for r in rows:
        line = next(x for x in dl["series"] if x["label"] == f"{r['mode']}, fmn-4nations, every 2 s")
        assert r["delivery_ratio"] == pytest.approx(line["y"][line["x"].index(r["loss_pct"])])
    bars = json.loads((out / "aoi.json").read_text())[0]["series"][0]
    assert bars["y"] == pytest.approx([r["aoi_p95_s"] for r in rows])
    assert "matrix" in p.stdout and "runs" in p.stdout  # the progress bar and the table were shown


def _receivers() -> list[tuple[str, str]]:
    return [(f"{n}-S{u:03d}", n) for n in ("DEU", "NOR", "PRT", "USA") for u in range(1, 9)]
