"""Bundles that go to the agent before the commits behind them are on disk (issue 14: a flash
message's round trip waited on two fsyncs): the rules in overlay/custody.py's module doc, and
what a power cut in that moment may cost (a repeat, never a message)."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest

from c2dtn.overlay import custody as custody_mod
from c2dtn.overlay import machine as machine_mod
from c2dtn.overlay import node as node_mod
from c2dtn.overlay.agent import AgentDelivery
from c2dtn.overlay.client import NodeClient
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import Custody, CustodyStore
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.overlay.node import OverlayNode
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store.memory import MemoryStore

KEY = b"k" * 32
CFG = SchedulerConfig(min_rto_ms=5_000, initial_rto_ms=10_000)


def core(store: Custody) -> OverlayCore:
    peer = "gw4" if store.origin == "gw1" else "gw1"
    return OverlayCore(store, Codec(store.origin, {peer: KEY}), CFG)


def synced(c: OverlayCore) -> None:
    """What the node does around an fsync that covered every commit so far."""
    c.store.synced(c.store.sync_point())


def acked(out, origin_store: Custody) -> set[int]:
    """Seqs of origin_store's envelopes that the bundles `out` ack (done or got)."""
    seqs: set[int] = set()
    for b in out:
        acks = b.acks if isinstance(b.acks, dict) else {origin_store.source: b.acks}
        done, got = acks.get(origin_store.source, ([], []))
        seqs.update(done, got)
    return seqs


@pytest.fixture(params=["sqlite", "memory"])
def pair(request, tmp_path):
    if request.param == "memory":
        return core(Custody(MemoryStore(), "gw1")), core(Custody(MemoryStore(), "gw4"))
    return (
        core(CustodyStore(tmp_path / "gw1.db", "gw1", sync="thread")),
        core(CustodyStore(tmp_path / "gw4.db", "gw4", sync="thread")),
    )


def test_seqs_may_go_before_the_fsync_only_within_a_reservation_on_disk(pair):
    a, _b = pair
    assert a.store.may_send_unsynced()  # nothing handed out yet
    first = a.submit("gw4", b"one", 0)
    # this submit reserved seqs up to first + SEQ_BLOCK, in its own commit: not on disk yet
    assert not a.store.may_send_unsynced()
    synced(a)
    assert a.store.may_send_unsynced()
    with a.store.transaction():  # as if the rest of the block but one had been handed out
        a.store.records.bump("next_seq", custody_mod.SEQ_BLOCK - 1)
    assert a.submit("gw4", b"the block's last", 0) == first + custody_mod.SEQ_BLOCK
    assert a.store.may_send_unsynced()
    assert a.submit("gw4", b"past the block", 0) == first + custody_mod.SEQ_BLOCK + 1
    assert not a.store.may_send_unsynced()  # a new reservation, not on disk yet
    synced(a)
    assert a.store.may_send_unsynced()


def test_a_mark_keeps_everything_waiting_for_its_fsync(pair):
    """A resent MQTT PUBLISH is told from a new one by its mark: a mark lost with its submit in a
    power cut would let the client's repeat through as a second message."""
    a, _b = pair
    a.submit("gw4", b"one", 0)
    synced(a)
    a.store.submit_many(
        [("gw4", b"publish", 60_000, Priority.FLASH, None, "mqtt")], 0, marks=[("client-1:7", b"digest", False)]
    )
    assert not a.store.may_send_unsynced()
    synced(a)
    assert a.store.may_send_unsynced()


