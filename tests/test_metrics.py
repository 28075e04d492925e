"""The Prometheus endpoint ([metrics] listen): what it serves is what `node status` shows,
counted where it happens (custody, scheduler, node, MQTT gateway); refusals and rolled-back
transactions counted as they ended; the listen address checked; nothing served but /metrics.
The live check (promtool, a running node's counters against its status) is
tests/test_box_install.py."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from types import SimpleNamespace

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from c2dtn.errors import ConfigError
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway import near_core as nc
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.custody import Custody
from c2dtn.overlay.envelope import Priority
from c2dtn.overlay.metrics import MetricsServer, _Collector
from c2dtn.overlay.node import OverlayNode
from c2dtn.overlay.node_api import local_status
from c2dtn.overlay.store import Quota, QuotaExceeded, TooLarge
from c2dtn.overlay.store.memory import MemoryStore
from c2dtn.overlay.tally import Histogram

KEY = "ab" * 32


def scrape(status: dict) -> dict[tuple[str, tuple], float]:
    """What a scrape of this status serves: (sample name, sorted labels) -> value."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(lambda: status))  # type: ignore[arg-type]
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_histogram_is_cumulative_and_a_value_on_a_bound_falls_in_that_bucket():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap["buckets"] == [[0.1, 2], [1.0, 3], ["+Inf", 4]] and snap["count"] == 4
    assert snap["sum"] == pytest.approx(3.65)


def test_refusals_count_at_once_and_a_rolled_back_transaction_counts_nothing():
    c = Custody(MemoryStore(), "gw1", Quota(max_envelopes=2))
    c.submit("gw4", b"a", 0, 60_000, Priority.PRIORITY)
    with pytest.raises(QuotaExceeded):
        c.submit_many(
            [("gw4", b"b", 60_000, Priority.PRIORITY, None, ""), ("gw4", b"c", 60_000, Priority.FLASH, None, "")], 0
        )
    with pytest.raises(TooLarge):
        c.submit("gw4", bytes(20 << 20), 0, 60_000, Priority.ROUTINE)
    with pytest.raises(RuntimeError), c.transaction():
        c.submit("gw4", b"d", 0, 60_000, Priority.PRIORITY)  # taken, then the transaction fails
        raise RuntimeError
    assert c.tally == {
        ("submitted", "gw4", Priority.PRIORITY): 1,
        ("refused_quota", "gw4", Priority.PRIORITY): 1,
        ("refused_quota", "gw4", Priority.FLASH): 1,
        ("refused_too_large", "gw4", Priority.ROUTINE): 1,
    }
    assert c.held_out()[0] == 1


def _node(tmp_path, name: str, peer: str, sent: list, extra: str = "") -> OverlayNode:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'[node]\nid = "{name}"\nstorage = "{tmp_path / name}"\nfsync = "loop"\n[agent]\nkind = "ion"\n'
        f'[keys]\n{peer} = "{KEY}"\n{extra}'
    )
    p.chmod(0o600)
    node = OverlayNode(load_node_config(p))

    async def send(dst_node, endpoint, payload, lifetime_s, priority=3):
        sent.append((dst_node, payload))

    node.agent.send = send
    return node


