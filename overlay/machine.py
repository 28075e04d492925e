"""The overlay node's timing rules as an event machine (I/O-free, virtual time; decision 0008).

The node's shell (overlay/node.py) feeds it what happens and does what it says; tests drive it
with a clock of their own (tests/test_machine.py).  `now` is monotonic seconds (the event loop's
clock: a step of the wall clock moves no deadline); the envelopes' own times come from
`wall_ms(now)`, the wall clock in milliseconds (in tests, `now` itself).

    submit(...)            -> seq, events   an application's envelope (flash and immediate: planned in its commit)
    submitted(priority)    -> events        envelopes of this priority went into custody some other way (a gateway)
    bundles(payloads)      -> events        what the agent delivered, taken in one commit
    consumed(ids)          -> events        the application is done with these
    handed_over(h)         -> events        the shell finished HandOver h (fsync and sends)
    tick()                 -> events        a deadline passed; next_deadline() says when the next is

Events: HandOver(bundles, unsynced) -- fsync first unless `unsynced`, then give the bundles to
the agent, one hand-over at a time in the order given, then handed_over(); AppsReady --
envelopes arrived for the applications (wake GET /recv and the gateways' handlers).

The rules, and why each (decision 0006):
- Priority and routine submits gather SUBMIT_GATHER_S, and while a stream goes on they are
  planned at most every STREAM_GATHER_S; flash and immediate ones are planned at once, in the
  submit's own commit, and may go before its fsync when custody allows.
- A ping's answer is planned in the commit that took the ping and may go before its fsync; the
  acks that came with the ping are applied ANSWER_CLEAR_S after the answer is with the agent.
- Nothing is planned at once while a hand-over is under way: the pump plans it next, so what
  arrives meanwhile goes together.  The pump looks at least every PUMP_IDLE_S, and waits for
  its own hand-over before it looks again.
- Planning that fails (a full disk, a bug) is tried again after PLAN_RETRY_S, not in a hot loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from c2dtn.overlay.core import BundleResult, OverlayCore
from c2dtn.overlay.envelope import Priority
from c2dtn.overlay.scheduler import Outgoing
from c2dtn.overlay.store import StoreFull
from c2dtn.spells import Spell

log = logging.getLogger("c2dtn.node")

SUBMIT_GATHER_S = 0.002  # priority and routine submits this close are planned together
STREAM_GATHER_S = 0.020  # ... and while they keep coming, at most this often
ANSWER_CLEAR_S = 0.005  # the acks that came with an answered ping wait this long after the answer
PUMP_IDLE_S = 1.0  # the pump plans at least this often (maintenance: held envelopes, expiry)
PLAN_RETRY_S = 1.0  # a plan that failed is tried again after this long


@dataclass(eq=False)
class HandOver:
    bundles: list[Outgoing]
    unsynced: bool = False  # planned to go before the fsync of what they come from (custody module doc)
    by_pump: bool = False  # the pump waits for it before it looks again
    results: list[BundleResult] | None = None  # an answer's: the acks of what it answered wait for it


@dataclass(eq=False)
class AppsReady:
    pass


Event = HandOver | AppsReady


@dataclass
class _Later:
    at: float
    results: list[BundleResult] = field(default_factory=list)


class NodeMachine:
    def __init__(self, core: OverlayCore, now: float, wall_ms: Callable[[float], int] | None = None):
        self.core = core
        self._ms = wall_ms or (lambda t: int(t * 1000))
        self._given = 0  # hand-overs given out, and of those, finished (they finish in order)
        self._finished = 0
        self._pump_busy = False  # the pump waits for a hand-over (its own, or those before an empty plan)
        self._pump_after = 0  # ... until this many have finished
        self._pump_until = now + PUMP_IDLE_S  # the pump plans when this passes, though nothing woke it
        self._pump_sleep: float | None = None  # planning failed: the pump looks again then
        self._signal = False  # the pump should look again (plan if _poll_now, else re-read the core's wake-up)
        self._poll_now = False
        self._soon: float | None = None  # when gathered submits are planned
        self._gathered_at = float("-inf")  # when the last gathered submits were planned
        self._later: list[_Later] = []  # acks taken with data, applied at `at` (_after_take)
        self._plan_full = Spell(log)  # planning failed on a full disk
        self._take_full = Spell(log)  # bundles not taken on a full disk
        self._pump_rest(now)

    @property
    def handing(self) -> bool:
        """A hand-over is under way (nothing is planned at once meanwhile)."""
        return self._finished < self._given

    # -- inputs ---------------------------------------------------------------------------
    def submit(
        self, dst: str, body: bytes, lifetime_ms: int, priority: Priority, supersede: str | None, app: str, now: float
    ) -> tuple[int, list[Event]]:
        """An application's envelope into custody (raises what the core raises, having kept
        nothing).  Flash and immediate ones are planned for their destination in the same commit
        (unless a hand-over is under way), to go before its fsync when custody allows."""
        urgent = priority <= Priority.IMMEDIATE and not self.handing
        out, unsynced = None, False
        store = self.core.store
        with store.transaction():
            seq = self.core.submit(dst, body, self._ms(now), lifetime_ms, priority, supersede, app)
            if urgent:
                unsynced = store.may_send_unsynced()
                out = self._plan(now, unsynced, only={dst})
        if urgent:
            return seq, self._hand(out, unsynced)
        return seq, self.submitted(priority, now)

    def submitted(self, priority: Priority, now: float) -> list[Event]:
        """Envelopes of this priority (the most urgent of a batch) went into custody: flash and
        immediate are planned at once; others a moment later, with whatever else comes."""
        if priority <= Priority.IMMEDIATE:
            return self._plan_at_once(now)
        if self._soon is None:
            # the first gather after a quiet spell is short, later ones in a stream are spaced
            self._soon = now + max(SUBMIT_GATHER_S, self._gathered_at + STREAM_GATHER_S - now)
        return []

    def bundles(self, payloads: list[bytes], now: float) -> list[Event]:
        """Payloads the agent delivered, taken in one commit.  Never raises for what a peer sent."""
        try:
            # answers (pongs) planned in the take's own commit, unless a hand-over is under way
            results = self.core.on_bundles(payloads, self._ms(now), acks_later=True, answer_now=not self.handing)
        except StoreFull as e:  # not acked: their origins send them again once space frees
            self._take_full.hit("bundles not taken: %s", e)
            self._later.append(_Later(now))  # (their acks free space)
            return []
        except Exception:  # a bug must not take the node down, nor the rest of the batch with it
            log.exception("processing %d bundles together failed; taking them one by one", len(payloads))
            results = []
            for p in payloads:
                try:
                    results.append(self.core.on_bundle(p, self._ms(now)))
                except Exception:
                    log.exception("processing a bundle of %d bytes failed", len(p))
        self._take_full.over("custody takes bundles again")
        events: list[Event] = [AppsReady()] if any(res.data for res in results) else []
        # the acks that came with data, and planning for what else arrived, after the
        # applications' turn, and after the answers are with the agent (decision 0006)
        answers: list[Event] = []
        if self.core.answered:  # answers go now, before the fsync of what they answer
            self.core.answered = False
            if self.core.answers is None:  # (a hand-over is under way: the pump plans them next)
                self._wake()
            else:
                out, unsynced = self.core.answers
                self.core.answers = None
                answers = self._hand(out, unsynced, results=results)
        if not answers:
            self._later.append(_Later(now, results))
        return events + answers

    def consumed(self, ids: list[int], now: float) -> list[Event]:
        """Their acks go after the ack delay with whatever goes that way, or at once past
        ACK_BATCH; not a plan at once for each (decision 0006)."""
        if self.core.consumed(ids, self._ms(now)):
            self._wake()
        else:
            self._signal = True  # the pump re-reads the core's wake-up
        return []

    def handed_over(self, h: HandOver, now: float) -> list[Event]:
        """The shell is done with `h` (sent, or given up); hand-overs finish in the order given."""
        self._finished += 1
        if h.results is not None:
            self._later.append(_Later(now + ANSWER_CLEAR_S, h.results))
        if self._pump_busy and self._finished >= self._pump_after:
            self._pump_busy = False
            self._pump_rest(now)
        return self.tick(now)

    def tick(self, now: float) -> list[Event]:
        """Whatever is due at `now`."""
        events: list[Event] = []
        if self._soon is not None and now >= self._soon:
            self._soon = None
            self._gathered_at = now
            self._wake()
        due = [x for x in self._later if x.at <= now]
        if due:
            self._later = [x for x in self._later if x.at > now]
            for x in due:
                events += self._after_take(x.results, now)
        if self._pump_sleep is not None and now >= self._pump_sleep:
            self._pump_sleep = None
            self._wake()
        return events + self._pump(now)

    def next_deadline(self) -> float | None:
        """When tick() next has something to do (None: only an input can change anything)."""
        times = [x.at for x in self._later]
        if self._soon is not None:
            times.append(self._soon)
        if self._pump_sleep is not None:
            times.append(self._pump_sleep)
        elif not self._pump_busy:
            times.append(float("-inf") if self._signal else self._pump_until)
        return min(times) if times else None

    def wake(self) -> None:
        """Plan again at the pump's next look (the agent restarted, its endpoints registered again)."""
        self._wake()

    # -- the rules ---------------------------------------------------------------------------
    def _wake(self) -> None:
        """Plan again at the pump's next look."""
        self._poll_now = True
        self._signal = True

    def _after_take(self, results: list[BundleResult], now: float) -> list[Event]:
        try:
            self.core.apply_acks(self._ms(now))
        except Exception:  # (StoreFull too: acks only release; the peer repeats them)
            log.exception("processing acks failed")
        if self.core.poll_due:  # acks came in, or acks are owed at once
            self.core.poll_due = False
            return self._plan_at_once(now)
        if any(res.data or res.acks for res in results):
            # acks owed after the ack delay, or acks came in with nothing queued to send (a fast
            # retransmission shows as a wake-up due now): the pump re-reads the core's wake-up
            self._signal = True
        return []

    def _plan_at_once(self, now: float) -> list[Event]:
        """Plan now (an urgent submit, acks that move a window), rather than at the pump's next
        look; while a hand-over is under way the pump is woken instead, so that what arrives
        meanwhile still goes together in its next plan."""
        if self.handing:
            self._wake()
            return []
        self._poll_now = False
        return self._hand(self._plan(now), False)

    def _pump(self, now: float) -> list[Event]:
        if self._pump_busy or self._pump_sleep is not None:
            return []
        timed_out = now >= self._pump_until
        if not (self._signal or timed_out):
            return []
        self._signal = False
        if not (self._poll_now or timed_out):
            # only the timer moved (data arrived, its ack is not due yet): no planning now, which
            # would hold up the application's GET /recv of that very data
            wake = self.core.next_wakeup_ms()
            if wake is None or wake > self._ms(now):
                self._pump_rest(now, wake)
                return []
        self._poll_now = False
        out = self._plan(now)
        if out is None:  # failed: try again in a while, not in a hot loop
            self._pump_sleep = now + PLAN_RETRY_S
            return []
        if not out:
            if self.handing:  # (as after its own: the pump looks again once those under way are done)
                self._pump_busy, self._pump_after = True, self._given
            else:
                self._pump_rest(now)
            return []
        self._pump_busy, self._pump_after = True, self._given + 1
        return self._hand(out, False, by_pump=True)

    def _pump_rest(self, now: float, wake: int | None = -1) -> None:
        """The pump waits until the core's next wake-up, at most PUMP_IDLE_S."""
        if wake == -1:
            wake = self.core.next_wakeup_ms()
        wait = PUMP_IDLE_S if wake is None else max(0.0, min(PUMP_IDLE_S, (wake - self._ms(now)) / 1000))
        self._pump_until = now + wait

    def _plan(self, now: float, unsynced: bool = False, only: set[str] | None = None) -> list[Outgoing] | None:
        try:
            out = self.core.poll(self._ms(now), unsynced, only)
        except StoreFull as e:
            self._plan_full.hit("planning stopped: %s; retrying every second", e)
            return None
        except Exception:
            log.exception("planning failed")
            return None
        self._plan_full.over("custody store writable again: planning resumed")
        return out

    def _hand(
        self,
        out: list[Outgoing] | None,
        unsynced: bool,
        by_pump: bool = False,
        results: list[BundleResult] | None = None,
    ) -> list[Event]:
        if not out:
            return []
        self._given += 1
        return [HandOver(out, unsynced, by_pump, results)]
