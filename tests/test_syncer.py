"""fsync off the event loop (issue 17): the custody store commits without waiting on the
disk (store/sqlite.py, sync="thread"), one writer thread fsyncs for many commits
(overlay/syncer.py), and what a client is told waits for that fsync -- while the loop
goes on serving everyone else.  A slow disk is stood in for by a sync_wal that sleeps."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.gateway import MqttGateway
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import CustodyStore
from c2dtn.overlay.envelope import Codec
from c2dtn.overlay.port import Port
from c2dtn.overlay.syncer import Syncer
from c2dtn.perf.fsync_bench import gateway_config

KEY = b"k" * 32


def slow(store, seconds: float, calls: list | None = None, fail: list | None = None):
    """The store's fsync made slow (a disk that takes `seconds` per fsync); each call's
    commit count goes to `calls`; while `fail` holds an error, the next call raises it."""
    real = store.sync_wal

    def sync_wal():
        n = store.commits
        time.sleep(seconds)
        if fail:
            raise fail.pop()
        real()
        if calls is not None:
            calls.append(n)

    store.sync_wal = sync_wal


def test_thread_mode_commits_unsynced_and_counts_what_the_fsync_must_cover(tmp_path):
    c = CustodyStore(tmp_path / "c.db", "gw1", sync="thread")
    st = c.records
    c.submit("gw4", b"a", 0, 60_000)
    before = st.commits
    c.submit("gw4", b"b", 0, 60_000)
    c.submit("gw4", b"c", 0, 60_000)
    assert st.commits == before + 2
    assert st.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: no fsync in the commit
    with c.records.transaction(durable=False):
        st.bump("x")
    assert st.commits == before + 2  # relaxed commits need no fsync of their own
    st.sync_wal()
    c.close()
    loop_mode = CustodyStore(tmp_path / "l.db", "gw1")
    loop_mode.submit("gw4", b"a", 0, 60_000)
    assert loop_mode.records.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: fsync in the commit
    loop_mode.close()
    again = CustodyStore(tmp_path / "c.db", "gw1")
    assert again.counters()["accepted"] == 3
    again.close()


def test_a_slow_fsync_leaves_the_loop_free_and_one_fsync_covers_many_commits(tmp_path):
    c = CustodyStore(tmp_path / "c.db", "gw1", sync="thread")
    calls: list[int] = []
    slow(c.records, 0.2, calls)
    lag: list[float] = []

    async def main():
        sy = Syncer(c.records)
        sy.start()
        stop = asyncio.Event()

        async def ticker():  # how late the loop runs a 10 ms timer while fsyncs go on
            while not stop.is_set():
                t = time.monotonic()
                await asyncio.sleep(0.01)
                lag.append(time.monotonic() - t - 0.01)

        async def client(i):
            c.submit("gw4", b"m%d" % i, 0, 60_000)
            t = time.monotonic()
            await sy.synced()
            return time.monotonic() - t

        tick = asyncio.create_task(ticker())
        waits = []
        for burst in range(3):  # 20 clients' commits while each fsync takes 0.2 s
            waits += await asyncio.gather(*(client(burst * 20 + i) for i in range(20)))
            await asyncio.sleep(0.05)
        stop.set()
        await tick
        sy.stop()
        return sy, waits

    sy, waits = asyncio.run(main())
    assert max(lag) < 0.1, f"the loop stalled {max(lag) * 1000:.0f} ms during the fsyncs"
    assert len(calls) <= 6 and sy.fsyncs == len(calls), calls  # 60 commits, a few fsyncs
    assert calls[-1] == c.records.commits == sy.synced_upto  # the last fsync covered every commit
    assert all(0.15 < w < 0.9 for w in waits), waits  # each waited for an fsync that covered it


def test_a_failed_fsync_fails_its_waiters_and_every_later_wait(tmp_path):
    """A later fsync that succeeds proves nothing about the pages of the failed one (Linux may
    have dropped them): after the first failure every synced() raises, and the node is told
    once (on_failure) so that it stops and reopens its store from the disk."""
    c = CustodyStore(tmp_path / "c.db", "gw1", sync="thread")
    fail = [OSError(5, "Input/output error")]
    slow(c.records, 0.01, fail=fail)
    told = []

    async def main():
        sy = Syncer(c.records)
        sy.on_failure = told.append
        sy.start()
        c.submit("gw4", b"a", 0, 60_000)
        with pytest.raises(OSError, match="Input/output"):
            await sy.synced()
        assert sy.failures == 1 and sy.pending()
        c.submit("gw4", b"b", 0, 60_000)
        with pytest.raises(OSError, match="an earlier custody fsync failed"):
            await sy.synced()
        assert sy.pending() and len(told) == 1
        sy.stop()

    asyncio.run(main())


def test_auto_mode_fsyncs_on_the_loop_while_the_disk_is_fast_and_in_the_thread_while_slow(tmp_path):
    """fsync = "auto": a fast disk's fsync runs in synced() itself, on the loop (no hand-off
    to the thread and back); once fsyncs turn slow (20 ms here) they move to the writer
    thread after about half of RECENT (the median decides); fast again, they come back.
    Every synced() still returns only once an fsync covered its commit."""
    from c2dtn.overlay import syncer as syncer_mod

    c = CustodyStore(tmp_path / "c.db", "gw1", sync="auto")
    st = c.records
    delay = [0.0]
    where: list[tuple[str, int]] = []  # (thread, commits covered) per fsync
    real = st.sync_wal

    def sync_wal():
        n = st.commits
        time.sleep(delay[0])
        real()
        where.append((threading.current_thread().name, n))

    st.sync_wal = sync_wal
    phases: dict[str, list[str]] = {}

    async def main():
        sy = Syncer(st, inline=True)
        sy.start()
        for phase, d in (("fast", 0.0), ("slow", 0.02), ("fast again", 0.0)):
            delay[0] = d
            where.clear()
            for i in range(2 * syncer_mod.RECENT):
                c.submit("gw4", b"%s %d" % (phase.encode(), i), 0, 60_000)
                want = st.commits
                await sy.synced()
                assert sy.synced_upto >= want and any(n >= want for _, n in where), (phase, i)
            phases[phase] = [name for name, _ in where]
        sy.stop()

    asyncio.run(main())
    loop_thread = threading.main_thread().name
    assert set(phases["fast"]) == {loop_thread}, phases["fast"]
    slow = phases["slow"]
    on_loop = [i for i, name in enumerate(slow) if name == loop_thread]
    assert len(on_loop) <= syncer_mod.RECENT // 2 + 1 and max(on_loop) < syncer_mod.RECENT, slow
    assert set(slow[syncer_mod.RECENT :]) == {"c2-custody-fsync"}, slow
    assert set(phases["fast again"][-syncer_mod.RECENT // 2 :]) == {loop_thread}, phases["fast again"]


def _read_packet(sock: socket.socket, parser: m.Parser, timeout: float):
    sock.settimeout(timeout)
    while True:
        pkts = parser.feed(sock.recv(65536))
        if pkts:
            assert len(pkts) == 1, pkts
            return pkts[0]


def test_puback_waits_for_the_fsync_and_other_clients_are_answered_meanwhile(tmp_path):
    """A QoS 1 PUBLISH is acknowledged only once an fsync covered its commit; while that
    fsync takes 0.5 s another client's PINGREQ is answered at once.  (Before 2026-11-24 the
    PUBACK went as soon as the commit returned, its fsync on the loop holding up everyone.)"""
    store = CustodyStore(tmp_path / "gw1.db", "gw1", sync="thread")
    calls: list[int] = []
    slow(store.records, 0.5, calls)
    core = OverlayCore(store, Codec("gw1", {"c2gw4": KEY}))
    out: dict = {}

    async def main():
        sy = Syncer(store.records)
        sy.start()
        port = _free_port()
        gw = MqttGateway(Port(core, sy, tmp_path), gateway_config(port))  # topics c2/# to gw4
        await gw.start()

        def clients():
            a, b = (socket.create_connection(("127.0.0.1", port)) for _ in range(2))
            pa, pb = m.Parser(version=4), m.Parser(version=4)
            for s, p, cid in ((a, pa, "c2-a"), (b, pb, "c2-b")):
                s.sendall(m.encode(m.Connect(cid, clean_start=True, keepalive=60), 4))
                assert isinstance(_read_packet(s, p, 5), m.ConnAck)
            calls.clear()
            t0 = time.monotonic()
            a.sendall(m.encode(m.Publish("c2/orders/1", b"order 1", qos=1, packet_id=7), 4))
            time.sleep(0.05)
            b.sendall(m.encode(m.PingReq(), 4))
            assert isinstance(_read_packet(b, pb, 5), m.PingResp)
            out["ping_s"] = time.monotonic() - t0 - 0.05
            ack = _read_packet(a, pa, 5)
            out["puback_s"] = time.monotonic() - t0
            out["ack"] = ack
            out["fsyncs_before_ack"] = list(calls)
            a.close()
            b.close()

        await asyncio.to_thread(clients)
        await gw.stop()
        sy.stop()

    asyncio.run(main())
    assert isinstance(out["ack"], m.PubAck) and out["ack"].packet_id == 7
    assert out["fsyncs_before_ack"], "PUBACK went before any fsync covered the publish"
    assert out["puback_s"] >= 0.45, out
    assert out["ping_s"] < 0.2, f"a PINGREQ waited {out['ping_s']:.2f} s behind another client's fsync"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_perf_fsync_short_reports_its_own_runs_in_a_table_and_a_plot(tmp_path):
    """`c2dtn perf fsync` in short: both modes run, the report's figures are the runs' own."""
    import json

    from c2dtn.perf import fsync_bench

    out = fsync_bench.main(runs=1, clients=3, rate=5, duration=3, disk_ms=5, out=tmp_path / "r")
    res = json.loads((out / "summary.json").read_text())
    assert [r["mode"] for r in res["runs"]] == ["loop", "thread"]
    for r in res["runs"]:
        assert r["sent"] == 3 * 15 and r["acked"] == r["sent"], r
        assert 5 <= r["puback_p50_ms"] <= r["puback_p99_ms"] <= r["puback_max_ms"]  # each waited for a slow fsync
        assert r["fsyncs"] > 0 and r["ping_p99_ms"] > 0
    loop, thread = res["runs"]
    md = (out / "report.md").read_text()
    assert f"| PUBACK p99 | {loop['puback_p99_ms']:.2f} ms | {thread['puback_p99_ms']:.2f} ms |" in md
    drawn = json.loads((out / "plot.json").read_text())
    assert {s["label"] for p in drawn for s in p["series"]} == {"fsync loop", "fsync thread"}
    rows = (out / "latency.csv").read_text().splitlines()
    assert rows[0] == "mode,run,kind,t_s,latency_ms" and len(rows) > 2 * 45
