"""The near side's asyncio shell: client connections in, the I/O-free NearCore
(near_core.py) deciding, and this file doing what its events say: writing to
sockets, committing envelopes to custody, arming the keep-alive/expiry timer.

A commit's replies (PUBACK, PUBREC, ...) go once the custody store's writer thread has
fsynced it (OverlayNode.synced); meanwhile that connection's next bytes wait unread, so
its replies keep their order, and other connections' commits join the same fsync."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from c2dtn.ip_gateway import near_core as nc
from c2dtn.overlay.port import QuotaExceeded, TooLarge
from c2dtn.spells import Spell

MARKS_PENDING_MAX = 100_000  # answered marks kept for another try while the store cannot drop them

if TYPE_CHECKING:
    from c2dtn.ip_gateway.gateway import MqttGateway

log = logging.getLogger("c2dtn.gateway")


class NearSide:
    def __init__(self, gw: MqttGateway):
        self.gw = gw
        batch = gw.cfg.batch_bytes
        if batch is None:
            batch = gw.port.aggregate_bytes // 2
        self.core = nc.NearCore(gw.cfg.policy, gw.cfg.max_packet_size, batch, gw.cfg.auth, gw.cfg.limits)
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._syncing: dict[int, asyncio.Task] = {}  # conn -> its replies waiting for the fsync
        self._full = Spell(log)  # custody refusing publishes (a full disk, the quota)
        self._unanswered: list[str] = []  # marks whose drop the store refused (a full disk): tried again
        self._synced_at: dict[int, int] = {}  # conn -> the store's commit count its replies wait for

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, broker: tuple[str, int]) -> None:
        """One client connection, until it or the core ends it."""
        cid = next(self._ids)
        self.writers[cid] = writer
        peer = writer.get_extra_info("peername")
        self.run(self.core.open(cid, f"{broker[0]}:{broker[1]}", time.time(), peer[0] if peer else ""))
        try:
            while cid in self.writers:
                data = await reader.read(65536)
                if not data:
                    break
                self.run(self.core.data(cid, data, time.time()))
                waiting = self._syncing.get(cid)
                if waiting is not None:  # read on once its replies went (shielded: they still go if we stop)
                    await asyncio.shield(waiting)
                if cid in self.writers:
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.run(self.core.closed(cid, time.time()))
            w = self.writers.pop(cid, None)
            if w is not None:
                w.close()

    def run(self, events: list[nc.Event]) -> None:
        """Do what the core's events say, in order (a commit's outcome goes back to the core
        and its replies are done next)."""
        q = deque(events)
        save = False
        while q:
            ev = q.popleft()
            if isinstance(ev, nc.Write):
                w = self.writers.get(ev.conn)
                if w is not None and not w.is_closing():
                    w.write(ev.data)
            elif isinstance(ev, nc.Close):
                w = self.writers.pop(ev.conn, None)
                if w is not None:
                    w.close()
            elif isinstance(ev, nc.Submit):
                ok = True
                try:
                    self.gw.submit_many(ev.envelopes, ev.marks)
                    if ev.envelopes:
                        self._full.over("custody takes MQTT publishes again")
                except TooLarge as e:  # NearCore refuses these first: only a batch could reach here
                    ok = False
                    log.warning("MQTT publishes refused: %s", e)
                except QuotaExceeded as e:
                    ok = False
                    self._full.hit("custody full, MQTT publishes refused (MQTT 5: 0x97; 3.1.1: disconnect): %s", e)
                if ev.conn is not None:
                    mark = self.gw.port.commit_mark() if ok else None
                    if mark is not None:
                        self._reply_when_synced(ev.conn, mark)
                    else:
                        q.extendleft(reversed(self.core.committed(ev.conn, ok, time.time())))
            elif isinstance(ev, nc.Answered):
                self._marks_answered(ev.keys)
            elif isinstance(ev, nc.Done):
                self.gw.delivered(ev.inbox_id)
            elif isinstance(ev, nc.Release):
                self.gw.release(ev.inbox_ids)
            elif isinstance(ev, nc.SessionsChanged):
                save = True
            elif isinstance(ev, (nc.Resume, nc.Ended)):
                # a pass over all that waits: handed to a session that is back, dropped for one that ended
                asyncio.get_running_loop().call_soon(self.gw.on_inbox, True)
        if save:
            self.gw.save_sessions()
        self._arm()

    def _reply_when_synced(self, conn: int, mark: int) -> None:
        """The core holds this connection's replies until committed(), which hands out all of
        them: they go once an fsync covered this connection's last commit (a timer's Submit
        may add one while the first waits), or not at all if it failed (refused as a commit
        that failed: the client resends)."""
        self._synced_at[conn] = mark
        if conn in self._syncing:
            return

        async def reply() -> None:
            ok = True
            try:
                while True:  # (a timer's Submit may move the mark while this waits)
                    mark = self._synced_at[conn]
                    await self.gw.port.durable(mark)
                    if self._synced_at[conn] <= mark:
                        break
            except OSError:  # logged by the syncer
                ok = False
            finally:
                del self._syncing[conn], self._synced_at[conn]
            self.run(self.core.committed(conn, ok, time.time()))

        self._syncing[conn] = asyncio.get_running_loop().create_task(reply())

    def _marks_answered(self, keys: list[str]) -> None:
        """Drop the marks of publishes whose PUBACK was written; a store that cannot take the
        change (the disk is full) keeps them, and they are dropped with the next ones."""
        keys = self._unanswered + list(keys)
        try:
            self.gw.port.marks_answered(keys)
            self._unanswered = []
        except QuotaExceeded as e:  # StoreFull too: nothing of the change was kept
            self._unanswered = keys[-MARKS_PENDING_MAX:]
            self._full.hit("custody full, MQTT publishes refused (MQTT 5: 0x97; 3.1.1: disconnect): %s", e)

    def _arm(self) -> None:
        """A timer at the core's next deadline (keep alive, session expiry).  One that fires
        earlier is kept: the tick finds nothing due and arms the next (a deadline that moves
        later with every packet must not cost a new timer per packet)."""
        due = self.core.next_deadline()
        if due is None:
            return
        when = self._loop_time(due) + 0.01
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._tick)

    @staticmethod
    def _loop_time(wall: float) -> float:
        return asyncio.get_running_loop().time() + max(0.0, wall - time.time())

    def _tick(self) -> None:
        self._timer = None
        self.run(self.core.tick(time.time()))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for w in list(self.writers.values()):
            w.close()
