"""The CoAP split session's I/O-free core (ip-gateway/coap_core.py) in virtual time, with
aiocoap's codec building what a client would send."""

import random

import cbor2
import pytest
from aiocoap import Code, Message
from aiocoap.numbers.types import Type
from hypothesis import given, settings
from hypothesis import strategies as hs

from c2dtn.errors import ConfigError
from c2dtn.ip_gateway import coap_core as cc
from c2dtn.ip_gateway.policy import parse_gateway
from c2dtn.overlay.envelope import Priority

CLIENT, SERVER = ("10.77.1.2", 40001), ("10.77.9.2", 5683)
RULES = [cc.ResourceRule("/secret/*", allow=False), cc.ResourceRule("/orders/*", Priority.IMMEDIATE, 600)]


def near(seed=1):
    return cc.NearCoap(RULES, lambda ip: "gw4" if ip.startswith("10.77.9.") else None, random.Random(seed))


def request(path="/orders/1", mid=100, token=b"\x0a\x0b", mtype=Type.CON, code=Code.POST, payload=b"attack at dawn"):
    m = Message(code=code, payload=payload, uri_path=tuple(p for p in path.split("/") if p))
    return cc.encode(m, mtype, mid, token)


def only(actions, kind):
    got = [a for a in actions if isinstance(a, kind)]
    assert len(got) == 1, actions
    return got[0]


def test_a_con_request_is_acked_only_after_its_commit_and_its_retransmission_is_not_sent_twice():
    n = near()
    acts = n.datagram(request(), CLIENT, SERVER, 0)
    sub = only(acts, cc.Submit)
    assert not [a for a in acts if isinstance(a, cc.Reply)]  # nothing to the client before the commit
    assert (sub.dst, sub.priority, sub.lifetime_ms) == ("gw4", Priority.IMMEDIATE, 600_000)
    ack = cc.decode(only(sub.then, cc.Reply).data)
    assert (ack.mtype, ack.code, ack.mid) == (Type.ACK, Code.EMPTY, 100)
    body = cc.unpack(sub.body)
    assert cc.decode(body["m"]).payload == b"attack at dawn" and tuple(body["s"]) == SERVER
    assert n.datagram(request(), CLIENT, SERVER, 500) == []  # retransmitted before the commit: its ACK is coming
    assert n.committed(sub.key, True, sub.then, 1000) == []  # the ACK waits for a response to ride on
    assert n.next_deadline_ms() == 1000 + cc.PIGGYBACK_WAIT_MS
    assert n.poll(1999) == [] and only(n.poll(2000), cc.Reply) == only(sub.then, cc.Reply)  # none came: empty ACK
    again = n.datagram(request(), CLIENT, SERVER, 2500)
    assert cc.decode(only(again, cc.Reply).data).mtype == Type.ACK and not [
        a for a in again if isinstance(a, cc.Submit)
    ]
    assert n.counters["requests"] == 1 and n.counters["duplicates"] == 2
    # the same message id with other content is a new request; so is any id from another client
    assert isinstance(n.datagram(request(payload=b"other"), CLIENT, SERVER, 3000)[0], cc.Submit)
    assert isinstance(n.datagram(request(), ("10.77.1.3", 40001), SERVER, 3000)[0], cc.Submit)


def test_a_repeat_the_store_recognised_after_a_restart_counts_as_a_duplicate():
    n = near()
    sub = only(n.datagram(request(), CLIENT, SERVER, 0), cc.Submit)
    assert sub.mark[0] == f"coap:{CLIENT[0]}:{CLIENT[1]}:100" and sub.mark[2]
    assert n.committed(sub.key, False, sub.then, 0) == sub.then  # the custody mark said: taken before the restart
    assert n.counters["requests"] == 0 and n.counters["duplicates"] == 1


def test_what_no_rule_releases_is_answered_here_with_4_03_and_an_unrouted_server_with_5_02():
    n = near()
    for path in ("/secret/plans", "/elsewhere"):
        r = cc.decode(only(n.datagram(request(path, mid=7), CLIENT, SERVER, 0), cc.Reply).data)
        assert (r.mtype, r.code, r.mid, r.token) == (Type.ACK, Code.FORBIDDEN, 7, b"\x0a\x0b")
    r = cc.decode(only(n.datagram(request(mid=8, mtype=Type.NON), CLIENT, ("192.0.2.1", 5683), 0), cc.Reply).data)
    assert (r.mtype, r.code, r.token) == (Type.NON, Code.BAD_GATEWAY, b"\x0a\x0b")
    assert n.counters["forbidden"] == 2 and n.counters["no_route"] == 1 and n.counters["requests"] == 0


