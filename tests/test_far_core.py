"""The MQTT far side's session core (ip-gateway/far_core.py) in virtual time: a broker played by
the test, bytes and `now` in, events out.  These cover what tests/test_far_sessions.py checks
against Mosquitto (which stays as the integration test), and the timing rules it cannot reach
in a test's time: windows, QoS 0 pacing, ping and answer waits, expiry, resends with DUP."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import far_core as fc
from c2dtn.ip_gateway import mqtt as m

BROKER = "10.77.4.2:1883"


@dataclass
class D:  # what custody hands out (overlay.port.Delivery's fields the far side reads)
    id: int
    created_ms: int = 0
    origin: str = "gw1"
    seq: int = 0


def body(op: str, client: str = "c1", **kw) -> dict:
    return s.unpack(s.pack(op, client, BROKER, **kw))


def conn(**kw) -> dict:
    return body("conn", **{"v": 4, "cs": True, "ka": 60, **kw})


def pub(topic: str = "t/x", payload: bytes = b"p", q: int = 1) -> dict:
    return body("pub", t=topic, p=payload, q=q, r=False)


class Sim:
    """One FarCore and the broker side of its connection, on a clock of the test's own."""

    def __init__(
        self,
        limits: fc.FarLimits | None = None,
        state: dict | None = None,
        v: int = 4,
        gate: bool = True,
        auto_connack: bool = True,
    ):
        self.now = 0.0
        self.v = v
        held = None if gate else (lambda _inbox_id, _topic: False)  # gate=False: every publish is held
        self.core = fc.FarCore("gw1", "c1", BROKER, limits or fc.FarLimits(), 0.0, state, clear=held)
        self.sent: list[m.Packet] = []  # every packet the core wrote, over all connections
        self.done: list = []  # Done items, in order
        self.events: list = []
        self.opens = self.closes = 0
        self.gate = gate  # gates pass at once
        self.auto_connack = auto_connack
        self.keeps_session = True
        self.closes_at_once = True  # the broker closes a connection we ended at once (closed())
        self._parser = m.Parser(1 << 20, version=5)
        self.run(self.core.start(0.0))

    def run(self, evs: list) -> list:
        for e in evs:
            self.events.append(e)
            if isinstance(e, fc.Write):
                self.sent += self._parser.feed(e.data)
            elif isinstance(e, fc.Done):
                self.done.append(e.item)
            elif isinstance(e, fc.Open):
                self.opens += 1
                self._parser = m.Parser(1 << 20, version=5)
                self.run(self.core.opened(self.now))
                if self.auto_connack:  # a broker that keeps the session (present from the second connection)
                    present = self.opens > 1 and self.keeps_session
                    self.broker(m.ConnAck(present, 0, {"receive_maximum": 10} if self.v == 5 else {}))
            elif isinstance(e, fc.Close):
                self.closes += 1
                if not e.abort and self.closes_at_once:
                    self.run(self.core.closed(self.now))
            elif isinstance(e, fc.Gate) and self.gate:
                self.run(self.core.gate_passed(e.token, self.now))
        return evs

    def put(self, d, msg: dict) -> list:
        return self.run(self.core.put((d, msg), self.now))

    def broker(self, *packets: m.Packet) -> list:
        return self.run(self.core.data(b"".join(m.encode(p, self.v) for p in packets), self.now))

    def advance(self, seconds: float) -> None:
        """Let virtual time pass, running every deadline due on the way."""
        end = self.now + seconds
        while (at := self.core.next_deadline()) is not None and at <= end:
            self.now = max(self.now, at)
            self.run(self.core.tick(self.now))
        self.now = end

    def of(self, kind) -> list:
        return [p for p in self.sent if isinstance(p, kind)]


def connected(**kw) -> Sim:
    sim = Sim(**kw)
    sim.put(D(1), conn(v=sim.v))
    assert sim.core.connected() and [d.id for d in sim.done] == [1]
    return sim


