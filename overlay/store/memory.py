"""The in-memory custody store: the records of store/__init__.py in dicts, for unit tests of
custody, the scheduler and the core (no disk, nothing survives the process).

It keeps the SQLite store's contract where tests can see it: a transaction that fails
undoes everything it did (a snapshot at the outermost BEGIN), and a durable change
inside a relaxed transaction is refused.  Queries walk the records: fine for the
sizes a unit test holds, not for a node."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import replace

from c2dtn.overlay.store import REPORTS_KEPT, Delivery, OutItem, register

_UPDATABLE = {"inflight", "attempts", "sent_ms", "retry_ms", "received", "superseded"}


def _order(it: OutItem) -> tuple[int, int]:
    return it.priority, it.seq


@register("memory")
class MemoryStore:
    reports_kept = REPORTS_KEPT

    def __init__(self):
        self.s = {
            "counters": {},
            "reports": [],
            "out": {},
            "members": {},
            "marks": {},
            "seen": {},
            "latest": {},
            "order": {},
            "held": {},
            "inbox": {},
            "inbox_id": 0,
            "owed": {"done": set(), "got": set()},
        }
        self._depth = 0
        self._durable = False
        self._snapshot = None

    # -- lifecycle -----------------------------------------------------------------------
    def transaction(self, durable: bool = True):
        return _Tx(self, durable)

    def close(self) -> None:
        pass

    def checkpoint(self) -> tuple[int, int]:
        return 0, 0

    # -- counters and reports ----------------------------------------------------------------
    def bump(self, name: str, by: int = 1) -> int:
        c = self.s["counters"]
        c[name] = c.get(name, 0) + by
        return c[name]

    def counter(self, name: str) -> int:
        return self.s["counters"].get(name, 0)

    def counters(self) -> dict[str, int]:
        return dict(self.s["counters"])

    def report_add(self, seq, dst, outcome, at_ms, created_ms, supersede) -> None:
        r = self.s["reports"]
        r.append(((r[-1][0] if r else 0) + 1, seq, dst, outcome, at_ms, created_ms, supersede))
        if len(r) > self.reports_kept * 1.1:
            del r[: len(r) - self.reports_kept]

    def reports(self, since_id: int = 0) -> list[tuple]:
        return [r for r in self.s["reports"] if r[0] > since_id]

    # -- outbox ------------------------------------------------------------------------------
    def _items(self, body: bool, pred) -> list[OutItem]:
        out = sorted((it for it in self.s["out"].values() if pred(it)), key=_order)
        return [copy.copy(it) if body else _nobody(it) for it in out]

    def out_add(self, items: list[OutItem]) -> None:
        for it in items:
            if it.seq in self.s["out"]:
                raise ValueError(f"outbox already holds seq {it.seq}")
            self.s["out"][it.seq] = copy.copy(it)

    def out_get(self, seqs: Iterable[int]) -> dict[int, OutItem]:
        out = self.s["out"]
        return {s: _nobody(out[s]) for s in seqs if s in out}

    def out_seqs_between(self, lo: int, hi: int) -> list[int]:
        return sorted(s for s in self.s["out"] if lo <= s <= hi)

    def out_delete(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self.s["out"].pop(seq, None)
            self.s["members"].pop(seq, None)

    def out_update(self, seqs: Iterable[int], **fields) -> None:
        bad = set(fields) - _UPDATABLE
        if bad:
            raise ValueError(f"outbox fields {sorted(bad)} cannot be updated")
        for seq in seqs:
            it = self.s["out"].get(seq)
            if it is not None:  # records are replaced, never changed in place (see _Tx's snapshot)
                self.s["out"][seq] = replace(it, **fields)

    def out_set_retry(self, retry_at_ms: dict[int, int]) -> None:
        for seq, at in retry_at_ms.items():
            self.out_update([seq], retry_ms=at)

    def out_sent(self, seqs: list[int], sent_ms: int, retry_at_ms: dict[int, int]) -> None:
        for seq in seqs:
            it = self.s["out"].get(seq)
            if it is not None:
                self.s["out"][seq] = replace(
                    it, inflight=True, attempts=it.attempts + 1, sent_ms=sent_ms, retry_ms=retry_at_ms[seq]
                )

    def out_totals(self) -> tuple[int, int]:
        return len(self.s["out"]), sum(it.size for it in self.s["out"].values())

    def out_by_key(self, dst: str, key: str) -> list[OutItem]:
        return self._items(False, lambda it: it.dst == dst and it.supersede == key)

    def out_queued(self, dst: str, limit: int) -> list[OutItem]:
        return self._items(True, lambda it: it.dst == dst and not it.inflight)[:limit]

    def out_due(self, now_ms: int) -> list[OutItem]:
        return self._items(True, lambda it: it.inflight and not it.received and it.retry_ms <= now_ms)

    def out_expired(self, now_ms: int) -> list[OutItem]:
        return self._items(False, lambda it: it.expires_ms <= now_ms)

    def out_inflight(
        self,
        dst: str,
        lacking: str | None = None,
        sent_before_ms: int | None = None,
        retry_after_ms: int | None = None,
        limit: int = -1,
    ) -> list[OutItem]:
        members = self.s["members"]
        out = self._items(
            False,
            lambda it: (
                it.dst == dst
                and it.inflight
                and not it.received
                and not it.superseded
                and (lacking is None or lacking not in members.get(it.seq, {}))
                and (sent_before_ms is None or it.sent_ms < sent_before_ms)
                and (retry_after_ms is None or it.retry_ms > retry_after_ms)
            ),
        )
        return out if limit < 0 else out[:limit]

    def out_last_sent_ms(self, dst: str) -> int:
        return max((it.sent_ms for it in self.s["out"].values() if it.dst == dst and it.inflight), default=0) or 0

    def out_next_retry_ms(self) -> int | None:
        return min((it.retry_ms for it in self.s["out"].values() if it.inflight and not it.received), default=None)

    def out_next_expiry_ms(self) -> int | None:
        return min((it.expires_ms for it in self.s["out"].values()), default=None)

    def out_destinations(self) -> list[str]:
        return sorted({it.dst for it in self.s["out"].values()})

    def out_inflight_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.s["out"].values():
            if it.inflight and not it.received:
                out[it.dst] = out.get(it.dst, 0) + it.size
        return out

    def out_superseded_inflight(self, dst: str, sent_before_ms: int) -> list[int]:
        return sorted(
            it.seq
            for it in self.s["out"].values()
            if it.dst == dst
            and it.inflight
            and not it.received
            and it.superseded
            and it.sent_ms is not None
            and it.sent_ms < sent_before_ms
        )

    def out_min_cseq(self, dst: str, priority: int) -> int:
        return min(
            (
                it.cseq
                for it in self.s["out"].values()
                if it.dst == dst and it.priority == priority and not it.superseded and it.cseq > 0
            ),
            default=0,
        )

    def out_pending(self, dst: str) -> bool:
        return any(
            it.dst == dst and (not it.inflight or not (it.received or it.superseded)) for it in self.s["out"].values()
        )

    def out_summary(self) -> list[tuple[str, int, int, int, int]]:
        rows: dict[tuple[str, int], list[int]] = {}
        for it in self.s["out"].values():
            r = rows.setdefault((it.dst, it.priority), [0, 0, 0])
            r[0 if not it.inflight else 1] += 1
            r[2] += it.size
        return [(d, p, *v) for (d, p), v in sorted(rows.items())]

    def member_acks(self, seq: int) -> dict[str, bool]:
        return dict(self.s["members"].get(seq, {}))

    def member_ack(self, seq: int, member: str, done: bool) -> None:
        self.s["members"].setdefault(seq, {})[member] = done

    def member_acks_prune(self) -> None:
        for seq in [s for s in self.s["members"] if s not in self.s["out"]]:
            del self.s["members"][seq]

    def mark_get(self, key: str) -> tuple[bytes, int] | None:
        return self.s["marks"].get(key)

    def mark_drop(self, keys: list[str]) -> None:
        for k in keys:
            self.s["marks"].pop(k, None)

    def mark_set(self, marks: dict[str, bytes], at_ms: int) -> None:
        for key, digest in marks.items():
            self.s["marks"][key] = (digest, at_ms)

    def marks_prune(self, before_ms: int) -> None:
        self.s["marks"] = {k: v for k, v in self.s["marks"].items() if v[1] > before_ms}

    # -- receiving side -------------------------------------------------------------------------
    def seen_has(self, origin: str, seq: int) -> bool:
        return (origin, seq) in self.s["seen"]

    def seen_add(self, origin: str, seq: int, expires_ms: int) -> None:
        if (origin, seq) in self.s["seen"]:
            raise ValueError(f"({origin}, {seq}) was seen already")
        self.s["seen"][(origin, seq)] = expires_ms

    def seen_prune(self, now_ms: int) -> None:
        self.s["seen"] = {k: v for k, v in self.s["seen"].items() if v > now_ms}

    def seen_next_expiry_ms(self) -> int | None:
        return min(self.s["seen"].values(), default=None)

    def latest_get(self, origin: str, key: str) -> int | None:
        return self.s["latest"].get((origin, key))

    def latest_set(self, origin: str, key: str, seq: int) -> None:
        self.s["latest"][(origin, key)] = seq

    def order_next(self, stream: str, priority: int) -> int:
        return self.s["order"].get((stream, priority), 1)

    def order_set(self, stream: str, priority: int, nxt: int) -> None:
        self.s["order"][(stream, priority)] = nxt

    def held_add(self, stream: str, cseq: int, d: Delivery) -> None:
        self.s["held"].setdefault((stream, int(d.priority)), {}).setdefault(cseq, copy.copy(d))

    def held_first(self, stream: str, priority: int, upto: int) -> tuple[int, Delivery] | None:
        h = self.s["held"].get((stream, priority), {})
        cs = [c for c in h if c <= upto]
        if not cs:
            return None
        c = min(cs)
        return c, copy.copy(h[c])

    def held_delete(self, stream: str, priority: int, cseq: int) -> None:
        h = self.s["held"].get((stream, priority))
        if h is not None:
            h.pop(cseq, None)
            if not h:
                del self.s["held"][(stream, priority)]

    def held_older(self, received_before_ms: int) -> list[tuple[str, int]]:
        return [k for k, h in self.s["held"].items() if any(d.received_ms <= received_before_ms for d in h.values())]

    def held_min(self, stream: str, priority: int) -> int | None:
        return min(self.s["held"].get((stream, priority), {}), default=None)

    def held_has(self, origin: str, seq: int) -> bool:
        return any(
            (stream == origin or stream.startswith(origin + ">")) and any(d.seq == seq for d in h.values())
            for (stream, _), h in self.s["held"].items()
        )

    def inbox_add(self, d: Delivery) -> None:
        self.s["inbox_id"] += 1
        d = copy.copy(d)
        d.id = self.s["inbox_id"]
        self.s["inbox"][d.id] = d

    def inbox(
        self, limit: int = 1000, app: str | None = None, exclude: Iterable[str] = (), after: int = 0
    ) -> list[Delivery]:
        exclude = set(exclude)
        out = [
            copy.copy(d)
            for i, d in sorted(self.s["inbox"].items())
            if i > after and (d.app == app if app is not None else d.app not in exclude)
        ]
        return out[:limit]

    def inbox_count(self) -> int:
        return len(self.s["inbox"])

    def inbox_has(self, origin: str, seq: int) -> bool:
        return any(d.origin == origin and d.seq == seq for d in self.s["inbox"].values())

    def inbox_pop(self, inbox_id: int) -> tuple[str, int] | None:
        d = self.s["inbox"].pop(inbox_id, None)
        return (d.origin, d.seq) if d else None

    def owed_add(self, kind: str, origin: str, seq: int) -> None:
        self.s["owed"][kind].add((origin, seq))

    def owed_remove(self, kind: str, origin: str, seqs: Iterable[int]) -> None:
        self.s["owed"][kind].difference_update((origin, s) for s in seqs)

    def owed(self, kind: str) -> list[tuple[str, int]]:
        return sorted(self.s["owed"][kind])


def _snapshot(s: dict) -> dict:
    """A copy to roll back to: containers copied two levels deep; the records in them are
    replaced, never changed in place, so they are shared."""
    out = {}
    for k, v in s.items():
        if isinstance(v, dict):
            out[k] = {kk: (vv.copy() if isinstance(vv, (dict, set, list)) else vv) for kk, vv in v.items()}
        elif isinstance(v, (list, set)):
            out[k] = v.copy()
        else:
            out[k] = v
    return out


def _nobody(it: OutItem) -> OutItem:
    c = copy.copy(it)
    c.body = b""
    return c


class _Tx:
    def __init__(self, store: MemoryStore, durable: bool):
        self.store, self.durable = store, durable

    def __enter__(self):
        st = self.store
        if st._depth and self.durable and not st._durable:
            raise RuntimeError("a durable custody change inside a relaxed transaction")
        if not st._depth:
            st._durable = self.durable
            st._snapshot = _snapshot(st.s)
        st._depth += 1
        return self

    def __exit__(self, et, ev, tb):
        st = self.store
        st._depth -= 1
        if not st._depth:
            if et is not None:
                st.s = st._snapshot  # a failure undoes the whole transaction
            st._snapshot = None
        return False
