"""The custody store's boundary: what a node keeps, as records, behind one interface.

Custody (custody.py) decides everything: quota, supersession, class order, dedupe, group
acks, what an ack releases; it answers every question about its outbox from an index in
memory (outbox.py).  A Store only keeps records: the outbox's, and keyed records in the
tables below, each operation one statement's worth of work, as dtn7-rs's `core/store`
puts its stores behind one trait.  Implementations are chosen by name
(`open_store("sqlite", ...)`):

  sqlite  store/sqlite.py: WAL, synchronous commits, survives kill -9 and power loss;
          what a node runs.
  memory  store/memory.py: dicts; nothing survives the process.  For unit tests of
          custody, the scheduler and the core (virtual time, no disk).

Records:
  outbox       OutItem per envelope accepted and not yet released (body apart), and per
               group envelope, which members said got / done (out_* and member_ack)
  counters     name -> value (bump, counter, counters)
  TABLES       keyed records (get, put, add, delete, scan, due, first_due, count):
    seen       (origin, seq) received -> until when it is remembered, where it went (inbox id)
    latest     (origin, supersession key) -> newest seq received
    order      (stream, class) -> next place in order expected
    held       (stream, class, place) -> an envelope waiting for a gap to fill
    inbox      (id) -> an envelope for the application (ids ascending, assigned by add)
    done, got  (origin, seq) acks owed: taken by the application / kept here
    marks      (key) -> digest, when set (a resent MQTT PUBLISH told from a new one)
    reports    (id) -> how an envelope ended without an ack (expired, superseded, ...)

Transactions: `transaction(durable)` groups calls; nested calls join the outer one,
whose `durable` decides whether the commit is fsynced.  A failure inside undoes the
whole transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from c2dtn.errors import C2Error
from c2dtn.overlay.envelope import Envelope, Kind, Priority


class QuotaExceeded(C2Error):
    pass


class TooLarge(C2Error, ValueError):
    """A message over envelope.MAX_MESSAGE_BYTES: refused at entry (HTTP 413, MQTT 0x95, CoAP 4.13)."""


REPORTS_KEPT = 10_000  # report rows a store keeps (the newest)

# where a durable commit is fsynced ([node] fsync): loop: before it returns (on the caller's
# thread, the event loop); thread: it returns unsynced and the syncer's thread makes it durable;
# auto: as thread, the syncer syncing on the loop while that is fast (overlay/syncer.py)
SYNC_MODES = ("auto", "thread", "loop")


class StoreFull(QuotaExceeded):
    """The store's disk is full: refused as a quota is (MQTT 5 0x97, HTTP 507), nothing of
    the refused change kept and nothing held before it lost; accepted again once space frees."""


@dataclass(frozen=True)
class Quota:
    max_envelopes: int = 100_000
    max_bytes: int = 256 << 20


# what of an outbox record changes once it is added (Store.out_put writes these)
OUT_FIELDS = ("inflight", "attempts", "sent_ms", "retry_ms", "received", "superseded")


@dataclass(slots=True)
class OutItem:
    seq: int
    dst: str
    priority: int
    cseq: int
    created_ms: int
    lifetime_ms: int
    expires_ms: int
    supersede: str | None
    app: str
    body: bytes
    size: int
    inflight: bool
    attempts: int
    sent_ms: int | None
    retry_ms: int | None
    received: bool = False
    superseded: bool = False

    def envelope(self, origin: str, floor: int, inc: int = 0) -> Envelope:
        return Envelope(
            Kind.DATA,
            origin,
            self.seq,
            self.dst,
            self.created_ms,
            self.lifetime_ms,
            Priority(self.priority),
            self.supersede,
            self.body,
            self.app,
            self.cseq,
            floor,
            inc=inc,
        )


@dataclass
class Delivery:
    """An envelope ready for the application (from the inbox), or held for order (id 0)."""

    id: int
    origin: str
    seq: int
    priority: Priority
    created_ms: int
    lifetime_ms: int
    supersede: str | None
    app: str
    body: bytes
    received_ms: int


@dataclass
class Received:
    """What happened to one incoming data envelope."""

    outcome: str  # "delivered", "held", "duplicate", "stale", "expired"
    released: int = 0  # how many envelopes went to the inbox as a result (incl. held ones)


@runtime_checkable
class Store(Protocol):
    # -- lifecycle -------------------------------------------------------------------------
    def transaction(self, durable: bool = True) -> AbstractContextManager: ...
    def close(self) -> None: ...
    def checkpoint(self) -> tuple[int, int]: ...

    # -- counters (a rolled-back transaction's changes are undone) ------------------------
    def bump(self, name: str, by: int = 1) -> int: ...
    def counter(self, name: str) -> int: ...
    def counters(self) -> dict[str, int]: ...

    # -- outbox: records only; custody's index (overlay/outbox.py) answers the questions ---------
    def out_add(self, items: list[OutItem]) -> None: ...  # new envelopes, with their bodies
    def out_put(self, items: list[OutItem]) -> None: ...  # their OUT_FIELDS
    def out_delete(self, seqs: Iterable[int]) -> None: ...  # with their bodies and member acks
    def out_bodies(self, seqs: Iterable[int]) -> dict[int, bytes]: ...  # about to be sealed
    # everything held, without bodies, in seq order; and the group envelopes' member -> done
    def out_load(self) -> tuple[list[OutItem], dict[int, dict[str, bool]]]: ...
    def member_ack(self, seq: int, member: str, done: bool) -> None: ...

    # -- keyed records (TABLES): keys and values are tuples of the table's columns ------------
    def get(self, table: str, key: tuple) -> tuple | None: ...
    def put(self, table: str, key: tuple, value: tuple) -> None: ...  # inserted, or replacing
    def add(self, table: str, value: tuple) -> int: ...  # keyed by a new id, above every one before
    def delete(self, table: str, keys: Iterable[tuple]) -> None: ...
    # in key order: those whose key starts with `prefix`, the next key column above `after`,
    # and whose value columns equal `only` / are in none of `besides`; values () with keys_only
    # (nothing else read: no body)
    def scan(
        self,
        table: str,
        prefix: tuple = (),
        after: object = None,
        limit: int = -1,
        only: dict[str, object] | None = None,
        besides: dict[str, Iterable[object]] | None = None,
        keys_only: bool = False,
    ) -> list[tuple[tuple, tuple]]: ...
    def due(self, table: str, upto_ms: int, limit: int = -1) -> list[tuple]: ...  # keys, time <= upto_ms
    def first_due(self, table: str) -> int | None: ...  # the earliest time in the table
    def count(self, table: str) -> int: ...


@dataclass(frozen=True)
class Table:
    key: tuple[str, ...]
    value: tuple[str, ...]
    time: str | None = None  # a value column `due` and `first_due` read (an index in SQLite)
    body: str | None = None  # a value column holding a message body (large ones in files)
    sql: str = ""  # the SQLite table's name where it is not the record's
    auto: bool = False  # keyed by the id `add` assigns


TABLES = {
    "seen": Table(("origin", "seq"), ("expires_ms", "place"), time="expires_ms"),
    "latest": Table(("origin", "key"), ("seq",)),
    "order": Table(("origin", "priority"), ("next_cseq",), sql="orderq"),
    "held": Table(
        ("origin", "priority", "cseq"),
        ("seq", "created_ms", "lifetime_ms", "supersede", "app", "body", "received_ms"),
        time="received_ms",
        body="body",
    ),
    "inbox": Table(
        ("id",),
        ("origin", "seq", "priority", "created_ms", "lifetime_ms", "supersede", "app", "body", "received_ms"),
        body="body",
        auto=True,
    ),
    "done": Table(("origin", "seq"), (), sql="acks"),
    "got": Table(("origin", "seq"), (), sql="gotq"),
    "marks": Table(("key",), ("digest", "at_ms"), time="at_ms"),
    "reports": Table(("id",), ("seq", "dst", "outcome", "at_ms", "created_ms", "supersede"), auto=True),
}


STORES: dict[str, Callable[..., Store]] = {}


def register(name: str):
    """Make a Store class available to open_store under `name`."""

    def deco(cls):
        STORES[name] = cls
        return cls

    return deco


def open_store(kind: str, path: str | Path | None = None, **kw) -> Store:
    """A store by name (`sqlite` needs a path; `memory` takes none)."""
    from c2dtn.overlay.store import memory, sqlite  # noqa: F401  (they register themselves)

    try:
        cls = STORES[kind]
    except KeyError:
        raise C2Error(f"unknown custody store {kind!r}: stores are {', '.join(sorted(STORES))}") from None
    return cls(path, **kw) if path is not None else cls(**kw)
