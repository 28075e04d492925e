"""The MQTT-SN baseline's client core (perf/mqtt_sn.py), in virtual time: what it sends to the
gateway and when, a lost PUBLISH resent with DUP, one transaction open at a time."""

import struct

import pytest

from c2dtn.perf import mqtt_sn as sn


def _ack(kind: int, *fields) -> bytes:
    fmt = {sn.CONNACK: ">B", sn.REGACK: ">HHB", sn.PUBACK: ">HHB"}[kind]
    return sn.packet(kind, struct.pack(fmt, *fields))


def _ready(unit: sn.SnUnit, now: float = 0.0, topic_id: int = 7) -> None:
    (connect,) = unit.start(now)
    assert sn.parse(connect)[0] == sn.CONNECT
    (register,) = unit.on_datagram(_ack(sn.CONNACK, 0), now)
    kind, body = sn.parse(register)
    assert kind == sn.REGISTER and body[4:] == unit.topic
    mid = struct.unpack(">H", body[2:4])[0]
    assert unit.on_datagram(_ack(sn.REGACK, topic_id, mid, 0), now) == []


def _pub(d: bytes) -> tuple[int, int, int, bytes]:
    kind, body = sn.parse(d)
    assert kind == sn.PUBLISH
    flags, topic_id, mid = body[0], *struct.unpack(">HH", body[1:5])
    return flags, topic_id, mid, body[5:]


def test_a_report_goes_as_one_qos1_publish_under_the_registered_topic_id():
    u = sn.SnUnit("c2sn-NOR-1", "/NOR/NOR-UNIT001/NOR-S001/location")
    _ready(u)
    (d,) = u.publish("NOR-S001_1", b"x" * 230, 1.0)
    flags, topic_id, mid, payload = _pub(d)
    assert (flags, topic_id, payload) == (sn.FLAG_QOS1, 7, b"x" * 230)
    assert len(d) == 7 + 230  # MQTT-SN's own cost of a report: 7 bytes
    assert u.on_datagram(_ack(sn.PUBACK, 7, mid, 0), 1.5) == [] and u.events == [("acked", "NOR-S001_1")]


def test_one_open_at_a_time_a_lost_one_resent_with_dup_then_given_up():
    u = sn.SnUnit("c2sn-NOR-1", "t/x", t_retry=10.0)
    _ready(u)
    (first,) = u.publish("r1", b"one", 0.0)
    assert u.publish("r2", b"two", 0.1) == []  # queued behind r1's PUBACK
    assert u.due(9.9) == [] and u.deadline() == 10.0
    flags, _, mid, _ = _pub(u.due(10.0)[0])
    assert flags & sn.FLAG_DUP and mid == _pub(first)[2]
    for k in range(2, sn.N_RETRY + 1):
        assert _pub(u.due(10.0 * k)[0])[0] & sn.FLAG_DUP
    (nxt,) = u.due(10.0 * (sn.N_RETRY + 1))  # r1 given up: r2 goes
    assert u.events == [("gave_up", "r1")] and _pub(nxt)[3] == b"two"


def test_a_late_puback_of_an_earlier_message_changes_nothing():
    u = sn.SnUnit("c", "t/x")
    _ready(u)
    (d,) = u.publish("r1", b"one", 0.0)
    mid = _pub(d)[2]
    assert u.on_datagram(_ack(sn.PUBACK, 7, mid + 5, 0), 1.0) == [] and u.events == []
    assert u.open is not None


def test_a_disconnect_from_the_gateway_connects_again_and_keeps_the_open_report():
    u = sn.SnUnit("c", "t/x")
    _ready(u)
    u.publish("r1", b"one", 0.0)
    (connect,) = u.on_datagram(sn.packet(sn.DISCONNECT, b""), 1.0)
    assert sn.parse(connect)[0] == sn.CONNECT and u.open is None and list(u.queue) == [("r1", b"one")]
    (register,) = u.on_datagram(_ack(sn.CONNACK, 0), 1.1)
    mid = struct.unpack(">H", sn.parse(register)[1][2:4])[0]
    (again,) = u.on_datagram(_ack(sn.REGACK, 9, mid, 0), 1.2)
    assert _pub(again)[1] == 9 and _pub(again)[3] == b"one"


def test_long_messages_take_the_three_octet_length_and_bad_datagrams_are_named():
    d = sn.packet(sn.PUBLISH, b"\x20" + bytes(4) + b"y" * 600)
    assert d[0] == 1 and struct.unpack(">H", d[1:3])[0] == len(d) and sn.parse(d)[1].endswith(b"y" * 600)
    for bad, match in ((b"\x05", "1 bytes"), (b"\x09\x0d\x00", "length 9"), (b"\x01\x00", "cut short")):
        with pytest.raises(sn.SnError, match=match):
            sn.parse(bad)
    u = sn.SnUnit("c", "t/x")
    _ready(u)
    with pytest.raises(sn.SnError, match="PUBACK of 2 bytes"):
        u.on_datagram(sn.packet(sn.PUBACK, b"\x00\x01"), 0.0)
