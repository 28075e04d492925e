"""perf overlay's report: medians over runs, ratios per run with their spread, CSV, plot data."""

import csv
import json

import pytest

from c2dtn.perf import overlay_bench as ob


def test_report_gives_median_ratios_with_their_spread_and_a_plot_of_the_medians(tmp_path, capsys):
    rows = []
    for run, (bare_rtt, over_rtt, bare_bps, over_bps) in enumerate(
        [(0.010, 0.014, 3e6, 2.7e6), (0.012, 0.018, 2e6, 2.0e6), (0.011, 0.0143, 2.5e6, 2.0e6)], 1
    ):
        rows.append(
            {
                "size": "1k",
                "bytes": 1000,
                "run": run,
                "bare_rtt_s": bare_rtt,
                "overlay_rtt_s": over_rtt,
                "bare_bps": bare_bps,
                "overlay_bps": over_bps,
            }
        )
    rows.append(
        {
            "size": "1M",
            "bytes": 10**6,
            "run": 1,
            "bare_rtt_s": 0.080,
            "overlay_rtt_s": 0.100,
            "bare_bps": 150e6,
            "overlay_bps": 140e6,
        }
    )
    ob.report(rows, None, tmp_path)
    (s1k, s1m) = list(csv.DictReader(open(tmp_path / "summary.csv")))
    # per-run round-trip ratios 1.4, 1.5, 1.3: median 1.4 (not the ratio of the medians, 14.3/11)
    assert abs(float(s1k["rtt_ratio"]) - 1.4) < 1e-9
    assert (round(float(s1k["rtt_ratio_min"]), 3), round(float(s1k["rtt_ratio_max"]), 3)) == (1.3, 1.5)
    assert (float(s1k["throughput_ratio"]), float(s1k["throughput_ratio_min"])) == (0.9, 0.8)
    assert s1k["runs"] == "3" and abs(float(s1m["rtt_ratio"]) - 1.25) < 1e-9
    out = capsys.readouterr().out
    assert "1.40" in out and "1.30-1.50" in out and "0.80-1.00" in out
    tp, rtt = json.loads((tmp_path / "plot.json").read_text())
    over = next(x for x in rtt["series"] if x["label"] == "c2dtn overlay")
    assert over["y"] == [14.3, 100.0]  # median round trips in ms, by payload
    bare = next(x for x in tp["series"] if x["label"] == "bare dtnd")
    assert bare["y"] == [2.5, 150.0]  # median throughput in Mbit/s


