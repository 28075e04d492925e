"""CoAP split session (I/O-free): RFC 7252 towards the clients, envelopes towards the link.

Near side (clients here), `NearCoap`: datagrams and `now` in, actions out.
- A confirmable request is acknowledged only once its envelope is committed to custody
  (the `Submit` action carries the empty ACK; `committed` says what to send then).  A
  response back within PIGGYBACK_WAIT_MS of the commit goes piggybacked on the ACK, as
  the server itself would answer (some clients, libcoap's among them, take the first
  Block2 block of a body only in a piggybacked response); else the empty ACK goes then
  and the response comes later as a separate CON response with the client's token,
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

- Observe (RFC 7641): a GET with Observe 0 crosses once as a registration; the far side
  keeps it registered at the server and sends each notification back as a supersedable
  envelope (keyed by client and token), so after an outage the newest state comes first.
  Here each notification goes to the client with an Observe value from this gateway's
  clock (increasing across restarts); a newer one replaces an unacknowledged older one
  (RFC 7641 4.5.2); a reset from the client, a notification never acknowledged, or a GET
  with Observe 1 ends the observation at the far side too (a `cancel` envelope).
  Supersession clears what waits in custody, but copies already handed to the BPAs
  before a cut still arrive after it, ahead of the newest; so a notification older than
  its Max-Age by more than STALE_HOLD_MS when it gets here (stale, RFC 7641 4.3.1) is held until STALE_HOLD_MS pass
  with nothing newer (at most STALE_HOLD_MAX_MS from the first one held) and then sent
  (with Max-Age 0); a fresh one goes at once and replaces it.  Every response's Max-Age is reduced by its age (RFC 7252 5.6.1),
  measured from the envelope's creation (the gateways' clocks agree, as BPv7's do).
- Block-wise (RFC 7959): a request body sent in Block1 blocks is gathered here (each
  block but the last answered 2.31 Continue) and crosses as one envelope; a response
  body larger than a block (1024 bytes, or what the client asked for) is sent in Block2
  blocks, the first in the response, the rest from a copy kept here for
  EXCHANGE_LIFETIME (a later block asked for when that copy is gone crosses again as a
  whole request, and the block is cut from its answer).  Across the link and to the
  server, bodies travel whole (the far side's aiocoap client does the server's blocks).

Far side (server here): the request's envelope is replayed to the server by a CoAP client
(the shell, over aiocoap), and the response goes back as an envelope; `response_body`
and `timeout_body` build it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import random
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import cbor2
from aiocoap import Code, Message
from aiocoap.error import UnparsableMessage
from aiocoap.numbers.types import Type
from aiocoap.optiontypes import BlockOption

from c2dtn.overlay.port import MAX_MESSAGE_BYTES, Priority
from c2dtn.strict_cbor import StrictCBORError
from c2dtn.strict_cbor import loads as strict_loads

APP = "coap"
# RFC 7252 4.8 transmission parameters (the defaults)
ACK_TIMEOUT_MS = 2000
ACK_RANDOM_FACTOR = 1.5
MAX_RETRANSMIT = 4
EXCHANGE_LIFETIME_MS = 247_000
# a committed CON request's empty ACK waits this long for its response to piggyback on it:
# well inside ACK_TIMEOUT, so the client does not retransmit meanwhile (RFC 7252 5.2.2)
PIGGYBACK_WAIT_MS = 1000
# options this gateway acts on itself and does not pass on as they came
OBSERVE, BLOCK2, BLOCK1, SIZE2, SIZE1 = 6, 23, 27, 28, 60
URI_HOST, URI_PORT, PROXY_URI, PROXY_SCHEME = 3, 7, 35, 39
NOT_CARRIED = {OBSERVE, BLOCK2, BLOCK1, SIZE2, SIZE1}
BLOCK_SZX = 6  # 1024-byte blocks unless the client asks for smaller
# a request body gathered from Block1 blocks (larger: 4.13): the overlay's message limit, less room
# for the request's own fields in the envelope body (request_body)
MAX_BODY = MAX_MESSAGE_BYTES - (8 << 10)
MAX_KEPT = 256  # response bodies kept for later Block2 blocks, and uploads being gathered
STALE_HOLD_MS = 5000  # a stale notification waits this long for a newer one before it goes ...
STALE_HOLD_MAX_MS = 30_000  # ... each newer stale one restarting the wait, up to this long in all

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
    try:  # the gateway encodes what it forwards again (found by perf fuzz: aiocoap decodes
        # option numbers past 65535 + 269 that its encoder then refuses)
        again = encode(copy(m), m.mtype, m.mid, m.token)
    except ValueError as e:
        raise CoapError(f"options that cannot be sent on: {e}") from None
    if not m.payload and data[-1] == 0xFF and len(again) == len(data) - 1:
        raise CoapError("payload marker with no payload")
    return m


def encode(m: Message, mtype: Type, mid: int, token: bytes) -> bytes:
    m.mtype, m.mid, m.token = mtype, mid, token
    return m.encode()


def empty(mtype: Type, mid: int) -> bytes:
    return encode(Message(code=Code.EMPTY), mtype, mid, b"")


def copy(m: Message, drop: frozenset[int] | set[int] = frozenset()) -> Message:
    """An outgoing copy of m's code, options (less `drop`) and payload."""
    out = Message(code=m.code, payload=m.payload)
    for opt in m.opt.option_list():
        if int(opt.number) not in drop:
            out.opt.add_option(opt)
    return out


