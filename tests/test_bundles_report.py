"""perf bundles: which sizes fit a run's budget, and the report built from its runs."""

import json

import matplotlib.image as mpimg

from perf import bundles_bench as b


def test_sizes_that_cannot_finish_or_cannot_be_carried_are_skipped_with_the_reason():
    assert b.plan_run("tcpcl", None, 1_000_000, "1M", 180) == (8, 10, None)  # lan: the full counts
    n, rtts, why = b.plan_run("tcpcl", 9800, 1000, "1k", 180)
    assert why is None and rtts == 3 and 3 <= n <= 200
    n, rtts, why = b.plan_run("tcpcl", 9800, 100_000, "100k", 180)
    assert n == 0 and "9.8 kbit/s" in why and "180 s" in why
    assert "datagram" in b.plan_run("udp", None, 100_000, "100k", 180)[2]


def test_report_has_medians_min_max_skips_and_a_plot(tmp_path):
    rows = []
    for run, (tp, rtt) in enumerate([(800e3, 0.020), (1000e3, 0.030), (900e3, 0.025)], 1):
        rows.append({"agent": "dtn7", "cla": "tcpcl", "profile": "lan", "size": "1k", "bytes": 1000, "run": run,
                     "throughput_bps": tp, "rtt_s": rtt, "rtts": [rtt], "link_bps": None})
        rows.append({"agent": "dtn7", "cla": "tcpcl", "profile": "lan", "size": "10k", "bytes": 10000, "run": run,
                     "throughput_bps": tp * 5, "rtt_s": rtt * 2, "rtts": [rtt * 2], "link_bps": None})
    rows.append({"agent": "dtn7", "cla": "udp", "profile": "lan", "size": "1M", "bytes": 10 ** 6, "run": 1,
                 "skipped": "too big for a datagram"})
    summary = b.report(rows, tmp_path)
    s = next(x for x in summary if x["size"] == "1k")
    assert (s["throughput_bps"], s["throughput_min"], s["throughput_max"], s["rtt_s"]) == (900e3, 800e3, 1000e3, 0.025)
    md = (tmp_path / "report.md").read_text()
    assert "900.00 kbit/s (800.00 kbit/s-1.00 Mbit/s)" in md and "too big for a datagram" in md
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 7
    assert json.loads((tmp_path / "summary.json").read_text())[-1]["skipped"] == "too big for a datagram"
    img = mpimg.imread(tmp_path / "plot.png")
    assert img.shape[1] > 800 and img.std() > 0.01