def test_a_clients_conn_connects_with_its_own_id_keep_alive_and_credentials_and_is_done_at_the_connack():
    sim = Sim()
    sim.auto_connack = False
    sim.put(D(1), conn(ka=30, u="alice", pw=b"pw"))
    c = sim.of(m.Connect)[0]
    assert (c.client_id, c.clean_start, c.keepalive, c.username, c.password) == ("c1", True, 30, "alice", b"pw")
    assert sim.done == []  # not before the broker accepted it
    sim.broker(m.ConnAck(False, 0))
    assert [d.id for d in sim.done] == [1] and sim.core.present and any(isinstance(e, fc.Changed) for e in sim.events)


def test_a_refused_connect_is_tried_again_after_the_retry_wait_and_its_envelope_waits():
    sim = Sim()
    sim.auto_connack = False
    sim.put(D(1), conn())
    sim.broker(m.ConnAck(False, 0x87))  # not authorised
    assert sim.closes == 1 and sim.done == [] and sim.opens == 1
    sim.advance(fc.RETRY_S * 0.9)
    assert sim.opens == 1
    sim.advance(fc.RETRY_S * 0.2)
    assert sim.opens == 2 and len(sim.of(m.Connect)) == 2
    sim.broker(m.ConnAck(False, 0))
    assert [d.id for d in sim.done] == [1]


def test_a_broker_that_cannot_be_reached_is_tried_with_a_backoff_doubling_to_its_cap():
    sim = Sim()
    opens: list[float] = []

    def failing(evs):
        for e in evs:
            if isinstance(e, fc.Open):
                opens.append(sim.now)
                failing(sim.core.open_failed(sim.now, "connection refused"))

    failing(sim.core.put((D(1), conn()), 0.0))
    while sim.now < 60:
        at = sim.core.next_deadline()
        sim.now = at
        failing(sim.core.tick(at))
    gaps = [round(b - a, 3) for a, b in zip(opens, opens[1:])]
    assert gaps[:6] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0] and set(gaps[6:]) == {10.0}, gaps


def test_no_connack_within_its_wait_drops_the_connection_and_connects_again():
    sim = Sim()
    sim.auto_connack = False
    sim.put(D(1), conn())
    sim.advance(fc.CONNACK_WAIT_S - 0.1)
    assert sim.closes == 0
    sim.advance(0.2 + fc.RETRY_S)
    assert sim.closes == 1 and sim.opens == 2


def test_qos2_publishes_keep_to_the_311_window_and_are_done_only_at_pubcomp():
    sim = connected()
    for i in range(2, 102):
        sim.put(D(i), pub(f"t/{i}", q=2))
    pubs = sim.of(m.Publish)
    assert len(pubs) == fc.FAR_INFLIGHT_V311 == len(sim.core.inflight)
    for p in pubs[:5]:
        sim.broker(m.PubRec(p.packet_id))
    assert [type(p) for p in sim.sent[-5:]] == [m.PubRel] * 5 and len(sim.done) == 1  # released, not done
    for p in pubs[:5]:
        sim.broker(m.PubComp(p.packet_id))
    assert [d.id for d in sim.done[1:]] == [2, 3, 4, 5, 6]
    assert len(sim.of(m.Publish)) == fc.FAR_INFLIGHT_V311 + 5  # as many more went as were completed
    while sim.core.inflight:
        for pid in list(sim.core.inflight):
            sim.broker(m.PubRec(pid), m.PubComp(pid))
    assert [d.id for d in sim.done[1:]] == list(range(2, 102))
    assert [p.topic for p in sim.of(m.Publish)] == [f"t/{i}" for i in range(2, 102)]  # each once, in order
    assert sim.core.counters["to_broker"] == 100 and "to_broker_again" not in sim.core.counters


def test_an_mqtt5_broker_sets_the_window_with_its_receive_maximum():
    sim = connected(v=5)
    for i in range(2, 40):
        sim.put(D(i), pub(q=1))
    assert len(sim.core.inflight) == 10  # the broker's Receive Maximum in Sim


