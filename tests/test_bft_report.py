"""The BFT job's figures come from its event log: counts, delays, superseded apart from lost."""

import json

import matplotlib.image as mpimg
import pytest

from c2dtn.perf import bft


def _events() -> list[dict]:
    """Two nations, one unit each, 4 reports each way; per mode, which get through and when."""
    ev = []
    plan = {"overlay": {1: 0.5, 2: 1.5, 3: None, 4: 4.0}, "mqtt-bridge": {1: 0.2, 2: None, 3: None, 4: 9.0}}
    for mode, delays in plan.items():
        for nat, other in (("NOR", "PRT"), ("PRT", "NOR")):
            for seq, d in delays.items():
                ts = 1000.0 + seq * 2
                mid = f"{nat}-S001_{seq}"
                ev.append({"mode": mode, "ev": "sent", "id": mid, "nation": nat, "unit": f"{nat}-S001", "t": ts})
                if d is not None:
                    rec = {
                        "mode": mode,
                        "ev": "recv",
                        "rx": f"{other}-S001",
                        "rx_nation": other,
                        "id": mid,
                        "from": nat,
                        "ts": ts,
                        "t": ts + d,
                    }
                    ev.append(rec)
                    if seq == 4:
                        ev.append(dict(rec, t=ts + d + 1))  # a duplicate: counted once, reported apart
                # the sender's own nation sees it at once: not across a link, not counted
                ev.append(
                    {
                        "mode": mode,
                        "ev": "recv",
                        "rx": f"{nat}-S001",
                        "rx_nation": nat,
                        "id": mid,
                        "from": nat,
                        "ts": ts,
                        "t": ts + 0.01,
                    }
                )
    return ev


RECEIVERS = [("NOR-S001", "NOR"), ("PRT-S001", "PRT")]


def test_summary_counts_delays_and_tells_superseded_from_lost():
    ev = _events()
    o = bft.summarize(
        ev, "overlay", {"supersedes": True, "receivers": RECEIVERS, "link_bytes": 2400, "link_bps": 9800, "run_s": 10}
    )
    assert (o["sent"], o["expected"], o["delivered"], o["duplicates"], o["superseded"], o["lost"]) == (8, 8, 6, 2, 2, 0)
    assert (o["delay_min_s"], o["delay_median_s"], o["delay_max_s"]) == (0.5, 1.5, 4.0)
    assert o["link_bytes_per_delivery"] == 400
    assert o["in_drain"] == 2  # report 4 each way arrived after the last report was sent (t=1008)
    b = bft.summarize(ev, "mqtt-bridge", {"receivers": RECEIVERS})
    assert (b["sent"], b["delivered"], b["superseded"], b["lost"], b["lost_pct"]) == (8, 4, None, 4, 50.0)
    # each side's newest position of the other is report 4, sent at t=1008, the last report sent
    assert o["newest_age_max_s"] == 0.0
    # age of information: at t=1004 (period 2 after the first report at 1002) the newest report held
    # is report 1 (ts 1002, received 1002.5): age 2 s; just before report 4 arrives (1012) it is 1004's
    assert o["aoi_series"][0][1] == 2.0
    assert max(a for _, a, _ in o["aoi_series"]) <= 1008 - 1004 + 1e-9


def test_report_writes_table_files_and_plots_that_open(tmp_path):
    ev = _events()
    plan = bft.Plan(duration=10, outage=(2, 6), topology="fmn-2nations")
    rows = [
        bft.summarize(ev, "overlay", {"supersedes": True, "receivers": RECEIVERS}),
        bft.summarize(ev, "mqtt-bridge", {"receivers": RECEIVERS}),
    ]
    bft.report(tmp_path, plan, ev, rows)
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == len(ev)
    md = (tmp_path / "report.md").read_text()
    lines = md.splitlines()
    assert "| figure | overlay | mqtt-bridge |" in lines
    for row in (
        "| reports sent | 8 | 8 |",
        "| deliveries due (receiver x report) | 8 | 8 |",
        "| delivered | 6 | 4 |",
        "| superseded (a newer report arrived) | 2 | - |",
        "| not delivered by the end of the drain | 0 (0.0 %) | 4 (50.0 %) |",
    ):
        assert row in lines, row
    # the table a person reads on a terminal fits 100 columns with full names
    header, table = bft.figure_rows(rows)
    widths = [max(len(r[i]) for r in [header] + table) for i in range(len(header))]
    assert sum(widths) + 3 * len(widths) + 1 <= 100
    assert json.loads((tmp_path / "summary.json").read_text())["modes"][0]["delivered"] == 6
    for name in ("plot.png", "delay_box.png", "aoi.png"):
        img = mpimg.imread(tmp_path / name)
        assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 0.01, name  # a picture, not a blank
    # ... and each shows what its title says: the data drawn (plots.save_figure's .json) is the run's own
    delays = json.loads((tmp_path / "plot.json").read_text())[0]
    assert delays["title"] == "Delay of each position report delivery"
    by_mode = {x["label"].split(":")[0]: x for x in delays["series"]}
    # each delivery once, not the duplicate
    assert sorted(by_mode["overlay"]["y"]) == pytest.approx([0.5, 0.5, 1.5, 1.5, 4.0, 4.0])
    assert sorted(by_mode["mqtt-bridge"]["y"]) == pytest.approx([0.2, 0.2, 9.0, 9.0])
    assert by_mode["overlay"]["label"] == "overlay: 6/8 delivered"
    box = json.loads((tmp_path / "delay_box.json").read_text())[0]
    assert box["title"] == "Delay per sender -> receiver nation"
    assert box["xticks"] == ["overlay\nNOR->PRT", "overlay\nPRT->NOR", "mqtt-bridge\nNOR->PRT", "mqtt-bridge\nPRT->NOR"]
    aoi = json.loads((tmp_path / "aoi.json").read_text())[0]
    assert aoi["ylabel"] == "age of newest position held (s)"
    mean = next(x for x in aoi["series"] if x["label"] == "overlay: mean")
    assert list(zip(mean["x"], mean["y"])) == [(x, m) for x, m, _ in rows[0]["aoi_series"]]
    assert any(x["label"] == "link down" for x in aoi["series"]) is False  # shaded spans are not series


