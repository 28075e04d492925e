"""A durable queue of payloads per lane (the relay's: one lane per island), in SQLite.

One row per payload; `add` commits a batch at once (WAL, synchronous=FULL: on disk when it
returns), `take` reads a lane's oldest, `delete` drops those its consumer took.  Every
failure of the file (a full disk, an I/O error) is QueueError: nothing of that call kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from c2dtn.errors import C2Error
from c2dtn.private import private_sqlite


class QueueError(C2Error):
    pass


Row = tuple[int, str, bytes, int]  # (id, destination, payload, held since, ms)


class SqliteQueue:
    def __init__(self, path: Path | str):
        private_sqlite(path)
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS held (id INTEGER PRIMARY KEY AUTOINCREMENT, island TEXT NOT NULL, "
                "dst TEXT NOT NULL, payload BLOB NOT NULL, held_ms INTEGER NOT NULL)"
            )
            self.db.execute("CREATE INDEX IF NOT EXISTS held_island ON held (island, id)")
        except sqlite3.Error as e:
            raise QueueError(f"queue {path}: {e}") from None

    def bytes_held(self) -> int:
        return self.db.execute("SELECT coalesce(sum(length(payload)), 0) FROM held").fetchone()[0]

    def add(self, rows: list[tuple[str, str, bytes, int]]) -> None:
        """(lane, destination, payload, held since ms) rows, in one commit."""
        try:
            with self.db:
                self.db.executemany("INSERT INTO held (island, dst, payload, held_ms) VALUES (?, ?, ?, ?)", rows)
        except sqlite3.Error as e:
            raise QueueError(f"{len(rows)} payloads not queued: {e}") from None

    def take(self, lane: str, limit: int) -> list[Row]:
        """The oldest rows of `lane`."""
        return self.db.execute(
            "SELECT id, dst, payload, held_ms FROM held WHERE island = ? ORDER BY id LIMIT ?", (lane, limit)
        ).fetchall()

    def delete(self, ids: list[int]) -> None:
        try:
            with self.db:
                self.db.executemany("DELETE FROM held WHERE id = ?", [(i,) for i in ids])
        except sqlite3.Error as e:
            raise QueueError(f"{len(ids)} payloads not dropped from the queue: {e}") from None

    def counts(self) -> dict[str, int]:
        """Rows held per lane."""
        return dict(self.db.execute("SELECT island, count(*) FROM held GROUP BY island").fetchall())

    def close(self) -> None:
        self.db.close()