def forward_target(m: Message) -> tuple[Message, Addr] | str:
    """A forward-proxy request (RFC 7252 5.7.2) as the request its server gets, and that
    server's address; or why it cannot be forwarded (answered 5.05).  Servers are named by
    IPv4 address: the gateway resolves no names (its routes are prefixes)."""
    out = copy(m, {PROXY_URI, PROXY_SCHEME, URI_HOST, URI_PORT})
    out.mtype, out.mid, out.token = m.mtype, m.mid, m.token
    if m.opt.proxy_uri is not None:
        uri = m.opt.proxy_uri
    else:
        host = m.opt.uri_host or ""
        uri = (
            f"{m.opt.proxy_scheme}://{f'[{host}]' if ':' in host else host}"
            f"{f':{m.opt.uri_port}' if m.opt.uri_port else ''}/"
        )
    try:
        parsed = urllib.parse.urlsplit(uri)
        port = parsed.port or 5683
        if parsed.scheme != "coap":
            return f"{uri}: only coap:// is forwarded"
        ipaddress.IPv4Address(parsed.hostname or "")
    except ValueError:
        return f"{uri}: not coap://<IPv4 address>[:port]/path"
    if m.opt.proxy_uri is not None:  # the path and query come from the URI
        out.opt.uri_path = [urllib.parse.unquote(x) for x in parsed.path.split("/")[1:] if x]
        out.opt.uri_query = [urllib.parse.unquote(x) for x in parsed.query.split("&") if x]
    return out, (parsed.hostname, port)


def strip(m: Message) -> Message:
    """The request or response without what is not carried (Observe, block-wise)."""
    return copy(m, NOT_CARRIED)


def path_of(m: Message) -> str:
    return "/" + "/".join(m.opt.uri_path)


def resource_key(m: Message) -> bytes:
    """What tells one request's blocks from another's: code and options less the block-wise
    and Observe ones (RFC 7959 2.4: the block option is not part of it)."""
    kept = copy(m, NOT_CARRIED)
    kept.payload = b""
    return hashlib.blake2b(encode(kept, Type.CON, 0, b""), digest_size=16).digest()


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
    mark: tuple[str, bytes, bool | int] | None  # None: a cancel, which no client repeats
    then: list[Reply]
    key: tuple[Addr, int] | None  # the exchange, told of the commit by `committed` (None: a cancel)


@dataclass
class Consume:
    """Done with a response envelope (delivered to its client, or given up on)."""

    inbox_id: int


@dataclass
class Drop:
    """A datagram dropped; `why` names the source and the reason (for the log)."""

    why: str
    source: str = ""  # the sender's address (a flood from it is logged in few lines)


@dataclass
class _Pending:  # a CON response waiting for the client's ACK
    inbox_id: int
    reply: Reply
    timeout_ms: float
    next_ms: int
    sent: int = 1
    observation: tuple | None = None  # a notification: (client, token, far gateway, server)


@dataclass
class _Acking:  # a committed CON request whose empty ACK waits for its response to piggyback on
    token: bytes
    ack: Reply
    until_ms: int


@dataclass
class _Kept:  # a response body kept for the client's later Block2 blocks, or an upload being gathered
    message: Message
    until_ms: int


