"""The CoAP gateway's far side (ip-gateway/coap_far_core.py) in virtual time: request envelopes
in, what to ask the server and what goes back out; the test plays the server and custody.
tests/test_coap_live.py runs the same through aiocoap and real servers."""

from __future__ import annotations

from dataclasses import dataclass

import cbor2
import pytest
from aiocoap import Code, Message
from aiocoap.numbers.types import Type

from c2dtn.ip_gateway import coap_core as cc
from c2dtn.ip_gateway import coap_far_core as fc
from c2dtn.overlay.envelope import Priority

S = 1000  # ms


@dataclass
class D:  # the request's Delivery (the fields the far side reads)
    id: int
    created_ms: int = 0
    lifetime_ms: int = 600 * S
    origin: str = "gw1"
    seq: int = 0
    priority: Priority = Priority.IMMEDIATE
    received_ms: int = 0


def req(path="/orders/1", token=b"\x0a", obs=None, code=Code.POST, op="req") -> dict:
    m = Message(code=code, payload=b"x", uri_path=tuple(p for p in path.split("/") if p))
    if obs is not None:
        m.opt.observe = obs
    body = {"op": op, "m": cc.encode(m, Type.CON, 7, token), "c": ["10.77.1.2", 40001], "s": ["10.77.9.2", 5683]}
    body |= {"con": True} | ({"obs": obs} if obs is not None else {}) | ({"t": token} if op == "cancel" else {})
    return cc.unpack(cbor2.dumps(body))


def resp(code=Code.CHANGED, payload=b"ok", observe=None) -> Message:
    m = Message(code=code, payload=payload)
    if observe is not None:
        m.opt.observe = observe
    return m


class Far:
    """A FarCoap with custody played by the test: `custody` says what each Answer meets."""

    def __init__(self, **kw):
        self.core = fc.FarCoap(**kw)
        self.now = 0
        self.asks: list[fc.Ask] = []
        self.stops: list[int] = []
        self.kept: list[fc.Answer] = []
        self.consumed: list[int] = []
        self.custody = "ok"

    def run(self, evs: list) -> None:
        for e in evs:
            if isinstance(e, fc.Ask):
                self.asks.append(e)
            elif isinstance(e, fc.Stop):
                self.stops.append(e.xid)
            elif isinstance(e, fc.Consume):
                self.consumed.append(e.inbox_id)
            elif isinstance(e, fc.Answer):
                how = self.custody(e) if callable(self.custody) else self.custody
                if how == "ok":
                    self.kept.append(e)
                self.run(self.core.kept(e.xid, how, self.now))

    def envelope(self, d: D, body: dict) -> None:
        self.run(self.core.envelope(d, body, self.now))

    def answer(self, ask: fc.Ask, m: Message) -> None:
        self.run(self.core.answered(ask.xid, m, self.now))

    def fail(self, ask: fc.Ask, why="TimeoutError") -> None:
        self.run(self.core.failed(ask.xid, why, self.now))

    def advance(self, ms: int) -> None:
        end = self.now + ms
        while (at := self.core.next_deadline_ms()) is not None and at <= end:
            self.now = max(self.now, at)
            self.run(self.core.tick(self.now))
        self.now = end

    def answers(self) -> list[Message]:
        return [cc.decode(cc.unpack(a.body)["m"]) for a in self.kept]


def test_a_request_is_consumed_only_once_its_answer_is_in_custody():
    far = Far()
    far.custody = "full"
    far.envelope(D(1), req())
    ask = far.asks[0]
    assert (ask.server, ask.observe, cc.path_of(ask.request)) == ("10.77.9.2:5683", False, "/orders/1")
    far.answer(ask, resp())
    assert far.consumed == [] and far.kept == []  # custody full: the answer waits, the request too
    far.advance(fc.RETRY_S * S - 1)
    assert far.kept == []
    far.custody = "ok"
    far.advance(2)
    assert far.consumed == [1] and [m.code for m in far.answers()] == [Code.CHANGED]
    assert far.core.counters["replayed"] == 1 and len(far.asks) == 1  # the server was asked once


def test_a_server_that_does_not_answer_is_asked_every_retry_wait_until_the_lifetime_then_5_04_goes_back():
    far = Far()
    far.envelope(D(1, lifetime_ms=30 * S), req())
    while far.consumed == []:
        far.fail(far.asks[-1])
        far.advance(S)
    times = [a.timeout_s for a in far.asks]
    assert len(far.asks) == 30 // fc.RETRY_S and times[0] == 30 and times[-1] <= 30 - fc.RETRY_S * (len(times) - 1)
    assert [m.code for m in far.answers()] == [Code.GATEWAY_TIMEOUT] and far.consumed == [1]
    assert far.core.counters["server_timeouts"] == 1 and far.core.counters["server_retries"] == len(far.asks)
    assert far.kept[0].lifetime_ms == fc.MIN_ANSWER_LIFE_MS  # an answer outlives its request a little


