"""perf bundles: which sizes fit a run's budget, and the report built from its runs."""

import json

import matplotlib.image as mpimg
import pytest

from c2dtn.overlay.agents import agent_class
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

    from c2dtn.perf import bare_client

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
                asyncio.get_running_loop().call_later(
                    0.35 if i == 5 else 0.01, self.q.put_nowait, SimpleNamespace(payload=payload[:16])
                )

        async def deliveries(self, ep):
            while True:
                yield await self.q.get()

    t0 = time.monotonic()
    d = asyncio.run(bare_client.data(LossyAgent(), "gw4", 100, 20, 4, timeout=30, ack_timeout=0.3))
    assert (d["sent"], d["acked"], d["lost"], d["late"]) == (20, 17, 3, 1)
    assert time.monotonic() - t0 < 5  # not the 30 s budget
    assert d["end"] - d["start"] < 2  # the run ends at the last ack


def test_report_has_medians_min_max_skips_and_a_plot(tmp_path):
    rows = []
    for run, (tp, rtt) in enumerate([(800e3, 0.020), (1000e3, 0.030), (900e3, 0.025)], 1):
        rows.append(
            {
                "agent": "dtn7",
                "cla": "tcpcl",
                "profile": "lan",
                "size": "1k",
                "bytes": 1000,
                "run": run,
                "throughput_bps": tp,
                "rtt_s": rtt,
                "rtts": [rtt],
                "link_bps": None,
            }
        )
        rows.append(
            {
                "agent": "dtn7",
                "cla": "tcpcl",
                "profile": "lan",
                "size": "10k",
                "bytes": 10000,
                "run": run,
                "throughput_bps": tp * 5,
                "rtt_s": rtt * 2,
                "rtts": [rtt * 2],
                "link_bps": None,
            }
        )
    for r in rows:
        r.update(count=100, lost=1 if r["size"] == "1k" else 0)
    rows.append(
        {
            "agent": "dtn7",
            "cla": "udp",
            "profile": "lan",
            "size": "1M",
            "bytes": 10**6,
            "run": 1,
            "skipped": "too big for a datagram",
        }
    )
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


def test_each_agent_runs_on_the_clas_asked_for_it_and_says_why_it_cannot_on_others():
    assert b.pairs(["dtn7", "ion", "ibrdtn"], ["dtn7:tcpcl", "ion:udp", "ibrdtn:tcpcl"]) == [
        ("dtn7", "tcpcl"),
        ("ion", "udp"),
        ("ibrdtn", "tcpcl"),
    ]
    assert b.pairs(["dtn7", "ion"], ["tcpcl", "ion:udp"]) == [("dtn7", "tcpcl"), ("ion", "tcpcl"), ("ion", "udp")]
    assert "no mtcp convergence layer" in b.cannot_run("ibrdtn", "mtcp")
    assert "ion runs over udp or ltp only here" in b.cannot_run("ion", "tcpcl")
    assert b.cannot_run("ion", "ltp") == agent_class("ion").missing()  # LTP runs where ION is built
    # each agent's UDP limit is its own: ION's datagram holds ~65 kB, IBR-DTN fragments
    assert "ion's UDP CLA" in b.plan_run("udp", None, 100_000, "100k", 180, agent="ion")[2]
    assert b.plan_run("udp", None, 10_000, "10k", 180, agent="ion")[2] is None
    assert b.plan_run("udp", None, 1_000_000, "1M", 180, agent="ibrdtn")[2] is None
    # ION's BIBE custody rides on its UDP CLA, and is ION's only
    assert "dtn7 has no udp+bibe: it is ion's own" in b.cannot_run("dtn7", "udp+bibe")
    assert b.cannot_run("ion", "udp+bibe") == agent_class("ion").missing()
    assert "ion's UDP CLA" in b.plan_run("udp+bibe", None, 100_000, "100k", 180, agent="ion")[2]


def test_a_paced_source_stamps_each_bundle_and_the_sink_gives_each_ones_latency():
    import asyncio

    from c2dtn.overlay.agent import AgentError
    from c2dtn.perf import bare_client

    class Link:
        """Passes bundles after 50 ms; refuses bundle 2 (the agent's error is counted, not fatal)."""

        def __init__(self):
            self.q = asyncio.Queue()
            self.n = 0

        async def register(self, ep):
            pass

        async def send(self, dst, ep, payload, lifetime):
            self.n += 1
            if self.n == 3:
                raise AgentError("no route")
            asyncio.get_running_loop().call_later(0.05, self.q.put_nowait, type("D", (), {"payload": payload})())

        async def deliveries(self, ep):
            while True:
                yield await self.q.get()

    async def run():
        link = Link()
        sink = asyncio.create_task(bare_client.sink(link, 5, timeout=3, stamps=True))
        src = await bare_client.source(link, "gw4", 100, 5, interval=0.05)
        return src, await sink

    src, got = asyncio.run(run())
    assert (src["sent"], src["refused"]) == (4, 1)
    assert [s[0] for s in got["stamps"]] == [0, 1, 3, 4]
    assert all(0.04 < r - s < 0.5 for _, s, r in got["stamps"])


