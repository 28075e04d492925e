"""The MQTT codec: round trips, another codec (mqtt5, Rust) as an oracle, real
clients (paho-mqtt 3.1.1 and 5.0, mosquitto_pub/sub) on loopback, malformed input."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import threading
import time

import pytest

from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.mqtt import MqttError, Parser, Reason, encode

try:
    import mqtt5  # the oracle codec, from the [test] extra
except ImportError:
    mqtt5 = None
needs_mqtt5 = pytest.mark.skipif(
    mqtt5 is None, reason="the mqtt5 oracle codec is not installed (pip install 'c2dtn[test]')"
)

V5_PROPS = {
    "message_expiry_interval": 120,
    "content_type": "application/geo+json",
    "response_topic": "r/1",
    "correlation_data": b"\x01\x02",
    "user_property": [("unit", "NOR-3"), ("unit", "dup-key ok")],
    "payload_format_indicator": 1,
}

ALL = [
    m.Connect("c1", clean_start=False, keepalive=30, username="u", password=b"p", will=m.Will("w/t", b"gone", 1, True)),
    m.ConnAck(True, 0),
    m.Publish("a/b", b"\x00\xffpayload", 0, True),
    m.Publish("a/b", b"x", 1, False, True, 7),
    m.Publish("a/b", b"x", 2, False, False, 65535),
    m.PubAck(7),
    m.PubRec(8),
    m.PubRel(9),
    m.PubComp(10),
    m.Subscribe(11, [m.SubOption("a/+/c", 1), m.SubOption("d/#", 2)]),
    m.SubAck(11, [1, 2, 0x80]),
    m.Unsubscribe(12, ["a/+/c", "x"]),
    m.UnsubAck(12),
    m.PingReq(),
    m.PingResp(),
    m.Disconnect(),
]

ALL_V5 = [
    m.Connect(
        "c5",
        keepalive=10,
        version=5,
        properties={"session_expiry_interval": 3600, "receive_maximum": 20, "user_property": [("a", "b")]},
        will=m.Will("w/t", b"gone", 2, False, {"will_delay_interval": 5, "content_type": "text/plain"}),
    ),
    m.ConnAck(False, 0, {"maximum_qos": 1, "assigned_client_identifier": "auto-1", "topic_alias_maximum": 10}),
    m.Publish("a/b", b"{}", 1, False, False, 3, dict(V5_PROPS)),
    m.Publish("", b"aliased", 0, False, False, None, {"topic_alias": 4}),
    m.PubAck(3, 0x10, {"reason_string": "no subscribers"}),
    m.PubRec(4, 0),
    m.PubRel(4, 0x92),
    m.PubComp(4),
    m.Subscribe(5, [m.SubOption("a/#", 2, True, True, 2)], {"subscription_identifier": [9]}),
    m.SubAck(5, [2, 0x87], {"reason_string": "partly"}),
    m.Unsubscribe(6, ["a/#"], {"user_property": [("k", "v")]}),
    m.UnsubAck(6, [0, 0x11]),
    m.Disconnect(0x04, {"session_expiry_interval": 0}),
    m.Auth(0x18, {"authentication_method": "SCRAM", "authentication_data": b"xyz"}),
]


def _roundtrip(pkts, version):
    wire = b"".join(encode(p, version) for p in pkts)
    parser = Parser(version=None if isinstance(pkts[0], m.Connect) else version)
    got = []
    for i in range(len(wire)):  # byte by byte: framing across any split
        got += parser.feed(wire[i : i + 1])
    return got


def test_every_packet_type_round_trips_in_3_1_1_and_5():
    assert _roundtrip(ALL, 4) == ALL
    assert _roundtrip(ALL_V5, 5) == ALL_V5


def test_remaining_length_boundaries():
    for n in (0, 127, 128, 16383, 16384, 2_097_151, 2_097_152):
        p = m.Publish("t", b"z" * max(0, n - 3))
        wire = encode(p, 4)
        assert Parser(version=4, max_packet_size=1 << 24).feed(wire) == [p]


# -- another codec as the oracle -------------------------------------------------
@needs_mqtt5
def test_mqtt5_oracle_reads_what_we_write():
    pub = encode(m.Publish("a/b", b"{}", 1, True, False, 3, dict(V5_PROPS)), 5)
    o, n = mqtt5.read(memoryview(pub))
    assert n == len(pub)
    assert (o.topic, o.payload, o.qos, o.retain, o.packet_id) == ("a/b", b"{}", mqtt5.QoS.AT_LEAST_ONCE, True, 3)
    assert (o.message_expiry_interval, o.content_type, o.response_topic, o.correlation_data) == (
        120,
        "application/geo+json",
        "r/1",
        b"\x01\x02",
    )
    assert o.user_properties == [("unit", "NOR-3"), ("unit", "dup-key ok")]
    con = encode(ALL_V5[0], 5)
    o, _ = mqtt5.read(memoryview(con))
    assert (o.client_id, o.keep_alive, o.session_expiry_interval, o.receive_max) == ("c5", 10, 3600, 20)
    assert (o.will.topic, o.will.payload, o.will.qos, o.will.will_delay_interval) == (
        "w/t",
        b"gone",
        mqtt5.QoS.EXACTLY_ONCE,
        5,
    )
    sub = encode(ALL_V5[8], 5)
    o, _ = mqtt5.read(memoryview(sub))
    f = o.topic_filters[0]
    assert (o.packet_id, f.pattern, f.no_local, f.retain_as_published, o.subscription_id) == (5, "a/#", True, True, 9)


@needs_mqtt5
def test_we_read_what_the_mqtt5_oracle_writes():
    p = Parser(version=5)
    w = mqtt5.Will("w/x", payload=b"bye", qos=mqtt5.QoS.AT_LEAST_ONCE, retain=True, will_delay_interval=7)
    con = mqtt5.ConnectPacket(
        "orc",
        username="u",
        password=b"pw",
        clean_start=False,
        will=w,
        keep_alive=25,
        session_expiry_interval=60,
        user_properties=[("x", "y")],
    )
    got = Parser().feed(con.write())[0]
    assert (got.client_id, got.username, got.password, got.clean_start, got.keepalive, got.version) == (
        "orc",
        "u",
        b"pw",
        False,
        25,
        5,
    )
    assert got.properties["session_expiry_interval"] == 60 and got.properties["user_property"] == [("x", "y")]
    assert (got.will.topic, got.will.payload, got.will.qos, got.will.retain) == ("w/x", b"bye", 1, True)
    assert got.will.properties["will_delay_interval"] == 7
    pub = mqtt5.PublishPacket(
        "u/1/loc",
        b"\x01" * 300,
        qos=mqtt5.QoS.EXACTLY_ONCE,
        packet_id=42,
        message_expiry_interval=9,
        content_type="c",
        user_properties=[("k", "v")],
    )
    got = p.feed(pub.write())[0]
    assert (got.topic, got.payload, got.qos, got.packet_id) == ("u/1/loc", b"\x01" * 300, 2, 42)
    assert got.properties == {"message_expiry_interval": 9, "content_type": "c", "user_property": [("k", "v")]}
    for pkt in (
        mqtt5.PubAckPacket(42),
        mqtt5.PubRecPacket(42),
        mqtt5.PubRelPacket(42),
        mqtt5.PubCompPacket(42),
        mqtt5.PingReqPacket(),
        mqtt5.DisconnectPacket(),
    ):
        (got,) = p.feed(pkt.write())
        assert got.type.name.replace("_", "") in type(pkt).__name__.upper()


# -- malformed input -------------------------------------------------------------
def _err(data: bytes, version: int | None = 5, max_size: int = 1 << 20) -> MqttError:
    with pytest.raises(MqttError) as ei:
        Parser(max_size, version).feed(data)
    return ei.value


def test_malformed_packets_get_the_right_reason():
    assert _err(b"\x30\xff\xff\xff\xff\x01").reason == Reason.MALFORMED_PACKET  # 5-byte remaining length
    bad_utf8 = b"\x30\x05\x00\x03a\xffb"
    e = _err(bad_utf8)
    assert e.reason == Reason.MALFORMED_PACKET and "UTF-8" in str(e)
    e = _err(encode(m.Publish("a/+/c", b"x"), 5))
    assert e.reason == Reason.TOPIC_NAME_INVALID and "a/+/c" in str(e)
    e = _err(encode(m.Publish("big", b"x" * 5000), 5), max_size=4096)
    assert e.reason == Reason.PACKET_TOO_LARGE and "4096" in str(e)
    assert _err(b"\x36\x03\x00\x01a").reason == Reason.MALFORMED_PACKET  # QoS 3
    assert _err(b"\x08\x00\x00\x00").reason == Reason.MALFORMED_PACKET  # QoS 0 with DUP
    assert _err(b"\x00\x00").reason == Reason.MALFORMED_PACKET  # reserved type 0
    assert _err(b"\x82\x03\x00\x01\x00").reason == Reason.PROTOCOL_ERROR  # SUBSCRIBE without filters (v5 props)
    assert _err(encode(m.Subscribe(1, [m.SubOption("a/#/b")]), 5)).reason == Reason.MALFORMED_PACKET
    assert _err(b"\x40\x02\x00\x00").reason == Reason.MALFORMED_PACKET  # PUBACK packet id 0
    # a property that PUBLISH may not carry, and one given twice
    assert _err(b"\x30\x07\x00\x01a\x02\x24\x01x").reason == Reason.PROTOCOL_ERROR
    e = _err(b"\x30\x0e\x00\x01a\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02")
    assert e.reason == Reason.PROTOCOL_ERROR and "message_expiry_interval given twice" in str(e)
    # properties that claim more bytes than the packet has
    assert _err(b"\x30\x0a\x00\x01a\x06\x02\x00\x00\x00\x01\x02").reason == Reason.MALFORMED_PACKET
    # CONNECT: other protocol versions, 3.1.1's own return code for it
    e = _err(b"\x10\x0c\x00\x04MQTT\x03\x02\x00\x3c\x00\x00", version=None)
    assert e.reason == Reason.UNSUPPORTED_PROTOCOL_VERSION and m.connack_code_v3(e.reason) == 1
    assert _err(b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00", version=None).reason == Reason.MALFORMED_PACKET
    assert _err(encode(m.PingReq()), version=None).reason == Reason.PROTOCOL_ERROR  # before CONNECT


def test_random_corruption_never_escapes_as_anything_but_mqtt_error():
    rng = random.Random(7)
    wire = [encode(p, 5) for p in ALL_V5] + [encode(p, 4) for p in ALL]
    for _ in range(3000):
        w = bytearray(rng.choice(wire))
        for _ in range(rng.randint(1, 4)):
            w[rng.randrange(len(w))] = rng.randrange(256)
        if rng.random() < 0.3:
            w = w[: rng.randrange(1, len(w) + 1)]
        try:
            Parser(1 << 16, rng.choice([4, 5])).feed(bytes(w))
        except MqttError:
            pass


def test_topic_matching():
    cases = [
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/b", "a/b/c", False),
        ("+", "", True),
        ("$share/g/a/+", "a/z", True),
        ("/+", "/x", True),
        ("a//b", "a//b", True),
    ]
    for flt, topic, want in cases:
        assert m.topic_matches(flt, topic) is want, (flt, topic)


# -- real clients against a minimal server built on the codec ---------------------
class _Server:
    """Accepts clients on loopback, answers CONNECT/SUBSCRIBE/PUBLISH/PINGREQ, records
    what it decoded, and can push a PUBLISH to a subscriber."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.got: list = []
        self.push: list[m.Publish] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket):
        p = Parser()
        with c:
            while True:
                data = c.recv(65536)
                if not data:
                    return
                for pkt in p.feed(data):
                    self.got.append(pkt)
                    v = p.version
                    if isinstance(pkt, m.Connect):
                        c.sendall(encode(m.ConnAck(False, 0), v))
                    elif isinstance(pkt, m.Publish) and pkt.qos == 1:
                        c.sendall(encode(m.PubAck(pkt.packet_id), v))
                    elif isinstance(pkt, m.Publish) and pkt.qos == 2:
                        c.sendall(encode(m.PubRec(pkt.packet_id), v))
                    elif isinstance(pkt, m.PubRel):
                        c.sendall(encode(m.PubComp(pkt.packet_id), v))
                    elif isinstance(pkt, m.Subscribe):
                        c.sendall(encode(m.SubAck(pkt.packet_id, [s.qos for s in pkt.subscriptions]), v))
                        for i, pub in enumerate(self.push):
                            pub.packet_id = i + 1 if pub.qos else None
                            c.sendall(encode(pub, v))
                    elif isinstance(pkt, m.PingReq):
                        c.sendall(encode(m.PingResp(), v))
                    elif isinstance(pkt, m.Disconnect):
                        return

    def wait(self, pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [p for p in self.got if pred(p)]
            if hits:
                return hits
            time.sleep(0.02)
        raise AssertionError(f"server saw only {self.got}")


@pytest.mark.parametrize("version", [4, 5])
def test_paho_client_talks_to_the_codec(version):
    import paho.mqtt.client as paho
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    srv = _Server()
    srv.push = [
        m.Publish(
            "down/1",
            b"from-server",
            1,
            False,
            False,
            None,
            {"user_property": [("k", "v")], "content_type": "x/y"} if version == 5 else {},
        )
    ]
    proto = paho.MQTTv5 if version == 5 else paho.MQTTv311
    cl = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"paho{version}", protocol=proto)
    cl.will_set("will/t", b"w", qos=1, retain=True)
    seen = []
    cl.on_message = lambda c, u, msg: seen.append(msg)
    cl.connect("127.0.0.1", srv.port, keepalive=5)
    cl.loop_start()
    try:
        props = None
        if version == 5:
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = 30
            props.UserProperty = [("unit", "PRT-1")]
            props.ResponseTopic = "resp/x"
        cl.publish("up/1", b"hello", qos=1, properties=props).wait_for_publish(5)
        cl.publish("up/2", b"two", qos=2).wait_for_publish(5)
        cl.subscribe("down/#", qos=1)
        (con,) = srv.wait(lambda p: isinstance(p, m.Connect))
        assert (con.client_id, con.version, con.will.topic, con.will.qos, con.will.retain) == (
            f"paho{version}",
            version,
            "will/t",
            1,
            True,
        )
        (pub,) = srv.wait(lambda p: isinstance(p, m.Publish) and p.topic == "up/1")
        assert pub.payload == b"hello" and pub.qos == 1
        if version == 5:
            assert pub.properties["message_expiry_interval"] == 30
            assert pub.properties["user_property"] == [("unit", "PRT-1")]
            assert pub.properties["response_topic"] == "resp/x"
        srv.wait(lambda p: isinstance(p, m.PubRel))
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen and seen[0].topic == "down/1" and seen[0].payload == b"from-server"
        if version == 5:
            assert seen[0].properties.UserProperty == [("k", "v")] and seen[0].properties.ContentType == "x/y"
    finally:
        cl.disconnect()
        cl.loop_stop()
        srv.sock.close()