def test_perf_cli_names_the_bad_value():
    from click.testing import CliRunner

    from c2dtn.cli import cli

    for args, bad in (
        (["perf", "bft", "--outage", "20-200"], "20-200"),
        (["perf", "bft", "--outage", "x"], "'x'"),
        (["perf", "bft", "--modes", "overlay,carrier-pigeon"], "carrier-pigeon"),
        (["perf", "bft", "--profile", "cnr-tactical-9"], "cnr-tactical-9"),
        (["perf", "bft", "--scheduler", "linger=1500"], "'linger=1500'"),
        (["perf", "bft", "--scheduler", "linger_ms=long"], "'long' is not an integer"),
        (["perf", "bft", "--scheduler", "linger_ms=-5"], "'scheduler.linger_ms' = -5: must be a whole number from 0"),
        (["perf", "bft", "--scheduler", "aggregate_bytes=100000000"], "= 100000000: must be a whole number from 1"),
        (["perf", "bft", "--scheduler", "linger_ms=1", "--scheduler", "linger_ms=2"], "linger_ms is given twice"),
        (["perf", "bft", "--seed", "-3"], "-3"),
        (["perf", "bft", "--seed", "seven"], "'seven'"),
        (["perf", "gateway", "--qos", "0,3"], "'3'"),
        (["perf", "scale", "--sizes", "8,0"], "0: units per nation go from 1 to 500"),
        (["perf", "scale", "--sizes", "8,lots"], "'8,lots'"),
        (["perf", "scale", "--modes", "overlay,pigeon"], "pigeon"),
    ):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and bad in r.output, (args, r.output)


def test_perf_report_puts_runs_side_by_side(tmp_path, capsys):
    from c2dtn.perf import compare

    ev = _events()
    for name in ("run-a", "run-b"):
        rows = [
            bft.summarize(ev, "overlay", {"supersedes": True, "receivers": RECEIVERS}),
            bft.summarize(ev, "mqtt-bridge", {"receivers": RECEIVERS}),
        ]
        bft.report(tmp_path / name, bft.Plan(topology="fmn-2nations"), ev, rows)
    capsys.readouterr()
    compare.main([str(tmp_path / "run-a"), str(tmp_path / "run-b")], str(tmp_path / "cmp.png"))
    out = capsys.readouterr().out
    assert out.count("run-a") == 2 and out.count("run-b") == 2 and "50.0" in out
    assert mpimg.imread(tmp_path / "cmp.png").std() > 0.01


def test_nps_chain_report_names_the_hosts_not_a_nation(tmp_path):
    plan = bft.Plan(topology="nps-chain", duration=10, outage=None)
    assert "8 units on h1 reporting to the broker on h4" in bft.title_of(plan)
    assert "per nation" not in bft.title_of(plan) and "scheduler" not in bft.title_of(plan)
    # a run with its own scheduler settings says so in its report's title
    tuned = bft.Plan(topology="nps-chain", scheduler={"linger_ms": 1500, "ack_delay_ms": 2000})
    assert bft.title_of(tuned).endswith(", scheduler ack_delay_ms=2000, linger_ms=1500")
    # ... and one on another loss pattern names its seed (the default one, 7, goes unsaid as before)
    assert bft.title_of(bft.Plan(topology="nps-chain", seed=8)).endswith(", seed 8") and "seed" not in bft.title_of(
        plan
    )
    assert bft._place(plan, "NOR") == "h1" and bft._place(bft.Plan(topology="fmn-2nations"), "NOR") == "NOR"


def test_each_unit_reports_every_period_from_its_own_phase():
    """The BFT units' timer: a period between a unit's reports (a report falling anywhere in
    its period made gaps of up to two periods, and the age of information measured that)."""
    import random

    from c2dtn.perf.train_dict import report_times

    times = report_times(random.Random(3), 8, 2.0, 60)
    assert times == sorted(times) and len(times) == 8 * 30
    for u in range(1, 9):
        mine = [t for t, v in times if v == u]
        assert 0 <= mine[0] < 2.0
        assert all(abs(b - a - 2.0) < 1e-9 for a, b in zip(mine, mine[1:]))
    assert len({round(t, 6) for t, v in times if t < 2.0}) == 8  # each its own phase


def test_perf_bft_seed_reaches_the_plan_and_the_emulator(monkeypatch, tmp_path):
    # --seed picks the emulator's loss draws (and the units' timing); without it, seed 7 as before
    from click.testing import CliRunner

    from c2dtn.cli import cli

    plans = []
    monkeypatch.setattr(bft, "main", lambda plan, modes: plans.append(plan))
    for args, seed in ((["--seed", "8"], 8), ([], 7)):
        r = CliRunner().invoke(cli, ["perf", "bft", "--modes", "overlay", *args])
        assert r.exit_code == 0, r.output
        assert plans[-1].seed == seed

    class Built(Exception):
        pass

    def up(topology, **kw):
        raise Built(kw["seed"])

    monkeypatch.setattr(bft.testbed, "down", lambda: None)
    monkeypatch.setattr(bft.testbed, "up", up)
    with pytest.raises(Built) as got:
        bft.run_mode("overlay", plans[0], tmp_path, [])
    assert got.value.args == (8,)
