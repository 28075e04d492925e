"""The SQLite custody store (WAL, synchronous commits): records only, see store/__init__.py.

Durability: a durable transaction (what takes custody or records what arrived) is on
disk when it returns (fsync of the WAL) -- with sync="loop".  With sync="thread" it
commits without the fsync and counts itself in `commits`; sync_wal(), called from one
other thread (overlay/syncer.py), fsyncs the WAL, after which every commit counted
before the call is on disk: one fsync for all commits made meanwhile (group commit),
and the event loop never waits on the disk.  Whoever makes a commit's outcome seen
outside (an MQTT PUBACK, a bundle to the agent) waits for that fsync first.
Bookkeeping that can only cause a harmless repeat if a power cut undoes it commits
without its own fsync; in WAL mode it still reaches the disk in order, with the next
durable commit, so nothing is ever seen half done.

Checkpoints (copying the WAL into the database file): by default SQLite's own, run
inside whichever commit crosses 1,000 pages.  With background_checkpoints the commits
leave that to checkpoint(), which the node calls from a thread on a second connection
(PASSIVE: it neither waits for nor blocks a commit); a megabyte envelope otherwise made
every few commits stop for a checkpoint of several megabytes on the message's path.  A
commit still checkpoints itself past BACKSTOP_PAGES, should the thread fall behind.

Large bodies (FILE_BODY_BYTES and up) live in files of their own, in the folder
`<store>.bodies` beside the database; the body column then holds the file's name (TEXT,
where a body held in the row is a BLOB).  SQLite's own measurements ("Internal Versus
External BLOBs") put the turn near 100 kB with 4 KB pages, for reading; here, writing as
well, near 200 kB (FILE_BODY_BYTES; decision 0006).  Rules that keep a
row and its file together:
- a row never names a file that is not on disk: a transaction's files are written and
  fsynced (and the folder once) by its COMMIT, whatever the transaction's durability --
  only those a row still names then: a body taken and dropped in one transaction (a ping
  answered in the commit that took it) is never written.  Those read to go out (to be
  sealed) are written meanwhile in a thread of the store's (_start_writes); the COMMIT waits;
- a file goes only once the commit that dropped its row is on disk: reap() (the checkpoint
  thread, or after a durable commit with sync="loop", or close) fsyncs the WAL, then
  overwrites each such file with zeros, fsyncs and unlinks it (as secure_delete does for
  bodies in pages: a released message is not left readable on the disk);
- a file no row names (a crash between the two) is removed when the store is opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from c2dtn.errors import C2Error
from c2dtn.overlay.store import SYNC_MODES, TABLES, OutItem, StoreFull, Table, register
from c2dtn.private import private_sqlite

log = logging.getLogger("c2dtn.overlay")

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
-- the outbox is read whole when custody opens the store and by its primary key after that:
-- custody's index in memory answers every question about it (overlay/outbox.py), so a row
-- costs no secondary index's upkeep (schema version 5 dropped them)
CREATE TABLE IF NOT EXISTS seen(
  origin TEXT NOT NULL, seq INTEGER NOT NULL, expires_ms INTEGER NOT NULL, place INTEGER NOT NULL DEFAULT 0,
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
-- the time columns `due` reads (store/__init__.py TABLES)
CREATE INDEX IF NOT EXISTS marks_at ON marks(at_ms);
CREATE INDEX IF NOT EXISTS held_received ON held(received_ms);

CREATE TABLE IF NOT EXISTS member_acks(
  seq INTEGER NOT NULL, member TEXT NOT NULL, done INTEGER NOT NULL,
  PRIMARY KEY(seq, member)) WITHOUT ROWID;
-- bodies kept in files (the column holds the file's name, TEXT): only those rows are indexed,
-- so the files a store names are listed without walking its rows (when it is opened)
CREATE INDEX IF NOT EXISTS bodies_files ON bodies(body) WHERE typeof(body)='text';
CREATE INDEX IF NOT EXISTS inbox_files ON inbox(body) WHERE typeof(body)='text';
CREATE INDEX IF NOT EXISTS held_files ON held(body) WHERE typeof(body)='text';
"""