def test_qos1_goes_as_qos2_with_qos1_once_and_the_publish_keeps_its_packet_id_from_its_inbox_id():
    sim = connected(limits=fc.FarLimits(qos1_once=True))
    sim.put(D(70_005), pub(q=1))
    p = sim.of(m.Publish)[0]
    assert p.qos == 2 and p.packet_id == fc.pub_pid(70_005)


def test_unacknowledged_publishes_go_again_first_and_in_order_with_dup_on_the_next_connection():
    sim = connected()
    for i in range(2, 8):
        sim.put(D(i), pub(f"t/{i}", q=1))
    first = sim.of(m.Publish)
    sim.broker(m.PubAck(first[0].packet_id))  # t/2 done
    sim.broker(m.PubRec(first[1].packet_id))  # (a QoS 1 one is never PUBRECed; take t/3 as QoS 2's case below)
    sim.put(D(8), pub("t/8", q=1))
    n = len(sim.sent)
    sim.run(sim.core.lost(sim.now, "reset by peer"))
    assert sim.core.inflight == {} and [d.id for d, _ in sim.core.queue] == [3, 4, 5, 6, 7, 8]
    sim.advance(fc.RETRY_S)  # connected again (not in a hot loop against a broker that drops it)
    assert sim.opens == 2
    again = [p for p in sim.sent[n:] if isinstance(p, (m.Publish, m.PubRel))]
    assert isinstance(again[0], m.PubRel) and again[0].packet_id == first[1].packet_id  # PUBRECed: released
    assert [(p.topic, p.dup) for p in again[1:]] == [(f"t/{i}", True) for i in (4, 5, 6, 7, 8)]
    assert sim.core.counters["to_broker_again"] == 6  # the five publishes and the PUBREL


def test_a_publish_the_broker_pubreced_goes_again_whole_when_the_broker_lost_the_session():
    """PUBREL alone to a broker that forgot the session would be answered PUBCOMP (MQTT 5) and
    the message done, never delivered."""
    sim = connected()
    sim.keeps_session = False
    sim.put(D(2), pub("t/2", q=2))
    sim.broker(m.PubRec(sim.of(m.Publish)[0].packet_id))
    sim.run(sim.core.lost(sim.now, "reset by peer"))
    sim.advance(fc.RETRY_S)
    assert [(type(p).__name__, getattr(p, "dup", None)) for p in sim.sent if isinstance(p, (m.Publish, m.PubRel))] == [
        ("Publish", False),
        ("PubRel", None),
        ("Publish", True),
    ]


def test_an_mqtt5_broker_refusing_a_publish_or_a_subscription_is_counted_and_done_not_asked_for_ever():
    sim = connected(v=5)
    sim.put(D(2), pub("t/2", q=1))
    sim.put(D(3), pub("t/3", q=2))
    p2, p3 = sim.of(m.Publish)
    sim.broker(m.PubAck(p2.packet_id, 0x87), m.PubRec(p3.packet_id, 0x97))  # not authorised; quota exceeded
    assert [d.id for d in sim.done] == [1, 2, 3] and not sim.of(m.PubRel)
    assert sim.core.counters["broker_refused"] == 2 and "to_broker" not in sim.core.counters
    sim.put(D(4), body("sub", s=[["t/ok", 1, False, False, 0], ["t/no", 1, False, False, 0]]))
    sim.broker(m.SubAck(sim.of(m.Subscribe)[0].packet_id, [1, 0x87]))
    assert list(sim.core.subs) == ["t/ok"]  # the refused one is not asked again on the next session


def test_a_broker_that_answers_no_keep_alive_ping_is_dropped():
    sim = connected()
    sim.advance(30)  # the first ping (keep alive 60)
    assert len(sim.of(m.PingReq)) == 1 and sim.closes == 0
    sim.advance(fc.FAR_PING_WAIT_S)
    assert sim.closes == 1 and not sim.core.connected()  # made again by the next message
    sim.put(D(2), pub(q=0))
    sim.advance(fc.RETRY_S)
    assert sim.opens == 2 and sim.of(m.Publish)


