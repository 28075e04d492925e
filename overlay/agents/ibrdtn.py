"""IBR-DTN driver: runs IBR-DTN's dtnd for a node and speaks its extended text API.

How it works, its quirks and the workarounds here: docs/agents/ibrdtn.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from c2dtn.cla_adapters.schemes import cla_name
from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import ConfigError
from c2dtn.overlay.agent import (
    SEED_002,
    AgentDelivery,
    AgentError,
    BundleAgent,
    Capabilities,
    Launch,
    PeerInfo,
    Published,
    static_peers,
)
from c2dtn.overlay.agents import register
from c2dtn.overlay.agents.builds import built, not_built

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig

log = logging.getLogger("c2dtn.ibrdtn")

CLA_NAMES = {"tcpcl": "tcp", "udp": "udp"}
NOTIFY_BUNDLE = "602"
MAX_PAYLOAD = 16 << 20


def _proto(spec) -> str:
    return cla_name("IBR-DTN", CLA_NAMES, spec, "TCPCLv3")


def ibrdtn_conf(cfg: NodeConfig, interfaces: list[str] = ()) -> str:
    """ibrdtnd.conf for this node; `interfaces`: the network interfaces its UDP CL binds to."""
    d = cfg.agent_dir
    lines = [
        f"# written by c2dtn from {cfg.source}",
        f"local_uri = dtn://{cfg.id}",
        f"api_port = {cfg.agent_options['api_port']}",
        "api_interface = lo",
        "storage = sqlite",
        f"storage_path = {d / 'bundles'}",
        f"blob_path = {d / 'blobs'}",
        "discovery_announce = 0",
        "routing = default",
        "routing_forwarding = yes",
        "net_autoconnect = 2",
    ]  # seconds between tries to reach a static neighbour (default 60)
    names = []
    for i, s in enumerate(cfg.listen):
        # TCP listens on any address; UDP only sends from a socket bound to an interface (bound
        # to "any", IBR-DTN 1.0.1 queued bundles for a UDP neighbour and never sent them): one
        # UDP convergence layer per interface of the node's namespace
        for iface in [None] if _proto(s) == "tcp" else interfaces or [None]:
            name = f"cl{i}" if iface is None else f"cl{i}u{len(names)}"
            names.append(name)
            lines += [f"net_{name}_type = {_proto(s)}", f"net_{name}_port = {s.port}"]
            if iface:
                lines.append(f"net_{name}_interface = {iface}")
    lines.append("net_interfaces = " + " ".join(names))
    for i, p in enumerate(cfg.peers, 1):
        lines += [
            f"static{i}_address = {p.cla.host}",
            f"static{i}_port = {p.cla.port}",
            f"static{i}_uri = dtn://{p.node}",
            f"static{i}_proto = {_proto(p.cla)}",
            f"static{i}_immediately = yes",
        ]
    neighbours = {p.node for p in cfg.peers}
    k = 0
    for r in cfg.routes:
        if r.to in neighbours or r.to == r.via:
            continue
        k += 1
        pattern = "^dtn://.*" if r.to == "*" else f"^dtn://{r.to}/.*"
        lines.append(f"route{k} = {pattern} dtn://{r.via}")
    return "\n".join(lines) + "\n"


def plain_bundle(src: str, dst: str, payload: bytes, lifetime_s: int) -> bytes:
    """A bundle in the API's plain notation: primary block headers, then one payload block of
    raw bytes (flags 144: singleton destination, normal priority)."""
    head = (
        f"Processing flags: 144\nSource: {src}\nDestination: {dst}\nLifetime: {lifetime_s}\nBlocks: 1\n\n"
        f"Block: 1\nFlags: LAST_BLOCK\nLength: {len(payload)}\nEncoding: raw\n\n"
    ).encode()
    return head + payload + b"\n\n"


@dataclass
class Reply:
    code: int
    text: str
    data: bytes = b""


class ApiReader:
    """Bytes from the API in; replies (in order) and bundle notifications out.  No I/O: fed
    as data arrives.  A `200 PAYLOAD GET` reply carries `Length: N` lines, an empty line
    and N raw bytes, which are read as its data."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._payload: Reply | None = None  # a PAYLOAD GET whose data is still coming
        self._need = -1  # bytes of that data (-1: its header lines are still coming)
        self._payload_len = 0  # what its Length line said
        self.greeting: str | None = None

    def feed(self, data: bytes) -> tuple[list[Reply], list[str]]:
        self._buf += data
        replies: list[Reply] = []
        notes: list[str] = []
        while True:
            if self._payload is not None and self._need >= 0:
                if len(self._buf) < self._need:
                    break
                self._payload.data = bytes(self._buf[: self._need])
                del self._buf[: self._need]
                replies.append(self._payload)
                self._payload, self._need = None, -1
                continue
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > 65536:
                    raise AgentError("IBR-DTN's API sent a line of more than 64 kB: out of step")
                break
            line = self._buf[:nl].rstrip(b"\r").decode(errors="replace")
            del self._buf[: nl + 1]
            if self._payload is not None:  # its header lines, up to the empty line
                if line.startswith("Length:"):
                    try:
                        self._payload_len = int(line.split(":", 1)[1])
                    except ValueError:
                        raise AgentError(f"IBR-DTN's API: bad payload length line {line!r}") from None
                elif not line:
                    self._need = self._payload_len
                    if not 0 <= self._need <= MAX_PAYLOAD:
                        raise AgentError(f"IBR-DTN's API: payload of {self._need} bytes")
                continue
            if not line:
                continue  # the empty lines that close a payload or a bundle
            if self.greeting is None:
                self.greeting = line
                continue
            code, _, text = line.partition(" ")
            if not (code.isdigit() and len(code) == 3):
                log.debug("IBR-DTN API line ignored: %s", line[:200])
                continue
            if code == NOTIFY_BUNDLE:
                notes.append(text.removeprefix("NOTIFY BUNDLE ").strip())
            elif code.startswith("6"):
                continue  # reports and custody signals: not asked for
            elif code == "200" and text.startswith("PAYLOAD GET"):
                self._payload, self._payload_len, self._need = Reply(200, text), 0, -1
            else:
                replies.append(Reply(int(code), text))
        return replies, notes