def test_acks_owed_since_the_last_fsync_do_not_ride_a_bundle_sent_before_it(pair):
    """gw4 answers what gw1 sent before gw4's taking of it is on disk: the answer goes, the ack
    waits (a power cut would undo the taking, and gw1, acked, would never send it again)."""
    a, b = pair
    s = a.submit("gw4", b"ping", 0, priority=Priority.FLASH)
    b.on_bundles([o.payload for o in a.poll(0)], 10)
    assert b.store.unsynced_acks() == {(a.store.source, s)}
    b.submit("gw1", b"answer", 10, priority=Priority.FLASH)
    early = b.poll(10, unsynced=True)
    assert len(early) == 1 and early[0].seqs and acked(early, a.store) == set()
    assert b.next_wakeup_ms() is not None and b.next_wakeup_ms() <= 10 + CFG.ack_delay_ms  # the ack's timer stands
    synced(b)
    assert b.store.unsynced_acks() == set()
    late = b.poll(10 + CFG.ack_delay_ms)  # its time: the ack goes, on its own
    assert acked(late, a.store) == {s}
    # a second answer, once the fsync came, carries the ack of what it answers' predecessor
    s2 = a.submit("gw4", b"ping 2", 200, priority=Priority.FLASH)
    b.on_bundles([o.payload for o in a.poll(200)], 210)
    consumed = b.take()
    b.consumed([d.id for d in consumed], 210)
    assert b.store.unsynced_acks() >= {(a.store.source, s2)}  # taking and consuming: both not on disk


@pytest.mark.parametrize("clean", [True, False])
def test_a_power_cut_after_a_bundle_went_before_its_fsync_costs_no_later_message(tmp_path, clean):
    """gw1 hands a message to the agent before its commit is on disk; gw4 takes it; the power
    fails and gw1's disk is as at its last fsync (its submit undone).  gw1's next message must
    not get that message's seq: gw4 has seen it and would take the new one for a duplicate,
    ack it and drop it, and gw1 would release it -- lost.  A clean close gives back the seqs
    reserved and not used (the next run numbers on without a gap)."""
    path = tmp_path / "gw1.db"
    a = core(CustodyStore(path, "gw1", sync="thread"))
    b = core(CustodyStore(tmp_path / "gw4.db", "gw4", sync="thread"))
    first = a.submit("gw4", b"first", 0, priority=Priority.FLASH)
    a.store.records.sync_wal()
    synced(a)
    b.on_bundles([o.payload for o in a.poll(0)], 10)
    disk = tmp_path / "disk"
    disk.mkdir()
    for f in (path, tmp_path / "gw1.db-wal"):  # what an fsync put on disk (sync="thread": commits are in the files)
        shutil.copy(f, disk / f.name)
    assert a.store.may_send_unsynced()
    gone = a.submit("gw4", b"sent, then the power failed", 20, priority=Priority.FLASH)
    b.on_bundles([o.payload for o in a.poll(20, unsynced=True)], 30)
    assert b.store.records.get("seen", (a.store.source, gone))  # gw4 holds it
    if clean:
        a.store.close()
        again = core(CustodyStore(path, "gw1", sync="thread"))
        assert again.submit("gw4", b"next run", 40) == gone + 1
        return
    a.store.records.close()  # the power cut: no close() of custody; the disk as at the last fsync
    for f in tmp_path.glob("gw1.db*"):
        f.unlink()
    for f in disk.iterdir():
        shutil.copy(f, tmp_path / f.name)
    again = core(CustodyStore(path, "gw1", sync="thread"))
    assert again.store.source == a.store.source  # the same store, the same incarnation
    after = again.submit("gw4", b"after the power cut", 40, priority=Priority.FLASH)
    assert after > gone and after > first + custody_mod.SEQ_BLOCK - 1
    b.on_bundles([o.payload for o in again.poll(40)], 50)
    assert [d.body for d in b.take()] == [b"first", b"sent, then the power failed", b"after the power cut"]


async def serve_api_to(node, client, then=None) -> None:
    """The node's API served (its syncer running) while `client` runs in a thread; `then`
    (a coroutine function) before it stops."""
    from c2dtn.overlay.node_api import LocalApi

    api = LocalApi(node)
    node.syncer.start()
    await api.serve()
    th = threading.Thread(target=client)
    th.start()
    while th.is_alive():
        await asyncio.sleep(0.01)
    if then is not None:
        await then()
    await api.close()
    await node.close()
    node.syncer.stop()