def test_a_restarted_far_gateway_sends_what_the_broker_never_acknowledged_with_the_same_packet_ids():
    sim = connected()
    for i in range(2, 12):
        sim.put(D(i), pub(f"t/{i}", q=1))
    before = {p.topic: p.packet_id for p in sim.of(m.Publish)}
    state = {"params": sim.core.params, "subs": sim.core.subs, "present": True}
    again = Sim(state=state)  # the session file brought the session back; custody hands out the same ids
    assert again.opens == 1
    for i in range(2, 12):
        again.put(D(i), pub(f"t/{i}", q=1))
    assert {p.topic: p.packet_id for p in again.of(m.Publish)} == before


def test_a_pubs_envelope_goes_as_its_publishes_in_order_and_is_consumed_with_the_last():
    sim = connected()
    msg = body("pubs", m=[{"t": f"t/{i}", "p": b"x", "q": 1, "r": False} for i in range(30)])
    for item in fc.Part.split(D(2), msg):
        sim.run(sim.core.put(item, sim.now))
    pubs = sim.of(m.Publish)
    assert [p.topic for p in pubs] == [f"t/{i}" for i in range(fc.FAR_INFLIGHT_V311)]
    assert len({p.packet_id for p in pubs}) == len(pubs)
    finished = []
    while sim.core.inflight:
        for pid in list(sim.core.inflight):
            sim.broker(m.PubAck(pid))
            finished.append(sim.done[-1].finish())
    assert [p.topic for p in sim.of(m.Publish)] == [f"t/{i}" for i in range(30)]
    assert finished == [False] * 29 + [True]  # the envelope is done with its last publish


def test_qos0_runs_at_most_two_chunks_ahead_of_a_broker_that_has_not_answered_a_ping():
    sim = connected()
    n = fc.FAR_QOS0_CHUNK * 5 + 7
    for i in range(n):
        sim.put(D(i + 2), pub(f"{i:04d}", q=0))
    assert len(sim.of(m.Publish)) == 2 * fc.FAR_QOS0_CHUNK and len(sim.of(m.PingReq)) == 2
    assert len(sim.done) == 1 + 2 * fc.FAR_QOS0_CHUNK  # QoS 0: done once written
    while len(sim.of(m.Publish)) < n:
        k = len(sim.of(m.Publish))
        sim.broker(m.PingResp())
        assert len(sim.of(m.Publish)) == min(n, k + fc.FAR_QOS0_CHUNK)
    assert [p.topic for p in sim.of(m.Publish)] == [f"{i:04d}" for i in range(n)]


def test_a_broker_that_answers_no_ping_has_its_connection_dropped_and_qos0_goes_on_on_a_new_one():
    sim = connected()
    n = fc.FAR_QOS0_CHUNK * 3
    for i in range(n):
        sim.put(D(i + 2), pub(f"{i:04d}", q=0))
    assert len(sim.of(m.Publish)) == 2 * fc.FAR_QOS0_CHUNK
    sim.advance(fc.FAR_PING_WAIT_S - 0.5)
    assert sim.closes == 0
    sim.advance(1.0)
    assert sim.closes == 1 and sim.opens == 2
    assert [p.topic for p in sim.of(m.Publish)] == [f"{i:04d}" for i in range(n)]


def test_a_ping_goes_every_half_keep_alive():
    sim = Sim()
    sim.put(D(1), conn(ka=20))
    sim.advance(60)
    assert len(sim.of(m.PingReq)) == 6


def test_a_publish_is_written_only_once_the_gateway_lets_it_past_earlier_subscriptions():
    sim = connected(gate=False)
    sim.put(D(2), pub("c2/x", q=1))
    gate = [e for e in sim.events if isinstance(e, fc.Gate)]
    assert [(g.inbox_id, g.topic) for g in gate] == [(2, "c2/x")] and sim.of(m.Publish) == []
    sim.run(sim.core.gate_passed(gate[0].token + 1, sim.now))  # a stale answer passes nothing
    assert sim.of(m.Publish) == []
    sim.run(sim.core.gate_passed(gate[0].token, sim.now))
    assert [p.topic for p in sim.of(m.Publish)] == ["c2/x"]
    clear = connected()  # nothing holds it: no Gate at all, written at once
    clear.put(D(2), pub("c2/x", q=1))
    assert not any(isinstance(e, fc.Gate) for e in clear.events) and clear.of(m.Publish)


