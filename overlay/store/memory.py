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

from c2dtn.overlay.store import OUT_FIELDS, TABLES, OutItem, register


@register("memory")
class MemoryStore:
    def __init__(self):
        self.s: dict = {"counters": {}, "ids": {}, "out": {}, "members": {}}
        self.s.update({name: {} for name in TABLES})
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

    # -- keyed records (TABLES) ----------------------------------------------------------------
    def get(self, table: str, key: tuple) -> tuple | None:
        return self.s[table].get(tuple(key))

    def put(self, table: str, key: tuple, value: tuple) -> None:
        _check(table, key, value)
        self.s[table][tuple(key)] = tuple(value)

    def add(self, table: str, value: tuple) -> int:
        _check(table, (0,), value)
        ids = self.s["ids"]
        ids[table] = ids.get(table, 0) + 1
        self.s[table][(ids[table],)] = tuple(value)
        return ids[table]

    def delete(self, table: str, keys: Iterable[tuple]) -> None:
        rows = self.s[table]
        for k in keys:
            rows.pop(tuple(k), None)

    def scan(
        self,
        table: str,
        prefix: tuple = (),
        after: object = None,
        limit: int = -1,
        only: dict[str, object] | None = None,
        besides: dict[str, Iterable[object]] | None = None,
        keys_only: bool = False,
    ) -> list[tuple[tuple, tuple]]:
        t, n = TABLES[table], len(prefix)
        col = t.value.index
        only_at = [(col(c), v) for c, v in (only or {}).items()]
        besides_at = [(col(c), set(vs)) for c, vs in (besides or {}).items()]
        out = []
        for k in sorted(self.s[table]):
            v = self.s[table][k]
            if k[:n] != tuple(prefix) or (after is not None and not k[n] > after):  # type: ignore[operator]
                continue
            if any(v[i] != x for i, x in only_at) or any(v[i] in xs for i, xs in besides_at):
                continue
            if len(out) == limit:
                break
            out.append((k, () if keys_only else v))
        return out

    def due(self, table: str, upto_ms: int, limit: int = -1) -> list[tuple]:
        i = TABLES[table].value.index(TABLES[table].time or "")
        keys = sorted((v[i], k) for k, v in self.s[table].items() if v[i] <= upto_ms)
        return [k for _t, k in (keys if limit < 0 else keys[:limit])]

    def first_due(self, table: str) -> int | None:
        i = TABLES[table].value.index(TABLES[table].time or "")
        return min((v[i] for v in self.s[table].values()), default=None)

    def count(self, table: str) -> int:
        return len(self.s[table])


def _check(table: str, key: tuple, value: tuple) -> None:
    t = TABLES[table]
    if len(key) != len(t.key) or len(value) != len(t.value):
        raise ValueError(f"a record of {len(key)} keys and {len(value)} values for {table}{t.key + t.value}")


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
