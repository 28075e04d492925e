"""perf bundles: which sizes fit a run's budget, and the report built from its runs."""

import json

import matplotlib.image as mpimg

from c2dtn.perf import bundles_bench as b


def test_sizes_that_cannot_finish_or_cannot_be_carried_are_skipped_with_the_reason():
    assert b.plan_run("tcpcl", None, 1_000_000, "1M", 180) == (8, 10, None)  # lan: the full counts
    n, rtts, why = b.plan_run("tcpcl", 9800, 1000, "1k", 180)
    assert why is None and rtts == 3 and n == 30  # ~30 s of link time: a sixth of the budget
    assert b.plan_run("tcpcl", 9800, 10_000, "10k", 180)[:2] == (3, 3)  # at least 3 transfers
    n, rtts, why = b.plan_run("tcpcl", 9800, 100_000, "100k", 180)
    assert n == 0 and "9.8 kbit/s" in why and "180 s" in why
    assert "datagram" in b.plan_run("udp", None, 100_000, "100k", 180)[2]


def test_lost_bundles_free_the_window_and_are_counted_not_waited_for():
    import asyncio
    import time
    from types import SimpleNamespace

    from c2dtn.perf import dtnd_client

    class LossyAgent:
        """Acks every bundle after 10 ms, except bundles 3, 7 and 18 (never) and 5 (after 0.35 s: late,
        but while the run still waits for 18)."""
        def __init__(self):
            self.q = asyncio.Queue()

        async def register(self, ep):
            pass

        async def send(self, dst, ep, payload, lifetime):
            i = int(payload.split(b":")[0])
            if i not in (3, 7, 18):
                asyncio.get_running_loop().call_later(0.35 if i == 5 else 0.01, self.q.put_nowait,
                                                      SimpleNamespace(payload=payload[:16]))

        async def deliveries(self, ep):
            while True:
                yield await self.q.get()

    t0 = time.monotonic()
    d = asyncio.run(dtnd_client.data(LossyAgent(), "gw4", 100, 20, 4, timeout=30, ack_timeout=0.3))
    assert (d["sent"], d["acked"], d["lost"], d["late"]) == (20, 17, 3, 1)
    assert time.monotonic() - t0 < 5  # not the 30 s budget
    assert d["end"] - d["start"] < 2  # the run ends at the last ack


def test_report_has_medians_min_max_skips_and_a_plot(tmp_path):
    rows = []
    for run, (tp, rtt) in enumerate([(800e3, 0.020), (1000e3, 0.030), (900e3, 0.025)], 1):
        rows.append({"agent": "dtn7", "cla": "tcpcl", "profile": "lan", "size": "1k", "bytes": 1000, "run": run,
                     "throughput_bps": tp, "rtt_s": rtt, "rtts": [rtt], "link_bps": None})
        rows.append({"agent": "dtn7", "cla": "tcpcl", "profile": "lan", "size": "10k", "bytes": 10000, "run": run,
                     "throughput_bps": tp * 5, "rtt_s": rtt * 2, "rtts": [rtt * 2], "link_bps": None})
    for r in rows:
        r.update(count=100, lost=1 if r["size"] == "1k" else 0)
    rows.append({"agent": "dtn7", "cla": "udp", "profile": "lan", "size": "1M", "bytes": 10 ** 6, "run": 1,
                 "skipped": "too big for a datagram"})
    summary = b.report(rows, tmp_path)
    s = next(x for x in summary if x["size"] == "1k")
    assert (s["throughput_bps"], s["throughput_min"], s["throughput_max"], s["rtt_s"]) == (900e3, 800e3, 1000e3, 0.025)
    md = (tmp_path / "report.md").read_text()
    assert "900.00 kbit/s (800.00 kbit/s-1.00 Mbit/s)" in md and "too big for a datagram" in md
    assert "| 3 of 300 (1.0 %) |" in md and "| 0 of 300 (0.0 %) |" in md
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 7
    assert json.loads((tmp_path / "summary.json").read_text())[-1]["skipped"] == "too big for a datagram"
    img = mpimg.imread(tmp_path / "plot.png")
    assert img.shape[1] > 800 and img.std() > 0.01
    tp, rtt = json.loads((tmp_path / "plot.json").read_text())
    assert tp["title"].startswith("Throughput by payload size") and rtt["title"].startswith("Round trip by payload")
    line = next(x for x in tp["series"] if x["label"] == "dtn7 tcpcl lan")
    assert (line["x"], line["y"]) == ([1000.0, 10000.0], [900.0, 4500.0])  # medians in kbit/s, by payload
    line = next(x for x in rtt["series"] if x["label"] == "dtn7 tcpcl lan")
    assert line["y"] == [25.0, 50.0]  # ms
    assert not any("udp" in x["label"] for x in tp["series"])  # the skipped size draws nothing