def test_status_and_metrics_say_the_same_after_envelopes_cross_and_are_acked(tmp_path):
    """gw1 sends 3 priority and 2 routine envelopes to gw4, which takes them and acks; each
    node's scrape carries status's numbers: per peer and class, custody, bundles, the store's
    counters and the delay histogram."""
    to4: list = []
    to1: list = []
    gw1 = _node(tmp_path, "gw1", "gw4", to4)
    gw4 = _node(tmp_path, "gw4", "gw1", to1)

    async def main():
        try:
            for i in range(3):
                gw1.submit_now("gw4", b"pos %d" % i, 600_000, Priority.PRIORITY, f"u{i}", "bft")
            for i in range(2):
                gw1.submit_now("gw4", b"log %d" % i, 600_000, Priority.ROUTINE, None, "log")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                if to4:
                    gw4.take([SimpleNamespace(payload=p, src_node="gw1") for _, p in to4])
                    to4.clear()
                items = gw4.core.take(100)
                if items:
                    gw4.consumed([d.id for d in items])
                if to1:
                    gw1.take([SimpleNamespace(payload=p, src_node="gw4") for _, p in to1])
                    to1.clear()
                if gw1.core.store.held_out()[0] == 0 and gw4.core.store.count("delivered") == 5:
                    break
        finally:
            for n in (gw1, gw4):
                n.closing = True
                n._arm()

    asyncio.run(main())
    s1, s4 = local_status(gw1, None), local_status(gw4, None)
    m1, m4 = scrape(s1), scrape(s4)
    rows = {(r["peer"], r["priority"]): r for r in s1["envelopes"]}
    assert rows[("gw4", "priority")]["submitted"] == 3 and rows[("gw4", "priority")]["acked"] == 3
    assert rows[("gw4", "routine")]["submitted"] == 2 and rows[("gw4", "routine")]["acked"] == 2
    for cls, n in (("priority", 3), ("routine", 2)):
        lab = (("class", cls), ("peer", "gw4"))
        assert m1[("c2dtn_envelopes_submitted_total", lab)] == n
        assert m1[("c2dtn_envelopes_acked_total", lab)] == n
        assert m4[("c2dtn_envelopes_received_total", (("class", cls), ("peer", "gw1")))] == n
    assert m1[("c2dtn_store_accepted_total", ())] == s1["counters"]["accepted"] == 5
    assert m1[("c2dtn_store_acked_total", ())] == 5 and m4[("c2dtn_store_delivered_total", ())] == 5
    assert m1[("c2dtn_custody_envelopes", ())] == s1["custody"]["envelopes"] == 0
    assert m1[("c2dtn_bundles_to_agent_total", ())] == s1["bundles"]["to_agent"] >= 1
    assert m4[("c2dtn_bundles_from_agent_total", ())] == s4["bundles"]["from_agent"] == s1["bundles"]["to_agent"]
    assert m4[("c2dtn_bundle_bytes_from_agent_total", ())] == s1["bundles"]["to_agent_bytes"]
    assert m4[("c2dtn_received_delay_seconds_count", ())] == s4["received_delay_s"]["count"] == 5
    assert m4[("c2dtn_received_delay_seconds_bucket", (("le", "+Inf"),))] == 5
    assert ("c2dtn_path_srtt_seconds", (("peer", "gw4"),)) in m1
    assert m1[("c2dtn_path_window_bytes", (("peer", "gw4"),))] == s1["windows"]["gw4"]["window"]
    gw1.close_store()
    gw4.close_store()


def test_resends_are_counted_by_cause():
    """A lost envelope goes again at its timeout: counted "timeout" for its peer."""
    from c2dtn.overlay.core import OverlayCore
    from c2dtn.overlay.envelope import Codec
    from c2dtn.overlay.scheduler import SchedulerConfig

    a = OverlayCore(
        Custody(MemoryStore(), "gw1"),
        Codec("gw1", {"gw4": b"k" * 32}),
        SchedulerConfig(min_rto_ms=5_000, initial_rto_ms=5_000, linger_ms=0),
    )
    a.submit("gw4", b"one", 0)
    assert a.poll(0)  # sent, and lost: no ack ever comes
    t = 0
    resent = {k: v for k, v in a.store.tally.items() if k[0].startswith("resent_")}
    while not resent and t < 60_000:
        t += 100
        a.poll(t)
        resent = {k: v for k, v in a.store.tally.items() if k[0].startswith("resent_")}
    assert resent == {("resent_timeout", "gw4", Priority.ROUTINE): 1}  # no round trip measured: no probe yet
    assert 4_000 <= t <= 11_000  # at its timeout (5 s), not before


def test_the_puback_latency_is_from_the_publish_read_to_the_commit_that_answers_it():
    core = nc.NearCore(
        nc.Policy(
            routes=[(ipaddress.ip_network("10.77.4.0/24"), "gw4")],
            topics=[nc.TopicRule("c2/#", Priority.IMMEDIATE, 3600)],
        ),
        max_packet_size=4096,
    )
    core.open(1, "10.77.4.2:1883", 100.0)
    core.data(1, m.encode(m.Connect("u1", True, 0, version=5), 5), 100.0)
    core.committed(1, True, 100.0)
    evs = core.data(1, m.encode(m.Publish("c2/orders", b"hold", 1, packet_id=5), 5), 101.0)
    assert any(isinstance(e, nc.Submit) for e in evs)
    core.committed(1, True, 101.25)
    snap = core.status()["puback_s"]
    assert snap["count"] == 1 and snap["sum"] == pytest.approx(0.25)
    assert scrape_mqtt(core.status())[("c2dtn_mqtt_puback_latency_seconds_count", ())] == 1


def scrape_mqtt(mqtt_status: dict) -> dict:
    base = {"node": "gw1", "agent": "ion", "uptime_s": 1.0, "agent_restarts": 0, "send_errors": 0}
    bundles = {"to_agent": 0, "to_agent_bytes": 0, "from_agent": 0, "from_agent_bytes": 0}
    return scrape({**base, "bundles": bundles, "mqtt": {**mqtt_status, "counters": {"logins_refused": 2}}})


def test_gateway_counters_are_served_with_their_names():
    got = scrape_mqtt({"clients": ["a", "b"], "sessions_near": 3, "sessions_far": {}})
    assert got[("c2dtn_mqtt_logins_refused_total", ())] == 2
    assert got[("c2dtn_mqtt_clients", ())] == 2 and got[("c2dtn_mqtt_sessions_near", ())] == 3