SCHEMA_VERSION = 5
# version 4 -> 5: the outbox's questions answered by custody's index (overlay/outbox.py):
# its secondary indexes and the totals kept in counters go (the new indexes come with SCHEMA);
# a seen id says where its envelope went (custody's _kept: an inbox id, -1 held, 0 not kept),
# where a copy searched the inbox and the held rows, each without an index
MIGRATE_4_TO_5 = """
CREATE INDEX migrate_inbox_source ON inbox(origin, seq);
UPDATE seen SET place = coalesce((SELECT id FROM inbox WHERE inbox.origin = seen.origin AND inbox.seq = seen.seq), 0);
UPDATE seen SET place = -1 WHERE place = 0 AND (origin, seq) IN (SELECT CASE WHEN instr(origin, '>')
  THEN substr(origin, 1, instr(origin, '>') - 1) ELSE origin END, seq FROM held);
DROP INDEX migrate_inbox_source;
DROP INDEX IF EXISTS outbox_queue;
DROP INDEX IF EXISTS outbox_expiry;
DROP INDEX IF EXISTS outbox_keyed;
DROP INDEX IF EXISTS outbox_retry_open;
DROP INDEX IF EXISTS outbox_open;
DROP INDEX IF EXISTS outbox_wire;
DROP INDEX IF EXISTS outbox_floor;
DELETE FROM counters WHERE name IN ('held_envelopes', 'held_bytes');
DELETE FROM member_acks WHERE seq NOT IN (SELECT seq FROM outbox);
"""
# version 3 -> 4: large bodies in files (the *_files indexes come with SCHEMA); a store of
# version 3 holds none, so nothing moves
# version 2 -> 3: the outbox's totals kept in counters (the quota check no longer counts
# the outbox on every submit); the indexes come with SCHEMA
MIGRATE_2_TO_3 = """
INSERT OR REPLACE INTO counters(name, value) SELECT 'held_envelopes', count(*) FROM outbox;
INSERT OR REPLACE INTO counters(name, value) SELECT 'held_bytes', coalesce(sum(size), 0) FROM outbox;
"""
# version 1 -> 2: envelope bodies moved from outbox.body to their own table
MIGRATE_1_TO_2 = """
CREATE TABLE bodies(seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
INSERT INTO bodies(seq, body) SELECT seq, body FROM outbox;
ALTER TABLE outbox DROP COLUMN body;
"""

WAL_KEEP_BYTES = 4 << 20
# bodies of this size and up are kept in files (module doc).  Measured (a ping through two
# cores, no sockets, the files' removal off the timed path as the node has it): per round trip
# 100 kB 5.3 ms in rows against 6.3 in files, 200 kB even (7.5), 400 kB 12.3 against 10.2,
# 1 MB 30.3 against 20.9: a file costs fsyncs of its own (file and folder) where rows share
# their commit's
FILE_BODY_BYTES = 256 * 1024
FRESH_BYTES = 8 << 20  # the last bodies written to files, kept to be read back (SqliteStore._fresh)
_ZEROS = bytes(1 << 20)
BACKSTOP_PAGES = 16384  # 64 MB of WAL: with background checkpoints, a commit checkpoints only past this

_OUT_COLS = (
    "seq, dst, priority, cseq, created_ms, lifetime_ms, expires_ms, supersede, app, size, "
    "inflight, attempts, sent_ms, retry_ms, received, superseded"
)


def _chunks(seqs: Iterable[int], size: int = 500) -> Iterator[list[int]]:
    """Ids in lists short enough for one statement's parameters."""
    seqs = list(seqs)
    for i in range(0, len(seqs), size):
        yield seqs[i : i + size]


def _marks(chunk: list) -> str:
    return ",".join("?" * len(chunk))