def response_envelope(n, req_data, code=Code.CONTENT, payload=b"done", con=True):
    body = cc.unpack(only(n.datagram(req_data, CLIENT, SERVER, 0), cc.Submit).body)
    assert body["con"] is con
    return cc.unpack(cc.response_body(body, Message(code=code, payload=payload)))


def test_the_response_goes_as_a_separate_con_with_the_clients_token_until_acked():
    n = near()
    rsp = response_envelope(n, request())
    acts = n.response(42, rsp, 100_000)
    r = cc.decode(only(acts, cc.Reply).data)
    assert (r.mtype, r.code, r.token, r.payload) == (Type.CON, Code.CONTENT, b"\x0a\x0b", b"done")
    assert not [a for a in acts if isinstance(a, cc.Consume)]  # kept until the client has it
    first = n.next_deadline_ms() - 100_000
    assert 2000 <= first <= 3000  # ACK_TIMEOUT x [1, 1.5]
    again = n.poll(100_000 + first)
    assert cc.decode(only(again, cc.Reply).data).mid == r.mid  # a retransmission, same message id
    assert n.next_deadline_ms() - (100_000 + first) == 2 * first  # doubled
    done = n.datagram(cc.empty(Type.ACK, r.mid), CLIENT, SERVER, 100_000 + first + 10)
    assert only(done, cc.Consume).inbox_id == 42 and n.next_deadline_ms() is None
    assert n.counters["responses_acked"] == 1 and n.counters["retransmissions"] == 1


def test_a_response_nobody_acks_is_given_up_after_four_retransmissions_and_consumed():
    n = near()
    n.response(43, response_envelope(n, request()), 0)
    sent, t = 1, 0
    while n.next_deadline_ms() is not None:
        t = n.next_deadline_ms()
        acts = n.poll(t)
        sent += sum(isinstance(a, cc.Reply) for a in acts)
    assert sent == 1 + cc.MAX_RETRANSMIT and only(acts, cc.Consume).inbox_id == 43
    assert 62_000 <= t <= 93_000  # RFC 7252 MAX_TRANSMIT_WAIT at most
    assert n.counters["responses_unacknowledged"] == 1


def test_a_response_back_before_the_empty_ack_went_is_piggybacked_as_the_server_would_answer():
    """libcoap's client takes the first Block2 block of a body only in a piggybacked
    response ("large body receive internal issue" on a separate one): a fast path must
    answer as the server itself does, the later blocks from the copy kept here."""
    n = near()
    get = request("/orders/big", mid=300, token=b"\x01", code=Code.GET, payload=b"")
    sub = only(n.datagram(get, CLIENT, SERVER, 0), cc.Submit)
    assert n.committed(sub.key, True, sub.then, 10) == []
    body = bytes(0x41 + i % 26 for i in range(4500))
    acts = n.response(
        50, cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CONTENT, payload=body))), 600
    )
    r = cc.decode(only(acts, cc.Reply).data)
    assert (r.mtype, r.mid, r.token, r.code) == (Type.ACK, 300, b"\x01", Code.CONTENT)
    assert (r.opt.block2.block_number, r.opt.block2.more, r.opt.size2, r.payload) == (0, True, 4500, body[:1024])
    assert only(acts, cc.Consume).inbox_id == 50 and n.pending == {} and n.poll(5000) == []  # no empty ACK after it
    nxt = Message(code=Code.GET, uri_path=("orders", "big"))
    nxt.opt.block2 = cc._blockwise(4, 0, 6)
    r = cc.decode(only(n.datagram(cc.encode(nxt, Type.CON, 301, b"\x02"), CLIENT, SERVER, 700), cc.Reply).data)
    assert (r.mtype, r.payload, r.opt.block2.more) == (Type.ACK, body[4096:], False) and n.counters["piggybacked"] == 1
    # a response later than the wait is a separate CON after the empty ACK
    sub = only(n.datagram(request(mid=302, token=b"\x03"), CLIENT, SERVER, 1000), cc.Submit)
    n.committed(sub.key, True, sub.then, 1000)
    assert cc.decode(only(n.poll(1000 + cc.PIGGYBACK_WAIT_MS), cc.Reply).data).code == Code.EMPTY
    r = cc.decode(
        only(
            n.response(51, cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CHANGED))), 3000), cc.Reply
        ).data
    )
    assert (r.mtype, r.token) == (Type.CON, b"\x03")