def test_a_subscribe_is_done_at_its_suback_and_an_unanswered_one_reconnects_and_goes_again():
    sim = connected()
    sim.put(D(2), body("sub", s=[["t/#", 1, False, False, 0]]))
    sub = sim.of(m.Subscribe)[0]
    assert [e.inbox_id for e in sim.events if isinstance(e, fc.SubWritten)] == [2] and len(sim.done) == 1
    sim.advance(fc.ANSWER_WAIT_S + fc.RETRY_S + 0.1)  # no SUBACK: a new connection, and it goes again
    assert sim.closes == 1 and len(sim.of(m.Subscribe)) == 2 and sim.core.subs == {}
    sim.broker(m.SubAck(sim.of(m.Subscribe)[-1].packet_id, [1]))
    assert [d.id for d in sim.done] == [1, 2] and sim.core.subs == {"t/#": [1, False, False, 0]}
    assert sub.packet_id > fc.PUB_PIDS  # never a publish's id
    sim.put(D(3), body("unsub", f=["t/#"]))
    sim.broker(m.UnsubAck(sim.of(m.Unsubscribe)[0].packet_id, []))
    assert sim.core.subs == {} and [d.id for d in sim.done] == [1, 2, 3]


def test_a_new_broker_session_is_subscribed_again_before_anything_else_goes():
    state = {"params": {"v": 4, "cs": False, "ka": 60}, "subs": {"t/#": [1, False, False, 0]}, "present": True}
    sim = Sim(state=state)
    sim.put(D(5), pub(q=1))
    assert [type(p) for p in sim.sent] == [m.Connect, m.Subscribe]  # the broker had no session
    sim.broker(m.SubAck(sim.of(m.Subscribe)[0].packet_id, [1]))
    assert [type(p) for p in sim.sent] == [m.Connect, m.Subscribe, m.Publish]
    kept = Sim(state=state, auto_connack=False)
    kept.broker(m.ConnAck(True, 0))  # the broker kept the session: no SUBSCRIBE
    assert [type(p) for p in kept.sent] == [m.Connect] and kept.core.connected()


def test_a_clients_reconnect_waits_for_what_is_in_flight_then_starts_the_new_session():
    sim = connected()
    sim.put(D(2), pub(q=1))
    sim.put(D(3), conn(cs=True))
    assert not any(isinstance(p, m.Disconnect) for p in sim.sent)  # t/x is in flight: the broker's first
    sim.broker(m.PubAck(sim.of(m.Publish)[0].packet_id))
    assert [type(p) for p in sim.sent[-2:]] == [m.Disconnect, m.Connect] and [d.id for d in sim.done] == [1, 2, 3]


def test_a_broker_that_never_acknowledges_holds_a_reconnect_only_its_settle_wait():
    sim = connected()
    sim.put(D(2), pub(q=1))
    sim.put(D(3), conn(cs=False))
    sim.advance(fc.SETTLE_S + fc.RETRY_S + 0.1)
    # the connection dropped; t/x went again first (DUP), and the reconnect waits for it again
    assert sim.closes == 1 and [p.dup for p in sim.of(m.Publish)] == [False, True]


def test_a_clean_311_session_ends_at_its_clients_disconnect_and_a_will_goes_without_disconnect():
    sim = connected()
    sim.put(D(2), body("disc", w=False))
    assert isinstance(sim.sent[-1], m.Disconnect) and any(isinstance(e, fc.Left) for e in sim.events)
    assert sim.core.idle() and sim.core.expiry_s() == 0.0 and not sim.core.present
    will = connected()
    will.put(D(2), body("disc", w=True))
    # our side's FIN, after what was written (a reset could lose it): no DISCONNECT, so the will goes
    assert not will.of(m.Disconnect) and [e.abort for e in will.events if isinstance(e, fc.Close)] == [False]


