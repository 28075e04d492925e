"""Differential MQTT 5: our packet reader (ip-gateway/mqtt.py) against the mqtt5 codec (Rust,
PyPI), the `mqtt_diff` fuzz target.

Both read the first packet of the same bytes.  They agree when both wait for more bytes, both
refuse, or both take it with the same fields (spec defaults filled in) and the same length.  A
disagreement is a `Disagreement` (a crash for the fuzzer) unless it is one of the explained ones
below: where MQTT 5 makes the packet malformed or a protocol error and the oracle does not check
it (we refuse; each with its spec rule), or where the oracle refuses or misreads what MQTT 5
allows (its defects, found by this target).  Any new class fails the campaign until it is fixed
on our side or explained here.
"""

from __future__ import annotations

import re

from c2dtn.ip_gateway import mqtt


class Disagreement(AssertionError):
    """Our reader and the oracle differ on these bytes, in no way explained below."""


# Our refusal stands where the oracle takes the packet: (our error message, the spec's rule)
OURS_STRICTER: list[tuple[str, str]] = [
    (r"reserved bits set in subscription options", "3.8.3.1: reserved bits of the options are malformed"),
    (r"PUBLISH QoS 0 with DUP set", "3.3.1.1 [MQTT-3.3.1-2]: DUP is 0 for QoS 0"),
    (r"wildcard in a PUBLISH topic name", "3.3.2.1 [MQTT-3.3.2-2]: no wildcards in a topic name"),
    (r"must be a whole (last )?level", "4.7.1: '#' and '+' occupy a whole level"),
    (r"with packet identifier 0", "2.2.1 [MQTT-2.2.1-3]: a packet identifier is non-zero"),
    (r"contains U\+0000", "1.5.4 [MQTT-1.5.4-2]: no U+0000 in a UTF-8 string"),
    (
        r"(UN)?SUBSCRIBE without a topic filter",
        "3.8.3 [MQTT-3.8.3-2], 3.10.3 [MQTT-3.10.3-2]: at least one topic filter",
    ),
    (
        r"\w+ \d+ in .*: must be 0 or 1",
        "3.1.2.11.6/7, 3.2.2.3.4-12: a Protocol Error but 0 or 1 (maximum QoS, the availabilities, the requests); "
        "3.3.2.3.2 defines 0 and 1 only for the payload format (Mosquitto refuses the rest too)",
    ),
    (
        r"empty (topic filter|will topic)",
        "4.7.3 [MQTT-4.7.3-1]: topic names and filters are at least one character long",
    ),
    (
        r"marked UTF-8 but is not",
        "3.3.2.3.2: a receiver may check a payload marked UTF-8 (we answer 0x99 Payload format invalid)",
    ),
    (r"CONNECT reserved flag set", "3.1.2.3 [MQTT-3.1.2-3]: the reserved flag is 0"),
    (r"will QoS or retain set without a will", "3.1.2.6/7 [MQTT-3.1.2-11, -13]: no will, will QoS and retain 0"),
    (
        r"will QoS 3|PUBLISH with QoS 3|subscription QoS 3",
        "3.1.2.6 [MQTT-3.1.2-12], 3.3.1.2 [MQTT-3.3.1-4], 3.8.3.1 [MQTT-3-8.3-4]: QoS 3 is malformed",
    ),
    (r"retain handling 3", "3.8.3.1: retain handling 3 is a Protocol Error"),
    (
        r"with fixed-header flags|CONNACK flags",
        "2.1.3 [MQTT-2.1.3-1], 3.2.2.1: reserved flags are as the spec lists them",
    ),
    (
        r"empty PUBLISH topic name without a topic alias",
        "3.3.2.3.4 [MQTT-3.3.2-8]: an empty topic name needs a topic alias",
    ),
    (
        r"property \w+ is not allowed in|property \w+ given twice|given twice in SUBSCRIBE",
        "2.2.2.2, 3.8.2.1.2: a property where the packet's list has it, once (but user properties)",
    ),
    (
        r"\w+ \d+ in .*: must not be 0",
        "3.1.2.11.3/4, 3.2.2.3.3/6, 3.8.2.1.2: receive maximum, maximum packet size "
        "and subscription identifier 0 are Protocol Errors",
    ),
    (
        r"properties overrun their length",
        "2.2.2.1: the properties end where their length says; the oracle reads properties past it",
    ),
]
# The oracle refuses where MQTT 5 allows the packet: (oracle's message, a test on our packet, why)
ORACLE_WRONG: list[tuple[str, object, str]] = [
    (
        r"Missing property length",
        lambda p: isinstance(p, mqtt.Auth),
        "3.15.2.1: an AUTH of reason 0x00 and no properties has remaining length 0; the oracle needs "
        "the property length (we read a missing one as 0, as 3.14.2.2.1 says for DISCONNECT)",
    ),
    (
        r"Topic alias must be != 0",
        lambda p: p.properties.get("topic_alias") == 0,
        "3.3.2.3.4: topic alias 0 is an error the near gateway answers itself (DISCONNECT Topic Alias Invalid, "
        "near_core), after the reader",
    ),
]
EXPLAINED = [w for _, w in OURS_STRICTER] + [w for _, _, w in ORACLE_WRONG]


