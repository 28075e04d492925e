"""The far side of the MQTT gateway (where the broker is): one MQTT connection per
origin client at the real broker, with the client's own id, clean-start flag, keep
alive and will.  An envelope is consumed (so its origin is acked) only once the
broker accepted it (PUBACK, PUBCOMP, SUBACK); publications the broker sends are put
in custody before the broker gets its PUBACK, and travel back as "msg" envelopes.

An asyncio shell around the codec: the session's state is its params and
subscriptions (kept in the session file by the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from typing import TYPE_CHECKING

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.near_core import PUB_PIDS, Envelope, aged, lifetime_ms, pub_pid
from c2dtn.ip_gateway.policy import TopicRule
from c2dtn.overlay.port import Delivery, QuotaExceeded, TooLarge, now_ms

if TYPE_CHECKING:
    from c2dtn.ip_gateway.gateway import MqttGateway

log = logging.getLogger("c2dtn.gateway")


def session_expiry_s(params: dict) -> float | None:
    """How long a session outlives its client's disconnect: 0 (a clean 3.1.1 session, an
    MQTT 5 session expiry of 0 or none), seconds, or None (never: 3.1.1 without clean
    session, or MQTT 5's 0xFFFFFFFF)."""
    if params.get("v", 4) == 5:
        sx = params.get("sx") or 0
        return None if not isinstance(sx, int) or sx >= 0xFFFFFFFF else float(max(0, sx))
    return 0.0 if params.get("clean", params.get("cs")) else None


# A QoS 1/2 publish's packet id is its inbox id's (the custody delivery's) modulo PUB_PIDS, plus 1:
# the same message always goes with the same id, also after a restart of this gateway, as MQTT
# asks of a client resuming a session (decision 0007).  Inbox ids are never reused
# (AUTOINCREMENT) and at most FAR_INFLIGHT_MAX publishes are in flight, so two messages in flight
# share an id only if 60,000 ids apart (then the later one waits).  SUBSCRIBE and UNSUBSCRIBE
# take ids above PUB_PIDS.
# QoS 1/2 publishes in flight to the broker at once.  MQTT 5: the broker's Receive Maximum (its
# CONNACK), at most FAR_INFLIGHT_MAX.  MQTT 3.1.1 has no such field: FAR_INFLIGHT_V311, which is
# Mosquitto's default max_inflight_messages; past it Mosquitto drops QoS 2 messages (decision 0007).
FAR_INFLIGHT_MAX = 200
FAR_INFLIGHT_V311 = 20
# QoS 0 publishes have no ack to pace them: after every FAR_QOS0_CHUNK of them a PINGREQ goes, and
# a chunk waits for the PINGRESP of the one before (the broker has read what came before it), so at
# most two chunks are ahead of the broker: unpaced, a backlog outran Mosquitto's queue to its
# subscriber (decision 0007).
FAR_QOS0_CHUNK = 100
FAR_PING_WAIT_S = 60.0  # a PINGREQ unanswered this long: the broker connection is dropped and made again


class Part:
    """One publish of a "pubs" envelope (several publishes a client sent together): queued and
    sent as its own publish; the envelope is consumed once every part is done (Part.finish).
    Its id is negative, never an inbox id (the sets of ids sent and released hold both), and
    the same after a restart: (inbox id, index), so its packet id is too.  A far gateway killed
    midway sends the envelope's parts again, the acknowledged ones too: at least once, as
    QoS 1 is (with qos1_once, the broker's QoS 2 dedupe takes the repeats: same packet ids)."""

    __slots__ = ("id", "envelope", "index", "pending", "created_ms", "origin", "seq")

    def __init__(self, d: Delivery, index: int, pending: set[int]):
        self.id = -(d.id * s.MAX_PARTS + index + 1)
        self.envelope, self.index, self.pending = d.id, index, pending
        self.created_ms, self.origin, self.seq = d.created_ms, d.origin, d.seq

    @staticmethod
    def split(d: Delivery, msg: dict) -> list[tuple["Part", dict]]:
        pending = set(range(len(msg["m"])))
        return [
            (Part(d, i, pending), {"op": "pub", "c": msg["c"], "b": msg["b"], **pm}) for i, pm in enumerate(msg["m"])
        ]

    def finish(self) -> bool:
        """This part is done; True when it was the envelope's last."""
        was = bool(self.pending)
        self.pending.discard(self.index)
        return was and not self.pending


def _order(d) -> tuple[int, int]:
    """Inbox order: an envelope's parts in theirs."""
    return (d.envelope, d.index) if isinstance(d, Part) else (d.id, -1)


class FarSession:
    """One origin client's connection to the real broker, at the far gateway."""

    always_subscribe = False

    def __init__(self, gw: "MqttGateway", origin: str, client: str, broker: str, state: dict | None = None):
        self.gw, self.origin, self.client, self.broker = gw, origin, client, broker
        self.params: dict = {"v": 4, "cs": False, "ka": 60}
        self.subs: dict[str, list] = {}
        self.queue: asyncio.Queue[tuple[Delivery, dict]] = asyncio.Queue()
        self.writer: asyncio.StreamWriter | None = None
        self.parser: m.Parser | None = None
        self.waiting: dict[int, asyncio.Future] = {}
        self.inflight: dict[int, tuple[Delivery, dict]] = {}  # packet id -> publish awaiting PUBACK/PUBCOMP
        self._room = asyncio.Event()  # set when inflight shrinks, a PINGRESP comes or the connection drops
        self._q0_written = 0  # QoS 0 publishes written since the last PINGREQ that paces them
        self._pings_out = 0  # PINGREQs on this connection not yet answered
        self._conn: asyncio.StreamWriter | None = None  # the newest broker connection
        self.connack: asyncio.Future | None = None
        self.next_pid = PUB_PIDS + 1
        self.max_inflight = FAR_INFLIGHT_V311  # set from each CONNACK
        self._sent: set[int] = set()  # inbox ids of publishes sent on a connection (a resend has DUP set)
        self._released: set[int] = set()  # QoS 2 inbox ids the broker PUBRECed: resent as PUBREL
        self.present = False  # the origin client is connected at its near gateway
        self.gone_at: float | None = None  # wall clock when the client left (its session's expiry runs)
        self.deferring = False  # something for it stayed in custody (queue full): the rest waits too
        self.deferred_from: int | None = None  # the inbox id of the first envelope kept for it
        self.refilling = False  # a refill from custody is due (MqttGateway.refill)
        self._expiry: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        if state is not None:  # a session from before a restart: reconnect at once, with its subscriptions
            self.params, self.subs = state["params"], state["subs"]
            self.present = state.get("present", True)
            self.gone_at = state.get("gone_at")
        self.task = asyncio.create_task(self._run(resume=state is not None))
        self._pinger = asyncio.create_task(self._keepalive())

    def key(self) -> str:
        return f"{self.origin}/{self.client}"

    def expiry_s(self) -> float | None:
        return session_expiry_s(self.params)

    def expire_in(self, seconds: float) -> None:
        self._unexpire()
        self._expiry = asyncio.get_running_loop().call_later(max(0.0, seconds), self.gw.far_expired, self)

    def _unexpire(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def idle(self) -> bool:
        """Nothing queued or in flight for it, and its client is away."""
        return not self.present and self.queue.empty() and not self.inflight

    def _pid(self) -> int:
        """A packet id for a SUBSCRIBE or UNSUBSCRIBE (publishes have theirs: pub_pid)."""
        pid = self.next_pid
        self.next_pid = PUB_PIDS + 1 + (pid - PUB_PIDS) % (65535 - PUB_PIDS)
        return pid

    async def _keepalive(self) -> None:
        """PINGREQ within the keep alive; while the client is present and has subscriptions,
        a lost broker connection is made again at once (publications wait for it there)."""
        while True:
            await asyncio.sleep(max(1.0, (self.params.get("ka") or 60) / 2))
            if self.writer is not None:
                self._ping()
            elif self.present and self.subs:
                try:
                    await self._ensure_connected()
                except (ConnectionError, OSError, asyncio.TimeoutError) as e:
                    log.warning("session %s: reconnecting failed: %s", self.key(), e)
                    self._drop()

    async def _ensure_connected(self) -> None:
        async with self._lock:
            if self.writer is None:
                await self._connect()

    def cancel(self) -> None:
        self._unexpire()
        self.task.cancel()
        self._pinger.cancel()
        self._drop_clean()

    async def _connect(self) -> None:
        host, port = self.broker.rsplit(":", 1)
        backoff = 0.5
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                break
            except OSError as e:
                log.warning("broker %s unreachable for %s: %s; retrying in %.1f s", self.broker, self.key(), e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(10.0, backoff * 2)
        v = self.params.get("v", 4)
        self._requeue_inflight()  # unacknowledged on the connection before: they go again on this one
        for f in self.waiting.values():
            if not f.done():
                f.set_exception(ConnectionError("broker connection replaced"))
        self.waiting.clear()
        self.parser = m.Parser(self.gw.cfg.max_packet_size, version=v)
        self.writer = self._conn = writer
        self._q0_written = self._pings_out = 0
        self.connack = asyncio.get_running_loop().create_future()
        props = {"session_expiry_interval": self._broker_expiry()} if v == 5 and "sx" in self.params else {}
        writer.write(
            m.encode(
                m.Connect(
                    self.client,
                    self.params.get("cs", False),
                    self.params.get("ka", 60),
                    self.params.get("u"),
                    self.params.get("pw"),
                    s.will_in(self.params.get("w")),
                    v,
                    props,
                ),
                v,
            )
        )
        self._reader_task = asyncio.create_task(self._read(reader, writer))
        ack = await asyncio.wait_for(self.connack, 30)
        if ack.reason:
            raise ConnectionError(f"broker {self.broker} refused client {self.client}: reason 0x{ack.reason:02x}")
        self.max_inflight = (
            min(FAR_INFLIGHT_MAX, ack.properties.get("receive_maximum", 65535)) if v == 5 else FAR_INFLIGHT_V311
        )
        self.params["cs"] = False  # a reconnect resumes the session the first connect started
        if self.subs and (self.always_subscribe or not ack.session_present):
            await self._request(m.Subscribe(self._pid(), [m.SubOption(f, *o) for f, o in self.subs.items()]))
        log.info("session %s open at broker %s", self.key(), self.broker)

    async def _read(self, reader, writer) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for p in self.parser.feed(data):
                    await self._from_broker(p, writer)
        except (ConnectionError, OSError, m.MqttError) as e:
            log.warning("broker connection of %s failed: %s", self.key(), e)
        finally:
            if self.writer is writer:
                self.writer = None
                self._room.set()
            if self._conn is writer:  # not yet replaced by a newer connection: its waiters fail
                for f in list(self.waiting.values()) + ([self.connack] if self.connack else []):
                    if not f.done():
                        f.set_exception(ConnectionError("broker connection lost"))
                self.waiting.clear()
                self._requeue_inflight()

    def _requeue_inflight(self) -> None:
        """Publishes the broker never acknowledged go again, first and in their order."""
        if not self.inflight:
            return
        again = sorted(self.inflight.values(), key=lambda x: _order(x[0]))
        self.inflight.clear()
        self._room.set()
        while not self.queue.empty():
            again.append(self.queue.get_nowait())
        for x in again:
            self.queue.put_nowait(x)

    async def _from_broker(self, p: m.Packet, writer) -> None:
        v = self.params.get("v", 4)
        if isinstance(p, m.ConnAck):
            if self.connack and not self.connack.done():
                self.connack.set_result(p)
        elif isinstance(p, m.PingResp):
            if writer is self.writer and self._pings_out:
                self._pings_out -= 1
                self._room.set()
        elif isinstance(p, (m.PubAck, m.PubComp)) and p.packet_id in self.inflight:
            done = self.inflight.pop(p.packet_id)[0]
            self._room.set()
            self.gw.counters["to_broker"] += 1  # the broker acknowledged it: done
            self._sent.discard(done.id)
            self._released.discard(done.id)
            self.gw.finished(done)
        elif isinstance(p, (m.PubAck, m.PubComp, m.SubAck, m.UnsubAck)):
            f = self.waiting.pop(p.packet_id, None)
            if f and not f.done():
                f.set_result(p)
        elif isinstance(p, m.PubRec):
            if p.packet_id in self.inflight:
                self._released.add(self.inflight[p.packet_id][0].id)
            writer.write(m.encode(m.PubRel(p.packet_id), v))
        elif isinstance(p, m.PubRel):
            writer.write(m.encode(m.PubComp(p.packet_id), v))
        elif isinstance(p, m.Publish):
            # into custody before the broker hears PUBACK: it stays the broker's until then
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
                    return  # no ack: the broker sends it again
                except OSError:  # the fsync failed (logged by the syncer): no ack either
                    return
            if p.qos == 1:
                writer.write(m.encode(m.PubAck(p.packet_id), v))
            elif p.qos == 2:
                writer.write(m.encode(m.PubRec(p.packet_id), v))

    def _envelopes(self, p: m.Publish, rule: TopicRule) -> list[Envelope]:
        """What a publication from the broker becomes: one "msg" back to the origin client."""
        self.gw.counters["returned"] += 1
        body = s.pack(
            "msg", self.client, self.broker, t=p.topic, p=p.payload, q=p.qos, r=p.retain, x=s.props_out(p.properties)
        )
        key = rule.key(p.topic)
        return [(self.origin, body, lifetime_ms(rule, p), rule.priority, key and f"{key}@{self.client}")]

    async def _request(self, pkt) -> m.Packet:
        fut = asyncio.get_running_loop().create_future()
        self.waiting[pkt.packet_id] = fut
        self.writer.write(m.encode(pkt, self.params.get("v", 4)))
        return await asyncio.wait_for(fut, 60)

    async def _run(self, resume: bool = False) -> None:
        if resume:
            try:
                await self._ensure_connected()
            except (ConnectionError, OSError, asyncio.TimeoutError) as e:
                log.warning("session %s not resumed yet: %s", self.key(), e)
                self._drop()
        while True:
            d, msg = await self.queue.get()
            if self.deferring and self.queue.qsize() <= self.gw.cfg.far_queue // 2:
                self.gw.refill_soon(self)  # what stayed in custody for it can come now
            while True:
                try:
                    await self._apply(d, msg)
                    break
                except (ConnectionError, OSError, asyncio.TimeoutError) as e:
                    log.warning("session %s: %s; reconnecting", self.key(), e)
                    self._drop()
                    await asyncio.sleep(0.5)
                except (ValueError, TypeError, KeyError, IndexError, struct.error) as e:
                    # what a peer gateway sent does not make an MQTT packet: count, drop, go on
                    self.gw.counters["bad_bodies"] += 1
                    log.warning("session %s: %s from %s dropped: %s", self.key(), msg.get("op"), self.origin, e)
                    self.gw.finished(d)
                    break

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None

    async def _apply(self, d: Delivery | Part, msg: dict) -> None:
        op = msg["op"]
        if op == "conn":
            self.params = {k: msg[k] for k in ("v", "cs", "ka", "sx", "w", "u", "pw") if k in msg}
            self.params["clean"] = bool(msg.get("cs"))  # "cs" is cleared once connected (reconnects resume)
            if self.params.get("cs"):
                self.subs.clear()
            self.present = True
            self.gone_at = None
            self._unexpire()
            await self._settle()  # what went on the old connection is the broker's before it ends
            async with self._lock:
                self._drop_clean()
                await self._connect()
            self.gw.far_changed(self)
            self.gw.delivered(d.id)
            return
        if op == "disc":
            if isinstance(msg.get("sx"), int) and 0 <= msg["sx"] <= 0xFFFFFFFF and self.params.get("v", 4) == 5:
                self.params["sx"] = msg["sx"]  # set again at the client's DISCONNECT (MQTT 5 3.14.2.2.2)
            self.present = False
            self.gone_at = time.time()
            self.gw.far_changed(self)
            await self._settle()  # what the client published before it left is the broker's first
            if self.writer is not None:
                if msg.get("w"):
                    self._drop()  # no DISCONNECT: the broker publishes the will
                else:
                    self._drop_clean()
            self.gw.delivered(d.id)
            self.gw.far_left(self)
            return
        await self._ensure_connected()
        if op == "sub":
            subs = [m.SubOption(x[0], *x[1:5]) for x in msg.get("s", []) if isinstance(x, list) and x]
            self.gw.sub_written(d.id)
            await self._request(m.Subscribe(self._pid(), subs))
            for so in subs:
                self.subs[so.filter] = [so.qos, so.no_local, so.retain_as_published, so.retain_handling]
            self.gw.far_changed(self)
            self.gw.delivered(d.id)
        elif op == "unsub":
            flts = [f for f in msg.get("f", []) if isinstance(f, str)]
            self.gw.sub_written(d.id)
            await self._request(m.Unsubscribe(self._pid(), flts))
            for f in flts:
                self.subs.pop(f, None)
            self.gw.far_changed(self)
            self.gw.delivered(d.id)
        elif op == "pub":
            await self.gw.subscribed_before(d.envelope if isinstance(d, Part) else d.id, self.broker, msg.get("t", ""))
            pub = aged(s.publish_from(msg, self.params.get("v", 4)), d.created_ms, now_ms())
            if pub.qos == 1 and self.gw.cfg.qos1_once:
                pub.qos = 2  # the broker's QoS 2 dedupe: see qos1_once in policy.py
            if pub.qos == 0:
                self.writer.write(m.encode(pub, self.params.get("v", 4)))
                self.gw.counters["to_broker"] += 1
                self.gw.finished(d)
                await self._pace_qos0()
            else:
                # pipelined: the next publish goes before this one's ack comes back; unacknowledged
                # ones go again (in order, with their packet ids) when the broker connection is lost
                pub.packet_id = pub_pid(d.id)
                deadline = asyncio.get_running_loop().time() + 60
                # room in the broker's window, and the id free (a message 60,000 ids older holds it)
                while len(self.inflight) >= self.max_inflight or pub.packet_id in self.inflight:
                    if self.writer is None:
                        raise ConnectionError("broker connection lost")
                    await self._wait_room(deadline)
                pub.dup = d.id in self._sent
                if pub.dup:  # sent before and not acknowledged (a broker connection lost meanwhile)
                    self.gw.counters["to_broker_again"] += 1
                self.inflight[pub.packet_id] = (d, msg)
                self._sent.add(d.id)
                if d.id in self._released:  # the broker has it (and may have released it): finish
                    self.writer.write(m.encode(m.PubRel(pub.packet_id), self.params.get("v", 4)))
                else:
                    self.writer.write(m.encode(pub, self.params.get("v", 4)))

    def _ping(self) -> None:
        self._pings_out += 1
        self.writer.write(m.encode(m.PingReq(), self.params.get("v", 4)))

    async def _pace_qos0(self) -> None:
        """After a QoS 0 publish: a PINGREQ every FAR_QOS0_CHUNK, and wait while more than one is
        unanswered (FAR_QOS0_CHUNK above).  Never raises: the publish is written and done.  A lost
        connection ends the wait; so does a broker that answers no PINGREQ for FAR_PING_WAIT_S,
        whose connection is then dropped (MQTT: a client SHOULD close it) and made again by the
        next message."""
        self._q0_written += 1
        if self._q0_written < FAR_QOS0_CHUNK or self.writer is None:
            return
        self._q0_written = 0
        self._ping()
        deadline = asyncio.get_running_loop().time() + FAR_PING_WAIT_S
        while self._pings_out > 1 and self.writer is not None:
            try:
                await self._wait_room(deadline)
            except asyncio.TimeoutError:
                log.warning(
                    "session %s: broker %s answered no PINGREQ for %.0f s; reconnecting",
                    self.key(),
                    self.broker,
                    FAR_PING_WAIT_S,
                )
                self._drop()
                return

    async def _wait_room(self, deadline: float) -> None:
        """Until the broker answers (a PUBACK or PUBCOMP frees a place in flight, a PINGRESP comes)
        or the connection drops, at most a second; raises past the deadline.  Woken by the answer
        itself, not by a poll (decision 0007)."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise asyncio.TimeoutError("the broker acknowledged nothing for 60 s")
        self._room.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(remaining, 1.0)):
                await self._room.wait()

    async def _settle(self) -> None:
        """Wait until the broker has acknowledged every publish in flight on this connection
        (ending the connection earlier would send them again on the next: duplicates)."""
        deadline = asyncio.get_running_loop().time() + 30
        while self.inflight and self.writer is not None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        if self.inflight and self.writer is not None:
            raise ConnectionError(f"{len(self.inflight)} publishes not acknowledged by the broker in 30 s")

    def _broker_expiry(self) -> int:
        """The session expiry the broker is asked for: the client's, cut to persistent_client_expiration."""
        sx = self.params["sx"]
        cap = int(self.gw.cfg.limits.persistent_client_expiration)
        return min(sx, cap) if cap and isinstance(sx, int) else sx

    def _drop_clean(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                v = self.params.get("v", 4)
                props = {"session_expiry_interval": self._broker_expiry()} if v == 5 and "sx" in self.params else {}
                self.writer.write(m.encode(m.Disconnect(0, props), v))
                self.writer.close()
            self.writer = None