def test_a_flash_message_goes_to_the_agent_before_its_fsync_and_is_answered_after_it(tmp_path):
    """Through the node's API, with an fsync that takes 80 ms: the bundle is handed to the agent
    at once, the client's answer (the message is in custody) comes only once the fsync is done."""
    p = tmp_path / "gw1.toml"
    p.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\nfsync = "thread"\n[agent]\nkind = "ion"\n'
        f'[keys]\ngw4 = "{"ab" * 32}"\n'
    )
    p.chmod(0o600)
    node = OverlayNode(load_node_config(p))
    sent: list[float] = []
    fsyncs: list[tuple[float, float]] = []

    async def send(dst_node, endpoint, payload, lifetime_s, priority=3):
        sent.append(time.monotonic())

    node.agent.send = send
    store = node.core.store.records
    real = store.sync_wal

    def slow_sync():
        t0 = time.monotonic()
        time.sleep(0.08)
        real()
        fsyncs.append((t0, time.monotonic()))

    store.sync_wal = slow_sync
    answers: list[tuple[float, float]] = []

    def client():
        c = NodeClient(node.cfg.api_socket, "gw1")
        for i in range(3):
            t0 = time.monotonic()
            c.send("gw4", b"order %d" % i, priority="flash")
            answers.append((t0, time.monotonic()))

    asyncio.run(serve_api_to(node, client))
    node.core.store.close()
    assert len(sent) == 3 and len(answers) == 3
    # the first submit's reservation of seqs had to reach the disk before anything could go early
    first_fsync_end = fsyncs[0][1]
    assert sent[0] >= first_fsync_end - 0.001
    for (t0, t1), at in zip(answers[1:], sent[1:]):
        assert at - t0 < 0.05, "handed over before the 80 ms fsync"
        assert t1 - at >= 0.07, "answered only once the fsync was done"


def test_an_answer_goes_before_the_fsync_with_the_ack_of_the_ping_it_answers(pair):
    """A ping's pong goes before the fsync of the ping's taking, and carries the ping's ack: the
    answer proves the ping was taken (a power cut undoing the taking costs nothing the pinger
    waits for).  A 100 kB ping too (its ack is owed at once: it rides the answer).  An ack for
    anything else that came stays held back."""
    a, b = pair
    b.submit("gw1", b"warm", 0)  # b's first seqs reserved, and on disk
    synced(b)
    small = a.submit("gw4", b"p" * 1000, 0, priority=Priority.FLASH, app="ping")
    other = a.submit("gw4", b"order", 0, priority=Priority.FLASH)
    b.on_bundles([o.payload for o in a.poll(0)], 10, answer_now=True)
    out, unsynced = b.answers
    assert unsynced and any(o.seqs for o in out)
    assert small in acked(out, a.store) and other not in acked(out, a.store)
    synced(b)
    big = a.submit("gw4", bytes(range(256)) * 400, 20, priority=Priority.FLASH, app="ping")
    b.on_bundles([o.payload for o in a.poll(20)], 30, answer_now=True)
    out, unsynced = b.answers
    assert unsynced and any(o.seqs for o in out) and big in acked(out, a.store)


def test_an_answer_waits_for_the_fsync_when_other_acks_are_owed_at_once(pair):
    """A 100 kB message comes with a ping: its ack is owed at once (ACK_BYTES) and may not go
    before the fsync; sent early, the answer would leave it for a bundle of its own.  So the
    answer waits for the fsync and carries both."""
    a, b = pair
    b.submit("gw1", b"warm", 0)
    synced(b)
    ping = a.submit("gw4", b"p" * 1000, 0, priority=Priority.FLASH, app="ping")
    big = a.submit("gw4", bytes(range(256)) * 400, 0, priority=Priority.FLASH)
    b.on_bundles([o.payload for o in a.poll(0)], 10, answer_now=True)
    out, unsynced = b.answers
    assert not unsynced and any(o.seqs for o in out) and {ping, big} <= acked(out, a.store)


