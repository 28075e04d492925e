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
import logging
import socket
import struct
import time
from collections import Counter

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import sessions_file
from c2dtn.ip_gateway.bridge import BridgeSession
from c2dtn.ip_gateway.far import FarSession
from c2dtn.ip_gateway.near import NearSide
from c2dtn.ip_gateway.near_core import Envelope
from c2dtn.ip_gateway.policy import GatewayConfig
from c2dtn.overlay.store import Delivery
from c2dtn.overlay.node import now_ms

log = logging.getLogger("c2dtn.gateway")


class MqttGateway:
    name = "mqtt"

    def __init__(self, node, cfg: GatewayConfig):
        self.node, self.cfg = node, cfg
        self.core = node.core
        self.counters: Counter[str] = Counter()
        self.near = NearSide(self)
        self.far: dict[str, FarSession] = {}
        self._taken: set[int] = set()
        self._done: list[int] = []
        self._mark = 0  # inbox ids up to here have been handed out (or kept for an absent client)
        self.state_path = node.cfg.storage / "mqtt-sessions.cbor"
        self._servers: list[asyncio.AbstractServer] = []
        self._tproxy = None
        self.bridge: BridgeSession | None = None

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        self.near.core.sessions, far_state = sessions_file.load(self.state_path, time.time())
        for key, st in far_state.items():
            self.far[key] = FarSession(self, st["origin"], st["client"], st["broker"], st)
        if self.cfg.bridge:
            self.bridge = BridgeSession(self, self.cfg.bridge)
            log.info("bridging broker %s: out %s, in %s, peers %s", self.bridge.broker, self.cfg.bridge.out,
                     self.cfg.bridge.in_, self.cfg.bridge.peers)
        self.node.app_handlers[s.APP] = self.on_inbox
        if self.cfg.listen:
            srv = await asyncio.start_server(lambda r, w: self.near.accept(r, w, self.cfg.broker), *self.cfg.listen)
            self._servers.append(srv)
            log.info("MQTT listener on %s:%d for broker %s:%d", *self.cfg.listen, *self.cfg.broker)
        if self.cfg.tproxy:
            from c2dtn.ip_gateway import tproxy

            tproxy.intercept("tcp", 1883, self.cfg.tproxy_port)
            self._tproxy = True
            sock = tproxy.transparent_socket(socket.SOCK_STREAM, ("0.0.0.0", self.cfg.tproxy_port))
            srv = await asyncio.start_server(lambda r, w: self.near.accept(r, w, w.get_extra_info("sockname")[:2]),
                                             sock=sock)
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
        if self._tproxy:
            from c2dtn.ip_gateway import tproxy

            tproxy.release("tcp", 1883)

    def save_sessions(self) -> None:
        far = {k: {"origin": f.origin, "client": f.client, "broker": f.broker, "params": f.params,
                   "subs": f.subs, "present": f.present} for k, f in self.far.items()}
        sessions_file.save(self.state_path, self.near.core.sessions, far)

    # -- custody -------------------------------------------------------------
    def submit_many(self, items: list[Envelope],
                    marks: list[tuple[str, bytes, bool] | None] | None = None) -> None:
        now = now_ms()
        self.core.store.submit_many([(dst, body, life, prio, sup, s.APP) for dst, body, life, prio, sup in items], now,
                                    marks)
        if items:
            self.node.submitted(min(prio for _dst, _body, _life, prio, _sup in items))

    def delivered(self, inbox_id: int | None) -> None:
        """Done with an envelope (the broker or client acknowledged it).  Consumption is
        durable (a power cut must not make the broker see it twice), so the ids done in
        one turn of the event loop share one commit."""
        if inbox_id is None:
            return
        self._taken.add(inbox_id)  # not handed out again before the commit
        self._done.append(inbox_id)
        if len(self._done) == 1:
            asyncio.get_running_loop().call_soon(self._flush_done)

    def release(self, inbox_ids) -> None:
        """Handed to a client that left without acking them: handed out again when it is back."""
        self._taken.difference_update(inbox_ids)

    def _flush_done(self) -> None:
        ids, self._done = self._done, []
        self.core.consumed(ids)
        self._taken.difference_update(ids)
        self.node.wake()

    # -- envelopes from the other side ------------------------------------------
    def on_inbox(self, full: bool = False) -> None:
        """Hand out envelopes that arrived since the last call; `full` looks at all of them
        again (those kept for a client that was away, once it is back)."""
        cursor = 0 if full else self._mark
        while True:
            batch = self.core.take(10_000, app=s.APP, after=cursor)
            if not batch:
                return
            cursor = batch[-1].id
            self._mark = max(self._mark, cursor)
            self._hand_out(batch)

    def _hand_out(self, batch: list[Delivery]) -> None:
        for d in batch:
            if d.id in self._taken:
                continue
            try:
                msg = s.unpack(d.body)
            except s.BodyError as e:
                self.counters["bad_bodies"] += 1
                log.warning("MQTT envelope %s:%d from %s dropped: %s", d.origin, d.seq, d.origin, e)
                self.delivered(d.id)
                continue
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
                    log.warning("bridged publication on %r from %s refused: %s", msg["t"], d.origin,
                                "no bridge here" if self.bridge is None else "no `in` filter matches")
                    self.delivered(d.id)
                    continue
                self._taken.add(d.id)
                self.counters["bridged_in"] += 1
                self.bridge.queue.put_nowait((d, {**msg, "op": "pub"}))
                continue
            self._taken.add(d.id)
            f = self._far_session(d.origin, msg["c"], msg["b"])
            f.queue.put_nowait((d, msg))

    def _far_session(self, origin: str, client: str, broker: str) -> FarSession:
        key = f"{origin}/{client}"
        f = self.far.get(key)
        if f is None or f.broker != broker:
            if f is not None:
                f.cancel()
            f = self.far[key] = FarSession(self, origin, client, broker)
        return f

    def far_changed(self, f: FarSession) -> None:
        self.save_sessions()

    def status(self) -> dict:
        return {**self.near.core.status(),
                "sessions_far": {k: {"broker": f.broker, "connected": f.writer is not None, "subs": sorted(f.subs),
                                     "queued": f.queue.qsize()} for k, f in self.far.items()},
                "bridge": None if self.bridge is None else {
                    "broker": self.bridge.broker, "connected": self.bridge.writer is not None,
                    "out": self.cfg.bridge.out, "in": self.cfg.bridge.in_, "peers": self.cfg.bridge.peers,
                    "queued": self.bridge.queue.qsize()},
                "counters": dict(self.counters + self.near.core.counters)}
