"""The CoAP split session's I/O-free core (ip-gateway/coap_core.py) in virtual time, with
aiocoap's codec building what a client would send."""

import random

import cbor2
import pytest
from aiocoap import Code, Message
from aiocoap.numbers.types import Type
from hypothesis import given, settings, strategies as hs

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
    n.committed(sub.key, True)
    again = n.datagram(request(), CLIENT, SERVER, 2500)
    assert cc.decode(only(again, cc.Reply).data).mtype == Type.ACK and not [a for a in again if isinstance(a, cc.Submit)]
    assert n.counters["requests"] == 1 and n.counters["duplicates"] == 2
    # the same message id with other content is a new request; so is any id from another client
    assert isinstance(n.datagram(request(payload=b"other"), CLIENT, SERVER, 3000)[0], cc.Submit)
    assert isinstance(n.datagram(request(), ("10.77.1.3", 40001), SERVER, 3000)[0], cc.Submit)


def test_a_repeat_the_store_recognised_after_a_restart_counts_as_a_duplicate():
    n = near()
    sub = only(n.datagram(request(), CLIENT, SERVER, 0), cc.Submit)
    assert sub.mark[0] == f"coap:{CLIENT[0]}:{CLIENT[1]}:100" and sub.mark[2]
    n.committed(sub.key, False)  # the custody mark said: taken before the restart
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


def test_envelope_bodies_that_are_not_coap_ones_are_refused_by_name():
    with pytest.raises(ValueError, match="not CBOR"):
        cc.unpack(b"\xff\xff")
    with pytest.raises(ValueError, match="'c'"):
        cc.unpack(cbor2.dumps({"op": "req", "m": b"", "c": "x", "s": ["a", 1], "con": True}))


def test_coap_config_errors_name_the_bad_value():
    g = parse_gateway("gw.toml", {"coap": {"listen": "0.0.0.0:5683", "server": "10.77.9.2:5683",
                                           "resource": [{"path": "/orders/*", "priority": "flash", "lifetime": 60}]}})
    assert g.coap.server == ("10.77.9.2", 5683) and g.coap.resources[0].priority == Priority.FLASH
    for bad, value in [({"listen": "0.0.0.0:5683"}, "server"), ({"resource": [{"path": "orders"}]}, "orders"),
                       ({"resource": [{"path": "/a", "priority": "urgent"}]}, "urgent"),
                       ({"resource": [{"path": "/a", "allow": "yes"}]}, "yes"), ({"port": 5683}, "port")]:
        with pytest.raises(ConfigError, match=value):
            parse_gateway("gw.toml", {"coap": bad})


def test_answers_go_from_the_address_the_client_spoke_to_a_listener_or_under_tproxy_the_server():
    n = near()
    listener = ("0.0.0.0", 5683)
    sub = only(n.datagram(request(), CLIENT, SERVER, 0, via=listener), cc.Submit)
    assert only(sub.then, cc.Reply).via == listener
    assert only(n.response(47, response_envelope(n, request(mid=101)), 0), cc.Reply).via == SERVER  # TPROXY: the server's
    rsp = cc.unpack(cc.response_body(cc.unpack(sub.body), Message(code=Code.CHANGED)))
    assert only(n.response(48, rsp, 0), cc.Reply).via == listener  # the response goes the way the request came
    assert only(n.datagram(request("/secret/x", mid=5), CLIENT, SERVER, 0, via=listener), cc.Reply).via == listener
