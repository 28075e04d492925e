"""The drill view's I/O-free parts (topologies/view.py): age of information per unit and
receiver, order delays, link rates from the emulators' counters; the page ships with the
package.  The page in a browser: tests/test_view_live.py."""

from __future__ import annotations

from pathlib import Path

from c2dtn.topologies.view import aoi, link_rows, orders


def test_aoi_is_per_unit_and_receiver_from_the_newest_report_each_has():
    ev = [
        {"ev": "sent", "unit": "NOR-S001", "id": "NOR-S001_1", "mode": "overlay"},
        {"ev": "sent", "unit": "NOR-S002", "id": "NOR-S002_1", "mode": "overlay"},
        {"ev": "recv", "rx": "deu", "id": "NOR-S001_1", "ts": 100.0, "mode": "overlay"},
        {"ev": "recv", "rx": "deu", "id": "NOR-S001_2", "ts": 102.0, "mode": "overlay"},
        {"ev": "recv", "rx": "usa", "id": "NOR-S001_1", "ts": 100.0, "mode": "overlay"},
        {"ev": "recv", "rx": "usa", "id": "NOR-S001_9", "ts": 190.0, "mode": "mqtt-bridge"},
    ]
    got = aoi(ev, 105.0, "overlay")
    assert got["receivers"] == ["deu", "usa"]
    assert got["units"] == [
        {"unit": "NOR-S001", "aoi_s": {"deu": 3.0, "usa": 5.0}},
        {"unit": "NOR-S002", "aoi_s": {"deu": None, "usa": None}},
    ]


def test_orders_show_their_delay_or_how_long_they_have_waited():
    ev = [
        {"ev": "sent", "id": "o1", "t": 10.0, "mode": "mqtt-overlay"},
        {"ev": "sent", "id": "o2", "t": 11.0, "mode": "mqtt-overlay"},
        {"ev": "recv", "id": "o1", "t": 12.5, "mode": "mqtt-overlay"},
        {"ev": "recv", "id": "o1", "t": 13.0, "mode": "mqtt-overlay"},  # a second copy: the first counts
        {"ev": "sent", "id": "o3", "t": 11.5, "mode": "coap-overlay"},
    ]
    got = orders(ev, 20.0, "mqtt-overlay")
    assert got["orders"] == [
        {"id": "o1", "delay_s": 2.5, "waiting_s": 10.0},
        {"id": "o2", "delay_s": None, "waiting_s": 9.0},
    ]
    assert [o["id"] for o in orders(ev, 20.0, None, last=1)["orders"]] == ["o3"]  # every mode: the newest


def test_link_rates_are_bytes_a_second_between_two_snapshots_and_survive_a_restart():
    def st(ab, ba, state="up"):
        live = {"ab": {"delivered_bytes": ab}, "ba": {"delivered_bytes": ba}}
        prof = {"name": "cnr-tactical-2"}
        link = {"a": "r2", "b": "r3", "state": state, "emulate": True, "profile_ab": prof, "profile_ba": prof}
        return {"links": {"r2-r3": {**link, "live": live}}}

    prev: dict = {}
    (r,) = link_rows(st(1000, 500), prev, 100.0)
    assert (r["ab_Bps"], r["ba_Bps"]) == (0.0, 0.0)  # nothing to compare with yet
    (r,) = link_rows(st(3000, 900, "down"), prev, 102.0)
    assert (r["ab_Bps"], r["ba_Bps"], r["state"], r["profile_ab"]) == (1000.0, 200.0, "down", "cnr-tactical-2")
    (r,) = link_rows(st(10, 10), prev, 103.0)  # the emulator restarted: counters from 0, no negative rate
    assert (r["ab_Bps"], r["ba_Bps"]) == (0.0, 0.0)


def test_the_page_ships_with_the_package():
    from importlib import resources

    html = resources.files("c2dtn.topologies").joinpath("data", "view.html").read_text()
    assert 'EventSource("/events")' in html and "X-C2-Drill" in html
    assert Path(__file__).resolve().parent.parent.joinpath("topologies", "data", "view.html").exists()
