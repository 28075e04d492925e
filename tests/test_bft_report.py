"""The BFT job's figures come from its event log: counts, delays, superseded apart from lost."""

import json

import matplotlib.image as mpimg

from overlay.train_dict import position_report, report_topic
from perf import bft


def _events() -> list[dict]:
    ev = []
    for mode, delays in (("overlay", {1: 0.5, 2: 1.5, 3: None, 4: 4.0}), ("mqtt-bridge", {1: 0.2, 2: None, 3: None,
                                                                                           4: 9.0})):
        for seq, d in delays.items():
            ts = 1000.0 + seq * 2
            mid = f"NOR-S001_{seq}"
            ev.append({"mode": mode, "role": "pub", "ev": "sent", "id": mid, "topic": report_topic("NOR", 1, 1),
                       "t": ts})
            if d is not None:
                rec = {"mode": mode, "role": "sub", "topic": report_topic("NOR", 1, 1), "t": ts + d,
                       "payload": position_report("NOR", 1, 1, seq, int(ts * 1000), 59.9, 10.7).decode()}
                ev.append(rec)
                if seq == 4:
                    ev.append(dict(rec, t=ts + d + 1))  # a duplicate: counted once, reported apart
    return ev


def test_summary_counts_delays_and_tells_superseded_from_lost():
    ev = _events()
    o = bft.summarize(ev, "overlay", {"supersedes": True})
    assert (o["sent"], o["delivered"], o["duplicates"], o["superseded"], o["lost"]) == (4, 3, 1, 1, 0)
    assert (o["delay_min_s"], o["delay_median_s"], o["delay_max_s"]) == (0.5, 1.5, 4.0)
    b = bft.summarize(ev, "mqtt-bridge", {})
    assert (b["sent"], b["delivered"], b["superseded"], b["lost"], b["lost_pct"]) == (4, 2, None, 2, 50.0)
    # the unit's newest known position is report 4, sent at t=1008, the last report sent
    assert o["newest_age_max_s"] == 0.0 and o["units_known"] == 1


def test_report_writes_table_files_and_a_plot_that_opens(tmp_path):
    ev = _events()
    plan = bft.Plan(duration=10, outage=(2, 6))
    rows = [bft.summarize(ev, "overlay", {"supersedes": True}), bft.summarize(ev, "mqtt-bridge", {})]
    bft.report(tmp_path, plan, ev, rows)
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == len(ev)
    md = (tmp_path / "report.md").read_text()
    assert "| overlay | 4 | 3 | 1 | 0 |" in md and "| mqtt-bridge | 4 | 2 | - | 2 |" in md
    assert json.loads((tmp_path / "summary.json").read_text())["modes"][0]["delivered"] == 3
    img = mpimg.imread(tmp_path / "plot.png")
    assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 0.01  # a picture, not a blank


def test_perf_cli_names_the_bad_value():
    from click.testing import CliRunner

    from c2dtn.cli import cli

    for args, bad in ((["perf", "bft", "--outage", "20-200"], "20-200"), (["perf", "bft", "--outage", "x"], "'x'"),
                      (["perf", "bft", "--modes", "overlay,carrier-pigeon"], "carrier-pigeon"),
                      (["perf", "bft", "--profile", "cnr-tactical-9"], "cnr-tactical-9"),
                      (["perf", "gateway", "--qos", "0,3"], "'3'")):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and bad in r.output, (args, r.output)