def test_a_reset_from_the_client_ends_the_response_and_a_non_request_gets_a_non_response():
    n = near()
    r = cc.decode(only(n.response(44, response_envelope(n, request()), 0), cc.Reply).data)
    assert only(n.datagram(cc.empty(Type.RST, r.mid), CLIENT, SERVER, 10), cc.Consume).inbox_id == 44
    sub = only(n.datagram(request(mid=9, mtype=Type.NON), CLIENT, SERVER, 0), cc.Submit)
    assert sub.then == []  # no empty ACK for a NON
    rsp = cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CHANGED)))
    acts = n.response(45, rsp, 0)
    assert cc.decode(only(acts, cc.Reply).data).mtype == Type.NON and only(acts, cc.Consume).inbox_id == 45


def test_a_server_never_reached_answers_5_04_not_silence():
    n = near()
    body = cc.unpack(only(n.datagram(request(), CLIENT, SERVER, 0), cc.Submit).body)
    r = cc.decode(only(n.response(46, cc.unpack(cc.timeout_body(body, "no answer")), 0), cc.Reply).data)
    assert r.code == Code.GATEWAY_TIMEOUT and r.token == b"\x0a\x0b"


def test_a_ping_is_answered_with_a_reset():
    r = cc.decode(only(near().datagram(cc.empty(Type.CON, 77), CLIENT, SERVER, 0), cc.Reply).data)
    assert (r.mtype, r.mid) == (Type.RST, 77)


BAD = {
    "version 2": bytes([0x80, 0x01, 0, 1]),
    "token length 9": bytes([0x49, 0x01, 0, 1]) + bytes(9),
    "token length 15": bytes([0x4F, 0x01, 0, 1]) + bytes(15),
    "truncated option": bytes([0x40, 0x01, 0, 1, 0xD1]),
    "option delta 15 without the payload marker": bytes([0x40, 0x01, 0, 1, 0xF0]),
    "payload marker with no payload": bytes([0x40, 0x02, 0, 1, 0xFF]),
    "shorter than a header": bytes([0x40, 0x01]),
}


@pytest.mark.parametrize("what", BAD)
def test_malformed_datagrams_are_dropped_counted_and_named(what):
    n = near()
    acts = n.datagram(BAD[what], CLIENT, SERVER, 0)
    assert n.counters["malformed"] == 1 and "10.77.1.2:40001" in only(acts, cc.Drop).why


@settings(max_examples=3000, deadline=None)
@given(hs.binary(max_size=64))
def test_generated_garbage_never_raises_and_a_well_formed_client_loses_nothing(data):
    n = near()
    acts = n.datagram(data, CLIENT, SERVER, 0)
    assert all(isinstance(a, (cc.Drop, cc.Reply, cc.Submit, cc.Consume)) for a in acts)
    sub = only(n.datagram(request(mid=4242, token=b"ok"), ("10.77.1.9", 5000), SERVER, 1), cc.Submit)
    assert cc.decode(cc.unpack(sub.body)["m"]).payload == b"attack at dawn"


def test_the_flood_generators_kinds_are_each_dropped_and_a_client_between_them_loses_nothing():
    """The datagrams the live flood sends (perf/coap_clients.py): every one of each RFC 7252
    format error is dropped and counted here, and requests interleaved with them are taken."""
    from c2dtn.perf.coap_clients import MALFORMED, malformed

    n = near()
    flood = malformed(3000, seed=7)
    taken = []
    for i, (kind, data) in enumerate(flood):
        assert [type(a) for a in n.datagram(data, ("10.77.1.66", 999), SERVER, i)] == [cc.Drop], (kind, data.hex())
        if i % 300 == 0:
            taken.append(only(n.datagram(request(mid=i, token=b"ok"), CLIENT, SERVER, i), cc.Submit))
    assert {k for k, _ in flood} == set(MALFORMED) and n.counters["malformed"] == 3000
    assert len(taken) == 10 and n.counters["requests"] == 10