def test_outage_figures_count_what_went_into_the_cut_and_when_the_last_of_it_came():
    # sent one a second from t=0; cut from 10 to 70; 3 sent into it arrive at 75, 76, 77; the rest before
    stamps = [[i, float(i), i + 0.01] for i in range(10)] + [[i, float(i), 65.0 + i] for i in (10, 11, 12)]
    f = b.outage_figures(stamps, sent=80, refused=0, down_at=10.0, up_at=70.0)
    assert (f["delivered"], f["lost"], f["into_outage"], f["into_outage_delivered"]) == (13, 67, 60, 3)
    assert abs(f["cleared_after_up_s"] - 7.0) < 1e-9 and f["latency_max_s"] == 65.0
    assert f["stamps"][0] == [-10.0, 0.01]  # sent 10 s before the cut, 10 ms on the way


def test_report_has_the_outage_table_its_plot_and_seed_002_beside_our_round_trips(tmp_path):
    rows = [
        {
            "agent": a,
            "cla": c,
            "profile": "lan",
            "size": "1k",
            "bytes": 1000,
            "run": 1,
            "count": 10,
            "lost": 0,
            "throughput_bps": 1e6,
            "rtt_s": rtt,
            "rtts": [rtt],
            "link_bps": None,
        }
        for a, c, rtt in (("ion", "udp", 0.093), ("ibrdtn", "tcpcl", 0.018))
    ]
    for run, into in ((1, 60), (2, 58)):
        stamps = [[-1.0, 0.01]] + [[float(t), 70.0 - t] for t in range(into)]
        rows.append(
            {
                "agent": "ibrdtn",
                "cla": "tcpcl",
                "profile": "lan, 60 s outage",
                "mode": "outage",
                "size": "1k",
                "bytes": 1000,
                "run": run,
                "outage_s": 60.0,
                "sent": 80,
                "refused": 0,
                "delivered": 20 + into,
                "lost": 60 - into,
                "into_outage": 60,
                "into_outage_delivered": into,
                "latency_s": 1.0 * run,
                "latency_max_s": 70.0,
                "cleared_after_up_s": 10.0 * run,
                "stamps": stamps,
            }
        )
    rows.append(
        {
            "agent": "ion",
            "cla": "tcpcl",
            "profile": "lan, 60 s outage",
            "mode": "outage",
            "size": "1k",
            "bytes": 1000,
            "run": 1,
            "outage_s": 60.0,
            "skipped": "ion runs over UDP only here",
        }
    )
    b.report(rows, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| ion | round trip, small bundles | seed 002 | 70-99 ms | 93-93 ms" in md
    assert "| ibrdtn | round trip, small bundles | seed 002 | ~10 ms | 18-18 ms" in md
    assert "| ion | throughput at 1 MB | seed 002 | over 100 Mbit/s | not measured: ion's UDP CLA" in md
    assert "seed 002: NPS 2017" in md
    assert "| ibrdtn | tcpcl | lan, 60 s outage | 2 | 158 of 160 | 118 of 120 | 1.5 s | 70.0 s | 15.0 s |" in md
    assert "skipped: ion runs over UDP only here" in md
    assert json.loads((tmp_path / "outage-summary.json").read_text())[0]["into_outage_delivered"] == 118
    (panel,) = json.loads((tmp_path / "outage.json").read_text())  # the data the plot draws
    line = next(x for x in panel["series"] if x["label"] == "ibrdtn tcpcl")
    assert len(line["x"]) == 1 + 60 + 1 + 58 and max(line["y"]) == 70.0
    assert mpimg.imread(tmp_path / "outage.png").std() > 0.01
    tp, rt = json.loads((tmp_path / "plot.json").read_text())  # seed 002's figures drawn beside ours
    assert next(x for x in tp["series"] if x["label"].startswith("seed 002: ion throughput at 1 MB"))["y"] == [100e3]
    seed = {x["label"]: x["y"] for x in rt["series"] if x["label"].startswith("seed 002")}  # each range's middle
    assert seed == {
        "seed 002: ion round trip 70-99 ms": [84.5, 84.5],
        "seed 002: ibrdtn round trip ~10 ms": [10.0, 10.0],
    }


@pytest.mark.parametrize(
    "args, says",
    [
        (["--cla", "ion:tcpx", "--agents", "ion"], "unknown CLA 'tcpx' in 'ion:tcpx'"),
        (["--agents", "dtn7", "--cla", "ion:udp"], "agent 'ion' of 'ion:udp' is not in --agents (dtn7)"),
        (["--agents", "dtn7,spindle"], "unknown agent 'spindle'"),
        (["--cla", ",,"], "no CLA given"),
    ],
)
def test_bad_agents_and_clas_are_named_before_anything_runs(args, says):
    from click.testing import CliRunner

    from c2dtn.cli import cli

    res = CliRunner().invoke(cli, ["perf", "bundles", *args])
    assert res.exit_code == 2 and says in res.output, res.output