@pytest.mark.skipif(not shutil.which("mosquitto_pub"), reason="mosquitto-clients not installed (make deps installs it)")
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_pub_talks_to_the_codec(version):
    srv = _Server()
    args = [
        "mosquitto_pub",
        "-h",
        "127.0.0.1",
        "-p",
        str(srv.port),
        "-V",
        version,
        "-q",
        "1",
        "-r",
        "-t",
        "bft/NOR/u1/location",
        "-m",
        '{"type":"Feature"}',
        "-i",
        "mpub",
    ]
    if version == "mqttv5":
        args += ["-D", "publish", "user-property", "unit", "NOR-1", "-D", "publish", "message-expiry-interval", "60"]
    subprocess.run(args, check=True, timeout=10)
    (pub,) = srv.wait(lambda p: isinstance(p, m.Publish))
    assert (pub.topic, pub.payload, pub.qos, pub.retain) == ("bft/NOR/u1/location", b'{"type":"Feature"}', 1, True)
    if version == "mqttv5":
        assert pub.properties == {"user_property": [("unit", "NOR-1")], "message_expiry_interval": 60}
    srv.sock.close()


@pytest.mark.skipif(not shutil.which("mosquitto_sub"), reason="mosquitto-clients not installed (make deps installs it)")
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_sub_talks_to_the_codec(version):
    srv = _Server()
    props = (
        {"user_property": [("unit", "NOR-2")], "content_type": "application/geo+json"} if version == "mqttv5" else {}
    )
    srv.push = [m.Publish("bft/NOR/u2/location", b'{"seq":7}', 1, False, False, None, props)]
    fmt = "%t|%p|%q" + ("|%P" if version == "mqttv5" else "")
    out = subprocess.run(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(srv.port),
            "-V",
            version,
            "-q",
            "1",
            "-t",
            "bft/#",
            "-C",
            "1",
            "-W",
            "10",
            "-F",
            fmt,
            "-i",
            "msub",
        ],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith('bft/NOR/u2/location|{"seq":7}|1'), line
    if version == "mqttv5":
        assert "unit:NOR-2" in line  # %P prints user properties as key:value
    (sub,) = srv.wait(lambda p: isinstance(p, m.Subscribe))
    assert [(s.filter, s.qos) for s in sub.subscriptions] == [("bft/#", 1)]
    srv.sock.close()


