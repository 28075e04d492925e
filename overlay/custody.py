"""Persistent end-to-end custody (SQLite, WAL, synchronous commits).

What it keeps, per node:
- outbox: every envelope this node accepted, until the destination node acks it
  or its lifetime ends (then it is reported expired, never dropped silently);
- seen: ids of envelopes received, so a retransmission is never delivered twice;
- inbox: envelopes received and in order, waiting for the application to take
  them; held: envelopes that arrived ahead of a gap in their class's order;
- acks: ids the application has taken and the origin must hear about ("done":
  the origin releases custody); gotq: ids received and kept here but not yet
  taken ("got": the origin stops retransmitting them, and learns from what
  arrived after a missing one that it was lost);
- reports: envelopes that ended without an ack (expired, superseded, dropped);
- member_acks: for an envelope sent to a group, which members said "got" or
  "done"; it counts as received when all have it and is released when all took it.

Order on the receiving side is kept per stream: an origin's envelopes for this
node are one stream, its envelopes for each group another ("origin>group"), as
the origin numbers them (cseq) per destination.

No method reads the clock: every call that depends on time takes `now_ms`, so
tests run hours of custody in milliseconds.  Each public method is one
transaction (callers may group several in `transaction()`).

Durability: a transaction that takes custody or records what arrived (submit,
receive, consumed) is on disk when it returns (fsync of the WAL).  Bookkeeping
that can only cause a harmless repeat if a power cut undoes it (marking sent,
releasing acked envelopes, acks sent, retransmission times, expiry reports)
commits without its own fsync; in WAL mode it still reaches the disk in order,
with the next durable commit, so nothing is ever seen half done.

Checkpoints (copying the WAL into the database file): by default SQLite's own,
run inside whichever commit crosses 1,000 pages.  With background_checkpoints the
commits leave that to checkpoint(), which the node calls from a thread on a
second connection (PASSIVE: it neither waits for nor blocks a commit); a
megabyte envelope otherwise made every few commits stop for a checkpoint of
several megabytes on the message's path.  A commit still checkpoints itself past
BACKSTOP_PAGES, should the thread fall behind.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from c2dtn.errors import C2Error
from c2dtn.overlay.envelope import Envelope, Kind, Priority

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox(
  seq INTEGER PRIMARY KEY,
  dst TEXT NOT NULL,
  priority INTEGER NOT NULL,
  cseq INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  lifetime_ms INTEGER NOT NULL,
  expires_ms INTEGER NOT NULL,
  supersede TEXT,
  app TEXT NOT NULL DEFAULT '',
  size INTEGER NOT NULL,
  inflight INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  sent_ms INTEGER,
  retry_ms INTEGER,
  superseded INTEGER NOT NULL DEFAULT 0,
  received INTEGER NOT NULL DEFAULT 0
);
-- Bodies live apart from the outbox rows: marking a megabyte envelope sent, scanning sizes
-- or retry times must not rewrite or walk the body's overflow pages (schema version 2).
CREATE TABLE IF NOT EXISTS bodies(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TRIGGER IF NOT EXISTS outbox_body_gone AFTER DELETE ON outbox
  BEGIN DELETE FROM bodies WHERE seq = old.seq; END;
CREATE INDEX IF NOT EXISTS outbox_queue ON outbox(dst, inflight, priority, seq);
CREATE INDEX IF NOT EXISTS outbox_key ON outbox(dst, supersede);
CREATE INDEX IF NOT EXISTS outbox_expiry ON outbox(expires_ms);
CREATE TABLE IF NOT EXISTS seen(
  origin TEXT NOT NULL, seq INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
  PRIMARY KEY(origin, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS seen_expiry ON seen(expires_ms);
CREATE TABLE IF NOT EXISTS latest(
  origin TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY(origin, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS orderq(
  origin TEXT NOT NULL, priority INTEGER NOT NULL, next_cseq INTEGER NOT NULL,
  PRIMARY KEY(origin, priority)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS held(
  origin TEXT NOT NULL, priority INTEGER NOT NULL, cseq INTEGER NOT NULL, seq INTEGER NOT NULL,
  created_ms INTEGER NOT NULL, lifetime_ms INTEGER NOT NULL, supersede TEXT, app TEXT NOT NULL,
  body BLOB NOT NULL, received_ms INTEGER NOT NULL,
  PRIMARY KEY(origin, priority, cseq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  origin TEXT NOT NULL, seq INTEGER NOT NULL, priority INTEGER NOT NULL, created_ms INTEGER NOT NULL,
  lifetime_ms INTEGER NOT NULL, supersede TEXT, app TEXT NOT NULL, body BLOB NOT NULL,
  received_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS acks(
  origin TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY(origin, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gotq(
  origin TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY(origin, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reports(
  id INTEGER PRIMARY KEY AUTOINCREMENT, seq INTEGER NOT NULL, dst TEXT NOT NULL,
  outcome TEXT NOT NULL, at_ms INTEGER NOT NULL, created_ms INTEGER NOT NULL, supersede TEXT);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS marks(key TEXT PRIMARY KEY, digest BLOB NOT NULL, at_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS member_acks(
  seq INTEGER NOT NULL, member TEXT NOT NULL, done INTEGER NOT NULL,
  PRIMARY KEY(seq, member)) WITHOUT ROWID;
"""

