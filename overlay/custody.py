"""End-to-end custody: the rules, over a Store that keeps the records (store/__init__.py).

What it keeps, per node:
- outbox: every envelope this node accepted, until the destination node acks it
  or its lifetime ends (then it is reported expired, never dropped silently);
- seen: ids of envelopes received, so a retransmission is never delivered twice;
- inbox: envelopes received and in order, waiting for the application to take
  them; held: envelopes that arrived ahead of a gap in their class's order;
- done: ids the application has taken and the origin must hear about (the origin
  releases custody); got: ids received and kept here but not yet taken (the origin
  stops retransmitting them, and learns from what arrived after a missing one that
  it was lost);
- reports: envelopes that ended without an ack (expired, superseded, dropped);
- member_acks: for an envelope sent to a group, which members said "got" or
  "done"; it counts as received when all have it and is released when all took it.

Order on the receiving side is kept per stream: an origin's envelopes for this
node are one stream, its envelopes for each group another ("origin>group"), as
the origin numbers them (cseq) per destination.

Every store has an incarnation, a random number chosen when it is created and sent
in every envelope.  The receiving side keys ids, order, supersession and acks by the
origin's source key, its node and incarnation (envelope.source_key): a node whose
store was lost (or replaced) starts its seqs at 1 again under a new incarnation, and
what it sends is new, never taken for a duplicate of the old store's ids, never held
behind the old store's order, and never released by an ack for the old store's ids.
A store made before incarnations existed gets one when first opened; what it had sent
and not yet had acked may then be delivered a second time (never lost).  A store put
back from a copy keeps the copy's incarnation: give it a new one (`c2dtn node
renew-incarnation CONFIG`) before the node starts, or the receivers take its
reused seqs for duplicates.

No method reads the clock: every call that depends on time takes `now_ms`, so
tests run hours of custody in milliseconds.  Each public method is one
transaction (callers may group several in `transaction()`).  What takes custody or
records what arrived (submit, receive, consumed) is durable when it returns;
bookkeeping that can only cause a harmless repeat if a power cut undoes it (marking
sent, releasing acked envelopes, acks sent, retransmission times, expiry reports) is
not fsynced on its own (see store/sqlite.py).

Sending before the fsync.  A bundle may go to the agent before the commits it comes from
are on disk (a flash message's round trip then does not wait on the disk twice, decision 0006),
as long as a power cut in that moment can cost nothing but a repeat:
- seqs: a power cut would undo the submit and hand its seq out again, and the receiver,
  having seen it, would take the new message for a duplicate and lose it.  So seqs are
  reserved on disk ahead of use, SEQ_BLOCK at a time (counter `seq_reserved`, in the commit
  of the submit that crosses it), and a store opened after a run that did not close()
  numbers on from its reservation; only seqs within a reservation known to be on disk may
  go early.  (A class's order numbers, cseqs, may be handed out twice: the receiver takes a
  place it has passed as late, at once, and nothing is lost.)
- acks: an ack for an envelope whose taking is not on disk would release (or stop the
  resending of) what a power cut then loses here.  Acks owed since the last fsync are held
  back (unsynced_acks) and go with the next bundle, after it.  But for a ping answered in
  the commit that took it: its ack may ride the bundle carrying its answer (the core's
  _plan_answers checks they are in one), since that answer is all the pinger waits for --
  a power cut undoing the taking then costs the pinger nothing (and if the bundle is lost,
  the ping comes again and is answered again).
- marks (a resent MQTT PUBLISH told from a new one): a mark lost with its submit would take
  the client's repeat for a new message, twice delivered; a transaction that recorded one
  keeps everything waiting for its fsync.
The caller says when the disk caught up: sync_point() before it waits for an fsync, then
synced(token) once that fsync covered every commit made before it; may_send_unsynced()
and unsynced_acks() answer from that.  A store that fsyncs every durable commit itself
(sync="loop") is caught up at once.

`Custody(store, origin)` runs over any Store (`MemoryStore()` in unit tests);
`CustodyStore(path, origin)` is custody over the SQLite store, what a node runs.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from c2dtn.overlay.envelope import (
    INC_BITS,
    MAX_MESSAGE_BYTES,
    Envelope,
    Priority,
    in_runs,
    runs_total,
    source_key,
    source_node,
)
from c2dtn.overlay.outbox import Outbox
from c2dtn.overlay.store import Delivery, OutItem, Quota, QuotaExceeded, Received, Store, TooLarge, open_store
from c2dtn.overlay.tally import Histogram

# A submitted message's mark (key, digest, repeat: see Custody.submit_many), or a list of them for an
# envelope holding several messages, or None
# (key, digest, repeat): repeat is False (a first sending), True (a resend: skipped while the mark
# stands) or a window in ms (skipped only within that long of the mark: CoAP's EXCHANGE_LIFETIME)
Mark = tuple[str, bytes, bool | int] | list[tuple[str, bytes, bool | int]] | None

__all__ = ["Custody", "CustodyStore", "Delivery", "OutItem", "Quota", "QuotaExceeded", "Received"]

# Seen ids are kept this long past the envelope's own expiry, so a copy that a
# BPA delivers late is still recognised.
SEEN_MARGIN_MS = 10 * 60 * 1000
SEEN_PRUNE_MS = 60 * 1000  # seen ids past their time go in batches, at most once a minute
MARK_KEEP_MS = 7 * 24 * 3600 * 1000  # how long a mark (see submit_many) is remembered
ACK_EXPAND_MAX = 4096  # an ack's runs naming up to this many ids are looked up id by id (held_in)
SEQ_BLOCK = 4096  # seqs reserved on disk at a time (module doc: sending before the fsync)
PRUNE_BATCH = 20_000  # seen ids and marks forgotten per expire() at most (the next call goes on)
HELD = -1  # a seen id's place while its envelope is held (else its inbox id, or 0: not kept)
RELEASE_BATCH = 20_000  # envelopes held past their wait released per release_held() at most
REPORTS_KEPT = 10_000  # the newest reports kept (the counters keep the totals)
PLACE_SLACK_BYTES = 64  # a superseding report keeps its place if no larger than the first by this (0014)


class Custody:
    def __init__(
        self, store: Store, origin: str, quota: Quota = Quota(), groups: dict[str, tuple[str, ...]] | None = None
    ):
        # since this process started, for status and metrics (overlay/tally.py): (event, peer,
        # class) -> envelopes, and how long received envelopes took from their creation; what a
        # transaction counts is added when it commits
        self.tally: Counter[tuple[str, str, int]] = Counter()
        self.delays = Histogram()
        self._tally_tx: list[tuple[str, str, int]] = []
        self._delays_tx: list[float] = []
        self.records = store
        items, members = store.out_load()
        self.outbox = Outbox(items, members)  # the outbox's questions, answered in memory (outbox.py)
        self._depth = 0  # transactions open (nested ones join the outer)
        # reports are a log of the newest outcomes, bounded: a gateway superseding positions
        # for weeks would otherwise grow its store without end
        self.reports_kept = REPORTS_KEPT
        self.origin = origin
        self.quota = quota
        self.groups = dict(groups or {})  # group -> the other members
        self.inc = store.counter("incarnation") or self.renew_incarnation()
        # sending before the fsync (module doc): what is on disk, as far as the caller said
        reserved, nxt = store.counter("seq_reserved"), store.counter("next_seq")
        if reserved > nxt:  # the last run did not close(): seqs up to its reservation may be out
            with store.transaction():
                store.bump("next_seq", reserved - nxt)
        self._reserved_on_disk = reserved
        self._tag = 1  # what is recorded now is on disk once synced(token >= this) is called
        self._points: list[tuple[int, int]] = []  # (token, seq_reserved then), oldest first
        self._synced_tag = 0
        self._fresh_acks: dict[tuple[str, int], int] = {}  # (source, seq) owed -> tag
        self._marks_tag = 0  # tag of the last transaction that recorded marks

    def renew_incarnation(self) -> int:
        """Choose a new random incarnation (a new store, or one put back from a copy): from now
        on every envelope, those still held included, goes out under it."""
        with self.transaction():
            old = self.records.counter("incarnation")
            new = old
            while new in (0, old):
                new = secrets.randbits(INC_BITS)
            self.records.bump("incarnation", new - old)
        self.inc = new
        return new

    @property
    def source(self) -> str:
        """What receivers key this store's ids and acks by (envelope.source_key)."""
        return source_key(self.origin, self.inc)

    # -- lifecycle ---------------------------------------------------------------------
    def transaction(self, durable: bool = True) -> _Tx:
        """Group several calls into one transaction (one fsync for a whole bundle).  The
        outbox index follows the store: what a failed transaction undid is undone in it too."""
        return _Tx(self, durable)

    # -- the outbox: records in the store, questions to the index ------------------------------
    def _out_add(self, items: list[OutItem], places: dict[int, tuple[int, int]] | None = None) -> None:
        self.records.out_add(items)
        self.outbox.add(items, places)

    def _out_delete(self, seqs: Iterable[int]) -> list[OutItem]:
        gone = self.outbox.delete(seqs)
        self.records.out_delete([it.seq for it in gone])
        return gone

    def _out_put(self, changed: list[OutItem]) -> None:
        if changed:
            self.records.out_put(changed)

    def _with_bodies(self, items: list[OutItem]) -> list[OutItem]:
        bodies = self.records.out_bodies([it.seq for it in items])
        for it in items:
            it.body = bodies[it.seq]
        return items

    def held(self, seqs: Iterable[int]) -> dict[int, OutItem]:
        """Those of seqs held here, without bodies (copies: changing one changes nothing held)."""
        return self.outbox.get(seqs)

    def member_acks(self, seq: int) -> dict[str, bool]:
        """For an envelope sent to a group: member -> whether it took it ("done")."""
        return dict(self.outbox.members.get(seq, {}))

    def close(self) -> None:
        """Close the store; a clean close gives back the seqs reserved and not used (the next
        run numbers on without a gap)."""
        st = self.records
        nxt = st.counter("next_seq")
        if st.counter("seq_reserved") > nxt:
            with self.transaction():
                st.bump("seq_reserved", nxt - st.counter("seq_reserved"))
        st.close()

    # -- sending before the fsync (module doc) -------------------------------------------------
    def sync_point(self) -> int:
        """Call outside a transaction, before waiting for an fsync of every commit made so
        far; pass what it returns to synced() once that fsync is done."""
        t = self._tag
        self._tag += 1
        self._points.append((t, self.records.counter("seq_reserved")))
        return t

    def synced(self, token: int) -> None:
        """Every commit made before sync_point() returned `token` is on disk."""
        if token <= self._synced_tag:
            return
        self._synced_tag = token
        while self._points and self._points[0][0] <= token:
            self._reserved_on_disk = max(self._reserved_on_disk, self._points.pop(0)[1])
        if self._fresh_acks:
            self._fresh_acks = {k: t for k, t in self._fresh_acks.items() if t > token}

    def may_send_unsynced(self) -> bool:
        """May what is queued now go to the agent before its commit is on disk?  Yes when
        every seq handed out is within a reservation on disk and no mark waits for its fsync."""
        return self._marks_tag <= self._synced_tag and self.records.counter("next_seq") <= self._reserved_on_disk

    def unsynced_acks(self) -> set[tuple[str, int]]:
        """(source, seq) of acks owed whose cause (the envelope taken, or consumed) may not be
        on disk yet: they must not go before the fsync."""
        return set(self._fresh_acks)

    def _owe(self, kind: str, src: str, seq: int) -> None:
        self.records.put(kind, (src, seq), ())
        self._fresh_acks[(src, seq)] = self._tag

    def checkpoint(self) -> tuple[int, int]:
        return self.records.checkpoint()

    def counters(self) -> dict[str, int]:
        return self.records.counters()

    def count(self, name: str) -> int:
        return self.records.counter(name)

    def count_event(self, name: str, by: int = 1) -> None:
        with self.transaction(durable=False):
            self.records.bump(name, by)

    def _count(self, event: str, peer: str, priority: int) -> None:
        self._tally_tx.append((event, peer, int(priority)))

    def tally_event(self, event: str, peer: str, priority: int) -> None:
        """Count an event of an envelope for status and metrics: when the transaction it is
        part of commits (at once outside one)."""
        if self._depth:
            self._count(event, peer, priority)
        else:
            self.tally[(event, peer, int(priority))] += 1

    def _tx_end(self, committed: bool) -> None:
        if committed:
            self.tally.update(self._tally_tx)
            for v in self._delays_tx:
                self.delays.observe(v)
        self._tally_tx.clear()
        self._delays_tx.clear()

    def _report(self, it: OutItem, outcome: str, now_ms: int) -> None:
        self._count(outcome, it.dst, it.priority)
        rid = self.records.add("reports", (it.seq, it.dst, outcome, now_ms, it.created_ms, it.supersede))
        self.records.bump(outcome)
        if rid % max(1, self.reports_kept // 10) == 0:  # the newest reports_kept (+10 %) stay
            old = self.records.scan("reports", limit=max(0, self.records.count("reports") - self.reports_kept))
            self.records.delete("reports", [k for k, _v in old])

    # -- sending side ----------------------------------------------------
    def submit(
        self,
        dst: str,
        body: bytes,
        now_ms: int,
        lifetime_ms: int,
        priority: Priority = Priority.ROUTINE,
        supersede: str | None = None,
        app: str = "",
    ) -> int:
        seq = self.submit_many([(dst, body, lifetime_ms, priority, supersede, app)], now_ms)[0]
        assert seq is not None  # (None only for a marked submit the store already took)
        return seq

    def submit_many(
        self,
        items: Iterable[tuple[str, bytes, int, Priority, str | None, str]],
        now_ms: int,
        marks: list[Mark] | None = None,
    ) -> list[int | None]:
        """Accept envelopes into custody in one durable transaction; returns their seqs.

        A newer envelope with a supersession key replaces any queued (not yet sent)
        older one to the same destination with the same key, and takes its place in the
        queue when it is of the same class (outbox, decision 0014).  Over quota, nothing
        of the batch is accepted and QuotaExceeded says by how much.

        marks (one per item, or None): (key, digest, repeat).  The digest is remembered
        under the key in the same commit as the envelope; an item marked `repeat` whose
        key already holds the same digest was taken before and is skipped (seq None).
        This is how a resent MQTT PUBLISH (DUP flag, same packet id) after a gateway
        crash is told from a new one: the record and the envelope commit together.  A list
        of marks (an envelope holding several messages, none a repeat) records each."""
        st = self.records
        items = list(items)
        for i in items:
            if len(i[1]) > MAX_MESSAGE_BYTES:
                self.tally.update(("refused_too_large", j[0], int(j[3])) for j in items)  # the batch's every one
                raise TooLarge(
                    f"a message of {len(i[1])} bytes for {i[0]} is over the overlay's limit of "
                    f"{MAX_MESSAGE_BYTES} bytes; nothing of this batch was accepted"
                )
        marks = list(marks) if marks is not None else [None] * len(items)
        seqs: list[int | None] = []
        with self.transaction():
            # the repeats first (a mark standing with the same digest): skipped, they take no room
            repeats: set[int] = set()
            marked: dict[str, bytes] = {}
            for idx, mark in enumerate(marks):
                if isinstance(mark, list):  # several messages in one envelope, none a repeat: each recorded
                    marked.update((key, digest) for key, digest, _repeat in mark)
                elif mark is not None:
                    key, digest, repeat = mark
                    got = (marked[key], now_ms) if key in marked else st.get("marks", (key,))
                    # a repeat only while its mark stands, and within `repeat` ms when that is a window
                    if (
                        repeat
                        and got is not None
                        and got[0] == digest
                        and (repeat is True or now_ms - got[1] <= repeat)
                    ):
                        repeats.add(idx)
                        continue
                    marked[key] = digest
            new = [i for idx, i in enumerate(items) if idx not in repeats]
            n, nbytes = self.outbox.totals()
            add_bytes = sum(len(i[1]) for i in new)
            if n + len(new) > self.quota.max_envelopes or nbytes + add_bytes > self.quota.max_bytes:
                self.tally.update(("refused_quota", i[0], int(i[3])) for i in new)
                raise QuotaExceeded(
                    f"custody store full: {n} envelopes / {nbytes} bytes held, {len(new)} / {add_bytes} more "
                    f"would pass the quota of {self.quota.max_envelopes} / {self.quota.max_bytes}; "
                    "nothing of this batch was accepted"
                )
            adds: list[OutItem] = []  # written together (one statement for the batch)
            places: dict[int, tuple[int, int]] = {}  # a report that takes an unsent one's place (outbox)
            for idx, (dst, body, lifetime_ms, priority, supersede, app) in enumerate(items):
                if idx in repeats:
                    st.bump("repeats_skipped")
                    seqs.append(None)
                    continue
                seq = st.bump("next_seq")
                if seq > st.counter("seq_reserved"):  # on disk with this commit (module doc)
                    st.bump("seq_reserved", seq + SEQ_BLOCK - st.counter("seq_reserved"))
                # An envelope with a supersession key is outside its class's order (cseq 0): the
                # receiver takes it at once, never held behind a lost one, and drops an older
                # copy of the key that arrives after a newer one (stale) -- newest wins, as
                # supersession means; only envelopes without a key wait for their turn.
                cseq = 0 if supersede is not None else st.bump(f"cseq:{dst}:{int(priority)}")
                if supersede is not None:
                    self._out_add(adds, places)  # an older copy of the key may be in this very batch
                    adds, places = [], {}
                    for old in self.outbox.by_key(dst, supersede):
                        if not old.inflight:
                            place, first = self.outbox.place_of(old.seq)
                            # the newest position waits no longer than the one it replaces, if it
                            # weighs about what the place was taken with (a 1-byte placeholder
                            # cannot hold a place for 60 kB)
                            if old.priority == int(priority) and len(body) <= first + PLACE_SLACK_BYTES:
                                places[seq] = min(places.get(seq, (place, first)), (place, first))
                            self._out_delete([old.seq])
                            self._report(old, "superseded", now_ms)
                        elif not old.superseded:  # copies already handed to the BPA are not sent again
                            self._out_put(self.outbox.update([old.seq], superseded=True))
                adds.append(
                    OutItem(
                        seq,
                        dst,
                        int(priority),
                        cseq,
                        now_ms,
                        lifetime_ms,
                        now_ms + lifetime_ms,
                        supersede,
                        app,
                        body,
                        len(body),
                        False,
                        0,
                        None,
                        None,
                    )
                )
                seqs.append(seq)
                self._count("submitted", dst, priority)
            self._out_add(adds, places)
            for key, digest in marked.items():
                st.put("marks", (key,), (digest, now_ms))
            if marked:
                self._marks_tag = self._tag
            st.bump("accepted", sum(1 for x in seqs if x is not None))
        return seqs

    def expire(self, now_ms: int) -> list[tuple[int, str]]:
        """End every envelope whose lifetime is over: reported 'expired'.  Returns (seq, dst)."""
        st = self.records
        with self.transaction(durable=False):
            gone = self._out_delete([it.seq for it in self.outbox.expired(now_ms)])
            for it in gone:
                self._report(it, "superseded" if it.superseded else "expired", now_ms)
            st.delete("seen", st.due("seen", now_ms, PRUNE_BATCH))
            st.delete("marks", st.due("marks", now_ms - MARK_KEEP_MS, PRUNE_BATCH))
        return [(it.seq, it.dst) for it in gone]

    def queued(self, dst: str, limit: int = 1000) -> list[OutItem]:
        """Not yet sent, in sending order: strict priority, then by place (Outbox.queued)."""
        return self._with_bodies(self.outbox.queued(dst, limit))

    def due_retries(self, now_ms: int) -> list[OutItem]:
        """In flight and past their retransmission time (superseded copies excluded)."""
        return self._with_bodies([it for it in self.outbox.due(now_ms) if not it.superseded])

    def drop_superseded_inflight(self, now_ms: int) -> int:
        """Superseded copies whose retransmission time came: never sent again, reported."""
        with self.transaction(durable=False):
            gone = self._out_delete([it.seq for it in self.outbox.due(now_ms) if it.superseded])
            for it in gone:
                self._report(it, "superseded", now_ms)
        return len(gone)

    def has_pending(self, dsts: Iterable[str]) -> bool:
        """Is anything for these destinations not yet sent, or sent and not yet there?  (A
        superseded copy in flight is not: it is never sent again.)"""
        return any(self.outbox.pending(d) for d in dsts)

    def next_retry_ms(self) -> int | None:
        return self.outbox.next_retry_ms()

    def next_expiry_ms(self) -> int | None:
        """When expire() has something to do: an envelope held here ends, or seen ids are past
        their time (a node that only receives must forget them too, or its dedupe state
        grows with everything it was ever sent)."""
        out, seen = self.outbox.next_expiry_ms(), self.records.first_due("seen")
        if seen is not None:
            seen = -(-seen // SEEN_PRUNE_MS) * SEEN_PRUNE_MS
        return min((t for t in (out, seen) if t is not None), default=None)

    def destinations(self) -> list[str]:
        return self.outbox.destinations()

    def inflight_bytes(self) -> dict[str, int]:
        """Bytes handed to the BPA and not known to be there, per destination: superseded
        copies too (never sent again, but on the radio's queue until they arrive or are lost)."""
        return self.outbox.inflight_bytes()

    def superseded_inflight(self, dst: str, sent_before_ms: int, lacking: str | None = None) -> list[int]:
        """Superseded copies in flight to dst sent before `sent_before_ms` (for a group, only
        those the member `lacking` has not acked)."""
        return self.outbox.superseded_inflight(dst, sent_before_ms, lacking)

    def floor(self, dst: str, priority: int) -> int:
        """The oldest place in the class's order the receiver must still wait for.  Superseded
        copies do not count: they are never sent again, so a lost one must not hold back the
        newer envelopes behind it."""
        return self.outbox.min_cseq(dst, priority)

    def mark_sent(self, seqs: list[int], now_ms: int, retry_at_ms: dict[int, int]) -> None:
        st = self.records
        with self.transaction(durable=False):
            self._out_put(self.outbox.sent(seqs, now_ms, retry_at_ms))
            st.bump("sent", len(seqs))

    def inflight(
        self,
        dst: str,
        lacking: str | None = None,
        sent_before_ms: int | None = None,
        retry_after_ms: int | None = None,
        limit: int = -1,
    ) -> list[OutItem]:
        """What is in flight to dst and not there yet (superseded copies excluded), in
        sending order, bodies left out; `lacking`: for a group, only what that member has
        not acked; only what was sent before `sent_before_ms`, or is due for its retry after
        `retry_after_ms`, when given.  The scheduler decides what of it is lost."""
        return self.outbox.inflight(dst, lacking, sent_before_ms, retry_after_ms, limit)

    def last_sent_ms(self, dst: str) -> int:
        """When anything in flight to dst (there or not) was last sent; 0 if nothing is."""
        return self.outbox.last_sent_ms(dst)

    def set_retry(self, retry_at_ms: dict[int, int]) -> None:
        """New retransmission times for envelopes in flight."""
        with self.transaction(durable=False):
            self._out_put(self.outbox.set_retry(retry_at_ms))

    def marks_answered(self, keys: Iterable[str]) -> None:
        """The client heard that these were taken (PUBACK written): their marks go, so that a DUP
        reusing the packet id is a new message (QoS 1 stays at least once)."""
        keys = list(keys)
        if keys:
            with self.transaction(durable=False):
                self.records.delete("marks", [(k,) for k in keys])

    def held_in(self, runs: list[tuple[int, int]], member: str | None = None) -> list[int]:
        """The seqs of envelopes held that an ack's runs name: at most what is held, however
        many ids the runs span (a peer's 20-byte run of 2**40 ids costs no more than what it
        names).  Few ids are looked up by value; many, by one range scan of what was sent to
        `member` (and the groups it is in), when given: what an ack from it can concern."""
        if not runs:
            return []
        if runs_total(runs) <= ACK_EXPAND_MAX:
            return sorted({s for a, b in runs for s in range(a, b + 1)})
        lo, hi = min(a for a, _ in runs), max(b for _, b in runs)
        dsts = None if member is None else [member] + [g for g, ms in self.groups.items() if member in ms]
        return in_runs(self.outbox.seqs_between(lo, hi, dsts), runs)

    def ack_from(self, member: str, done: Iterable[int], got: Iterable[int]) -> tuple[list[OutItem], list[OutItem]]:
        """An ack from `member`: (released, arrived).  An envelope sent to that member alone is
        released on "done" and stops being retransmitted on "got"; one sent to a group that
        member is in waits for every member: received when all have it, released when all
        took it.  `arrived` is what this member newly holds (round-trip samples, window).
        Ids of envelopes for other destinations are ignored: a peer cannot release them."""
        st = self.records
        if member in self.groups:  # a group does not ack: its members do (the codec refuses such senders too)
            st.bump("acks_from_a_group")
            return [], []
        released, arrived, gone, received = [], [], [], []
        done, got = list(done), list(got)
        with self.transaction(durable=False):
            held = self.outbox.get(done + got)  # one question for the whole ack
            for s, is_done in [(x, True) for x in done] + [(x, False) for x in got]:
                it = held.get(s)
                if it is None:
                    continue  # a second ack, or one for an envelope that expired meanwhile
                if it.dst == member:
                    if is_done:
                        del held[s]
                        gone.append(s)
                        released.append(it)
                    elif not it.received:
                        received.append(s)
                    if not it.received:
                        arrived.append(it)
                        it.received = True  # the same id twice in one ack counts once
                    continue
                members = self.groups.get(it.dst)
                if not members or member not in members:
                    st.bump("acks_not_theirs")
                    continue
                acks = self.member_acks(s)
                prev = acks.get(member)
                if prev is None or (is_done and not prev):
                    self.outbox.member_ack(s, member, is_done)
                    st.member_ack(s, member, is_done)
                    acks[member] = is_done
                if prev is None:
                    arrived.append(it)
                if sum(acks.values()) >= len(members):
                    del held[s]
                    gone.append(s)
                    released.append(it)
                elif len(acks) >= len(members) and not it.received:
                    received.append(s)
                    it.received = True
            self._out_delete(gone)
            gone_ids = set(gone)
            self._out_put(self.outbox.update([s for s in received if s not in gone_ids], received=True))
            if released:
                st.bump("acked", len(released))
                for it in released:
                    self._count("acked", it.dst, it.priority)
        return released, arrived

    def held_out(self) -> tuple[int, int]:
        return self.outbox.totals()

    def queue_summary(self) -> list[tuple[str, int, int, int, int]]:
        """(dst, priority, queued, in flight, bytes) rows."""
        return self.outbox.summary()

    def reports(self, since_id: int = 0) -> list[tuple]:
        """(id, seq, dst, outcome, at_ms, created_ms, supersede), oldest first."""
        return [(k[0], *v) for k, v in self.records.scan("reports", after=since_id)]

    # -- receiving side --------------------------------------------------
    def receive(self, env: Envelope, now_ms: int) -> Received:
        """Take one data envelope from a peer: dedupe, drop stale superseded, keep class order."""
        st = self.records
        src = env.source  # the origin and its store's incarnation: ids, order and acks are per source
        stream = src if env.dst == self.origin else f"{src}>{env.dst}"
        with self.transaction():
            seen = st.get("seen", (src, env.seq))
            if seen is not None:
                st.bump("duplicates")
                # the origin did not hear: tell it again, "got" if still here, "done" if taken
                self._owe("got" if self._kept(seen[1]) else "done", src, env.seq)
                return Received("duplicate")
            until = max(env.expires_ms(), now_ms) + SEEN_MARGIN_MS
            if env.expires_ms() <= now_ms:
                st.put("seen", (src, env.seq), (until, 0))
                st.bump("received_expired")
                self._owe("done", src, env.seq)
                return Received("expired")
            prio = int(env.priority)
            if env.supersede is not None:
                newest = st.get("latest", (src, env.supersede))
                if newest is not None and newest[0] > env.seq:
                    st.put("seen", (src, env.seq), (until, 0))
                    st.bump("received_stale")
                    self._owe("done", src, env.seq)
                    # a stale envelope still fills its place in the class's order
                    nxt = self._order(stream, prio)
                    self._advance(stream, prio, max(env.floor, env.cseq + 1 if env.cseq == nxt else 0), now_ms)
                    return Received("stale")
                st.put("latest", (src, env.supersede), (env.seq,))
            self._owe("got", src, env.seq)
            nxt = self._order(stream, prio)
            in_turn = env.cseq == nxt and env.floor <= nxt  # the very one the order waits for
            d = Delivery(
                0, src, env.seq, env.priority, env.created_ms, env.lifetime_ms, env.supersede, env.app, env.body, now_ms
            )
            # (last: a place held already by another envelope, the origin having numbered two
            # for it when a power cut undid a commit: this one goes now, late, not lost)
            if (
                env.cseq == 0
                or env.cseq < max(nxt, env.floor)
                or in_turn
                or (self._held_place(stream, prio, env.cseq) and st.bump("held_place_taken") > 0)
            ):
                # unordered, older than what the order already passed, or in its turn (the
                # common case: straight to the inbox, never held and taken back; nothing
                # held is older, held ones all wait for a later turn)
                self._to_inbox(d)
                st.put("seen", (src, env.seq), (until, d.id))
                released = 1 + self._advance(stream, prio, nxt + 1 if in_turn else env.floor, now_ms)
                return Received("delivered", released)
            st.put("seen", (src, env.seq), (until, HELD))
            st.put(
                "held",
                (stream, prio, env.cseq),
                (d.seq, d.created_ms, d.lifetime_ms, d.supersede, d.app, d.body, d.received_ms),
            )
            released = self._advance(stream, prio, env.floor, now_ms)
            return Received("delivered" if released else "held", released)

    def _kept(self, place: int) -> bool:
        """Is an envelope still here, by where its seen id says it went: an inbox id (still
        there until taken), HELD, or 0 (not kept: expired, stale)."""
        if place == HELD:
            return True
        rows = self.records.scan("inbox", after=place - 1, limit=1, keys_only=True) if place > 0 else []
        return bool(rows) and rows[0][0][0] == place

    def _order(self, stream: str, prio: int) -> int:
        """The next place in the class's order a stream waits for (1 at first)."""
        got = self.records.get("order", (stream, prio))
        return got[0] if got else 1

    def _held_place(self, stream: str, prio: int, cseq: int) -> bool:
        """Is this place of a stream's class held?  (Its key only: no body read.)"""
        if cseq <= 0:
            return False
        rows = self.records.scan("held", (stream, prio), after=cseq - 1, limit=1, keys_only=True)
        return bool(rows) and rows[0][0][2] == cseq

    def _lowest_held(self, stream: str, prio: int) -> int | None:
        """The lowest place held in a stream's class (its key only: no body read)."""
        rows = self.records.scan("held", (stream, prio), limit=1, keys_only=True)
        return rows[0][0][2] if rows else None

    def _take_held(self, stream: str, prio: int, cseq: int) -> Delivery:
        """The envelope held at a place, out of held."""
        key = (stream, prio, cseq)
        value = self.records.get("held", key)
        assert value is not None  # (asked for a place _lowest_held named, in the same transaction)
        seq, created, lifetime, sup, app, body, rcv = value
        self.records.delete("held", [key])
        return Delivery(0, stream.split(">", 1)[0], seq, Priority(prio), created, lifetime, sup, app, body, rcv)

    def _advance(self, stream: str, prio: int, floor: int, now_ms: int) -> int:
        """Move the class's order of a stream (`origin`, or `origin>group`) up to at least
        `floor` (the sender holds nothing older), releasing held envelopes while they are
        contiguous."""
        st = self.records
        nxt = max(self._order(stream, prio), floor)
        released = 0
        while True:
            cseq = self._lowest_held(stream, prio)
            if cseq is None or cseq > nxt:
                break
            d = self._take_held(stream, prio, cseq)
            d.received_ms = now_ms  # in the inbox from now (held since d.received_ms)
            self._to_inbox(d)
            seen = st.get("seen", (d.origin, d.seq))
            if seen is not None:  # where a copy finds it now
                st.put("seen", (d.origin, d.seq), (seen[0], d.id))
            released += 1
            nxt = max(nxt, cseq + 1)
        st.put("order", (stream, prio), (nxt,))
        return released

    def _to_inbox(self, d: Delivery) -> None:
        d.id = self.records.add(
            "inbox",
            (d.origin, d.seq, int(d.priority), d.created_ms, d.lifetime_ms, d.supersede, d.app, d.body, d.received_ms),
        )
        self.records.bump("delivered")
        self._count("received", source_node(d.origin), d.priority)
        self._delays_tx.append(max(0, d.received_ms - d.created_ms) / 1000)

    def release_held(self, older_than_ms: int, now_ms: int) -> int:
        """Give up waiting for a gap: envelopes held since before `older_than_ms` go to the inbox."""
        st = self.records
        if not st.due("held", older_than_ms, 1):
            return 0
        with self.transaction():
            n = gaps = 0
            # the oldest held first, its class moved past the gap before it; each turn releases
            # at least that one, and a call at most RELEASE_BATCH (the next call goes on)
            while n < RELEASE_BATCH:
                oldest = st.due("held", older_than_ms, 1)
                if not oldest:
                    break
                stream, prio = oldest[0][0], oldest[0][1]
                low = self._lowest_held(stream, prio)
                assert low is not None
                n += self._advance(stream, prio, low, now_ms)
                gaps += 1
            st.bump("gaps_skipped", gaps)
        return n

    def inbox_count(self) -> int:
        """How many envelopes wait for the application (for status: no body is read)."""
        return self.records.count("inbox")

    def inbox(
        self, limit: int = 1000, app: str | None = None, exclude: Iterable[str] = (), after: int = 0
    ) -> list[Delivery]:
        """Envelopes waiting for the application, oldest first (only those of `app` when given,
        none of the apps in `exclude`, only ids above `after`).  Their origin is the node (the
        store keeps the source key)."""
        rows = self.records.scan(
            "inbox",
            after=after,
            limit=limit,
            only=None if app is None else {"app": app},
            besides=None if app is not None else {"app": list(exclude)},
        )
        return [
            Delivery(k[0], source_node(origin), seq, Priority(prio), created, lifetime, sup, a, body, rcv)
            for k, (origin, seq, prio, created, lifetime, sup, a, body, rcv) in rows
        ]

    def consumed(self, ids: Iterable[int]) -> list[tuple[str, int]]:
        """The application has taken these: they leave the inbox and their origin gets an ack.
        Returns (source, seq) of those that were there."""
        st = self.records
        out = []
        with self.transaction():
            for i in ids:
                row = st.get("inbox", (i,))
                if row is None:
                    continue
                gone = (row[0], row[1])
                st.delete("inbox", [(i,)])
                st.delete("got", [gone])
                self._owe("done", *gone)
                out.append(gone)
        return out

    def pending_acks(self) -> dict[str, tuple[list[int], list[int]]]:
        """source key (origin and incarnation) -> (done, got): what each origin must hear about."""
        out: dict[str, tuple[list[int], list[int]]] = {}
        for i, kind in enumerate(("done", "got")):
            for (origin, seq), _v in self.records.scan(kind):
                out.setdefault(origin, ([], []))[i].append(seq)
        return out

    def acks_sent(self, origin: str, done: Iterable[int], got: Iterable[int] = ()) -> None:
        with self.transaction(durable=False):
            self.records.delete("done", [(origin, s) for s in done])
            self.records.delete("got", [(origin, s) for s in got])


class CustodyStore(Custody):
    """Custody over the SQLite store at `path`: what a node runs."""

    def __init__(
        self,
        path: str | Path,
        origin: str,
        quota: Quota = Quota(),
        groups: dict[str, tuple[str, ...]] | None = None,
        background_checkpoints: bool = False,
        sync: str = "loop",
    ):
        super().__init__(
            open_store("sqlite", path, background_checkpoints=background_checkpoints, sync=sync), origin, quota, groups
        )
        self.path = str(path)

    @property
    def db(self):
        """The SQLite connection (for tests of the file itself: schema, commits)."""
        return self.records.db  # type: ignore[attr-defined]  # the SQLite store's


class _Tx:
    """The store's transaction, with the outbox index's begin / commit / rollback around the
    outermost one (nested ones join it, as the store's do)."""

    __slots__ = ("c", "durable", "inner", "outer")

    def __init__(self, c: Custody, durable: bool):
        self.c, self.durable = c, durable

    def __enter__(self) -> None:
        c = self.c
        self.outer = c._depth == 0
        self.inner = c.records.transaction(self.durable)
        if self.outer:
            c.outbox.begin()
        c._depth += 1
        try:
            self.inner.__enter__()
        except BaseException:
            c._depth -= 1
            if self.outer:
                c.outbox.rollback()
            raise

    def __exit__(self, et, ev, tb) -> None:
        c = self.c
        try:
            self.inner.__exit__(et, ev, tb)  # (raises if the commit fails: the store undid it)
        except BaseException:
            if self.outer:
                c.outbox.rollback()
                c._tx_end(False)
            raise
        finally:
            c._depth -= 1
        if self.outer:
            if et is None:
                c.outbox.commit()
            else:
                c.outbox.rollback()
            c._tx_end(et is None)