def _item(r, body: bytes = b"") -> OutItem:
    """An OutItem from _OUT_COLS."""
    return OutItem(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        r[6],
        r[7],
        r[8],
        body,
        r[9],
        bool(r[10]),
        r[11],
        r[12],
        r[13],
        bool(r[14]),
        bool(r[15]),
    )


@register("sqlite")
class SqliteStore:
    def __init__(self, path: str | Path, background_checkpoints: bool = False, sync: str = "loop"):
        if sync not in SYNC_MODES:
            raise C2Error(f"custody store sync {sync!r}: one of {', '.join(SYNC_MODES)}")
        self.path = str(path)
        self.sync = sync
        self.commits = 0  # durable commits so far (sync="thread": on disk once sync_wal() ran after them)
        self._wal_fd: int | None = None
        self._wal_lock = threading.Lock()
        private_sqlite(self.path)  # every order is in it: 0600 in a 0700 folder
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
        # the WAL grows with a backlog (and while a full disk stops checkpoints); once drained and
        # checkpointed, SQLite truncates it to this when it starts over, so an edge box's small
        # card gets that room back (without it the WAL keeps its largest size until the store
        # is closed; perf diskfull measured 6.8 MB of WAL holding nothing on a 16 MB disk)
        self.db.execute(f"PRAGMA journal_size_limit={WAL_KEEP_BYTES}")
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
        if not fresh and version == 2:
            self.db.executescript("BEGIN IMMEDIATE;" + SCHEMA + MIGRATE_2_TO_3 + "PRAGMA user_version=3; COMMIT;")
            version = 3
        if not fresh and version == 3:
            self.db.executescript("BEGIN IMMEDIATE;" + SCHEMA + "PRAGMA user_version=4; COMMIT;")
            version = 4
        if not fresh and version == 4:
            cols = [r[1] for r in self.db.execute("PRAGMA table_info(seen)")]
            place = "" if "place" in cols else "ALTER TABLE seen ADD COLUMN place INTEGER NOT NULL DEFAULT 0;"
            self.db.executescript(
                "BEGIN IMMEDIATE;" + place + SCHEMA + MIGRATE_4_TO_5 + "PRAGMA user_version=5; COMMIT;"
            )
            version = 5
        if not fresh and version != SCHEMA_VERSION:
            raise C2Error(
                f"custody store {self.path} has schema version {version}, this c2dtn uses "
                f"{SCHEMA_VERSION}: deliver or export what it holds with the c2dtn that wrote it"
            )
        self.db.executescript(SCHEMA)
        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._sql: dict[str, str] = {}  # statements by shape (_q)
        self._counts: dict[str, int] = dict(self.db.execute("SELECT name, value FROM counters").fetchall())
        self._before: dict[str, int | None] = {}  # counters changed in the open transaction: old values
        self._ckpt_db: sqlite3.Connection | None = None
        self._ckpt_lock = threading.Lock()
        self._closed = False
        self.background = background_checkpoints
        if background_checkpoints:
            self.db.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
        self.files = Path(self.path + ".bodies")  # large bodies (module doc)
        self._dir_fd: int | None = None
        self._tx_bodies: dict[str, bytes] = {}  # files the open transaction names: written at its commit
        self._tx_files: list[str] = []  # ... those written so far (removed if the commit fails)
        self._tx_writing: dict[str, Future] = {}  # ... those being written already (_start_writes)
        self._writer: ThreadPoolExecutor | None = None
        self._tx_doomed: list[str] = []  # files whose rows the open transaction dropped
        self._doomed: list[str] = []  # ... committed: removed by reap() (under _reap_lock)
        self._reap_lock = threading.Lock()
        self._reap_failing = False  # (logged once per spell)
        # the bodies last written to files, by name: most are read back at once (a submit is
        # planned, an arrival delivered), and a megabyte read costs ~0.4 ms here
        self._fresh: OrderedDict[str, bytes] = OrderedDict()
        self._fresh_bytes = 0
        self._remove_unnamed()

    # -- lifecycle -----------------------------------------------------------------------
    def transaction(self, durable: bool = True):
        return _Tx(self, durable)

    def sync_wal(self) -> None:
        """fsync the WAL: every commit that returned before this call is on disk after it.
        Safe to call from one other thread (the syncer) while the store's own commits go on:
        the fsync is of the file, not of SQLite's connection.  Raises OSError as fsync does
        (after which what it covered is not known to be on disk)."""
        with self._wal_lock:
            if self._closed:
                return
            if self._wal_fd is None:  # the -wal file lives as long as the store is open (WAL mode)
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
            os.fsync(self._wal_fd)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
        if not self._closed:
            self.reap()
        with self._wal_lock:
            if self._wal_fd is not None:
                os.close(self._wal_fd)
                self._wal_fd = None
            self._closed = True
        with self._ckpt_lock:  # not under a checkpoint running in another thread
            self._closed = True
            if self._ckpt_db is not None:
                self._ckpt_db.close()
                self._ckpt_db = None
            self.db.close()
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None

    # -- bodies kept in files (module doc) -------------------------------------------------
    def _put(self, body: bytes) -> bytes | str:
        """What the body column holds: the body itself, or the name of the file it goes to:
        written and fsynced at the transaction's COMMIT (_files_to_disk), and only if a row
        still names it then (a ping taken and answered in one commit: its megabyte never
        touches the disk, where it cost a write and an fsync on the round trip's path, and a
        shredding after it)."""
        if len(body) < FILE_BODY_BYTES:
            return body
        name = secrets.token_hex(8)
        self._tx_bodies[name] = body
        self._fresh[name] = body
        self._fresh_bytes += len(body)
        while self._fresh_bytes > FRESH_BYTES:
            self._fresh_bytes -= len(self._fresh.popitem(last=False)[1])
        return name

    def body_of(self, value: bytes | str) -> bytes:
        """The body a body column's value stands for: the value itself, or its file's contents."""
        if not isinstance(value, str):
            return value
        body = self._tx_bodies.get(value) or self._fresh.get(value)
        if body is not None:
            return body
        try:
            with open(self.files / value, "rb") as f:
                return f.read()
        except OSError as e:
            raise C2Error(f"custody store {self.path}: the file of a body it holds cannot be read: {e}") from None

    def _dropped(self, values: Iterable) -> None:
        """Rows holding these body column values were deleted in the open transaction."""
        for v in values:
            if isinstance(v, str):
                if self._tx_bodies.pop(v, None) is None or v in self._tx_writing:  # (else never written)
                    self._tx_doomed.append(v)
                self._forget(v)

    def _forget(self, name: str) -> None:
        """A file's body no longer kept to be read back (its row or its file is going)."""
        body = self._fresh.pop(name, None)
        if body is not None:
            self._fresh_bytes -= len(body)

    def _write_file(self, name: str, body: bytes) -> None:
        """Create, write and fsync one body's file (from the store's thread or the writer's)."""
        fd = os.open(self.files / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _open_dir(self) -> None:
        if self._dir_fd is None:
            self.files.mkdir(mode=0o700, exist_ok=True)
            self._dir_fd = os.open(self.files, os.O_RDONLY)

    def _start_writes(self, values: Iterable) -> None:
        """Bodies of the open transaction about to be sealed (read to go out): their files are
        written and fsynced in a thread while the envelope is sealed (both leave the GIL), not
        by the commit after, on a round trip's path (decision 0006).  The commit waits for them
        (_files_to_disk); still only files a row names: those of rows taken in the same
        transaction (an answered ping) are never read to go out."""
        for v in values:
            if isinstance(v, str) and v in self._tx_bodies and v not in self._tx_writing:
                if self._writer is None:
                    self._open_dir()
                    self._writer = ThreadPoolExecutor(1, thread_name_prefix="c2-custody-bodies")
                self._tx_files.append(v)
                self._tx_writing[v] = self._writer.submit(self._write_file, v, self._tx_bodies[v])

    def _files_to_disk(self) -> None:
        """Before COMMIT: the files the transaction's rows name written, fsynced, and the
        folder naming them on disk.  Raises StoreFull if one cannot be written (_Tx then
        removes those written and rolls back)."""
        if not self._tx_bodies:
            return
        self._open_dir()
        for name, body in self._tx_bodies.items():
            try:
                writing = self._tx_writing.pop(name, None)
                if writing is not None:
                    writing.result()
                else:
                    self._tx_files.append(name)
                    self._write_file(name, body)
            except OSError as e:
                raise StoreFull(
                    f"custody store {self.path}: a body of {len(body)} bytes could not be written to "
                    f"{self.files / name} ({e}); nothing of this change was kept"
                ) from e
        os.fsync(self._dir_fd)

    def _writes_done(self) -> None:
        """Wait for the writes of files the transaction started (whatever their outcome: a
        failure that matters was raised by _files_to_disk already)."""
        for writing in self._tx_writing.values():
            with contextlib.suppress(Exception):
                writing.result()
        self._tx_writing.clear()

    def _files_undone(self) -> None:
        """After a ROLLBACK (or a failed COMMIT): the transaction's files gone, and what it
        dropped kept."""
        self._writes_done()
        for name in [*self._tx_bodies, *self._tx_files]:
            self._forget(name)
        for name in self._tx_files:
            with contextlib.suppress(OSError):
                os.unlink(self.files / name)
        self._tx_bodies, self._tx_files = {}, []
        self._tx_doomed.clear()

    def reap(self) -> int:
        """Remove the files of rows whose deletion is on disk (the WAL fsynced first): each
        overwritten with zeros, fsynced, unlinked.  Safe from one other thread (the
        checkpoint's).  Returns how many went."""
        with self._reap_lock:
            names, self._doomed = self._doomed, []
        if not names:
            return 0
        try:
            self.sync_wal()
            for name in names:
                self._shred(self.files / name)
            os.fsync(self._dir_fd)
            self._reap_failing = False
        except OSError:
            with self._reap_lock:  # tried again at the next reap (or found unnamed at the next open)
                self._doomed[:0] = names
            raise
        return len(names)

    def _reap_failed(self, e: OSError) -> None:
        """Once per spell of failures: the names stay doomed, the next reap tries them again."""
        if not self._reap_failing:
            log.warning("custody store %s: removing released bodies failed (%s); tried again later", self.path, e)
        self._reap_failing = True

    @staticmethod
    def _shred(path: Path) -> None:
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:  # removed already (a reap that failed part way)
            return
        try:
            left = os.fstat(fd).st_size
            while left > 0:
                left -= os.write(fd, _ZEROS[:left])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(path)

    def _remove_unnamed(self) -> None:
        """At opening: files no row names (written by a transaction that never committed, or
        dropped by one whose reap a crash cut short) go."""
        try:
            names = set(os.listdir(self.files))
        except FileNotFoundError:
            return
        if not names:
            return
        named = {
            r[0]
            for r in self.db.execute(
                "SELECT body FROM bodies WHERE typeof(body)='text' UNION ALL SELECT body FROM inbox WHERE "
                "typeof(body)='text' UNION ALL SELECT body FROM held WHERE typeof(body)='text'"
            )
        }
        self._dir_fd = os.open(self.files, os.O_RDONLY)
        for name in sorted(names - named):
            self._shred(self.files / name)
        os.fsync(self._dir_fd)

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
            self.reap()
        return frames, copied

    # -- counters and reports ----------------------------------------------------------------
    def bump(self, name: str, by: int = 1) -> int:
        """Counters live in memory and reach the table once per transaction, at its commit
        (one row write per counter changed, not per call: a submit bumps four of them per
        envelope); a rollback puts the values from before it back."""
        v = self._counts.get(name, 0) + by
        if not self.db.in_transaction:
            self._write_counters({name: v})
        elif name not in self._before:
            self._before[name] = self._counts.get(name)
        self._counts[name] = v
        return v

    def _write_counters(self, values: dict[str, int]) -> None:
        self.db.executemany(
            "INSERT INTO counters(name, value) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            list(values.items()),
        )

    def _flush_counters(self) -> None:
        """Before the outer COMMIT: this transaction's counter changes into the table (what
        they were is kept until the COMMIT has succeeded)."""
        if self._before:
            self._write_counters({k: self._counts[k] for k in self._before})

    def _undo_counters(self) -> None:
        """After a ROLLBACK: counters as they were before the transaction."""
        for k, v in self._before.items():
            if v is None:
                self._counts.pop(k, None)
            else:
                self._counts[k] = v
        self._before.clear()

    def counter(self, name: str) -> int:
        return self._counts.get(name, 0)

    def counters(self) -> dict[str, int]:
        return dict(self._counts)

    # -- outbox ------------------------------------------------------------------------------
    def out_add(self, items: list[OutItem]) -> None:
        if not items:
            return
        self.db.executemany(
            "INSERT INTO outbox(seq, dst, priority, cseq, created_ms, lifetime_ms, expires_ms, supersede, "
            "app, size) VALUES(?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    it.seq,
                    it.dst,
                    it.priority,
                    it.cseq,
                    it.created_ms,
                    it.lifetime_ms,
                    it.expires_ms,
                    it.supersede,
                    it.app,
                    it.size,
                )
                for it in items
            ],
        )
        self.db.executemany("INSERT INTO bodies(seq, body) VALUES(?,?)", [(it.seq, self._put(it.body)) for it in items])

    def out_put(self, items: list[OutItem]) -> None:
        self.db.executemany(
            "UPDATE outbox SET inflight=?, attempts=?, sent_ms=?, retry_ms=?, received=?, superseded=? WHERE seq=?",
            [
                (int(it.inflight), it.attempts, it.sent_ms, it.retry_ms, int(it.received), int(it.superseded), it.seq)
                for it in items
            ],
        )

    def out_delete(self, seqs: Iterable[int]) -> None:
        for chunk in _chunks(seqs):
            qs = _marks(chunk)
            # by the primary key (NOT INDEXED: the partial index of files would be walked whole)
            self._dropped(
                r[0]
                for r in self.db.execute(
                    f"SELECT body FROM bodies NOT INDEXED WHERE seq IN ({qs}) AND typeof(body)='text'", chunk
                )
            )
            self.db.execute(f"DELETE FROM outbox WHERE seq IN ({qs})", chunk)  # the trigger takes the bodies
            self.db.execute(f"DELETE FROM member_acks WHERE seq IN ({qs})", chunk)

    def out_bodies(self, seqs: Iterable[int]) -> dict[int, bytes]:
        rows = []
        for chunk in _chunks(seqs):
            rows += self.db.execute(f"SELECT seq, body FROM bodies WHERE seq IN ({_marks(chunk)})", chunk).fetchall()
        self._start_writes(r[1] for r in rows)  # files about to be sealed (module doc)
        return {seq: self.body_of(body) for seq, body in rows}

    def out_load(self) -> tuple[list[OutItem], dict[int, dict[str, bool]]]:
        items = [_item(r) for r in self.db.execute(f"SELECT {_OUT_COLS} FROM outbox ORDER BY seq")]
        members: dict[int, dict[str, bool]] = {}
        for seq, member, done in self.db.execute("SELECT seq, member, done FROM member_acks"):
            members.setdefault(seq, {})[member] = bool(done)
        return items, members

    def member_ack(self, seq: int, member: str, done: bool) -> None:
        self.db.execute(
            "INSERT INTO member_acks(seq, member, done) VALUES(?,?,?) ON CONFLICT(seq, member) "
            "DO UPDATE SET done=excluded.done",
            (seq, member, int(done)),
        )

    # -- keyed records (TABLES) ----------------------------------------------------------------
    def _q(self, name: str, make) -> str:
        """A statement, built once per shape."""
        q = self._sql.get(name)
        if q is None:
            q = self._sql[name] = make()
        return q

    def _value(self, t: Table, row: Iterable) -> tuple:
        """A row's value columns as the record's value (a body named by a file read back)."""
        v = tuple(row)
        if t.body is not None:
            i = t.value.index(t.body)
            v = (*v[:i], self.body_of(v[i]), *v[i + 1 :])
        return v

    def _stored(self, t: Table, value: tuple) -> tuple:
        """A value as its row holds it (a large body as its file's name, written at the commit)."""
        if len(value) != len(t.value):
            raise ValueError(f"a record of {len(value)} values for columns {t.value}")
        if t.body is None:
            return value
        i = t.value.index(t.body)
        return (*value[:i], self._put(value[i]), *value[i + 1 :])

    def get(self, table: str, key: tuple) -> tuple | None:
        t, q = TABLES[table], _SQL[table]
        row = self.db.execute(q.get, key).fetchone()
        if row is None:
            return None
        return () if not t.value else (row if t.body is None else self._value(t, row))

    def put(self, table: str, key: tuple, value: tuple) -> None:
        t = TABLES[table]
        if t.body is not None:  # the body it replaces, if in a file, goes
            self._drop_bodies(t, table, [key])
        self.db.execute(_SQL[table].put, (*key, *self._stored(t, value)))

    def add(self, table: str, value: tuple) -> int:
        row = self.db.execute(_SQL[table].add, self._stored(TABLES[table], value))
        return row.lastrowid  # type: ignore[return-value]  # AUTOINCREMENT: ascending, never reused

    def delete(self, table: str, keys: Iterable[tuple]) -> None:
        t = TABLES[table]
        keys = list(keys)
        if t.body is not None:
            self._drop_bodies(t, table, keys)
        self.db.executemany(_SQL[table].delete, keys)

    def _drop_bodies(self, t: Table, table: str, keys: list[tuple]) -> None:
        """Bodies in files that rows about to go (or be replaced) name: removed once that is on disk."""
        q = self._q(
            f"files {table}",
            lambda: f"SELECT {t.body} FROM {t.sql or table} WHERE {_eq(t.key)} AND typeof({t.body})='text'",
        )
        self._dropped(r[0] for k in keys for r in self.db.execute(q, k))

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
        t = TABLES[table]
        besides = {c: list(vs) for c, vs in (besides or {}).items()}
        args = list(prefix)
        shape = [table, str(len(prefix)), str(after is not None), str(keys_only)]
        if after is not None:
            args.append(after)
        for c, v in (only or {}).items():
            shape.append(f"={c}")
            args.append(v)
        for c, vs in besides.items():
            shape.append(f"!{c}{len(vs)}")
            args += vs
        q = self._q(
            " ".join(shape), lambda: _scan_sql(t, table, len(prefix), after is not None, only, besides, keys_only)
        )
        rows = self.db.execute(q, (*args, limit)).fetchall()
        n = len(t.key)
        if keys_only:
            return [(r, ()) for r in rows]
        if t.body is None:
            return [(r[:n], r[n:]) for r in rows]
        return [(r[:n], self._value(t, r[n:])) for r in rows]

    def due(self, table: str, upto_ms: int, limit: int = -1) -> list[tuple]:
        t = TABLES[table]
        q = self._q(
            f"due {table}",
            lambda: f"SELECT {', '.join(t.key)} FROM {t.sql or table} WHERE {t.time} <= ? ORDER BY {t.time} LIMIT ?",
        )
        return [tuple(r) for r in self.db.execute(q, (upto_ms, limit))]

    def first_due(self, table: str) -> int | None:
        t = TABLES[table]
        return self.db.execute(f"SELECT min({t.time}) FROM {t.sql or table}").fetchone()[0]

    def count(self, table: str) -> int:
        t = TABLES[table]
        return self.db.execute(f"SELECT count(*) FROM {t.sql or table}").fetchone()[0]