def test_envelope_bodies_that_are_not_coap_ones_are_refused_by_name():
    with pytest.raises(ValueError, match="not strict CBOR"):
        cc.unpack(b"\xff\xff")
    with pytest.raises(ValueError, match="'c'"):
        cc.unpack(cbor2.dumps({"op": "req", "m": b"", "c": "x", "s": ["a", 1], "con": True}))


def test_coap_config_errors_name_the_bad_value():
    g = parse_gateway(
        "gw.toml",
        {
            "coap": {
                "listen": "0.0.0.0:5683",
                "server": "10.77.9.2:5683",
                "resource": [{"path": "/orders/*", "priority": "flash", "lifetime": 60}],
            }
        },
    )
    assert g.coap.server == ("10.77.9.2", 5683) and g.coap.resources[0].priority == Priority.FLASH
    assert parse_gateway("gw.toml", {"coap": {"listen": "127.0.0.1:5684"}}).coap.server is None  # a forward proxy
    for bad, value in [
        ({"listen": "0.0.0.0"}, "0.0.0.0"),
        ({"resource": [{"path": "orders"}]}, "orders"),
        ({"resource": [{"path": "/a", "priority": "urgent"}]}, "urgent"),
        ({"resource": [{"path": "/a", "allow": "yes"}]}, "yes"),
        ({"port": 5683}, "port"),
    ]:
        with pytest.raises(ConfigError, match=value):
            parse_gateway("gw.toml", {"coap": bad})


def test_answers_go_from_the_address_the_client_spoke_to_a_listener_or_under_tproxy_the_server():
    n = near()
    listener = ("0.0.0.0", 5683)
    sub = only(n.datagram(request(), CLIENT, SERVER, 0, via=listener), cc.Submit)
    assert only(sub.then, cc.Reply).via == listener
    assert (
        only(n.response(47, response_envelope(n, request(mid=101)), 0), cc.Reply).via == SERVER
    )  # TPROXY: the server's
    rsp = cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CHANGED)))
    assert only(n.response(48, rsp, 0), cc.Reply).via == listener  # the response goes the way the request came
    assert only(n.datagram(request("/secret/x", mid=5), CLIENT, SERVER, 0, via=listener), cc.Reply).via == listener


def test_a_listener_forwards_a_proxy_request_to_the_server_its_uri_names_and_refuses_what_it_cannot():
    n, listener = near(), ("127.0.0.1", 5684)
    m = Message(code=Code.POST, payload=b"move", proxy_uri="coap://10.77.9.7:5690/orders/b-v1?urgent")
    sub = only(n.datagram(cc.encode(m, Type.CON, 300, b"\x01"), CLIENT, None, 0, via=listener), cc.Submit)
    body = cc.unpack(sub.body)
    assert tuple(body["s"]) == ("10.77.9.7", 5690) and sub.dst == "gw4" and tuple(body["v"]) == listener
    replay = cc.decode(body["m"])  # the server gets an ordinary request: no proxy options, the URI's path
    assert (replay.opt.proxy_uri, replay.opt.uri_path, replay.opt.uri_query) == (None, ("orders", "b-v1"), ("urgent",))
    assert replay.payload == b"move" and only(sub.then, cc.Reply).via == listener
    # Proxy-Scheme with Uri-Host and Uri-Path (RFC 7252 5.7.2), to the default port
    m = Message(code=Code.POST, payload=b"x", proxy_scheme="coap", uri_host="10.77.9.8", uri_path=("orders", "a"))
    body = cc.unpack(
        only(n.datagram(cc.encode(m, Type.CON, 301, b"\x02"), CLIENT, None, 0, via=listener), cc.Submit).body
    )
    assert tuple(body["s"]) == ("10.77.9.8", 5683) and cc.decode(body["m"]).opt.uri_host is None
    for uri, why in (
        ("http://10.77.9.7/orders/1", "only coap://"),
        ("coap://hq.example/orders/1", "IPv4"),
        ("coap://10.77.9.7:99999/orders/1", "not coap://"),
    ):
        m = Message(code=Code.POST, payload=b"x", proxy_uri=uri)
        r = cc.decode(
            only(n.datagram(cc.encode(m, Type.CON, 302, b"\x03"), CLIENT, None, 0, via=listener), cc.Reply).data
        )
        assert r.code == Code.PROXYING_NOT_SUPPORTED and why in r.payload.decode(), (uri, r.payload)
    r = cc.decode(only(n.datagram(request(mid=303), CLIENT, None, 0, via=listener), cc.Reply).data)
    assert r.code == Code.NOT_FOUND and b"Proxy-Uri" in r.payload  # a proxy-only listener has no resources
    assert n.counters["proxy_refused"] == 4 and n.counters["requests"] == 2