SCHEMA_VERSION = 2
# version 1 -> 2: envelope bodies moved from outbox.body to their own table
MIGRATE_1_TO_2 = """
CREATE TABLE bodies(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
INSERT INTO bodies(seq, body) SELECT seq, body FROM outbox;
ALTER TABLE outbox DROP COLUMN body;
"""

# Seen ids are kept this long past the envelope's own expiry, so a copy that a
# BPA delivers late is still recognised.
SEEN_MARGIN_MS = 10 * 60 * 1000


class QuotaExceeded(C2Error):
    pass


@dataclass(frozen=True)
class Quota:
    max_envelopes: int = 100_000
    max_bytes: int = 256 << 20


@dataclass
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

    def envelope(self, origin: str, floor: int) -> Envelope:
        return Envelope(Kind.DATA, origin, self.seq, self.dst, self.created_ms, self.lifetime_ms,
                        Priority(self.priority), self.supersede, self.body, self.app, self.cseq, floor)


@dataclass
class Delivery:
    """An envelope ready for the application (from the inbox)."""

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


MARK_KEEP_MS = 7 * 24 * 3600 * 1000  # how long a mark (see submit_many) is remembered

_OUT_COLS = ("seq, dst, priority, cseq, created_ms, lifetime_ms, expires_ms, supersede, app, size, "
             "inflight, attempts, sent_ms, retry_ms, received")
# ... and the body, for what is about to be sealed
_OUT_WITH_BODY = f"SELECT {_OUT_COLS}, body FROM outbox JOIN bodies USING(seq)"


BACKSTOP_PAGES = 16384  # 64 MB of WAL: with background checkpoints, a commit checkpoints only past this


