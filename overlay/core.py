"""The overlay node's protocol core (I/O-free): custody store + codec + scheduler.

The asyncio shell (overlay.node) feeds it bundle payloads from the BPA and the
clock, and hands the BPA what poll() returns.  Tests drive it with virtual time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from c2dtn.overlay.custody import Custody
from c2dtn.overlay.envelope import (
    APP_MAX_BYTES,
    SN_MOD,
    Codec,
    Envelope,
    EnvelopeError,
    Kind,
    Priority,
    decode_ack_body,
    heard_of,
    source_node,
)
from c2dtn.overlay.scheduler import Outgoing, Scheduler, SchedulerConfig
from c2dtn.overlay.store import Delivery, QuotaExceeded

log = logging.getLogger("c2dtn.overlay")

# Acks wait SchedulerConfig.ack_delay_ms for data going the same way to ride on (or
# for more acks to gather) before they travel in a bundle of their own; many pending
# go at once.
ACK_BATCH = 256
ACK_BYTES = 16 * 1024  # ... and at once after this much data from one origin (as TCP acks every other segment),
# or after half the initial window if that is less: a sender whose whole first window is smaller
# than ACK_BYTES would otherwise wait out ack_delay_ms for every window of its slow start

# An ack bundle lost on the way would make its origin resend what did arrive (a later
# ack shows a gap) and, for a group, keep it in custody until a duplicate draws a new
# ack.  So each ack also repeats the ids of the last ACK_REPEATS acks to the same
# origin sent within ACK_REPEAT_MS (as TCP SACK repeats its blocks); id runs keep this small.
ACK_REPEATS = 2
ACK_REPEAT_MS = 10_000

# Envelopes held behind a gap in their class's order are released after this
# long, so one lost envelope whose sender gave up cannot stall a class forever.
DEFAULT_MAX_HOLD_MS = 300_000

# send numbers followed, one per (source, destination): past this many (a peer cycling its
# incarnation), that node's other streams are forgotten first, else the oldest one
SN_STREAMS_MAX = 4096
# an ack-only bundle's announced send number older than this by the receiver's clock is not taken
# (OverlayCore._announced): it helps only for a round trip, and a replay after a restart is older
ANNOUNCED_MAX_AGE_MS = 60_000

REJECT_LINE_MAX = 300  # characters of a rejection kept and logged (messages name peer values by prefix)

# Envelopes of app "ping" are answered by the node itself with "pong" (`c2dtn ping`).  A peer's
# pings cannot fill custody: an answer lives at most PONG_LIFETIME_MAX_MS, and no more than
# PONGS_HELD_MAX answers to one peer are held at once (further pings go unanswered, counted).
PING_APP = "ping"
PONG_APP = "pong"
PONG_LIFETIME_MAX_MS = 600_000
PONGS_HELD_MAX = 64


@dataclass
class BundleResult:
    data: int = 0  # data envelopes that passed their checks: new, duplicates, stale or expired
    acks: int = 0
    duplicates: int = 0
    taken: int = 0  # of data, those taken as new (delivered or held for order)
    rejected: list[str] = field(default_factory=list)  # one line per rejected envelope or bundle
    logged: int = 0  # of `rejected`, those already in the log (_log_rejected)


class OverlayCore:
    def __init__(
        self,
        store: Custody,
        codec: Codec,
        cfg: SchedulerConfig = SchedulerConfig(),
        max_hold_ms: int = DEFAULT_MAX_HOLD_MS,
        answer_pings: bool = True,
    ):
        self.store = store
        self.codec = codec
        self.sched = Scheduler(store, codec, cfg)
        self.max_hold_ms = max_hold_ms
        self.answer_pings = answer_pings
        self._next_hold_check = 0
        self._ack_since: dict[str, int] = {}  # source (origin, incarnation) -> when its oldest unsent ack was queued
        self._ack_bytes: dict[str, int] = {}  # source -> data bytes received since its last ack
        self._ack_count: dict[str, int] = {}  # source -> data envelopes received since its last ack
        # set when what arrived calls for planning now (acks came in, or acks are owed past
        # ACK_BATCH / ACK_BYTES); otherwise data that arrived only owes acks after ack_delay_ms,
        # which next_wakeup_ms() already says
        self.poll_due = False
        self.answered = False  # answers (pongs) were queued: plan now (they may go before the fsync, node.py)
        self._acks_later: list[tuple[BundleResult, str, list[Envelope]]] = []  # see on_bundles
        self.answers: tuple[list[Outgoing], bool] | None = None  # see on_bundles
        self._ack_bytes_due = min(ACK_BYTES, cfg.init_window // 2)
        self._acks_recent: dict[str, list[tuple[int, list[int], list[int]]]] = {}  # source -> (sent, done, got)
        self._pongs: dict[str, list[int]] = {}  # peer -> seqs of answers to its pings, maybe still held
        self._newest_at: dict[str, int] = {}  # source -> when its newest envelope arrived (acks say how long ago)
        # sources an envelope arrived from out of its turn (one before it missing), or that filled
        # such a gap: their acks go at once, as TCP's and QUIC's do, so the origin finds a loss,
        # or that there was none, an ack delay sooner
        self._gap: set[str] = set()
        # (source, destination) -> (the send number expected next, the last that came): one that
        # skips ahead shows envelopes lost on the way whatever their class (a report has no order
        # to hold it in), one behind it came late; either way the acks go at once (decision 0016)
        self._sn_next: dict[tuple[str, str], tuple[int, int]] = {}
        # (node, destination) -> the source key its data there came under last: an ack-only
        # bundle names no incarnation, and its announced send number is that stream's
        self._sn_src: dict[tuple[str, str], str] = {}
        # source -> an announcement of a send number past one that has not come (envelope.heard_of):
        # its acks go at once and say it (decision 0041); and (when the last announcement taken was made, the last number
        # answered): a replayed or late one is older, and a number draws one answer
        self._heard: dict[str, int] = {}
        self._announced_at: dict[str, tuple[int, int | None]] = {}

    @property
    def node(self) -> str:
        return self.codec.node

    def submit(
        self,
        dst: str,
        body: bytes,
        now_ms: int,
        lifetime_ms: int = 3600_000,
        priority: Priority = Priority.ROUTINE,
        supersede: str | None = None,
        app: str = "",
    ) -> int:
        if dst == self.node:
            raise ValueError(f"destination {dst!r} is this node itself")
        if dst not in self.codec.keys:
            raise ValueError(
                f"no key shared with destination node {dst!r} (known peers and groups: "
                f"{', '.join(sorted(self.codec.keys)) or 'none'})"
            )
        if len(app.encode()) > APP_MAX_BYTES:
            raise ValueError(f"app name {app[:40]!r}... is over {APP_MAX_BYTES} bytes")
        return self.store.submit(dst, body, now_ms, lifetime_ms, priority, supersede, app)

    def on_bundle(self, payload: bytes, now_ms: int) -> BundleResult:
        """Take one bundle payload from the BPA.  Never raises for what a peer sent:
        bad bundles and envelopes are counted, logged once each, and dropped; the
        good envelopes of the same bundle are still taken."""
        return self.on_bundles([payload], now_ms)[0]

    def on_bundles(
        self, payloads: list[bytes], now_ms: int, acks_later: bool = False, answer_now: bool = False
    ) -> list[BundleResult]:
        """Take several bundle payloads in one commit (group commit: one fsync for all
        that arrived together), durable if any brought data, relaxed if only acks.
        acks_later: when data came too, the acks that came with it are kept for apply_acks(),
        a commit of their own, made once what the data calls for (a delivery, an answer) is
        under way: the releases they cause are not on the round trip's path (decision 0006).
        answer_now: answers (pongs) are planned in the same commit (poll(only=...)), and left in
        `answers` as (bundles, unsynced) for the caller to hand over once it returns."""
        opened = [self._open(p) for p in payloads]
        self.answers = None
        data = any(e.kind != Kind.ACK for _, _, envs in opened for e in envs)
        if acks_later and data:
            for i, (res, sender, envs) in enumerate(opened):
                acks = [e for e in envs if e.kind == Kind.ACK]
                if acks:
                    self._acks_later.append((res, sender, acks))
                    opened[i] = (res, sender, [e for e in envs if e.kind != Kind.ACK])
        with self.store.transaction(durable=data):
            pings = False
            self.store.count_event("bundles_received", len(payloads))
            for res, sender, envs in opened:
                self._apply(res, sender, envs, now_ms)
                pings = pings or any(e.app == PING_APP and e.kind != Kind.ACK for e in envs)
            if self.answer_pings and pings:
                pongs = self._pong(now_ms)
                dsts = {source_node(src) for src, _ in pongs}
                if answer_now and dsts:
                    self.answers = self._plan_answers(opened, pongs, dsts, now_ms)
        self.poll_due = self.poll_due or self._plan_now(opened)
        self.answered = self.answered or (pings and self.answer_pings)
        self._log_rejected(res for res, _, _ in opened)
        return [res for res, _, _ in opened]

    def _plan_answers(
        self, opened: list, pongs: dict[tuple[str, int], int], dsts: set[str], now_ms: int
    ) -> tuple[list[Outgoing], bool]:
        """The answers' bundles, and whether they may go before the fsync: yes, carrying the
        acks of the very pings they answer (custody module doc: the answer proves them), unless
        other acks are owed at once for what came (a megabyte's: sent before the fsync, the
        answer would leave them for a bundle of their own), or an answer did not fit beside its
        ping's ack (then the ack would go alone, unsynced)."""
        unsynced = self.store.may_send_unsynced()
        if unsynced:
            held = self.store.unsynced_acks() - pongs.keys()
            unsynced = not self._acks_owed_now(opened, {src for src, _ in held})
        out = self.poll(now_ms, unsynced, only=dsts, answered=set(pongs) if unsynced else set())
        if unsynced:
            for b in out:
                acks = b.acks if isinstance(b.acks, dict) else {b.dst: b.acks}
                for src, (done, got) in acks.items():
                    if any(pongs.get((src, q), -1) not in b.seqs for q in (*done, *got) if (src, q) in pongs):
                        unsynced = False  # (the node hands them over after the fsync instead)
        return out, unsynced

    def apply_acks(self, now_ms: int) -> None:
        """Take the acks on_bundles(acks_later=True) kept, in one relaxed commit."""
        later, self._acks_later = self._acks_later, []
        if not later:
            return
        with self.store.transaction(durable=False):
            for res, sender, envs in later:
                self._apply(res, sender, envs, now_ms)
        self._log_rejected(res for res, _, _ in later)
        self.poll_due = self.poll_due or self._plan_now(later)

    def _plan_now(self, opened: list) -> bool:
        """Does what just arrived call for planning at once (besides answers: `answered`)?  Acks
        came from a peer something is queued or still under way for (its window moved, a tail
        probe is to be timed again); or acks are owed past ACK_BATCH / ACK_BYTES (or half
        the initial window), or an announced send number showed a loss (_announced).  Else
        the acks owed wait for ack_delay_ms (next_wakeup_ms)."""
        if self._heard or self._acks_owed_now(opened):
            return True
        acked_by = {s for res, s, _ in opened if res.acks}
        dsts = acked_by | {g for g, members in self.codec.groups.items() if acked_by & set(members)}
        return self.store.has_pending(dsts)

    def _acks_owed_now(self, opened: list, only: set[str] | None = None) -> bool:
        """only: of these sources alone (those with acks still held back)."""
        srcs = {e.source for _, _, envs in opened for e in envs if e.kind != Kind.ACK}
        return any(
            self._ack_bytes.get(src, 0) >= self._ack_bytes_due
            or self._ack_count.get(src, 0) >= ACK_BATCH
            or src in self._gap
            for src in (srcs if only is None else srcs & only)
        )

    def _open(self, payload: bytes) -> tuple[BundleResult, str, list[Envelope]]:
        """Check and open one bundle: (result so far, sender, the envelopes that passed)."""
        res = BundleResult()
        try:
            c = self.codec.open_container(payload)
        except EnvelopeError as e:
            self._reject(res, f"bundle of {len(payload)} bytes rejected ({e.reason}): {e}", e.reason)
            return res, "", []
        sender = c.sender
        if sender == self.node:
            return res, sender, []  # our own group bundle, handed back by the BPA (we are a member too)
        try:
            maps = self.codec.open_items(c)  # (open_container refused a bundle not for us)
        except EnvelopeError as e:
            self._reject(res, f"bundle of {len(payload)} bytes from {sender!r} rejected ({e.reason}): {e}", e.reason)
            return res, sender, []
        envs = []
        for i, m in enumerate(maps):
            try:
                envs.append(self.codec.open(c, m))
            except EnvelopeError as e:
                self._reject(res, f"envelope {i} of a bundle from {sender!r} rejected ({e.reason}): {e}", e.reason)
        return res, sender, envs

    def _pong(self, now_ms: int) -> dict[tuple[str, int], int]:
        """Answer pings in the commit that took them (an echo endpoint inside the node); returns
        the pings answered, (source, seq), and each one's answer's seq."""
        pings = self.store.inbox(1000, app=PING_APP)
        pong_of = {}  # (node, seq) of a ping -> its answer's seq
        unanswered: list[str] = []
        for d in pings:
            owed = self._pongs.setdefault(d.origin, [])
            if len(owed) >= PONGS_HELD_MAX:  # still held for it: those released are forgotten first
                owed[:] = list(self.store.held(owed))
            if len(owed) >= PONGS_HELD_MAX:
                self.store.count_event("pings_unanswered")
                unanswered.append(f"{d.origin}:{d.seq}: {len(owed)} answers to it still held")
                continue
            try:
                pong_of[(d.origin, d.seq)] = seq = self.submit(
                    d.origin, d.body, now_ms, min(d.lifetime_ms, PONG_LIFETIME_MAX_MS), Priority.FLASH, app=PONG_APP
                )
                owed.append(seq)
            except (ValueError, QuotaExceeded) as e:
                self.store.count_event("pings_unanswered")
                unanswered.append(f"{d.origin}:{d.seq}: {e}")
        if unanswered:  # one line for the pass, however many (a peer's flood must not flood the log)
            log.warning("%d pings not answered; the first, %s", len(unanswered), unanswered[0][:REJECT_LINE_MAX])
        gone = self.store.consumed([d.id for d in pings])  # (source, seq): the inbox keeps the source
        return {(src, seq): pong_of[(source_node(src), seq)] for src, seq in gone if (source_node(src), seq) in pong_of}

    def _apply(self, res: BundleResult, sender: str, envs: list, now_ms: int) -> None:
        done: list[tuple[int, int]] = []
        got: list[tuple[int, int]] = []
        holds: list[int] = []
        heard: list[tuple[str, str | None, int]] = []  # (stream's destination, member, number)
        announced: list[Envelope] = []  # ack envelopes that announce a send number (_announced)
        for env in envs:
            try:
                if env.kind == Kind.ACK:
                    # one ack may answer every origin of a group: ours only, and only for this
                    # store's incarnation (an ack for a lost store's ids must not release ours)
                    ack = decode_ack_body(env.body, self.store.source)
                    if not ack.found and any(source_node(k) == self.node for k in ack.sources):
                        self.store.count_event("acks_other_incarnation")
                    done += ack.done
                    got += ack.got
                    if ack.hold_ms is not None:
                        holds.append(ack.hold_ms)
                    if ack.heard is not None:  # the stream is the one the ack went to: a group, or us
                        group = env.dst in self.codec.groups
                        heard.append((env.dst if group else sender, sender if group else None, ack.heard))
                    if env.sn is not None:
                        announced.append(env)
                    res.acks += 1
                else:
                    r = self.store.receive(env, now_ms)
                    src = env.source  # acks are owed per origin and incarnation
                    self._ack_bytes[src] = self._ack_bytes.get(src, 0) + len(env.body)
                    self._ack_count[src] = self._ack_count.get(src, 0) + 1
                    self._ack_since.setdefault(src, now_ms)  # an ack is owed from now
                    res.data += 1
                    res.duplicates += r.outcome == "duplicate"
                    res.taken += r.outcome in ("delivered", "held")
                    if r.outcome in ("delivered", "held"):
                        self._newest_at[src] = now_ms
                    new = r.outcome in ("delivered", "held", "stale")
                    fills = new and self._fills_answered(env)
                    skipped = self._out_of_turn(env, new)
                    if r.outcome == "held" or r.released > 1 or skipped or fills:  # a gap opened, or one closed
                        self._gap.add(src)
            except EnvelopeError as e:
                self._reject(
                    res,
                    f"{env.kind.name.lower()} envelope {env.origin}:{env.seq} from {sender!r} "
                    f"rejected ({e.reason}): {e}",
                    e.reason,
                )
        for env in announced:  # after the bundle's data: copies in it may fill the gap (decision 0042)
            self._announced(sender, env, now_ms)
        if done or got:  # the bundle's acks, merged: one look at what is held, however many acks it carries
            self.sched.on_ack(
                sender,
                self.store.held_in(done, sender),
                self.store.held_in(got, sender),
                now_ms,
                min(holds) if holds else None,  # several acks: the least held, so no sample comes out short
            )
        for dst, member, sn in heard:  # (after the acks: what they name has arrived)
            self.sched.on_heard(dst, member, sn, now_ms)

    def _announced(self, sender: str, ack: Envelope, now_ms: int) -> None:
        """An ack-only bundle from `sender` says its next data envelope to ack.dst takes send
        number ack.sn.  One on from what came here shows data envelopes lost on the way, though
        no later one came (the tail of a burst, a lull): the acks go at once and say so, and
        the sender resends them a round trip after the loss, not after its next data and that
        one's ack (decision 0041).  Only an announcement made after the last one taken (a
        replayed bundle draws nothing) and within ANNOUNCED_MAX_AGE_MS of now by this node's
        clock (after a restart forgot the last one taken, a replay of an older one draws
        nothing either), one answer per number until new data comes, and only where the acks
        go back to that stream's destination (the group, or the sender itself): an ack cannot
        say which stream it means."""
        dst, sn = ack.dst, ack.sn
        src = self._sn_src.get((sender, dst))
        state = self._sn_next.get((src, dst)) if src is not None else None
        if src is None or state is None or sn is None:
            return
        made, answered = self._announced_at.get(src, (-1, None))
        if ack.created_ms <= made:
            return
        if now_ms - ack.created_ms > ANNOUNCED_MAX_AGE_MS:
            self.store.count_event("announcements_too_old")  # (a clock a minute off turns them off)
            return
        self._announced_at.pop(src, None)  # (re-inserted: the source longest quiet goes first)
        if len(self._announced_at) >= SN_STREAMS_MAX:  # a node's own other incarnations go first
            mine = [k for k in self._announced_at if source_node(k) == sender]
            del self._announced_at[mine[0] if mine else next(iter(self._announced_at))]
        self._announced_at[src] = (ack.created_ms, answered)
        ahead = (sn - state[0]) % SN_MOD
        if answered == sn or not 0 < ahead < SN_MOD // 2:
            return
        if (self._ack_group(sender) or sender) != (dst if dst in self.codec.groups else sender):
            return
        self._announced_at[src] = (ack.created_ms, sn)
        self._heard[src] = heard_of(sn, ack.created_ms)
        self._gap.add(src)

    def _out_of_turn(self, env: Envelope, new: bool) -> bool:
        """Did this envelope's send number skip some (lost on the way), or come after a later one?
        new: the store took it as new; a copy seen before (a replay, a relay's repeat) only
        follows the numbers when it is exactly in turn, and never calls for an ack."""
        if env.sn is None:
            return False
        stream = (env.source, env.dst)
        got = self._sn_next.get(stream)
        if got is None:
            if not new:
                return False
            if len(self._sn_next) >= SN_STREAMS_MAX:  # a node's own other incarnations go first
                node = source_node(env.source)
                for k in [k for k in self._sn_next if source_node(k[0]) == node] or [next(iter(self._sn_next))]:
                    del self._sn_next[k]
            self._sn_next[stream] = ((env.sn + 1) % SN_MOD, env.sn)
            self._note_source(env)
            return False
        nxt, prev = got
        ahead = (env.sn - nxt) % SN_MOD
        if not new:
            if ahead == 0:
                self._sn_next[stream] = ((env.sn + 1) % SN_MOD, env.sn)
            return False
        # in turn, past a gap, or one after the last that came (a sender restarted counting
        # from 0, or a run that came late as a whole): expect the one after it
        self._note_source(env)
        if ahead < SN_MOD // 2 or env.sn == (prev + 1) % SN_MOD:
            self._sn_next[stream] = ((env.sn + 1) % SN_MOD, env.sn)
            return ahead != 0 and env.sn != (prev + 1) % SN_MOD
        self._sn_next[stream] = (nxt, env.sn)
        return True

    def _fills_answered(self, env: Envelope) -> bool:
        """Is env one this node said it lacked, answering an announcement (_announced)?  Its ack
        goes at once: it may only have come late (the agent put the announcement on the air
        first), and the sender waits for that ack before it resends it (Scheduler.on_heard)."""
        answered = self._announced_at.get(env.source, (0, None))[1]
        return answered is not None and env.sn is not None and 0 < (answered - env.sn) % SN_MOD < SN_MOD // 2

    def _note_source(self, env: Envelope) -> None:
        """env came new from its origin: its source key is the one an ack-only bundle from that
        node to env.dst speaks for (_announced)."""
        # a number announced again from now on is a new gap; and no announcement made before this
        # envelope was is taken any more (after a restart forgot the last one taken: a replay)
        made = self._announced_at.get(env.source, (-1, None))[0]
        if env.source in self._announced_at or made < env.created_ms:
            self._announced_at.pop(env.source, None)
            if len(self._announced_at) >= SN_STREAMS_MAX:
                mine = [k for k in self._announced_at if source_node(k) == source_node(env.source)]
                del self._announced_at[mine[0] if mine else next(iter(self._announced_at))]
            self._announced_at[env.source] = (max(made, env.created_ms), None)
        at = (source_node(env.source), env.dst)
        if self._sn_src.get(at) != env.source:
            self._sn_src.pop(at, None)  # (re-inserted: the stream longest quiet goes first)
            if len(self._sn_src) >= SN_STREAMS_MAX:
                del self._sn_src[next(iter(self._sn_src))]
            self._sn_src[at] = env.source

    def _reject(self, res: BundleResult, line: str, reason: str) -> None:
        res.rejected.append(line[:REJECT_LINE_MAX])
        self.store.count_event(f"rejected:{reason}")

    @staticmethod
    def _log_rejected(results: Iterable[BundleResult]) -> None:
        """One log line per bundle, however many of its items were refused (a 4 kB bundle of
        bad items must not write a line per item)."""
        for res in results:
            new = res.rejected[res.logged :]
            if not new:
                continue
            res.logged = len(res.rejected)
            if len(new) == 1:
                log.warning(new[0])
            else:
                log.warning("%d items of one bundle rejected; the first: %s", len(new), new[0])

    def poll(
        self,
        now_ms: int,
        unsynced: bool = False,
        only: set[str] | None = None,
        answered: frozenset[tuple[str, int]] | set[tuple[str, int]] = frozenset(),
    ) -> list[Outgoing]:
        """Bundles to hand to the BPA now (data within the windows, and pending acks).
        unsynced: they will go before the commits behind them are on disk (custody module doc:
        only when store.may_send_unsynced()), so acks owed since the last fsync stay owed, but
        those of `answered` (pings whose answers these bundles carry: _plan_answers).
        only: for these destinations only, no maintenance (Scheduler.plan)."""
        if only is None and self.max_hold_ms and now_ms >= self._next_hold_check:
            self.store.release_held(now_ms - self.max_hold_ms, now_ms)
            self._next_hold_check = now_ms + 1000
        acks = self.store.pending_acks()
        for origin in list(self._ack_since):
            if origin not in acks:
                del self._ack_since[origin]
        waiting: dict[str, int] = {}  # source -> since when, of acks held back for the fsync
        if unsynced:
            held = self.store.unsynced_acks() - answered
            if held:
                waiting = {o: self._ack_since.setdefault(o, now_ms) for o, _ in held if o in acks}
                acks = {
                    o: ([s for s in d if (o, s) not in held], [s for s in g if (o, s) not in held])
                    for o, (d, g) in acks.items()
                }
                acks = {o: dg for o, dg in acks.items() if dg[0] or dg[1]}
        for src in self._heard:  # said even when nothing new came (the recent acks repeat, below)
            acks.setdefault(src, ([], []))
        due = set()
        for origin, (done, got) in acks.items():
            since = self._ack_since.setdefault(origin, now_ms)
            if (
                now_ms - since >= self.sched.cfg.ack_delay_ms
                or len(done) + len(got) >= ACK_BATCH
                or self._ack_bytes.get(origin, 0) >= self._ack_bytes_due
                or origin in self._gap
            ):
                due.add(origin)
        fresh = {o: (list(d), list(g)) for o, (d, g) in acks.items()}
        for origin, (done, got) in acks.items():
            recent = [r for r in self._acks_recent.get(origin, []) if now_ms - r[0] <= ACK_REPEAT_MS]
            self._acks_recent[origin] = recent[len(recent) - ACK_REPEATS :] if ACK_REPEATS else []
            for _, d, g in self._acks_recent[origin]:
                done.extend(d)
                got.extend(g)
            done[:] = sorted(set(done))
            got[:] = sorted(set(got) - set(done))
        # acks go to their origin's node, keyed by source (origin and incarnation); those for
        # origins in a group we share go to the group: one ack envelope for all of them, riding
        # in the group's own data bundle (sealed with the group key)
        plan_acks: dict = {}
        plan_due: set[str] = set()
        for src, ack in acks.items():
            node = source_node(src)
            to = self._ack_group(node) or node
            plan_acks.setdefault(to, {})[src] = ack
            if src in due:
                plan_due.add(to)
        with self.store.transaction(durable=False):
            holds = {o: now_ms - t for o, t in self._newest_at.items() if o in acks}
            out = self.sched.plan(now_ms, plan_acks, plan_due, only, holds, self._heard)
            self.store.count_event("plans")
            if out:
                self.store.count_event("bundles_sent", len(out))
            for b in out:
                for origin, (done, got) in b.acks.items() if isinstance(b.acks, dict) else [(b.dst, b.acks)]:
                    # origin: the source key (node and incarnation) the acks were owed to
                    if self._heard.pop(origin, None) is not None:
                        self._gap.discard(origin)
                    if not (done or got):
                        continue
                    self.store.acks_sent(origin, done, got)
                    self._ack_since.pop(origin, None)
                    self._newest_at.pop(origin, None)
                    self._gap.discard(origin)
                    self._ack_bytes.pop(origin, None)
                    self._ack_count.pop(origin, None)
                    if origin in fresh:
                        self._acks_recent.setdefault(origin, []).append((now_ms, *fresh.pop(origin)))
        for origin, since in waiting.items():  # still owed: they go after ack_delay_ms, or with the next bundle
            self._ack_since.setdefault(origin, since)
        return out

    def _ack_group(self, origin: str) -> str | None:
        return next((g for g, members in self.codec.groups.items() if origin in members), None)

    def take(
        self, limit: int = 1000, app: str | None = None, exclude: Iterable[str] = (), after: int = 0
    ) -> list[Delivery]:
        return self.store.inbox(limit, app, exclude, after)

    def consumed(self, ids: list[int], now_ms: int | None = None) -> bool:
        """The application took these: "done" acks are owed.  With now_ms their ack delay starts
        (next_wakeup_ms), and the answer says whether they are owed at once (ACK_BATCH)."""
        gone = self.store.consumed(ids)
        if now_ms is None:
            return True
        for src in {src for src, _ in gone}:
            self._ack_since.setdefault(src, now_ms)
        return len(gone) >= ACK_BATCH

    def next_wakeup_ms(self) -> int | None:
        times = [
            t
            for t in [self.sched.next_wakeup_ms()] + [s + self.sched.cfg.ack_delay_ms for s in self._ack_since.values()]
            if t is not None
        ]
        return min(times) if times else None