@pytest.mark.parametrize(
    "bad",
    ["localhost:9464", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "::1:9464", "[::1]9464", 9464, "1.2.3.4:9464\n"],
)
def test_a_bad_listen_address_is_named(tmp_path, bad):
    p = tmp_path / "gw1.toml"
    val = (
        f'"{bad}"'
        if isinstance(bad, str) and "\n" not in bad
        else (repr(bad) if isinstance(bad, int) else '"1.2.3.4:9464\\n"')
    )
    p.write_text(f'[node]\nid = "gw1"\nstorage = "{tmp_path}"\n[metrics]\nlisten = {val}\n')
    with pytest.raises(ConfigError, match=r"metrics\.listen.*must be an IP address and a port"):
        load_node_config(p)


def test_listen_addresses_v4_and_v6_and_unknown_keys(tmp_path):
    p = tmp_path / "gw1.toml"
    for val, want in (('"127.0.0.1:9464"', ("127.0.0.1", 9464)), ('"[::1]:9100"', ("::1", 9100))):
        p.write_text(f'[node]\nid = "gw1"\nstorage = "{tmp_path}"\n[metrics]\nlisten = {val}\n')
        assert load_node_config(p).metrics_listen == want
    p.write_text(f'[node]\nid = "gw1"\nstorage = "{tmp_path}"\n')
    assert load_node_config(p).metrics_listen is None
    p.write_text(f'[node]\nid = "gw1"\nstorage = "{tmp_path}"\n[metrics]\nport = 9464\n')
    with pytest.raises(ConfigError, match="port"):
        load_node_config(p)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(restarts: int = 0, to_agent: int = 0) -> dict:
    """A node's status as the metrics read it, with a few counters set."""
    return {
        "node": "gw1",
        "agent": "ion",
        "uptime_s": 2.0,
        "agent_restarts": restarts,
        "send_errors": 0,
        "bundles": {"to_agent": to_agent, "to_agent_bytes": 100 * to_agent, "from_agent": 0, "from_agent_bytes": 0},
    }


def test_the_server_serves_metrics_and_nothing_else():
    port, status = _free_port(), _status(restarts=1, to_agent=4)

    async def main():
        srv = MetricsServer(("127.0.0.1", port), lambda: status)
        await srv.start()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    body, ctype, code = await r.text(), r.headers["Content-Type"], r.status
                async with http.get(f"http://127.0.0.1:{port}/") as r:
                    other = r.status
                async with http.post(f"http://127.0.0.1:{port}/metrics", data=b"x" * 4096) as r:
                    post = r.status
        finally:
            await srv.close()
        return body, ctype, code, other, post

    body, ctype, code, other, post = asyncio.run(main())
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
    assert "c2dtn_agent_restarts_total 1.0" in body and "c2dtn_bundles_to_agent_total 4.0" in body
    assert other == 404 and post == 405


def test_the_server_holds_few_connections_and_drops_slow_or_large_requests(monkeypatch):
    """Idle connections past the cap are closed at once, those under it when their time to send
    a request is up, and a request larger than the cap is closed unanswered: the node's file
    descriptors and memory stay bounded whoever reaches the port; a scraper still gets in."""
    from c2dtn.overlay import metrics

    monkeypatch.setattr(metrics, "REQUEST_TIMEOUT_S", 0.5)
    port, status = _free_port(), _status()

    async def main():
        srv = MetricsServer(("127.0.0.1", port), lambda: status)
        await srv.start()
        try:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(metrics.MAX_CONNECTIONS + 4)]
            await asyncio.sleep(0.1)
            held, refused = srv.open, srv.refused
            closed_at_once = 0
            for r, _w in idle[metrics.MAX_CONNECTIONS :]:
                closed_at_once += (await asyncio.wait_for(r.read(), 1)) == b""
            big_r, big_w = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.7)  # the idle ones' time is up
            big_w.write(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (metrics.REQUEST_MAX_BYTES + 10))
            big = await asyncio.wait_for(big_r.read(), 2)
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(r.read(), 2)
            return held, refused, closed_at_once, big, answer, srv.open
        finally:
            await srv.close()

    held, refused, closed_at_once, big, answer, left = asyncio.run(main())
    assert held == metrics.MAX_CONNECTIONS and refused == 4 and closed_at_once == 4
    assert big == b"" and answer.startswith(b"HTTP/1.1 200 OK") and b"c2dtn_uptime_seconds 2.0" in answer
    assert left == 0


