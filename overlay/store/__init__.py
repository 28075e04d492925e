"""The custody store's boundary: what a node keeps, as records, behind one interface.

Custody (custody.py) decides: quota, supersession, class order, group acks, what an
ack releases, and answers every question about its outbox from an index in memory
(outbox.py).  A Store only keeps records and answers questions about the receiving side,
each in one statement's worth of work, as dtn7-rs's `core/store` puts its stores behind
one trait.  Implementations are chosen by name (`open_store("sqlite", ...)`):

  sqlite  store/sqlite.py: WAL, synchronous commits, survives kill -9 and power loss;
          what a node runs.
  memory  store/memory.py: dicts; nothing survives the process.  For unit tests of
          custody, the scheduler and the core (virtual time, no disk).

Records:
  outbox       OutItem per envelope accepted and not yet released (body apart)
  member_acks  per group envelope, which members said got / done
  marks        key -> digest (a resent MQTT PUBLISH told from a new one)
  reports      how envelopes ended without an ack (expired, superseded, ...)
  counters     name -> value
  seen         (origin, seq) received, until an expiry
  latest       (origin, supersession key) -> newest seq received
  order        (stream, class) -> next place in order expected
  held         (stream, class, place) -> an envelope waiting for a gap to fill
  inbox        envelopes for the application (Delivery)
  done / got   (origin, seq) acks owed: taken by the application / held here

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

    # -- counters and reports ----------------------------------------------------------------
    def bump(self, name: str, by: int = 1) -> int: ...
    def counter(self, name: str) -> int: ...
    def counters(self) -> dict[str, int]: ...

    # reports are a log of the newest outcomes, bounded (the counters keep the totals): a
    # gateway superseding positions for weeks would otherwise grow its store without end
    reports_kept: int  # REPORTS_KEPT unless changed

    def report_add(
        self, seq: int, dst: str, outcome: str, at_ms: int, created_ms: int, supersede: str | None
    ) -> None: ...
    def reports(self, since_id: int = 0) -> list[tuple]: ...

    # -- outbox: records only; custody's index (overlay/outbox.py) answers the questions ---------
    def out_add(self, items: list[OutItem]) -> None: ...  # new envelopes, with their bodies
    def out_put(self, items: list[OutItem]) -> None: ...  # their OUT_FIELDS
    def out_delete(self, seqs: Iterable[int]) -> None: ...  # with their bodies and member acks
    def out_bodies(self, seqs: Iterable[int]) -> dict[int, bytes]: ...  # about to be sealed
    # everything held, without bodies, in seq order; and the group envelopes' member -> done
    def out_load(self) -> tuple[list[OutItem], dict[int, dict[str, bool]]]: ...
    def member_ack(self, seq: int, member: str, done: bool) -> None: ...
    def mark_get(self, key: str) -> tuple[bytes, int] | None: ...  # (digest, when set)
    def mark_drop(self, keys: list[str]) -> None: ...
    def mark_set(self, marks: dict[str, bytes], at_ms: int) -> None: ...  # key -> digest
    def marks_prune(self, before_ms: int) -> None: ...

    # -- receiving side -------------------------------------------------------------------------
    def seen_has(self, origin: str, seq: int) -> bool: ...
    def seen_add(self, origin: str, seq: int, expires_ms: int) -> None: ...
    def seen_prune(self, now_ms: int) -> None: ...
    def seen_next_expiry_ms(self) -> int | None: ...  # the earliest seen id's expiry
    def latest_get(self, origin: str, key: str) -> int | None: ...
    def latest_set(self, origin: str, key: str, seq: int) -> None: ...
    def order_next(self, stream: str, priority: int) -> int: ...  # 1 when never set
    def order_set(self, stream: str, priority: int, nxt: int) -> None: ...
    def held_add(self, stream: str, cseq: int, d: Delivery) -> None: ...  # d.priority is the class
    def held_first(self, stream: str, priority: int, upto: int) -> tuple[int, Delivery] | None: ...
    def held_delete(self, stream: str, priority: int, cseq: int) -> None: ...
    def held_older(self, received_before_ms: int) -> list[tuple[str, int]]: ...  # (stream, class) with such
    def held_min(self, stream: str, priority: int) -> int | None: ...
    def held_has(self, origin: str, seq: int) -> bool: ...  # in any of the origin's streams
    def inbox_add(self, d: Delivery) -> None: ...  # d.id is assigned by the store
    def inbox(
        self, limit: int = 1000, app: str | None = None, exclude: Iterable[str] = (), after: int = 0
    ) -> list[Delivery]: ...
    def inbox_count(self) -> int: ...  # envelopes waiting for the application (their bodies not read)
    def inbox_has(self, origin: str, seq: int) -> bool: ...
    def inbox_pop(self, inbox_id: int) -> tuple[str, int] | None: ...  # (origin, seq) of what left
    def owed_add(self, kind: str, origin: str, seq: int) -> None: ...  # kind: "done" | "got"
    def owed_remove(self, kind: str, origin: str, seqs: Iterable[int]) -> None: ...
    def owed(self, kind: str) -> list[tuple[str, int]]: ...  # (origin, seq), in that order


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