# -- found by the differential fuzz target (perf/mqtt_diff.py, 2026-11-24): each accepted before --
def _with_junk(pkt, junk=b"junk"):
    """The packet with `junk` inside its remaining length (one-byte lengths only)."""
    w = encode(pkt, 5)
    return bytes([w[0], w[1] + len(junk)]) + w[2:] + junk


SUB = m.SubOption("a/#")


@pytest.mark.parametrize(
    "wire, what",
    [
        (bytes.fromhex("c08000"), "remaining length 0 not in its shortest form"),  # PINGREQ, length as 0x80 0x00
        (bytes.fromhex("40050003008000"), "PUBACK properties length: variable byte integer 0 not in its shortest form"),
        (_with_junk(m.Connect("c1", version=5)), "4 bytes left over after CONNECT"),
        (bytes.fromhex("4003000b6b"), "PUBACK reason code 0x6b is not one MQTT 5 defines"),
        (bytes.fromhex("7003000710"), "PUBCOMP reason code 0x10 is not one MQTT 5 defines"),
        (bytes.fromhex("e0013a"), "DISCONNECT reason code 0x3a is not one MQTT 5 defines"),
        (encode(m.ConnAck(False, 0, {"maximum_qos": 2}), 5), "maximum_qos 2 in CONNACK: must be 0 or 1"),
        (
            encode(m.Subscribe(4, [SUB], {"subscription_identifier": [0]}), 5),
            "subscription_identifier 0 in SUBSCRIBE: must not be 0",
        ),
        (
            encode(m.Subscribe(4, [SUB], {"subscription_identifier": [1, 2]}), 5),
            "subscription identifier given twice in SUBSCRIBE",
        ),
    ],
)
def test_what_mqtt_5_forbids_and_the_reader_took_is_refused_naming_it(wire, what):
    with pytest.raises(MqttError, match=what):
        Parser(version=5).feed(wire)