def test_an_answer_that_cannot_go_beside_its_pings_ack_waits_for_the_fsync(pair):
    """The window to the pinger is full: the pong stays queued, and the ping's ack (a 100 kB
    ping's: owed at once) would go alone before the fsync, nothing then proving the ping was
    taken.  So that bundle waits for the fsync."""
    a, b = pair
    b.submit("gw1", bytes(range(256)) * 80, 0)  # 20 kB in flight, past the 8 kB first window
    b.poll(0)
    synced(b)
    ping = a.submit("gw4", bytes(range(256)) * 400, 0, priority=Priority.FLASH, app="ping")
    b.on_bundles([o.payload for o in a.poll(0)], 10, answer_now=True)
    out, unsynced = b.answers
    assert not any(o.seqs for o in out), "the pong waits for room in the window"
    assert ping in acked(out, a.store) and not unsynced


def test_acks_that_came_with_a_ping_are_applied_after_the_answer_is_with_the_agent(tmp_path, monkeypatch):
    """A bundle brings a ping and the ack for a message this node sent: the pong goes to the
    agent first, the release the ack calls for only ANSWER_CLEAR_S after (on lan it took the CPU
    the agents were carrying the answer with), and then it does happen."""
    monkeypatch.setattr(machine_mod, "ANSWER_CLEAR_S", 0.05)  # (5 ms: too close to a loop's turn to time)
    p = tmp_path / "gw4.toml"
    p.write_text(
        f'[node]\nid = "gw4"\nstorage = "{tmp_path / "gw4"}"\nfsync = "thread"\n[agent]\nkind = "ion"\n'
        f'[keys]\ngw1 = "{"ab" * 32}"\n'
    )
    p.chmod(0o600)
    node = OverlayNode(load_node_config(p))
    peer = OverlayCore(Custody(MemoryStore(), "gw1"), Codec("gw1", {"gw4": bytes.fromhex("ab" * 32)}), CFG)
    handed: list[tuple[float, bytes]] = []

    async def send(dst_node, endpoint, payload, lifetime_s, priority=3):
        handed.append((time.monotonic(), payload))

    node.agent.send = send
    seen: list[tuple[float, int]] = []  # (when, envelopes gw4 holds: the report and, once planned, the pong)

    async def main():
        node.syncer.start()
        report = node.core.submit("gw1", b"report", node_mod.now_ms(), priority=Priority.FLASH)
        await node.synced()
        peer.on_bundles([o.payload for o in node.core.poll(node_mod.now_ms())], node_mod.now_ms())
        peer.consumed([d.id for d in peer.take()])  # its ack: done (a "got" keeps it held here)
        peer.submit("gw4", b"are you there", node_mod.now_ms(), priority=Priority.FLASH, app="ping")
        out = peer.poll(node_mod.now_ms() + CFG.ack_delay_ms)
        assert len(out) == 1 and report in acked(out, node.core.store)  # the ping and the ack, together
        t0 = time.monotonic()
        node.take([AgentDelivery("gw1", "/c2/overlay", out[0].payload)])
        while time.monotonic() - t0 < 0.2:
            seen.append((time.monotonic(), node.core.store.held_out()[0]))
            await asyncio.sleep(0.0005)
        node.syncer.stop()

    asyncio.run(main())
    node.core.store.close()
    assert handed, "the pong went to the agent"
    answered_at = handed[0][0]
    held_then = [n for t, n in seen if t <= answered_at + 0.04]
    assert held_then and all(n == 2 for n in held_then), "the report still held while the pong goes"
    assert seen[-1][1] == 1, "and released once the answer was with the agent (the pong waits for its ack)"
    released_at = next(t for t, n in seen if n == 1 and t > answered_at)
    assert released_at - answered_at >= 0.04