# -- Observe (RFC 7641) ------------------------------------------------------------------
def observe_request(mid=200, token=b"\x0b\x5e", observe=0):
    m = Message(code=Code.GET, observe=observe, uri_path=("orders", "state"))
    return cc.encode(m, Type.CON, mid, token)


def notification(n, req_body, payload, max_age=None):
    m = Message(code=Code.CONTENT, payload=payload, observe=7)
    if max_age is not None:
        m.opt.max_age = max_age
    return cc.unpack(cc.response_body(req_body, m))


def test_an_observation_crosses_once_and_each_notification_replaces_the_one_not_yet_acked():
    n = near()
    sub = only(n.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit)
    req = cc.unpack(sub.body)
    assert req["obs"] == 0 and cc.decode(only(sub.then, cc.Reply).data).code == Code.EMPTY
    first = cc.decode(only(n.response(50, notification(n, req, b"1"), 10_000, "gw4", 9_900), cc.Reply).data)
    assert (first.mtype, first.token, first.payload) == (Type.CON, b"\x0b\x5e", b"1") and first.opt.observe is not None
    acts = n.response(51, notification(n, req, b"2"), 10_500, "gw4", 10_400)
    assert only(acts, cc.Consume).inbox_id == 50  # the older one, never ACKed, is dropped for the newer
    second = cc.decode(only(acts, cc.Reply).data)
    assert second.payload == b"2" and second.opt.observe > first.opt.observe
    assert len(n.pending) == 1 and n.counters["notifications_replaced"] == 1
    assert only(n.datagram(cc.empty(Type.ACK, second.mid), CLIENT, SERVER, 10_600), cc.Consume).inbox_id == 51
    # a plain response is not a notification and carries no Observe option
    plain = cc.decode(only(n.response(52, response_envelope(n, request(mid=300)), 11_000), cc.Reply).data)
    assert plain.opt.observe is None


def test_a_reset_or_a_notification_never_acked_ends_the_observation_at_the_far_side():
    n = near()
    req = cc.unpack(only(n.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit).body)
    r = cc.decode(only(n.response(60, notification(n, req, b"1"), 0, "gw4", 0), cc.Reply).data)
    acts = n.datagram(cc.empty(Type.RST, r.mid), CLIENT, SERVER, 100)
    assert only(acts, cc.Consume).inbox_id == 60
    cancel = only(acts, cc.Submit)
    body = cc.unpack(cancel.body)
    assert cancel.dst == "gw4" and body["op"] == "cancel" and body["t"] == b"\x0b\x5e"
    assert cc.observation_key("gw1", body) == cc.observation_key("gw1", req)  # the far side finds it by this
    n.response(61, notification(n, req, b"2"), 1000, "gw4", 1000)
    t, acts = 1000, []
    while n.next_deadline_ms() is not None:
        t = n.next_deadline_ms()
        acts = n.poll(t)
    assert only(acts, cc.Consume).inbox_id == 61 and cc.unpack(only(acts, cc.Submit).body)["op"] == "cancel"
    assert n.counters["observations_cancelled"] == 2