def test_a_reconnect_opens_only_once_the_broker_has_closed_the_connection_we_ended():
    """A CONNECT with the same client id on a new connection makes the broker drop the old one,
    and the QoS 0 publishes it had not read yet with it: the new one waits for the old to close."""
    sim = connected()
    sim.closes_at_once = False
    for i in range(5):
        sim.put(D(2 + i), pub(payload=b"%d" % i, q=0))
    sim.put(D(9), conn(cs=False))
    assert isinstance(sim.sent[-1], m.Disconnect) and sim.opens == 1  # ended; no new connection yet
    sim.advance(fc.CLOSE_WAIT_S / 2)
    assert sim.opens == 1 and not any(isinstance(e, fc.Abandon) for e in sim.events)
    sim.run(sim.core.closed(sim.now))  # the broker read it all and closed its side
    assert sim.opens == 2 and isinstance(sim.sent[-1], m.Connect) and [d.id for d in sim.done][-1] == 9


def test_a_broker_that_never_closes_the_connection_we_ended_has_it_reset_after_the_close_wait():
    sim = connected()
    sim.closes_at_once = False
    sim.put(D(2), conn(cs=False))
    sim.advance(fc.CLOSE_WAIT_S - 0.1)
    assert sim.opens == 1
    sim.advance(0.2)
    kinds = [type(e) for e in sim.events]
    assert sim.opens == 2 and kinds.index(fc.Abandon) < len(kinds) - 1 - kinds[::-1].index(fc.Open)


def test_envelopes_that_come_after_the_clients_disconnect_go_on_a_connection_closed_when_they_are_done():
    """Priorities let a client's DISCONNECT overtake its routine publishes: those that come later
    still reach the broker, and the connection made for them ends with them (Left again)."""
    sim = connected()
    sim.put(D(2), body("disc", w=False))
    lefts = sum(isinstance(e, fc.Left) for e in sim.events)
    sim.put(D(3), pub(payload=b"late0", q=0))
    sim.put(D(4), pub(payload=b"late1", q=1))
    assert sim.opens == 2 and [p.payload for p in sim.of(m.Publish)] == [b"late0", b"late1"]
    assert sim.core.connected()  # the QoS 1 one is not acknowledged yet
    sim.broker(m.PubAck(sim.of(m.Publish)[-1].packet_id))
    sim.advance(fc.AWAY_LINGER_S * 0.9)
    assert sim.core.connected()  # a little longer, for more that may follow
    sim.advance(fc.AWAY_LINGER_S * 0.2)
    assert not sim.core.connected() and isinstance(sim.sent[-1], m.Disconnect)
    assert sum(isinstance(e, fc.Left) for e in sim.events) == lefts + 1 and sim.core.idle()
    assert [d.id for d in sim.done] == [1, 2, 3, 4]


def test_an_mqtt5_session_expiry_set_again_at_disconnect_is_capped_for_the_broker_and_expires():
    sim = Sim(limits=fc.FarLimits(persistent_client_expiration=3600), v=5)
    sim.put(D(1), conn(v=5, cs=False, sx=100))
    assert sim.of(m.Connect)[0].properties["session_expiry_interval"] == 100
    sim.put(D(2), body("disc", sx=86_400, w=False))
    assert sim.of(m.Disconnect)[0].properties["session_expiry_interval"] == 3600  # cut to the cap
    assert sim.core.expiry_s() == 86_400.0
    sim.core.expire_in(3600, sim.now)
    sim.advance(3599)
    assert not any(isinstance(e, fc.Expired) for e in sim.events)
    sim.advance(2)
    assert any(isinstance(e, fc.Expired) for e in sim.events)