def test_report_of_several_agents_keeps_each_agents_rows_its_skips_and_bare_losses_apart(tmp_path, capsys):
    rows = [
        {
            "agent": "dtn7",
            "cla": "tcpcl",
            "size": "1k",
            "bytes": 1000,
            "run": 1,
            "bare_rtt_s": 0.010,
            "overlay_rtt_s": 0.015,
            "bare_bps": 3e6,
            "overlay_bps": 3.3e6,
        },
        {
            "agent": "ion",
            "cla": "udp",
            "size": "100k",
            "bytes": 100_000,
            "skipped": "ion runs over UDP here, whose CLA sends a bundle as one datagram (at most ~65 kB)",
        },
    ]
    for run, (bare_rtt, over_rtt, lost) in enumerate([(0.050, 0.055, 3), (0.060, 0.060, 0)], 1):
        rows.append(
            {
                "agent": "ion",
                "cla": "udp",
                "size": "1k",
                "bytes": 1000,
                "run": run,
                "bare_rtt_s": bare_rtt,
                "overlay_rtt_s": over_rtt,
                "bare_bps": 1e6,
                "overlay_bps": 0.8e6,
                "bare_lost": lost,
            }
        )
    ob.report(rows, None, tmp_path)
    got = {(s["agent"], s["size"]): s for s in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert list(got) == [("dtn7", "1k"), ("ion", "1k"), ("ion", "100k")]  # sizes in order, skips in place
    assert abs(float(got["ion", "1k"]["rtt_ratio"]) - 1.05) < 1e-9 and got["ion", "1k"]["runs"] == "2"
    assert (got["ion", "1k"]["bare_lost"], got["ion", "1k"]["bare_sent"]) == ("3", str(2 * ob.COUNTS["1k"]))
    assert got["ion", "100k"]["runs"] == "0" and "one datagram" in got["ion", "100k"]["skipped"]
    out = capsys.readouterr().out
    assert "skipped: ion 100k: ion runs over UDP" in out and "1.10" in out  # dtn7's 1k round trip ratio
    tp, rtt = json.loads((tmp_path / "plot.json").read_text())
    labels = [x["label"] for x in rtt["series"]]
    assert labels == ["bare dtnd", "overlay on dtn7", "bare ion", "overlay on ion"]
    assert next(x for x in rtt["series"] if x["label"] == "overlay on ion")["y"] == [pytest.approx(57.5)]


def test_a_run_whose_bare_agent_stopped_answering_is_left_out_and_said_why(tmp_path, capsys):
    why = "bare agent, 10000-byte round trips: 3 pings in a row unanswered within 30 s (ping 3 of 40)"
    rows = [
        {"agent": "hdtn", "cla": "tcpcl", "size": "10k", "bytes": 10_000, "run": 1, "failed": why},
        {
            "agent": "hdtn",
            "cla": "tcpcl",
            "size": "100k",
            "bytes": 100_000,
            "run": 1,
            "failed": "not measured: this run's bare chain had failed at 10k",
        },
    ]
    for run in (2, 3):
        rows.append(
            {
                "agent": "hdtn",
                "cla": "tcpcl",
                "size": "10k",
                "bytes": 10_000,
                "run": run,
                "bare_rtt_s": 0.044,
                "overlay_rtt_s": 0.088,
                "bare_bps": 2e8,
                "overlay_bps": 5e7,
                "bare_lost": 0,
            }
        )
    ob.report(rows, None, tmp_path)
    got = {s["size"]: s for s in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert got["10k"]["runs"] == "2" and float(got["10k"]["rtt_ratio"]) == 2.0 and got["10k"]["failed"] == why
    assert got["100k"]["runs"] == "0" and got["100k"]["skipped"].startswith("every run failed: not measured")
    out = " ".join(capsys.readouterr().out.split())
    assert "left out: hdtn 10k: 1 run(s) failed: bare agent, 10000-byte round trips" in out


def test_each_radio_run_draws_its_own_losses_and_an_invocation_its_own_unless_a_seed_is_given(tmp_path, monkeypatch):
    """Every radio run replayed the emulator's seed 5, one loss pattern: its runs were not
    independent.  Now run i is seeded SEED + 1000 i, SEED drawn afresh per invocation (or --seed)."""
    seen: list[list[int]] = []
    reported = []

    def fake_tactical(**kw):
        seen[-1].append(kw["seed"])
        return {"profile": "cnr-tactical-2", "seed": kw["seed"], "fraction": 0.5, "goodput_bps": 4900.0,
                "seconds": 90.0, "payload_bytes": 60_000, "link_bps": 9800.0, "cla": "udp"}  # fmt: skip

    monkeypatch.setattr(ob, "tactical", fake_tactical)
    monkeypatch.setattr(ob, "run_dir", lambda _kind: tmp_path)
    monkeypatch.setattr(ob, "report", lambda rows, tac, out: reported.append(tac))
    for seed in (None, None, 77, 77):
        seen.append([])
        ob.main(["1k"], 3, 60_000, skip_lan=True, seed=seed)
    drawn1, drawn2, given1, given2 = seen
    assert len(set(drawn1)) == 3 and drawn1 != drawn2  # independent runs, and invocations
    assert given1 == given2 == [77, 1077, 2077]  # the same losses again when asked
    assert [r["seed"] for r in reported[-1]["all_runs"]] == [77, 1077, 2077]
