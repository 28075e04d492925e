"""The CoAP gateway (shell), inside the overlay node process beside the MQTT gateway: UDP
sockets for the clients (the explicit listener; under TPROXY a transparent socket that reads
each datagram's original destination, and per server a transparent socket bound to that
server's address to answer from it) over the I/O-free coap_core.NearCoap, and the far
side's CoAP client (aiocoap) that replays requests to their server.

Near side: a request's envelope is committed to custody before its empty ACK goes; the
response envelope, when it comes, is sent to the client and consumed once the client
ACKed it (or gave up).  Far side: the I/O-free coap_far_core.FarCoap decides what to ask the
server, when to ask again, what goes back and when a request's envelope is consumed (its
rules are in its docstring); this shell asks with aiocoap and puts the answers in custody.
A registration's envelope stays unconsumed in the inbox while its observation lives, so a
far gateway that restarts registers again.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import OrderedDict

from c2dtn.ip_gateway import coap_core as cc
from c2dtn.ip_gateway import coap_far_core as fc
from c2dtn.ip_gateway import tproxy
from c2dtn.ip_gateway.policy import GatewayConfig
from c2dtn.overlay.port import Delivery, Port, QuotaExceeded, TooLarge, now_ms

log = logging.getLogger("c2dtn.gateway.coap")

MAX_SPOOF_SOCKETS = 256  # servers answered for under TPROXY with a socket kept open
DROP_LOG_EVERY_S = 10.0  # dropped datagrams: at most one log line per source per this long


class _Listener(asyncio.DatagramProtocol):
    """The explicit listener: clients send to `via` and mean `server`."""

    def __init__(self, gw: "CoapGateway", server: cc.Addr, via: cc.Addr):
        self.gw, self.server, self.via = gw, server, via
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.gw.datagram(data, (addr[0], addr[1]), self.server, self.via)

    def error_received(self, exc) -> None:
        log.debug("CoAP socket: %s", exc)


class _Interceptor:
    """The TPROXY socket: datagrams to any server's UDP 5683 routed through this box, each
    with its original destination (asyncio's datagram transport drops ancillary data, so
    this reads with recvmsg itself)."""

    def __init__(self, gw: "CoapGateway", port: int):
        self.gw = gw
        self.sock = tproxy.transparent_socket(socket.SOCK_DGRAM, ("0.0.0.0", port), orig_dst=True)
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        for _ in range(256):  # then let the loop run others
            try:
                data, anc, _flags, addr = self.sock.recvmsg(65536, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # an ICMP error queued on the socket: nothing to read
                log.debug("CoAP TPROXY socket: %s", e)
                return
            dst = tproxy.orig_dst(anc)
            if dst is None:
                self.gw.near.counters["no_original_destination"] += 1
                continue
            self.gw.datagram(data, (addr[0], addr[1]), dst, dst)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()


class CoapGateway:
    name = "coap"

    def __init__(self, port: Port, cfg: GatewayConfig):
        self.port, self.cfg, self.ccfg = port, cfg, cfg.coap
        self.near = cc.NearCoap(self.ccfg.resources, cfg.policy.gateway_for)
        self.listeners: dict[cc.Addr, _Listener] = {}  # by the address clients send to
        self._spoof: OrderedDict[cc.Addr, socket.socket] = OrderedDict()  # TPROXY: answer as these servers
        self._drops: OrderedDict[str, tuple[float, int]] = OrderedDict()  # source -> last logged, not logged since
        self._interceptor: _Interceptor | None = None
        self._taken: set[int] = set()
        self._mark = 0
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.far = fc.FarCoap(self.near.counters)
        self._client = None  # aiocoap client context, made on the first replay
        self._asks: dict[int, asyncio.Task] = {}  # the far side's requests out, by exchange

    async def start(self) -> None:
        self.port.subscribe(cc.APP, self.on_inbox)
        if self.ccfg.listen:
            loop = asyncio.get_running_loop()
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            # shared with the TPROXY sockets bound to servers' addresses on the same port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self.ccfg.listen)
            _, proto = await loop.create_datagram_endpoint(
                lambda: _Listener(self, self.ccfg.server, self.ccfg.listen), sock=sock
            )
            self.listeners[self.ccfg.listen] = proto
            log.info(
                "CoAP listener on %s:%d for %s",
                *self.ccfg.listen,
                "server %s:%d" % self.ccfg.server if self.ccfg.server else "forward-proxy requests only",
            )
        if self.ccfg.tproxy:
            self._interceptor = _Interceptor(self, self.ccfg.tproxy_port)
            # only to servers a route names: the rest (a server on this side) is routed as before
            nets = [str(net) for net, _ in self.cfg.policy.routes if net.version == 4]
            tproxy.intercept("udp", 5683, self.ccfg.tproxy_port, nets)
            if not nets:
                log.warning("[gateway.coap] tproxy = true but no [[gateway.route]]: no CoAP is intercepted")
            log.info(
                "intercepting CoAP (UDP 5683) crossing this box to %s, TPROXY to port %d",
                ", ".join(nets) or "nothing",
                self.ccfg.tproxy_port,
            )
        self.on_inbox()

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for lst in self.listeners.values():
            if lst.transport:
                lst.transport.close()
        if self._interceptor:
            tproxy.release("udp", 5683)
            self._interceptor.close()
        for sock in self._spoof.values():
            sock.close()
        if self._timer:
            self._timer.cancel()
        if self._client is not None:
            await self._client.shutdown()

    # -- near side --------------------------------------------------------------------
    def datagram(self, data: bytes, client: cc.Addr, server: cc.Addr, via: cc.Addr) -> None:
        try:
            self.run(self.near.datagram(data, client, server, now_ms(), via))
        except Exception:  # a daemon never dies of what a client sent: log it and carry on
            log.exception("CoAP datagram from %s:%d", *client)

    def _send(self, a: cc.Reply) -> None:
        lst = self.listeners.get(a.via)
        if lst is not None and lst.transport is not None:
            lst.transport.sendto(a.data, a.client)
            return
        if not self.ccfg.tproxy:
            self.near.counters["no_listener"] += 1
            log.warning("no socket answers for %s:%d: reply to %s:%d dropped", *a.via, *a.client)
            return
        try:
            sock = self._spoof.pop(a.via, None) or tproxy.transparent_socket(socket.SOCK_DGRAM, a.via)
            self._spoof[a.via] = sock
            if len(self._spoof) > MAX_SPOOF_SOCKETS:
                self._spoof.popitem(last=False)[1].close()
            sock.sendto(a.data, a.client)
        except OSError as e:  # lost like a datagram on the wire: retransmissions cover it
            self.near.counters["send_errors"] += 1
            log.warning("CoAP reply to %s:%d from %s:%d not sent: %s", *a.client, *a.via, e)

    def run(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, cc.Reply):
                self._send(a)
            elif isinstance(a, cc.Submit):
                self._submit(a)
            elif isinstance(a, cc.Consume):
                self._consume(a.inbox_id)
            elif isinstance(a, cc.Drop):
                self._log_drop(a)
        self._arm()

    def _log_drop(self, a: cc.Drop) -> None:
        """One line per source per DROP_LOG_EVERY_S (a flood does not flood the log; the
        counters have every datagram), saying how many it left out since the last."""
        now = time.monotonic()
        last, quiet = self._drops.pop(a.source, (float("-inf"), 0))
        if now - last < DROP_LOG_EVERY_S:
            self._drops[a.source] = (last, quiet + 1)
            return
        log.warning(
            "%s%s", a.why, f" ({quiet} more from {a.source} not logged in the last {now - last:.0f} s)" if quiet else ""
        )
        self._drops[a.source] = (now, 0)
        if len(self._drops) > 4096:
            self._drops.popitem(last=False)

    def _submit(self, a: cc.Submit) -> None:
        try:
            seq = self.port.submit([(a.dst, a.body, a.lifetime_ms, a.priority, None, cc.APP)], [a.mark])[0]
        except QuotaExceeded as e:
            if a.key is None:  # a cancel: the far side's observation ends with the request's lifetime
                log.warning("CoAP observation cancel not kept: %s", e)
                return
            self.near.exchanges.pop(a.key, None)
            self.near.counters["refused_quota"] += 1
            log.warning("CoAP request from %s:%d refused: %s", *a.key[0], e)
            return  # no ACK: the client retransmits, and may find room then
        if self.port.commit_mark() is not None:
            self._start(self._committed_when_synced(a, seq is not None))  # the ACK once it is on disk
            return
        self.run(self.near.committed(a.key, seq is not None, a.then, now_ms()))

    async def _committed_when_synced(self, a: cc.Submit, took: bool) -> None:
        try:
            await self.port.durable()
        except OSError:  # logged by the syncer: no ACK, the client retransmits and is answered then
            self.near.exchanges.pop(a.key, None)
            return
        self.run(self.near.committed(a.key, took, a.then, now_ms()))

    def _consume(self, inbox_id: int) -> None:
        self.port.consumed([inbox_id])
        self._taken.discard(inbox_id)

    def _start(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def _arm(self) -> None:
        at = min(
            (a for a in (self.near.next_deadline_ms(), self.far.next_deadline_ms()) if a is not None), default=None
        )
        if self._timer:
            self._timer.cancel()
            self._timer = None
        if at is not None:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, (at - now_ms()) / 1000), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.run(self.near.poll(now_ms()))
        self._far(self.far.tick(now_ms()))

    # -- envelopes from the other side --------------------------------------------------
    def on_inbox(self) -> None:
        while True:
            batch = self.port.take(10_000, app=cc.APP, after=self._mark)
            if not batch:
                break
            self._mark = batch[-1].id
            for d in batch:
                if d.id not in self._taken:
                    self._hand_out(d)
        self._arm()

    def _hand_out(self, d: Delivery) -> None:
        try:
            body = cc.unpack(d.body)
            if body["op"] == "rsp":
                actions = self.near.response(d.id, body, now_ms(), d.origin, d.created_ms)
                self._taken.add(d.id)
                self.run(actions)
                return
            events = self.far.envelope(d, body, now_ms())
        except (ValueError, cc.CoapError) as e:
            self.near.counters["bad_bodies"] += 1
            log.warning("CoAP envelope %s:%d dropped: %s", d.origin, d.seq, e)
            self._consume(d.id)
            return
        self._taken.add(d.id)
        self._far(events)

    # -- far side: what FarCoap says --------------------------------------------------------
    def _far(self, events: list) -> None:
        for e in events:
            if isinstance(e, fc.Ask):
                self._asks[e.xid] = self._start(self._ask(e))
            elif isinstance(e, fc.Stop):
                task = self._asks.pop(e.xid, None)
                if task is not None:
                    task.cancel()
            elif isinstance(e, fc.Answer):
                self._far(self.far.kept(e.xid, self._keep(e), now_ms()))
            elif isinstance(e, fc.Consume):
                self._consume(e.inbox_id)
        self._arm()

    def _keep(self, a: fc.Answer) -> str:
        """An answer into custody: "ok", "full", or why it can never cross."""
        try:
            self.port.submit([(a.origin, a.body, a.lifetime_ms, a.priority, a.supersede, cc.APP)])
        except TooLarge as e:
            return str(e)
        except QuotaExceeded:
            return "full"
        return "ok"

    async def _ask(self, a: fc.Ask) -> None:
        """Ask the server once (an observation: register, and report every notification); the
        core hears the answer or why there was none."""
        import aiocoap

        try:
            if self._client is None:
                self._client = await aiocoap.Context.create_client_context()
            msg = cc.strip(a.request)
            if a.observe:
                msg.opt.observe = 0
            msg.unresolved_remote = a.server
            pr = self._client.request(msg)
            try:
                first = await asyncio.wait_for(pr.response, a.timeout_s)
                self._far(self.far.answered(a.xid, first, now_ms()))
                if a.observe and first.opt.observe is not None and first.code.is_successful():
                    async for n in pr.observation:
                        self._far(self.far.answered(a.xid, n, now_ms()))
                    self._far(self.far.failed(a.xid, "ended by the server", now_ms()))
            finally:
                if a.observe and not pr.observation.cancelled:
                    pr.observation.cancel()
        except (aiocoap.error.Error, OSError, asyncio.TimeoutError) as e:
            self._far(self.far.failed(a.xid, type(e).__name__, now_ms()))
        except Exception as e:  # aiocoap refusing what a peer sent: the core retries, then 5.04
            log.warning("CoAP request to %s failed: %r", a.server, e)
            self._far(self.far.failed(a.xid, type(e).__name__, now_ms()))
        finally:
            if self._asks.get(a.xid) is asyncio.current_task():
                del self._asks[a.xid]

    def status(self) -> dict:
        far = self.far.status()
        return {
            "counters": dict(self.near.counters),
            "pending_responses": len(self.near.pending),
            "replaying": far["replaying"] + far["waiting"],
            "observing": far["observing"],
        }