class CustodyStore:
    def __init__(self, path: str | Path, origin: str, quota: Quota = Quota(),
                 groups: dict[str, tuple[str, ...]] | None = None, background_checkpoints: bool = False):
        self.origin = origin
        self.quota = quota
        self.groups = dict(groups or {})  # group -> the other members
        self.path = str(path)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
        # a delivered or released message is overwritten on disk, not left in free pages (Debian's
        # SQLite does this by default, others do not: chosen here, whatever the build; costs a write
        # of each body's pages when it goes)
        self.db.execute("PRAGMA secure_delete=ON")
        self._sync = "FULL"
        self._tx_durable = False
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        fresh = not self.db.execute("SELECT 1 FROM sqlite_master WHERE name='outbox'").fetchone()
        if not fresh and version == 1:  # one transaction: a power cut leaves version 1 or 2, whole
            self.db.executescript("BEGIN IMMEDIATE;" + MIGRATE_1_TO_2 + "PRAGMA user_version=2; COMMIT;")
            version = 2
        if not fresh and version != SCHEMA_VERSION:
            raise C2Error(f"custody store {self.path} has schema version {version}, this c2dtn uses "
                          f"{SCHEMA_VERSION}: deliver or export what it holds with the c2dtn that wrote it")
        self.db.executescript(SCHEMA)
        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._ckpt_db: sqlite3.Connection | None = None
        self._ckpt_lock = threading.Lock()
        self._closed = False
        if background_checkpoints:
            self.db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")

    def close(self) -> None:
        with self._ckpt_lock:  # not under a checkpoint running in another thread
            self._closed = True
            if self._ckpt_db is not None:
                self._ckpt_db.close()
                self._ckpt_db = None
            self.db.close()

    def checkpoint(self) -> tuple[int, int]:
        """Copy what the WAL holds into the database file (PASSIVE); safe to call from one
        other thread than the store's own.  Returns (frames in the WAL, frames copied)."""
        with self._ckpt_lock:
            if self._closed:  # a call queued in an executor before close() ran
                return 0, 0
            if self._ckpt_db is None:
                self._ckpt_db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                self._ckpt_db.execute("PRAGMA synchronous=FULL")
            _busy, frames, copied = self._ckpt_db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return frames, copied

    # -- helpers -------------------------------------------------------
    def _tx(self, durable: bool = True):
        return _Tx(self, durable)

    def transaction(self, durable: bool = True):
        """Group several calls into one transaction (one fsync for a whole bundle)."""
        return _Tx(self, durable)

    def _counter(self, name: str) -> int:
        row = self.db.execute("SELECT value FROM counters WHERE name=?", (name,)).fetchone()
        return row[0] if row else 0

    def _bump(self, name: str, by: int = 1) -> int:
        return self.db.execute("INSERT INTO counters(name, value) VALUES(?, ?) ON CONFLICT(name) "
                               "DO UPDATE SET value = value + excluded.value RETURNING value", (name, by)).fetchone()[0]

    def counters(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT name, value FROM counters").fetchall())

    def count(self, name: str) -> int:
        return self._counter(name)

    # -- sending side ----------------------------------------------------
    def submit(self, dst: str, body: bytes, now_ms: int, lifetime_ms: int, priority: Priority = Priority.ROUTINE,
               supersede: str | None = None, app: str = "") -> int:
        return self.submit_many([(dst, body, lifetime_ms, priority, supersede, app)], now_ms)[0]

    def submit_many(self, items: Iterable[tuple[str, bytes, int, Priority, str | None, str]], now_ms: int,
                    marks: list[tuple[str, bytes, bool] | None] | None = None) -> list[int | None]:
        """Accept envelopes into custody in one durable transaction; returns their seqs.

        A newer envelope with a supersession key replaces any queued (not yet sent)
        older one to the same destination with the same key.  Over quota, nothing
        of the batch is accepted and QuotaExceeded says by how much.

        marks (one per item, or None): (key, digest, repeat).  The digest is remembered
        under the key in the same commit as the envelope; an item marked `repeat` whose
        key already holds the same digest was taken before and is skipped (seq None).
        This is how a resent MQTT PUBLISH (DUP flag, same packet id) after a gateway
        crash is told from a new one: the record and the envelope commit together."""
        items = list(items)
        marks = list(marks) if marks is not None else [None] * len(items)
        seqs: list[int | None] = []
        with self._tx():
            n, nbytes = self.db.execute("SELECT count(*), coalesce(sum(size), 0) FROM outbox").fetchone()
            add_bytes = sum(len(i[1]) for i in items)
            if n + len(items) > self.quota.max_envelopes or nbytes + add_bytes > self.quota.max_bytes:
                raise QuotaExceeded(
                    f"custody store full: {n} envelopes / {nbytes} bytes held, {len(items)} / {add_bytes} more "
                    f"would pass the quota of {self.quota.max_envelopes} / {self.quota.max_bytes}; "
                    "nothing of this batch was accepted")
            for (dst, body, lifetime_ms, priority, supersede, app), mark in zip(items, marks):
                if mark is not None:
                    key, digest, repeat = mark
                    if repeat:
                        row = self.db.execute("SELECT digest FROM marks WHERE key=?", (key,)).fetchone()
                        if row and row[0] == digest:
                            self._bump("repeats_skipped")
                            seqs.append(None)
                            continue
                    self.db.execute("INSERT OR REPLACE INTO marks(key, digest, at_ms) VALUES(?,?,?)",
                                    (key, digest, now_ms))
                seq = self._bump("next_seq")
                # An envelope with a supersession key is outside its class's order (cseq 0): the
                # receiver takes it at once, never held behind a lost one, and drops an older
                # copy of the key that arrives after a newer one (stale) -- newest wins, as
                # supersession means; only envelopes without a key wait for their turn.
                cseq = 0 if supersede is not None else self._bump(f"cseq:{dst}:{int(priority)}")
                if supersede is not None:
                    old = self.db.execute(
                        "SELECT seq, created_ms FROM outbox WHERE dst=? AND supersede=? AND inflight=0",
                        (dst, supersede)).fetchall()
                    for oseq, ocreated in old:
                        self.db.execute("DELETE FROM outbox WHERE seq=?", (oseq,))
                        self._report(oseq, dst, "superseded", now_ms, ocreated, supersede)
                    # copies already handed to the BPA are not sent again
                    self.db.execute("UPDATE outbox SET superseded=1 WHERE dst=? AND supersede=? AND inflight=1",
                                    (dst, supersede))
                self.db.execute(
                    "INSERT INTO outbox(seq, dst, priority, cseq, created_ms, lifetime_ms, expires_ms, supersede, "
                    "app, size) VALUES(?,?,?,?,?,?,?,?,?,?)",
                    (seq, dst, int(priority), cseq, now_ms, lifetime_ms, now_ms + lifetime_ms, supersede, app,
                     len(body)))
                self.db.execute("INSERT INTO bodies(seq, body) VALUES(?,?)", (seq, body))
                seqs.append(seq)
            self._bump("accepted", sum(1 for x in seqs if x is not None))
        return seqs

    def _report(self, seq: int, dst: str, outcome: str, now_ms: int, created_ms: int, supersede: str | None) -> None:
        self.db.execute("INSERT INTO reports(seq, dst, outcome, at_ms, created_ms, supersede) VALUES(?,?,?,?,?,?)",
                        (seq, dst, outcome, now_ms, created_ms, supersede))
        self._bump(outcome)

    def expire(self, now_ms: int) -> list[tuple[int, str]]:
        """End every envelope whose lifetime is over: reported 'expired'.  Returns (seq, dst)."""
        with self._tx(durable=False):
            rows = self.db.execute("SELECT seq, dst, created_ms, supersede, superseded FROM outbox "
                                   "WHERE expires_ms <= ?", (now_ms,)).fetchall()
            for seq, dst, created, sup, superseded in rows:
                self.db.execute("DELETE FROM outbox WHERE seq=?", (seq,))
                self._report(seq, dst, "superseded" if superseded else "expired", now_ms, created, sup)
            self.db.execute("DELETE FROM seen WHERE expires_ms <= ?", (now_ms,))
            self.db.execute("DELETE FROM marks WHERE at_ms <= ?", (now_ms - MARK_KEEP_MS,))
            if self.groups:  # what ended without every member's ack
                self.db.execute("DELETE FROM member_acks WHERE seq NOT IN (SELECT seq FROM outbox)")
        return [(r[0], r[1]) for r in rows]

    def queued(self, dst: str, limit: int = 1000) -> list[OutItem]:
        """Not yet sent, in sending order: strict priority, then oldest first."""
        rows = self.db.execute(f"{_OUT_WITH_BODY} WHERE dst=? AND inflight=0 "
                               "ORDER BY priority, seq LIMIT ?", (dst, limit)).fetchall()
        return [_item(r) for r in rows]

    def due_retries(self, now_ms: int) -> list[OutItem]:
        """In flight and past their retransmission time (superseded copies excluded)."""
        rows = self.db.execute(f"{_OUT_WITH_BODY} WHERE inflight=1 AND superseded=0 AND received=0 "
                               "AND retry_ms <= ? ORDER BY priority, seq", (now_ms,)).fetchall()
        return [_item(r) for r in rows]

    def drop_superseded_inflight(self, now_ms: int) -> int:
        """Superseded copies whose retransmission time came: never sent again, reported."""
        with self._tx(durable=False):
            rows = self.db.execute("SELECT seq, dst, created_ms, supersede FROM outbox WHERE inflight=1 AND "
                                   "superseded=1 AND retry_ms <= ?", (now_ms,)).fetchall()
            for seq, dst, created, sup in rows:
                self.db.execute("DELETE FROM outbox WHERE seq=?", (seq,))
                self.db.execute("DELETE FROM member_acks WHERE seq=?", (seq,))
                self._report(seq, dst, "superseded", now_ms, created, sup)
        return len(rows)

    def has_pending(self, dsts: Iterable[str]) -> bool:
        """Is anything for these destinations not yet sent, or sent and not yet there?"""
        return any(self.db.execute("SELECT 1 FROM outbox WHERE dst=? AND (inflight=0 OR received=0) LIMIT 1",
                                   (d,)).fetchone() for d in dsts)

    def next_retry_ms(self) -> int | None:
        row = self.db.execute("SELECT min(retry_ms) FROM outbox WHERE inflight=1 AND received=0").fetchone()
        return row[0]

    def next_expiry_ms(self) -> int | None:
        return self.db.execute("SELECT min(expires_ms) FROM outbox").fetchone()[0]

    def destinations(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT dst FROM outbox").fetchall()]

    def inflight_bytes(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT dst, sum(size) FROM outbox WHERE inflight=1 AND superseded=0 "
                                    "AND received=0 GROUP BY dst").fetchall())

    def floor(self, dst: str, priority: int) -> int:
        """The oldest place in the class's order the receiver must still wait for.  Superseded
        copies do not count: they are never sent again, so a lost one must not hold back the
        newer envelopes behind it."""
        row = self.db.execute("SELECT min(cseq) FROM outbox WHERE dst=? AND priority=? AND superseded=0 "
                              "AND cseq > 0", (dst, priority)).fetchone()
        return row[0] or 0

    def mark_sent(self, seqs: list[int], now_ms: int, retry_at_ms: dict[int, int]) -> None:
        with self._tx(durable=False):
            for s in seqs:
                self.db.execute("UPDATE outbox SET inflight=1, attempts=attempts+1, sent_ms=?, retry_ms=? "
                                "WHERE seq=?", (now_ms, retry_at_ms[s], s))
            self._bump("sent", len(seqs))

    def inflight(self, dst: str, lacking: str | None = None, sent_before_ms: int | None = None,
                 retry_after_ms: int | None = None, limit: int = -1) -> list[OutItem]:
        """What is in flight to dst and not there yet (superseded copies excluded), in
        sending order, bodies left out; `lacking`: for a group, only what that member has
        not acked; only what was sent before `sent_before_ms`, or is due for its retry after
        `retry_after_ms`, when given.  The scheduler decides what of it is lost."""
        where, args = "", [dst]
        if lacking:
            where, args = where + " AND seq NOT IN (SELECT seq FROM member_acks WHERE member=?)", args + [lacking]
        if sent_before_ms is not None:
            where, args = where + " AND sent_ms < ?", args + [sent_before_ms]
        if retry_after_ms is not None:
            where, args = where + " AND retry_ms > ?", args + [retry_after_ms]
        rows = self.db.execute(f"SELECT {_OUT_COLS} FROM outbox WHERE dst=? AND inflight=1 AND received=0 AND "
                               f"superseded=0{where} ORDER BY priority, seq LIMIT ?", args + [limit]).fetchall()
        return [_item(r) for r in rows]

    def last_sent_ms(self, dst: str) -> int:
        """When anything in flight to dst (there or not) was last sent; 0 if nothing is."""
        return self.db.execute("SELECT max(sent_ms) FROM outbox WHERE dst=? AND inflight=1", (dst,)).fetchone()[0] or 0

    def set_retry(self, retry_at_ms: dict[int, int]) -> None:
        """New retransmission times for envelopes in flight."""
        with self._tx(durable=False):
            self.db.executemany("UPDATE outbox SET retry_ms=? WHERE seq=?", [(t, s) for s, t in retry_at_ms.items()])

    def ack_from(self, member: str, done: Iterable[int], got: Iterable[int]) -> tuple[list[OutItem], list[OutItem]]:
        """An ack from `member`: (released, arrived).  An envelope sent to that member alone is
        released on "done" and stops being retransmitted on "got"; one sent to a group that
        member is in waits for every member: received when all have it, released when all
        took it.  `arrived` is what this member newly holds (round-trip samples, window).
        Ids of envelopes for other destinations are ignored: a peer cannot release them."""
        released, arrived = [], []
        with self._tx(durable=False):
            for s, is_done in [(x, True) for x in done] + [(x, False) for x in got]:
                row = self.db.execute(f"SELECT {_OUT_COLS} FROM outbox WHERE seq=?", (s,)).fetchone()
                if row is None:
                    continue  # a second ack, or one for an envelope that expired meanwhile
                it = _item(row)
                if it.dst == member:
                    if is_done:
                        self.db.execute("DELETE FROM outbox WHERE seq=?", (s,))
                        released.append(it)
                    elif not it.received:
                        self.db.execute("UPDATE outbox SET received=1 WHERE seq=?", (s,))
                    if not it.received:
                        arrived.append(it)
                    continue
                members = self.groups.get(it.dst)
                if not members or member not in members:
                    self._bump("acks_not_theirs")
                    continue
                prev = self.db.execute("SELECT done FROM member_acks WHERE seq=? AND member=?", (s, member)).fetchone()
                if prev is None or (is_done and not prev[0]):
                    self.db.execute("INSERT INTO member_acks(seq, member, done) VALUES(?,?,?) ON CONFLICT(seq, member)"
                                    " DO UPDATE SET done=excluded.done", (s, member, int(is_done)))
                if prev is None:
                    arrived.append(it)
                n, ndone = self.db.execute("SELECT count(*), coalesce(sum(done), 0) FROM member_acks WHERE seq=?",
                                           (s,)).fetchone()
                if ndone >= len(members):
                    self.db.execute("DELETE FROM outbox WHERE seq=?", (s,))
                    self.db.execute("DELETE FROM member_acks WHERE seq=?", (s,))
                    released.append(it)
                elif n >= len(members) and not it.received:
                    self.db.execute("UPDATE outbox SET received=1 WHERE seq=?", (s,))
            if released:
                self._bump("acked", len(released))
        return released, arrived

    def held_out(self) -> tuple[int, int]:
        return self.db.execute("SELECT count(*), coalesce(sum(size), 0) FROM outbox").fetchone()

    def queue_summary(self) -> list[tuple[str, int, int, int, int]]:
        """(dst, priority, queued, in flight, bytes) rows."""
        return self.db.execute("SELECT dst, priority, sum(inflight=0), sum(inflight=1), sum(size) FROM outbox "
                               "GROUP BY dst, priority ORDER BY dst, priority").fetchall()

    def reports(self, since_id: int = 0) -> list[tuple]:
        return self.db.execute("SELECT id, seq, dst, outcome, at_ms, created_ms, supersede FROM reports "
                               "WHERE id > ? ORDER BY id", (since_id,)).fetchall()

    # -- receiving side --------------------------------------------------
    def receive(self, env: Envelope, now_ms: int) -> Received:
        """Take one data envelope from a peer: dedupe, drop stale superseded, keep class order."""
        stream = env.origin if env.dst == self.origin else f"{env.origin}>{env.dst}"
        with self._tx():
            if self.db.execute("SELECT 1 FROM seen WHERE origin=? AND seq=?", (env.origin, env.seq)).fetchone():
                self._bump("duplicates")
                # the origin did not hear: tell it again, "got" if still here, "done" if taken
                table = "gotq" if self._pending(env.origin, env.seq) else "acks"
                self.db.execute(f"INSERT OR IGNORE INTO {table}(origin, seq) VALUES(?,?)", (env.origin, env.seq))
                return Received("duplicate")
            self.db.execute("INSERT INTO seen(origin, seq, expires_ms) VALUES(?,?,?)",
                            (env.origin, env.seq, max(env.expires_ms(), now_ms) + SEEN_MARGIN_MS))
            if env.expires_ms() <= now_ms:
                self._bump("received_expired")
                self.db.execute("INSERT OR IGNORE INTO acks(origin, seq) VALUES(?,?)", (env.origin, env.seq))
                return Received("expired")
            if env.supersede is not None:
                row = self.db.execute("SELECT seq FROM latest WHERE origin=? AND key=?",
                                      (env.origin, env.supersede)).fetchone()
                if row and row[0] > env.seq:
                    self._bump("received_stale")
                    self.db.execute("INSERT OR IGNORE INTO acks(origin, seq) VALUES(?,?)", (env.origin, env.seq))
                    # a stale envelope still fills its place in the class's order
                    nxt = self._next(stream, int(env.priority))
                    self._advance(stream, int(env.priority),
                                  max(env.floor, env.cseq + 1 if env.cseq == nxt else 0), now_ms)
                    return Received("stale")
                self.db.execute("INSERT INTO latest(origin, key, seq) VALUES(?,?,?) ON CONFLICT(origin, key) "
                                "DO UPDATE SET seq=excluded.seq", (env.origin, env.supersede, env.seq))
            prio = int(env.priority)
            self.db.execute("INSERT OR IGNORE INTO gotq(origin, seq) VALUES(?,?)", (env.origin, env.seq))
            nxt = self._next(stream, prio)
            in_turn = env.cseq == nxt and env.floor <= nxt  # the very one the order waits for
            if env.cseq == 0 or env.cseq < max(nxt, env.floor) or in_turn:
                # unordered, older than what the order already passed, or in its turn (the
                # common case: straight to the inbox, never written to `held` and deleted;
                # nothing held is older, held ones all wait for a later turn)
                self._to_inbox(env.origin, env.seq, prio, env.created_ms, env.lifetime_ms, env.supersede,
                               env.app, env.body, now_ms)
                released = 1 + self._advance(stream, prio, nxt + 1 if in_turn else env.floor, now_ms)
                return Received("delivered", released)
            self.db.execute("INSERT OR IGNORE INTO held(origin, priority, cseq, seq, created_ms, lifetime_ms, "
                            "supersede, app, body, received_ms) VALUES(?,?,?,?,?,?,?,?,?,?)",
                            (stream, prio, env.cseq, env.seq, env.created_ms, env.lifetime_ms, env.supersede,
                             env.app, env.body, now_ms))
            released = self._advance(stream, prio, env.floor, now_ms)
            return Received("delivered" if released else "held", released)

    def _pending(self, origin: str, seq: int) -> bool:
        return bool(self.db.execute("SELECT 1 FROM inbox WHERE origin=? AND seq=? UNION ALL "
                                    "SELECT 1 FROM held WHERE (origin=? OR (origin>? AND origin<?)) AND seq=?",
                                    (origin, seq, origin, origin + ">", origin + "?", seq)).fetchone())

    def _next(self, origin: str, prio: int) -> int:
        row = self.db.execute("SELECT next_cseq FROM orderq WHERE origin=? AND priority=?", (origin, prio)).fetchone()
        return row[0] if row else 1

    def _advance(self, origin: str, prio: int, floor: int, now_ms: int) -> int:
        """Move the class's order of a stream (`origin`, or `origin>group`) up to at least
        `floor` (the sender holds nothing older), releasing held envelopes while they are
        contiguous."""
        nxt = max(self._next(origin, prio), floor)
        released = 0
        while True:
            row = self.db.execute("SELECT cseq, seq, created_ms, lifetime_ms, supersede, app, body FROM held "
                                  "WHERE origin=? AND priority=? AND cseq<=? ORDER BY cseq LIMIT 1",
                                  (origin, prio, nxt)).fetchone()
            if row is None:
                break
            cseq, seq, created, lifetime, sup, app, body = row
            self.db.execute("DELETE FROM held WHERE origin=? AND priority=? AND cseq=?", (origin, prio, cseq))
            self._to_inbox(origin.split(">", 1)[0], seq, prio, created, lifetime, sup, app, body, now_ms)
            released += 1
            nxt = max(nxt, cseq + 1)
        self.db.execute("INSERT INTO orderq(origin, priority, next_cseq) VALUES(?,?,?) ON CONFLICT(origin, priority) "
                        "DO UPDATE SET next_cseq=excluded.next_cseq", (origin, prio, nxt))
        return released

    def _to_inbox(self, origin, seq, prio, created, lifetime, sup, app, body, now_ms) -> None:
        self.db.execute("INSERT INTO inbox(origin, seq, priority, created_ms, lifetime_ms, supersede, app, body, "
                        "received_ms) VALUES(?,?,?,?,?,?,?,?,?)",
                        (origin, seq, prio, created, lifetime, sup, app, body, now_ms))
        self._bump("delivered")

    def release_held(self, older_than_ms: int, now_ms: int) -> int:
        """Give up waiting for a gap: envelopes held since before `older_than_ms` go to the inbox."""
        if not self.db.execute("SELECT 1 FROM held WHERE received_ms <= ? LIMIT 1", (older_than_ms,)).fetchone():
            return 0
        with self._tx():
            rows = self.db.execute("SELECT DISTINCT origin, priority FROM held WHERE received_ms <= ?",
                                   (older_than_ms,)).fetchall()
            n = 0
            for origin, prio in rows:
                first = self.db.execute("SELECT min(cseq) FROM held WHERE origin=? AND priority=?",
                                        (origin, prio)).fetchone()[0]
                n += self._advance(origin, prio, first, now_ms)
            if n:
                self._bump("gaps_skipped", len(rows))
        return n

    def inbox(self, limit: int = 1000, app: str | None = None, exclude: Iterable[str] = (),
              after: int = 0) -> list[Delivery]:
        """Envelopes waiting for the application, oldest first (only those of `app` when given,
        none of the apps in `exclude`, only ids above `after`)."""
        exclude = list(exclude)
        where, args = "WHERE id > ? ", [after]
        if app is not None:
            where, args = where + "AND app=? ", [*args, app]
        elif exclude:
            where, args = where + f"AND app NOT IN ({','.join('?' * len(exclude))}) ", [*args, *exclude]
        rows = self.db.execute("SELECT id, origin, seq, priority, created_ms, lifetime_ms, supersede, app, body, "
                               f"received_ms FROM inbox {where}ORDER BY id LIMIT ?", [*args, limit]).fetchall()
        return [Delivery(r[0], r[1], r[2], Priority(r[3]), *r[4:]) for r in rows]

    def consumed(self, ids: Iterable[int]) -> None:
        """The application has taken these: they leave the inbox and their origin gets an ack."""
        with self._tx():
            for i in ids:
                row = self.db.execute("SELECT origin, seq FROM inbox WHERE id=?", (i,)).fetchone()
                if row:
                    self.db.execute("DELETE FROM inbox WHERE id=?", (i,))
                    self.db.execute("DELETE FROM gotq WHERE origin=? AND seq=?", row)
                    self.db.execute("INSERT OR IGNORE INTO acks(origin, seq) VALUES(?,?)", row)

    def pending_acks(self) -> dict[str, tuple[list[int], list[int]]]:
        """origin -> (done, got): what each origin must hear about."""
        out: dict[str, tuple[list[int], list[int]]] = {}
        for origin, seq in self.db.execute("SELECT origin, seq FROM acks ORDER BY origin, seq"):
            out.setdefault(origin, ([], []))[0].append(seq)
        for origin, seq in self.db.execute("SELECT origin, seq FROM gotq ORDER BY origin, seq"):
            out.setdefault(origin, ([], []))[1].append(seq)
        return out

    def acks_sent(self, origin: str, done: Iterable[int], got: Iterable[int] = ()) -> None:
        with self._tx(durable=False):
            self.db.executemany("DELETE FROM acks WHERE origin=? AND seq=?", [(origin, s) for s in done])
            self.db.executemany("DELETE FROM gotq WHERE origin=? AND seq=?", [(origin, s) for s in got])

    def count_event(self, name: str, by: int = 1) -> None:
        with self._tx(durable=False):
            self._bump(name, by)


def _item(r) -> OutItem:
    """An OutItem from _OUT_COLS (+ body when selected with _OUT_WITH_BODY; else b"")."""
    return OutItem(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[15] if len(r) > 15 else b"", r[9],
                   bool(r[10]), r[11], r[12], r[13], bool(r[14]))


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT; nested calls join the outer transaction.  SQLite
    fixes the fsync policy before BEGIN, so the outermost caller decides whether
    the commit is durable; a durable call inside a relaxed transaction is a bug."""

    def __init__(self, store: CustodyStore, durable: bool):
        self.store = store
        self.durable = durable
        self.outer = False

    def __enter__(self):
        st = self.store
        if st.db.in_transaction:
            if self.durable and not st._tx_durable:
                raise RuntimeError("a durable custody change inside a relaxed transaction")
            return self
        want = "FULL" if self.durable else "NORMAL"
        if want != st._sync:
            st.db.execute(f"PRAGMA synchronous={want}")
            st._sync = want
        st.db.execute("BEGIN IMMEDIATE")
        st._tx_durable = self.durable
        self.outer = True
        return self

    def __exit__(self, et, ev, tb):
        if self.outer:
            self.store.db.execute("ROLLBACK" if et else "COMMIT")
        return False