def ours(data: bytes):
    """("short", None) | ("err", MqttError) | ("ok", (packet, length))."""
    p = mqtt.Parser(max_packet_size=1 << 29, version=5)  # above the largest MQTT packet: no limit of ours
    p._buf += data
    try:
        framed = p._frame()
        if framed is None:
            return "short", None
        hdr, start, end = framed
        return "ok", (p._decode(hdr, memoryview(p._buf), start, end), end)
    except mqtt.MqttError as e:
        return "err", e


def oracle(data: bytes):
    import mqtt5  # the [test] extra; perf fuzz checks it is there

    try:
        pkt, n = mqtt5.read(memoryview(data))
    except IndexError:  # "Not enough bytes"
        return "short", None
    except (ValueError, UnicodeDecodeError) as e:
        return "err", e
    except BaseException as e:  # pyo3 panics (PanicException) after some refusals: a refusal too
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return "err", e
    return "ok", (pkt, n)


def _i(v):
    return None if v is None else int(v)


def _props(p: dict, *names: str) -> tuple:
    return tuple(p.get(n) for n in names)


def norm_ours(pkt) -> tuple:
    t, pr = type(pkt).__name__, getattr(pkt, "properties", {})
    up = tuple(pr.get("user_property", []))
    if isinstance(pkt, mqtt.Publish):
        return (
            t,
            pkt.topic,
            pkt.payload,
            pkt.qos,
            pkt.retain,
            pkt.dup,
            pkt.packet_id,
            pr.get("payload_format_indicator", 0),
            *_props(pr, "message_expiry_interval", "content_type", "response_topic", "correlation_data"),
            tuple(pr.get("subscription_identifier", [])),
            pr.get("topic_alias"),
            up,
        )
    if isinstance(pkt, mqtt.Connect):
        w = pkt.will
        will = (
            None
            if w is None
            else (
                w.topic,
                w.payload,
                w.qos,
                w.retain,
                w.properties.get("payload_format_indicator", 0),
                *_props(w.properties, "message_expiry_interval", "content_type", "response_topic", "correlation_data"),
                w.properties.get("will_delay_interval", 0),
                tuple(w.properties.get("user_property", [])),
            )
        )
        return (
            t,
            pkt.version,
            pkt.client_id,
            pkt.clean_start,
            pkt.keepalive,
            pkt.username,
            pkt.password,
            will,
            pr.get("session_expiry_interval", 0),
            *_props(pr, "authentication_method", "authentication_data"),
            pr.get("request_problem_information", 1) == 1,
            pr.get("request_response_information", 0) == 1,
            pr.get("receive_maximum", 65535),
            pr.get("topic_alias_maximum", 0),
            pr.get("maximum_packet_size"),
            up,
        )
    if isinstance(pkt, mqtt.ConnAck):
        return (
            t,
            pkt.session_present,
            pkt.reason,
            *_props(
                pr,
                "session_expiry_interval",
                "assigned_client_identifier",
                "server_keep_alive",
                "authentication_method",
                "authentication_data",
                "response_information",
                "server_reference",
                "reason_string",
            ),
            pr.get("receive_maximum", 65535),
            pr.get("topic_alias_maximum", 0),
            pr.get("maximum_qos", 2),
            pr.get("retain_available", 1) == 1,
            pr.get("maximum_packet_size"),
            pr.get("wildcard_subscription_available", 1) == 1,
            pr.get("subscription_identifier_available", 1) == 1,
            pr.get("shared_subscription_available", 1) == 1,
            up,
        )
    if isinstance(pkt, mqtt._Ack):
        return (t, pkt.packet_id, pkt.reason, pr.get("reason_string"), up)
    if isinstance(pkt, mqtt.Subscribe):
        sid = pr.get("subscription_identifier", [None])
        return (
            t,
            pkt.packet_id,
            tuple((s.filter, s.qos, s.no_local, s.retain_as_published, s.retain_handling) for s in pkt.subscriptions),
            tuple(sid),
            up,
        )
    if isinstance(pkt, (mqtt.SubAck, mqtt.UnsubAck)):
        return (t, pkt.packet_id, tuple(pkt.reasons), pr.get("reason_string"), up)
    if isinstance(pkt, mqtt.Unsubscribe):
        return (t, pkt.packet_id, tuple(pkt.filters), up)
    if isinstance(pkt, mqtt.Disconnect):
        return (t, pkt.reason, *_props(pr, "session_expiry_interval", "server_reference", "reason_string"), up)
    if isinstance(pkt, mqtt.Auth):
        return (t, pkt.reason, *_props(pr, "authentication_method", "authentication_data", "reason_string"), up)
    return (t,)  # PingReq, PingResp