class _Statements:
    """A table's statements by key (get, put: insert or replace the value, add, delete)."""

    def __init__(self, name: str, t: Table):
        cols, where = t.key + t.value, _eq(t.key)
        self.get = f"SELECT {', '.join(t.value) or '1'} FROM {name} WHERE {where}"
        update = ", ".join(f"{c}=excluded.{c}" for c in t.value)
        self.put = f"INSERT INTO {name}({', '.join(cols)}) VALUES({_marks(cols)}) " + (
            f"ON CONFLICT DO UPDATE SET {update}" if t.value else "ON CONFLICT DO NOTHING"
        )
        self.add = f"INSERT INTO {name}({', '.join(t.value)}) VALUES({_marks(t.value)})"
        self.delete = f"DELETE FROM {name} WHERE {where}"


def _scan_sql(
    t: Table, table: str, n: int, after: bool, only: dict | None, besides: dict | None, keys_only: bool
) -> str:
    where = [f"{c}=?" for c in t.key[:n]]
    if after:
        where.append(f"{t.key[n]}>?")
    for c in only or {}:
        where.append(f"{t.value[t.value.index(c)]}=?")
    for c, vs in (besides or {}).items():
        if vs:
            where.append(f"{t.value[t.value.index(c)]} NOT IN ({_marks(list(vs))})")
    cols = ", ".join(t.key if keys_only else t.key + t.value)
    cond = f"WHERE {' AND '.join(where)} " if where else ""
    return f"SELECT {cols} FROM {t.sql or table} {cond}ORDER BY {', '.join(t.key)} LIMIT ?"


