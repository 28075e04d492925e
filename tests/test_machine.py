"""The node's timing rules (overlay/machine.py), in virtual time: when what is submitted,
delivered and consumed becomes bundles handed to the agent.  Two cores on in-memory stores;
the test plays the node's shell (it does the hand-overs the machine asks for, when it likes)."""

from __future__ import annotations

import pytest

from c2dtn.overlay import machine as mm
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import Custody
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.overlay.machine import AppsReady, HandOver, NodeMachine
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store import StoreFull
from c2dtn.overlay.store.memory import MemoryStore

KEY = b"k" * 32
CFG = SchedulerConfig(min_rto_ms=5_000, initial_rto_ms=10_000)
T0 = 1_800_000_000.0  # (wall-clock seconds: envelopes carry their creation time)
HOUR_MS = 3_600_000


def core(name: str) -> OverlayCore:
    peer = "gw4" if name == "gw1" else "gw1"
    return OverlayCore(Custody(MemoryStore(), name), Codec(name, {peer: KEY}), CFG)


def synced(c: OverlayCore) -> None:
    """What the shell does around an fsync that covered every commit so far."""
    c.store.synced(c.store.sync_point())


def hand_overs(events) -> list[HandOver]:
    return [e for e in events if isinstance(e, HandOver)]


class Shell:
    """The node's shell in virtual time: ticks the machine at its deadlines and finishes each
    hand-over `takes` seconds after it was given (one at a time, in order)."""

    def __init__(self, m: NodeMachine, takes: float = 0.0):
        self.m, self.takes = m, takes
        self.queue: list[tuple[float, HandOver]] = []  # (given at, hand-over), oldest first
        self.done: list[tuple[float, HandOver]] = []  # (finished at, hand-over)
        self.apps_ready = 0

    def apply(self, events, now: float) -> None:
        for e in events:
            if isinstance(e, HandOver):
                self.queue.append((now, e))
            elif isinstance(e, AppsReady):
                self.apps_ready += 1

    def run_until(self, until: float) -> None:
        for _ in range(100_000):  # a machine that asks for a tick again and again at one time: a hot loop
            due = self.m.next_deadline()
            finish = None
            if self.queue:  # the head of the queue finishes `takes` after it started
                start = max(self.queue[0][0], self.done[-1][0] if self.done else self.queue[0][0])
                finish = start + self.takes
            nxt = min(t for t in (due, finish) if t is not None) if (due is not None or finish is not None) else None
            if nxt is None or nxt > until:
                return
            now = max(nxt, T0)
            if finish is not None and finish <= (due if due is not None else finish):
                _, h = self.queue.pop(0)
                self.done.append((now, h))
                self.apply(self.m.handed_over(h, now), now)
            else:
                self.apply(self.m.tick(now), now)
        raise AssertionError(f"the machine asked for 100,000 steps before {until}: a hot loop")

    def bundles(self) -> list:
        return [b for _, h in self.done for b in h.bundles]


def test_a_lone_routine_submit_waits_the_gather_time_and_no_longer():
    c = core("gw1")
    m = NodeMachine(c, T0)
    seq, events = m.submit("gw4", b"lone", HOUR_MS, Priority.ROUTINE, None, "t", T0)
    assert events == [] and m.next_deadline() == pytest.approx(T0 + mm.SUBMIT_GATHER_S)
    assert m.tick(T0 + mm.SUBMIT_GATHER_S / 2) == []
    (h,) = hand_overs(m.tick(T0 + mm.SUBMIT_GATHER_S))
    assert [b.seqs for b in h.bundles] == [[seq]] and h.by_pump and not h.unsynced


def test_routine_submits_within_the_gather_time_go_in_one_bundle():
    c = core("gw1")
    m = NodeMachine(c, T0)
    seqs = [m.submit("gw4", b"m%d" % i, HOUR_MS, Priority.ROUTINE, None, "t", T0 + i * 0.0005)[0] for i in range(3)]
    sh = Shell(m)
    sh.run_until(T0 + 0.1)
    assert [b.seqs for b in sh.bundles()] == [seqs]


