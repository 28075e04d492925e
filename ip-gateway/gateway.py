"""The MQTT split-session gateway: the asyncio shell, inside the overlay node process.

Near side (clients here): answers CONNECT, SUBSCRIBE, UNSUBSCRIBE and PINGREQ
itself; a QoS 1/2 PUBLISH is acknowledged only once its envelope is durable in
custody (publishes read together are committed together: one fsync per read,
not per message).  Far side (broker here): one MQTT connection per origin
client at the real broker, with the client's own id, clean-start flag and will;
an envelope is consumed (so its origin is acked) only once the broker accepted
it (PUBACK, PUBCOMP, SUBACK); publications the broker sends are put in custody
before the broker gets its PUBACK, and travel back as "msg" envelopes.

Sessions (subscriptions, clean flag, will) are kept in <storage>/mqtt-sessions.cbor
(CBOR: wills and properties carry bytes)
on both sides, so they survive outages and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field

import cbor2

from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway import session as s
from c2dtn.ip_gateway.policy import BridgeConfig, GatewayConfig, TopicRule
from c2dtn.overlay.custody import Delivery, QuotaExceeded
from c2dtn.overlay.envelope import Priority
from c2dtn.overlay.node import now_ms

log = logging.getLogger("c2dtn.gateway")

CONTROL_LIFETIME_MS = 7 * 24 * 3600 * 1000
IP_TRANSPARENT = 19  # not in Python 3.11's socket module


def lifetime_ms(rule: TopicRule, p: m.Publish) -> int:
    """The rule's lifetime, shortened by an MQTT 5 message expiry."""
    life = rule.lifetime_s * 1000
    if "message_expiry_interval" in p.properties:
        life = max(1000, min(life, p.properties["message_expiry_interval"] * 1000))
    return life


def aged(pub: m.Publish, created_ms: int) -> m.Publish:
    """An MQTT 5 message expiry counts down what is left after the crossing."""
    if "message_expiry_interval" in pub.properties:
        age_s = max(0, now_ms() - created_ms) // 1000
        pub.properties["message_expiry_interval"] = max(1, pub.properties["message_expiry_interval"] - age_s)
    return pub


@dataclass
class NearSession:
    client: str
    broker: str
    far: str
    version: int = 4
    clean: bool = True
    subs: dict[str, int] = field(default_factory=dict)


