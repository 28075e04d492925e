"""CoAP split session (I/O-free): RFC 7252 towards the clients, envelopes towards the link.

Near side (clients here), `NearCoap`: datagrams and `now` in, actions out.
- A confirmable request is acknowledged with an empty ACK only once its envelope is
  committed to custody (the `Submit` action carries the ACK to send after the commit);
  the response comes later as a separate CON response with the client's token,
  retransmitted per RFC 7252 4.2 (ACK_TIMEOUT x random factor, doubling, MAX_RETRANSMIT)
  until the client ACKs it.  A NON request goes the same way without the empty ACK, and
  its response is NON.
- A client's retransmission (same message id) is answered again, never sent twice: within
  a run by the exchange table here, across a gateway restart by the custody mark committed
  with the envelope (key: client and message id; digest: the datagram's token, code,
  options and payload, so a reused message id with other content is a new request).
- Policy: the first `[[gateway.coap.resource]]` rule whose path pattern matches decides the
  priority and lifetime, or that the request is answered here with 4.03 Forbidden; a
  request that matches no rule is answered 4.03 too and never crosses the link (the
  allow-list is the list of rules, as for MQTT topics).  A server no route reaches gets 5.02.
- Malformed datagrams are dropped and counted (the shell logs one line naming the source).

Far side (server here): the request's envelope is replayed to the server by a CoAP client
(the shell, over aiocoap), and the response goes back as an envelope; `response_body`
and `timeout_body` build it.

Not carried yet: Observe (RFC 7641) and block-wise transfer (RFC 7959); a request that
carries either option is forwarded without it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

import cbor2
from aiocoap import Code, Message
from aiocoap.error import UnparsableMessage
from aiocoap.numbers.types import Type

from c2dtn.overlay.envelope import Priority

APP = "coap"
# RFC 7252 4.8 transmission parameters (the defaults)
ACK_TIMEOUT_MS = 2000
ACK_RANDOM_FACTOR = 1.5
MAX_RETRANSMIT = 4
EXCHANGE_LIFETIME_MS = 247_000
# options not carried across yet (see the module's docstring)
OBSERVE, BLOCK2, BLOCK1, SIZE2, SIZE1 = 6, 23, 27, 28, 60
NOT_CARRIED = {OBSERVE, BLOCK2, BLOCK1, SIZE2, SIZE1}

Addr = tuple[str, int]


class CoapError(ValueError):
    """A datagram that is not a CoAP message (the text names what is wrong)."""


def decode(data: bytes) -> Message:
    """aiocoap's decoder, plus two format errors RFC 7252 section 3 requires and aiocoap lets
    through: token lengths 9-15 (reserved) and a payload marker followed by no payload."""
    if not data:
        raise CoapError("empty datagram")
    if data[0] >> 6 != 1:
        raise CoapError(f"version {data[0] >> 6} (only 1 exists)")
    if data[0] & 0x0F > 8:
        raise CoapError(f"token length {data[0] & 0x0F} (9-15 are reserved)")
    try:
        m = Message.decode(data)
    except (UnparsableMessage, ValueError, IndexError) as e:
        raise CoapError(str(e) or type(e).__name__) from None
    if not m.payload and data[-1] == 0xFF and len(encode(copy(m), m.mtype, m.mid, m.token)) == len(data) - 1:
        raise CoapError("payload marker with no payload")
    return m


def encode(m: Message, mtype: Type, mid: int, token: bytes) -> bytes:
    m.mtype, m.mid, m.token = mtype, mid, token
    return m.encode()


def empty(mtype: Type, mid: int) -> bytes:
    return encode(Message(code=Code.EMPTY), mtype, mid, b"")


def copy(m: Message, drop: set[int] = frozenset()) -> Message:
    """An outgoing copy of m's code, options (less `drop`) and payload."""
    out = Message(code=m.code, payload=m.payload)
    for opt in m.opt.option_list():
        if int(opt.number) not in drop:
            out.opt.add_option(opt)
    return out


def strip(m: Message) -> Message:
    """The request or response without what is not carried (Observe, block-wise)."""
    return copy(m, NOT_CARRIED)


def path_of(m: Message) -> str:
    return "/" + "/".join(m.opt.uri_path)


@dataclass(frozen=True)
class ResourceRule:
    path: str  # shell-style pattern on the request's path ("/orders/*"; "*" also spans "/")
    priority: Priority = Priority.ROUTINE
    lifetime_s: int = 3600
    allow: bool = True

    def matches(self, path: str) -> bool:
        return fnmatch.fnmatchcase(path, self.path)