def _eq(cols: tuple[str, ...]) -> str:
    return " AND ".join(f"{c}=?" for c in cols)


_SQL = {table: _Statements(t.sql or table, t) for table, t in TABLES.items()}


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT; nested calls join the outer transaction.  SQLite
    fixes the fsync policy before BEGIN, so the outermost caller decides whether
    the commit is durable; a durable call inside a relaxed transaction is a bug."""

    def __init__(self, store: SqliteStore, durable: bool):
        self.store = store
        self.durable = durable
        self.outer = False

    def __enter__(self):
        st = self.store
        if st.db.in_transaction:
            if self.durable and not st._tx_durable:
                raise RuntimeError("a durable custody change inside a relaxed transaction")
            return self
        want = "FULL" if self.durable and st.sync == "loop" else "NORMAL"
        if want != st._sync:
            st.db.execute(f"PRAGMA synchronous={want}")
            st._sync = want
        st.db.execute("BEGIN IMMEDIATE")
        st._tx_durable = self.durable
        self.outer = True
        return self

    def __exit__(self, et, ev, tb):
        if not self.outer:
            return False
        st = self.store
        if et is None:
            try:
                st._flush_counters()
                st._files_to_disk()
                st._writes_done()  # (those of rows dropped since: doomed, removed by reap())
                st.db.execute("COMMIT")
                st._tx_files.clear()
                st._tx_bodies.clear()
                st._before.clear()
                if st._tx_durable:
                    st.commits += 1
            except BaseException as e:
                st._files_undone()
                if st.db.in_transaction:
                    st.db.execute("ROLLBACK")
                st._undo_counters()
                if _disk_full(e):
                    raise _store_full(st, e) from e
                raise
            if st._tx_doomed:
                with st._reap_lock:
                    st._doomed.extend(st._tx_doomed)
                st._tx_doomed.clear()
                if st.sync == "loop" and st._tx_durable and not st.background:
                    try:  # on disk now: no thread will come for them
                        st.reap()
                    except OSError as e:  # the commit stands; the files wait for the next reap
                        st._reap_failed(e)
            return False
        st._files_undone()
        if st.db.in_transaction:
            st.db.execute("ROLLBACK")
        st._undo_counters()
        if _disk_full(ev):
            raise _store_full(st, ev) from ev
        return False


def _disk_full(e: BaseException | None) -> bool:
    return isinstance(e, sqlite3.OperationalError) and getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def _store_full(st: SqliteStore, e: BaseException) -> StoreFull:
    return StoreFull(
        f"custody store {st.path}: the disk is full ({e}); nothing of this change was kept, "
        "what the store held before it is intact"
    )