class NearConn:
    """One client connection at the near gateway."""

    def __init__(self, gw: "MqttGateway", reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 broker: tuple[str, int]):
        self.gw, self.reader, self.writer = gw, reader, writer
        self.broker = f"{broker[0]}:{broker[1]}"
        self.parser = m.Parser(gw.cfg.max_packet_size)
        self.sess: NearSession | None = None
        self.qos2_in: set[int] = set()  # PUBLISH QoS 2 ids taken, PUBREL not yet seen
        self.next_pid = 1
        self.out_pids: dict[int, int] = {}  # packet id -> inbox id of a "msg" sent to the client
        self.clean_exit = False
        self.closed = False

    @property
    def version(self) -> int:
        return self.parser.version or 4

    def send(self, *pkts: m.Packet) -> None:
        if not self.closed:
            self.writer.write(b"".join(m.encode(p, self.version) for p in pkts))

    async def run(self) -> None:
        peer = self.writer.get_extra_info("peername")
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                try:
                    pkts = self.parser.feed(data)
                except m.MqttError as e:
                    self.gw.counters["protocol_errors"] += 1
                    log.warning("client %s (%s) sent a bad packet: %s (reason 0x%02x); closing its connection",
                                self.sess.client if self.sess else "?", peer, e, e.reason)
                    if self.sess is None and self.parser.version is None:
                        code = e.reason if e.reason == m.Reason.UNSUPPORTED_PROTOCOL_VERSION else None
                        if code is not None:
                            self.writer.write(m.encode(m.ConnAck(False, m.connack_code_v3(code)), 4))
                    elif self.version == 5:
                        self.send(m.Disconnect(e.reason, {"reason_string": str(e)[:200]}))
                    break
                if not await self.handle(pkts):
                    break
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            with contextlib.suppress(Exception):
                self.writer.close()
            self.gw.near_closed(self)

    async def handle(self, pkts: list[m.Packet]) -> bool:
        """Answer one read's packets; publishes go to custody together before any is acked."""
        subs: list[tuple[str, bytes, int, Priority, str | None]] = []
        marks: list[tuple[str, bytes, bool] | None] = []
        replies: list[m.Packet] = []
        for p in pkts:
            if isinstance(p, m.Connect):
                if self.sess is not None:
                    self.send(m.Disconnect(m.Reason.PROTOCOL_ERROR)) if self.version == 5 else None
                    return False
                ack = self.gw.near_connect(self, p)
                self.send(ack)
                if ack.reason:
                    return False
                continue
            if self.sess is None:
                return False
            if isinstance(p, m.Publish):
                self._publish(p, subs, marks, replies)
            elif isinstance(p, m.PubRel):
                self.qos2_in.discard(p.packet_id)
                replies.append(m.PubComp(p.packet_id))
            elif isinstance(p, m.Subscribe):
                granted = self.gw.near_subscribe(self, p)
                replies.append(m.SubAck(p.packet_id, granted))
            elif isinstance(p, m.Unsubscribe):
                self.gw.near_unsubscribe(self, p)
                replies.append(m.UnsubAck(p.packet_id, [0] * len(p.filters) if self.version == 5 else []))
            elif isinstance(p, m.PingReq):
                replies.append(m.PingResp())
            elif isinstance(p, (m.PubAck, m.PubComp)):
                self.gw.delivered(self.out_pids.pop(p.packet_id, None))
            elif isinstance(p, m.PubRec):
                replies.append(m.PubRel(p.packet_id))
            elif isinstance(p, m.Disconnect):
                self.clean_exit = p.reason != m.Reason.DISCONNECT_WITH_WILL
                break
        if subs:
            try:
                self.gw.submit_many(subs, marks)
            except QuotaExceeded as e:
                log.warning("custody full, refusing %d publishes from %s: %s", len(subs), self.sess.client, e)
                if self.version == 5:
                    replies = [m.PubAck(r.packet_id, m.Reason.QUOTA_EXCEEDED) if isinstance(r, m.PubAck) else r
                               for r in replies]
                else:
                    return False  # 3.1.1 has no refusal: the client resends after reconnecting
        self.send(*replies)
        return not isinstance(pkts[-1], m.Disconnect) if pkts else True

    def _publish(self, p: m.Publish, subs: list, marks: list, replies: list) -> None:
        if p.qos == 2 and p.packet_id in self.qos2_in:
            replies.append(m.PubRec(p.packet_id))  # a resend before PUBREL: taken already
            return
        gw = self.gw
        rule = gw.cfg.policy.rule_for(p.topic)
        if rule is None:
            gw.counters["held_local"] += 1
        else:
            body = s.pack("pub", self.sess.client, self.broker, t=p.topic, p=p.payload, q=p.qos, r=p.retain,
                          x=s.props_out(p.properties))
            subs.append((self.sess.far, body, lifetime_ms(rule, p), rule.priority, rule.key(p.topic)))
            # a PUBLISH resent with DUP after this gateway crashed between its commit and the client
            # hearing PUBACK is the same (client, packet id, content): custody skips it
            marks.append(None if not p.qos else (
                f"mqtt:{self.sess.client}:{p.packet_id}",
                hashlib.blake2b(p.topic.encode() + b"\0" + p.payload, digest_size=8).digest(), p.dup))
            gw.counters["published"] += 1
        if p.qos == 1:
            replies.append(m.PubAck(p.packet_id))
        elif p.qos == 2:
            self.qos2_in.add(p.packet_id)
            replies.append(m.PubRec(p.packet_id))

    def deliver(self, d: Delivery, msg: dict) -> bool:
        """Send a publication from the far broker; True if it is done (QoS 0) at once."""
        pub = aged(s.publish_from(msg, self.version), d.created_ms)
        sub_qos = max((q for f, q in self.sess.subs.items() if m.topic_matches(f, pub.topic)), default=pub.qos)
        pub.qos = min(pub.qos, sub_qos)
        if pub.qos:
            pid = self.next_pid
            self.next_pid = pid % 65535 + 1
            pub.packet_id = pid
            self.out_pids[pid] = d.id
        self.send(pub)
        return pub.qos == 0


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
        self._conn: asyncio.StreamWriter | None = None  # the newest broker connection
        self.connack: asyncio.Future | None = None
        self.next_pid = 1
        self.present = False  # the origin client is connected at its near gateway
        self._lock = asyncio.Lock()
        if state is not None:  # a session from before a restart: reconnect at once, with its subscriptions
            self.params, self.subs = state["params"], state["subs"]
            self.present = state.get("present", True)
        self.task = asyncio.create_task(self._run(resume=state is not None))
        self._pinger = asyncio.create_task(self._keepalive())

    def key(self) -> str:
        return f"{self.origin}/{self.client}"

    def _pid(self) -> int:
        pid = self.next_pid
        self.next_pid = pid % 65535 + 1
        return pid

    async def _keepalive(self) -> None:
        """PINGREQ within the keep alive; while the client is present and has subscriptions,
        a lost broker connection is made again at once (publications wait for it there)."""
        while True:
            await asyncio.sleep(max(1.0, (self.params.get("ka") or 60) / 2))
            if self.writer is not None:
                self.writer.write(m.encode(m.PingReq(), self.params.get("v", 4)))
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
        self.connack = asyncio.get_running_loop().create_future()
        props = {"session_expiry_interval": self.params["sx"]} if v == 5 and "sx" in self.params else {}
        writer.write(m.encode(m.Connect(self.client, self.params.get("cs", False), self.params.get("ka", 60), None,
                                        None, s.will_in(self.params.get("w")), v, props), v))
        self._reader_task = asyncio.create_task(self._read(reader, writer))
        ack = await asyncio.wait_for(self.connack, 30)
        if ack.reason:
            raise ConnectionError(f"broker {self.broker} refused client {self.client}: reason 0x{ack.reason:02x}")
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
        again = sorted(self.inflight.values(), key=lambda x: x[0].id)
        self.inflight.clear()
        while not self.queue.empty():
            again.append(self.queue.get_nowait())
        for x in again:
            self.queue.put_nowait(x)

    async def _from_broker(self, p: m.Packet, writer) -> None:
        v = self.params.get("v", 4)
        if isinstance(p, m.ConnAck):
            if self.connack and not self.connack.done():
                self.connack.set_result(p)
        elif isinstance(p, (m.PubAck, m.PubComp)) and p.packet_id in self.inflight:
            self.gw.delivered(self.inflight.pop(p.packet_id)[0].id)
        elif isinstance(p, (m.PubAck, m.PubComp, m.SubAck, m.UnsubAck)):
            f = self.waiting.pop(p.packet_id, None)
            if f and not f.done():
                f.set_result(p)
        elif isinstance(p, m.PubRec):
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
                except QuotaExceeded as e:
                    log.warning("custody full, broker publication for %s not taken: %s", self.key(), e)
                    return  # no ack: the broker sends it again
            if p.qos == 1:
                writer.write(m.encode(m.PubAck(p.packet_id), v))
            elif p.qos == 2:
                writer.write(m.encode(m.PubRec(p.packet_id), v))

    def _envelopes(self, p: m.Publish, rule: TopicRule) -> list[tuple[str, bytes, int, Priority, str | None]]:
        """What a publication from the broker becomes: one "msg" back to the origin client."""
        self.gw.counters["returned"] += 1
        body = s.pack("msg", self.client, self.broker, t=p.topic, p=p.payload, q=p.qos, r=p.retain,
                      x=s.props_out(p.properties))
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
                    self.gw.delivered(d.id)
                    break

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None

    async def _apply(self, d: Delivery, msg: dict) -> None:
        op = msg["op"]
        if op == "conn":
            self.params = {k: msg[k] for k in ("v", "cs", "ka", "sx", "w") if k in msg}
            if self.params.get("cs"):
                self.subs.clear()
            self.present = True
            await self._settle()  # what went on the old connection is the broker's before it ends
            async with self._lock:
                self._drop_clean()
                await self._connect()
            self.gw.far_changed(self)
            self.gw.delivered(d.id)
            return
        if op == "disc":
            self.present = False
            self.gw.far_changed(self)
            await self._settle()  # what the client published before it left is the broker's first
            if self.writer is not None:
                if msg.get("w"):
                    self._drop()  # no DISCONNECT: the broker publishes the will
                else:
                    self._drop_clean()
            self.gw.delivered(d.id)
            return
        await self._ensure_connected()
        if op == "sub":
            subs = [m.SubOption(x[0], *x[1:5]) for x in msg.get("s", []) if isinstance(x, list) and x]
            await self._request(m.Subscribe(self._pid(), subs))
            for so in subs:
                self.subs[so.filter] = [so.qos, so.no_local, so.retain_as_published, so.retain_handling]
            self.gw.far_changed(self)
            self.gw.delivered(d.id)
        elif op == "unsub":
            flts = [f for f in msg.get("f", []) if isinstance(f, str)]
            await self._request(m.Unsubscribe(self._pid(), flts))
            for f in flts:
                self.subs.pop(f, None)
            self.gw.far_changed(self)
            self.gw.delivered(d.id)
        elif op == "pub":
            pub = aged(s.publish_from(msg, self.params.get("v", 4)), d.created_ms)
            if pub.qos == 0:
                self.writer.write(m.encode(pub, self.params.get("v", 4)))
                self.gw.delivered(d.id)
            else:
                # pipelined: the next publish goes before this one's ack comes back; unacknowledged
                # ones go again (in order) when the broker connection is lost
                pub.packet_id = self._pid()
                self.inflight[pub.packet_id] = (d, msg)
                self.writer.write(m.encode(pub, self.params.get("v", 4)))
                deadline = asyncio.get_running_loop().time() + 60
                while len(self.inflight) > 200 and self.writer is not None:
                    if asyncio.get_running_loop().time() > deadline:
                        raise asyncio.TimeoutError("the broker acknowledged nothing for 60 s")
                    await asyncio.sleep(0.005)

    async def _settle(self) -> None:
        """Wait until the broker has acknowledged every publish in flight on this connection
        (ending the connection earlier would send them again on the next: duplicates)."""
        deadline = asyncio.get_running_loop().time() + 30
        while self.inflight and self.writer is not None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        if self.inflight and self.writer is not None:
            raise ConnectionError(f"{len(self.inflight)} publishes not acknowledged by the broker in 30 s")

    def _drop_clean(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.write(m.encode(m.Disconnect(), self.params.get("v", 4)))
                self.writer.close()
            self.writer = None


class BridgeSession(FarSession):
    """Bridge mode: the gateway is one client of the local broker.  It subscribes there
    to the `out` filters (MQTT 5, no-local, so what it publishes itself never comes
    back) and sends each publication the allow-list releases to every peer gateway as
    a "bpub" envelope; "bpub" envelopes from peers whose topic matches an `in` filter it
    publishes here.  The broker keeps its session (clean start off, 7-day expiry) so
    publications queue there while the gateway restarts."""

    always_subscribe = True  # the config, not a remembered session, says what is bridged

    def __init__(self, gw: "MqttGateway", cfg: BridgeConfig):
        super().__init__(gw, "", cfg.client_id or f"c2bridge-{gw.node.cfg.id}", f"{cfg.broker[0]}:{cfg.broker[1]}",
                         {"params": {"v": 5, "cs": False, "ka": 60, "sx": 7 * 24 * 3600},
                          "subs": {f: [cfg.qos, True, True, 0] for f in cfg.out}, "present": True})
        self.cfg = cfg

    def key(self) -> str:
        return f"bridge/{self.client}"

    def _envelopes(self, p: m.Publish, rule: TopicRule) -> list[tuple[str, bytes, int, Priority, str | None]]:
        self.gw.counters["bridged_out"] += 1
        body = s.pack("bpub", self.client, self.broker, t=p.topic, p=p.payload, q=p.qos, r=p.retain,
                      x=s.props_out(p.properties))
        return [(peer, body, lifetime_ms(rule, p), rule.priority, rule.key(p.topic)) for peer in self.cfg.peers]

    def accepts(self, topic: str) -> bool:
        return any(m.topic_matches(f, topic) for f in self.cfg.in_)


class MqttGateway:
    name = "mqtt"

    def __init__(self, node, cfg: GatewayConfig):
        self.node, self.cfg = node, cfg
        self.core = node.core
        self.counters: Counter[str] = Counter()
        self.near: dict[str, NearConn] = {}
        self.near_sessions: dict[str, NearSession] = {}
        self.far: dict[str, FarSession] = {}
        self._taken: set[int] = set()
        self._done: list[int] = []
        self._mark = 0  # inbox ids up to here have been handed out (or kept for an absent client)
        self.state_path = node.cfg.storage / "mqtt-sessions.cbor"
        self._servers: list[asyncio.AbstractServer] = []
        self._tproxy = None
        self.bridge: BridgeSession | None = None

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        self._load()
        for key, st in self._far_state.items():
            self.far[key] = FarSession(self, st["origin"], st["client"], st["broker"], st)
        if self.cfg.bridge:
            self.bridge = BridgeSession(self, self.cfg.bridge)
            log.info("bridging broker %s: out %s, in %s, peers %s", self.bridge.broker, self.cfg.bridge.out,
                     self.cfg.bridge.in_, self.cfg.bridge.peers)
        self.node.app_handlers[s.APP] = self.on_inbox
        if self.cfg.listen:
            srv = await asyncio.start_server(lambda r, w: self._accept(r, w, self.cfg.broker), *self.cfg.listen)
            self._servers.append(srv)
            log.info("MQTT listener on %s:%d for broker %s:%d", *self.cfg.listen, *self.cfg.broker)
        if self.cfg.tproxy:
            from c2dtn.ip_gateway import tproxy

            self._tproxy = tproxy.install(self.cfg.tproxy_port)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
            sock.bind(("0.0.0.0", self.cfg.tproxy_port))
            srv = await asyncio.start_server(lambda r, w: self._accept(r, w, w.get_extra_info("sockname")[:2]),
                                             sock=sock)
            self._servers.append(srv)
            log.info("intercepting MQTT (TCP 1883) crossing this box, TPROXY to port %d", self.cfg.tproxy_port)
        self.on_inbox()

    async def stop(self) -> None:
        if self._done:
            self._flush_done()
        for srv in self._servers:
            srv.close()
        for c in list(self.near.values()):
            c.writer.close()
        for f in [*self.far.values(), *([self.bridge] if self.bridge else [])]:
            f.cancel()
        if self._tproxy:
            from c2dtn.ip_gateway import tproxy

            tproxy.remove(self._tproxy)

    def _load(self) -> None:
        self._far_state = {}
        try:
            st = cbor2.loads(self.state_path.read_bytes())
        except FileNotFoundError:
            return
        except (ValueError, OSError, cbor2.CBORDecodeError) as e:
            log.error("MQTT session file %s unreadable (%s): starting without sessions", self.state_path, e)
            return
        try:
            for c, n in st.get("near", {}).items():
                self.near_sessions[c] = NearSession(c, n["broker"], n["far"], n["version"], n["clean"], n["subs"])
            self._far_state = {k: f for k, f in st.get("far", {}).items()
                               if all(x in f for x in ("origin", "client", "broker", "params", "subs"))}
        except (AttributeError, KeyError, TypeError) as e:
            log.error("MQTT session file %s damaged (%s): starting without sessions", self.state_path, e)
            self.near_sessions.clear()

    def _save(self) -> None:
        st = {"near": {c: n.__dict__ for c, n in self.near_sessions.items() if not n.clean},
              "far": {k: {"origin": f.origin, "client": f.client, "broker": f.broker, "params": f.params,
                          "subs": f.subs, "present": f.present} for k, f in self.far.items()}}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_bytes(cbor2.dumps(st))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        tmp.replace(self.state_path)

    # -- custody -------------------------------------------------------------
    def submit_many(self, items: list[tuple[str, bytes, int, Priority, str | None]],
                    marks: list[tuple[str, bytes, bool] | None] | None = None) -> None:
        now = now_ms()
        self.core.store.submit_many([(dst, body, life, prio, sup, s.APP) for dst, body, life, prio, sup in items], now,
                                    marks)
        self.node.wake()

    def delivered(self, inbox_id: int | None) -> None:
        """Done with an envelope (the broker or client acknowledged it).  Consumption is
        durable (a power cut must not make the broker see it twice), so the ids done in
        one turn of the event loop share one commit."""
        if inbox_id is None:
            return
        self._taken.add(inbox_id)  # not handed out again before the commit
        self._done.append(inbox_id)
        if len(self._done) == 1:
            asyncio.get_running_loop().call_soon(self._flush_done)

    def _flush_done(self) -> None:
        ids, self._done = self._done, []
        self.core.consumed(ids)
        self._taken.difference_update(ids)
        self.node.wake()

    # -- near side -----------------------------------------------------------
    async def _accept(self, reader, writer, broker) -> None:
        conn = NearConn(self, reader, writer, broker)
        await conn.run()

    def near_connect(self, conn: NearConn, p: m.Connect) -> m.ConnAck:
        bad = 0x85 if p.version == 5 else 2
        props = {}
        client = p.client_id
        if not client:
            if not p.clean_start:
                return m.ConnAck(False, bad)
            client = "c2-" + os.urandom(6).hex()
            props["assigned_client_identifier"] = client
        far = self.cfg.policy.gateway_for(conn.broker.rsplit(":", 1)[0])
        if far is None:
            log.warning("no gateway serves broker %s (client %s): refusing", conn.broker, client)
            return m.ConnAck(False, 0x88 if p.version == 5 else 3, props)
        old = self.near.get(client)
        if old is not None and old is not conn:
            old.clean_exit = True  # taken over: no will
            old.closed = True
            old.writer.close()
        prev = self.near_sessions.get(client)
        present = bool(prev and not p.clean_start and not prev.clean)
        sess = prev if present else NearSession(client, conn.broker, far, p.version, p.clean_start)
        sess.version, sess.clean, sess.broker, sess.far = p.version, p.clean_start, conn.broker, far
        self.near_sessions[client] = sess
        conn.sess = sess
        self.near[client] = conn
        kw = {"v": p.version, "cs": p.clean_start, "ka": p.keepalive}
        if "session_expiry_interval" in p.properties:
            kw["sx"] = p.properties["session_expiry_interval"]
        if p.will:
            kw["w"] = s.will_out(p.will)
        self.submit_many([(far, s.pack("conn", client, conn.broker, **kw), CONTROL_LIFETIME_MS, Priority.IMMEDIATE,
                           None)])
        self._save()
        self.counters["connects"] += 1
        asyncio.get_running_loop().call_soon(self.on_inbox, True)  # publications kept for a resumed session
        return m.ConnAck(present, 0, props)

    def near_subscribe(self, conn: NearConn, p: m.Subscribe) -> list[int]:
        sess = conn.sess
        for so in p.subscriptions:
            sess.subs[so.filter] = so.qos
        body = s.pack("sub", sess.client, sess.broker, s=[[so.filter, so.qos, so.no_local, so.retain_as_published,
                                                           so.retain_handling] for so in p.subscriptions])
        self.submit_many([(sess.far, body, CONTROL_LIFETIME_MS, Priority.IMMEDIATE, None)])
        self._save()
        return [so.qos for so in p.subscriptions]

    def near_unsubscribe(self, conn: NearConn, p: m.Unsubscribe) -> None:
        sess = conn.sess
        for f in p.filters:
            sess.subs.pop(f, None)
        self.submit_many([(sess.far, s.pack("unsub", sess.client, sess.broker, f=p.filters), CONTROL_LIFETIME_MS,
                           Priority.IMMEDIATE, None)])
        self._save()

    def near_closed(self, conn: NearConn) -> None:
        if conn.sess is None or self.near.get(conn.sess.client) is not conn:
            return
        del self.near[conn.sess.client]
        for inbox_id in conn.out_pids.values():
            self._taken.discard(inbox_id)  # unacked by the client: sent again when it is back
        sess = conn.sess
        try:
            self.submit_many([(sess.far, s.pack("disc", sess.client, sess.broker, w=not conn.clean_exit),
                               CONTROL_LIFETIME_MS, Priority.IMMEDIATE, None)])
        except QuotaExceeded as e:
            log.warning("custody full, cannot tell %s that %s left: %s", sess.far, sess.client, e)
        if sess.clean:
            self.near_sessions.pop(sess.client, None)
            self._save()

    # -- envelopes from the other side ------------------------------------------
    def on_inbox(self, full: bool = False) -> None:
        """Hand out envelopes that arrived since the last call; `full` looks at all of them
        again (those kept for a client that was away, once it is back)."""
        cursor = 0 if full else self._mark
        while True:
            batch = self.core.take(10_000, app=s.APP, after=cursor)
            if not batch:
                return
            cursor = batch[-1].id
            self._mark = max(self._mark, cursor)
            self._hand_out(batch)

    def _hand_out(self, batch: list[Delivery]) -> None:
        for d in batch:
            if d.id in self._taken:
                continue
            try:
                msg = s.unpack(d.body)
            except s.BodyError as e:
                self.counters["bad_bodies"] += 1
                log.warning("MQTT envelope %s:%d from %s dropped: %s", d.origin, d.seq, d.origin, e)
                self.delivered(d.id)
                continue
            if msg["op"] == "msg":
                conn = self.near.get(msg["c"])
                if conn is None:
                    if msg["c"] not in self.near_sessions:
                        self.counters["msg_no_session"] += 1
                        self.delivered(d.id)  # nobody will come for it
                    continue  # kept in custody until the client is back
                self._taken.add(d.id)
                try:
                    done = conn.deliver(d, msg)
                except (ValueError, TypeError, KeyError, struct.error) as e:
                    self.counters["bad_bodies"] += 1
                    log.warning("publication %s:%d for %s dropped: %s", d.origin, d.seq, msg["c"], e)
                    done = True
                if done:
                    self.delivered(d.id)
                continue
            if msg["op"] == "bpub":
                if self.bridge is None or not self.bridge.accepts(msg["t"]):
                    self.counters["bridge_refused"] += 1
                    log.warning("bridged publication on %r from %s refused: %s", msg["t"], d.origin,
                                "no bridge here" if self.bridge is None else "no `in` filter matches")
                    self.delivered(d.id)
                    continue
                self._taken.add(d.id)
                self.counters["bridged_in"] += 1
                self.bridge.queue.put_nowait((d, {**msg, "op": "pub"}))
                continue
            self._taken.add(d.id)
            f = self._far_session(d.origin, msg["c"], msg["b"])
            f.queue.put_nowait((d, msg))

    def _far_session(self, origin: str, client: str, broker: str) -> FarSession:
        key = f"{origin}/{client}"
        f = self.far.get(key)
        if f is None or f.broker != broker:
            if f is not None:
                f.cancel()
            f = self.far[key] = FarSession(self, origin, client, broker)
        return f

    def far_changed(self, f: FarSession) -> None:
        self._save()

    def status(self) -> dict:
        return {"clients": sorted(self.near), "sessions_near": len(self.near_sessions),
                "sessions_far": {k: {"broker": f.broker, "connected": f.writer is not None, "subs": sorted(f.subs),
                                     "queued": f.queue.qsize()} for k, f in self.far.items()},
                "bridge": None if self.bridge is None else {
                    "broker": self.bridge.broker, "connected": self.bridge.writer is not None,
                    "out": self.cfg.bridge.out, "in": self.cfg.bridge.in_, "peers": self.cfg.bridge.peers,
                    "queued": self.bridge.queue.qsize()},
                "counters": dict(self.counters)}
