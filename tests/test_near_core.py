"""The near side's session machine (ip-gateway/near_core.py) with virtual time: bytes
and `now` in, the packets a client would read, the envelopes it would put in custody
and the deadlines out.  No socket, no store, no clock."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from c2dtn.ip_gateway import bodies
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway import near_core as nc
from c2dtn.ip_gateway.policy import Policy, TopicRule
from c2dtn.overlay.envelope import Priority

BROKER = "10.77.4.2:1883"
T0 = 1_000_000.0


def policy() -> Policy:
    return Policy(
        routes=[(ipaddress.ip_network("10.77.4.0/24"), "gw4")],
        topics=[TopicRule("c2/#", Priority.IMMEDIATE, 3600), TopicRule("bft/#", Priority.PRIORITY, 600, "topic")],
    )


class Net:
    """The core plus the stores and sockets the shell would be: commits succeed unless
    `full`, writes are decoded as a client reads them."""

    def __init__(self, core: nc.NearCore | None = None):
        self.core = core or nc.NearCore(policy(), max_packet_size=4096)
        self.now = T0
        self.full = False
        self.committed: list[tuple[str, dict, int, Priority, str | None]] = []
        self.marks: list = []
        self.done: list[int] = []
        self.released: list[int] = []
        self.saves = 0
        self.resumed: list[str] = []
        self.ended: list[str] = []
        self.closed: set[int] = set()
        self.readers: dict[int, m.Parser] = {}
        self.inbox: dict[int, list[m.Packet]] = {}
        self._next = 0

    def connect(
        self,
        client: str = "u1",
        version: int = 5,
        clean: bool = True,
        keepalive: int = 0,
        props: dict | None = None,
        will: m.Will | None = None,
    ) -> tuple[int, m.ConnAck]:
        self._next += 1
        cid = self._next
        self.core.open(cid, BROKER, self.now)
        self.readers[cid] = m.Parser(1 << 20, version=version)
        self.inbox[cid] = []
        self.send(cid, m.Connect(client, clean, keepalive, will=will, version=version, properties=props or {}), version)
        return cid, self.take(cid)[0]

    def send(self, cid: int, pkt: m.Packet, version: int = 5) -> None:
        self.feed(cid, m.encode(pkt, version))

    def feed(self, cid: int, data: bytes) -> None:
        self.run(self.core.data(cid, data, self.now))

    def run(self, evs: list) -> None:
        evs = list(evs)
        while evs:
            ev = evs.pop(0)
            if isinstance(ev, nc.Write):
                assert ev.conn not in self.closed, "wrote to a closed connection"
                self.inbox[ev.conn] += self.readers[ev.conn].feed(ev.data)
            elif isinstance(ev, nc.Close):
                self.closed.add(ev.conn)
            elif isinstance(ev, nc.Submit):
                if not self.full:
                    self.committed += [
                        (dst, bodies.unpack(body), life, prio, key) for dst, body, life, prio, key in ev.envelopes
                    ]
                    self.marks += ev.marks or [None] * len(ev.envelopes)
                if ev.conn is not None:
                    evs[0:0] = self.core.committed(ev.conn, not self.full, self.now)
            elif isinstance(ev, nc.Done):
                self.done.append(ev.inbox_id)
            elif isinstance(ev, nc.Release):
                self.released += ev.inbox_ids
            elif isinstance(ev, nc.SessionsChanged):
                self.saves += 1
            elif isinstance(ev, nc.Resume):
                self.resumed.append(ev.client)
            elif isinstance(ev, nc.Ended):
                self.ended.append(ev.client)

    def take(self, cid: int) -> list[m.Packet]:
        out, self.inbox[cid] = self.inbox[cid], []
        return out

    def lose(self, cid: int) -> None:
        """The TCP connection breaks (no DISCONNECT)."""
        self.closed.add(cid)
        self.run(self.core.closed(cid, self.now))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.run(self.core.tick(self.now))

    def ops(self) -> list[str]:
        return [b["op"] for _, b, *_ in self.committed]

    def deliver(
        self, client: str, inbox_id: int, topic: str, payload: bytes = b"x", qos: int = 1, props: dict | None = None
    ) -> bool:
        msg = {"op": "msg", "c": client, "b": BROKER, "t": topic, "p": payload, "q": qos, "r": False, "x": props or {}}
        evs = self.core.deliver(client, inbox_id, msg, int(self.now * 1000), int(self.now * 1000))
        if evs is None:
            return False
        self.run(evs)
        return True


# -- QoS both ways ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", [4, 5])
def test_publishes_are_acked_only_after_their_envelopes_are_committed(version):
    n = Net()
    c, ack = n.connect(version=version)
    assert isinstance(ack, m.ConnAck) and ack.reason == 0 and n.ops() == ["conn"]
    n.send(c, m.Publish("c2/orders", b"advance", 0), version)
    n.send(c, m.Publish("c2/orders", b"hold", 1, packet_id=5), version)
    assert n.take(c) == [m.PubAck(5)]
    assert [(b["t"], b["p"], b["q"]) for _, b, *_ in n.committed[1:]] == [
        ("c2/orders", b"advance", 0),
        ("c2/orders", b"hold", 1),
    ]
    assert all(dst == "gw4" and prio == Priority.IMMEDIATE for dst, _, _, prio, _ in n.committed[1:])
    # QoS 2: PUBREC after the commit, a resend before PUBREL is not taken twice, PUBREL -> PUBCOMP
    n.send(c, m.Publish("c2/orders", b"withdraw", 2, packet_id=6), version)
    assert n.take(c) == [m.PubRec(6)]
    n.send(c, m.Publish("c2/orders", b"withdraw", 2, dup=True, packet_id=6), version)
    assert n.take(c) == [m.PubRec(6)] and n.ops().count("pub") == 3
    n.send(c, m.PubRel(6), version)
    assert n.take(c) == [m.PubComp(6)]


def test_publishes_read_together_share_an_envelope_in_order_up_to_batch_bytes():
    """One read holding QoS 1, 2 and 0 publishes, a keyed one and a resend (DUP): the QoS 0
    and 1 ones for the same class and lifetime share "pubs" envelopes of at most batch_bytes
    of topic and payload, in order; the others go alone, as before; every publish is
    answered once its envelope is committed, and each QoS 1 one leaves its mark."""
    n = Net(nc.NearCore(policy(), max_packet_size=4096, batch_bytes=100))
    c, _ = n.connect()
    pub = [m.Publish("c2/a", b"%02d" % i + b"." * 18, 1, packet_id=10 + i) for i in range(6)]  # 4 + 20 bytes each
    pkts = pub + [
        m.Publish("c2/a", b"two", 2, packet_id=20),
        m.Publish("c2/a", b"z0", 0),
        m.Publish("c2/a", b"z1", 0),
        m.Publish("bft/u1/pos", b"p", 1, packet_id=21),
        m.Publish("c2/a", b"again", 1, dup=True, packet_id=30),
        m.Publish("c2/a", b"last", 1, packet_id=31),
    ]
    n.feed(c, b"".join(m.encode(p, 5) for p in pkts))
    got = [(b["op"], [x["p"] for x in b["m"]] if b["op"] == "pubs" else b["p"]) for _, b, *_ in n.committed[1:]]
    assert got == [
        ("pubs", [p.payload for p in pub[:4]]),
        ("pubs", [p.payload for p in pub[4:]]),
        ("pub", b"two"),
        ("pubs", [b"z0", b"z1"]),
        ("pub", b"p"),
        ("pub", b"again"),
        ("pub", b"last"),
    ]
    assert [p.packet_id for p in n.take(c)] == [10, 11, 12, 13, 14, 15, 20, 21, 30, 31]
    assert [k for k, _d, _r in n.marks[1]] == [f"mqtt:u1:{i}" for i in (10, 11, 12, 13)] and n.marks[4] is None
    assert n.marks[6] == ("mqtt:u1:30", n.marks[6][1], True) and n.core.counters["batched"] == 8
    assert [prio for _, _, _, prio, _ in n.committed[1:]] == [Priority.IMMEDIATE] * 4 + [Priority.PRIORITY] + [
        Priority.IMMEDIATE
    ] * 2


def test_a_batch_from_a_peer_is_checked_publish_by_publish():
    ok = bodies.pack("pubs", "u1", BROKER, m=[{"t": "c2/a", "p": b"x", "q": 1, "r": False, "x": {}}])
    assert bodies.unpack(ok)["m"][0]["t"] == "c2/a"
    for bad, why in (
        (bodies.pack("pubs", "u1", BROKER), "needs 1 to 4096 publishes in m, not NoneType"),
        (bodies.pack("pubs", "u1", BROKER, m=[]), "not list of 0"),
        (bodies.pack("pubs", "u1", BROKER, m=[7]), "publish 0 of op pubs is a int"),
        (bodies.pack("pubs", "u1", BROKER, m=[{"t": "c2/a", "q": 2}]), "op pubs\\[0\\] without a topic or with QoS 2"),
        (bodies.pack("pubs", "u1", BROKER, m=[{"t": 5}]), "field 't' of op pubs\\[0\\] has type int"),
        (bodies.pack("pubs", "u1", BROKER, m=[{"t": "a", "x": {"nope": 1}}]), "unknown MQTT property 'nope'"),
        (bodies.pack("pubs", "u1", BROKER, m=[{"t": "a"}] * 4097), "not list of 4097"),
    ):
        with pytest.raises(bodies.BodyError, match=why):
            bodies.unpack(bad)


def test_a_full_store_refuses_what_it_could_not_take():
    n = Net()
    c5, _ = n.connect("v5", 5)
    c4, _ = n.connect("v4", 4)
    n.full = True
    n.send(c5, m.Publish("c2/x", b"1", 1, packet_id=1), 5)
    n.send(c5, m.Publish("c2/x", b"2", 2, packet_id=2), 5)
    assert n.take(c5) == [m.PubAck(1, m.Reason.QUOTA_EXCEEDED)] + [m.PubRec(2, m.Reason.QUOTA_EXCEEDED)]
    assert c5 not in n.closed
    n.send(c4, m.Publish("c2/x", b"1", 1, packet_id=1), 4)
    assert n.take(c4) == [] and c4 in n.closed  # 3.1.1 has no refusal: it resends after reconnecting


def test_a_topic_no_rule_releases_is_acked_and_stays_here():
    n = Net()
    c, _ = n.connect()
    n.send(c, m.Publish("chat/secret", b"psst", 1, packet_id=3))
    assert n.take(c) == [m.PubAck(3)] and n.ops() == ["conn"] and n.core.counters["held_local"] == 1


@pytest.mark.parametrize("version", [4, 5])
def test_publications_to_a_client_at_qos_0_1_2(version):
    n = Net()
    c, _ = n.connect(version=version)
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 2)]), version)
    assert n.take(c) == [m.SubAck(1, [2])] and n.ops()[-1] == "sub"
    assert n.deliver("u1", 100, "c2/a", b"q0", qos=0)
    (p0,) = n.take(c)
    assert (p0.topic, p0.payload, p0.qos) == ("c2/a", b"q0", 0) and n.done == [100]
    n.deliver("u1", 101, "c2/a", b"q1", qos=1)
    (p1,) = n.take(c)
    assert p1.qos == 1 and n.done == [100]
    n.send(c, m.PubAck(p1.packet_id), version)
    assert n.done == [100, 101]
    n.deliver("u1", 102, "c2/a", b"q2", qos=2)
    (p2,) = n.take(c)
    n.send(c, m.PubRec(p2.packet_id), version)
    assert n.take(c) == [m.PubRel(p2.packet_id)] and n.done == [100, 101]
    n.send(c, m.PubComp(p2.packet_id), version)
    assert n.done == [100, 101, 102]


def test_a_publication_goes_at_the_subscription_qos_and_waits_for_an_absent_client():
    n = Net()
    c, _ = n.connect()
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 0)]))
    n.take(c)
    n.deliver("u1", 7, "c2/a", qos=2)
    assert n.take(c)[0].qos == 0 and n.done == [7]
    n.lose(c)
    assert n.deliver("u1", 8, "c2/a") is False  # not connected: stays in custody


# -- keep alive, will, session ------------------------------------------------------------------
def test_a_silent_client_is_closed_after_one_and_a_half_keep_alives_and_its_will_goes():
    n = Net()
    c, _ = n.connect(keepalive=10, will=m.Will("c2/gone", b"u1 lost"))
    assert n.core.next_deadline() == T0 + 15
    n.advance(9)
    n.send(c, m.PingReq())
    assert n.take(c) == [m.PingResp()]
    assert n.core.next_deadline() == T0 + 9 + 15
    n.advance(14.9)
    assert c not in n.closed
    n.advance(0.2)
    assert n.take(c) == [m.Disconnect(m.Reason.KEEP_ALIVE_TIMEOUT)] and c in n.closed
    disc = n.committed[-1][1]
    assert disc["op"] == "disc" and disc["w"] is True
    assert n.core.counters["keepalive_timeouts"] == 1


@pytest.mark.parametrize("how,will", [("lost", True), ("disconnect", False), ("disconnect-with-will", True)])
def test_the_will_goes_unless_the_client_said_disconnect(how, will):
    n = Net()
    c, _ = n.connect(will=m.Will("c2/gone", b"bye"))
    if how == "lost":
        n.lose(c)
    else:
        reason = m.Reason.DISCONNECT_WITH_WILL if how == "disconnect-with-will" else 0
        n.send(c, m.Disconnect(reason))
        assert c in n.closed
        n.run(n.core.closed(c, n.now))  # the shell's read loop ends: nothing more happens
    discs = [b for _, b, *_ in n.committed if b["op"] == "disc"]
    assert len(discs) == 1 and discs[0]["w"] is will


def test_a_311_session_without_clean_session_comes_back_with_its_subscriptions():
    n = Net()
    c, ack = n.connect("u4", version=4, clean=False)
    assert ack.session_present is False
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 1)]), 4)
    n.lose(c)
    n.advance(3600 * 24 * 30)  # clean session 0 keeps it for good
    c2, ack = n.connect("u4", version=4, clean=False)
    assert ack.session_present is True and n.resumed[-1] == "u4"
    assert n.deliver("u4", 9, "c2/a") and n.take(c2)[0].topic == "c2/a"
    c3, ack = n.connect("u4", version=4, clean=True)
    assert ack.session_present is False


@pytest.mark.parametrize("version", [4, 5])
def test_a_resumed_session_gets_its_unacknowledged_publications_under_their_original_packet_ids(version):
    """MQTT 3.1.1 4.4 / 5.0 4.4: on a resumed session the server resends an unacknowledged
    PUBLISH with its original packet id and DUP set, and a PUBREL for one whose PUBREC it
    had.  A client still holding a QoS 2 id before PUBREL drops a new message under that id
    as a resend (lost), and takes the old one under a new id as new (delivered twice)."""
    n = Net()
    props = {"session_expiry_interval": 3600} if version == 5 else None
    c, _ = n.connect("u6", version=version, clean=False, props=props)
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 2)]), version)
    n.take(c)
    n.deliver("u6", 300, "c2/a", b"first", qos=2)  # acknowledged in full
    (p0,) = n.take(c)
    n.send(c, m.PubRec(p0.packet_id), version)
    n.send(c, m.PubComp(p0.packet_id), version)
    assert n.take(c) == [m.PubRel(p0.packet_id)]
    n.deliver("u6", 301, "c2/a", b"released", qos=2)  # PUBREC seen, PUBCOMP not
    n.deliver("u6", 302, "c2/a", b"unacked", qos=2)  # no answer at all
    n.deliver("u6", 303, "c2/a", b"qos1", qos=1)
    sent = {p.payload: p for p in n.take(c)}
    n.send(c, m.PubRec(sent[b"released"].packet_id), version)
    assert n.take(c) == [m.PubRel(sent[b"released"].packet_id)]
    assert not any(p.dup for p in sent.values())
    n.lose(c)
    assert n.done == [300]
    c2, ack = n.connect("u6", version=version, clean=False, props=props)
    assert ack.session_present
    for inbox_id, payload, qos in [(301, b"released", 2), (302, b"unacked", 2), (303, b"qos1", 1)]:
        n.deliver("u6", inbox_id, "c2/a", payload, qos=qos)  # custody hands them over again
    again = n.take(c2)
    assert again[0] == m.PubRel(sent[b"released"].packet_id)
    assert [(p.payload, p.packet_id, p.dup) for p in again[1:]] == [
        (b"unacked", sent[b"unacked"].packet_id, True),
        (b"qos1", sent[b"qos1"].packet_id, True),
    ]
    n.send(c2, m.PubComp(sent[b"released"].packet_id), version)
    n.send(c2, m.PubRec(sent[b"unacked"].packet_id), version)
    n.send(c2, m.PubComp(sent[b"unacked"].packet_id), version)
    n.send(c2, m.PubAck(sent[b"qos1"].packet_id), version)
    assert sorted(n.done) == [300, 301, 302, 303]


def test_packet_ids_to_a_client_follow_the_custody_inbox_so_a_restarted_gateway_resends_under_the_same_id():
    """A gateway that restarts has no memory of what it sent; the id comes from the message's
    custody inbox id, so the resend still carries the id the client holds (3.1.1 4.3.3: a
    PUBLISH under an id awaiting PUBREL is acknowledged, not delivered again)."""
    n = Net()
    c, _ = n.connect("u7", version=4, clean=False)
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 2)]), 4)
    n.take(c)
    n.deliver("u7", 1, "c2/a", b"a", qos=2)
    n.deliver("u7", 70_005, "c2/a", b"b", qos=2)
    first = {p.payload: p.packet_id for p in n.take(c)}
    n.send(c, m.PubRec(first[b"a"]), 4)
    n.send(c, m.PubComp(first[b"a"]), 4)
    n = Net()  # the gateway restarted (its session file brought the session back; here: connect again)
    c, _ = n.connect("u7", version=4, clean=False)
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 2)]), 4)
    n.take(c)
    n.deliver("u7", 70_005, "c2/a", b"b", qos=2)  # still in custody: handed over again
    (b,) = n.take(c)
    assert b.packet_id == first[b"b"] != first[b"a"]


def test_mqtt5_session_expiry_keeps_a_session_for_its_interval_only():
    n = Net()
    # clean start with an expiry: a new session that outlives this connection
    c, ack = n.connect("u5", clean=True, props={"session_expiry_interval": 60})
    assert ack.session_present is False and ack.properties["topic_alias_maximum"] == nc.TOPIC_ALIAS_MAX
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 1)], {"subscription_identifier": [4]}))
    n.send(c, m.Disconnect())
    n.advance(59)
    c, ack = n.connect("u5", clean=False, props={"session_expiry_interval": 60})
    assert ack.session_present is True
    n.take(c)
    assert n.deliver("u5", 3, "c2/a")
    assert n.take(c)[0].properties["subscription_identifier"] == [4]  # the session's subscription came back
    n.lose(c)
    assert n.core.next_deadline() == n.now + 60
    n.advance(61)
    assert "u5" not in n.core.sessions and n.core.counters["sessions_expired"] == 1
    assert n.ended == ["u5"]  # what waited for it in custody is for nobody now
    c, ack = n.connect("u5", clean=False, props={"session_expiry_interval": 60})
    assert ack.session_present is False


def test_mqtt5_session_expiry_zero_ends_the_session_with_the_connection():
    n = Net()
    c, _ = n.connect("u6", clean=False)  # no Session Expiry Interval: 0
    n.lose(c)
    assert "u6" not in n.core.sessions
    c, ack = n.connect("u6", clean=False)
    assert ack.session_present is False
    # DISCONNECT may not give an expiry to a session that had none: protocol error
    n.send(c, m.Disconnect(0, {"session_expiry_interval": 30}))
    assert n.take(c) == [
        m.Disconnect(m.Reason.PROTOCOL_ERROR, {"reason_string": "session expiry set at DISCONNECT after 0 at CONNECT"})
    ]


def test_a_second_connection_with_the_same_client_id_takes_the_session_over():
    n = Net()
    old, _ = n.connect("u7", clean=False, props={"session_expiry_interval": 600}, will=m.Will("c2/gone", b"x"))
    n.deliver("u7", 11, "c2/a")  # in flight to the old connection, never acked
    n.take(old)
    new, ack = n.connect("u7", clean=False, props={"session_expiry_interval": 600})
    assert ack.session_present is True
    assert n.take(old) == [m.Disconnect(m.Reason.SESSION_TAKEN_OVER)] and old in n.closed
    assert n.released == [11]  # handed out again to the new connection
    assert [b["op"] for _, b, *_ in n.committed].count("disc") == 0  # no will on a takeover


# -- bad input ------------------------------------------------------------------------------------
def test_malformed_packets_close_only_that_connection_with_the_reason():
    n = Net()
    a, _ = n.connect("a")
    b, _ = n.connect("b")
    n.feed(a, b"\x30\xff\xff\xff\xff\x01")  # remaining length longer than 4 bytes
    assert n.take(a) == [
        m.Disconnect(m.Reason.MALFORMED_PACKET, {"reason_string": "remaining length longer than 4 bytes"})
    ]
    assert a in n.closed and n.committed[-1][1] == {"op": "disc", "c": "a", "b": BROKER, "w": True}
    n.send(b, m.Publish("c2/x", b"still here", 1, packet_id=1))
    assert n.take(b) == [m.PubAck(1)] and b not in n.closed
    # a second CONNECT on a connection
    n.send(b, m.Connect("b", version=5))
    assert n.take(b)[0].reason == m.Reason.PROTOCOL_ERROR and b in n.closed
    # an unknown protocol level before any CONNECT: 3.1.1's refusal, then close
    n._next += 1
    n.core.open(n._next, BROKER, n.now)
    n.readers[n._next], n.inbox[n._next] = m.Parser(version=4), []
    n.feed(n._next, bytes([0x10, 10, 0, 4]) + b"MQTT" + bytes([3, 2, 0, 60]))
    assert n.take(n._next) == [m.ConnAck(False, 1)] and n._next in n.closed
    # a packet too large for the gateway
    c, _ = n.connect("c")
    n.send(c, m.Publish("c2/x", bytes(5000), 0))
    assert n.take(c)[0].reason == m.Reason.PACKET_TOO_LARGE and c in n.closed
    assert n.core.counters["protocol_errors"] == 4


def test_a_broker_no_gateway_serves_is_refused():
    n = Net()
    n._next += 1
    n.core.open(n._next, "192.0.2.1:1883", n.now)
    n.readers[n._next], n.inbox[n._next] = m.Parser(version=5), []
    n.send(n._next, m.Connect("x", version=5))
    assert n.take(n._next)[0].reason == 0x88 and n._next in n.closed and n.committed == []


# -- MQTT 5 limits the client sets and what it is owed ---------------------------------------------
@pytest.mark.parametrize("alias", [0, nc.TOPIC_ALIAS_MAX + 1])
def test_topic_alias_zero_or_above_the_maximum_is_a_protocol_error(alias):
    n = Net()
    c, _ = n.connect()
    n.send(c, m.Publish("c2/a", b"x", 0, properties={"topic_alias": alias}))
    (d,) = n.take(c)
    assert d.reason == m.Reason.TOPIC_ALIAS_INVALID and c in n.closed
    assert n.ops() == ["conn", "disc"]


def test_topic_aliases_the_client_sets_are_resolved():
    n = Net()
    c, _ = n.connect()
    n.send(c, m.Publish("c2/orders/alpha", b"1", 1, packet_id=1, properties={"topic_alias": 3}))
    n.send(c, m.Publish("", b"2", 1, packet_id=2, properties={"topic_alias": 3}))
    assert n.take(c) == [m.PubAck(1), m.PubAck(2)]
    assert [b["t"] for _, b, *_ in n.committed[1:]] == ["c2/orders/alpha"] * 2
    assert all("topic_alias" not in b["x"] for _, b, *_ in n.committed[1:])  # per connection: not carried
    n.send(c, m.Publish("", b"3", 1, packet_id=3, properties={"topic_alias": 4}))
    assert n.take(c)[0].reason == m.Reason.PROTOCOL_ERROR and c in n.closed


def test_a_publication_larger_than_the_clients_maximum_packet_size_is_dropped_for_it():
    n = Net()
    c, _ = n.connect(props={"maximum_packet_size": 200})
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 1)]))
    n.take(c)
    n.deliver("u1", 1, "c2/big", bytes(500))
    n.deliver("u1", 2, "c2/small", bytes(50))
    got = n.take(c)
    assert [p.topic for p in got] == ["c2/small"] and all(len(m.encode(p, 5)) <= 200 for p in got)
    assert n.done == [1] and n.core.counters["too_large_for_client"] == 1


def test_never_more_in_flight_to_a_client_than_its_receive_maximum():
    n = Net()
    c, _ = n.connect(props={"receive_maximum": 2})
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 1)]))
    n.take(c)
    for i in range(5):
        n.deliver("u1", 10 + i, f"c2/{i}")
    first = n.take(c)
    assert [p.topic for p in first] == ["c2/0", "c2/1"]
    n.send(c, m.PubAck(first[0].packet_id))
    (third,) = n.take(c)
    assert third.topic == "c2/2"
    n.deliver("u1", 20, "c2/qos0", qos=0)  # QoS 0 is not counted against it
    assert [p.topic for p in n.take(c)] == ["c2/qos0"]
    for p in (first[1], third):
        n.send(c, m.PubAck(p.packet_id))
    assert [p.topic for p in n.take(c)] == ["c2/3", "c2/4"]
    n.lose(c)
    assert sorted(n.released) == [13, 14]


def test_subscription_identifiers_are_delivered_on_the_publications_that_match():
    n = Net()
    c, _ = n.connect()
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 1)], {"subscription_identifier": [7]}))
    n.send(c, m.Subscribe(2, [m.SubOption("c2/orders", 1)], {"subscription_identifier": [9]}))
    n.send(c, m.Subscribe(3, [m.SubOption("bft/#", 0)]))
    n.take(c)
    n.deliver("u1", 1, "c2/orders")
    n.deliver("u1", 2, "c2/other")
    n.deliver("u1", 3, "bft/x", qos=0)
    a, b, x = n.take(c)
    assert a.properties["subscription_identifier"] == [7, 9]
    assert b.properties["subscription_identifier"] == [7]
    assert "subscription_identifier" not in x.properties
    # 3.1.1 has no properties at all
    n2 = Net()
    c4, _ = n2.connect(version=4)
    n2.send(c4, m.Subscribe(1, [m.SubOption("c2/#", 1)]), 4)
    n2.take(c4)
    n2.deliver("u1", 1, "c2/a")
    assert n2.take(c4)[0].properties == {}


def test_sessions_survive_the_session_file_round_trip(tmp_path):
    from c2dtn.ip_gateway import sessions_file

    n = Net()
    c, _ = n.connect("u8", clean=False, props={"session_expiry_interval": 120})
    n.send(c, m.Subscribe(1, [m.SubOption("c2/#", 1)], {"subscription_identifier": [5]}))
    n.connect("u9", version=4, clean=False)
    sessions_file.save(tmp_path / "s.cbor", n.core.sessions, {})
    # the gateway restarts 30 s later: the sessions that were connected count down from then
    near, far = sessions_file.load(tmp_path / "s.cbor", T0 + 30)
    assert near["u8"].subs == {"c2/#": 1} and near["u8"].sub_ids == {"c2/#": 5}
    assert near["u8"].expires_at == T0 + 30 + 120 and near["u9"].expires_at is None and far == {}
    assert near["u8"].user is None and near["u8"].owned  # written with its (anonymous) owner
    # persistent_client_expiration caps what the file brings back, as it caps a disconnect
    near, _ = sessions_file.load(tmp_path / "s.cbor", T0 + 30, cap=60)
    assert near["u8"].expires_at == T0 + 30 + 60 and near["u9"].expires_at == T0 + 30 + 60
    (tmp_path / "bad.cbor").write_bytes(b"\xff\x00garbage")
    assert sessions_file.load(tmp_path / "bad.cbor", T0) == ({}, {})


def test_marks_a_full_disk_would_not_let_go_are_dropped_with_the_next_puback_not_crashing_the_connection():
    """Found by CI's disk-full campaign: dropping the marks of PUBACKed publishes is a commit;
    on a full disk it raised StoreFull inside the connection's handler, which died, and MQTT 5
    clients were disconnected instead of hearing 0x97."""
    import types

    from c2dtn.ip_gateway.near import NearSide
    from c2dtn.ip_gateway.policy import GatewayConfig
    from c2dtn.overlay.port import Port
    from c2dtn.overlay.store import StoreFull

    tried: list[list[str]] = []

    class Store:
        full = True

        def marks_answered(self, keys):
            tried.append(list(keys))
            if self.full:
                raise StoreFull("custody store: the disk is full")

    store = Store()
    gw = types.SimpleNamespace(
        cfg=GatewayConfig(batch_bytes=0), port=Port(types.SimpleNamespace(store=store), None, Path("."))
    )
    near = NearSide(gw)
    near.run([nc.Answered(["a", "b"])])  # no exception: kept for the next try
    store.full = False
    near.run([nc.Answered(["c"])])
    assert tried == [["a", "b"], ["a", "b", "c"]] and near._unanswered == []