OPTIONS = table(
    "agent.ibrdtn",
    "IBR-DTN's own settings ([its page](agents/ibrdtn.md)).",
    [
        F("api_port", "integer", "4550", "The daemon's API on 127.0.0.1 of the node's namespace.", "4550"),
        F(
            "bundle_lifetime_s",
            "integer",
            "60",
            "The lifetime of the bundles this node sends (5 to 86400).",
            "600",
            "s",
        ),
    ],
)


@register("ibrdtn")
class IbrdtnAgent(BundleAgent):
    # BPv6; payloads up to 16 MB through the API here; no group endpoints in this driver;
    # sqlite storage keeps bundles across a SIGKILL; deliveries are marked `bundle delivered`; its UDP
    # CL cuts a bundle larger than the interface's mtu (1,280 by default) into fragments
    cla_names = CLA_NAMES
    capabilities = Capabilities(
        bp_version=6, max_bundle_bytes=MAX_PAYLOAD, groups=False, own_custody=True, delivery_ack=True
    )
    # seed 002: "on the order of 10 ms" (more at 100k, 1M)
    published = (Published("seed 002", "round trip", "~10 ms", 8, 12, SEED_002),)

    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.port = cfg.agent_options["api_port"]
        self.bundle_lifetime_s = cfg.agent_options["bundle_lifetime_s"]
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task | None = None
        self._waiting: list[asyncio.Future] = []
        self._notes: asyncio.Queue = asyncio.Queue()
        self._lock = asyncio.Lock()  # one command sequence at a time: the connection has one register
        self._connect_lock = asyncio.Lock()

    @classmethod
    def options(cls, source: str, table: dict[str, Any]) -> dict[str, Any]:
        OPTIONS.check(source, "agent.ibrdtn", table)
        port = table.get("api_port", 4550)
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ConfigError(source, "agent.ibrdtn.api_port", port, "not a port", "1 to 65535")
        life = table.get("bundle_lifetime_s", 60)
        if not isinstance(life, int) or isinstance(life, bool) or not 5 <= life <= 86400:
            raise ConfigError(source, "agent.ibrdtn.bundle_lifetime_s", life, "not a lifetime in seconds", "5 to 86400")
        return {"api_port": port, "bundle_lifetime_s": life}

    @classmethod
    def missing(cls) -> str | None:
        return not_built("ibrdtn")

    # -- the daemon ----------------------------------------------------------------------------
    def prepare(self) -> Launch:
        home = built("ibrdtn")
        d = self.cfg.agent_dir
        for sub in ("", "bundles", "blobs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        # the node process runs in the node's network namespace: its interfaces are the node's
        ifaces = [name for _, name in socket.if_nameindex() if name != "lo"]
        (d / "ibrdtnd.conf").write_text(ibrdtn_conf(self.cfg, ifaces))
        return Launch([str(home / "sbin" / "dtnd"), "-c", str(d / "ibrdtnd.conf"), "--nodiscovery"], cwd=d)

    def owns(self, cmdline: bytes) -> bool:
        return b"dtnd" in cmdline and str(self.cfg.agent_dir / "ibrdtnd.conf").encode() in cmdline

    async def ready(self) -> None:
        await self.start()
        if not self.cfg.overlay:  # a node without the overlay leaves the endpoint to other clients
            await self.stop()

    # -- the API connection ------------------------------------------------------------------------
    async def start(self) -> None:
        async with self._connect_lock:
            if self._writer is not None and not self._writer.is_closing() and self._task and not self._task.done():
                return
            await self._close()
            try:
                self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 5)
            except (OSError, asyncio.TimeoutError) as e:
                raise AgentError(
                    f"IBR-DTN's API at 127.0.0.1:{self.port} does not answer: {e or type(e).__name__}"
                ) from None
            self._task = asyncio.create_task(self._read(self._reader))
            for cmd in ("protocol extended", "set endpoint c2dtn", "set encoding raw"):
                r = await self._ask(cmd.encode() + b"\n")
                if r.code != 200:
                    await self._close()
                    raise AgentError(f"IBR-DTN's API refused {cmd!r}: {r.code} {r.text}")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        api = ApiReader()
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                replies, notes = api.feed(data)
                for r in replies:
                    fut = self._waiting.pop(0) if self._waiting else None
                    if fut is None:
                        log.warning("IBR-DTN's API said %d %s unasked", r.code, r.text)
                    elif not fut.done():
                        fut.set_result(r)
                for n in notes:
                    self._notes.put_nowait(n)
        except (OSError, AgentError) as e:
            log.warning("IBR-DTN's API connection: %s", e)
        finally:
            for fut in self._waiting:
                if not fut.done():
                    fut.set_exception(AgentError("IBR-DTN's API connection closed"))
            self._waiting.clear()
            if self._writer is not None:
                self._writer.close()

    def _expect(self, n: int = 1) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(n)]
        self._waiting.extend(futs)
        return futs

    async def _ask(self, data: bytes, replies: int = 1, timeout: float = 30) -> Reply:
        """Write a command (and what follows it); return its last reply (raise on any not 1xx/2xx)."""
        if self._writer is None or self._writer.is_closing():
            raise AgentError("IBR-DTN's API is not connected")
        futs = self._expect(replies)
        try:
            self._writer.write(data)
            await self._writer.drain()
            out = [await asyncio.wait_for(f, timeout) for f in futs]
        except (OSError, asyncio.TimeoutError) as e:
            self._writer.close()
            raise AgentError(f"IBR-DTN's API did not answer: {e or type(e).__name__}") from None
        for r in out[:-1]:
            if r.code >= 300:
                return r
        return out[-1]

    async def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._writer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def stop(self) -> None:
        await self._close()

    async def register(self, endpoint: str) -> None:
        if endpoint != self.endpoint:
            raise AgentError(f"the ibrdtn agent serves only its own endpoint c2dtn, not {endpoint!r}")
        await self.start()

    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float, priority: int = 3) -> None:
        await self.start()
        bundle = plain_bundle(
            f"dtn://{self.cfg.id}/{self.endpoint}", f"dtn://{dst_node}/{endpoint}", payload, max(1, int(lifetime_s))
        )
        async with self._lock:
            r = await self._ask(b"bundle put plain\n" + bundle, replies=2)
            if r.code != 200:
                raise AgentError(f"IBR-DTN refused a bundle for {dst_node}: {r.code} {r.text}")
            r = await self._ask(b"bundle send\n")
            if r.code != 200:
                raise AgentError(f"IBR-DTN did not send a bundle for {dst_node}: {r.code} {r.text}")

    async def _fetch(self) -> AgentDelivery | None:
        """The next bundle of the API's queue, marked delivered and freed; None if it was gone."""
        async with self._lock:
            r = await self._ask(b"bundle load queue\n")
            if r.code != 200:
                return None
            bid = r.text.removeprefix("BUNDLE LOADED ").strip()
            p = await self._ask(b"payload get\n")
            if p.code != 200:
                log.warning("IBR-DTN would not hand over bundle %s: %d %s", bid, p.code, p.text)
            d = await self._ask(f"bundle delivered {bid}\n".encode())
            if d.code != 200:
                log.warning("IBR-DTN did not take bundle %s as delivered: %d %s", bid, d.code, d.text)
            await self._ask(b"bundle free\n")
        if p.code != 200:
            return None
        src = bid.split(" ")[-1] if bid else "?"
        return AgentDelivery(src.split("://", 1)[-1].split("/", 1)[0], self.endpoint, p.data, bid)

    async def deliveries(self, endpoint: str) -> AsyncIterator[AgentDelivery]:
        while True:
            try:
                await self.start()
                try:
                    await asyncio.wait_for(self._notes.get(), 2.0)
                except asyncio.TimeoutError:
                    pass  # look at the queue anyway: notifications sent before we connected
                while True:
                    d = await self._fetch()
                    if d is None:
                        break
                    yield d
            except AgentError as e:
                log.info("IBR-DTN's API unavailable (%s); retrying", e)
                await asyncio.sleep(1.0)

    async def peers(self) -> list[PeerInfo]:
        return static_peers(self.cfg, _proto)

    async def stored(self) -> int:
        raise AgentError("the ibrdtn driver does not count IBR-DTN's bundles")
