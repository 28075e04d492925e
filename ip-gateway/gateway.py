"""The MQTT split-session gateway, inside the overlay node process: wiring of the
near side (near.py: the clients' connections, over the I/O-free near_core.py), the
far side (far.py: one broker connection per origin client), the bridge (bridge.py)
and the session file (sessions_file.py), and the custody calls they share.

Near side (clients here): CONNECT, SUBSCRIBE, UNSUBSCRIBE and PINGREQ are answered
here; a QoS 1/2 PUBLISH is acknowledged only once its envelope is durable in
custody (publishes read together are committed together: one fsync per read, not
per message).  Far side (broker here): an envelope is consumed (so its origin is
acked) only once the broker accepted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections import Counter

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway import sessions_file
from c2dtn.ip_gateway.bridge import BridgeSession
from c2dtn.ip_gateway.far import FarSession
from c2dtn.ip_gateway.far_core import Part, session_expiry_s
from c2dtn.ip_gateway.near import NearSide
from c2dtn.ip_gateway.near_core import Envelope
from c2dtn.ip_gateway.policy import GatewayConfig
from c2dtn.overlay.port import Delivery, Mark, Port, now_ms
from c2dtn.spells import Spell
from c2dtn.strict_cbor import short

# a publish waits for an earlier subscription to its broker (subscribed_before) that its session
# wrote within SUB_HANDOUT_S of its arrival, for at most SUB_BARRIER_S from that writing
SUB_HANDOUT_S = 0.5
SUB_BARRIER_S = 2.0
SUB_PENDING_MAX = 4096  # subscription envelopes tracked so (the oldest forgotten past it)

log = logging.getLogger("c2dtn.gateway")


class MqttGateway:
    name = "mqtt"

    def __init__(self, port: Port, cfg: GatewayConfig):
        self.port, self.cfg = port, cfg
        self.counters: Counter[str] = Counter()
        self.near = NearSide(self)
        self.far: dict[str, FarSession] = {}
        self._taken: set[int] = set()
        self._done: list[int] = []
        # SUBSCRIBE/UNSUBSCRIBE envelopes handed out, not yet answered by the broker: inbox id ->
        # [broker, filters, handed out at, written to the broker at]; a later publish to that
        # broker on a topic they match waits for them (subscribed_before)
        self._subscribing: dict[int, list] = {}
        self._subs_changed = asyncio.Event()
        self._mark = 0  # inbox ids up to here have been handed out (or kept for an absent client)
        self._rescan = False  # a session could not be made (max_far_sessions): look again when one ends
        self._full_logged: set[str] = set()
        self._ending: dict[str, FarSession] = {}  # ended sessions whose broker connection is still closing
        # the parameters (credentials, cleanness) of sessions ended lately, oldest first: publishes
        # that came after their client's DISCONNECT ended its session log in as the client did
        self._recent: dict[str, tuple[str, dict]] = {}
        self.state_path = port.storage / "mqtt-sessions.cbor"
        self._servers: list[asyncio.AbstractServer] = []
        self._tproxy = None
        self.bridge: BridgeSession | None = None
        self._sessions_data: bytes | None = None  # the session file's next contents, not yet written
        self._sessions_writer: asyncio.Task | None = None
        self._sessions_failing = Spell(log, logging.ERROR)
        self.far_full = Spell(log)  # custody refusing broker publications, for all far sessions
        self.far_too_large = Spell(log)  # broker publications over the overlay's message limit

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        now = time.time()
        self.near.core.sessions, far_state = sessions_file.load(
            self.state_path, now, self.cfg.limits.persistent_client_expiration
        )
        for key, st in far_state.items():
            left = None  # seconds the session of a client that had left still has
            if not st.get("present", True) and isinstance(st.get("gone_at"), (int, float)):
                sx = session_expiry_s(st["params"])
                cap = self.cfg.limits.persistent_client_expiration
                if cap and (sx is None or sx > cap):  # as far_left caps it
                    sx = cap
                if sx is not None:
                    left = st["gone_at"] + sx - now
                    if left <= 0:
                        self.counters["far_sessions_expired"] += 1
                        log.info("far session %s expired while the gateway was down", key)
                        continue
            f = self.far[key] = FarSession(self, st["origin"], st["client"], st["broker"], st)
            if left is not None:
                f.expire_in(left)
        if self.cfg.bridge:
            self.bridge = BridgeSession(self, self.cfg.bridge)
            log.info(
                "bridging broker %s: out %s, in %s, peers %s",
                self.bridge.broker,
                self.cfg.bridge.out,
                self.cfg.bridge.in_,
                self.cfg.bridge.peers,
            )
        self.port.subscribe(s.APP, self.on_inbox)
        if self.cfg.listen:
            srv = await asyncio.start_server(lambda r, w: self.near.accept(r, w, self.cfg.broker), *self.cfg.listen)
            self._servers.append(srv)
            log.info("MQTT listener on %s:%d for broker %s:%d", *self.cfg.listen, *self.cfg.broker)
        if self.cfg.tproxy:
            from c2dtn.ip_gateway import tproxy

            tproxy.intercept("tcp", 1883, self.cfg.tproxy_port)
            self._tproxy = True
            sock = tproxy.transparent_socket(socket.SOCK_STREAM, ("0.0.0.0", self.cfg.tproxy_port))
            srv = await asyncio.start_server(
                lambda r, w: self.near.accept(r, w, w.get_extra_info("sockname")[:2]), sock=sock
            )
            self._servers.append(srv)
            log.info("intercepting MQTT (TCP 1883) crossing this box, TPROXY to port %d", self.cfg.tproxy_port)
        self.on_inbox()

    async def stop(self) -> None:
        if self._done:
            self._flush_done()
        for srv in self._servers:
            srv.close()
        self.near.close()
        for f in [*self.far.values(), *([self.bridge] if self.bridge else [])]:
            f.cancel()
        for f in [*self._ending.values(), *self.far.values()]:  # connections still closing end now
            f.abandon()
        self._ending.clear()
        if self._tproxy:
            from c2dtn.ip_gateway import tproxy

            tproxy.release("tcp", 1883)
        await self.sessions_saved()

    def save_sessions(self) -> None:
        """The session file, as the sessions are now, written (and fsynced) by a worker thread,
        not on the event loop; saves asked for while one is being written become one, of the
        newest state."""
        far = {
            k: {
                "origin": f.origin,
                "client": f.client,
                "broker": f.broker,
                "params": f.params,
                "subs": f.subs,
                "present": f.present,
                "gone_at": f.gone_at,
            }
            for k, f in self.far.items()
        }
        self._sessions_data = sessions_file.dump(self.near.core.sessions, far)
        if self._sessions_writer is None:
            self._sessions_writer = asyncio.get_running_loop().create_task(self._write_sessions())

    async def _write_sessions(self) -> None:
        try:
            while self._sessions_data is not None:
                data, self._sessions_data = self._sessions_data, None
                try:
                    await asyncio.to_thread(sessions_file.write, self.state_path, data)
                    self._sessions_failing.over("MQTT session file %s written again", self.state_path)
                except OSError as e:  # the next change writes the whole file again
                    self._sessions_failing.hit("MQTT session file %s not written: %s", self.state_path, e)
        finally:
            self._sessions_writer = None

    async def sessions_saved(self) -> None:
        """Return once the session file holds the sessions as of the last save_sessions()."""
        while self._sessions_writer is not None:
            await asyncio.shield(self._sessions_writer)

    # -- custody -------------------------------------------------------------
    def submit_many(self, items: list[Envelope], marks: list[Mark] | None = None) -> None:
        self.port.submit([(dst, body, life, prio, sup, s.APP) for dst, body, life, prio, sup in items], marks)

    def delivered(self, inbox_id: int | None) -> None:
        """Done with an envelope (the broker or client acknowledged it).  Consumption is
        durable (a power cut must not make the broker see it twice), so the ids done in
        one turn of the event loop share one commit."""
        if inbox_id is None:
            return
        if self._subscribing.pop(inbox_id, None) is not None:
            self._subs_changed.set()
            self._subs_changed = asyncio.Event()
        self._taken.add(inbox_id)  # not handed out again before the commit
        self._done.append(inbox_id)
        if len(self._done) == 1:
            asyncio.get_running_loop().call_soon(self._flush_done)

    def finished(self, d: Delivery | Part) -> None:
        """The far side is done with a delivery, or with a part of one (consumed with its last)."""
        if not isinstance(d, Part):
            self.delivered(d.id)
        elif d.finish():
            self.delivered(d.envelope)

    def release(self, inbox_ids) -> None:
        """Handed to a client that left without acking them: handed out again when it is back."""
        self._taken.difference_update(inbox_ids)

    def _flush_done(self) -> None:
        ids, self._done = self._done, []
        self.port.consumed(ids)
        self._taken.difference_update(ids)

    # -- envelopes from the other side ------------------------------------------
    def on_inbox(self, full: bool = False) -> None:
        """Hand out envelopes that arrived since the last call; `full` looks at all of them
        again (those kept for a client that was away, once it is back)."""
        cursor = 0 if full else self._mark
        if full:  # in inbox order again: what each session had kept goes before what came since
            for f in self._queues():
                f.deferring, f.deferred_from = False, None
        while True:
            batch = self.port.take(10_000, app=s.APP, after=cursor)
            if not batch:
                return
            cursor = batch[-1].id
            self._mark = max(self._mark, cursor)
            self._hand_out(batch)

    def _queues(self) -> list[FarSession]:
        return [*self.far.values(), *([self.bridge] if self.bridge else [])]

    def refill_soon(self, f: FarSession) -> None:
        """The session's queue has drained to half: what was kept in custody for it comes next."""
        if not f.refilling:
            f.refilling = True
            asyncio.get_running_loop().call_soon(self._refill, f)

    def _refill(self, f: FarSession) -> None:
        """Hand `f` what was kept for it, in order, from its first kept envelope on, until its
        queue is full again; other sessions' envelopes are passed over.  Only that stretch of
        the inbox is read: reading the whole inbox on every refill would make each half queue
        cost the whole backlog."""
        f.refilling = False
        if not f.deferring or not any(q is f for q in self._queues()):
            return
        cursor = (f.deferred_from or 1) - 1
        f.deferring, f.deferred_from = False, None
        while not f.deferring and cursor < self._mark:
            room = self.cfg.far_queue - f.queued() + 1
            batch = [d for d in self.port.take(max(64, room), app=s.APP, after=cursor) if d.id <= self._mark]
            if not batch:
                break
            cursor = batch[-1].id
            self._hand_out(batch, only=f)
        if not f.deferring:
            f.backlog.over("session %s: what waited in custody for its broker connection is all queued", f.key())

    def _hand_out(self, batch: list[Delivery], only: FarSession | None = None) -> None:
        for d in batch:
            if d.id in self._taken:
                continue
            if only is not None and only.deferring:
                return
            try:
                msg = s.unpack(d.body)
            except s.BodyError as e:
                self.counters["bad_bodies"] += 1
                log.warning("MQTT envelope %s:%d from %s dropped: %s", d.origin, d.seq, d.origin, e)
                self.delivered(d.id)
                continue
            if only is not None:
                if self._queue_of(d, msg) is not only:
                    continue
                if msg["op"] != "bpub" and msg["b"] != only.broker:  # the client moved on to another broker
                    self.rescan_soon()
                    return
            if msg["op"] == "msg":
                try:
                    evs = self.near.core.deliver(msg["c"], d.id, msg, d.created_ms, now_ms())
                except (ValueError, TypeError, KeyError, struct.error) as e:
                    self.counters["bad_bodies"] += 1
                    log.warning("publication %s:%d for %s dropped: %s", d.origin, d.seq, msg["c"], e)
                    self.delivered(d.id)
                    continue
                if evs is None:
                    if msg["c"] not in self.near.core.sessions:
                        self.counters["msg_no_session"] += 1
                        self.delivered(d.id)  # nobody will come for it
                    continue  # kept in custody until the client is back
                self._taken.add(d.id)
                self.near.run(evs)
                continue
            if msg["op"] == "bpub":
                if self.bridge is None or not self.bridge.accepts(msg["t"]):
                    self.counters["bridge_refused"] += 1
                    log.warning(
                        "bridged publication on %s from %s refused: %s",
                        short(msg["t"]),
                        d.origin,
                        "no bridge here" if self.bridge is None else "no `in` filter matches",
                    )
                    self.delivered(d.id)
                    continue
                if self._queue(self.bridge, d, {**msg, "op": "pub"}):
                    self.counters["bridged_in"] += 1
                continue
            f = self._far_session(d.origin, msg["c"], msg["b"])
            if f is None:
                self.counters["far_sessions_full"] += 1
                self._rescan = True
                continue  # kept in custody until a session ends
            self._queue(f, d, msg)

    def sub_written(self, inbox_id: int) -> None:
        """Its session wrote this SUBSCRIBE/UNSUBSCRIBE to the broker."""
        e = self._subscribing.get(inbox_id)
        if e is not None:
            e[3] = asyncio.get_running_loop().time()

    def _holds(self, e: list, inbox_id: int, i: int, broker: str, topic: str, now: float) -> bool:
        """Does subscription envelope `i` (entry `e`) hold back publish `inbox_id`?  Only one to
        the same broker, on a filter the topic matches, that its session takes up at once
        (written within SUB_HANDOUT_S of arriving: one queued behind its session's own backlog
        does not hold other sessions), for at most SUB_BARRIER_S from its writing."""
        broker_e, flts, handed, written = e
        if i >= inbox_id or broker_e != broker or not any(m.topic_matches(f, topic) for f in flts):
            return False
        return now - handed < SUB_HANDOUT_S if written is None else now - written < SUB_BARRIER_S

    async def subscribed_before(self, inbox_id: int, broker: str, topic: str) -> None:
        """Wait until the broker answered the subscriptions to it on `topic` that arrived
        before this publish, from any session (see _holds): a client that saw its SUBACK
        gets what another client published after it, as from the broker itself (the near
        side SUBACKs once the subscription is in custody, before it crossed)."""
        while not self.subscriptions_clear(inbox_id, broker, topic):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._subs_changed.wait(), min(SUB_HANDOUT_S, SUB_BARRIER_S))

    def subscriptions_clear(self, inbox_id: int, broker: str, topic: str) -> bool:
        """Does no subscription that arrived before this publish hold it now (see _holds)?  The
        far sessions ask this first, and wait in subscribed_before only when it says no."""
        if not self._subscribing:
            return True
        now = asyncio.get_running_loop().time()
        for i in [
            i
            for i, e in self._subscribing.items()  # those that can hold nothing any more
            if now - (e[2] if e[3] is None else e[3]) >= (SUB_HANDOUT_S if e[3] is None else SUB_BARRIER_S)
        ]:
            del self._subscribing[i]
        return not any(self._holds(e, inbox_id, i, broker, topic, now) for i, e in self._subscribing.items())

    def _queue_of(self, d: Delivery, msg: dict) -> FarSession | None:
        """The queue an envelope would go to, if it exists (none for the near side's)."""
        if msg["op"] == "msg":
            return None
        if msg["op"] == "bpub":
            return self.bridge
        return self.far.get(f"{d.origin}/{msg['c']}")

    def _queue(self, f: FarSession, d: Delivery, msg: dict) -> bool:
        """Into the session's queue, or (full, or already keeping some) left in custody,
        in order, until its queue has drained to half (the session asks then: refill_soon)."""
        if f.deferring or f.queued() >= self.cfg.far_queue:
            if not f.deferring:
                f.backlog.hit("session %s: %d messages queued for its broker connection; more wait in custody",
                              f.key(), f.queued())  # fmt: skip
                f.deferring, f.deferred_from = True, d.id
            self.counters["far_queue_full"] += 1
            return False
        self._taken.add(d.id)
        if msg["op"] in ("sub", "unsub"):
            flts = (
                [x[0] for x in msg.get("s", []) if isinstance(x, list) and x and isinstance(x[0], str)]
                if msg["op"] == "sub"
                else [f for f in msg.get("f", []) if isinstance(f, str)]
            )
            self._subscribing[d.id] = [msg["b"], flts, asyncio.get_running_loop().time(), None]
            while len(self._subscribing) > SUB_PENDING_MAX:
                del self._subscribing[next(iter(self._subscribing))]
        for item in Part.split(d, msg) if msg["op"] == "pubs" else [(d, msg)]:
            f.put(item)
        return True

    def _far_session(self, origin: str, client: str, broker: str) -> FarSession | None:
        """The broker session of an origin client (made when first needed; None if
        max_far_sessions are held and none can end)."""
        key = f"{origin}/{client}"
        f = self.far.get(key)
        if f is None or f.broker != broker:
            if f is not None:
                f.cancel()
            elif len(self.far) >= self.cfg.max_far_sessions or self._peer_sessions(origin) >= self._peer_share():
                if key not in self._full_logged:
                    self._full_logged.add(key)
                    log.warning(
                        "%d far sessions held, %d for %s (max_far_sessions %d, %d a peer): %s's messages "
                        "wait in custody",
                        len(self.far),
                        self._peer_sessions(origin),
                        origin,
                        self.cfg.max_far_sessions,
                        self._peer_share(),
                        key,
                    )
                return None
            old = self._ending.get(key)
            prev = self._recent.pop(key, None)  # its client's parameters, for what came after its session ended
            state = {"params": prev[1], "subs": {}, "present": False} if prev and prev[0] == broker else None
            f = self.far[key] = FarSession(
                self, origin, client, broker, state, closing_until=old and old.closing_until()
            )
        return f

    def _peer_share(self) -> int:
        """Far sessions one peer gateway's clients may hold: max_far_sessions shared among the
        peers this node has keys for, so that one peer's clients cannot take them all."""
        peers = self.port.peers() or [""]
        return max(1, self.cfg.max_far_sessions // len(peers))

    def _peer_sessions(self, origin: str) -> int:
        return sum(1 for k in self.far if k.startswith(origin + "/"))

    def far_changed(self, f: FarSession) -> None:
        self.save_sessions()

    def far_left(self, f: FarSession) -> None:
        """Its client disconnected: the session ends now or after its expiry interval."""
        sx = f.expiry_s()
        cap = self.cfg.limits.persistent_client_expiration
        if cap and (sx is None or sx > cap):  # no session outlives its client longer (docs/security.md)
            sx = cap
        if sx == 0:
            self._end_far(f, "ended with its client's disconnect")
        elif sx is not None:
            f.expire_in(sx)

    def far_closed(self, f: FarSession) -> None:
        """The connection of an ended session is closed at the broker: its successor may connect."""
        if self._ending.get(f.key()) is f:
            del self._ending[f.key()]
            new = self.far.get(f.key())
            if new is not None:
                new.closed()

    def far_abandon(self, f: FarSession) -> None:
        """`f` waited long enough for the connection its predecessor ended: reset that one."""
        old = self._ending.pop(f.key(), None)
        if old is not None:
            old.abandon()

    def far_expired(self, f: FarSession) -> None:
        self._end_far(f, "expired")

    def _end_far(self, f: FarSession, why: str) -> None:
        """Forget a session whose client is away and for which nothing waits (a conn queued
        behind its disconnect keeps it: the client came back)."""
        if self.far.get(f.key()) is not f or not f.idle():
            return
        del self.far[f.key()]
        f.cancel()
        if f.closing_until() is not None:  # a new session of this client opens after the broker closed it
            self._ending[f.key()] = f
        self._recent[f.key()] = (f.broker, dict(f.params))
        while len(self._recent) > self.cfg.max_far_sessions:
            del self._recent[next(iter(self._recent))]
        self.counters["far_sessions_ended"] += 1
        log.info("far session %s %s", f.key(), why)
        self.save_sessions()
        if self._rescan:
            self.rescan_soon()

    def rescan_soon(self) -> None:
        """Look at the whole inbox again in a moment: room freed for what was kept."""
        self._rescan = False
        asyncio.get_running_loop().call_soon(self.on_inbox, True)

    def status(self) -> dict:
        return {
            **self.near.core.status(),
            "sessions_far": {
                k: {
                    "broker": f.broker,
                    "connected": f.connected(),
                    "subs": sorted(f.subs),
                    "queued": f.queued(),
                    "present": f.present,
                    "waiting_in_custody": f.deferring,
                }
                for k, f in self.far.items()
            },
            "bridge": None
            if self.bridge is None
            else {
                "broker": self.bridge.broker,
                "connected": self.bridge.connected(),
                "out": self.cfg.bridge.out,
                "in": self.cfg.bridge.in_,
                "peers": self.cfg.bridge.peers,
                "queued": self.bridge.queued(),
            },
            "counters": dict(self.counters + self.near.core.counters),
        }