def test_an_attempt_takes_at_most_the_request_timeout():
    far = Far()
    far.envelope(D(1, lifetime_ms=3600 * S), req())
    assert far.asks[0].timeout_s == fc.REQUEST_TIMEOUT_S


def test_at_most_max_replays_are_asked_at_once_and_the_rest_start_in_order():
    far = Far(max_replays=3)
    for i in range(1, 7):
        far.envelope(D(i), req(f"/orders/{i}"))
    assert [cc.path_of(a.request) for a in far.asks] == ["/orders/1", "/orders/2", "/orders/3"]
    far.fail(far.asks[0])  # a retry keeps its place
    far.advance(fc.RETRY_S * S)
    assert len(far.asks) == 4 and cc.path_of(far.asks[3].request) == "/orders/1"
    far.answer(far.asks[1], resp())
    assert far.consumed == [2] and cc.path_of(far.asks[-1].request) == "/orders/4"
    assert far.core.status() == {"replaying": 3, "waiting": 2, "observing": 0}


def test_an_answer_too_large_to_cross_goes_back_as_5_02_with_the_reason():
    far = Far()
    far.envelope(D(1), req())
    far.custody = lambda a: "envelope over the limit" if len(a.body) > 1000 else "ok"
    far.answer(far.asks[0], resp(payload=b"x" * 70_000))
    assert [(m.code, m.payload) for m in far.answers()] == [(Code.BAD_GATEWAY, b"envelope over the limit")]
    assert far.consumed == [1]
    far.custody = "envelope over the limit"  # (nothing crosses: the request is still done, not asked for ever)
    far.envelope(D(2), req())
    far.answer(far.asks[-1], resp())
    assert far.consumed == [1, 2] and far.core.next_deadline_ms() is None


def test_an_observation_sends_each_notification_back_to_replace_the_last_and_lives_its_lifetime():
    far = Far()
    far.envelope(D(1, lifetime_ms=120 * S), req(obs=0, code=Code.GET))
    ask = far.asks[0]
    assert ask.observe
    for i in range(3):
        far.answer(ask, resp(Code.CONTENT, b"%d" % i, observe=i + 2))
    assert [m.payload for m in far.answers()] == [b"0", b"1", b"2"]
    assert len({a.supersede for a in far.kept}) == 1 and far.kept[0].supersede.startswith("coap-obs:10.77.1.2:40001:")
    assert far.consumed == [] and far.core.counters["observations"] == 1
    far.advance(120 * S)  # its lifetime is over, although the server goes on notifying
    assert far.stops == [ask.xid] and far.consumed == [1] and far.core.status()["observing"] == 0
    far.answer(ask, resp(Code.CONTENT, b"late", observe=9))
    assert len(far.kept) == 3


def test_an_observation_the_server_ends_is_registered_again_after_the_retry_wait():
    far = Far()
    far.envelope(D(1), req(obs=0, code=Code.GET))
    far.answer(far.asks[0], resp(Code.CONTENT, observe=2))
    far.fail(far.asks[0], "ended by the server")
    far.advance(fc.RETRY_S * S - 1)
    assert len(far.asks) == 1
    far.advance(1)
    assert len(far.asks) == 2 and far.asks[1].observe and far.core.counters["observe_retries"] == 1


def test_a_first_answer_that_is_no_observation_is_the_response_and_consumes_the_request_once_kept():
    far = Far()
    far.envelope(D(1), req(obs=0, code=Code.GET))
    far.custody = "full"
    far.answer(far.asks[0], resp(Code.NOT_FOUND))
    assert far.consumed == []
    far.custody = "ok"
    far.advance(fc.RETRY_S * S)
    assert [m.code for m in far.answers()] == [Code.NOT_FOUND] and far.consumed == [1]


def test_a_cancel_or_a_deregistration_ends_the_observation_and_a_new_registration_replaces_the_old():
    far = Far()
    far.envelope(D(1), req(obs=0, code=Code.GET))
    far.envelope(D(2), req(obs=0, code=Code.GET))  # the same client and token registers again
    assert far.stops == [far.asks[0].xid] and far.consumed == [1] and far.core.status()["observing"] == 1
    far.envelope(D(3), req(op="cancel"))
    assert far.stops[-1] == far.asks[1].xid and far.consumed == [1, 2, 3]
    far.envelope(D(4), req(obs=0, code=Code.GET, token=b"\x0b"))
    far.envelope(D(5), req(obs=1, code=Code.GET, token=b"\x0b"))  # GET with Observe 1: ends it, and is asked
    assert far.consumed == [1, 2, 3, 4] and not far.asks[-1].observe
    far.answer(far.asks[-1], resp(Code.CONTENT))
    assert far.consumed == [1, 2, 3, 4, 5]


