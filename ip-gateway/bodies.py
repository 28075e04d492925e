"""What MQTT gateways tell each other (I/O-free): the bodies of app "mqtt" envelopes.

A near gateway (where the clients are) and a far gateway (where the broker is)
keep one split session per client.  Each envelope body is a CBOR map:

  op "conn"   client connected: c (client id), b (broker "ip:port"), v (3.1.1: 4, 5.0: 5),
              cs (clean start), ka (keep alive), sx (session expiry, v5), w (will or absent),
              u, pw (the user name and password it logged in with, when it gave them: the far
              side logs in to the broker with them; the envelope is encrypted)
  op "sub"    s: [[filter, qos, no_local, retain_as_published, retain_handling], ...]
  op "unsub"  f: [filter, ...]
  op "pub"    t (topic), p (payload), q (QoS), r (retain), x (v5 properties)
  op "pubs"   m: [{t, p, q, r, x}, ...], publishes of QoS 0 or 1 read together, in order (near_core._batched)
  op "disc"   the client left: w true if its will must be published (no DISCONNECT seen);
              sx (MQTT 5) the session expiry interval then in force
  op "msg"    far -> near: a publication for client c from the broker (t, p, q, r, x)
  op "bpub"   bridge -> bridge: a publication from the sender's local broker (t, p, q, r, x);
              c is the sending bridge's client id
"""

from __future__ import annotations

import struct
from typing import Any

import cbor2

from c2dtn.ip_gateway import mqtt as m
from c2dtn.strict_cbor import StrictCBORError, short
from c2dtn.strict_cbor import loads as strict_loads

APP = "mqtt"
OPS = ("conn", "sub", "unsub", "pub", "pubs", "disc", "msg", "bpub")
MAX_PARTS = 4096  # publishes in one "pubs" (a peer's batch is checked against it)


class BodyError(ValueError):
    pass


def pack(op: str, client: str, broker: str, **kw: Any) -> bytes:
    return cbor2.dumps({"op": op, "c": client, "b": broker, **kw})


def packed_size(op: str, client: str, broker: str, fields: dict[str, Any]) -> int:
    """len(pack(op, client, broker, **fields)) or a little more, without copying the payload."""
    p = fields.get("p", b"")
    return len(pack(op, client, broker, **{**fields, "p": b""})) + len(p) + 8  # + the longest bytes head


def unpack(body: bytes) -> dict[str, Any]:
    """A body from a peer gateway, checked field by field (BodyError names what is wrong)."""
    try:
        d = strict_loads(body)
    except StrictCBORError as e:
        raise BodyError(f"not strict CBOR: {e}") from None
    if not isinstance(d, dict) or d.get("op") not in OPS:
        raise BodyError(f"not an MQTT gateway message (op {short(d.get('op')) if isinstance(d, dict) else short(d)})")
    _check_fields(d, d["op"])
    if "c" not in d or "b" not in d:
        raise BodyError(f"op {d['op']} without client or broker")
    if d["op"] in ("pub", "msg", "bpub"):
        _check_publish(d, d["op"], (0, 1, 2))
    if d["op"] in ("sub", "unsub"):
        _check_subscriptions(d)
    if d["op"] == "conn":
        _check_connect(d)
    _check_text(d["c"], d["op"])
    if d["op"] == "pubs":
        parts = d.get("m")
        if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS:
            raise BodyError(
                f"op pubs needs 1 to {MAX_PARTS} publishes in m, not {type(parts).__name__}"
                f"{'' if not isinstance(parts, list) else f' of {len(parts)}'}"
            )
        for i, part in enumerate(parts):
            if not isinstance(part, dict):
                raise BodyError(f"publish {i} of op pubs is a {type(part).__name__}, not a map")
            _check_fields(part, f"pubs[{i}]")
            _check_publish(part, f"pubs[{i}]", (0, 1))
    return d


def publishes(d: dict) -> list[dict]:
    """The client publishes an unpacked body carries: a "pub"'s one, a "pubs"'s each, else none."""
    return [d] if d["op"] == "pub" else d["m"] if d["op"] == "pubs" else []


def _check_fields(d: dict, where: str) -> None:
    for k, typ in (
        ("c", str),
        ("b", str),
        ("t", str),
        ("p", bytes),
        ("q", int),
        ("r", bool),
        ("x", dict),
        ("s", list),
        ("f", list),
        ("v", int),
        ("cs", bool),
        ("ka", int),
        ("sx", int),
        ("u", str),
        ("pw", bytes),
    ):
        if k in d and not isinstance(d[k], typ):
            raise BodyError(f"field {short(k)} of op {where} has type {type(d[k]).__name__}")
    if "x" in d:
        d["x"] = props_in(d["x"])
        bad = sorted(k for k in d["x"] if k not in PUBLISH_PROPERTIES)
        if bad:
            raise BodyError(f"op {where} with properties a client's PUBLISH has not: {short(bad)}")