# -- actions --------------------------------------------------------------------
@dataclass
class Reply:
    """Send data to the client from `via`, the address it spoke to (a listener's, or under
    TPROXY the server's own)."""

    data: bytes
    client: Addr
    via: Addr


@dataclass
class Submit:
    """Commit an envelope (a request crossing); then send `then` (the empty ACK)."""

    dst: str
    body: bytes
    lifetime_ms: int
    priority: Priority
    mark: tuple[str, bytes, bool]
    then: list[Reply]
    key: tuple[Addr, int]  # the exchange, told of the commit by `committed`


@dataclass
class Consume:
    """Done with a response envelope (delivered to its client, or given up on)."""

    inbox_id: int


@dataclass
class Drop:
    """A datagram dropped; `why` names the source and the reason (for the log)."""

    why: str


@dataclass
class _Pending:  # a CON response waiting for the client's ACK
    inbox_id: int
    reply: Reply
    timeout_ms: float
    next_ms: int
    sent: int = 1


@dataclass
class NearCoap:
    rules: list[ResourceRule]
    gateway_for: object  # callable: server ip -> far gateway node, or None
    rng: random.Random = field(default_factory=random.Random)
    counters: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.exchanges: dict[tuple[Addr, int], tuple[bytes, int, bool]] = {}  # (digest, until, committed)
        self.pending: dict[tuple[Addr, int], _Pending] = {}
        self.mid = self.rng.randrange(1 << 16)

    def _next_mid(self) -> int:
        self.mid = (self.mid + 1) & 0xFFFF
        return self.mid

    # -- datagrams from clients --------------------------------------------------
    def datagram(self, data: bytes, client: Addr, server: Addr, now_ms: int, via: Addr | None = None) -> list:
        """A datagram from `client` meaning `server`, received at `via` (default: the server's
        address, as under TPROXY)."""
        server = tuple(server)
        via = tuple(via or server)
        try:
            m = decode(data)
        except CoapError as e:
            self.counters["malformed"] += 1
            return [Drop(f"malformed CoAP datagram from {client[0]}:{client[1]} dropped: {e}")]
        if m.mtype in (Type.ACK, Type.RST):
            p = self.pending.pop((client, m.mid), None)
            if p is None:
                self.counters["acks_unmatched"] += 1
                return []
            self.counters["responses_acked" if m.mtype == Type.ACK else "responses_reset"] += 1
            return [Consume(p.inbox_id)]
        if m.code == Code.EMPTY:
            if m.mtype == Type.CON:  # a CoAP ping (RFC 7252 4.3): answered with a reset
                return [Reply(empty(Type.RST, m.mid), client, via)]
            self.counters["unexpected"] += 1
            return []
        if not m.code.is_request():
            self.counters["unexpected"] += 1
            return [Drop(f"CoAP {m.code} from {client[0]}:{client[1]} dropped: a response is not a request")]
        con = m.mtype == Type.CON
        digest = hashlib.blake2b(data[4:], digest_size=16).digest()  # token, options, payload
        key = (client, m.mid)
        ex = self.exchanges.get(key)
        if ex is not None and ex[0] == digest and ex[1] > now_ms:
            self.counters["duplicates"] += 1
            # answered again once its envelope is committed; before that the commit's ACK is coming
            return [Reply(empty(Type.ACK, m.mid), client, via)] if con and ex[2] else []
        path = path_of(m)
        rule = next((r for r in self.rules if r.matches(path)), None)
        if rule is None or not rule.allow:
            self.counters["forbidden"] += 1
            return [self._answer(m, Code.FORBIDDEN, f"{path}: not released across the link", client, via)]
        dst = self.gateway_for(server[0])
        if dst is None:
            self.counters["no_route"] += 1
            return [self._answer(m, Code.BAD_GATEWAY, f"no gateway serves {server[0]}", client, via)]
        self.exchanges[key] = (digest, now_ms + EXCHANGE_LIFETIME_MS, False)
        body = cbor2.dumps({"op": "req", "m": data, "c": list(client), "s": list(server), "v": list(via), "con": con})
        self.counters["requests"] += 1
        then = [Reply(empty(Type.ACK, m.mid), client, via)] if con else []
        mark = (f"coap:{client[0]}:{client[1]}:{m.mid}", digest, True)
        return [Submit(dst, body, rule.lifetime_s * 1000, rule.priority, mark, then, key)]

    def committed(self, key: tuple[Addr, int], took: bool) -> None:
        """The request's envelope is in custody (`took`: new; else a repeat of one taken
        before a restart, counted as a duplicate)."""
        ex = self.exchanges.get(key)
        if ex is not None:
            self.exchanges[key] = (ex[0], ex[1], True)
        if not took:
            self.counters["requests"] -= 1
            self.counters["duplicates"] += 1

    def _answer(self, m: Message, code: Code, why: str, client: Addr, via: Addr) -> Reply:
        """A response made here: piggybacked on the ACK of a CON, a NON for a NON."""
        r = Message(code=code, payload=why.encode())
        if m.mtype == Type.CON:
            return Reply(encode(r, Type.ACK, m.mid, m.token), client, via)
        return Reply(encode(r, Type.NON, self._next_mid(), m.token), client, via)

    # -- responses from the far side ------------------------------------------------
    def response(self, inbox_id: int, body: dict, now_ms: int) -> list:
        """A response envelope arrived: send it to its client (CON: until ACKed)."""
        resp = decode(body["m"])
        client, via = tuple(body["c"]), tuple(body.get("v", body["s"]))
        con = bool(body["con"])
        data = encode(strip(resp), Type.CON if con else Type.NON, self._next_mid(), body["t"])
        reply = Reply(data, client, via)
        self.counters["responses"] += 1
        if not con:
            return [reply, Consume(inbox_id)]
        timeout = ACK_TIMEOUT_MS * self.rng.uniform(1.0, ACK_RANDOM_FACTOR)
        self.pending[(client, self.mid)] = _Pending(inbox_id, reply, timeout, now_ms + int(timeout))
        return [reply]

    def poll(self, now_ms: int) -> list:
        """Retransmissions due (RFC 7252 4.2); a response unacknowledged after MAX_RETRANSMIT
        is given up (the client is gone or gave up its exchange) and its envelope consumed."""
        out: list = []
        for key, p in list(self.pending.items()):
            if p.next_ms > now_ms:
                continue
            if p.sent > MAX_RETRANSMIT:
                del self.pending[key]
                self.counters["responses_unacknowledged"] += 1
                out.append(Consume(p.inbox_id))
                continue
            p.sent += 1
            p.timeout_ms *= 2
            p.next_ms = now_ms + int(p.timeout_ms)
            self.counters["retransmissions"] += 1
            out.append(p.reply)
        for key in [k for k, ex in self.exchanges.items() if ex[1] <= now_ms]:
            del self.exchanges[key]
        return out

    def next_deadline_ms(self) -> int | None:
        return min((p.next_ms for p in self.pending.values()), default=None)

    def waiting_for(self, inbox_id: int) -> bool:
        return any(p.inbox_id == inbox_id for p in self.pending.values())


