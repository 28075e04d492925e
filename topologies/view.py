"""The drill view (`c2dtn topo view`, `perf bft --view`): one page on the host showing the
testbed's topology with each link's state, profile and bytes a second, each overlay node's
custody queues per peer and class, and during `perf bft` each unit's age of information at
each receiver, live; a drill lead takes a link down or up or changes its profile from it.

`snapshot` and `aoi` are I/O-free (states and times in, the page's JSON out); `DrillView` is
the aiohttp shell: GET / (the page, topologies/data/view.html), GET /state, GET /events
(server-sent events, one snapshot a second), POST /link.  The page has no build step and no
library: SVG and a table, drawn by its own script."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger("c2dtn.view")

SNAPSHOT_EVERY_S = 1.0
HEADER = "X-C2-Drill"  # a POST must carry it: a page of another origin cannot without a preflight we never answer


def link_rows(st: dict[str, Any], prev: dict[str, tuple[float, int, int]], now: float) -> list[dict]:
    """A row per link: its ends, state, profiles and bytes a second each way since `prev`
    (link -> (time, bytes a->b, bytes b->a), updated in place)."""
    rows = []
    for name, ls in st["links"].items():
        live = ls.get("live") or {}
        ab = (live.get("ab") or {}).get("delivered_bytes", 0)
        ba = (live.get("ba") or {}).get("delivered_bytes", 0)
        t0, ab0, ba0 = prev.get(name, (now, ab, ba))
        dt = now - t0
        rows.append(
            {
                "name": name,
                "a": ls["a"],
                "b": ls["b"],
                "state": ls.get("state", "up"),
                "emulated": bool(ls.get("emulate")),
                "profile_ab": (ls.get("profile_ab") or {}).get("name", "lan"),
                "profile_ba": (ls.get("profile_ba") or {}).get("name", "lan"),
                "ab_Bps": round((ab - ab0) / dt, 1) if dt > 0 and ab >= ab0 else 0.0,
                "ba_Bps": round((ba - ba0) / dt, 1) if dt > 0 and ba >= ba0 else 0.0,
            }
        )
        prev[name] = (now, ab, ba)
    return rows


def aoi(events: list[dict], now: float, mode: str | None = None) -> dict:
    """Each unit's age of information at each receiver: now minus the creation time of the
    newest of its reports that receiver has (None: none yet)."""
    newest: dict[str, dict[str, float]] = {}
    units: set[str] = set()
    for e in list(events):  # (appended to by reader threads meanwhile)
        if mode is not None and e.get("mode") != mode:
            continue
        if e.get("ev") == "sent" and "unit" in e:
            units.add(e["unit"])
        elif e.get("ev") == "recv" and "id" in e and "ts" in e:
            unit = str(e["id"]).rsplit("_", 1)[0]
            units.add(unit)
            row = newest.setdefault(unit, {})
            row[e["rx"]] = max(row.get(e["rx"], 0.0), float(e["ts"]))
    receivers = sorted({rx for row in newest.values() for rx in row})
    return {
        "mode": mode,
        "receivers": receivers,
        "units": [
            {
                "unit": u,
                "aoi_s": {rx: round(now - newest[u][rx], 1) if rx in newest.get(u, {}) else None for rx in receivers},
            }
            for u in sorted(units)
        ],
    }


def orders(events: list[dict], now: float, mode: str | None = None, last: int = 40) -> dict:
    """The newest `last` orders sent: each one's delay to its first receipt, or how long it
    has waited so far."""
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    for e in list(events):
        if mode is not None and e.get("mode") != mode:
            continue
        if e.get("ev") == "sent" and "id" in e:
            sent.setdefault(str(e["id"]), float(e["t"]))
        elif e.get("ev") == "recv" and "id" in e and str(e["id"]) not in first:
            first[str(e["id"])] = float(e["t"])
    newest = sorted(sent.items(), key=lambda kv: kv[1])[-last:]
    return {
        "mode": mode,
        "orders": [
            {"id": i, "delay_s": round(first[i] - t, 2) if i in first else None, "waiting_s": round(now - t, 1)}
            for i, t in newest
        ],
    }


class Live:
    """The drill view of a campaign run (`perf bft --view`, `perf orders --view`): started on
    127.0.0.1:port in a thread of its own; the run says which mode, events and nodes to show."""

    def __init__(self, port: int, campaign: str, period: float | None = None):
        self.campaign, self.period = campaign, period
        self.mode: str | None = None
        self.events: list[dict] | None = None
        self.view = DrillView("127.0.0.1", port, drill=self.drill)
        self.loop = asyncio.new_event_loop()

    def drill(self) -> dict | None:
        if self.events is None:
            return None
        now = time.time()
        d: dict[str, Any] = {"campaign": self.campaign, "period": self.period}
        if self.campaign == "orders":
            d["orders"] = orders(self.events, now, self.mode)
        else:
            d["aoi"] = aoi(self.events, now, self.mode)
        return d

    def follow(self, mode: str, events: list[dict], node_configs: dict[str, Path]) -> None:
        """From now on, this mode's events (appended to as they come) and these nodes."""
        self.view.node_configs = dict(node_configs)
        self.mode, self.events = mode, events

    def start(self) -> None:
        import threading

        threading.Thread(target=self.loop.run_forever, daemon=True, name="c2-view").start()
        asyncio.run_coroutine_threadsafe(self.view.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.view.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def snapshot(
    st: dict[str, Any] | None,
    prev: dict,
    now: float,
    nodes: dict[str, dict],
    drill: dict | None,
    wall: float,
    profiles: list[str] | None = None,
) -> dict:
    """What the page shows: the topology (None when nothing is up), the nodes' queues, the drill."""
    out: dict[str, Any] = {
        "at": wall,
        "topology": None,
        "links": [],
        "nodes": [],
        "gateways": {},
        "drill": drill,
        "profiles": profiles or [],
    }
    if st is not None:
        out["topology"] = st["topology"]
        out["nodes"] = [{"name": n, "role": v.get("role", "")} for n, v in st["nodes"].items()]
        out["links"] = link_rows(st, prev, now)
    for name, s in sorted(nodes.items()):
        if "error" in s:
            out["gateways"][name] = {"error": s["error"]}
            continue
        out["gateways"][name] = {
            "overlay": "queues" in s,  # (a relay runs its agent alone)
            "queues": s.get("queues", []),
            "custody": s.get("custody"),
            "clients": len((s.get("mqtt") or {}).get("clients", [])),
        }
    return out


MAX_REQUESTS = 32  # requests and event streams open at once; more are answered 503
NODE_TIMEOUT_S = 2.0  # for all the nodes' status together, each snapshot


class DrillView:
    """The page and its feeds on (host, port), a loopback address.  node_configs: node id ->
    config path of the overlay nodes to show queues of; drill: the live state of a campaign
    (perf bft, perf orders), or None.

    One task makes a snapshot a second, whoever is watching (and at once after a change); a
    node that does not answer is shown as such, and asked again only once its last question
    has ended, so a stuck node costs one thread, not one a second.  Every request must name
    this host as 127.0.0.1, localhost or [::1] (a page of another site rebound to this address
    names its own), a change must come from this page's origin with its header, and at most
    MAX_REQUESTS are open at once."""

    def __init__(
        self,
        host: str,
        port: int,
        node_configs: dict[str, Path] | None = None,
        drill: Callable[[], dict | None] | None = None,
    ):
        import ipaddress
        from concurrent.futures import ThreadPoolExecutor

        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the drill view serves on a loopback address only (it changes links), not {host}")
        self.host, self.port = host, port
        self.hosts = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}
        self.node_configs = dict(node_configs or {})
        self.drill = drill or (lambda: None)
        self.runner: web.AppRunner | None = None
        self._prev: dict = {}
        self._last: dict | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._poller: asyncio.Task | None = None
        self._open = 0
        self._asks: dict[str, Any] = {}  # node -> its status question (a future) still under way
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="c2-view")

    async def state(self) -> dict:
        """The newest snapshot."""
        await self._ready.wait()
        assert self._last is not None
        return self._last

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._last = await loop.run_in_executor(None, self._snapshot)
                self._ready.set()
            except Exception:  # shown as it was last; the next second tries again
                log.exception("drill view snapshot failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SNAPSHOT_EVERY_S):
                    await self._wake.wait()

    def _node_status(self) -> dict[str, dict]:
        from concurrent.futures import wait

        from c2dtn.overlay.client import NodeClient

        def ask(cfg: Path) -> dict:
            return NodeClient.for_config(str(cfg)).request("GET", "/status", timeout=NODE_TIMEOUT_S)

        for name, cfg in self.node_configs.items():
            if name not in self._asks:
                self._asks[name] = self._pool.submit(ask, cfg)
        wait(list(self._asks.values()), timeout=NODE_TIMEOUT_S)
        out = {}
        for name in list(self._asks):
            f = self._asks[name]
            if not f.done():
                out[name] = {"error": "no answer yet (asked again once it answers)"}
                continue
            del self._asks[name]
            try:
                out[name] = f.result()
            except Exception as e:  # a bad config, a refused socket, a garbled answer: shown, not fatal
                out[name] = {"error": str(e)}
        return {n: out[n] for n in self.node_configs if n in out}

    def _snapshot(self) -> dict:
        from c2dtn.topologies import testbed
        from c2dtn.topologies.profiles import load_builtin_profiles

        try:
            st = testbed.status()
        except testbed.TestbedError:
            st = None
        names = sorted(load_builtin_profiles().profiles)
        return snapshot(st, self._prev, time.monotonic(), self._node_status(), self.drill(), time.time(), names)

    @web.middleware
    async def _guard(self, req: web.Request, handler: Callable) -> web.StreamResponse:
        if req.host not in self.hosts:
            return web.json_response({"error": f"host {req.host!r} is not this view's"}, status=403)
        if self._open >= MAX_REQUESTS:
            return web.json_response({"error": "too many open requests"}, status=503)
        self._open += 1
        try:
            return await handler(req)
        finally:
            self._open -= 1

    async def page(self, _req: web.Request) -> web.Response:
        html = resources.files("c2dtn.topologies").joinpath("data", "view.html").read_text()
        return web.Response(text=html, content_type="text/html")

    async def get_state(self, _req: web.Request) -> web.Response:
        return web.json_response(await self.state())

    async def events(self, req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            last = None
            while True:
                s = await self.state()
                if s is not last:
                    await resp.write(f"data: {json.dumps(s)}\n\n".encode())
                    last = s
                await asyncio.sleep(0.2)
        return resp

    async def link(self, req: web.Request) -> web.Response:
        """{"link": NAME, "action": "down" | "up" | "set", "profile": NAME (set)} from the page."""
        from c2dtn.errors import C2Error
        from c2dtn.topologies import testbed
        from c2dtn.topologies.profiles import load_builtin_profiles

        if req.headers.get(HEADER) != "1" or req.content_type != "application/json":
            return web.json_response({"error": f"a link change needs the {HEADER} header and a JSON body"}, status=403)
        if req.headers.get("Origin") != f"http://{req.host}":
            return web.json_response({"error": "a link change comes from this page only"}, status=403)
        try:
            body = await req.json()
            name, action = str(body["link"]), str(body["action"])
            lib = load_builtin_profiles()
            profile = lib.get(str(body["profile"]), "drill view", "profile") if action == "set" else None
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: testbed.change_link(name, None, action, profile))
        except (KeyError, TypeError, ValueError) as e:
            return web.json_response({"error": f"bad request: {e}"}, status=400)
        except C2Error as e:
            return web.json_response({"error": str(e)}, status=400)
        log.info("link %s: %s%s (from the drill view)", name, action, f" {profile.name}" if profile else "")
        self._wake.set()  # the next snapshot at once: the page sees it within the second
        return web.json_response({"ok": True, "link": name, "action": action})

    async def start(self) -> None:
        app = web.Application(client_max_size=4096, middlewares=[self._guard])
        app.add_routes(
            [
                web.get("/", self.page),
                web.get("/state", self.get_state),
                web.get("/events", self.events),
                web.post("/link", self.link),
            ]
        )
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)  # (event streams never end)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port).start()
        self._poller = asyncio.create_task(self._poll())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self.runner is not None:
            await self.runner.cleanup()
        self._pool.shutdown(wait=False, cancel_futures=True)