def _check_publish(d: dict, where: str, qos: tuple[int, ...]) -> None:
    if "t" not in d or d.get("q", 0) not in qos:
        raise BodyError(f"op {where} without a topic or with QoS {short(d.get('q'))}")
    _check_mqtt(m.check_topic_name, d["t"], where)


def _check_mqtt(check, value: str, where: str) -> None:
    """A topic name or filter the broker would take (else it drops the connection, and the
    far side would send the same again on the next)."""
    try:
        if not value:
            raise m.MqttError(m.Reason.MALFORMED_PACKET, "empty")
        _check_text(value, where)
        check(value)
    except m.MqttError as e:
        raise BodyError(f"op {where}: {e}") from None


def _check_text(value: str, where: str) -> None:
    """No control character or noncharacter, which MQTT brokers (Mosquitto) refuse in strings."""
    bad = next((ch for ch in value if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ord(ch) in (0xFFFE, 0xFFFF)), None)
    if bad is not None:
        raise BodyError(f"op {where}: U+{ord(bad):04X} in {short(value)}")


def _check_connect(d: dict) -> None:
    """What the broker's CONNECT is made of: version, keep alive, session expiry, will."""
    if d.get("v", 4) not in (4, 5) or not 0 <= d.get("ka", 60) <= 0xFFFF or not 0 <= d.get("sx", 0) <= 0xFFFFFFFF:
        raise BodyError(
            f"op conn with version {short(d.get('v'))}, keep alive {short(d.get('ka'))} or expiry out of range"
        )
    w = d.get("w")
    if w is not None:
        if not isinstance(w, dict) or not isinstance(w.get("p", b""), bytes):
            raise BodyError(f"op conn with a will that is not a publish: {short(w)}")
        _check_fields(w, "conn will")
        _check_publish(w, "conn will", (0, 1, 2))
    for k in ("u",):
        if k in d:
            _check_text(d[k], "conn")


def _check_subscriptions(d: dict) -> None:
    """A "sub"'s [filter, qos, no local, retain as published, retain handling] lists, an
    "unsub"'s filters."""
    if not d.get("f" if d["op"] == "unsub" else "s"):
        raise BodyError(f"op {d['op']} with no filter")
    if d["op"] == "unsub":
        for f in d.get("f", []):
            if not isinstance(f, str):
                raise BodyError(f"op unsub with a filter of type {type(f).__name__}")
            _check_mqtt(m.check_topic_filter, f, "unsub")
        return
    for x in d.get("s", []):
        ok = isinstance(x, list) and 1 <= len(x) <= 5 and isinstance(x[0], str)
        ok = ok and all(isinstance(v, bool) for v in x[2:4])
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2 for v in x[1:2] + x[4:5])
        if not ok:
            raise BodyError(f"op sub with a subscription that is not [filter, qos, nl, rap, rh]: {short(x)}")
        _check_mqtt(m.check_topic_filter, x[0], "sub")


# what a client's PUBLISH (and a will) may carry; topic alias and subscription ids are per connection
PUBLISH_PROPERTIES = frozenset(
    {"payload_format_indicator", "message_expiry_interval", "content_type", "response_topic", "correlation_data"}
    | {"user_property"}
)


def props_out(props: m.Properties) -> dict:
    """Properties that travel (topic alias and subscription ids are per connection: not carried)."""
    return {k: v for k, v in props.items() if k not in ("topic_alias", "subscription_identifier")}


def props_in(x: dict) -> m.Properties:
    """A peer's properties, each of the type MQTT gives it (checked by encoding them)."""
    out = {}
    for k, v in x.items():
        if k not in m.PROPERTY_IDS:
            raise BodyError(f"unknown MQTT property {short(k)}")
        if k == "user_property":
            if not isinstance(v, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in v
            ):
                raise BodyError(f"user_property is not a list of [name, value] strings: {short(v)}")
            v = [tuple(p) for p in v]
        out[k] = v
    try:
        m.encode_properties(out)
    except (ValueError, TypeError, OverflowError, struct.error) as e:
        raise BodyError(f"MQTT properties of the wrong type or size: {str(e)[:100]}") from None
    return out


def will_out(w: m.Will | None) -> dict | None:
    if w is None:
        return None
    return {"t": w.topic, "p": w.payload, "q": w.qos, "r": w.retain, "x": props_out(w.properties)}


def will_in(d: dict | None) -> m.Will | None:
    if not d:
        return None
    return m.Will(d["t"], d.get("p", b""), d.get("q", 0), d.get("r", False), props_in(d.get("x", {})))


def publish_from(d: dict, version: int) -> m.Publish:
    props = d.get("x", {}) if version == 5 else {}
    return m.Publish(d["t"], d.get("p", b""), d.get("q", 0), d.get("r", False), False, None, dict(props))
