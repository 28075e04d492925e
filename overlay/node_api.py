"""The node's local HTTP API on a Unix socket in its storage folder (reachable from any network
namespace): POST /send, GET /recv, POST /consumed, GET /status.  GET /recv answers JSON (bodies
in base64), or CBOR (bodies as byte strings) to a client that sends Accept: application/cbor.
Parameters are checked by overlay/api.py (I/O-free); this file is the aiohttp shell."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from typing import TYPE_CHECKING

import cbor2
from aiohttp import web

from c2dtn.overlay import api
from c2dtn.overlay.agent import AgentError
from c2dtn.overlay.custody import QuotaExceeded
from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES, Priority
from c2dtn.overlay.port import now_ms
from c2dtn.overlay.store import TooLarge

if TYPE_CHECKING:
    from c2dtn.overlay.node import OverlayNode
    from c2dtn.overlay.supervisor import Supervisor


def _error(why: str, status: int) -> web.Response:
    return web.json_response({"error": why}, status=status)


class LocalApi:
    def __init__(self, node: OverlayNode, sup: Supervisor | None = None):
        self.node, self.sup = node, sup
        self.runner: web.AppRunner | None = None

    async def serve(self) -> None:
        app = web.Application(client_max_size=MAX_MESSAGE_BYTES)  # larger: 413 before anything is read
        app.add_routes(
            [
                web.post("/send", self.send),
                web.get("/recv", self.recv),
                web.post("/consumed", self.consumed),
                web.get("/status", self.status),
            ]
        )
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        cfg = self.node.cfg
        sock = cfg.api_socket
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        await web.UnixSite(self.runner, str(sock)).start()
        # owner and the api_group only (connecting needs write permission); created 0755 by
        # the umask, so nobody else could connect in the moment before this
        if cfg.api_gid is not None:
            os.chown(sock, -1, cfg.api_gid)
            # the group may pass through the storage folder to the socket, not list or read it
            os.chown(cfg.storage, -1, cfg.api_gid)
            os.chmod(cfg.storage, 0o710)
        os.chmod(sock, 0o660)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def send(self, req: web.Request) -> web.Response:
        node = self.node
        if node.core is None:
            return _error(f"node {node.cfg.id} runs no overlay (overlay = false)", 400)
        try:
            a = api.parse_send(req.query)
        except api.ApiError as e:
            return _error(str(e), 400)
        try:
            body = await req.read()
        except web.HTTPRequestEntityTooLarge:
            size = req.content_length or f"more than {MAX_MESSAGE_BYTES}"
            return _error(f"a message of {size} bytes is over the overlay's limit of {MAX_MESSAGE_BYTES} bytes", 413)
        try:
            seq, handovers = node.submit_now(a.dst, body, a.lifetime_ms, a.priority, a.supersede, a.app)
            for h in handovers:
                # planned at once (flash, immediate): the answer follows the bundle's hand-over to
                # the agent (and its fsync, before or after it), so that an fsync on the loop, or
                # the answer's writing, never comes between (decision 0006)
                await asyncio.shield(h)
            await node.synced()
        except QuotaExceeded as e:
            return _error(str(e), 507)
        except TooLarge as e:
            return _error(str(e), 413)
        except ValueError as e:
            return _error(str(e), 400)
        except OSError as e:
            return _error(f"custody fsync failed: {e}", 500)
        return web.json_response({"seq": seq, "origin": node.cfg.id})

    async def recv(self, req: web.Request) -> web.Response:
        node = self.node
        if node.core is None:
            return _error("no overlay", 400)
        try:
            wait, app, limit = api.parse_recv(req.query)
        except api.ApiError as e:
            return _error(str(e), 400)
        deadline = time.monotonic() + wait
        while True:
            items = node.core.take(limit, app, exclude=node.app_handlers if app is None else ())
            if items or time.monotonic() >= deadline:
                break
            node.inbox_event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                    await node.inbox_event.wait()
        out = [
            {
                "id": d.id,
                "origin": d.origin,
                "seq": d.seq,
                "priority": d.priority.name.lower(),
                "created_ms": d.created_ms,
                "received_ms": d.received_ms,
                "supersede": d.supersede,
                "app": d.app,
                "body": d.body,
            }
            for d in items
        ]
        if "application/cbor" in req.headers.get("Accept", ""):
            # the same list in CBOR, bodies as byte strings: for a megabyte body, base64 in JSON
            # costs several milliseconds here and as much again in the application
            return web.Response(body=cbor2.dumps(out), content_type="application/cbor")
        for d in out:
            d["body"] = base64.b64encode(d["body"]).decode()
        return web.json_response(out)

    async def consumed(self, req: web.Request) -> web.Response:
        try:
            ids = api.parse_consumed(await req.read())
        except api.ApiError as e:
            return _error(str(e), 400)
        self.node.consumed(ids)
        try:
            await self.node.synced()
        except OSError as e:
            return _error(f"custody fsync failed: {e}", 500)
        return web.json_response({"ok": len(ids)})

    async def status(self, req: web.Request) -> web.Response:
        return web.json_response(await status(self.node, self.sup))


async def status(node: OverlayNode, sup: Supervisor | None) -> dict:
    """What `c2dtn node status` and `c2dtn gateway status` show: local_status and the agent's
    peers and store."""
    st = local_status(node, sup)
    try:
        st["peers"] = [p.__dict__ for p in await node.agent.peers()]
        st["agent_stored"] = await node.agent.stored()
    except AgentError as e:
        st["agent_error"] = str(e)
    return st


def local_status(node: OverlayNode, sup: Supervisor | None) -> dict:
    """Everything status shows but what the agent is asked: read from memory, at once (the
    metrics endpoint serves these, overlay/metrics.py)."""
    syncer = node.syncer
    proc = sup.proc if sup is not None else None
    st: dict = {
        "node": node.cfg.id,
        "agent": node.cfg.agent,
        "agent_pid": proc.pid if proc else None,
        "agent_up": proc is not None and proc.returncode is None if sup is not None else None,
        "agent_restarts": sup.restarts if sup is not None else 0,
        "uptime_s": (now_ms() - node.started_ms) / 1000,
        "send_errors": node.send_errors,
        "bundles": dict(node.bundles),
    }
    if node.udphc is not None:
        st["udphc"] = dict(node.udphc)
    if syncer is not None:
        st["fsync"] = {
            "fsyncs": syncer.fsyncs,
            "commits": syncer.store.commits,
            "failures": syncer.failures,
            "max_ms": round(syncer.fsync_ms_max, 1),
            "on_loop": syncer.inline_fsyncs,
            "on_loop_now": syncer.inline,
        }
    if node.core is not None:
        store, sched = node.core.store, node.core.sched
        st["counters"] = store.counters()
        n, nbytes = store.held_out()
        st["custody"] = {
            "envelopes": n,
            "bytes": nbytes,
            "max_envelopes": store.quota.max_envelopes,
            "max_bytes": store.quota.max_bytes,
        }
        st["queues"] = [
            {"dst": d, "priority": Priority(p).name.lower(), "queued": q, "in_flight": f, "bytes": b}
            for d, p, q, f, b in store.queue_summary()
        ]
        rows: dict[tuple[str, int], dict] = {}
        resent = []
        for (event, peer, prio), k in sorted(store.tally.items()):
            cls = Priority(prio).name.lower()
            if event.startswith("resent_"):  # sent again: "timeout", "fast" (an ack showed it lost), "probe", "copy"
                resent.append({"dst": peer, "priority": cls, "cause": event.removeprefix("resent_"), "envelopes": k})
            else:
                rows.setdefault((peer, prio), {"peer": peer, "priority": cls})[event] = k
        st["envelopes"] = list(rows.values())  # since this process started, per peer and class
        st["resent"] = resent
        st["received_delay_s"] = store.delays.snapshot()  # creation at the origin to here
        st["windows"] = {
            d: {
                "window": int(p.window),
                "ssthresh": int(p.ssthresh),
                "srtt_ms": p.srtt_ms,
                "min_rtt_ms": p.min_rtt_ms,
                "rto_ms": int(p.rto_ms),
            }
            for d, p in sched.paths.items()
        }
        st["inbox"] = store.inbox_count()  # (not len(inbox()): that read every body, files included)
    for ext in node.extensions:
        if hasattr(ext, "status"):
            st[getattr(ext, "name", "extension")] = ext.status()
    return st
