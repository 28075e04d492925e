"""The near side of the MQTT gateway (where the clients are) as a state machine
without I/O, in the manner of h11: bytes and the time in; bytes to write,
envelopes to commit, deliveries done and deadlines out.  The asyncio shell
(near.py) owns the sockets and the custody store and does what the events say.

One NearCore serves every client connection of a gateway, because sessions
outlive connections and a client id may move between them (takeover).

    core.open(conn, broker, now, source) -> events  a client connected (broker: "ip:port" it meant)
    core.data(conn, bytes, now)      -> events    what it sent
    core.committed(conn, ok, now)    -> events    after a Submit: the store took it (ok) or was full
    core.deliver(client, id, msg, ...) -> events  a publication from the far broker (None: not connected)
    core.closed(conn, now)           -> events    the connection is gone (will unless DISCONNECT)
    core.tick(now)                   -> events    keep alive and session expiry; next_deadline() says when

Events: Write(conn, data), Close(conn) (after the writes before it), Submit(conn,
envelopes, marks) (commit, then call committed() with the outcome: the replies that
need the commit wait for it), Done(inbox id) (the client took a delivery, or it was
dropped for this client), Release(ids) (deliveries a departed client never acked:
hand them out again when it is back), SessionsChanged (persist), Resume(client)
(a session is back: hand it what waited in custody), Ended(client) (a session expired:
what waited for it is dropped), Answered(keys) (the PUBACKs of publishes with these custody
marks were written: drop the marks, so a DUP reusing the packet id is a new message).

What MQTT 5 asks of a server here, beyond QoS 0/1/2 both ways and keep alive:
session expiry (a session outlives its connection by its Session Expiry Interval;
3.1.1: clean session 0 keeps it for good), topic aliases from the client (up to the
Topic Alias Maximum announced in CONNACK; 0 or above it is DISCONNECT 0x94), the
client's Maximum Packet Size (a larger publication is dropped for that client, as
the spec says), its Receive Maximum (no more QoS 1/2 publications in flight to it;
the rest wait in order) and subscription identifiers (carried on the publications
that match).  `now` is wall-clock seconds: session expiry must survive a restart.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import cbor2

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.auth import READ, WRITE, Auth
from c2dtn.ip_gateway.policy import Policy, SessionLimits, TopicRule
from c2dtn.overlay.port import LOCAL_BUCKETS_S, MAX_MESSAGE_BYTES, Histogram, Priority
from c2dtn.spells import Spell

if TYPE_CHECKING:
    from c2dtn.overlay.port import Mark

log = logging.getLogger("c2dtn.gateway")

CONTROL_LIFETIME_MS = 7 * 24 * 3600 * 1000
TOPIC_ALIAS_MAX = 64  # announced to MQTT 5 clients in CONNACK
NEVER = 0xFFFFFFFF  # a session expiry interval that never ends (and 3.1.1's clean session 0)
KEEPALIVE_GRACE = 1.5  # a client silent for 1.5 x its keep alive is gone (spec 3.1.2.10)
CONNECT_TIMEOUT_S = 10.0  # a connection that sent no CONNECT by then is closed
CONNECT_MAX_BYTES = 256 << 10  # the largest packet taken before CONNECT (a CONNECT with a will)
CONNECT_WAITING_PER_ADDRESS = 16  # connections from one address waiting for their CONNECT, by default

Envelope = tuple[str, bytes, int, Priority, str | None]  # (destination, body, lifetime ms, priority, supersession key)


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Write:
    conn: int
    data: bytes


@dataclass(frozen=True)
class Close:
    conn: int


@dataclass(frozen=True)
class Submit:
    conn: int | None  # None: nothing waits for the outcome
    envelopes: list[Envelope]
    marks: list[Mark] | None = None  # a batch's: a list


@dataclass(frozen=True)
class Done:
    inbox_id: int


@dataclass(frozen=True)
class Release:
    inbox_ids: tuple[int, ...]


@dataclass(frozen=True)
class SessionsChanged:
    pass


@dataclass(frozen=True)
class Resume:
    client: str


@dataclass(frozen=True)
class Ended:
    """A session expired: what waits in custody for it is for nobody now."""

    client: str


@dataclass(frozen=True)
class Answered:
    """The PUBACK/PUBREC of these publishes (their custody marks' keys) were written: a DUP with
    the same packet id is a new message from now on (the client may reuse a PUBACKed id)."""

    keys: list[str]


Event = Write | Close | Submit | Done | Release | SessionsChanged | Resume | Ended | Answered


PUB_PIDS = 60_000


def pub_pid(inbox_id: int) -> int:
    """The packet id of a publication to a client: from its custody inbox id, so a resend
    after a reconnect or a gateway restart carries the id the client may still hold (below
    60,001; 3.1.1 4.4 and 5.0 4.4 ask for the original id).  The far side does the same."""
    return inbox_id % PUB_PIDS + 1


# -- state ----------------------------------------------------------------------------------
@dataclass
class _Part:
    """A publish that may share an envelope with the ones read with it (NearCore._batched)."""

    far: str
    client: str
    broker: str
    life: int
    priority: Priority
    fields: dict


@dataclass
class NearSession:
    """What outlives a connection (kept in the session file)."""

    client: str
    broker: str
    far: str
    version: int = 4
    subs: dict[str, int] = field(default_factory=dict)  # filter -> QoS
    sub_ids: dict[str, int] = field(default_factory=dict)  # filter -> subscription identifier (MQTT 5)
    expiry_s: int = 0  # session expiry interval
    expires_at: float | None = None  # wall time it ends, while no connection has it
    user: str | None = None  # the user name its client logged in with
    owned: bool = True  # False: from a file without users (anyone's)
    # not in the file (a restarted gateway resends as PUBLISH, under the same id: pub_pid):
    sent: set[int] = field(default_factory=set)  # inbox ids sent to the client, not yet acknowledged
    released: set[int] = field(default_factory=set)  # QoS 2 inbox ids whose PUBREC came, PUBCOMP not

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("sent", "released")}

    @classmethod
    def from_dict(cls, d: dict) -> NearSession:
        sess = cls(
            d["client"],
            d["broker"],
            d["far"],
            d.get("version", 4),
            dict(d.get("subs", {})),
            dict(d.get("sub_ids", {})),
            d.get("expiry_s", 0 if d.get("clean", True) else NEVER),
            d.get("expires_at"),
            d.get("user") if isinstance(d.get("user"), str) else None,
            "user" in d,
        )
        return sess


@dataclass
class _Out:
    inbox_id: int
    pub: m.Publish
    released: bool = False  # QoS 2: PUBREC seen, PUBREL sent


class _Conn:
    def __init__(self, cid: int, broker: str, max_packet_size: int, now: float):
        self.id, self.broker = cid, broker
        self.parser = m.Parser(max_packet_size, connect_max=CONNECT_MAX_BYTES)
        self.sess: NearSession | None = None
        self.qos2_in: set[int] = set()  # QoS 2 packet ids taken, PUBREL not yet seen
        self.out: dict[int, _Out] = {}  # packet id -> publication in flight to the client
        self.waiting: deque[tuple[int, m.Publish]] = deque()  # beyond the client's Receive Maximum
        self.aliases: dict[int, str] = {}
        self.keepalive = 0
        self.receive_max = 65535
        self.max_packet: int | None = None
        self.last_rx = self.opened = now
        self.clean_exit = False
        self.user: str | None = None  # the user name it logged in with
        self.source = ""  # the client's address
        self.closing = False  # DISCONNECT seen or an error: close once the replies are out
        self.closed = False
        self.pending: list[m.Packet] = []  # replies waiting for a commit
        self.pending_at: list[float] = []  # when what each answers was read
        self.pending_marks: list[str] = []  # the custody marks of the publishes those replies answer
        self.resume = False
        self.disc_sx: int | None = None  # the session expiry interval its DISCONNECT set (MQTT 5)

    @property
    def session(self) -> NearSession:
        """The session of a connected client (every packet but CONNECT comes after it)."""
        assert self.sess is not None, "a packet before CONNECT reached the session's code"
        return self.sess

    @property
    def version(self) -> int:
        return self.parser.version or 4


class NearCore:
    def __init__(
        self,
        policy: Policy,
        max_packet_size: int = 1 << 20,
        batch_bytes: int = 0,
        auth: Auth | None = None,
        limits: SessionLimits | None = None,
    ):
        # a batch stays well inside the overlay's message limit, with room for its client and broker
        batch_bytes = min(batch_bytes, MAX_MESSAGE_BYTES // 2)
        self.policy = policy
        self.max_packet_size = max_packet_size
        self.batch_bytes = batch_bytes  # QoS 0/1 publishes read together share an envelope up to this (0: never)
        self.auth = auth  # who may connect, publish, subscribe ([gateway] password_file, acl_file): ip-gateway/auth.py
        self.limits = limits or SessionLimits()
        self._now = 0.0
        self._failed_logins = Spell(log, clock=lambda: self._now)
        self._bad_first = Spell(log, clock=lambda: self._now)  # one line per spell: a scan does not flood the log
        self.sessions: dict[str, NearSession] = {}
        self.active: dict[str, int] = {}  # client id -> the connection that has its session
        self.conns: dict[int, _Conn] = {}
        self.counters: Counter[str] = Counter()
        self.puback = Histogram(LOCAL_BUCKETS_S)  # seconds from a PUBLISH custody took to its PUBACK or PUBREC

    # -- connections -------------------------------------------------------------------
    def open(self, conn: int, broker: str, now: float, source: str = "") -> list[Event]:
        """A client connected, from address `source`, to `broker` ("ip:port" it meant).  Until
        its CONNECT it may send CONNECT_MAX_BYTES, for CONNECT_TIMEOUT_S.  It is closed at
        once when its address has more connections waiting for their CONNECT than
        max_connections_per_address (CONNECT_WAITING_PER_ADDRESS when that is 0); past
        max_sessions waiting in all, the oldest waiting one is closed instead, so that one
        host's idle connections cannot shut everyone else out."""
        self.conns[conn] = c = _Conn(conn, broker, self.max_packet_size, now)
        c.source = source
        lim = self.limits
        per = lim.max_connections_per_address or CONNECT_WAITING_PER_ADDRESS
        waiting = [o for o in self.conns.values() if o.sess is None and not o.closed]
        n = sum(1 for o in waiting if o.source == source) if source else 0
        self._now = now
        if n > per:
            self.counters["connects_over_limits"] += 1
            self._failed_logins.hit(
                "MQTT connections refused over the session limits, the latest: %s",
                f"{n} connections from {source} without CONNECT (at most {per})",
            )
            return self._shut(c, now)
        if len(waiting) > lim.max_sessions:
            oldest = min(waiting, key=lambda o: o.opened)
            self.counters["connect_timeouts"] += 1
            return self._shut(oldest, now)
        return []

    def data(self, conn: int, data: bytes, now: float) -> list[Event]:
        c = self.conns.get(conn)
        if c is None or c.closed or c.closing:
            return []
        c.last_rx = now
        try:
            pkts = c.parser.feed(data)
        except m.MqttError as e:
            if c.sess is None and c.parser.version is None:
                self.counters["protocol_errors"] += 1
                self._now = now
                self._bad_first.hit(
                    "connections closed on a bad first packet, the latest: %d from %s: %s (reason 0x%02x)",
                    conn,
                    c.source or "?",
                    str(e)[:200],
                    e.reason,
                )
                code = m.connack_code_v3(e.reason) if e.reason == m.Reason.UNSUPPORTED_PROTOCOL_VERSION else None
                evs = [Write(conn, m.encode(m.ConnAck(False, code), 4))] if code is not None else []
                return evs + self._shut(c, now)
            return self._fail(c, e.reason, str(e), now)
        return self._packets(c, pkts, now)

    def _packets(self, c: _Conn, pkts: list[m.Packet], now: float) -> list[Event]:
        evs: list[Event] = []
        envs: list[Envelope] = []
        marks: list[Mark] = []
        replies: list[m.Packet] = []
        for p in pkts:
            if isinstance(p, m.Connect):
                if c.sess is not None:
                    return self._fail(c, m.Reason.PROTOCOL_ERROR, "a second CONNECT", now)
                ack, env, more = self._connect(c, p, now)
                evs += more
                if env is None:
                    return evs + [Write(c.id, m.encode(ack, p.version))] + self._shut(c, now)
                envs.append(env)
                marks.append(None)
                replies.append(ack)
                continue
            if c.sess is None:
                return evs + self._shut(c, now)
            if isinstance(p, m.Publish):
                err = self._publish(c, p, envs, marks, replies)
                if err:
                    return evs + self._fail(c, err[0], err[1], now)
            elif isinstance(p, m.PubRel):
                c.qos2_in.discard(p.packet_id)
                replies.append(m.PubComp(p.packet_id))
            elif isinstance(p, m.Subscribe):
                ok = [
                    so
                    for so in p.subscriptions
                    if self.auth is None or self.auth.may(c.user, c.session.client, so.filter, READ, filter_=True)
                ]
                denied = 0x87 if c.version == 5 else 0x80
                self.counters["subscriptions_denied"] += len(p.subscriptions) - len(ok)
                if ok:
                    envs.append(self._subscribe(c, m.Subscribe(p.packet_id, ok, p.properties)))
                    marks.append(None)
                    evs.append(SessionsChanged())
                replies.append(m.SubAck(p.packet_id, [so.qos if so in ok else denied for so in p.subscriptions]))
            elif isinstance(p, m.Unsubscribe):
                sess = c.session
                for f in p.filters:
                    sess.subs.pop(f, None)
                    sess.sub_ids.pop(f, None)
                envs.append(
                    (
                        sess.far,
                        s.pack("unsub", sess.client, sess.broker, f=p.filters),
                        CONTROL_LIFETIME_MS,
                        Priority.IMMEDIATE,
                        None,
                    )
                )
                marks.append(None)
                replies.append(m.UnsubAck(p.packet_id, [0] * len(p.filters) if c.version == 5 else []))
                evs.append(SessionsChanged())
            elif isinstance(p, m.PingReq):
                replies.append(m.PingResp())
            elif isinstance(p, (m.PubAck, m.PubComp)):
                evs += self._acked(c, p.packet_id)
            elif isinstance(p, m.PubRec):
                o = c.out.get(p.packet_id)
                if o is not None and p.reason >= 0x80:  # MQTT 5: the client refused it; that is its answer
                    evs += self._acked(c, p.packet_id)
                    continue
                if o is not None:
                    o.released = True
                    c.session.released.add(o.inbox_id)
                replies.append(m.PubRel(p.packet_id))
            elif isinstance(p, m.Disconnect):
                c.clean_exit = p.reason != m.Reason.DISCONNECT_WITH_WILL
                sx = p.properties.get("session_expiry_interval")
                if sx is not None:
                    if c.session.expiry_s == 0 and sx != 0:
                        return evs + self._fail(
                            c, m.Reason.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0 at CONNECT", now
                        )
                    c.session.expiry_s = c.disc_sx = sx
                c.closing = True
                break
        if envs:
            c.pending += replies
            c.pending_at += [now] * len(replies)
            c.pending_marks += [
                k for mk in marks if mk is not None for k, _d, _r in ([mk] if isinstance(mk, tuple) else mk)
            ]
            envs, marks = self._batched(envs, marks)
            evs.append(Submit(c.id, envs, marks))
            return evs
        return evs + self._reply(c, replies, now)

    def _batched(self, envs: list, marks: list) -> tuple[list[Envelope], list]:
        """Publishes read together (one TCP read's worth), for the same far gateway, class
        and lifetime and without a supersession key, share one "pubs" envelope up to
        batch_bytes of payload: custody, sealing, bundles and acks cost per envelope, so a
        client streaming telemetry costs the gateway a fraction per message, and similar
        messages compress together on the link.  Nothing waits to be batched: only what
        arrived in the same read is.  A lone one stays a "pub".  Marks of a batch are a
        list (custody records each)."""
        out: list[Envelope] = []
        out_marks: list = []
        run: list[tuple[_Part, object]] = []
        size = 0

        def flush():
            nonlocal size
            if len(run) == 1:
                pt, mk = run[0]
                out.append((pt.far, s.pack("pub", pt.client, pt.broker, **pt.fields), pt.life, pt.priority, None))
                out_marks.append(mk)
            elif run:
                pt = run[0][0]
                out.append(
                    (
                        pt.far,
                        s.pack("pubs", pt.client, pt.broker, m=[x.fields for x, _ in run]),
                        pt.life,
                        pt.priority,
                        None,
                    )
                )
                out_marks.append([mk for _, mk in run if mk is not None] or None)
                self.counters["batched"] += len(run)
            run.clear()
            size = 0

        for env, mark in zip(envs, marks):
            if not isinstance(env, _Part):
                flush()
                out.append(env)
                out_marks.append(mark)
                continue
            # topic, payload and properties; the rest of a part is a few bytes (MAX_PARTS of them fit
            # in the room the cap on batch_bytes leaves under the message limit)
            x = env.fields["x"]
            n = len(env.fields["p"]) + len(env.fields["t"]) + (len(cbor2.dumps(x)) if x else 0)
            if run and (
                (run[0][0].far, run[0][0].life, run[0][0].priority) != (env.far, env.life, env.priority)
                or size + n > self.batch_bytes
            ):
                flush()
            run.append((env, mark))
            size += n
        flush()
        return out, out_marks

    def _reply(self, c: _Conn, replies: list[m.Packet], now: float) -> list[Event]:
        evs: list[Event] = [Write(c.id, b"".join(m.encode(r, c.version) for r in replies))] if replies else []
        if c.resume:
            c.resume = False
            evs.append(Resume(c.session.client))
        if c.closing:
            evs += self._shut(c, now)
        return evs

    def committed(self, conn: int, ok: bool, now: float) -> list[Event]:
        """The outcome of this connection's last Submit: the replies that waited for it."""
        c = self.conns.get(conn)
        if c is None:
            return []
        replies, c.pending = c.pending, []
        keys, c.pending_marks = c.pending_marks, []
        ats, c.pending_at = c.pending_at, []
        if c.closed:
            return []
        if ok:
            for r, at in zip(replies, ats):
                if isinstance(r, (m.PubAck, m.PubRec)):
                    self.puback.observe(max(0.0, now - at))
            return self._reply(c, replies, now) + ([Answered(keys)] if keys else [])
        log.debug(
            "custody full: refusing what client %s sent", c.sess.client if c.sess else "?"
        )  # the shell logs the spell
        self.counters["refused_quota"] += 1
        if c.version != 5:
            return self._shut(c, now)  # 3.1.1 has no refusal: the client resends after reconnecting
        q = m.Reason.QUOTA_EXCEEDED
        out = []
        for r in replies:
            if isinstance(r, m.PubAck):
                r = m.PubAck(r.packet_id, q)
            elif isinstance(r, m.PubRec):
                c.qos2_in.discard(r.packet_id)
                r = m.PubRec(r.packet_id, q)
            elif isinstance(r, m.SubAck):
                r = m.SubAck(r.packet_id, [q] * len(r.reasons))
            elif isinstance(r, m.ConnAck):
                c.closing = True
                r = m.ConnAck(False, q)
            out.append(r)
        c.resume = False
        return self._reply(c, out, now)

    def closed(self, conn: int, now: float) -> list[Event]:
        """The connection is gone (whatever the cause): the will goes unless DISCONNECT said
        otherwise, and the session ends now or at its expiry."""
        c = self.conns.pop(conn, None)
        if c is None or c.closed:
            return []
        c.closed = True
        evs: list[Event] = []
        ids = tuple(o.inbox_id for o in c.out.values()) + tuple(i for i, _ in c.waiting)
        if ids:
            evs.append(Release(ids))
        sess = c.sess
        if sess is None or self.active.get(sess.client) != conn:
            return evs
        del self.active[sess.client]
        # the far side ends its broker session when this one ends: an expiry DISCONNECT set goes too
        extra = {"sx": c.disc_sx} if c.disc_sx is not None else {}
        evs.append(
            Submit(
                None,
                [
                    (
                        sess.far,
                        s.pack("disc", sess.client, sess.broker, w=not c.clean_exit, **extra),
                        CONTROL_LIFETIME_MS,
                        Priority.IMMEDIATE,
                        None,
                    )
                ],
            )
        )
        cap = self.limits.persistent_client_expiration
        if sess.expiry_s == 0:
            del self.sessions[sess.client]
        elif cap and (sess.expiry_s == NEVER or sess.expiry_s > cap):  # no session outlives its client longer
            sess.expires_at = now + cap
        elif sess.expiry_s != NEVER:
            sess.expires_at = now + sess.expiry_s
        evs.append(SessionsChanged())
        return evs

    def _shut(self, c: _Conn, now: float) -> list[Event]:
        return [Close(c.id)] + self.closed(c.id, now)

    def _fail(self, c: _Conn, reason: int, why: str, now: float) -> list[Event]:
        """A protocol error: MQTT 5 hears why (DISCONNECT with the reason), then the
        connection closes; the will is published (the client did not DISCONNECT)."""
        self.counters["protocol_errors"] += 1
        log.warning(
            "client %s (connection %d): %s (reason 0x%02x); closing its connection",
            c.sess.client if c.sess else "?",
            c.id,
            why,
            reason,
        )
        evs: list[Event] = []
        if c.version == 5 and c.sess is not None:
            evs.append(Write(c.id, m.encode(m.Disconnect(reason, {"reason_string": why[:200]}), 5)))
        return evs + self._shut(c, now)

    def _over_limits(self, c: _Conn, client: str) -> str:
        """Why this CONNECT is over [gateway] max_sessions or max_connections_per_address ("": it is not)."""
        lim = self.limits
        if client not in self.sessions and len(self.sessions) >= lim.max_sessions:
            return f"{len(self.sessions)} sessions held (max_sessions {lim.max_sessions})"
        if lim.max_connections_per_address and c.source:
            n = sum(1 for o in self.conns.values() if o.source == c.source and o is not c and not o.closed)
            if n >= lim.max_connections_per_address:
                return (
                    f"{n} connections from {c.source} (max_connections_per_address {lim.max_connections_per_address})"
                )
        return ""

    # -- what a client sends -------------------------------------------------------------
    def _connect(self, c: _Conn, p: m.Connect, now: float) -> tuple[m.ConnAck, Envelope | None, list[Event]]:
        """The CONNACK, the "conn" envelope (None: refused) and what a takeover does to the old connection."""
        v5 = p.version == 5
        props: m.Properties = {}
        replaced: list[Event] = []  # another user's session this client id had, ended
        client = p.client_id
        if not client:
            if not p.clean_start:
                return m.ConnAck(False, 0x85 if v5 else 2), None, []
            client = "c2-" + os.urandom(6).hex()
            props["assigned_client_identifier"] = client
        if self.auth is not None:
            self._now = now
            why = self.auth.login(p.username, p.password)
            if why:  # 0x86 bad user name or password / 0x87 not authorized (3.1.1: 4 / 5)
                self.counters["logins_refused"] += 1
                self._failed_logins.hit(
                    "MQTT logins refused, the latest: client %r, user %r (0x%02x)",
                    client[:64],
                    (p.username or "")[:64],
                    why,
                )
                return m.ConnAck(False, why if v5 else (4 if why == 0x86 else 5)), None, []
            if p.will and not self.auth.may(p.username, client, p.will.topic, WRITE):
                self.counters["wills_denied"] += 1  # a will is a publish: the same rule (Mosquitto 2.0 refuses too)
                self._failed_logins.hit(
                    "MQTT wills refused by the ACL, the latest: client %r, user %r, topic %r",
                    client[:64],
                    (p.username or "")[:64],
                    p.will.topic[:64],
                )
                return m.ConnAck(False, 0x87 if v5 else 5), None, []
            prev = self.sessions.get(client)
            if prev is not None and prev.owned and prev.user != p.username:
                if client in self.active:  # its user is connected: no other user takes it over
                    self.counters["takeovers_refused"] += 1
                    self._failed_logins.hit(
                        "MQTT logins refused, the latest: client %r, user %r (connected as %r)",
                        client[:64],
                        (p.username or "")[:64],
                        (prev.user or "")[:64],
                    )
                    return m.ConnAck(False, 0x87 if v5 else 5), None, []
                # its user is away: the session is never handed to another user; it ends (what
                # waited for it is dropped, counted) and this client starts afresh, so a user
                # that took an id first cannot lock its owner out (docs/security.md)
                del self.sessions[client]
                self.counters["sessions_replaced"] += 1
                replaced = [Ended(client), SessionsChanged()]
            c.user = p.username
        busy = self._over_limits(c, client)
        if busy:  # refused before anything of it is taken: 0x97 quota exceeded (3.1.1: 3 server unavailable)
            self.counters["connects_over_limits"] += 1
            self._failed_logins.hit("MQTT connections refused over the session limits, the latest: %s", busy)
            return m.ConnAck(False, 0x97 if v5 else 3, {"reason_string": busy[:200]} if v5 else {}), None, replaced
        far = self.policy.gateway_for(c.broker.rsplit(":", 1)[0])
        if far is None:
            log.warning("no gateway serves broker %s (client %s): refusing", c.broker, client)
            return m.ConnAck(False, 0x88 if v5 else 3, props), None, replaced
        evs: list[Event] = list(replaced)
        old_id = self.active.pop(client, None)
        old = self.conns.get(old_id) if old_id is not None else None
        if old is not None and old is not c:  # taken over: the old connection ends, without its will
            if old.version == 5:
                evs.append(Write(old.id, m.encode(m.Disconnect(m.Reason.SESSION_TAKEN_OVER), 5)))
            evs += [Close(old.id)] + self.closed(old.id, now)
        prev = self.sessions.get(client)
        if prev is not None and prev.expires_at is not None and prev.expires_at <= now:
            prev = None  # expired while away
        present = prev is not None and not p.clean_start
        expiry = p.properties.get("session_expiry_interval", 0) if v5 else (0 if p.clean_start else NEVER)
        sess = prev if present and prev is not None else NearSession(client, c.broker, far)
        sess.version, sess.broker, sess.far, sess.expiry_s, sess.expires_at = p.version, c.broker, far, expiry, None
        sess.user, sess.owned = p.username, True
        self.sessions[client] = sess
        self.active[client] = c.id
        c.sess = sess
        c.keepalive = p.keepalive
        c.receive_max = p.properties.get("receive_maximum", 65535)
        c.max_packet = p.properties.get("maximum_packet_size")
        c.resume = True
        kw: dict[str, object] = {"v": p.version, "cs": p.clean_start or bool(replaced), "ka": p.keepalive}
        if p.username is not None:  # the far side logs in to the broker as the client did here
            kw["u"] = p.username
        if p.password is not None:
            kw["pw"] = p.password
        if "session_expiry_interval" in p.properties:
            kw["sx"] = p.properties["session_expiry_interval"]
        if p.will:
            kw["w"] = s.will_out(p.will)
        if v5:
            props["topic_alias_maximum"] = TOPIC_ALIAS_MAX
        self.counters["connects"] += 1
        evs.append(SessionsChanged())
        env = (far, s.pack("conn", client, c.broker, **kw), CONTROL_LIFETIME_MS, Priority.IMMEDIATE, None)
        return m.ConnAck(present, 0, props), env, evs

    def _publish(self, c: _Conn, p: m.Publish, envs: list, marks: list, replies: list) -> tuple[int, str] | None:
        """One PUBLISH from the client; (reason, why) for a protocol error."""
        alias = p.properties.get("topic_alias")
        if alias is not None:
            if alias == 0 or alias > TOPIC_ALIAS_MAX:
                return m.Reason.TOPIC_ALIAS_INVALID, f"topic alias {alias} (this gateway allows 1-{TOPIC_ALIAS_MAX})"
            if p.topic:
                c.aliases[alias] = p.topic
            elif alias in c.aliases:
                p.topic = c.aliases[alias]
            else:
                return m.Reason.PROTOCOL_ERROR, f"topic alias {alias} used before it was set"
        pid = p.packet_id or 0  # (the codec refuses a QoS 1 or 2 PUBLISH without one)
        if p.qos == 2 and pid in c.qos2_in:
            replies.append(m.PubRec(pid))  # a resend before PUBREL: taken already
            return None
        sess = c.session
        if self.auth is not None and not self.auth.may(c.user, sess.client, p.topic, WRITE):
            # as the broker itself answers: MQTT 5 hears 0x87; 3.1.1 has no refusal, and Mosquitto
            # acknowledges and drops what its ACL denies
            self.counters["publishes_denied"] += 1
            if p.qos == 1:
                replies.append(m.PubAck(pid, 0x87 if c.version == 5 else 0))
            elif p.qos == 2:
                replies.append(m.PubRec(pid, 0x87 if c.version == 5 else 0))
            return None
        rule = self.policy.rule_for(p.topic)
        if rule is None:
            self.counters["held_local"] += 1
        else:
            fields = {"t": p.topic, "p": p.payload, "q": p.qos, "r": p.retain, "x": s.props_out(p.properties)}
            size = s.packed_size("pub", sess.client, sess.broker, fields)
            if size > MAX_MESSAGE_BYTES:  # refused before anything of it is acknowledged (no PUBACK)
                self.counters["refused_too_large"] += 1
                return m.Reason.PACKET_TOO_LARGE, (
                    f"a publish to {p.topic[:80]!r} of {size} bytes as a message is "
                    f"over the overlay's limit of {MAX_MESSAGE_BYTES} bytes"
                )
            key, life = rule.key(p.topic), lifetime_ms(rule, p)
            # a PUBLISH resent with DUP after this gateway crashed between its commit and the client
            # hearing PUBACK is the same (client, packet id, content): custody skips it
            mark = (
                None
                if not p.qos
                else (
                    f"mqtt:{sess.client}:{p.packet_id}",
                    hashlib.blake2b(p.topic.encode() + b"\0" + p.payload, digest_size=8).digest(),
                    p.dup,
                )
            )
            if self.batch_bytes and key is None and p.qos < 2 and not p.dup:
                envs.append(_Part(sess.far, sess.client, sess.broker, life, rule.priority, fields))
            else:
                envs.append((sess.far, s.pack("pub", sess.client, sess.broker, **fields), life, rule.priority, key))
            marks.append(mark)
            self.counters["published"] += 1
        if p.qos == 1:
            replies.append(m.PubAck(pid))
        elif p.qos == 2:
            c.qos2_in.add(pid)
            replies.append(m.PubRec(pid))
        return None

    def _subscribe(self, c: _Conn, p: m.Subscribe) -> Envelope:
        sess = c.session
        ids = p.properties.get("subscription_identifier") or []
        for so in p.subscriptions:
            sess.subs[so.filter] = so.qos
            if ids:
                sess.sub_ids[so.filter] = ids[0]
            else:
                sess.sub_ids.pop(so.filter, None)  # a new subscription without an id replaces one with
        return (
            sess.far,
            s.pack(
                "sub",
                sess.client,
                sess.broker,
                s=[
                    [so.filter, so.qos, so.no_local, so.retain_as_published, so.retain_handling]
                    for so in p.subscriptions
                ],
            ),
            CONTROL_LIFETIME_MS,
            Priority.IMMEDIATE,
            None,
        )

    # -- publications to a client ----------------------------------------------------------
    def deliver(self, client: str, inbox_id: int, msg: dict, created_ms: int, now_ms: int) -> list[Event] | None:
        """A publication from the far broker for `client`; None when it is not connected
        (it stays in custody for when it is back)."""
        conn = self.active.get(client)
        c = self.conns.get(conn) if conn is not None else None
        if c is None:
            return None
        pub = aged(s.publish_from(msg, c.version), created_ms, now_ms)
        if self.auth is not None and not self.auth.may(c.user, client, pub.topic, READ):
            self.counters["deliveries_denied"] += 1
            return [Done(inbox_id)]  # the broker would not hand it to this client either
        matching = [f for f in c.session.subs if m.topic_matches(f, pub.topic)]
        if matching:
            pub.qos = min(pub.qos, max(c.session.subs[f] for f in matching))
        if c.version == 5:
            ids = sorted({c.session.sub_ids[f] for f in matching if f in c.session.sub_ids})
            if ids:
                pub.properties["subscription_identifier"] = ids
        if pub.qos and (len(c.out) >= c.receive_max or c.waiting):
            c.waiting.append((inbox_id, pub))  # the client's Receive Maximum: in order, after the acks
            return []
        return self._send_pub(c, inbox_id, pub)

    def _send_pub(self, c: _Conn, inbox_id: int, pub: m.Publish) -> list[Event]:
        sess = c.session
        if pub.qos:
            pid = pub_pid(inbox_id)
            while pid in c.out:  # 60,000 apart and both in flight: the next free one
                pid = pid % 65535 + 1
            pub.packet_id = pid
            if inbox_id in sess.released:  # resumed session: the client has it; it waits for PUBREL
                c.out[pid] = _Out(inbox_id, pub, released=True)
                return [Write(c.id, m.encode(m.PubRel(pid), c.version))]
            pub.dup = inbox_id in sess.sent
        data = m.encode(pub, c.version)
        if c.max_packet is not None and len(data) > c.max_packet:
            # larger than the client takes: dropped for this client, as the spec says (3.1.2.11.4)
            self.counters["too_large_for_client"] += 1
            log.info(
                "publication on %r (%d bytes) dropped for client %s: its maximum packet size is %d",
                pub.topic,
                len(data),
                c.session.client,
                c.max_packet,
            )
            return [Done(inbox_id)]
        if not pub.qos:
            return [Write(c.id, data), Done(inbox_id)]
        c.out[pid] = _Out(inbox_id, pub)
        sess.sent.add(inbox_id)
        return [Write(c.id, data)]

    def _acked(self, c: _Conn, pid: int) -> list[Event]:
        o = c.out.pop(pid, None)
        if o is None:
            return []
        c.session.sent.discard(o.inbox_id)
        c.session.released.discard(o.inbox_id)
        evs: list[Event] = [Done(o.inbox_id)]
        while c.waiting and len(c.out) < c.receive_max:
            inbox_id, pub = c.waiting.popleft()
            evs += self._send_pub(c, inbox_id, pub)
        return evs

    # -- time ------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        ds = [
            c.last_rx + KEEPALIVE_GRACE * c.keepalive
            for c in self.conns.values()
            if c.sess is not None and c.keepalive and not c.closed
        ]
        ds += [x.expires_at for x in self.sessions.values() if x.expires_at is not None]
        ds += [c.opened + CONNECT_TIMEOUT_S for c in self.conns.values() if c.sess is None and not c.closed]
        return min(ds, default=None)

    def tick(self, now: float) -> list[Event]:
        evs: list[Event] = []
        for c in list(self.conns.values()):
            if c.sess is None and not c.closed and now >= c.opened + CONNECT_TIMEOUT_S:
                self.counters["connect_timeouts"] += 1  # counted, not logged: a scanner would fill the log
                evs += self._shut(c, now)
                continue
            if c.sess is not None and c.keepalive and now >= c.last_rx + KEEPALIVE_GRACE * c.keepalive:
                self.counters["keepalive_timeouts"] += 1
                log.warning(
                    "client %s silent for %.0f s (keep alive %d s): closing, its will goes",
                    c.session.client,
                    now - c.last_rx,
                    c.keepalive,
                )
                if c.version == 5:
                    evs.append(Write(c.id, m.encode(m.Disconnect(m.Reason.KEEP_ALIVE_TIMEOUT), 5)))
                evs += self._shut(c, now)
        gone = [k for k, x in self.sessions.items() if x.expires_at is not None and x.expires_at <= now]
        for k in gone:
            del self.sessions[k]
            self.counters["sessions_expired"] += 1
            evs.append(Ended(k))
        if gone:
            evs.append(SessionsChanged())
        return evs

    def status(self) -> dict:
        return {"clients": sorted(self.active), "sessions_near": len(self.sessions), "puback_s": self.puback.snapshot()}


def lifetime_ms(rule: TopicRule, p: m.Publish) -> int:
    """The rule's lifetime, shortened by an MQTT 5 message expiry."""
    life = rule.lifetime_s * 1000
    if "message_expiry_interval" in p.properties:
        life = max(1000, min(life, p.properties["message_expiry_interval"] * 1000))
    return life


def aged(pub: m.Publish, created_ms: int, now_ms: int) -> m.Publish:
    """An MQTT 5 message expiry counts down what is left after the crossing."""
    if "message_expiry_interval" in pub.properties:
        age_s = max(0, now_ms - created_ms) // 1000
        pub.properties["message_expiry_interval"] = max(1, pub.properties["message_expiry_interval"] - age_s)
    return pub
