"""The outbox index: what custody holds to send, in memory, answering every question the
scheduler and an ack ask about it (decision 0010).

The store keeps the outbox's records (store/__init__.py: added, changed, deleted, read back
whole when custody opens it); this index is the same records without their bodies, with
the orders the questions need kept as the records change.  No question reads the disk, and
none costs more than what it answers (or, for a range of ids, what the range holds): a
plan asks a dozen of them.

Transactions: between begin() and commit() every record's state before its first change is
kept; rollback() puts it back, so a transaction the store undid (a full disk, a quota
refused halfway) leaves the index as the store is.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from sortedcontainers import SortedDict, SortedList

from c2dtn.overlay.store import OUT_FIELDS, OutItem

_NOWHERE = (False,) * 6


class Outbox:
    def __init__(self, items: Iterable[OutItem] = (), members: dict[int, dict[str, bool]] | None = None):
        self.items: dict[int, OutItem] = {}
        self.members: dict[int, dict[str, bool]] = {}  # group envelope -> member -> done
        self.n = self.nbytes = 0
        self._by_dst: dict[str, SortedList] = {}  # dst -> its seqs (an ack's runs resolved against its own)
        # (dst, priority) -> seq -> cseq, each in seq order: not sent; sent, not there and not
        # superseded; ordered (cseq > 0) and not superseded
        self._queued: dict[tuple[str, int], SortedDict] = {}  # ... but place -> seq (below)
        self._open: dict[tuple[str, int], SortedDict] = {}
        self._floor: dict[tuple[str, int], SortedDict] = {}
        self._keyed: dict[tuple[str, str], set[int]] = {}  # (dst, supersession key) -> seqs
        # seq -> (its place in the unsent order, the most bytes that place may carry) where the
        # place is not its own seq: a report that supersedes an unsent one of its key takes that
        # one's place (decision 0014); kept in memory only, so custody reopened sends in seq order
        self._place: dict[int, tuple[int, int]] = {}
        self._wire: dict[str, list[int]] = {}  # dst -> [count, bytes] sent and not there
        self._stale: dict[str, set[int]] = {}  # dst -> superseded copies sent and not there
        self._sums: dict[tuple[str, int], list[int]] = {}  # (dst, priority) -> [not sent, sent, bytes]
        self._dsts: dict[str, int] = {}  # dst -> records held
        self._retry: list[tuple[int, int]] = []  # heap of (retry_ms, seq); stale entries skipped
        self._expiry: list[tuple[int, int]] = []  # heap of (expires_ms, seq); ditto
        self._undo: dict[int, tuple[OutItem | None, dict[str, bool] | None, tuple[int, int] | None]] | None = None
        for it in sorted(items, key=lambda it: it.seq):
            self._insert(_copy(it) if it.body else it)
        for seq, acks in (members or {}).items():
            if seq in self.items:
                self.members[seq] = dict(acks)

    # -- transactions --------------------------------------------------------------------
    def begin(self) -> None:
        self._undo = {}

    def commit(self) -> None:
        self._undo = None

    def rollback(self) -> None:
        undo, self._undo = self._undo or {}, None
        for seq in undo:  # all out first: a record put back may take the place of one added
            if seq in self.items:
                self._remove(seq)
            self.members.pop(seq, None)
        for seq, (item, acks, place) in undo.items():
            if item is not None:
                if place is not None:
                    self._place[seq] = place
                self._insert(item)
            if acks is not None:
                self.members[seq] = acks
        self._compact()  # (restored records pushed their times again)

    def _touch(self, seq: int) -> None:
        """Keep seq's state from before the open transaction's first change to it."""
        if self._undo is not None and seq not in self._undo:
            it, acks = self.items.get(seq), self.members.get(seq)
            self._undo[seq] = (
                _copy(it, it.body) if it else None,
                dict(acks) if acks is not None else None,
                self._place.get(seq),
            )

    # -- one record in and out of every order ------------------------------------------------
    def _insert(self, it: OutItem) -> None:
        if it.seq in self.items:
            raise ValueError(f"outbox already holds seq {it.seq}")
        self.items[it.seq] = it
        self.n += 1
        self.nbytes += it.size
        seqs = self._by_dst.get(it.dst)
        if seqs is None:
            seqs = self._by_dst[it.dst] = SortedList()
        seqs.add(it.seq)
        self._dsts[it.dst] = self._dsts.get(it.dst, 0) + 1
        heapq.heappush(self._expiry, (it.expires_ms, it.seq))
        if it.supersede is not None:
            self._keyed.setdefault((it.dst, it.supersede), set()).add(it.seq)
        self._move(it, _NOWHERE, self._where(it))
        self._sums[(it.dst, it.priority)][2] += it.size

    def _remove(self, seq: int) -> OutItem:
        it = self.items.pop(seq)
        sums = self._sums[(it.dst, it.priority)]
        sums[2] -= it.size
        self._move(it, self._where(it), _NOWHERE)
        self.n -= 1
        self.nbytes -= it.size
        if self._dsts[it.dst] == 1:
            del self._dsts[it.dst]
        else:
            self._dsts[it.dst] -= 1
        if it.supersede is not None:
            keyed = self._keyed[(it.dst, it.supersede)]
            keyed.discard(seq)
            if not keyed:
                del self._keyed[(it.dst, it.supersede)]
        _drop(self._by_dst, it.dst, seq)
        self._place.pop(seq, None)
        return it

    @staticmethod
    def _where(it: OutItem) -> tuple[bool, ...]:
        """The orders a record's changeable fields put it in: not sent, sent, open (sent, not
        there, not superseded), stale (... superseded), on the wire (sent, not there), floor
        (ordered, not superseded)."""
        wire = it.inflight and not it.received
        return (
            not it.inflight,
            it.inflight,
            wire and not it.superseded,
            wire and it.superseded,
            wire,
            it.cseq > 0 and not it.superseded,
        )

    def _move(self, it: OutItem, was: tuple[bool, ...], now: tuple[bool, ...]) -> None:
        """A record from the orders `was` put it in to those `now` does (_where; _NOWHERE)."""
        k = (it.dst, it.priority)
        place = self.place(it.seq)
        for order, on, off, key, value in (
            (self._queued, now[0], was[0], place, it.seq),
            (self._open, now[2], was[2], it.seq, it.cseq),
            (self._floor, now[5], was[5], it.seq, it.cseq),
        ):
            if on and not off:
                d = order.get(k)
                if d is None:  # (not setdefault: it would build a SortedDict on every call)
                    d = order[k] = SortedDict()
                d[key] = value
            elif off and not on:
                _drop(order, k, key)
        if now[3] != was[3]:
            if now[3]:
                self._stale.setdefault(it.dst, set()).add(it.seq)
            else:
                _drop(self._stale, it.dst, it.seq)
        if now[4] != was[4]:
            wire = self._wire.setdefault(it.dst, [0, 0])
            d = 1 if now[4] else -1
            wire[0] += d
            wire[1] += d * it.size
            if not wire[0]:
                del self._wire[it.dst]
            if now[4] and it.retry_ms is not None:
                heapq.heappush(self._retry, (it.retry_ms, it.seq))
        sums = self._sums.setdefault(k, [0, 0, 0])
        sums[0] += now[0] - was[0]
        sums[1] += now[1] - was[1]
        if not sums[0] and not sums[1]:
            del self._sums[k]

    # -- changes ---------------------------------------------------------------------------
    def add(self, items: Iterable[OutItem], places: dict[int, tuple[int, int]] | None = None) -> None:
        """Records in; `places` puts some at another's place in the unsent order: (the place,
        the seq of the record that held it, which must have left; and the size the place was
        first taken with, which it keeps: place_of)."""
        for it in items:
            self._touch(it.seq)
            if places and it.seq in places:
                self._place[it.seq] = places[it.seq]
            self._insert(_copy(it))

    def place(self, seq: int) -> int:
        """Where a held record stands in its class's unsent order."""
        got = self._place.get(seq)
        return seq if got is None else got[0]

    def place_of(self, seq: int) -> tuple[int, int]:
        """(place, size it was first taken with) of a held record: what a record superseding it
        may inherit."""
        return self._place.get(seq) or (seq, self.items[seq].size)

    def delete(self, seqs: Iterable[int]) -> list[OutItem]:
        """Those held of seqs leave, with their members' acks; returns them."""
        gone = []
        for s in seqs:
            if s in self.items:
                self._touch(s)
                gone.append(self._remove(s))
                self.members.pop(s, None)
        return gone

    def update(self, seqs: Iterable[int], **fields) -> list[OutItem]:
        """Set fields (inflight, attempts, sent_ms, retry_ms, received, superseded) of those
        held; returns them as changed (what the store writes)."""
        bad = set(fields) - set(OUT_FIELDS)
        if bad:
            raise ValueError(f"outbox fields {sorted(bad)} cannot be updated")
        return [self._set(it, fields) for s in seqs if (it := self.items.get(s)) is not None]

    def _set(self, it: OutItem, fields: dict) -> OutItem:
        """Change a record's fields (checked by the caller) and move it between the orders."""
        self._touch(it.seq)
        was, retry = self._where(it), it.retry_ms
        for k, v in fields.items():
            setattr(it, k, v)
        now = self._where(it)
        self._move(it, was, now)
        if was[4] and now[4] and it.retry_ms != retry and it.retry_ms is not None:
            heapq.heappush(self._retry, (it.retry_ms, it.seq))  # (_move pushes on coming onto the wire)
        return it

    def set_retry(self, retry_at_ms: dict[int, int]) -> list[OutItem]:
        return [self._set(it, {"retry_ms": t}) for s, t in retry_at_ms.items() if (it := self.items.get(s)) is not None]

    def sent(self, seqs: Iterable[int], sent_ms: int, retry_at_ms: dict[int, int]) -> list[OutItem]:
        return [
            self._set(
                it, {"inflight": True, "attempts": it.attempts + 1, "sent_ms": sent_ms, "retry_ms": retry_at_ms[s]}
            )
            for s in seqs
            if (it := self.items.get(s)) is not None
        ]

    def member_ack(self, seq: int, member: str, done: bool) -> None:
        self._touch(seq)
        self.members.setdefault(seq, {})[member] = done

    # -- questions ---------------------------------------------------------------------------
    def get(self, seqs: Iterable[int]) -> dict[int, OutItem]:
        """Those held, as copies (a caller may change them), without bodies."""
        return {s: _copy(self.items[s]) for s in seqs if s in self.items}

    def seqs_between(self, lo: int, hi: int, dsts: Iterable[str] | None = None) -> list[int]:
        """Seqs held in lo..hi (for those destinations only, when given), ascending."""
        wanted = self._by_dst if dsts is None else {d: self._by_dst[d] for d in dsts if d in self._by_dst}
        return sorted(s for seqs in wanted.values() for s in seqs.irange(lo, hi))

    def totals(self) -> tuple[int, int]:
        return self.n, self.nbytes

    def by_key(self, dst: str, key: str) -> list[OutItem]:
        return [_copy(self.items[s]) for s in sorted(self._keyed.get((dst, key), ()))]

    def _classes(self, orders: dict[tuple[str, int], SortedDict], dst: str) -> list[SortedDict]:
        return [orders[k] for k in sorted(k for k in orders if k[0] == dst)]

    def queued(self, dst: str, limit: int) -> list[OutItem]:
        """Not sent: strict priority, then by place (oldest first, but a superseding report holds
        the place of the one it replaced: decision 0014)."""
        out: list[OutItem] = []
        for places in self._classes(self._queued, dst):
            for s in places.values():
                if len(out) == limit:
                    return out
                out.append(_copy(self.items[s]))
        return out

    def due(self, now_ms: int) -> list[OutItem]:
        """In flight, not there, retry time come (superseded copies too); priority, seq order."""
        heap, due, seen = self._retry, [], set()
        while heap and heap[0][0] <= now_ms:
            t, s = heapq.heappop(heap)
            if s not in seen and self._retry_entry(t, s):  # else stale: the record went or changed since
                seen.add(s)
                due.append((t, s))
        for e in due:  # still due until the caller sets a new time
            heapq.heappush(heap, e)
        self._compact()
        return [_copy(self.items[s]) for s in sorted(seen, key=lambda s: (self.items[s].priority, s))]

    def _retry_entry(self, t: int, s: int) -> bool:
        it = self.items.get(s)
        return it is not None and it.inflight and not it.received and it.retry_ms == t

    def _expiry_entry(self, t: int, s: int) -> bool:
        """(A seq given back by an undone transaction and used again is another record.)"""
        it = self.items.get(s)
        return it is not None and it.expires_ms == t

    def _compact(self) -> None:
        """The heaps rebuilt from their valid entries, once each once, when stale ones (changed,
        gone, restored by a rollback) outnumber the records."""
        if len(self._retry) > 2 * self.n + 64:
            self._retry = list({e for e in self._retry if self._retry_entry(*e)})
            heapq.heapify(self._retry)
        if len(self._expiry) > 2 * self.n + 64:
            self._expiry = list({e for e in self._expiry if self._expiry_entry(*e)})
            heapq.heapify(self._expiry)

    def expired(self, now_ms: int) -> list[OutItem]:
        """Lifetime over, in order of expiry."""
        heap, ended, seen = self._expiry, [], set()
        while heap and heap[0][0] <= now_ms:
            t, s = heapq.heappop(heap)
            if s not in seen and self._expiry_entry(t, s):
                seen.add(s)
                ended.append((t, s))
        for e in ended:  # held until the caller deletes them
            heapq.heappush(heap, e)
        self._compact()
        return [_copy(self.items[s]) for _t, s in ended]

    def inflight(
        self,
        dst: str,
        lacking: str | None = None,
        sent_before_ms: int | None = None,
        retry_after_ms: int | None = None,
        limit: int = -1,
    ) -> list[OutItem]:
        out: list[OutItem] = []
        for seqs in self._classes(self._open, dst):
            for s in seqs:
                if len(out) == limit:
                    return out
                it = self.items[s]
                if lacking and lacking in self.members.get(s, ()):
                    continue
                if sent_before_ms is not None and not (it.sent_ms is not None and it.sent_ms < sent_before_ms):
                    continue
                if retry_after_ms is not None and not (it.retry_ms is not None and it.retry_ms > retry_after_ms):
                    continue
                out.append(_copy(it))
        return out

    def last_sent_ms(self, dst: str) -> int:
        """When anything in flight to dst was last sent (asked once per destination after a start)."""
        return max((it.sent_ms or 0 for it in self.items.values() if it.dst == dst and it.inflight), default=0)

    def next_retry_ms(self) -> int | None:
        heap = self._retry
        while heap and not self._retry_entry(*heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_expiry_ms(self) -> int | None:
        heap = self._expiry
        while heap and not self._expiry_entry(*heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def destinations(self) -> list[str]:
        return sorted(self._dsts)

    def inflight_bytes(self) -> dict[str, int]:
        return {d: w[1] for d, w in self._wire.items()}

    def superseded_inflight(self, dst: str, sent_before_ms: int, lacking: str | None = None) -> list[int]:
        return sorted(
            s
            for s in self._stale.get(dst, ())
            if (t := self.items[s].sent_ms) is not None
            and t < sent_before_ms
            and not (lacking and lacking in self.members.get(s, ()))
        )

    def min_cseq(self, dst: str, priority: int) -> int:
        seqs = self._floor.get((dst, priority))
        return seqs.peekitem(0)[1] if seqs else 0

    def pending(self, dst: str) -> bool:
        return any(k[0] == dst for k in self._queued) or any(k[0] == dst for k in self._open)

    def summary(self) -> list[tuple[str, int, int, int, int]]:
        return [(d, p, v[0], v[1], v[2]) for (d, p), v in sorted(self._sums.items()) if v[0] or v[1]]


def _drop(orders: dict, k, seq: int) -> None:
    """seq out of orders[k]; the key goes with its last seq."""
    d = orders[k]
    if isinstance(d, (set, SortedList)):
        d.discard(seq)
    else:
        d.pop(seq, None)
    if not d:
        del orders[k]


def _copy(it: OutItem, body: bytes = b"") -> OutItem:
    """A record apart from the one held (dataclasses.replace is several times slower: this is
    on every plan's path)."""
    return OutItem(
        it.seq,
        it.dst,
        it.priority,
        it.cseq,
        it.created_ms,
        it.lifetime_ms,
        it.expires_ms,
        it.supersede,
        it.app,
        body,
        it.size,
        it.inflight,
        it.attempts,
        it.sent_ms,
        it.retry_ms,
        it.received,
        it.superseded,
    )