# -- far side -------------------------------------------------------------------------
def request_of(body: dict) -> tuple[Message, str]:
    """The request to replay and the server's "address:port" (from a request envelope)."""
    m = strip(decode(body["m"]))
    host, port = body["s"]
    return m, f"{host}:{port}"


def response_body(req: dict, resp: Message) -> bytes:
    """The response envelope's body: the response (token and message id are the near side's)."""
    client_tok = decode(req["m"]).token
    return cbor2.dumps({"op": "rsp", "m": encode(strip(resp), Type.NON, 0, b""), "c": req["c"], "s": req["s"],
                        "v": req.get("v", req["s"]), "con": req["con"], "t": client_tok})


def timeout_body(req: dict, why: str) -> bytes:
    """5.04 Gateway Timeout: the server was not reached within the request's lifetime."""
    return response_body(req, Message(code=Code.GATEWAY_TIMEOUT, payload=why.encode()))


def unpack(body: bytes) -> dict:
    """An envelope body of this app; ValueError names what is wrong."""
    try:
        d = cbor2.loads(body)
    except Exception as e:  # cbor2 raises several types for garbage
        raise ValueError(f"not CBOR ({e})") from None
    if not isinstance(d, dict) or d.get("op") not in ("req", "rsp"):
        raise ValueError("not a CoAP envelope body")
    for k, t in (("m", bytes), ("c", list), ("s", list), ("con", bool)):
        if not isinstance(d.get(k), t):
            raise ValueError(f"field {k!r} missing or of the wrong type")
    if not isinstance(d.setdefault("v", d["s"]), list):
        raise ValueError("field 'v' of the wrong type")
    for k in ("c", "s", "v"):
        if len(d[k]) != 2 or not isinstance(d[k][0], str) or not isinstance(d[k][1], int):
            raise ValueError(f"field {k!r} is not [address, port]")
    if d["op"] == "rsp" and not isinstance(d.get("t"), bytes):
        raise ValueError("response without the client's token")
    return d
