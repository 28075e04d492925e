"""perf scale's figures: the round-robin floor, the ratio to it, the verdict, memory per unit
added, and the plots' data beside them."""

import json

from c2dtn.perf import scale


def _summary(aoi: float, sent: int, lost: int) -> dict:
    return {
        "sent": sent,
        "expected": sent * 6,
        "delivered": sent * 6 - lost,
        "superseded": 0,
        "lost": lost,
        "lost_pct": 100 * lost / (sent * 6),
        "aoi_p95_s": aoi,
        "aoi_mean_s": aoi / 2,
        "uplink_bytes_per_report": 180.0,
    }


def _info(rss_mb: float, cpu_s: float) -> dict:
    # four uplinks of 9,800 bit/s; 100 s of run
    return {
        "link_bps": 4 * 9800,
        "run_s": 100.0,
        "link_bytes": 480_000,
        "box": {"cpu_s": cpu_s, "rss_bytes": int(4 * rss_mb * 1e6)},
    }


def test_floor_is_one_turn_of_the_queue_plus_the_period():
    # 200 units x 100 B on 9,800 bit/s: 16.3 s a turn, plus 10 s
    assert abs(scale.floor_s(200, 100, 9800, 10) - (200 * 800 / 9800 + 10)) < 1e-9
    assert scale.floor_s(8, 100, 9800, 10) < 11


def test_rows_report_the_ratio_to_the_floor_and_memory_per_unit_added(tmp_path):
    plan = scale.ScalePlan(sizes=(8, 200), modes=("overlay", "mqtt-bridge"))
    rows = [
        scale.row_of(plan, 8, "overlay", _summary(11.0, 100, 0), _info(30.0, 4.0)),
        scale.row_of(plan, 8, "mqtt-bridge", _summary(12.0, 100, 0), _info(3.0, 0.4)),
        scale.row_of(plan, 200, "overlay", _summary(45.0, 2400, 0), _info(49.2, 40.0)),
        scale.row_of(plan, 200, "mqtt-bridge", _summary(300.0, 2400, 9000), _info(13.0, 2.0)),
    ]
    md = "\n".join(scale.report(tmp_path, plan, rows))
    big = rows[2]
    assert abs(big["floor_s"] - 26.33) < 0.01 and abs(big["aoi_over_floor"] - 45.0 / 26.33) < 0.01
    assert abs(big["box_rss_kb_per_unit"] - 100.0) < 1e-6  # (49.2 - 30.0) MB over 192 units added
    assert rows[0]["box_rss_kb_per_unit"] is None  # the smallest size has nothing to compare with
    assert abs(big["box_cpu_share"] - 0.1) < 1e-9 and abs(big["box_cpu_ms_per_unit_s"] - 0.5) < 1e-9
    assert "not within 1.5x the floor at every size (worst: 1.71 at 200 units)" in md
    assert "| AoI p95 / floor | 1.03 | 1.13 | 1.71 | 11.40 |" in md
    data = json.loads((tmp_path / "scale.json").read_text())
    series = {s["label"]: s for p in data for s in p["series"]}
    assert series["overlay: AoI p95"]["y"] == [11.0, 45.0]
    assert (tmp_path / "cost.png").exists() and (tmp_path / "summary.csv").exists()
