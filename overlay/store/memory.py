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

from c2dtn.overlay.store import OUT_FIELDS, REPORTS_KEPT, Delivery, OutItem, register


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
    def out_add(self, items: list[OutItem]) -> None:
        for it in items:
            if it.seq in self.s["out"]:
                raise ValueError(f"outbox already holds seq {it.seq}")
            self.s["out"][it.seq] = copy.copy(it)

    def out_put(self, items: list[OutItem]) -> None:
        out = self.s["out"]
        for it in items:
            if it.seq in out:  # replaced, never changed in place (_snapshot)
                out[it.seq] = replace(out[it.seq], **{k: getattr(it, k) for k in OUT_FIELDS})

    def out_delete(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self.s["out"].pop(seq, None)
            self.s["members"].pop(seq, None)

    def out_bodies(self, seqs: Iterable[int]) -> dict[int, bytes]:
        out = self.s["out"]
        return {s: out[s].body for s in seqs if s in out}

    def out_load(self) -> tuple[list[OutItem], dict[int, dict[str, bool]]]:
        items = [_nobody(it) for _s, it in sorted(self.s["out"].items())]
        return items, {s: dict(m) for s, m in self.s["members"].items()}

    def member_ack(self, seq: int, member: str, done: bool) -> None:
        self.s["members"].setdefault(seq, {})[member] = done

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
