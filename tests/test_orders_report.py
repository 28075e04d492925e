"""perf orders: the script has seed 004's shape, and its figures come from the event log."""

import json

import matplotlib.image as mpimg
import pytest

from c2dtn.perf import orders


def test_the_script_has_97_messages_17_of_them_across_the_narrowband_link():
    msgs = orders.script()
    assert len(msgs) == 97 and sum(orders.crosses(m) for m in msgs) == 17
    assert msgs == orders.script()  # seeded: every run sends the same script
    assert all(m["from"] != m["to"] and m["from"] in orders.UNITS and m["to"] in orders.UNITS for m in msgs)
    assert sorted(m["t"] for m in msgs) == [m["t"] for m in msgs] and msgs[-1]["t"] <= 250


def test_orders_figures_count_lost_answered_twice_and_link_bytes_per_scope(tmp_path):
    msgs = orders.script()
    cross = [m["id"] for m in msgs if orders.crosses(m)]
    ev = []
    for mode, lose, delay in (("coap-overlay", set(), 0.5), ("mqtt-direct", set(cross[:3]), 2.0)):
        for m in msgs:
            ev.append({"mode": mode, "ev": "sent", "id": m["id"], "from": m["from"], "to": m["to"], "t": 100 + m["t"]})
            if m["id"] not in lose:
                d = delay * (3 if orders.crosses(m) else 1)
                rec = {
                    "mode": mode,
                    "ev": "recv",
                    "id": m["id"],
                    "rx": m["to"],
                    "from": m["from"],
                    "ts": 100 + m["t"],
                    "t": 100 + m["t"] + d,
                }
                ev += [rec, dict(rec, t=rec["t"] + 5)]  # a second copy does not change the first delay
                if mode == "coap-overlay" and m["id"] != cross[0]:  # one receipt never came back
                    ev.append(
                        {"mode": mode, "ev": "answered", "id": m["id"], "code": "2.04 Changed", "t": rec["t"] + 1}
                    )
        ev.append({"mode": mode, "ev": "link", "bytes": 97_000 if mode == "coap-overlay" else 47_000})
    rows = orders.summarize(ev, msgs, "coap-overlay") + orders.summarize(ev, msgs, "mqtt-direct")
    by = {(r["mode"], r["scope"]): r for r in rows}
    assert (by["coap-overlay", "all"]["lost"], by["coap-overlay", "narrowband"]["delay_median_s"]) == (0, 1.5)
    assert (by["coap-overlay", "narrowband"]["answered"], by["coap-overlay", "all"]["answered"]) == (16, 96)
    assert by["mqtt-direct", "all"]["answered"] is None  # a publication has no receipt to count
    assert by["coap-overlay", "all"]["twice"] == 97 and by["coap-overlay", "all"]["link_bytes_per_msg"] == 1000
    assert by["mqtt-direct", "all"]["link_bytes_per_msg"] == 500  # per message delivered: 94
    assert (
        by["mqtt-direct", "narrowband"]["lost"] == 3 and round(by["mqtt-direct", "narrowband"]["lost_pct"], 2) == 17.65
    )
    assert by["mqtt-direct", "all"]["messages"] == 97 and by["mqtt-direct", "all"]["delay_max_s"] == 6.0
    orders.report(tmp_path, "narrowband-15k", msgs, ev, rows, (60.0, 120.0))
    md = (tmp_path / "report.md").read_text()
    assert "link down 60-120 s" in md.splitlines()[0]
    assert "| narrowband | mqtt-direct | 17 | 17 | 3 | 17.6 | - | 14 |" in md
    assert "| all | coap-overlay | 97 | 97 | 0 | 0.0 | 96 | 97 | 0.50 s | 0.50 s | 1.50 s | 1000 |" in md
    assert "| narrowband | HTTP/JSON | 17 | 35.29 | 1.22 s | 1.36 s | 17.31 s |" in md  # seed 004's Table III beside
    assert json.loads((tmp_path / "summary.json").read_text())["rows"][0]["messages"] == 97
    for name in ("delays.png", "delay_box.png"):
        img = mpimg.imread(tmp_path / name)
        assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 0.01, name
    shown = json.loads((tmp_path / "delays.json").read_text())[0]
    assert shown["title"].startswith("Delay of each C2 message")
    series = {x["label"]: x["y"] for x in shown["series"]}
    assert len(series["mqtt-direct, narrowband"]) == 17 - 3  # lost ones are absent
    assert series["coap-overlay, narrowband"] == pytest.approx([1.5] * 17)  # the first copy's delay


def test_http_runs_direct_only():
    assert orders.runs(("mqtt", "coap", "http"), ("direct", "overlay")) == [
        "mqtt-direct",
        "mqtt-overlay",
        "coap-direct",
        "coap-overlay",
        "http-direct",
    ]
    assert orders.runs(("http",), ("overlay",)) == []


def test_orders_cli_names_the_bad_value():
    from click.testing import CliRunner

    from c2dtn.cli import cli

    for args, bad in (
        (["perf", "orders", "--modes", "overlay,smoke-signals"], "smoke-signals"),
        (["perf", "orders", "--protocols", "mqtt,amqp"], "amqp"),
        (["perf", "orders", "--protocols", "http", "--modes", "overlay"], "HTTP runs direct only"),
        (["perf", "orders", "--outage", "120-60"], "120-60"),
        (["perf", "orders", "--outage", "200-400"], "200-400"),
        (["perf", "orders", "--profile", "narrowband-1k"], "narrowband-1k"),
        (["perf", "orders", "--span", "3"], "3"),
    ):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2 and bad in r.output, (args, r.output)