def test_a_broker_publication_is_acknowledged_only_once_custody_holds_it():
    sim = connected()
    sim.broker(m.Publish("t/in", b"x", qos=1, packet_id=7), m.Publish("t/in2", b"y", qos=2, packet_id=8))
    p1, p2 = [e for e in sim.events if isinstance(e, fc.Publication)]
    assert not sim.of(m.PubAck) and not sim.of(m.PubRec)
    sim.run(sim.core.stored(p1, False))  # custody full: no ack, the broker sends it again
    sim.run(sim.core.stored(p2, True))
    assert not sim.of(m.PubAck) and [p.packet_id for p in sim.of(m.PubRec)] == [8]
    sim.broker(m.PubRel(8))
    assert [p.packet_id for p in sim.of(m.PubComp)] == [8]
    sim.run(sim.core.lost(sim.now, "cut"))
    sim.run(sim.core.stored(p1, True))  # its connection is gone: no ack on another
    assert not sim.of(m.PubAck)


@pytest.mark.parametrize(
    "msg",
    [
        {"op": "pub", "c": "c1", "b": BROKER, "q": 1},
        {"op": "bpub", "c": "c1", "b": BROKER},
        pub(q=1) | {"p": "not bytes"},
    ],
    ids=["no-topic", "not-an-op-here", "payload-not-bytes"],
)
def test_a_body_that_makes_no_mqtt_packet_is_counted_and_done_and_the_next_goes(msg):
    sim = connected()
    sim.put(D(2), msg)
    sim.put(D(3), pub("t/ok", q=0))
    assert [d.id for d in sim.done] == [1, 2, 3] and sim.core.counters["bad_bodies"] == 1
    assert [p.topic for p in sim.of(m.Publish)] == ["t/ok"]


@pytest.mark.parametrize(
    "op,fields",
    [
        ("pub", {"t": "a/+/b", "q": 1}),
        ("pub", {"t": "a/#", "q": 0}),
        ("pub", {"t": "a\x00b", "q": 0}),
        ("pub", {"t": "", "q": 0}),
        ("sub", {"s": [["t/#", 7, False, False, 0]]}),
        ("sub", {"s": [["a#", 1, False, False, 0]]}),
        ("sub", {"s": [["t/#", 1, False, False, 3]]}),
        ("sub", {"s": [["t/#", True]]}),
        ("unsub", {"f": ["a/b+"]}),
        ("unsub", {"f": [""]}),
        ("sub", {"s": []}),
        ("unsub", {}),
        ("pub", {"t": "a\x01b", "q": 0}),
        ("pub", {"t": "a\x85", "q": 0}),
        ("pub", {"t": "a\uffff", "q": 0}),
        ("pub", {"t": "t/x", "q": 0, "x": {"session_expiry_interval": 5}}),
        ("pub", {"t": "t/x", "q": 0, "x": {"subscription_identifier": 5}}),
        ("conn", {"ka": 70_000}),
        ("conn", {"ka": -1}),
        ("conn", {"v": 3}),
        ("conn", {"v": 5, "sx": 1 << 32}),
        ("conn", {"w": True}),
        ("conn", {"w": {"t": "a/#", "p": b""}}),
        ("conn", {"w": {"t": "t/w", "p": b"", "q": 3}}),
        ("conn", {"u": "al\x00ice"}),
    ],
)
def test_a_peers_body_the_broker_would_refuse_is_refused_before_it_reaches_the_far_side(op, fields):
    """A PUBLISH with a wildcard topic, or a SUBSCRIBE with reserved option bits, makes the
    broker drop the connection; the far side would send it again on the next, for ever."""
    with pytest.raises(s.BodyError):
        s.unpack(s.pack(op, "c1", BROKER, **fields))


def test_a_client_id_with_a_control_character_is_refused_and_a_good_will_is_taken():
    with pytest.raises(s.BodyError, match="U\\+0001"):
        s.unpack(s.pack("pub", "c\x011", BROKER, t="t/x", q=0))
    will = {"t": "t/will", "p": b"gone", "q": 1, "r": False, "x": {"message_expiry_interval": 9}}
    assert s.unpack(s.pack("conn", "c1", BROKER, v=5, ka=30, sx=60, w=will))["w"]["t"] == "t/will"


def test_a_broker_address_that_is_not_host_port_makes_its_envelopes_bad_not_a_stuck_session():
    core = fc.FarCore("gw1", "c1", "no-port-here", fc.FarLimits(), 0.0)
    evs = core.put((D(1), conn()), 0.0)
    assert [type(e) for e in evs] == [fc.Done] and core.counters["bad_bodies"] == 1