@dataclass
class NearCoap:
    rules: list[ResourceRule]
    gateway_for: Callable[[str], str | None]  # server ip -> far gateway node, or None
    rng: random.Random = field(default_factory=random.Random)
    counters: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        # (client, mid) -> (digest, until, committed, the piggybacked response sent, if one was)
        self.exchanges: dict[tuple[Addr, int], tuple[bytes, int, bool, bytes | None]] = {}
        self.pending: dict[tuple[Addr, int], _Pending] = {}
        self.notifying: dict[tuple[Addr, bytes], tuple[Addr, int]] = {}  # observation -> its pending key
        self.bodies: dict[tuple[Addr, bytes], _Kept] = {}  # (client, resource_key) -> response for Block2
        self.uploads: dict[tuple[Addr, bytes], _Kept] = {}  # (client, resource_key) -> Block1 so far
        self.held: dict[tuple[Addr, bytes], list] = {}  # observation -> [inbox_id, body, origin, until, first held]
        self.acking: dict[tuple[Addr, int], _Acking] = {}  # (client, mid) -> its ACK, waiting for the response
        self.tokens: dict[tuple[Addr, int], bytes] = {}  # (client, mid) -> token, of requests not yet committed
        self.mid = self.rng.randrange(1 << 16)
        self.obs_value = 0

    def _next_mid(self) -> int:
        self.mid = (self.mid + 1) & 0xFFFF
        return self.mid

    # -- datagrams from clients --------------------------------------------------
    def datagram(self, data: bytes, client: Addr, server: Addr | None, now_ms: int, via: Addr | None = None) -> list:
        """A datagram from `client` meaning `server`, received at `via` (default: the server's
        address, as under TPROXY).  At an explicit listener (`via` given) a forward-proxy
        request (Proxy-Uri, or Proxy-Scheme with Uri-Host) means the server it names;
        `server` None: such requests only."""
        listener = via is not None
        server = (server[0], server[1]) if server is not None else None  # (lists, from a session file)
        here = via or server
        if here is None:
            raise ValueError("a datagram needs the server it meant or the listener it came to")
        via = (here[0], here[1])
        try:
            m = decode(data)
        except CoapError as e:
            self.counters["malformed"] += 1
            return [Drop(f"malformed CoAP datagram from {client[0]}:{client[1]} dropped: {e}", client[0])]
        if m.mtype in (Type.ACK, Type.RST):
            p = self._settle((client, m.mid))
            if p is None:
                self.counters["acks_unmatched"] += 1
                return []
            self.counters["responses_acked" if m.mtype == Type.ACK else "responses_reset"] += 1
            if m.mtype == Type.RST and p.observation:  # RFC 7641 3.6: the client is done observing
                return [Consume(p.inbox_id), *self._cancel(p.observation, "reset by the client")]
            return [Consume(p.inbox_id)]
        if m.code == Code.EMPTY:
            if m.mtype == Type.CON:  # a CoAP ping (RFC 7252 4.3): answered with a reset
                return [Reply(empty(Type.RST, m.mid), client, via)]
            self.counters["unexpected"] += 1
            return []
        if not m.code.is_request():
            self.counters["unexpected"] += 1
            return [Drop(f"CoAP {m.code} from {client[0]}:{client[1]} dropped: a response is not a request", client[0])]
        con = m.mtype == Type.CON
        digest = hashlib.blake2b(data[4:], digest_size=16).digest()  # token, options, payload
        key = (client, m.mid)
        ex = self.exchanges.get(key)
        if ex is not None and ex[0] == digest and ex[1] > now_ms:
            self.counters["duplicates"] += 1
            # answered again once its envelope is committed; before that the commit's ACK is coming
            if con and ex[2]:  # the same ACK again (RFC 7252 4.5): the response, if it rode on it
                self._unpiggyback(key)
                return [Reply(ex[3] or empty(Type.ACK, m.mid), client, via)]
            return []
        if listener and (m.opt.proxy_uri is not None or m.opt.proxy_scheme is not None):
            target = forward_target(m)
            if isinstance(target, str):
                self.counters["proxy_refused"] += 1
                return [self._answer(m, Code.PROXYING_NOT_SUPPORTED, target, client, via)]
            m, server = target
            data = encode(m, m.mtype, m.mid, m.token)
        elif server is None:
            self.counters["proxy_refused"] += 1
            return [
                self._answer(
                    m, Code.NOT_FOUND, "this listener is a forward proxy: name the server in Proxy-Uri", client, via
                )
            ]
        path = path_of(m)
        rule = next((r for r in self.rules if r.matches(path)), None)
        if rule is None or not rule.allow:
            self.counters["forbidden"] += 1
            return [self._answer(m, Code.FORBIDDEN, f"{path}: not released across the link", client, via)]
        dst = self.gateway_for(server[0])
        if dst is None:
            self.counters["no_route"] += 1
            return [self._answer(m, Code.BAD_GATEWAY, f"no gateway serves {server[0]}", client, via)]
        b2 = m.opt.block2
        if b2 is not None and b2.block_number > 0:
            kept = self.bodies.get((client, resource_key(m)))
            if kept is not None and kept.until_ms > now_ms:  # a later block of a body kept here
                self.counters["blocks_served"] += 1
                return [self._reply(m, self._block(kept.message, b2.block_number, b2.size_exponent), client, via)]
        if m.opt.block1 is not None:
            got = self._gather(m, client, via, now_ms)
            if isinstance(got, Reply):
                return [got]
            data = got
        self.exchanges[key] = (digest, now_ms + EXCHANGE_LIFETIME_MS, False, None)
        body = cbor2.dumps(
            {
                "op": "req",
                "m": data,
                "c": list(client),
                "s": list(server),
                "v": list(via),
                "con": con,
                **({"obs": m.opt.observe} if m.opt.observe in (0, 1) and m.code == Code.GET else {}),
            }
        )
        self.counters["requests"] += 1
        then = [Reply(empty(Type.ACK, m.mid), client, via)] if con else []
        if con and m.opt.observe is None:
            self.tokens[key] = m.token
            self._bound(self.tokens)
        # a repeat of a message id only within EXCHANGE_LIFETIME (RFC 7252 4.5: it may be reused after)
        mark = (f"coap:{client[0]}:{client[1]}:{m.mid}", digest, EXCHANGE_LIFETIME_MS)
        return [Submit(dst, body, rule.lifetime_s * 1000, rule.priority, mark, then, key)]

    def _gather(self, m: Message, client: Addr, via: Addr, now_ms: int) -> Reply | bytes:
        """A Block1 block (RFC 7959 2.5): gathered; every block but the last is answered 2.31
        Continue here, the last gives the whole request (as a datagram) to send across."""
        b1, rkey = m.opt.block1, (client, resource_key(m))
        kept = self.uploads.get(rkey)
        so_far = kept.message.payload if kept is not None and kept.until_ms > now_ms else b""
        start = b1.block_number * b1.size
        if start > len(so_far):
            self.counters["blocks_out_of_order"] += 1
            return self._answer(
                m, Code.REQUEST_ENTITY_INCOMPLETE, f"block {b1.block_number} before the ones ahead of it", client, via
            )
        if b1.more and start + len(m.payload) <= len(so_far):  # a block had already (resent): same answer
            whole = so_far
        else:
            whole = so_far[:start] + m.payload
        if len(whole) > MAX_BODY:
            self.uploads.pop(rkey, None)
            self.counters["bodies_too_large"] += 1
            return self._answer(m, Code.REQUEST_ENTITY_TOO_LARGE, f"more than {MAX_BODY} bytes", client, via)
        if b1.more:
            full = copy(m, {BLOCK1, SIZE1})
            full.payload = whole
            self.uploads[rkey] = _Kept(full, now_ms + EXCHANGE_LIFETIME_MS)
            self._bound(self.uploads)
            self.counters["blocks_gathered"] += 1
            r = Message(code=Code.CONTINUE)
            r.opt.block1 = b1
            return self._reply(m, r, client, via)
        self.uploads.pop(rkey, None)
        full = copy(m, {SIZE1})  # Block1 stays: the response echoes it (RFC 7959 2.3); stripped when replayed
        full.payload = whole
        return encode(full, m.mtype, m.mid, m.token)

    @staticmethod
    def _bound(table: dict) -> None:
        while len(table) > MAX_KEPT:
            del table[next(iter(table))]

    @staticmethod
    def _block(resp: Message, num: int, szx: int) -> Message:
        """Block `num` of a kept response."""
        out = copy(resp, NOT_CARRIED)
        size = 1 << (szx + 4)
        out.payload = resp.payload[num * size : (num + 1) * size]
        out.opt.block2 = _blockwise(num, int(len(resp.payload) > (num + 1) * size), szx)
        out.opt.size2 = len(resp.payload)
        if resp.opt.observe is not None and num == 0:
            out.opt.observe = resp.opt.observe
        if resp.opt.block1 is not None:
            out.opt.block1 = resp.opt.block1
        return out

    def _reply(self, m: Message, r: Message, client: Addr, via: Addr) -> Reply:
        """A response made here: piggybacked on the ACK of a CON, a NON for a NON."""
        if m.mtype == Type.CON:
            return Reply(encode(r, Type.ACK, m.mid, m.token), client, via)
        return Reply(encode(r, Type.NON, self._next_mid(), m.token), client, via)

    def committed(self, key: tuple[Addr, int], took: bool, then: list, now_ms: int) -> list:
        """The request's envelope is in custody (`took`: new; else a repeat of one taken
        before a restart, counted as a duplicate): what to send now.  A new CON request's
        empty ACK (`then`) waits up to PIGGYBACK_WAIT_MS for the response."""
        ex = self.exchanges.get(key)
        if ex is not None:
            self.exchanges[key] = (ex[0], ex[1], True, None)
        token = self.tokens.pop(key, None)
        if not took:
            self.counters["requests"] -= 1
            self.counters["duplicates"] += 1
            return then
        if token is None or len(then) != 1:
            return then
        self.acking[key] = _Acking(token, then[0], now_ms + PIGGYBACK_WAIT_MS)
        return []

    def _unpiggyback(self, key: tuple[Addr, int]) -> _Acking | None:
        return self.acking.pop(key, None)

    def _answer(self, m: Message, code: Code, why: str, client: Addr, via: Addr) -> Reply:
        return self._reply(m, Message(code=code, payload=why.encode()), client, via)

    # -- responses from the far side ------------------------------------------------
    def response(
        self,
        inbox_id: int,
        body: dict,
        now_ms: int,
        origin: str = "",
        created_ms: int | None = None,
        stale: bool = False,
    ) -> list:
        """A response envelope arrived (from gateway `origin`, made at `created_ms`): send it
        to its client (CON: until ACKed).  A notification replaces an older one of its
        observation still waiting for its ACK, or held as stale."""
        resp = decode(body["m"])
        c, v = body["c"], body.get("v", body["s"])
        client, via = (c[0], c[1]), (v[0], v[1])
        con = bool(body["con"])
        out: list = []
        observation = None
        msg = strip(resp)
        age_s = max(0, now_ms - created_ms) // 1000 if created_ms is not None else 0
        max_age = msg.opt.max_age if msg.opt.max_age is not None else 60  # RFC 7252 5.10.5's default
        obs_key = (client, body["t"])
        if body.get("obs"):
            held = self.held.pop(obs_key, None)
            if held is not None:
                out.append(Consume(held[0]))
                self.counters["notifications_replaced"] += 1
            if age_s >= max_age + STALE_HOLD_MS // 1000 and not stale:
                # stale by more than the hold (a backlog flushed after a cut): wait a little for a
                # newer one; each newer stale one restarts the wait, but not past STALE_HOLD_MAX_MS
                # from the first.  One stale by less is a slow link's usual lateness (libcoap's
                # /time has Max-Age 1, the radio link takes longer): waiting for a newer one, as
                # late, would only hold every notification to the cap; it goes now, Max-Age 0.
                first = held[4] if held else now_ms
                self.held[obs_key] = [
                    inbox_id,
                    body,
                    origin,
                    min(now_ms + STALE_HOLD_MS, first + STALE_HOLD_MAX_MS),
                    first,
                ]
                self.counters["notifications_stale"] += 1
                return out
        msg.opt.max_age = 0 if stale else max(0, max_age - age_s)
        if body.get("obs"):
            observation = (client, body["t"], origin, tuple(body["s"]))
            older = self.notifying.get(obs_key)
            settled = self._settle(older) if older is not None else None
            if settled is not None:
                out.append(Consume(settled.inbox_id))
                self.counters["notifications_replaced"] += 1
            self.obs_value = max(self.obs_value + 1, now_ms // 32)
            msg.opt.observe = self.obs_value & 0xFFFFFF  # 24 bits, RFC 7641 4.4
            self.counters["notifications"] += 1
        else:
            self.counters["responses"] += 1
        if body.get("b1"):
            msg.opt.block1 = _blockwise(*body["b1"])
        num, szx = body.get("b2") or (0, BLOCK_SZX)
        if len(resp.payload) > (1 << (szx + 4)) or num > 0:
            self.bodies[(client, body.get("k", b""))] = _Kept(msg, now_ms + EXCHANGE_LIFETIME_MS)
            self._bound(self.bodies)
            msg = self._block(msg, num, szx)
        # its own request's ACK is still waiting (the same exchange: client, message id, token and
        # the address it spoke to): the response rides on it, and answers that request's repeats
        mid = body.get("mid")
        a = self.acking.get((client, mid)) if con and isinstance(mid, int) and not body.get("obs") else None
        if a is not None and isinstance(mid, int) and a.token == body["t"] and tuple(a.ack.via) == via:
            self._unpiggyback((client, mid))
            self.counters["piggybacked"] += 1
            data = encode(msg, Type.ACK, mid, body["t"])
            ex = self.exchanges.get((client, mid))
            if ex is not None:
                self.exchanges[(client, mid)] = (ex[0], ex[1], True, data)
            return [*out, Reply(data, client, via), Consume(inbox_id)]
        data = encode(msg, Type.CON if con else Type.NON, self._next_mid(), body["t"])
        reply = Reply(data, client, via)
        if not con:
            return [*out, reply, Consume(inbox_id)]
        timeout = ACK_TIMEOUT_MS * self.rng.uniform(1.0, ACK_RANDOM_FACTOR)
        self.pending[(client, self.mid)] = _Pending(
            inbox_id, reply, timeout, now_ms + int(timeout), observation=observation
        )
        if observation:
            self.notifying[obs_key] = (client, self.mid)
        return [*out, reply]

    def _settle(self, key: tuple[Addr, int]) -> _Pending | None:
        p = self.pending.pop(key, None)
        if p is not None and p.observation and self.notifying.get(p.observation[:2]) == key:
            del self.notifying[p.observation[:2]]
        return p

    def _cancel(self, observation: tuple, why: str) -> list:
        """End an observation at the far side (a `cancel` envelope to the gateway that sent it)."""
        client, token, origin, server = observation
        if not origin:
            return []
        self.counters["observations_cancelled"] += 1
        body = cbor2.dumps(
            {
                "op": "cancel",
                "m": b"",
                "c": list(client),
                "s": list(server),
                "v": list(server),
                "con": False,
                "t": token,
                "why": why,
            }
        )
        return [Submit(origin, body, EXCHANGE_LIFETIME_MS, Priority.IMMEDIATE, None, [], None)]

    def poll(self, now_ms: int) -> list:
        """Retransmissions due (RFC 7252 4.2); a response unacknowledged after MAX_RETRANSMIT
        is given up (the client is gone or gave up its exchange) and its envelope consumed."""
        out: list = []
        for key in [k for k, a in self.acking.items() if a.until_ms <= now_ms]:
            out.append(self.acking.pop(key).ack)  # no response yet: the empty ACK (RFC 7252 5.2.2)
        for held_key, (inbox_id, body, origin, until, _) in list(self.held.items()):
            if until <= now_ms:  # nothing newer came: the stale one is the newest there is
                del self.held[held_key]
                out += self.response(inbox_id, body, now_ms, origin, stale=True)
        for key, p in list(self.pending.items()):
            if p.next_ms > now_ms:
                continue
            if p.sent > MAX_RETRANSMIT:
                self._settle(key)
                self.counters["responses_unacknowledged"] += 1
                out.append(Consume(p.inbox_id))
                if p.observation:  # RFC 7641 4.5: a client that does not ACK is no longer observing
                    out += self._cancel(p.observation, "notification not acknowledged")
                continue
            p.sent += 1
            p.timeout_ms *= 2
            p.next_ms = now_ms + int(p.timeout_ms)
            self.counters["retransmissions"] += 1
            out.append(p.reply)
        for ex_key in [k for k, ex in self.exchanges.items() if ex[1] <= now_ms]:
            del self.exchanges[ex_key]
        for table in (self.bodies, self.uploads):
            for body_key in [k for k, kept in table.items() if kept.until_ms <= now_ms]:
                del table[body_key]
        return out

    def next_deadline_ms(self) -> int | None:
        return min(
            [p.next_ms for p in self.pending.values()]
            + [h[3] for h in self.held.values()]
            + [a.until_ms for a in self.acking.values()],
            default=None,
        )

    def waiting_for(self, inbox_id: int) -> bool:
        return any(p.inbox_id == inbox_id for p in self.pending.values())


# -- far side -------------------------------------------------------------------------
def _blockwise(num: int, more: int, szx: int) -> BlockOption.BlockwiseTuple:
    return BlockOption.BlockwiseTuple(num, more, szx)


def request_of(body: dict) -> tuple[Message, str]:
    """The request to replay and the server's "address:port" ("[v6]:port") from a request envelope."""
    m = strip(decode(body["m"]))
    host, port = body["s"]
    return m, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def observation_key(origin: str, body: dict) -> tuple:
    """An observation at the far side: the near gateway, its client and the client's token."""
    token = body["t"] if body["op"] == "cancel" else decode(body["m"]).token
    return origin, tuple(body["c"]), token


def response_body(req: dict, resp: Message) -> bytes:
    """The response envelope's body: the response (token and message id are the near side's),
    and what the near side needs to answer the way it was asked (Observe, the blocks)."""
    m = decode(req["m"])
    out = {
        "op": "rsp",
        "m": encode(strip(resp), Type.NON, 0, b""),
        "c": req["c"],
        "s": req["s"],
        "v": req.get("v", req["s"]),
        "con": req["con"],
        "t": m.token,
        "k": resource_key(m),
        "mid": m.mid,
    }
    if req.get("obs") == 0 and resp.opt.observe is not None:
        out["obs"] = True
    if m.opt.block2 is not None:
        out["b2"] = [m.opt.block2.block_number, min(m.opt.block2.size_exponent, BLOCK_SZX)]
    if m.opt.block1 is not None:
        out["b1"] = [m.opt.block1.block_number, 0, m.opt.block1.size_exponent]
    return cbor2.dumps(out)


def timeout_body(req: dict, why: str) -> bytes:
    """5.04 Gateway Timeout: the server was not reached within the request's lifetime."""
    return response_body(req, Message(code=Code.GATEWAY_TIMEOUT, payload=why.encode()))


def unpack(body: bytes) -> dict:
    """An envelope body of this app; ValueError names what is wrong."""
    try:
        d = strict_loads(body)
    except StrictCBORError as e:
        raise ValueError(f"not strict CBOR ({e})") from None
    if not isinstance(d, dict) or d.get("op") not in ("req", "rsp", "cancel"):
        raise ValueError("not a CoAP envelope body")
    for k, t in (("m", bytes), ("c", list), ("s", list), ("con", bool)):
        if not isinstance(d.get(k), t):
            raise ValueError(f"field {k!r} missing or of the wrong type")
    if not isinstance(d.setdefault("v", d["s"]), list):
        raise ValueError("field 'v' of the wrong type")
    for k in ("c", "s", "v"):
        if len(d[k]) != 2 or not isinstance(d[k][0], str) or not isinstance(d[k][1], int):
            raise ValueError(f"field {k!r} is not [address, port]")
    if d["op"] in ("rsp", "cancel") and not isinstance(d.get("t"), bytes):
        raise ValueError("response without the client's token")
    if d["op"] == "req":  # what the far side asks: an IP server and a request
        try:
            ipaddress.ip_address(d["s"][0])
        except ValueError:
            raise ValueError(f"server {d['s'][0][:60]!r} is not an IP address") from None
        if not 0 < d["s"][1] < 65536:
            raise ValueError(f"server port {d['s'][1]} is not 1-65535")
        if not decode(d["m"]).code.is_request():
            raise ValueError("field 'm' is not a request")
    if not isinstance(d.get("k", b""), bytes) or not isinstance(d.get("obs", False), (bool, int)):
        raise ValueError("field 'k' or 'obs' of the wrong type")
    for k, n in (("b1", 3), ("b2", 2)):
        v = d.get(k)
        if v is not None and not (
            isinstance(v, list)
            and len(v) == n
            and v[-1] in range(7)
            and all(isinstance(x, int) and 0 <= x < 1 << 20 for x in v)
        ):
            raise ValueError(f"field {k!r} is not a block number and size")
    return d