def test_the_operations_page_lists_every_metric_a_node_serves():
    """docs/operations.md names each metric a node with both gateways serves (the counters
    named by their event where the page gives one row for them all)."""
    from pathlib import Path

    from c2dtn.overlay.metrics import families

    h = Histogram().snapshot()
    st = {
        "node": "gw1",
        "agent": "dtn7",
        "uptime_s": 1.0,
        "agent_up": True,
        "agent_restarts": 0,
        "send_errors": 0,
        "bundles": {"to_agent": 0, "to_agent_bytes": 0, "from_agent": 0, "from_agent_bytes": 0},
        "fsync": {"fsyncs": 0, "commits": 0, "failures": 0, "max_ms": 0.0},
        "counters": {"accepted": 1, "rejected:bad-tag": 1},
        "custody": {"envelopes": 0, "bytes": 0, "max_envelopes": 1, "max_bytes": 1},
        "queues": [],
        "envelopes": [],
        "received_delay_s": h,
        "resent": [],
        "windows": {},
        "inbox": 0,
        "mqtt": {
            "clients": [],
            "sessions_near": 0,
            "sessions_far": {},
            "counters": {"logins_refused": 1},
            "puback_s": h,
        },
        "coap": {"counters": {"requests": 1}, "pending_responses": 0, "replaying": 0, "observing": 0},
        "relay": {
            "counters": {"accepted": 1},
            "held": {"dtn7": 1},
            "held_bytes": 10,
            "max_bytes": 100,
            "agents_up": {"dtn7": True},
        },
    }
    page = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    missing = []
    for fam in families(st):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        if f"`{name}`" in page:
            continue
        prefix = next(
            (p for p in ("c2dtn_store_", "c2dtn_mqtt_", "c2dtn_coap_", "c2dtn_relay_") if name.startswith(p)), None
        )
        if prefix and name.endswith("_total") and f"`{name[len(prefix) : -len('_total')]}`" in page:
            continue
        missing.append(name)
    assert not missing, missing


def test_a_relay_serves_what_it_holds_per_island_and_its_counters(tmp_path):
    from c2dtn.overlay.relay import load_relay_config

    st = {
        "node": "tacnet",
        "agent": "dtn7+ibrdtn",
        "uptime_s": 5.0,
        "agent_restarts": 1,
        "send_errors": 0,
        "relay": {
            "counters": {"accepted": 7, "forwarded": 5, "dropped_full": 1},
            "held": {"ibrdtn": 2},
            "held_bytes": 300,
            "max_bytes": 1 << 20,
            "agents_up": {"dtn7": True, "ibrdtn": False},
        },
    }
    got = scrape(st)
    assert got[("c2dtn_relay_held_bundles", (("island", "ibrdtn"),))] == 2
    assert got[("c2dtn_relay_agent_up", (("island", "ibrdtn"),))] == 0
    assert got[("c2dtn_relay_forwarded_total", ())] == 5 and got[("c2dtn_relay_dropped_full_total", ())] == 1
    assert ("c2dtn_bundles_to_agent_total", ()) not in got  # (a relay's bundles are its counters)
    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text(
            f'[node]\nid = "t{name}"\nstorage = "{tmp_path / name}"\n[agent]\nkind = "{"dtn7" if name == "a" else "ibrdtn"}"\n'
        )
    relay = tmp_path / "r.toml"
    for value, ok in (('"127.0.0.1:9465"', True), ('"nowhere:1"', False)):
        relay.write_text(
            f'[relay]\nid = "tacnet"\nstorage = "{tmp_path / "r"}"\nislands = ["a.toml", "b.toml"]\nmetrics = {value}\n'
        )
        if ok:
            assert load_relay_config(relay).metrics_listen == ("127.0.0.1", 9465)
        else:
            with pytest.raises(ConfigError, match=r"relay\.metrics"):
                load_relay_config(relay)


def test_a_udphc_link_shows_what_it_sent_saved_received_and_refused():
    """A node running a udphc link (overlay/hclink.py) serves its counts; one without serves none."""
    node = SimpleNamespace(cfg=SimpleNamespace(id="b", agent="dtn7"), started_ms=0, send_errors=0, bundles={})
    node.udphc, node.syncer, node.core, node.extensions = None, None, None, []
    assert not any(k[0].startswith("c2dtn_udphc") for k in scrape(local_status(node, None)))
    node.udphc = {"sent": 10, "sent_compressed": 7, "sent_bytes_saved": 259, "received": 9, "refused": 2, "dropped": 1}
    m = scrape(local_status(node, None))
    assert m[("c2dtn_udphc_frames_sent_total", (("form", "compressed"),))] == 7
    assert m[("c2dtn_udphc_frames_sent_total", (("form", "whole"),))] == 3
    assert m[("c2dtn_udphc_bytes_saved_total", ())] == 259
    assert m[("c2dtn_udphc_frames_received_total", ())] == 9
    assert m[("c2dtn_udphc_frames_refused_total", ())] == 2
    assert m[("c2dtn_udphc_datagrams_dropped_total", ())] == 1
