"""`c2dtn perf store` on small fills: a row per fill with its figures, the report's table,
and a plot that draws the same numbers."""

import json

from c2dtn.perf import store_bench


def test_store_bench_reports_each_fill_with_a_table_and_a_plot_of_the_same_figures(tmp_path):
    out = store_bench.main([200, 2000], out=tmp_path / "r")
    rows = json.loads((out / "summary.json").read_text())
    assert [r["envelopes"] for r in rows] == [200, 2000]
    for r in rows:
        assert 0 < r["submit_p50_ms"] <= r["submit_p99_ms"]
        assert set(r["plan_ms"]) == {n for n, _ in store_bench.PLAN_QUERIES} and r["plan_total_ms"] > 0
        assert r["receive_p50_ms"] > 0 and r["file_mb"] > 0 and r["rss_mb"] > 0 and r["reopen_ms"] > 0
    md = (out / "report.md").read_text()
    assert "| 2,000 | " in md and "![cost against envelopes held](plot.png)" in md
    drawn = json.loads((out / "plot.json").read_text())[0]
    p50 = next(s for s in drawn["series"] if s["label"] == "submit p50")
    assert p50["x"] == [200, 2000] and p50["y"] == [r["submit_p50_ms"] for r in rows]
    # whatever scans a whole table is named in the report, by the statement's purpose and plan
    for x in rows[-1]["full_scans"]:
        assert f"- {x}" in md and "SCAN" in x
