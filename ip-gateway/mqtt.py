"""MQTT 3.1.1 and 5.0 packet codec, I/O-free (bytes in, packets out, and back).

Written by hand because no maintained pure-Python sans-I/O codec covers both
versions (paho-mqtt's is buried in its client; mqtt-codec is 3.1.1 only): the
tests use those two, the mosquitto tools and a real broker as oracles.

- `Parser(max_packet_size)` frames a byte stream: `feed(data)` returns the whole
  packets it completed.  The protocol version is learnt from CONNECT (server
  side) or set with `parser.version = 5` (client side).
- `encode(packet, version)` gives the bytes of one packet.
- Anything malformed raises `MqttError` with the MQTT 5 reason code the server
  must answer with (0x81 malformed packet, 0x82 protocol error, 0x84
  unsupported protocol version, 0x90 topic name invalid, 0x95 packet too large)
  and a message naming the bad value.  For a 3.1.1 client the connection is just
  closed, except for the two CONNACK return codes 3.1.1 has (1: protocol
  version, 2: identifier rejected), see `connack_code_v3`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Reason(IntEnum):
    """MQTT 5 reason codes used by the gateway (spec 2.4)."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99
    QOS_NOT_SUPPORTED = 0x9B


class MqttError(Exception):
    """A packet the codec refuses; `reason` is what an MQTT 5 peer is told."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason = Reason(reason)


def connack_code_v3(reason: Reason) -> int | None:
    """The 3.1.1 CONNACK return code for a refused CONNECT, None where 3.1.1 just closes."""
    return {
        Reason.UNSUPPORTED_PROTOCOL_VERSION: 1,
        Reason.CLIENT_IDENTIFIER_NOT_VALID: 2,
        Reason.SERVER_UNAVAILABLE: 3,
        Reason.BAD_USER_NAME_OR_PASSWORD: 4,
        Reason.NOT_AUTHORIZED: 5,
    }.get(reason)


# -- properties (MQTT 5, spec 2.2.2.2) ------------------------------------------
BYTE, TWO, FOUR, VARINT, STR, BIN, PAIR = range(7)

_P = PacketType
PROPERTIES: dict[int, tuple[str, int, frozenset]] = {
    0x01: ("payload_format_indicator", BYTE, frozenset({_P.PUBLISH, 0})),  # 0: will properties
    0x02: ("message_expiry_interval", FOUR, frozenset({_P.PUBLISH, 0})),
    0x03: ("content_type", STR, frozenset({_P.PUBLISH, 0})),
    0x08: ("response_topic", STR, frozenset({_P.PUBLISH, 0})),
    0x09: ("correlation_data", BIN, frozenset({_P.PUBLISH, 0})),
    0x0B: ("subscription_identifier", VARINT, frozenset({_P.PUBLISH, _P.SUBSCRIBE})),
    0x11: ("session_expiry_interval", FOUR, frozenset({_P.CONNECT, _P.CONNACK, _P.DISCONNECT})),
    0x12: ("assigned_client_identifier", STR, frozenset({_P.CONNACK})),
    0x13: ("server_keep_alive", TWO, frozenset({_P.CONNACK})),
    0x15: ("authentication_method", STR, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    0x16: ("authentication_data", BIN, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    0x17: ("request_problem_information", BYTE, frozenset({_P.CONNECT})),
    0x18: ("will_delay_interval", FOUR, frozenset({0})),
    0x19: ("request_response_information", BYTE, frozenset({_P.CONNECT})),
    0x1A: ("response_information", STR, frozenset({_P.CONNACK})),
    0x1C: ("server_reference", STR, frozenset({_P.CONNACK, _P.DISCONNECT})),
    0x1F: (
        "reason_string",
        STR,
        frozenset(set(_P) - {_P.CONNECT, _P.PUBLISH, _P.SUBSCRIBE, _P.UNSUBSCRIBE, _P.PINGREQ, _P.PINGRESP}),
    ),
    0x21: ("receive_maximum", TWO, frozenset({_P.CONNECT, _P.CONNACK})),
    0x22: ("topic_alias_maximum", TWO, frozenset({_P.CONNECT, _P.CONNACK})),
    0x23: ("topic_alias", TWO, frozenset({_P.PUBLISH})),
    0x24: ("maximum_qos", BYTE, frozenset({_P.CONNACK})),
    0x25: ("retain_available", BYTE, frozenset({_P.CONNACK})),
    0x26: ("user_property", PAIR, frozenset(set(_P) | {0})),
    0x27: ("maximum_packet_size", FOUR, frozenset({_P.CONNECT, _P.CONNACK})),
    0x28: ("wildcard_subscription_available", BYTE, frozenset({_P.CONNACK})),
    0x29: ("subscription_identifier_available", BYTE, frozenset({_P.CONNACK})),
    0x2A: ("shared_subscription_available", BYTE, frozenset({_P.CONNACK})),
}
# values the spec makes a Protocol Error (3.1.2.11, 3.2.2.3, 3.3.2.3.2)
_ZERO_OR_ONE = (lambda v: v in (0, 1), "must be 0 or 1")
_NOT_ZERO = (lambda v: v != 0, "must not be 0")
_PROPERTY_VALUES = {
    "payload_format_indicator": _ZERO_OR_ONE,
    "request_problem_information": _ZERO_OR_ONE,
    "request_response_information": _ZERO_OR_ONE,
    "maximum_qos": _ZERO_OR_ONE,
    "retain_available": _ZERO_OR_ONE,
    "wildcard_subscription_available": _ZERO_OR_ONE,
    "subscription_identifier_available": _ZERO_OR_ONE,
    "shared_subscription_available": _ZERO_OR_ONE,
    "receive_maximum": _NOT_ZERO,
    "maximum_packet_size": _NOT_ZERO,
    "subscription_identifier": _NOT_ZERO,
}  # (topic_alias 0 the near gateway answers itself: Topic Alias Invalid, 3.3.2.3.4)
# the reason codes each packet may carry (MQTT 5: 3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.9.3,
# 3.11.3, 3.14.2.1, 3.15.2.1; SUBACK in 3.1.1: 3.9.3, CONNACK in 3.1.1: 0 to 5)
REASONS_V5: dict[int, frozenset[int]] = {
    _P.CONNACK: frozenset(
        {
            0x00,
            0x80,
            0x81,
            0x82,
            0x83,
            0x84,
            0x85,
            0x86,
            0x87,
            0x88,
            0x89,
            0x8A,
            0x8C,
            0x90,
            0x95,
            0x97,
            0x99,
            0x9A,
            0x9B,
            0x9C,
            0x9D,
            0x9F,
        }
    ),
    _P.PUBACK: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    _P.PUBREC: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    _P.PUBREL: frozenset({0x00, 0x92}),
    _P.PUBCOMP: frozenset({0x00, 0x92}),
    _P.SUBACK: frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    _P.UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    _P.DISCONNECT: frozenset(
        {
            0x00,
            0x04,
            0x80,
            0x81,
            0x82,
            0x83,
            0x87,
            0x89,
            0x8B,
            0x8D,
            0x8E,
            0x8F,
            0x90,
            0x93,
            0x94,
            0x95,
            0x96,
            0x97,
            0x98,
            0x99,
            0x9A,
            0x9B,
            0x9C,
            0x9D,
            0x9E,
            0x9F,
            0xA0,
            0xA1,
            0xA2,
        }
    ),
    _P.AUTH: frozenset({0x00, 0x18, 0x19}),
}
REASONS_V3: dict[int, frozenset[int]] = {_P.CONNACK: frozenset(range(6)), _P.SUBACK: frozenset({0, 1, 2, 0x80})}


def _check_reason(ptype: PacketType, code: int, v5: bool) -> int:
    allowed = (REASONS_V5 if v5 else REASONS_V3).get(ptype)
    if allowed is not None and code not in allowed:
        raise MqttError(
            Reason.MALFORMED_PACKET,
            f"{ptype.name} reason code 0x{code:02x} is not one MQTT {'5' if v5 else '3.1.1'} defines for it",
        )
    return code


PROPERTY_IDS = {name: (pid, typ) for pid, (name, typ, _) in PROPERTIES.items()}
# may appear more than once; kept as lists
MULTI = {"user_property", "subscription_identifier"}

Properties = dict  # name -> value; user_property: list[(key, value)]; subscription_identifier: list[int]


# -- packets ---------------------------------------------------------------------
@dataclass
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass
class Connect:
    client_id: str
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    version: int = 4  # 4: MQTT 3.1.1, 5: MQTT 5.0
    properties: Properties = field(default_factory=dict)
    type = PacketType.CONNECT


@dataclass
class ConnAck:
    session_present: bool = False
    reason: int = 0  # 3.1.1: return code
    properties: Properties = field(default_factory=dict)
    type = PacketType.CONNACK


@dataclass
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)
    type = PacketType.PUBLISH


@dataclass
class _Ack:
    packet_id: int
    reason: int = 0
    properties: Properties = field(default_factory=dict)


class PubAck(_Ack):
    type = PacketType.PUBACK


class PubRec(_Ack):
    type = PacketType.PUBREC


class PubRel(_Ack):
    type = PacketType.PUBREL


class PubComp(_Ack):
    type = PacketType.PUBCOMP


@dataclass
class SubOption:
    filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass
class Subscribe:
    packet_id: int
    subscriptions: list[SubOption]
    properties: Properties = field(default_factory=dict)
    type = PacketType.SUBSCRIBE


@dataclass
class SubAck:
    packet_id: int
    reasons: list[int]  # granted QoS or a failure code (0x80 in 3.1.1)
    properties: Properties = field(default_factory=dict)
    type = PacketType.SUBACK


@dataclass
class Unsubscribe:
    packet_id: int
    filters: list[str]
    properties: Properties = field(default_factory=dict)
    type = PacketType.UNSUBSCRIBE


@dataclass
class UnsubAck:
    packet_id: int
    reasons: list[int] = field(default_factory=list)  # MQTT 5 only
    properties: Properties = field(default_factory=dict)
    type = PacketType.UNSUBACK


@dataclass
class PingReq:
    type = PacketType.PINGREQ


@dataclass
class PingResp:
    type = PacketType.PINGRESP


@dataclass
class Disconnect:
    reason: int = 0
    properties: Properties = field(default_factory=dict)
    type = PacketType.DISCONNECT


@dataclass
class Auth:
    reason: int = 0
    properties: Properties = field(default_factory=dict)
    type = PacketType.AUTH


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)


# -- topic names and filters -----------------------------------------------------
def check_topic_name(topic: str) -> None:
    if "+" in topic or "#" in topic:
        raise MqttError(Reason.TOPIC_NAME_INVALID, f"wildcard in a PUBLISH topic name: {topic!r}")


def check_topic_filter(flt: str) -> None:
    if not flt:
        raise MqttError(Reason.PROTOCOL_ERROR, "empty topic filter")
    levels = flt.split("/")
    for i, lv in enumerate(levels):
        if "#" in lv and (lv != "#" or i != len(levels) - 1):
            raise MqttError(Reason.MALFORMED_PACKET, f"'#' must be a whole last level: {flt!r}")
        if "+" in lv and lv != "+":
            raise MqttError(Reason.MALFORMED_PACKET, f"'+' must be a whole level: {flt!r}")


def topic_matches(flt: str, topic: str) -> bool:
    """Does topic name `topic` match filter `flt` (spec 4.7)?  Topics starting with
    '$' are not matched by filters starting with a wildcard."""
    if flt.startswith("$share/"):
        flt = flt.split("/", 2)[2] if flt.count("/") >= 2 else ""
    if topic.startswith("$") and flt[:1] in ("+", "#"):
        return False
    f, t = flt.split("/"), topic.split("/")
    for i, lv in enumerate(f):
        if lv == "#":
            return True
        if i >= len(t) or (lv != "+" and lv != t[i]):
            return False
    return len(f) == len(t)


# -- reading ---------------------------------------------------------------------
class _Reader:
    __slots__ = ("b", "i", "end")

    def __init__(self, b: bytes | memoryview, start: int, end: int):
        self.b, self.i, self.end = b, start, end

    def need(self, n: int, what: str) -> None:
        if self.i + n > self.end:
            raise MqttError(Reason.MALFORMED_PACKET, f"packet ends inside its {what}")

    def byte(self, what: str) -> int:
        self.need(1, what)
        v = self.b[self.i]
        self.i += 1
        return v

    def u16(self, what: str) -> int:
        self.need(2, what)
        v = (self.b[self.i] << 8) | self.b[self.i + 1]
        self.i += 2
        return v

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = struct.unpack_from(">I", self.b, self.i)[0]
        self.i += 4
        return v

    def varint(self, what: str) -> int:
        v, mul = 0, 1
        for k in range(4):
            c = self.byte(what)
            v += (c & 0x7F) * mul
            if not c & 0x80:
                if c == 0 and k:  # MQTT-1.5.5-1
                    raise MqttError(
                        Reason.MALFORMED_PACKET, f"{what}: variable byte integer {v} not in its shortest form"
                    )
                return v
            mul <<= 7
        raise MqttError(Reason.MALFORMED_PACKET, f"{what}: variable byte integer longer than 4 bytes")

    def binary(self, what: str) -> bytes:
        n = self.u16(what)
        self.need(n, what)
        v = bytes(self.b[self.i : self.i + n])
        self.i += n
        return v

    def string(self, what: str) -> str:
        raw = self.binary(what)
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MqttError(Reason.MALFORMED_PACKET, f"{what} is not valid UTF-8 ({raw[:40]!r}: {e.reason})") from None
        if "\x00" in s:
            raise MqttError(Reason.MALFORMED_PACKET, f"{what} contains U+0000: {s[:40]!r}")
        return s

    def rest(self) -> bytes:
        v = bytes(self.b[self.i : self.end])
        self.i = self.end
        return v

    def left(self) -> int:
        return self.end - self.i

    def properties(self, ptype: int, what: str) -> Properties:
        n = self.varint(f"{what} properties length")
        self.need(n, f"{what} properties")
        end = self.i + n
        props: Properties = {}
        while self.i < end:
            pid = self.varint(f"{what} property id")
            spec = PROPERTIES.get(pid)
            if spec is None:
                raise MqttError(Reason.MALFORMED_PACKET, f"unknown property id 0x{pid:02x} in {what}")
            name, typ, allowed = spec
            if ptype not in allowed:
                raise MqttError(Reason.PROTOCOL_ERROR, f"property {name} is not allowed in {what}")
            v: Any
            if typ == BYTE:
                v = self.byte(name)
            elif typ == TWO:
                v = self.u16(name)
            elif typ == FOUR:
                v = self.u32(name)
            elif typ == VARINT:
                v = self.varint(name)
            elif typ == STR:
                v = self.string(name)
            elif typ == BIN:
                v = self.binary(name)
            else:
                v = (self.string(name + " key"), self.string(name + " value"))
            bad = _PROPERTY_VALUES.get(name)
            if bad is not None and not bad[0](v):
                raise MqttError(Reason.PROTOCOL_ERROR, f"{name} {v} in {what}: {bad[1]}")
            if name in MULTI:
                props.setdefault(name, []).append(v)
            elif name in props:
                raise MqttError(Reason.PROTOCOL_ERROR, f"property {name} given twice in {what}")
            else:
                props[name] = v
        if self.i != end:
            raise MqttError(Reason.MALFORMED_PACKET, f"{what} properties overrun their length")
        return props


# decoding's per-packet lookups, made once (a stream of tiny packets is decoded packet by packet)
_PACKET_TYPES = (None, *PacketType)
_FLAGS_0010 = frozenset((PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE))
_ACKS: dict[PacketType, type[PubAck | PubRec | PubRel | PubComp]] = {
    PacketType.PUBACK: PubAck,
    PacketType.PUBREC: PubRec,
    PacketType.PUBREL: PubRel,
    PacketType.PUBCOMP: PubComp,
}


class Parser:
    """Frames and decodes a stream of MQTT packets."""

    def __init__(self, max_packet_size: int = 1 << 20, version: int | None = None, connect_max: int | None = None):
        self.max_packet_size = max_packet_size
        self.version = version  # None until a CONNECT told it
        self.connect_max = connect_max  # the limit until then (None: max_packet_size)
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        self._buf += data
        out: list[Packet] = []
        while True:
            framed = self._frame()
            if framed is None:
                return out
            hdr, start, end = framed
            pkt = self._decode(hdr, memoryview(self._buf), start, end)
            del self._buf[:end]
            out.append(pkt)

    def _frame(self) -> tuple[int, int, int] | None:
        b = self._buf
        if len(b) < 2:
            return None
        length, mul, i = 0, 1, 1
        while True:
            if i >= len(b):
                return None
            c = b[i]
            length += (c & 0x7F) * mul
            i += 1
            if not c & 0x80:
                if c == 0 and i > 2:  # MQTT-1.5.5-1: the fewest bytes that hold the value
                    raise MqttError(Reason.MALFORMED_PACKET, f"remaining length {length} not in its shortest form")
                break
            if i == 5:
                raise MqttError(Reason.MALFORMED_PACKET, "remaining length longer than 4 bytes")
            mul <<= 7
        limit = self.max_packet_size
        if self.version is None and self.connect_max is not None:
            limit = min(limit, self.connect_max)
        if i + length > limit:
            raise MqttError(
                Reason.PACKET_TOO_LARGE, f"packet of {i + length} bytes exceeds the maximum packet size {limit}"
            )
        if len(b) < i + length:
            return None
        return b[0], i, i + length

    def _decode(self, hdr: int, b, start: int, end: int) -> Packet:
        ptype, flags = hdr >> 4, hdr & 0x0F
        if not 1 <= ptype <= 15:
            raise MqttError(Reason.MALFORMED_PACKET, f"reserved packet type {ptype}")
        ptype = _PACKET_TYPES[ptype]
        want = 0b0010 if ptype in _FLAGS_0010 else 0
        if ptype != PacketType.PUBLISH and flags != want:
            raise MqttError(Reason.MALFORMED_PACKET, f"{ptype.name} with fixed-header flags {flags:04b}")
        r = _Reader(b, start, end)
        if ptype == PacketType.CONNECT:
            conn = self._connect(r)
            if r.left():  # found by the differential fuzz target (perf/mqtt_diff.py)
                raise MqttError(Reason.MALFORMED_PACKET, f"{r.left()} bytes left over after CONNECT")
            self.version = conn.version
            return conn
        if self.version is None:
            raise MqttError(Reason.PROTOCOL_ERROR, f"{ptype.name} before CONNECT")
        v5 = self.version == 5
        pkt: Packet
        if ptype == PacketType.PUBLISH:
            return self._publish(r, flags, v5)
        if ptype == PacketType.CONNACK:
            fl = r.byte("CONNACK flags")
            if fl & 0xFE:
                raise MqttError(Reason.MALFORMED_PACKET, f"CONNACK flags {fl:08b}")
            pkt = ConnAck(bool(fl & 1), _check_reason(ptype, r.byte("CONNACK reason"), v5))
            if v5:
                pkt.properties = r.properties(ptype, "CONNACK")
        elif ptype in _ACKS:
            pkt = ack = _ACKS[ptype](self._packet_id(r, ptype))
            if v5 and r.left():
                ack.reason = _check_reason(ptype, r.byte(f"{ptype.name} reason"), v5)
                if r.left():
                    ack.properties = r.properties(ptype, ptype.name)
        elif ptype == PacketType.SUBSCRIBE:
            pid = self._packet_id(r, ptype)
            props = r.properties(ptype, "SUBSCRIBE") if v5 else {}
            if len(props.get("subscription_identifier", ())) > 1:  # 3.8.2.1.2
                raise MqttError(Reason.PROTOCOL_ERROR, "subscription identifier given twice in SUBSCRIBE")
            subs = []
            while r.left():
                flt = r.string("SUBSCRIBE topic filter")
                check_topic_filter(flt)
                o = r.byte("subscription options")
                if o & 0xC0 or (not v5 and o & 0xFC):
                    raise MqttError(Reason.MALFORMED_PACKET, f"reserved bits set in subscription options {o:08b}")
                if o & 3 == 3:
                    raise MqttError(Reason.MALFORMED_PACKET, f"subscription QoS 3 for {flt!r}")
                if (o >> 4) & 3 == 3:
                    raise MqttError(Reason.PROTOCOL_ERROR, f"retain handling 3 for {flt!r}")
                subs.append(SubOption(flt, o & 3, bool(o & 4), bool(o & 8), (o >> 4) & 3))
            if not subs:
                raise MqttError(Reason.PROTOCOL_ERROR, "SUBSCRIBE without a topic filter")
            pkt = Subscribe(pid, subs, props)
        elif ptype == PacketType.SUBACK:
            pid = self._packet_id(r, ptype)
            props = r.properties(ptype, "SUBACK") if v5 else {}
            pkt = SubAck(pid, [_check_reason(ptype, c, v5) for c in r.rest()], props)
        elif ptype == PacketType.UNSUBSCRIBE:
            pid = self._packet_id(r, ptype)
            props = r.properties(ptype, "UNSUBSCRIBE") if v5 else {}
            flts = []
            while r.left():
                flts.append(r.string("UNSUBSCRIBE topic filter"))
                check_topic_filter(flts[-1])
            if not flts:
                raise MqttError(Reason.PROTOCOL_ERROR, "UNSUBSCRIBE without a topic filter")
            pkt = Unsubscribe(pid, flts, props)
        elif ptype == PacketType.UNSUBACK:
            pid = self._packet_id(r, ptype)
            props = r.properties(ptype, "UNSUBACK") if v5 else {}
            pkt = UnsubAck(pid, [_check_reason(ptype, c, v5) for c in r.rest()] if v5 else [], props)
        elif ptype == PacketType.PINGREQ:
            pkt = PingReq()
        elif ptype == PacketType.PINGRESP:
            pkt = PingResp()
        elif ptype in (PacketType.DISCONNECT, PacketType.AUTH):
            if ptype == PacketType.AUTH and not v5:
                raise MqttError(Reason.PROTOCOL_ERROR, "AUTH is MQTT 5 only")
            pkt = fin = Disconnect() if ptype == PacketType.DISCONNECT else Auth()
            if v5 and r.left():
                fin.reason = _check_reason(ptype, r.byte(f"{ptype.name} reason"), v5)
                if r.left():
                    fin.properties = r.properties(ptype, ptype.name)
        if r.left():
            raise MqttError(Reason.MALFORMED_PACKET, f"{r.left()} bytes left over after {ptype.name}")
        return pkt

    @staticmethod
    def _packet_id(r: _Reader, ptype: PacketType) -> int:
        pid = r.u16(f"{ptype.name} packet identifier")
        if pid == 0:
            raise MqttError(Reason.MALFORMED_PACKET, f"{ptype.name} with packet identifier 0")
        return pid

    def _publish(self, r: _Reader, flags: int, v5: bool) -> Publish:
        qos = (flags >> 1) & 3
        if qos == 3:
            raise MqttError(Reason.MALFORMED_PACKET, "PUBLISH with QoS 3")
        dup = bool(flags & 8)
        if dup and qos == 0:
            raise MqttError(Reason.MALFORMED_PACKET, "PUBLISH QoS 0 with DUP set")
        topic = r.string("PUBLISH topic name")
        check_topic_name(topic)
        pid = self._packet_id(r, PacketType.PUBLISH) if qos else None
        props = r.properties(PacketType.PUBLISH, "PUBLISH") if v5 else {}
        if not topic and "topic_alias" not in props:
            raise MqttError(Reason.TOPIC_NAME_INVALID, "empty PUBLISH topic name without a topic alias")
        pkt = Publish(topic, r.rest(), qos, bool(flags & 1), dup, pid, props)
        if props.get("payload_format_indicator") == 1:
            try:
                pkt.payload.decode("utf-8")
            except UnicodeDecodeError:
                raise MqttError(
                    Reason.PAYLOAD_FORMAT_INVALID, f"payload on {topic!r} is marked UTF-8 but is not"
                ) from None
        return pkt

    def _connect(self, r: _Reader) -> Connect:
        name = r.string("protocol name")
        level = r.byte("protocol level")
        if name not in ("MQTT", "MQIsdp"):
            raise MqttError(Reason.MALFORMED_PACKET, f"protocol name {name!r} is not MQTT")
        if name != "MQTT" or level not in (4, 5):
            raise MqttError(
                Reason.UNSUPPORTED_PROTOCOL_VERSION,
                f"protocol {name!r} level {level}: this gateway speaks MQTT 3.1.1 (4) and 5.0 (5)",
            )
        v5 = level == 5
        fl = r.byte("CONNECT flags")
        if fl & 1:
            raise MqttError(Reason.MALFORMED_PACKET, "CONNECT reserved flag set")
        will_flag, will_qos, will_retain = bool(fl & 4), (fl >> 3) & 3, bool(fl & 0x20)
        if will_qos == 3:
            raise MqttError(Reason.MALFORMED_PACKET, "will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise MqttError(Reason.MALFORMED_PACKET, "will QoS or retain set without a will")
        has_user, has_pass = bool(fl & 0x80), bool(fl & 0x40)
        if has_pass and not has_user and not v5:
            raise MqttError(Reason.MALFORMED_PACKET, "password without a user name")
        keepalive = r.u16("keep alive")
        props = r.properties(PacketType.CONNECT, "CONNECT") if v5 else {}
        cid = r.string("client identifier")
        will = None
        if will_flag:
            wprops = r.properties(0, "will") if v5 else {}
            wtopic = r.string("will topic")
            check_topic_name(wtopic)
            if not wtopic:
                raise MqttError(Reason.TOPIC_NAME_INVALID, "empty will topic")
            will = Will(wtopic, r.binary("will payload"), will_qos, will_retain, wprops)
        user = r.string("user name") if has_user else None
        pw = r.binary("password") if has_pass else None
        return Connect(cid, bool(fl & 2), keepalive, user, pw, will, level, props)


# -- writing ---------------------------------------------------------------------
def _varint(n: int) -> bytes:
    if not 0 <= n < 1 << 28:
        raise ValueError(f"variable byte integer out of range: {n}")
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for MQTT: {s[:40]!r}...")
    return struct.pack(">H", len(raw)) + raw


def _bin(b: bytes) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError(f"binary field of {len(b)} bytes is too long for MQTT")
    return struct.pack(">H", len(b)) + b


def _props(props: Properties) -> bytes:
    out = bytearray()
    for name, value in props.items():
        if name not in PROPERTY_IDS:
            raise ValueError(f"unknown MQTT 5 property {name!r}")
        pid, typ = PROPERTY_IDS[name]
        for v in value if name in MULTI else [value]:
            out += _varint(pid)
            if typ == BYTE:
                out.append(v)
            elif typ == TWO:
                out += struct.pack(">H", v)
            elif typ == FOUR:
                out += struct.pack(">I", v)
            elif typ == VARINT:
                out += _varint(v)
            elif typ == STR:
                out += _str(v)
            elif typ == BIN:
                out += _bin(v)
            else:
                out += _str(v[0]) + _str(v[1])
    return _varint(len(out)) + bytes(out)


encode_properties = _props  # a property table's wire form: ValueError/TypeError/struct.error if a value is wrong


def encode(p: Packet, version: int = 4) -> bytes:
    v5 = version == 5
    flags = 0
    t = p.type
    if isinstance(p, Connect):
        v5 = p.version == 5
        fl = 2 if p.clean_start else 0
        body = bytearray(_str("MQTT") + bytes([p.version]))
        if p.will:
            fl |= 4 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
        if p.username is not None:
            fl |= 0x80
        if p.password is not None:
            fl |= 0x40
        body += bytes([fl]) + struct.pack(">H", p.keepalive)
        if v5:
            body += _props(p.properties)
        body += _str(p.client_id)
        if p.will:
            if v5:
                body += _props(p.will.properties)
            body += _str(p.will.topic) + _bin(p.will.payload)
        if p.username is not None:
            body += _str(p.username)
        if p.password is not None:
            body += _bin(p.password)
    elif isinstance(p, ConnAck):
        body = bytearray([1 if p.session_present else 0, p.reason])
        if v5:
            body += _props(p.properties)
    elif isinstance(p, Publish):
        flags = (8 if p.dup else 0) | (p.qos << 1) | (1 if p.retain else 0)
        body = bytearray(_str(p.topic))
        if p.qos:
            body += struct.pack(">H", p.packet_id)
        if v5:
            body += _props(p.properties)
        body += p.payload
    elif isinstance(p, _Ack):
        flags = 2 if t == PacketType.PUBREL else 0
        body = bytearray(struct.pack(">H", p.packet_id))
        if v5 and (p.reason or p.properties):
            body.append(p.reason)
            if p.properties:
                body += _props(p.properties)
    elif isinstance(p, Subscribe):
        flags = 2
        body = bytearray(struct.pack(">H", p.packet_id))
        if v5:
            body += _props(p.properties)
        for s in p.subscriptions:
            o = s.qos | (s.no_local << 2) | (s.retain_as_published << 3) | (s.retain_handling << 4) if v5 else s.qos
            body += _str(s.filter) + bytes([o])
    elif isinstance(p, SubAck):
        body = bytearray(struct.pack(">H", p.packet_id))
        if v5:
            body += _props(p.properties)
        body += bytes(p.reasons)
    elif isinstance(p, Unsubscribe):
        flags = 2
        body = bytearray(struct.pack(">H", p.packet_id))
        if v5:
            body += _props(p.properties)
        for f in p.filters:
            body += _str(f)
    elif isinstance(p, UnsubAck):
        body = bytearray(struct.pack(">H", p.packet_id))
        if v5:
            body += _props(p.properties) + bytes(p.reasons)
    elif isinstance(p, (PingReq, PingResp)):
        body = bytearray()
    else:  # DISCONNECT, AUTH
        body = bytearray()
        if v5 and (p.reason or p.properties):
            body.append(p.reason)
            # a DISCONNECT may end after its reason (3.14.2.2.1); AUTH leaves out only both (3.15.2.1)
            if p.properties or t == PacketType.AUTH:
                body += _props(p.properties)
    return bytes([(int(t) << 4) | flags]) + _varint(len(body)) + bytes(body)