def norm_oracle(o) -> tuple:
    t = type(o).__name__.removesuffix("Packet")  # mqtt5's names are ours + "Packet"
    up = tuple(tuple(kv) for kv in getattr(o, "user_properties", []))
    if t == "Publish":
        return (
            t,
            o.topic,
            bytes(o.payload),
            _i(o.qos),
            o.retain,
            o.duplicate,
            o.packet_id,
            _i(o.payload_format_indicator),
            o.message_expiry_interval,
            o.content_type,
            o.response_topic,
            None if o.correlation_data is None else bytes(o.correlation_data),
            tuple(o.subscription_ids),
            o.topic_alias,
            up,
        )
    if t == "Connect":
        w = o.will
        will = (
            None
            if w is None
            else (
                w.topic,
                bytes(w.payload),
                _i(w.qos),
                w.retain,
                _i(w.payload_format_indicator),
                w.message_expiry_interval,
                w.content_type,
                w.response_topic,
                None if w.correlation_data is None else bytes(w.correlation_data),
                w.will_delay_interval,
                tuple(tuple(kv) for kv in w.user_properties),
            )
        )
        return (
            t,
            5,
            o.client_id,
            o.clean_start,
            o.keep_alive,
            o.username,
            None if o.password is None else bytes(o.password),
            will,
            o.session_expiry_interval,
            o.authentication_method,
            None if o.authentication_data is None else bytes(o.authentication_data),
            o.request_problem_info,
            o.request_response_info,
            o.receive_max,
            o.topic_alias_max,
            o.max_packet_size,
            up,
        )
    if t == "ConnAck":
        return (
            t,
            o.session_present,
            _i(o.reason_code),
            o.session_expiry_interval,
            o.assigned_client_id,
            o.server_keep_alive,
            o.authentication_method,
            None if o.authentication_data is None else bytes(o.authentication_data),
            o.response_info,
            o.server_reference,
            o.reason_str,
            o.receive_max,
            o.topic_alias_max,
            _i(o.max_qos),
            o.retain_available,
            o.max_packet_size,
            o.wildcard_subscription_available,
            o.subscription_id_available,
            o.shared_subscription_available,
            up,
        )
    if t in ("PubAck", "PubRec", "PubRel", "PubComp"):
        return (t, o.packet_id, _i(o.reason_code), o.reason_str, up)
    if t == "Subscribe":
        return (
            t,
            o.packet_id,
            tuple(
                (f.pattern, _i(f.max_qos), f.no_local, f.retain_as_published, _i(f.retain_handling))
                for f in o.topic_filters
            ),
            (o.subscription_id,),
            up,
        )
    if t in ("SubAck", "UnsubAck"):
        return (t, o.packet_id, tuple(_i(c) for c in o.reason_codes), o.reason_str, up)
    if t == "Unsubscribe":
        return (t, o.packet_id, tuple(o.patterns), up)
    if t == "Disconnect":
        return (t, _i(o.reason_code), o.session_expiry_interval, o.server_reference, o.reason_str, up)
    if t == "Auth":
        return (
            t,
            _i(o.reason_code),
            o.authentication_method,
            None if o.authentication_data is None else bytes(o.authentication_data),
            o.reason_str,
            up,
        )
    return (t,)


def compare(data: bytes) -> str:
    """How the two readers relate on `data`: "agree", or the explanation of an explained
    disagreement.  Raises Disagreement otherwise, and MqttError where both refuse (the fuzz
    target's typed refusal)."""
    a = ours(data)
    if a[0] == "err" and "not valid UTF-8" in str(a[1]):
        # the oracle cannot take a string that is not UTF-8 either (it raises, or panics slowly in
        # pyo3: 700 inputs/s): both refuse
        raise a[1]
    b = oracle(data)
    if a[0] == "short" and b[0] in ("short", "err"):
        # the oracle refuses some packets before all their bytes are there; ours once it has them
        return "agree"
    if a[0] == "err" and b[0] == "err":
        raise a[1]
    if a[0] == "ok" and b[0] == "ok":
        (pk, n), (o, m) = a[1], b[1]
        if pk.type == mqtt.PacketType.CONNECT and pk.version != 5:
            return "agree"  # the oracle reads every CONNECT as MQTT 5
        x, y = norm_ours(pk), norm_oracle(o)
        if x != y or n != m:
            raise Disagreement(
                f"both take {data[:64].hex()} but read it differently: ours {x} ({n} bytes), oracle {y} ({m} bytes)"
            )
        return "agree"
    if a[0] == "err" and b[0] in ("ok", "short"):
        for pat, why in OURS_STRICTER:
            if re.search(pat, str(a[1])):
                return why
        raise Disagreement(
            f"we refuse {data[:64].hex()} ({a[1]}); the oracle "
            f"{'takes it: ' + repr(b[1][0]) if b[0] == 'ok' else 'waits for more bytes'}"
        )
    # ours ok, oracle err or short
    pk = a[1][0]
    if pk.type == mqtt.PacketType.CONNECT and pk.version != 5:
        return "agree"
    for pat, test, why in ORACLE_WRONG:
        if b[0] == "err" and re.search(pat, str(b[1])) and test(pk):
            return why
    raise Disagreement(
        f"we take {data[:64].hex()} as {pk!r}; the oracle "
        f"{'refuses it: ' + type(b[1]).__name__ + ': ' + str(b[1]) if b[0] == 'err' else 'waits for more bytes'}"
    )
