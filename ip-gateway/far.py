"""The far side of the MQTT gateway (where the broker is): the asyncio shell of one FarCore
(far_core.py) per origin client.  It makes the broker connection the core asks for, feeds it
what the broker sends, writes what it says, runs its deadlines, and puts the broker's
publications in custody before the core acknowledges them.  The session's state is the core's
params and subscriptions (kept in the session file by the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import far_core as fc
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.far_core import FarCore, FarLimits, Item
from c2dtn.ip_gateway.near_core import Envelope, lifetime_ms
from c2dtn.ip_gateway.policy import TopicRule
from c2dtn.overlay.port import QuotaExceeded, TooLarge, now_ms
from c2dtn.spells import Spell

if TYPE_CHECKING:
    from c2dtn.ip_gateway.gateway import MqttGateway

log = logging.getLogger("c2dtn.gateway")


class FarSession:
    """One origin client's connection to the real broker, at the far gateway."""

    always_subscribe = False

    def __init__(
        self,
        gw: MqttGateway,
        origin: str,
        client: str,
        broker: str,
        state: dict | None = None,
        closing_until: float | None = None,
    ):
        self.gw, self.origin, self.client, self.broker = gw, origin, client, broker
        self._loop = asyncio.get_running_loop()
        limits = FarLimits(
            gw.cfg.max_packet_size, gw.cfg.qos1_once, gw.cfg.limits.persistent_client_expiration, self.always_subscribe
        )
        self.core = FarCore(
            origin,
            client,
            broker,
            limits,
            self._loop.time(),
            state,
            gw.counters,
            wall_ms=lambda _now: now_ms(),
            clear=lambda inbox_id, topic: gw.subscriptions_clear(inbox_id, broker, topic),
        )
        self.core.label = self.key()
        # an ended session of the same client whose connection the broker has not closed yet:
        # this one opens only after it (or after the rest of its CLOSE_WAIT_S)
        self.core.wait_closed(closing_until)
        self.writer: asyncio.StreamWriter | None = None
        self._old: asyncio.StreamWriter | None = None  # the connection we ended, read until the broker closes it
        self._old_task: asyncio.Task | None = None
        self._opening: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._readers: dict[asyncio.StreamWriter, asyncio.Task] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._ended = False
        self.deferring = False  # something for it stayed in custody (queue full): the rest waits too
        self.deferred_from: int | None = None  # the inbox id of the first envelope kept for it
        self.refilling = False  # a refill from custody is due (MqttGateway.refill)
        self.backlog = Spell(log)  # its queue full, more kept in custody: logged once while it lasts
        self._do(self.core.start(self._loop.time()))

    # the session as the gateway saves and shows it
    params = property(lambda self: self.core.params)
    subs = property(lambda self: self.core.subs)
    present = property(lambda self: self.core.present)
    gone_at = property(lambda self: self.core.gone_at)

    def key(self) -> str:
        return f"{self.origin}/{self.client}"

    def expiry_s(self) -> float | None:
        return self.core.expiry_s()

    def idle(self) -> bool:
        return self.core.idle()

    def queued(self) -> int:
        return len(self.core.queue)

    def connected(self) -> bool:
        return self.writer is not None

    def closing_until(self) -> float | None:
        """When the connection this session ended is given up on, while the broker has not closed it."""
        return self.core.closing_until() if self._old is not None else None

    def closed(self) -> None:
        """The connection an earlier session of this client ended is closed at the broker."""
        self._do(self.core.closed(self._loop.time()))

    def _give_up(self, w: asyncio.StreamWriter) -> None:
        if self._old is w:  # (the read task then says closed, as for a broker that closed it)
            w.transport.abort()

    def abandon(self) -> None:
        w, self._old = self._old, None
        if w is not None:
            w.transport.abort()

    def put(self, item: Item) -> None:
        self._do(self.core.put(item, self._loop.time()))

    def expire_in(self, seconds: float) -> None:
        self.core.expire_in(seconds, self._loop.time())
        self._arm()

    def cancel(self) -> None:
        self._ended = True
        self._do(self.core.cancel())
        for t in [*self._tasks, *([self._opening] if self._opening else [])]:
            if t is not self._old_task:  # the broker still reads what was written: read on till it closes
                t.cancel()
        if self._timer is not None:
            self._timer.cancel()

    # -- doing what the core says ----------------------------------------------------------
    def _do(self, events: list) -> None:
        done = False
        for ev in events:
            if isinstance(ev, fc.Write):
                if self.writer is not None:
                    self.writer.write(ev.data)
                elif self.core.conn not in (None, "opening"):  # never: the core and the shell disagree
                    log.error("session %s: the core writes to a connection the shell has not", self.key())
                    self._do(self.core.lost(self._loop.time(), "no connection in the shell"))
            elif isinstance(ev, fc.Done):
                self.gw.finished(ev.item)
                done = True
            elif isinstance(ev, fc.Open):
                self._opening = self._start(self._open())
            elif isinstance(ev, fc.Close):
                self._close(ev.abort)
            elif isinstance(ev, fc.Abandon):
                if self._old is not None:
                    self.abandon()
                else:
                    self.gw.far_abandon(self)
            elif isinstance(ev, fc.Gate):
                self._start(self._gate(ev))
            elif isinstance(ev, fc.SubWritten):
                self.gw.sub_written(ev.inbox_id)
            elif isinstance(ev, fc.Changed):
                self.gw.far_changed(self)
            elif isinstance(ev, fc.Left):
                self.gw.far_left(self)
            elif isinstance(ev, fc.Expired):
                self.gw.far_expired(self)
            elif isinstance(ev, fc.Publication):  # only data() gives these, and _read takes them
                raise AssertionError("a broker publication outside the read loop")
        if done and self.deferring and self.queued() <= self.gw.cfg.far_queue // 2:
            self.gw.refill_soon(self)  # what stayed in custody for it can come now
        self._arm()

    def _start(self, coro) -> asyncio.Task:
        t = self._loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def _arm(self) -> None:
        at = None if self._ended else self.core.next_deadline()
        if self._timer is not None:
            if at == self._timer_at:
                return  # armed for it already (most events move no deadline)
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            self._timer = self._loop.call_at(at, self._tick)

    def _tick(self) -> None:
        self._timer = None
        try:
            self._do(self.core.tick(self._loop.time()))
        except Exception:  # a daemon never dies of one session: log it, and look again in a second
            log.exception("far session %s", self.key())
            if self._timer is None and not self._ended:
                self._timer, self._timer_at = self._loop.call_later(1.0, self._tick), None

    def _close(self, abort: bool) -> None:
        if self._opening is not None:
            self._opening.cancel()
            self._opening = None
        w, self.writer = self.writer, None
        if w is not None:
            with contextlib.suppress(Exception):
                if abort:
                    w.transport.abort()
                    return
                # our side ends after what was written (FIN, not RST); the read task reads on
                # until the broker has read it all and closed its side
                self._old, self._old_task = w, self._readers.get(w)
                w.write_eof()
                # reset if the broker has not closed it by the core's wait: an ended session has no
                # successor whose Abandon would, and its socket must not outlive it
                self._loop.call_later(fc.CLOSE_WAIT_S, self._give_up, w)

    # -- the broker connection --------------------------------------------------------------
    async def _open(self) -> None:
        me = asyncio.current_task()
        host, port = self.core.address or ("", 0)
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as e:
            if self._opening is me:
                self._opening = None
                self._do(self.core.open_failed(self._loop.time(), str(e)))
            return
        if self._opening is not me:  # closed meanwhile
            writer.close()
            return
        self._opening = None
        self.writer = writer
        task = self._readers[writer] = self._start(self._read(reader, writer))
        task.add_done_callback(lambda _t: self._readers.pop(writer, None))
        self._do(self.core.opened(self._loop.time()))

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "closed by the broker"
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self.writer is not writer:
                    continue  # a connection we ended: what the broker sends after it is not taken
                events = self.core.data(data, self._loop.time())
                # what the core said goes now (a Close among it is of this connection), then the
                # publications go into custody, each acknowledged once it is there
                self._do([e for e in events if not isinstance(e, fc.Publication)])
                for e in events:
                    if isinstance(e, fc.Publication) and self.writer is writer:  # (closed: it comes again)
                        await self._take(e)
        except (ConnectionError, OSError) as e:
            why = str(e) or type(e).__name__
        finally:
            if why == "closed by the broker":
                writer.close()
            else:
                writer.transport.abort()
            if self.writer is writer:
                self.writer = None
                self._do(self.core.lost(self._loop.time(), why))
            elif self._old is writer:
                self._old = self._old_task = None
                if self._ended:
                    self.gw.far_closed(self)
                else:
                    self._do(self.core.closed(self._loop.time()))

    async def _gate(self, ev: fc.Gate) -> None:
        await self.gw.subscribed_before(ev.inbox_id, self.broker, ev.topic)
        self._do(self.core.gate_passed(ev.token, self._loop.time()))

    async def _take(self, ev: fc.Publication) -> None:
        """A publication from the broker into custody, durably, before the core acknowledges it:
        it stays the broker's until then."""
        p, ok = ev.packet, True
        rule = self.gw.cfg.policy.rule_for(p.topic)
        if rule is None:
            self.gw.counters["held_local"] += 1  # not on the allow-list: it does not cross
        else:
            try:
                self.gw.submit_many(self._envelopes(p, rule))
                await self.gw.port.durable()  # on disk (the custody writer thread) before the ack
                self.gw.far_full.over("custody takes broker publications again")
            except TooLarge as e:  # it can never cross: acked, so the broker does not resend it forever
                self.gw.counters["far_too_large"] += 1
                self.gw.far_too_large.hit("broker publication for %s dropped: %s", self.key(), e)
            except QuotaExceeded as e:
                self.gw.far_full.hit("custody full, broker publication for %s not taken: %s", self.key(), e)
                ok = False  # no ack: the broker sends it again
            except OSError:  # the fsync failed (logged by the syncer): no ack either
                ok = False
        self._do(self.core.stored(ev, ok))

    def _envelopes(self, p: m.Publish, rule: TopicRule) -> list[Envelope]:
        """What a publication from the broker becomes: one "msg" back to the origin client."""
        self.gw.counters["returned"] += 1
        body = s.pack(
            "msg", self.client, self.broker, t=p.topic, p=p.payload, q=p.qos, r=p.retain, x=s.props_out(p.properties)
        )
        key = rule.key(p.topic)
        return [(self.origin, body, lifetime_ms(rule, p), rule.priority, key and f"{key}@{self.client}")]