def test_garbage_from_the_broker_drops_its_connection_and_what_was_in_flight_goes_again():
    sim = connected()
    sim.put(D(2), pub(q=1))
    sim.run(sim.core.data(b"\xf0\x00", sim.now))  # AUTH, which MQTT 3.1.1 has not
    assert sim.closes == 1 and [d.id for d, _ in sim.core.queue] == [2]
    sim.advance(fc.RETRY_S + 0.1)
    assert [p.dup for p in sim.of(m.Publish)] == [False, True]


def test_a_broker_that_refuses_every_connect_is_tried_with_a_backoff_not_every_retry_wait():
    sim = Sim(auto_connack=False)
    sim.put(D(1), conn())
    while sim.now < 600:
        sim.broker(m.ConnAck(False, 0x05))  # not authorised, as a wrong password is
        sim.now = sim.core.next_deadline()
        sim.run(sim.core.tick(sim.now))
    assert sim.opens <= 600 / fc.BACKOFF_MAX_S + 8 and sim.done == [], sim.opens


def test_a_conn_whose_connect_cannot_be_made_is_a_bad_body_not_a_stuck_session():
    sim = connected()
    sim.put(D(2), conn() | {"ka": 70_000})  # past what CONNECT can carry (unpack refuses it too)
    sim.put(D(3), pub("t/ok", q=0))
    assert [d.id for d in sim.done] == [1, 2, 3] and sim.core.counters["bad_bodies"] == 1 and sim.closes == 0


def test_a_broker_that_drops_every_connection_at_once_is_connected_to_every_retry_wait_not_in_a_loop():
    sim = connected()
    sim.put(D(2), pub(q=1))
    for _ in range(20):
        sim.run(sim.core.lost(sim.now, "closed by the broker"))
        sim.advance(0.1)
    assert sim.opens <= 1 + 20 * 0.1 / fc.RETRY_S + 1, sim.opens


def test_a_filter_the_broker_refuses_when_a_new_session_is_subscribed_again_is_dropped():
    subs = {"t/ok": [1, False, False, 0], "t/no": [1, False, False, 0]}
    sim = Sim(state={"params": {"v": 5, "cs": False, "ka": 60}, "subs": subs, "present": True}, v=5)
    sim.broker(m.SubAck(sim.of(m.Subscribe)[0].packet_id, [1, 0x87]))
    assert sim.core.connected() and list(sim.core.subs) == ["t/ok"]


WILL = {"t": "t/will", "p": b"gone", "q": 0, "r": False}


def test_a_connection_for_what_came_after_the_client_left_has_no_will_and_the_clients_cleanness():
    """Its loss must not publish a will the client's clean DISCONNECT withdrew (or one its FIN
    published already), nor leave a persistent session a clean client never had."""
    sim = Sim()
    sim.put(D(1), conn(cs=True, w=WILL, u="alice", pw=b"pw"))
    assert sim.of(m.Connect)[0].will is not None
    sim.put(D(2), body("disc", w=False))
    sim.put(D(3), pub(payload=b"late", q=0))
    c = sim.of(m.Connect)[-1]
    assert sim.opens == 2 and (c.will, c.clean_start, c.username, c.password) == (None, True, "alice", b"pw")


def test_a_session_no_conn_made_ends_with_its_client_and_a_restored_absent_one_stays_unconnected():
    assert fc.FarCore("gw1", "c1", BROKER, fc.FarLimits(), 0.0).expiry_s() == 0.0
    state = {"params": {"v": 4, "cs": False, "ka": 60, "w": WILL}, "subs": {"t/#": [1, False, False, 0]}}
    sim = Sim(state={**state, "present": False, "gone_at": 0})
    sim.advance(600)
    assert sim.opens == 0  # its broker keeps the session, as after the client's disc
    back = Sim(state={**state, "present": True})
    assert back.opens == 1  # a present client's session connects at once
