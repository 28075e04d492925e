"""One origin client's session at the real broker, at the far gateway (I/O-free, virtual time;
decision 0009).

The far gateway holds one MQTT connection per origin client at the broker, with the client's
own id, clean-start flag, keep alive and will.  FarCore is that session's protocol: the shell
(far.py) tells it what happens and does what it says, as overlay/machine.py is to the node.
`now` is monotonic seconds (a step of the wall clock moves no deadline); envelope times come
from `wall_ms(now)`.

    put(item)                 an envelope (or one publish of a "pubs" envelope) for this session
    opened(now)               the shell made the TCP connection an Open asked for
    open_failed(now, why)     ... it could not
    data(chunk, now)          bytes from the broker on the current connection
    lost(now, why)            the current connection ended
    gate_passed(token, now)   the publish a Gate asked about may go
    stored(publication, ok)   a broker publication is durable in custody (ok) or was refused
    tick(now)                 a deadline passed: next_deadline() says when the next is
    expire_in(s, now), cancel()

Each returns events: Write(data), Open(), Close(abort) for the connection; Done(item) (the
broker has it: consume); SubWritten(inbox_id); Changed() (save the session file); Left() (the
client disconnected); Expired(); Gate(token, inbox_id, topic) (ask the gateway whether an
earlier subscription holds this publish, when `clear` said one may); Publication(packet)
(into custody, then stored()).

The rules (decision 0007 for the windows and pacing):
- Envelopes go to the broker one at a time in inbox order.  QoS 1/2 publishes are pipelined
  up to the broker's window (MQTT 5 Receive Maximum, at most FAR_INFLIGHT_MAX; FAR_INFLIGHT_V311
  for 3.1.1); one is done when the broker acknowledges it.  Its packet id comes from its inbox
  id (pub_pid), so it is the same after a restart.  Unacknowledged ones go again, first and in
  order, on the next connection, with their packet ids and DUP set; one the broker had PUBRECed
  goes again as PUBREL.
- QoS 0 publishes are done once written; after every FAR_QOS0_CHUNK a PINGREQ goes, and the next
  chunk waits while two are unanswered; a PINGREQ unanswered FAR_PING_WAIT_S drops the
  connection (MQTT: the client SHOULD close it) and the next message makes it again.
- A SUBSCRIBE or UNSUBSCRIBE is done when the broker answers it, within ANSWER_WAIT_S; a
  publish waits for room in the window at most ANSWER_WAIT_S.  A connection waits CONNACK_WAIT_S
  for its CONNACK.  A failed step is tried again RETRY_S later, and so is a connection the broker
  dropped once it was up (a client's own reconnect closes and opens at once); a TCP connection
  that could not be made, and one that ended before it was up (a refused CONNACK), after a
  backoff from RETRY_S doubling to BACKOFF_MAX_S.
- The client's CONNECT and DISCONNECT first let the broker acknowledge what is in flight (at
  most SETTLE_S): ending the connection earlier would send it again on the next, twice.
- A connection we end is ended gracefully (DISCONNECT, or only our side's FIN when the will must
  go) and the next one opens only once the broker has closed it too (closed(), at most
  CLOSE_WAIT_S, then the old one is abandoned): a CONNECT with the same client id on a new
  connection makes the broker drop the old one, and with it the QoS 0 publishes it had not yet
  read (decision 0009).
- A connection made for envelopes that came after the client left is closed once they are done
  and none came for AWAY_LINGER_S, and the session is left again (Left), so a departed client
  keeps no broker connection.
- A PINGREQ goes every half of the client's keep alive, at least a second apart (with a keep
  alive of 0, which asks for no pings, every 30 s all the same: the far side has to learn of a
  dead connection whatever the client asked); while the client is present and has
  subscriptions, a lost connection is made again (publications wait there).
- A publication from the broker is acknowledged only once custody holds it (stored ok);
  refused, it is not, and the broker sends it again.
- Bad bodies from a peer gateway (no MQTT packet can be made of them) are counted and done.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.near_core import PUB_PIDS, aged, pub_pid
from c2dtn.overlay.port import Delivery

log = logging.getLogger("c2dtn.gateway")

FAR_INFLIGHT_MAX = 200
FAR_INFLIGHT_V311 = 20  # Mosquitto's default max_inflight_messages: past it, it drops QoS 2 messages
FAR_QOS0_CHUNK = 100
FAR_PING_WAIT_S = 60.0
CONNACK_WAIT_S = 30.0
ANSWER_WAIT_S = 60.0
SETTLE_S = 30.0
CLOSE_WAIT_S = 10.0  # the next connection waits this long at most for the broker to close the last
AWAY_LINGER_S = 1.0  # a connection made after the client left closes once idle this long
RETRY_S = 0.5
BACKOFF_MAX_S = 10.0


def session_expiry_s(params: dict) -> float | None:
    """How long a session outlives its client's disconnect: 0 (a clean 3.1.1 session, an
    MQTT 5 session expiry of 0 or none), seconds, or None (never: 3.1.1 without clean
    session, or MQTT 5's 0xFFFFFFFF)."""
    if params.get("v", 4) == 5:
        sx = params.get("sx") or 0
        return None if not isinstance(sx, int) or sx >= 0xFFFFFFFF else float(max(0, sx))
    return 0.0 if params.get("clean", params.get("cs")) else None


def broker_address(broker: str) -> tuple[str, int] | None:
    """host:port (what a peer gateway named), or None if it is not one."""
    host, _, port = broker.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


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
    def split(d: Delivery, msg: dict) -> list[tuple[Part, dict]]:
        pending = set(range(len(msg["m"])))
        return [
            (Part(d, i, pending), {"op": "pub", "c": msg["c"], "b": msg["b"], **pm}) for i, pm in enumerate(msg["m"])
        ]

    def finish(self) -> bool:
        """This part is done; True when it was the envelope's last."""
        was = bool(self.pending)
        self.pending.discard(self.index)
        return was and not self.pending


Item = tuple[Any, dict]  # (Delivery or Part, its body)


def _order(item: Item) -> tuple[int, int]:
    """Inbox order: an envelope's parts in theirs."""
    d = item[0]
    return (d.envelope, d.index) if isinstance(d, Part) else (d.id, -1)


@dataclass(frozen=True)
class Write:
    data: bytes


@dataclass(frozen=True)
class Open:
    pass


@dataclass(frozen=True)
class Close:
    abort: bool  # reset now (a dead connection); else our side ends after what was written, and the
    # shell reads on until the broker closes it too, then says closed()


@dataclass(frozen=True)
class Abandon:
    pass  # the broker did not close the connection we ended within CLOSE_WAIT_S: reset it


@dataclass(frozen=True, eq=False)
class Done:
    item: Any  # the Delivery or Part the broker has now


@dataclass(frozen=True)
class SubWritten:
    inbox_id: int


@dataclass(frozen=True)
class Changed:
    pass


@dataclass(frozen=True)
class Left:
    pass


@dataclass(frozen=True)
class Expired:
    pass


@dataclass(frozen=True)
class Gate:
    token: int
    inbox_id: int
    topic: str


@dataclass(frozen=True, eq=False)
class Publication:
    packet: m.Publish
    connection: int  # stored() acknowledges it only on this connection


Event = Write | Open | Close | Abandon | Done | SubWritten | Changed | Left | Expired | Gate | Publication


@dataclass
class FarLimits:
    max_packet_size: int = 1 << 20
    qos1_once: bool = False  # QoS 1 publishes go as QoS 2 (the broker's dedupe; policy.py)
    persistent_client_expiration: float = 0  # the most session expiry the broker is asked for (0: no cap)
    always_subscribe: bool = False  # subscribe on every connection (the bridge), not only to a new session


class FarCore:
    def __init__(
        self,
        origin: str,
        client: str,
        broker: str,
        limits: FarLimits,
        now: float,
        state: dict | None = None,
        counters: Counter[str] | None = None,
        wall_ms: Callable[[float], int] | None = None,
        clear: Callable[[int, str], bool] | None = None,
    ):
        self.origin, self.client, self.broker, self.limits = origin, client, broker, limits
        self.label = f"{origin}/{client}"  # in the log
        self.address = broker_address(broker)
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._ms = wall_ms or (lambda t: int(t * 1000))
        # the gateway's answer, without waiting, whether no earlier subscription holds a publish
        # (inbox id, topic): a pure query; False makes a Gate the gateway answers later
        self._clear = clear or (lambda _inbox_id, _topic: True)
        # until a "conn" says otherwise: a session that ends with its client (one made for
        # publishes that came after their client's session ended)
        self.params: dict = {"v": 4, "cs": False, "ka": 60, "clean": True}
        self.subs: dict[str, list] = {}
        self.present = False  # the origin client is connected at its near gateway
        self.gone_at: float | None = None  # wall clock (s) when the client left (its session's expiry runs)
        self.queue: deque[Item] = deque()  # the head is the one being applied
        self.inflight: dict[int, Item] = {}  # packet id -> publish awaiting PUBACK/PUBCOMP
        self._sent: set[int] = set()  # ids of publishes sent on some connection (a resend has DUP set)
        self._released: set[int] = set()  # QoS 2 ids the broker PUBRECed: resent as PUBREL
        self.max_inflight = FAR_INFLIGHT_V311  # set from each CONNACK
        self.next_pid = PUB_PIDS + 1
        # the connection: None, "opening" (Open given), "connack", "resub" (subscriptions asked
        # again on a new broker session), "up"
        self.conn: str | None = None
        self.connection = 0  # which connection (stored() acknowledges on the one a publication came on)
        self._parser: m.Parser | None = None
        self._conn_until: float | None = None  # CONNACK or the resubscription's answer due by then
        self._resub_pid: int | None = None
        self._open_at = now  # no Open before (backoff after a failed one)
        self._backoff = RETRY_S
        self._q0_written = 0  # QoS 0 publishes written since the last PINGREQ that paces them
        self._pings_out = 0  # PINGREQs on this connection not yet answered
        self._pong_until: float | None = None  # pacing: the next publish waits for a PINGRESP till then
        self._ka_pong_until: float | None = None  # the oldest unanswered PINGREQ is answered by then
        self._granted: list[bool] | None = None  # which filters of the SUBSCRIBE just answered the broker took
        self._ka_at = now + self._ka_every()
        self.expiry_at: float | None = None
        # what the head waits for: None (nothing yet), "settle", "connect", "answer", "gate",
        # "room", "retry"; until when, and the packet id or gate token it waits on
        self._wait: str | None = None
        self._until: float | None = None
        self._on: int | None = None
        self._gate_token = 0
        self._want_conn = False  # the keep alive wants the connection back (client present, subscriptions)
        self._closing_until: float | None = None  # a connection we ended: the broker closes it by then
        self._away_conn = False  # this connection was made for envelopes that came after the client left
        self._away_until: float | None = None  # and, idle, closes then
        self._now = now
        if state is not None:  # a session from before a restart: reconnect at once, with its subscriptions
            self.params, self.subs = state["params"], state["subs"]
            self.present = state.get("present", True)
            self.gone_at = state.get("gone_at")
            self._want_conn = self.present  # an absent client's session waits at the broker, as after its disc

    # -- what the gateway asks ----------------------------------------------------------
    def key(self) -> str:
        return self.label

    def expiry_s(self) -> float | None:
        return session_expiry_s(self.params)

    def idle(self) -> bool:
        """Nothing queued or in flight for it, and its client is away."""
        return not self.present and not self.queue and not self.inflight

    def connected(self) -> bool:
        return self.conn == "up"

    def next_deadline(self) -> float | None:
        ats = [self._ka_at, self.expiry_at, self._conn_until, self._until, self._pong_until, self._ka_pong_until]
        ats.append(self._away_until)
        if self.conn is None and (self._want_conn or self._wait == "connect"):
            if self._open_at > self._now:
                ats.append(self._open_at)
            if self._closing_until is not None:
                ats.append(self._closing_until)
        return min((a for a in ats if a is not None), default=None)

    # -- inputs -------------------------------------------------------------------------
    def start(self, now: float) -> list[Event]:
        """A restored session connects at once."""
        return self._advance(now)

    def put(self, item: Item, now: float) -> list[Event]:
        self.queue.append(item)
        return self._advance(now)

    def tick(self, now: float) -> list[Event]:
        out: list[Event] = []
        self._now = now
        if self.expiry_at is not None and now >= self.expiry_at:
            self.expiry_at = None
            out.append(Expired())
        if now >= self._ka_at:
            self._ka_at = now + self._ka_every()
            if self.conn in ("connack", "resub", "up"):
                out += self._ping()
            elif self.present and self.subs:
                self._want_conn = True
        if self._conn_until is not None and now >= self._conn_until:
            why = "no CONNACK" if self.conn == "connack" else "subscriptions not answered"
            log.warning("session %s: %s from broker %s in time; reconnecting", self.key(), why, self.broker)
            out += self._drop(now)
        if any(t is not None and now >= t for t in (self._pong_until, self._ka_pong_until)):
            log.warning(
                "session %s: broker %s answered no PINGREQ for %.0f s; reconnecting",
                self.key(),
                self.broker,
                FAR_PING_WAIT_S,
            )
            out += self._drop(now)
        return out + self._advance(now)

    def expire_in(self, seconds: float, now: float) -> None:
        self.expiry_at = now + max(0.0, seconds)

    def unexpire(self) -> None:
        self.expiry_at = None

    def opened(self, now: float) -> list[Event]:
        """The TCP connection is made: CONNECT goes."""
        if self.conn != "opening":
            return []
        self._want_conn = False
        self._ka_at = now + self._ka_every()  # the keep alive runs from the connection
        self.connection += 1
        self._parser = m.Parser(self.limits.max_packet_size, version=self.params.get("v", 4))
        self._q0_written = self._pings_out = 0
        self.conn, self._conn_until = "connack", now + CONNACK_WAIT_S
        try:
            p = self.params
            if not self.present:  # for what came after the client left: no will, and its session's cleanness
                p = {**p, "cs": bool(p.get("clean", p.get("cs"))), "w": None}
            data = self._connect_bytes(p)
        except (ValueError, TypeError, KeyError, struct.error, m.MqttError) as e:  # a session file's params
            log.error("session %s: no CONNECT can be made of its parameters: %s", self.key(), e)
            return self._drop(now) + self._advance(now)
        return [Write(data)] + self._advance(now)

    def _connect_bytes(self, p: dict) -> bytes:
        v = p.get("v", 4)
        connect = m.Connect(
            self.client, p.get("cs", False), p.get("ka", 60), p.get("u"), p.get("pw"), s.will_in(p.get("w")), v,
            self._expiry_props(p),
        )  # fmt: skip
        return m.encode(connect, v)

    def open_failed(self, now: float, why: str) -> list[Event]:
        if self.conn != "opening":
            return []
        log.warning("broker %s unreachable for %s: %s; retrying in %.1f s", self.broker, self.key(), why, self._backoff)
        self.conn = None
        self._open_at = now + self._backoff
        self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
        return self._advance(now)

    def lost(self, now: float, why: str) -> list[Event]:
        """The current connection ended (the broker closed it, or it failed)."""
        if self.conn in (None, "opening"):
            return []
        log.warning("broker connection of %s failed: %s", self.key(), why)
        self._ended(now)
        return self._advance(now)

    def closing_until(self) -> float | None:
        return self._closing_until

    def wait_closed(self, until: float | None) -> None:
        """No connection before `until`, unless closed() comes first: the connection an earlier
        session of this client ended is still open at the broker."""
        if until is not None:
            self._closing_until = until

    def closed(self, now: float) -> list[Event]:
        """The broker closed the connection we had ended: the next may open."""
        if self._closing_until is None:
            return []
        self._closing_until = None
        return self._advance(now)

    def data(self, chunk: bytes, now: float) -> list[Event]:
        if self.conn in (None, "opening") or self._parser is None:
            return []
        try:
            packets = self._parser.feed(chunk)
        except m.MqttError as e:
            log.warning("broker connection of %s failed: %s", self.key(), e)
            return self._drop(now) + self._advance(now)
        out: list[Event] = []
        for p in packets:
            out += self._packet(p, now)
            if self.conn is None:  # dropped on that one: the rest came on a connection that is gone
                break
        return out + self._advance(now)

    def gate_passed(self, token: int, now: float) -> list[Event]:
        if self._wait == "gate" and self._on == token:
            self._wait, self._on = "gated", None
        return self._advance(now)

    def stored(self, pub: Publication, ok: bool) -> list[Event]:
        """Custody holds the broker's publication (ok), or refused it: acknowledged only if held,
        and only on the connection it came on."""
        p = pub.packet
        if not ok or pub.connection != self.connection or self.conn in (None, "opening") or p.packet_id is None:
            return []  # (QoS 0 has no packet id, and no ack)
        v = self.params.get("v", 4)
        if p.qos == 1:
            return [Write(m.encode(m.PubAck(p.packet_id), v))]
        if p.qos == 2:
            return [Write(m.encode(m.PubRec(p.packet_id), v))]
        return []

    def cancel(self) -> list[Event]:
        """The session ends: DISCONNECT (the broker keeps its session as the expiry says)."""
        self.expiry_at = None
        return self._close_clean()

    # -- the broker's packets -----------------------------------------------------------
    def _packet(self, p: m.Packet, now: float) -> list[Event]:
        v = self.params.get("v", 4)
        if isinstance(p, m.ConnAck):
            return self._connack(p, now) if self.conn == "connack" else []
        if isinstance(p, m.PingResp):
            if self._pings_out:
                self._pings_out -= 1
                if self._pings_out <= 1:
                    self._pong_until = None
                # the next answer is due FAR_PING_WAIT_S from this one (a paced backlog keeps some out)
                self._ka_pong_until = now + FAR_PING_WAIT_S if self._pings_out else None
            return []
        if isinstance(p, (m.PubAck, m.PubComp)) and p.packet_id in self.inflight:
            return self._acked(p)
        if isinstance(p, m.PubRec) and p.packet_id in self.inflight and p.reason >= 0x80:
            return self._acked(p)  # MQTT 5: refused; no PUBREL follows
        if isinstance(p, (m.SubAck, m.UnsubAck)):
            if self.conn == "resub" and p.packet_id == self._resub_pid:
                if isinstance(p, m.SubAck) and len(p.reasons) == len(self.subs):
                    for f, r in zip(list(self.subs), p.reasons):
                        if r >= 0x80:  # refused again on this session: not asked on the next
                            log.warning("session %s: broker %s refused %s: 0x%02x", self.key(), self.broker, f, r)
                            del self.subs[f]
                self._up()
            elif self._wait == "answer" and p.packet_id == self._on:
                self._wait, self._until, self._on = "answered", None, None
                self._granted = [r < 0x80 for r in p.reasons] if isinstance(p, m.SubAck) else None
            return []
        if isinstance(p, m.PubRec):
            if p.packet_id in self.inflight:
                self._released.add(self.inflight[p.packet_id][0].id)
            return [Write(m.encode(m.PubRel(p.packet_id), v))]
        if isinstance(p, m.PubRel):
            return [Write(m.encode(m.PubComp(p.packet_id), v))]
        if isinstance(p, m.Publish):
            return [Publication(p, self.connection)]  # acknowledged once in custody (stored)
        return []

    def _acked(self, p: m.PubAck | m.PubComp | m.PubRec) -> list[Event]:
        """The broker answered a publish in flight: done.  One it refused (MQTT 5 reason 0x80 or
        more: not authorised, quota, a bad topic) is done too, counted and logged: sent again it
        would be refused again."""
        done = self.inflight.pop(p.packet_id)[0]
        self._sent.discard(done.id)
        self._released.discard(done.id)
        if p.reason >= 0x80:
            self.counters["broker_refused"] += 1
            log.warning("session %s: broker %s refused a publish: reason 0x%02x", self.key(), self.broker, p.reason)
        else:
            self.counters["to_broker"] += 1
        return [Done(done)]

    def _up(self) -> None:
        self.conn, self._conn_until, self._resub_pid = "up", None, None
        self._backoff = RETRY_S
        log.info("session %s open at broker %s", self.key(), self.broker)

    def _connack(self, ack: m.ConnAck, now: float) -> list[Event]:
        if ack.reason:
            log.warning("broker %s refused client %s: reason 0x%02x", self.broker, self.client, ack.reason)
            return self._drop(now)
        v = self.params.get("v", 4)
        self.max_inflight = (
            min(FAR_INFLIGHT_MAX, ack.properties.get("receive_maximum", 65535)) if v == 5 else FAR_INFLIGHT_V311
        )
        self.params["cs"] = False  # a reconnect resumes the session the first connect started
        if not ack.session_present:
            self._released.clear()  # a new session: the broker has none of them, they go as publishes
        if self.subs and (self.limits.always_subscribe or not ack.session_present):
            self._resub_pid = self._pid()
            self.conn, self._conn_until = "resub", now + ANSWER_WAIT_S
            subs = [m.SubOption(f, *o) for f, o in self.subs.items()]
            return [Write(m.encode(m.Subscribe(self._resub_pid, subs), v))]
        self._up()
        return []

    # -- the connection -----------------------------------------------------------------
    def _ka_every(self) -> float:
        return max(1.0, (self.params.get("ka") or 60) / 2)

    def _ping(self) -> list[Event]:
        if self._ka_pong_until is None:
            self._ka_pong_until = self._now + FAR_PING_WAIT_S  # a broker that answers no ping is dropped
        self._pings_out += 1
        return [Write(m.encode(m.PingReq(), self.params.get("v", 4)))]

    def _expiry_props(self, p: dict | None = None) -> dict:
        """The session expiry the broker is asked for: the client's, cut to persistent_client_expiration."""
        p = self.params if p is None else p
        if p.get("v", 4) != 5 or "sx" not in p:
            return {}
        sx, cap = p["sx"], int(self.limits.persistent_client_expiration)
        return {"session_expiry_interval": min(sx, cap) if cap and isinstance(sx, int) else sx}

    def _gone(self, now: float) -> None:
        """The connection is gone: what it had in flight goes again, first and in order, and
        what waited on it fails."""
        self.conn, self._parser, self._conn_until, self._resub_pid = None, None, None, None
        self._pong_until = self._ka_pong_until = None
        self._pings_out = 0
        if self.inflight:
            again = sorted(self.inflight.values(), key=_order)
            self.inflight.clear()
            self.queue.extendleft(reversed(again))
            self._reset_head()
        elif self._wait in ("connect", "answer", "room"):
            self._fail(now)

    def _drop(self, now: float) -> list[Event]:
        """Abort the connection (no DISCONNECT)."""
        if self.conn is None:
            return []
        self._ended(now)
        return [Close(abort=True)]

    def _ended(self, now: float) -> None:
        """The connection ended against our will.  The next one waits RETRY_S, or, while none
        gets as far as "up", a backoff doubling to BACKOFF_MAX_S (a broker that refuses or
        drops every connection is not tried in a loop)."""
        was_up = self.conn == "up"
        self._gone(now)
        self._open_at = max(self._open_at, now + (RETRY_S if was_up else self._backoff))
        if not was_up:
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)

    def _close_clean(self, will: bool = False) -> list[Event]:
        """End the connection after what was written: with DISCONNECT, or (will) without, so that
        the broker publishes the will; the next connection waits for the broker to close it."""
        if self.conn is None:
            return []
        out: list[Event] = []
        if self.conn != "opening":
            self._closing_until = self._now + CLOSE_WAIT_S
            try:
                if not will:
                    out.append(Write(m.encode(m.Disconnect(0, self._expiry_props()), self.params.get("v", 4))))
            except (ValueError, TypeError, struct.error, m.MqttError):  # (a session file's params) closed without it
                pass
        self._away_conn = False
        self._gone(self._now)
        return out + [Close(abort=False)]

    def _open(self, now: float) -> list[Event]:
        if self.conn is not None or now < self._open_at or self.address is None:
            return []
        out: list[Event] = []
        if self._closing_until is not None:
            if now < self._closing_until:
                return []
            log.warning(
                "session %s: broker %s did not close the connection we ended; resetting it", self.key(), self.broker
            )
            self._closing_until = None
            out.append(Abandon())
        self.conn = "opening"
        return out + [Open()]

    def _pid(self) -> int:
        """A packet id for a SUBSCRIBE or UNSUBSCRIBE (publishes have theirs: pub_pid)."""
        pid = self.next_pid
        self.next_pid = PUB_PIDS + 1 + (pid - PUB_PIDS) % (65535 - PUB_PIDS)
        return pid

    # -- the queue ------------------------------------------------------------------------
    def _reset_head(self) -> None:
        self._wait = self._until = self._on = None

    def _fail(self, now: float) -> None:
        """The head's step failed (its connection, or the broker's answer): again in RETRY_S."""
        self._wait, self._until, self._on = "retry", now + RETRY_S, None

    def _pop(self) -> Item:
        self._reset_head()
        return self.queue.popleft()

    def _advance(self, now: float) -> list[Event]:
        """Apply queued envelopes until one has to wait."""
        self._now = now
        out: list[Event] = []
        if self._want_conn and self.conn is None:
            out += self._open(now)
        while self.queue and self._pong_until is None:
            if not self._ready():
                if self._until is None or now < self._until:
                    break
                if self._wait == "retry":
                    self._reset_head()
                    continue
                # the broker did not answer in time: a new connection, and the step again
                what = {"settle": "what is in flight", "room": "its window", "answer": "the subscription"}
                log.warning(
                    "session %s: broker %s acknowledged not %s in time; reconnecting",
                    self.key(),
                    self.broker,
                    what.get(self._wait or "", self._wait),
                )
                out += self._drop(now)
                self._fail(now)
                break
            d, msg = self.queue[0]
            try:
                out += self._apply(d, msg, now)
            except (ValueError, TypeError, KeyError, IndexError, struct.error, m.MqttError) as e:
                # what a peer gateway sent does not make an MQTT packet: count, drop, go on
                self.counters["bad_bodies"] += 1
                log.warning("session %s: %s from %s dropped: %s", self.key(), msg.get("op"), self.origin, e)
                self._pop()
                out.append(Done(d))
        if self.conn is None and self._wait == "connect":
            out += self._open(now)
        if self._away_conn and self.conn == "up" and not self.present and not self.queue and not self.inflight:
            if self._away_until is None:
                self._away_until = now + AWAY_LINGER_S
            elif now >= self._away_until:  # done with what came after the client left
                out += self._close_clean() + [Left()]
        else:
            self._away_until = None
        return out

    def _ready(self) -> bool:
        """Has what the head waits for come?"""
        w = self._wait
        if w is None or w in ("answered", "gated"):
            return True
        if w == "settle":
            return self._settled()
        if w == "connect":
            return self.conn == "up"
        if w == "room":
            return self._room_for(self.queue[0])
        return False  # "retry", "answer", "gate": an input or a deadline ends them

    def _settled(self) -> bool:
        return not self.inflight or self.conn is None

    def _room_for(self, item: Item) -> bool:
        pid = pub_pid(item[0].id)
        return len(self.inflight) < self.max_inflight and pid not in self.inflight

    def _apply(self, d: Any, msg: dict, now: float) -> list[Event]:
        """The head envelope's next step: it is popped (done), or self._wait says what it waits for."""
        op = msg["op"]
        v = self.params.get("v", 4)
        if op in ("conn", "disc") and self._wait is None and not self._settled():
            self._wait, self._until = "settle", now + SETTLE_S  # the broker acknowledges what is in flight first
            return []
        if op != "disc" and self.address is None:
            raise ValueError(f"broker address {self.broker!r} is not host:port")
        if op == "conn":
            if self._wait == "connect":  # connected: done
                self._pop()
                return [Changed(), Done(d)]
            params = {k: msg[k] for k in ("v", "cs", "ka", "sx", "w", "u", "pw") if k in msg}
            self._connect_bytes(params)  # raises here (a bad body) rather than at every connection
            self.params = params
            self.params["clean"] = bool(msg.get("cs"))  # "cs" is cleared once connected (reconnects resume)
            if self.params.get("cs"):
                self.subs.clear()
            self.present, self.gone_at, self.expiry_at = True, None, None
            out = self._close_clean()
            self._wait, self._until = "connect", None
            return out + self._open(now)
        if op == "disc":
            if isinstance(msg.get("sx"), int) and 0 <= msg["sx"] <= 0xFFFFFFFF and v == 5:
                self.params["sx"] = msg["sx"]  # set again at the client's DISCONNECT (MQTT 5 3.14.2.2.2)
            self.present = False
            self.gone_at = self._ms(now) / 1000
            # no DISCONNECT when the client left without one: the broker publishes the will
            out = self._close_clean(will=bool(msg.get("w")))
            self._pop()
            return out + [Changed(), Done(d), Left()]
        if self.conn != "up":
            self._wait, self._until = "connect", None
            if not self.present and self.conn is None:
                self._away_conn = True
            return []
        if self._wait == "connect":
            self._reset_head()
        if op in ("sub", "unsub"):
            return self._subscribe(d, msg, op, v, now)
        if op != "pub":
            raise ValueError(f"op {op!r} is not one the far side applies")
        if self._wait is None:  # earlier subscriptions its topic matches are answered first
            inbox_id, topic = d.envelope if isinstance(d, Part) else d.id, msg.get("t", "")
            if not self._clear(inbox_id, topic):
                self._gate_token += 1
                self._wait, self._on = "gate", self._gate_token
                return [Gate(self._gate_token, inbox_id, topic)]
        pub = aged(s.publish_from(msg, v), d.created_ms, self._ms(now))
        if pub.qos == 1 and self.limits.qos1_once:
            pub.qos = 2  # the broker's QoS 2 dedupe: see qos1_once in policy.py
        if pub.qos == 0:
            data = m.encode(pub, v)
            self._pop()
            self.counters["to_broker"] += 1
            self._q0_written += 1
            out = [Write(data), Done(d)]
            if self._q0_written >= FAR_QOS0_CHUNK:  # pacing: a PINGREQ, and wait while two are out
                self._q0_written = 0
                out += self._ping()
                if self._pings_out > 1:
                    self._pong_until = now + FAR_PING_WAIT_S
            return out
        pub.packet_id = pub_pid(d.id)
        if not self._room_for((d, msg)):  # the broker's window is full, or the id held by an older one
            self._wait, self._until = "room", now + ANSWER_WAIT_S
            return []
        pub.dup = d.id in self._sent
        if pub.dup:  # sent before and not acknowledged (a broker connection lost meanwhile)
            self.counters["to_broker_again"] += 1
        # one the broker PUBRECed (and may have released): PUBREL finishes it
        data = m.encode(m.PubRel(pub.packet_id) if d.id in self._released else pub, v)
        self._pop()
        self.inflight[pub.packet_id] = (d, msg)
        self._sent.add(d.id)
        return [Write(data)]

    def _subscribe(self, d: Any, msg: dict, op: str, v: int, now: float) -> list[Event]:
        """SUBSCRIBE or UNSUBSCRIBE; done, and the session's subscriptions changed, once answered."""
        if self._wait == "answered":
            if op == "sub":
                asked = self._sub_options(msg)
                granted = self._granted if self._granted and len(self._granted) == len(asked) else [True] * len(asked)
                for so, ok in zip(asked, granted):
                    if ok:  # one the broker refused is not asked again on the next session
                        self.subs[so.filter] = [so.qos, so.no_local, so.retain_as_published, so.retain_handling]
            else:
                for f in msg.get("f", []):
                    if isinstance(f, str):
                        self.subs.pop(f, None)
            self._pop()
            return [Changed(), Done(d)]
        pid = self._pid()
        if op == "sub":
            data = m.encode(m.Subscribe(pid, self._sub_options(msg)), v)
        else:
            data = m.encode(m.Unsubscribe(pid, [f for f in msg.get("f", []) if isinstance(f, str)]), v)
        self._wait, self._until, self._on = "answer", now + ANSWER_WAIT_S, pid
        return [SubWritten(d.id), Write(data)]

    @staticmethod
    def _sub_options(msg: dict) -> list[m.SubOption]:
        return [m.SubOption(x[0], *x[1:5]) for x in msg.get("s", []) if isinstance(x, list) and x]
