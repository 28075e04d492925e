"""dtn7-rs driver: sends over dtnd's HTTP API, receives over its WebSocket API.

Facts about dtnd 0.21 this driver is built around (read from its source):
- POST /send?dst=<eid>&lifetime=<humantime> sends from the node's own EID;
- WebSocket /ws: "/data" switches deliveries to CBOR {bid, src, dst, cts,
  lifetime, data}; "/subscribe <name>" attaches to a registered endpoint;
- bundles that reached an endpoint while nobody was attached wait in memory;
  subscribing hands over only one of them, so the driver also drains the rest
  with GET /endpoint?<name> (whole BPv7 bundles, payload taken out here);
- dtnd has no priority in BPv7; the overlay's scheduler orders what it hands over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import cbor2

from c2dtn.overlay.agent import AgentDelivery, AgentError, BundleAgent, PeerInfo

log = logging.getLogger("c2dtn.dtn7")


def node_eid(node: str) -> str:
    return f"dtn://{node}/"


def eid_node(eid: str) -> str:
    """dtn://gw1/ or dtn://gw1/x -> gw1"""
    rest = eid.split("://", 1)[-1].lstrip("/")
    return rest.split("/", 1)[0]


def bundle_payload(raw: bytes) -> tuple[str, bytes]:
    """(source node, payload) of a BPv7 bundle (RFC 9171 §4.3: an array of blocks;
    the payload block has type code 1).  Small enough not to need a BPv7 library."""
    blocks = cbor2.loads(raw)
    if not isinstance(blocks, list) or not blocks or not isinstance(blocks[0], list):
        raise ValueError("not a BPv7 bundle")
    primary = blocks[0]
    src = primary[4]  # [scheme, ssp]; dtn scheme ssp is "//node/..."
    src_node = eid_node(src[1]) if isinstance(src, list) and len(src) == 2 and isinstance(src[1], str) else "?"
    for blk in blocks[1:]:
        if isinstance(blk, list) and len(blk) >= 5 and blk[0] == 1 and isinstance(blk[4], bytes):
            return src_node, blk[4]
    raise ValueError("bundle has no payload block")


class Dtn7Agent(BundleAgent):
    name = "dtn7"

    def __init__(self, base_url: str = "http://127.0.0.1:3000", timeout_s: float = 10.0):
        self.base = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str) -> str:
        await self.start()
        try:
            async with self._session.get(self.base + path) as r:
                text = await r.text()
                if r.status != 200:
                    raise AgentError(f"dtnd {path}: HTTP {r.status}: {text.strip()[:200]}")
                return text
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise AgentError(f"dtnd at {self.base} does not answer {path}: {e or type(e).__name__}") from None

    async def ready(self) -> str:
        """The agent's node id once its HTTP API answers."""
        return (await self._get("/status/nodeid")).strip()

    async def register(self, endpoint: str) -> None:
        await self._get(f"/register?{endpoint}")

    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float,
                   priority: int = 3) -> None:
        await self.start()
        url = f"{self.base}/send?dst={node_eid(dst_node)}{endpoint}&lifetime={max(1, int(lifetime_s))}s"
        try:
            async with self._session.post(url, data=payload) as r:
                text = await r.text()
                if r.status != 200:
                    raise AgentError(f"dtnd refused a bundle for {dst_node}: HTTP {r.status}: {text.strip()[:200]}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise AgentError(f"dtnd at {self.base} did not take a bundle: {e or type(e).__name__}") from None

    async def _drain(self, endpoint: str) -> list[AgentDelivery]:
        out = []
        for _ in range(100_000):
            await self.start()
            try:
                async with self._session.get(f"{self.base}/endpoint?{endpoint}") as r:
                    raw = await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                raise AgentError(f"dtnd endpoint poll failed: {e}") from None
            if r.status != 200 or raw.startswith(b"Nothing to receive"):
                break
            try:
                src, payload = bundle_payload(raw)
            except (ValueError, cbor2.CBORDecodeError, IndexError, TypeError) as e:
                log.warning("dtnd handed over something that is not a bundle (%d bytes): %s", len(raw), e)
                continue
            out.append(AgentDelivery(src, endpoint, payload))
        return out

    async def deliveries(self, endpoint: str) -> AsyncIterator[AgentDelivery]:
        backoff = 0.2
        while True:
            try:
                await self.start()
                async with self._session.ws_connect(self.base.replace("http", "ws", 1) + "/ws",
                                                    heartbeat=5.0, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                    await ws.send_str("/data")
                    await ws.send_str(f"/subscribe {endpoint}")
                    backoff = 0.2
                    for d in await self._drain(endpoint):
                        yield d
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            try:
                                rec = cbor2.loads(msg.data)
                                yield AgentDelivery(eid_node(rec["src"]), endpoint, bytes(rec["data"]), str(rec["bid"]))
                            except (ValueError, KeyError, TypeError, cbor2.CBORDecodeError) as e:
                                log.warning("unreadable delivery from dtnd (%d bytes): %s", len(msg.data), e)
                        elif msg.type == aiohttp.WSMsgType.TEXT:
                            if not msg.data.startswith("200"):
                                log.warning("dtnd says: %s", msg.data)
                        elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                            break
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, AgentError) as e:
                log.info("dtnd WebSocket at %s unavailable (%s); retrying in %.1f s", self.base, e, backoff)
            await asyncio.sleep(backoff)
            backoff = min(5.0, backoff * 2)

    async def peers(self) -> list[PeerInfo]:
        import json

        data: dict[str, Any] = json.loads(await self._get("/status/peers"))
        out = []
        for name, p in data.items():
            addr = p.get("addr", {})
            cla = p.get("cla_list") or [["?", 0]]
            out.append(PeerInfo(name, str(addr.get("Ip", addr)), f"{cla[0][0]}:{cla[0][1]}",
                                "static" if p.get("con_type") == "Static" else "discovered"))
        return out

    async def stored(self) -> int:
        import json

        return len(json.loads(await self._get("/status/bundles")))