def test_after_an_outage_a_stale_notification_waits_for_a_newer_one_and_goes_alone_if_none_comes():
    n = near()
    req = cc.unpack(only(n.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit).body)
    # made 50 s ago with Max-Age 2 (a copy the BPAs held through the cut): held, not sent
    assert n.response(70, notification(n, req, b"old", max_age=2), 100_000, "gw4", 50_000) == []
    assert n.next_deadline_ms() == 100_000 + cc.STALE_HOLD_MS
    # the newest, made 1 s ago, comes 2 s later: it goes at once and the stale one is dropped
    acts = n.response(71, notification(n, req, b"new", max_age=2), 102_000, "gw4", 101_000)
    assert only(acts, cc.Consume).inbox_id == 70
    fresh = cc.decode(only(acts, cc.Reply).data)
    assert fresh.payload == b"new" and fresh.opt.max_age == 1  # Max-Age less its age
    # a stale one with nothing newer behind it still goes, after the hold, as Max-Age 0
    n2 = near()
    req2 = cc.unpack(only(n2.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit).body)
    assert n2.response(72, notification(n2, req2, b"only", max_age=2), 100_000, "gw4", 40_000) == []
    assert n2.poll(100_000 + cc.STALE_HOLD_MS - 1) == []
    late = cc.decode(only(n2.poll(100_000 + cc.STALE_HOLD_MS), cc.Reply).data)
    assert late.payload == b"only" and late.opt.max_age == 0 and late.opt.observe is not None
    # a backlog of stale ones flushed one after another: the wait restarts with each, up to its cap
    n3 = near()
    req3 = cc.unpack(only(n3.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit).body)
    t = 100_000
    for i in range(20):  # one every 3 s for a minute, each made during the cut
        acts = n3.response(200 + i, notification(n3, req3, str(i).encode(), max_age=2), t, "gw4", 40_000 + i * 1000)
        assert not [a for a in acts if isinstance(a, cc.Reply)]
        sent = [a for a in n3.poll(t + 2999) if isinstance(a, cc.Reply)]
        if sent:
            break
        t += 3000
    assert t - 100_000 <= cc.STALE_HOLD_MAX_MS  # never held past the cap
    assert cc.decode(sent[0].data).payload == str(i).encode()  # the newest of them


def test_notifications_a_little_older_than_their_max_age_on_a_slow_link_go_at_once():
    """libcoap's /time (Max-Age 1) across the radio link: every notification arrives 1-2 s after
    it was made.  Each goes at once with Max-Age 0 (the first version held each for a newer
    one, as late, so the client saw one notification per 30 s)."""
    n = near()
    req = cc.unpack(only(n.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit).body)
    for i in range(5):
        made = 10_000 + 1000 * i
        acts = n.response(90 + i, notification(n, req, b"%d" % i, max_age=1), made + 1500 + 300 * (i % 2), "gw4", made)
        r = cc.decode(only(acts, cc.Reply).data)
        assert r.payload == b"%d" % i and r.opt.max_age == 0
        n.datagram(cc.empty(Type.ACK, r.mid), CLIENT, SERVER, made + 1900)
    assert n.counters["notifications_stale"] == 0


# -- block-wise (RFC 7959) ---------------------------------------------------------------
def test_a_large_response_goes_block_by_block_and_later_blocks_are_served_here():
    n = near()
    big = bytes(range(256)) * 80  # 20,480 bytes
    get = Message(code=Code.GET, uri_path=("orders", "big"))
    sub = only(n.datagram(cc.encode(get, Type.CON, 400, b"\x42"), CLIENT, SERVER, 0), cc.Submit)
    rsp = cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CONTENT, payload=big)))
    r = cc.decode(only(n.response(80, rsp, 1000), cc.Reply).data)
    assert r.mtype == Type.CON and r.opt.block2.block_number == 0 and r.opt.block2.more and r.opt.size2 == len(big)
    got, num = r.payload, 1
    while True:
        nxt = Message(code=Code.GET, uri_path=("orders", "big"), block2=cc._blockwise(num, 0, 6))
        acts = n.datagram(cc.encode(nxt, Type.CON, 400 + num, b"\x43"), CLIENT, SERVER, 1000 + num)
        b = cc.decode(only(acts, cc.Reply).data)  # answered here, nothing crosses
        assert (b.mtype, b.mid, b.token) == (Type.ACK, 400 + num, b"\x43") and b.opt.block2.block_number == num
        got += b.payload
        if not b.opt.block2.more:
            break
        num += 1
    assert got == big and num == 19 and n.counters["blocks_served"] == 19
    # a client that asks for 256-byte blocks gets them
    small = Message(code=Code.GET, uri_path=("orders", "big"), block2=cc._blockwise(0, 0, 4))
    sub = only(n.datagram(cc.encode(small, Type.CON, 500, b"\x44"), CLIENT, SERVER, 0), cc.Submit)
    rsp = cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CONTENT, payload=big)))
    assert len(cc.decode(only(n.response(81, rsp, 1000), cc.Reply).data).payload) == 256


