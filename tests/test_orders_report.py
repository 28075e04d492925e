"""perf orders: the script has seed 004's shape, and its figures come from the event log."""

import json

import pytest

import matplotlib.image as mpimg

from c2dtn.perf import orders


def test_the_script_has_97_messages_17_of_them_across_the_narrowband_link():
    msgs = orders.script()
    assert len(msgs) == 97 and sum(orders.crosses(m) for m in msgs) == 17
    assert msgs == orders.script()  # seeded: every run sends the same script
    assert all(m["from"] != m["to"] and m["from"] in orders.UNITS and m["to"] in orders.UNITS for m in msgs)
    assert sorted(m["t"] for m in msgs) == [m["t"] for m in msgs] and msgs[-1]["t"] <= 250


def test_orders_figures_count_lost_and_delays_per_scope(tmp_path):
    msgs = orders.script()
    cross = [m["id"] for m in msgs if orders.crosses(m)]
    ev = []
    for mode, lose, delay in (("overlay", set(), 0.5), ("mqtt", set(cross[:3]), 2.0)):
        for m in msgs:
            ev.append({"mode": mode, "ev": "sent", "id": m["id"], "from": m["from"], "to": m["to"], "t": 100 + m["t"]})
            if m["id"] not in lose:
                d = delay * (3 if orders.crosses(m) else 1)
                rec = {"mode": mode, "ev": "recv", "id": m["id"], "rx": m["to"], "from": m["from"], "ts": 100 + m["t"],
                       "t": 100 + m["t"] + d}
                ev += [rec, dict(rec, t=rec["t"] + 5)]  # a second copy does not change the first delay
    rows = orders.summarize(ev, msgs, "overlay") + orders.summarize(ev, msgs, "mqtt")
    by = {(r["mode"], r["scope"]): r for r in rows}
    assert (by["overlay", "all"]["lost"], by["overlay", "narrowband"]["delay_median_s"]) == (0, 1.5)
    assert by["mqtt", "narrowband"]["lost"] == 3 and round(by["mqtt", "narrowband"]["lost_pct"], 2) == 17.65
    assert by["mqtt", "all"]["messages"] == 97 and by["mqtt", "all"]["delay_max_s"] == 6.0
    orders.report(tmp_path, "narrowband-15k", msgs, ev, rows)
    md = (tmp_path / "report.md").read_text()
    assert "| narrowband | mqtt | 17 | 17 | 3 | 17.6 |" in md
    assert json.loads((tmp_path / "summary.json").read_text())["rows"][0]["messages"] == 97
    for name in ("delays.png", "delay_box.png"):
        img = mpimg.imread(tmp_path / name)
        assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 0.01, name
    shown = json.loads((tmp_path / "delays.json").read_text())[0]
    assert shown["title"].startswith("Delay of each C2 message")
    series = {x["label"]: x["y"] for x in shown["series"]}
    assert len(series["mqtt, narrowband"]) == 17 - 3  # lost ones are absent
    assert series["overlay, narrowband"] == pytest.approx([1.5] * 17)  # the first copy's delay


def test_orders_cli_names_the_bad_value():
    from click.testing import CliRunner

    from c2dtn.cli import cli

    for args, bad in ((["perf", "orders", "--modes", "overlay,smoke-signals"], "smoke-signals"),
                      (["perf", "orders", "--profile", "narrowband-1k"], "narrowband-1k"),
                      (["perf", "orders", "--span", "3"], "3")):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and bad in r.output, (args, r.output)
