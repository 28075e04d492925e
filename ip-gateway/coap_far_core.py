"""The CoAP gateway's far side (where the server is), I/O-free: request envelopes and `now` in;
what to ask the server, what to send back and what to consume out (decision 0009).

The shell (coap.py) asks the server with aiocoap and reports each answer (`answered`) or each
attempt that failed or observation the server ended (`failed`); it submits the `Answer`s to
custody and says how that went (`kept`).  Times are the wall clock in milliseconds, as the
envelopes' lifetimes are.

    envelope(d, body, now_ms)        a "req" or "cancel" envelope from a near gateway
    answered(xid, response, now_ms)  the server answered an Ask (or notified an observation)
    failed(xid, why, now_ms)         the attempt failed, timed out, or the server ended the observation
    kept(xid, how, now_ms)           custody took an Answer ("ok"), refused it ("full"), or it can
                                     never cross ("too large", with the reason)
    tick(now_ms)                     a deadline passed: next_deadline_ms() says when the next is

Events: Ask(xid, request, server, timeout_s, observe), Stop(xid) (abandon that request or
observation at the server), Answer(xid, origin, body, lifetime_ms, priority, supersede),
Consume(inbox_id) (the request's envelope is done: its origin is acked).

The rules:
- A request is asked until the server answers or its lifetime is over (counted from when it
  was made or, if that is later, when it arrived, and at most MAX_ASK_MS); each attempt may take
  REQUEST_TIMEOUT_S (aiocoap's own retransmissions run inside it), and a failed one is tried
  again RETRY_S later.  Past the lifetime, 5.04 Gateway Timeout goes back (also if the shell
  never reported the last attempt).  At most MAX_REPLAYS requests are being asked at once (an
  observation takes no place: MAX_OBSERVATIONS bounds those); the rest wait, in order per peer
  gateway, and the next place goes to the peer holding fewest.
- A response that cannot be carried back (aiocoap decodes options it cannot encode) goes back
  as 5.02 Bad Gateway.
- The request's envelope is consumed only once its answer is in custody.  An answer custody
  refuses (full) is submitted again RETRY_S later; one too large to ever cross goes back as
  5.02 Bad Gateway with the reason.  An answer lives at least MIN_ANSWER_LIFE_MS.
- An observation (GET with Observe 0) is registered at the server and each notification goes
  back with a supersession key per client and token, so in custody only the newest waits.
  The server ending it, or failing to answer, registers it again RETRY_S later.  It ends with
  the request's lifetime, with the client's cancel or deregistration, or when the first answer
  is not an observation (then that answer was the response); its envelope is consumed then.
  Past MAX_OBSERVATIONS, a registration is asked as a plain GET: its one answer, without
  Observe, tells the client the resource is not observed (RFC 7641 3.1).
  A notification custody refuses is dropped (a later one carries the state).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from aiocoap import Code, Message

from c2dtn.ip_gateway import coap_core as cc
from c2dtn.overlay.port import Priority

log = logging.getLogger("c2dtn.gateway.coap")

RETRY_S = 5.0
REQUEST_TIMEOUT_S = 60.0
MAX_REPLAYS = 16
MIN_ANSWER_LIFE_MS = 60_000
MAX_OBSERVATIONS = 1024  # observations kept at servers at once; past it a registration is a plain GET
MAX_ASK_MS = 7 * 24 * 3600 * 1000  # a request is asked at most this long, whatever lifetime its peer gave it


@dataclass(frozen=True, eq=False)
class Ask:
    xid: int
    request: Message
    server: str
    timeout_s: float  # for the (first) answer
    observe: bool  # register an observation: every notification is answered() too


@dataclass(frozen=True)
class Stop:
    xid: int


@dataclass(frozen=True)
class Answer:
    xid: int
    origin: str
    body: bytes
    lifetime_ms: int
    priority: Priority
    supersede: str | None


@dataclass(frozen=True)
class Consume:
    inbox_id: int


Event = Ask | Stop | Answer | Consume


@dataclass(eq=False)
class _Exchange:
    xid: int
    d: Any  # the request's Delivery
    body: dict
    request: Message
    server: str
    observation: tuple | None  # its key, for an observation
    deadline_ms: int
    origin: str = ""
    asking: bool = False  # an Ask is out
    retry_ms: int | None = None  # ask again then
    answer: Answer | None = None  # an answer waiting for custody (again at retry_ms)
    observing: bool = False
    bad_gateway: bool = False  # its answer could not cross: 5.02 goes instead
    final: bool = False  # its answer ends it (a replay's, or an observation's first when not observable)


class FarCoap:
    def __init__(self, counters: Counter[str] | None = None, max_replays: int = MAX_REPLAYS):
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.max_replays = max_replays
        self.exchanges: dict[int, _Exchange] = {}  # replays being asked, and observations
        self.observations: dict[tuple, int] = {}  # observation key -> xid
        self._waiting: dict[str, deque[_Exchange]] = {}  # replays waiting for a place, per peer gateway
        self._held: Counter[str] = Counter()  # places held, per peer gateway
        self._next = 0

    # -- inputs -------------------------------------------------------------------------
    def envelope(self, d: Any, body: dict, now_ms: int) -> list[Event]:
        """A request or cancel envelope (unpacked by coap_core.unpack); raises ValueError or
        CoapError for one that makes no request (the shell counts it and consumes it)."""
        key = cc.observation_key(d.origin, body)
        out: list[Event] = []
        if body["op"] == "cancel" or body.get("obs") is not None:  # a new registration replaces an old one
            out += self._end_observation(key, body.get("why", "deregistered by the client"), now_ms)
        if body["op"] == "cancel":
            return out + [Consume(d.id)]
        request, server = cc.request_of(body)
        if body.get("obs") == 0 and len(self.observations) >= MAX_OBSERVATIONS:
            self.counters["observations_refused"] += 1  # answered once, without Observe: "not observable"
            request.opt.observe = None
            body = {k: v for k, v in body.items() if k != "obs"}
        self._next += 1
        start = min(d.created_ms, getattr(d, "received_ms", d.created_ms))  # a peer's clock ahead buys no time
        x = _Exchange(
            self._next,
            d,
            body,
            request,
            server,
            key if body.get("obs") == 0 else None,
            start + min(d.lifetime_ms, MAX_ASK_MS),
            d.origin,
        )
        if x.observation is not None:
            self.exchanges[x.xid] = x
            self.observations[key] = x.xid
            return out + self._ask(x, now_ms)
        self._waiting.setdefault(x.origin, deque()).append(x)
        return out + self._start_replays(now_ms)

    def answered(self, xid: int, resp: Message, now_ms: int) -> list[Event]:
        x = self.exchanges.get(xid)
        if x is None or not (x.asking or x.observing):
            return []
        try:
            body = cc.response_body(x.body, resp)
        except (ValueError, TypeError, cc.CoapError) as e:  # aiocoap decoded what it cannot encode
            self.counters["bad_responses"] += 1
            log.warning("CoAP response from %s cannot be carried back: %s", x.server, e)
            if x.observation is not None and x.observing:
                return []  # a later notification carries the state
            bad = Message(code=Code.BAD_GATEWAY, payload=f"the server's response cannot be carried: {e}".encode()[:200])
            body, resp = cc.response_body(x.body, bad), bad
        if x.observation is None:
            x.asking = False
            self.counters["replayed"] += 1
            return self._answer(x, body, now_ms)
        out = self._notify(x, body, now_ms)
        if not x.observing:
            x.asking = False
            if resp.opt.observe is None or not resp.code.is_successful():
                x.final = True  # not observable: that answer is the response, consumed once kept
                return out
            x.observing = True
            self.counters["observations"] += 1
        return out

    def failed(self, xid: int, why: str, now_ms: int) -> list[Event]:
        x = self.exchanges.get(xid)
        if x is None or not (x.asking or x.observing):
            return []
        x.asking = x.observing = False
        path = cc.path_of(x.request)
        if x.observation is not None:
            self.counters["observe_retries"] += 1
            log.info("CoAP observe %s at %s: %s; again in %.0f s", path, x.server, why, RETRY_S)
        else:
            self.counters["server_retries"] += 1
            log.info("CoAP %s %s to %s: %s; again in %.0f s", x.request.code, path, x.server, why, RETRY_S)
        x.retry_ms = min(now_ms + int(RETRY_S * 1000), max(now_ms, x.deadline_ms))
        return []

    def kept(self, xid: int, how: str, now_ms: int) -> list[Event]:
        """What custody did with the exchange's last Answer: "ok", "full", or why it is too large."""
        x = self.exchanges.get(xid)
        if x is None or x.answer is None:
            return []
        if x.observation is not None and not x.final:  # a notification: a later one carries the state
            x.answer = None
            if how != "ok":
                self.counters["notifications_refused"] += 1
                log.warning("CoAP notification for %s not kept: %s", x.d.origin, how)
            return []
        if how == "ok":
            x.answer = None
            return self._finish(x, now_ms)
        if how == "full":
            log.warning(
                "CoAP response for %s:%d not kept (custody full): again in %.0f s", x.d.origin, x.d.seq, RETRY_S
            )
            x.retry_ms = now_ms + int(RETRY_S * 1000)
            return []
        log.warning("CoAP response for %s:%d: %s", x.d.origin, x.d.seq, how)
        if x.bad_gateway:  # even the short 5.02 does not cross: nothing goes back
            return self._finish(x, now_ms)
        x.bad_gateway = True
        bad = Message(code=Code.BAD_GATEWAY, payload=how.encode()[:200])
        return self._answer(x, cc.response_body(x.body, bad), now_ms)

    def tick(self, now_ms: int) -> list[Event]:
        out: list[Event] = []
        for x in list(self.exchanges.values()):
            if x.observation is not None and now_ms >= x.deadline_ms and not x.final:
                out += self._end_observation(x.observation, "its lifetime is over", now_ms)
            elif x.observation is None and x.asking and now_ms >= x.deadline_ms + REQUEST_TIMEOUT_S * 1000:
                x.asking = False  # its last attempt was never reported: the 5.04 goes anyway
                out += [Stop(x.xid)] + self._ask(x, now_ms)
            elif x.retry_ms is not None and now_ms >= x.retry_ms:
                x.retry_ms = None
                if x.answer is not None:
                    out.append(x.answer)  # custody was full: submitted again
                else:
                    out += self._ask(x, now_ms)
        return out + self._start_replays(now_ms)

    def next_deadline_ms(self) -> int | None:
        ats = [x.retry_ms for x in self.exchanges.values() if x.retry_ms is not None]
        ats += [x.deadline_ms for x in self.exchanges.values() if x.observation is not None and not x.final]
        ats += [x.deadline_ms + int(REQUEST_TIMEOUT_S * 1000) for x in self.exchanges.values() if x.asking]
        return min(ats, default=None)

    def status(self) -> dict:
        waiting = sum(len(q) for q in self._waiting.values())
        return {"replaying": sum(self._held.values()), "waiting": waiting, "observing": len(self.observations)}

    # -- the exchanges --------------------------------------------------------------------
    def _start_replays(self, now_ms: int) -> list[Event]:
        """Waiting replays into free places: the next from the peer holding fewest."""
        out: list[Event] = []
        while self._waiting and sum(self._held.values()) < self.max_replays:
            origin = min(self._waiting, key=lambda o: self._held[o])
            queue = self._waiting[origin]
            x = queue.popleft()
            if not queue:
                del self._waiting[origin]
            self._held[origin] += 1
            self.exchanges[x.xid] = x
            out += self._ask(x, now_ms)
        return out

    def _ask(self, x: _Exchange, now_ms: int) -> list[Event]:
        left_s = (x.deadline_ms - now_ms) / 1000
        if left_s <= 0:
            if x.observation is not None:
                return self._end_observation(x.observation, "its lifetime is over", now_ms)
            self.counters["server_timeouts"] += 1
            log.warning(
                "CoAP %s %s to %s: no answer within the request's lifetime: 5.04 back to %s",
                x.request.code,
                cc.path_of(x.request),
                x.server,
                x.d.origin,
            )
            why = f"{x.server} did not answer within the request's lifetime"
            return self._answer(x, cc.timeout_body(x.body, why), now_ms)
        x.asking = True
        return [Ask(x.xid, x.request, x.server, min(left_s, REQUEST_TIMEOUT_S), x.observation is not None)]

    def _life(self, x: _Exchange, now_ms: int) -> int:
        return max(MIN_ANSWER_LIFE_MS, x.deadline_ms - now_ms)

    def _answer(self, x: _Exchange, body: bytes, now_ms: int) -> list[Event]:
        x.answer = Answer(x.xid, x.d.origin, body, self._life(x, now_ms), x.d.priority, None)
        return [x.answer]

    def _notify(self, x: _Exchange, body: bytes, now_ms: int) -> list[Event]:
        key = x.observation or ()
        supersede = f"coap-obs:{key[1][0]}:{key[1][1]}:{key[2].hex()}"
        x.answer = Answer(x.xid, x.d.origin, body, self._life(x, now_ms), x.d.priority, supersede)
        return [x.answer]

    def _finish(self, x: _Exchange, now_ms: int) -> list[Event]:
        """The exchange is over: its request's envelope is consumed, and a waiting replay starts."""
        self.exchanges.pop(x.xid, None)
        if x.observation is not None:
            if self.observations.get(x.observation) == x.xid:
                del self.observations[x.observation]
        else:
            self._held[x.origin] -= 1
            if self._held[x.origin] <= 0:
                del self._held[x.origin]
        return [Consume(x.d.id)] + self._start_replays(now_ms)

    def _end_observation(self, key: tuple, why: str, now_ms: int) -> list[Event]:
        xid = self.observations.get(key)
        x = self.exchanges.get(xid) if xid is not None else None
        if x is None:
            return []
        log.info("CoAP observation of %s:%d (token %s) ended: %s", *key[1], key[2].hex(), why)
        self.counters["observations_ended"] += 1
        return [Stop(x.xid)] + self._finish(x, now_ms)