def test_a_request_body_in_block1_blocks_is_gathered_here_and_crosses_once_whole():
    n = near()
    body = b"x" * 2500
    acts = []
    for num in range(3):
        m = Message(
            code=Code.POST,
            uri_path=("orders", "plan"),
            payload=body[num * 1024 : (num + 1) * 1024],
            block1=cc._blockwise(num, int(num < 2), 6),
        )
        acts = n.datagram(cc.encode(m, Type.CON, 600 + num, b"\x51"), CLIENT, SERVER, num)
        if num < 2:
            c = cc.decode(only(acts, cc.Reply).data)
            assert (c.code, c.mid, c.opt.block1.block_number) == (Code.CONTINUE, 600 + num, num)
    sub = only(acts, cc.Submit)
    req = cc.unpack(sub.body)
    assert cc.request_of(req)[0].payload == body and cc.request_of(req)[0].opt.block1 is None
    final = cc.decode(
        only(n.response(90, cc.unpack(cc.response_body(req, Message(code=Code.CHANGED))), 10), cc.Reply).data
    )
    assert final.code == Code.CHANGED and final.opt.block1.block_number == 2 and not final.opt.block1.more
    # a block out of order is refused 4.08, not gathered wrong
    m = Message(code=Code.POST, uri_path=("orders", "other"), payload=b"y" * 1024, block1=cc._blockwise(2, 1, 6))
    assert (
        cc.decode(only(n.datagram(cc.encode(m, Type.CON, 700, b"\x52"), CLIENT, SERVER, 0), cc.Reply).data).code
        == Code.REQUEST_ENTITY_INCOMPLETE
    )


def test_notifications_sent_in_the_same_instant_still_get_increasing_observe_values():
    n = near()
    req = cc.unpack(only(n.datagram(observe_request(), CLIENT, SERVER, 0), cc.Submit).body)
    now = 1_790_000_000_000  # a real clock's milliseconds: past 24 bits, as values always are
    seen = []
    for i in range(5):
        acts = n.response(100 + i, notification(n, req, str(i).encode()), now, "gw4", now)
        seen.append(cc.decode(only(acts, cc.Reply).data).opt.observe)
    assert all(0 < b - a < 1 << 23 for a, b in zip(seen, seen[1:])), seen


def test_a_piggybacked_response_lost_on_the_wire_is_sent_again_for_the_clients_retransmission():
    """Found by review: the retransmitted request got an empty ACK, the response was gone."""
    n = near()
    sub = only(n.datagram(request(mid=7, token=b"\x01"), CLIENT, SERVER, 0), cc.Submit)
    assert n.committed(sub.key, True, sub.then, 10) == []
    acts = n.response(
        50, cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CHANGED, payload=b"ok"))), 300
    )
    first = only(acts, cc.Reply).data
    assert cc.decode(first).mtype == Type.ACK and only(acts, cc.Consume).inbox_id == 50  # ... and lost
    again = n.datagram(request(mid=7, token=b"\x01"), CLIENT, SERVER, 2500)  # the client's retransmission
    assert only(again, cc.Reply).data == first


def test_a_response_rides_only_on_its_own_requests_ack():
    """Found by review: a client may use one token (here the empty one) towards two servers;
    server A's response rode on the ACK of the request to B, from A's address."""
    n = near()
    A, B = ("10.77.9.2", 5683), ("10.77.9.3", 5683)
    sa = only(n.datagram(request(mid=1, token=b""), CLIENT, A, 0), cc.Submit)
    sb = only(n.datagram(request(mid=2, token=b""), CLIENT, B, 0), cc.Submit)
    n.committed(sa.key, True, sa.then, 10)
    n.committed(sb.key, True, sb.then, 10)
    rep = only(
        n.response(60, cc.unpack(cc.response_body(cc.unpack(sa.body), Message(code=Code.CHANGED, payload=b"A"))), 200),
        cc.Reply,
    )
    r = cc.decode(rep.data)
    assert (rep.via, r.mtype, r.mid, r.payload) == (A, Type.ACK, 1, b"A")
    assert cc.decode(only(n.poll(10 + cc.PIGGYBACK_WAIT_MS), cc.Reply).data).mid == 2  # B's empty ACK, on time
    # a response from a far gateway that does not say its request's message id goes separately
    sc = only(n.datagram(request(mid=3, token=b"\x03"), CLIENT, A, 2000), cc.Submit)
    n.committed(sc.key, True, sc.then, 2000)
    body = cc.unpack(cc.response_body(cc.unpack(sc.body), Message(code=Code.CHANGED)))
    del body["mid"]
    assert cc.decode(only(n.response(61, body, 2100), cc.Reply).data).mtype == Type.CON