def test_a_stream_of_submits_is_planned_at_most_every_stream_gather_time():
    """One envelope every 4 ms for 400 ms (a client streaming through the API on a LAN): a plan
    per STREAM_GATHER_S or so, not one each; none waits much past it."""
    c = core("gw1")
    m = NodeMachine(c, T0)
    sh = Shell(m, takes=0.001)
    submitted: dict[int, float] = {}
    t = T0
    for i in range(100):
        sh.run_until(t)
        seq, events = m.submit("gw4", b"s%d" % i, HOUR_MS, Priority.ROUTINE, None, "t", t)
        sh.apply(events, t)
        submitted[seq] = t
        t += 0.004
    sh.run_until(t + 1.0)
    sent_at = {s: at - sh.takes for at, h in sh.done for b in h.bundles for s in b.seqs}
    assert sorted(sent_at) == sorted(submitted)
    plans = len(sh.done)
    assert plans <= 0.4 / mm.STREAM_GATHER_S + 3, plans  # planned one by one: 100
    waited = max(sent_at[s] - submitted[s] for s in submitted)
    assert waited <= mm.STREAM_GATHER_S + 0.002, waited


def test_a_flash_submit_is_planned_in_its_own_commit_and_may_go_before_its_fsync():
    c = core("gw1")
    m = NodeMachine(c, T0)
    m.submit("gw4", b"first", HOUR_MS, Priority.ROUTINE, None, "t", T0)  # seqs reserved ...
    synced(c)  # ... and on disk
    seq, events = m.submit("gw4", b"flash", HOUR_MS, Priority.FLASH, None, "t", T0 + 0.0001)
    (h,) = hand_overs(events)
    assert seq in h.bundles[0].seqs and not h.by_pump
    assert h.unsynced, "within a reservation on disk, nothing waits for the fsync"
    assert m.handing


def test_a_flash_submit_waits_for_the_fsync_when_its_seq_is_not_reserved_on_disk():
    c = core("gw1")
    m = NodeMachine(c, T0)
    _, events = m.submit("gw4", b"flash", HOUR_MS, Priority.FLASH, None, "t", T0)
    (h,) = hand_overs(events)
    assert not h.unsynced


def test_nothing_is_planned_at_once_while_a_hand_over_is_under_way():
    """What arrives meanwhile goes together in the pump's next plan, once the hand-over is done."""
    c = core("gw1")
    m = NodeMachine(c, T0)
    _, events = m.submit("gw4", b"first", HOUR_MS, Priority.FLASH, None, "t", T0)
    (first,) = hand_overs(events)
    s2, ev2 = m.submit("gw4", b"second", HOUR_MS, Priority.FLASH, None, "t", T0 + 0.001)
    s3, ev3 = m.submit("gw4", b"third", HOUR_MS, Priority.IMMEDIATE, None, "t", T0 + 0.002)
    assert ev2 == ev3 == []
    (nxt,) = hand_overs(m.handed_over(first, T0 + 0.003))  # the pump looks as soon as it is done
    assert [b.seqs for b in nxt.bundles] == [[s2, s3]] and nxt.by_pump


def test_the_pump_waits_for_its_own_hand_over_before_it_plans_again():
    c = core("gw1")
    m = NodeMachine(c, T0)
    m.submit("gw4", b"a", HOUR_MS, Priority.ROUTINE, None, "t", T0)
    (h,) = hand_overs(m.tick(T0 + mm.SUBMIT_GATHER_S))
    t = T0 + mm.SUBMIT_GATHER_S
    m.submit("gw4", b"b", HOUR_MS, Priority.ROUTINE, None, "t", t)
    for k in range(1, 50):  # the gather time passes many times over: no second plan meanwhile
        assert hand_overs(m.tick(t + k * 0.001)) == []
    (h2,) = hand_overs(m.handed_over(h, t + 0.05))
    assert len(h2.bundles[0].seqs) == 1


def test_the_pump_plans_at_least_every_second_when_nothing_wakes_it():
    c = core("gw1")
    m = NodeMachine(c, T0)
    assert m.next_deadline() == pytest.approx(T0 + mm.PUMP_IDLE_S)
    polls = []
    real_poll = c.poll
    c.poll = lambda *a, **k: polls.append(a[0]) or real_poll(*a, **k)
    Shell(m).run_until(T0 + 5.5)
    assert len(polls) == 5 and all(b - a == pytest.approx(1000, abs=1) for a, b in zip(polls, polls[1:]))


def test_a_plan_that_fails_is_tried_again_after_a_while_not_in_a_hot_loop():
    c = core("gw1")
    m = NodeMachine(c, T0)
    calls = []

    def full(*a, **k):
        calls.append(a[0])
        raise StoreFull("custody store: the disk is full")

    real_poll, c.poll = c.poll, full
    m.submit("gw4", b"a", HOUR_MS, Priority.ROUTINE, None, "t", T0)
    sh = Shell(m)
    sh.run_until(T0 + 2.5)
    assert len(calls) == 3 and calls[1] - calls[0] >= mm.PLAN_RETRY_S * 1000, calls
    c.poll = real_poll  # the disk has room again
    sh.run_until(T0 + 4.0)
    assert [b.seqs for b in sh.bundles()] == [[1]]