def test_the_same_packets_done_right_are_taken():
    for p in (
        m.PingReq(),
        m.PubAck(3, 0x10),
        m.Disconnect(0x04),
        m.ConnAck(False, 0, {"maximum_qos": 1}),
        m.Subscribe(4, [SUB], {"subscription_identifier": [1]}),
        m.Connect("c1", version=5),
    ):
        assert Parser(version=5).feed(encode(p, 5)) == [p]


def test_a_3_1_1_suback_or_connack_code_outside_the_spec_is_refused():
    with pytest.raises(MqttError, match="SUBACK reason code 0x03 is not one MQTT 3.1.1 defines"):
        Parser(version=4).feed(bytes.fromhex("9003000103"))
    with pytest.raises(MqttError, match="CONNACK reason code 0x06"):
        Parser(version=4).feed(bytes.fromhex("20020006"))
    assert Parser(version=4).feed(bytes.fromhex("900400010180")) == [m.SubAck(1, [1, 0x80])]


@needs_mqtt5
def test_an_auth_with_a_reason_carries_its_property_length_so_the_oracle_reads_it():
    wire = encode(m.Auth(0x18), 5)
    assert wire == bytes.fromhex("f0021800")  # before: f00118, which MQTT 5 (3.15.2.1) does not allow
    o, n = mqtt5.read(memoryview(wire))
    assert (int(o.reason_code), n) == (0x18, 4)