def test_a_notification_custody_refuses_is_dropped_and_the_observation_goes_on():
    far = Far()
    far.envelope(D(1), req(obs=0, code=Code.GET))
    far.custody = "full"
    far.answer(far.asks[0], resp(Code.CONTENT, b"1", observe=2))
    far.custody = "ok"
    far.answer(far.asks[0], resp(Code.CONTENT, b"2", observe=3))
    assert [m.payload for m in far.answers()] == [b"2"] and far.core.counters["notifications_refused"] == 1
    assert far.consumed == []


def test_answers_for_exchanges_that_are_over_change_nothing():
    far = Far()
    far.envelope(D(1), req())
    ask = far.asks[0]
    far.answer(ask, resp())
    far.answer(ask, resp(Code.CONTENT))
    far.fail(ask)
    far.run(far.core.answered(999, resp(), 0))
    assert far.consumed == [1] and len(far.kept) == 1 and far.core.next_deadline_ms() is None


def test_an_attempt_the_shell_never_reports_ends_in_5_04_and_frees_its_place():
    far = Far(max_replays=1)
    far.envelope(D(1, lifetime_ms=30 * S), req("/a"))
    far.envelope(D(2), req("/b"))
    assert len(far.asks) == 1  # /b waits for the one place
    far.advance(30 * S + int(fc.REQUEST_TIMEOUT_S * S))  # the shell's task died: no answered, no failed
    assert far.stops == [far.asks[0].xid] and [m.code for m in far.answers()] == [Code.GATEWAY_TIMEOUT]
    assert far.consumed == [1] and cc.path_of(far.asks[-1].request) == "/b"


def test_a_server_response_that_cannot_be_carried_goes_back_as_5_02():
    opt = bytes([0xE0, 0xFF, 0xFF])  # an option numbered past 65535: aiocoap decodes it, will not encode it
    weird = Message.decode(bytes([0x60, 0x45, 0x00, 0x01]) + opt + opt)
    far = Far()
    far.envelope(D(1), req())
    far.answer(far.asks[0], weird)
    assert [m.code for m in far.answers()] == [Code.BAD_GATEWAY] and far.consumed == [1]
    assert far.core.counters["bad_responses"] == 1


def test_one_peers_backlog_does_not_take_every_place_from_another_peer():
    far = Far(max_replays=4)
    for i in range(1, 101):
        far.envelope(D(i, origin="gw1"), req(f"/a/{i}"))
    far.envelope(D(500, origin="gw2"), req("/b"))
    assert len(far.asks) == 4 and far.core.status() == {"replaying": 4, "waiting": 97, "observing": 0}
    assert len(far.core.exchanges) == 4  # what waits is not scanned at every deadline
    far.answer(far.asks[0], resp())
    assert cc.path_of(far.asks[-1].request) == "/b"  # the next place goes to the peer holding none


def test_a_peers_clock_ahead_or_a_huge_lifetime_buys_no_longer_asking():
    far = Far()
    far.envelope(D(1, created_ms=365 * 86_400 * S, lifetime_ms=30 * S), req("/a"))  # made "a year from now"
    far.envelope(D(2, lifetime_ms=1 << 62), req("/b"))
    deadlines = sorted(x.deadline_ms for x in far.core.exchanges.values())
    assert deadlines == [30 * S, fc.MAX_ASK_MS]  # from when it arrived (D.received_ms: 0); at most MAX_ASK_MS


def test_past_max_observations_a_registration_is_asked_once_as_a_plain_get():
    far = Far()
    for i in range(fc.MAX_OBSERVATIONS + 1):
        far.envelope(D(i + 1), req(obs=0, code=Code.GET, token=i.to_bytes(2, "big")))
    last = far.asks[-1]
    assert not last.observe and last.request.opt.observe is None
    assert far.core.counters["observations_refused"] == 1 and far.core.status()["observing"] == fc.MAX_OBSERVATIONS
    far.answer(last, resp(Code.CONTENT))
    assert far.consumed == [fc.MAX_OBSERVATIONS + 1]


@pytest.mark.parametrize(
    "server, code, why",
    [
        (["example.org", 5683], Code.GET, "not an IP address"),
        (["10.77.9.2", 0], Code.GET, "not 1-65535"),
        (["10.77.9.2", 99_999], Code.GET, "not 1-65535"),
        (["10.77.9.2", 5683], Code.CONTENT, "not a request"),
    ],
)
def test_a_request_envelope_the_far_side_cannot_ask_is_refused_by_name(server, code, why):
    m = cc.encode(Message(code=code, uri_path=("a",)), Type.CON, 7, b"\x01")
    with pytest.raises(ValueError, match=why):
        cc.unpack(cbor2.dumps({"op": "req", "m": m, "c": ["10.77.1.2", 40001], "s": server, "con": True}))


def test_an_ipv6_server_is_asked_with_its_address_in_brackets():
    m = cc.encode(Message(code=Code.GET, uri_path=("a",)), Type.CON, 7, b"\x01")
    body = cc.unpack(cbor2.dumps({"op": "req", "m": m, "c": ["fd00::2", 40001], "s": ["fd00::9", 5683], "con": True}))
    assert cc.request_of(body)[1] == "[fd00::9]:5683"