def _ping_with_an_ack(gw1: OverlayCore, gw4: OverlayCore, now_ms: int) -> tuple[int, bytes]:
    """gw1 sent gw4 a report; gw4 took it, and sends a ping with the report's ack in one bundle."""
    report = gw1.submit("gw4", b"report", now_ms, priority=Priority.FLASH)
    synced(gw1)
    gw4.on_bundles([o.payload for o in gw1.poll(now_ms)], now_ms)
    gw4.consumed([d.id for d in gw4.take()])
    gw4.submit("gw1", b"are you there", now_ms, priority=Priority.FLASH, app="ping")
    (b,) = gw4.poll(now_ms + CFG.ack_delay_ms)
    return report, b.payload


def test_a_ping_is_answered_in_the_commit_that_took_it_and_the_acks_with_it_wait_for_the_answer():
    gw1, gw4 = core("gw1"), core("gw4")
    report, payload = _ping_with_an_ack(gw1, gw4, int(T0 * 1000))
    m = NodeMachine(gw1, T0)
    t = T0 + 1.0
    (answer,) = hand_overs(m.bundles([payload], t))
    assert answer.results is not None and not answer.by_pump
    assert gw1.store.held_out()[0] == 2, "the report is still held while the answer goes"
    assert hand_overs(m.tick(t + 0.5)) == [] and gw1.store.held_out()[0] == 2, "not before the answer is done"
    m.handed_over(answer, t + 0.5)
    m.tick(t + 0.5 + mm.ANSWER_CLEAR_S / 2)
    assert gw1.store.held_out()[0] == 2, "not before ANSWER_CLEAR_S after it"
    m.tick(t + 0.5 + mm.ANSWER_CLEAR_S)
    assert gw1.store.held_out()[0] == 1, "released then (the answer itself waits for its ack)"


def test_a_ping_that_comes_while_a_hand_over_is_under_way_is_answered_once_it_is_done():
    gw1, gw4 = core("gw1"), core("gw4")
    _, payload = _ping_with_an_ack(gw1, gw4, int(T0 * 1000))
    m = NodeMachine(gw1, T0)
    _, events = m.submit("gw4", b"busy", HOUR_MS, Priority.FLASH, None, "t", T0 + 1.0)
    (busy,) = hand_overs(events)
    assert hand_overs(m.bundles([payload], T0 + 1.001)) == []
    (answer,) = hand_overs(m.handed_over(busy, T0 + 1.002))  # (its acks move the window: planned at once)
    assert [b.seqs for b in answer.bundles] == [[3]], "the answer (the report was 1, the busy one 2)"


def test_data_that_arrives_wakes_the_applications_and_its_ack_waits_for_the_ack_delay():
    gw1, gw4 = core("gw1"), core("gw4")
    now_ms = int(T0 * 1000)
    gw4.submit("gw1", b"order", now_ms, priority=Priority.ROUTINE)
    (b,) = gw4.poll(now_ms)
    m = NodeMachine(gw1, T0)
    sh = Shell(m)
    events = m.bundles([b.payload], T0)
    assert any(isinstance(e, AppsReady) for e in events) and hand_overs(events) == []
    sh.run_until(T0 + CFG.ack_delay_ms / 1000 - 0.001)
    assert sh.done == [], "no bundle of its own for an ack before the ack delay"
    sh.run_until(T0 + CFG.ack_delay_ms / 1000 + 0.001)
    assert len(sh.bundles()) == 1 and sh.bundles()[0].seqs == [], "then the ack alone"


def test_consumed_does_not_plan_at_once():
    gw1, gw4 = core("gw1"), core("gw4")
    now_ms = int(T0 * 1000)
    gw4.submit("gw1", b"order", now_ms, priority=Priority.ROUTINE)
    (b,) = gw4.poll(now_ms)
    m = NodeMachine(gw1, T0)
    m.bundles([b.payload], T0)
    assert m.consumed([d.id for d in gw1.take()], T0 + 0.001) == []
    assert hand_overs(m.tick(T0 + 0.002)) == [], "its ack waits for the ack delay like any other"


def test_bundles_refused_on_a_full_disk_are_not_acked_and_what_came_with_them_is_applied_later(monkeypatch):
    gw1, gw4 = core("gw1"), core("gw4")
    now_ms = int(T0 * 1000)
    gw4.submit("gw1", b"order", now_ms, priority=Priority.ROUTINE)
    (b,) = gw4.poll(now_ms)
    m = NodeMachine(gw1, T0)

    def full(*a, **k):
        raise StoreFull("custody store: the disk is full")

    monkeypatch.setattr(gw1, "on_bundles", full)
    assert m.bundles([b.payload], T0) == []
    assert m.next_deadline() == T0, "the acks kept are applied at the next turn"
    assert m.tick(T0) == [] and gw1.take() == []


def test_a_step_of_the_wall_clock_moves_no_deadline():
    """Deadlines run on the monotonic clock; only the envelopes' stamps read the wall clock (an
    hour's step back by NTP or GPS must not hold routine traffic for an hour)."""
    c = core("gw1")
    wall = [int(T0 * 1000)]
    m = NodeMachine(c, T0, wall_ms=lambda _t: wall[0])
    m.submit("gw4", b"a", HOUR_MS, Priority.ROUTINE, None, "t", T0)
    (h,) = hand_overs(m.tick(T0 + mm.SUBMIT_GATHER_S))
    m.handed_over(h, T0 + 0.003)
    wall[0] -= 3_600_000
    m.submit("gw4", b"b", HOUR_MS, Priority.ROUTINE, None, "t", T0 + 0.004)
    assert m.next_deadline() <= T0 + 0.004 + mm.STREAM_GATHER_S


def test_flash_is_planned_at_once_again_once_the_hand_over_is_done():
    c = core("gw1")
    m = NodeMachine(c, T0)
    _, ev = m.submit("gw4", b"a", HOUR_MS, Priority.FLASH, None, "t", T0)
    (h,) = hand_overs(ev)
    m.handed_over(h, T0 + 0.001)
    assert not m.handing
    _, ev = m.submit("gw4", b"b", HOUR_MS, Priority.FLASH, None, "t", T0 + 0.002)
    (h2,) = hand_overs(ev)
    assert not h2.by_pump


def test_a_gateways_flash_submit_is_planned_at_once():
    c = core("gw1")
    m = NodeMachine(c, T0)
    c.submit("gw4", b"g", int(T0 * 1000), HOUR_MS, Priority.FLASH)  # (through the port: custody first)
    (h,) = hand_overs(m.submitted(Priority.FLASH, T0))
    assert not h.by_pump


def test_a_wake_is_acted_on_at_once():
    m = NodeMachine(core("gw1"), T0)
    m.wake()
    assert m.next_deadline() <= T0


def test_the_pump_looks_within_a_second_though_the_next_retransmission_is_later():
    c = core("gw1")
    m = NodeMachine(c, T0)
    m.submit("gw4", b"a", HOUR_MS, Priority.ROUTINE, None, "t", T0)
    (h,) = hand_overs(m.tick(T0 + mm.SUBMIT_GATHER_S))
    m.handed_over(h, T0 + 0.003)  # in flight: its retransmission is seconds away
    assert m.next_deadline() <= T0 + 0.003 + mm.PUMP_IDLE_S + 1e-6


def test_consumed_data_owes_its_ack_after_the_ack_delay_not_the_idle_look():
    gw1, gw4 = core("gw1"), core("gw4")
    now_ms = int(T0 * 1000)
    gw4.submit("gw1", b"order", now_ms, priority=Priority.ROUTINE)
    (b,) = gw4.poll(now_ms)
    m = NodeMachine(gw1, T0)
    m.bundles([b.payload], T0)
    m.tick(T0)
    m.consumed([d.id for d in gw1.take()], T0 + 0.001)
    m.tick(T0 + 0.001)
    assert m.next_deadline() <= T0 + CFG.ack_delay_ms / 1000 + 0.002


def test_after_an_empty_plan_the_pump_waits_for_the_hand_overs_under_way():
    """Wakes while a (slow) flash hand-over is out cost one plan, not one each."""
    c = core("gw1")
    m = NodeMachine(c, T0)
    polls = []
    real = c.poll
    c.poll = lambda *a, **k: polls.append(a[0]) or real(*a, **k)
    _, ev = m.submit("gw4", b"flash", HOUR_MS, Priority.FLASH, None, "t", T0)
    (h,) = hand_overs(ev)
    n0 = len(polls)
    for i in range(5):
        m.wake()
        m.tick(T0 + 0.001 * (i + 1))
    assert len(polls) - n0 == 1
    m.handed_over(h, T0 + 0.01)
    assert len(polls) - n0 == 2, "and looks again once it is done"
