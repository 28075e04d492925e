"""dtn7-rs driver: runs dtnd for a node, sends over its HTTP API, receives over its
WebSocket API.

How it works, its quirks and the workarounds here: docs/agents/dtn7.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import cbor2

from c2dtn.cla_adapters import ClaSpec, bpv7
from c2dtn.cla_adapters.numbering import derived_number, node_numbers
from c2dtn.cla_adapters.schemes import cla_name
from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agent import AgentDelivery, AgentError, BundleAgent, Capabilities, Launch, PeerInfo
from c2dtn.overlay.agents import register
from c2dtn.overlay.agents.builds import cache_dir, version
from c2dtn.strict_cbor import StrictCBORError
from c2dtn.strict_cbor import loads as strict_loads

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig

log = logging.getLogger("c2dtn.dtn7")

DTN7_VERSION = version("dtn7")  # what its build fragment (make/dtn7.mk) installs
STORES = ("mem", "sled", "sneakers")
# dtn7-rs names its CLAs differently from the specs
CLA_NAMES = {"tcpcl": "tcp", "mtcp": "mtcp", "udp": "udp", "http": "http"}
NAMINGS = ("dtn", "ipn")
# with ipn naming: the overlay's endpoint ipn:N.1, another named one (a bare benchmark client's) a
# service number derived from its name; a group's stays dtn://<group>/~c2dtn (the ipn scheme has
# no non-singleton endpoints)
SERVICE = "1"
GROUP_SERVICE = "c2dtn"
MAX_NUMBER = (1 << 63) - 1


def service(endpoint: str) -> str:
    """An endpoint's ipn service number: a number as it is, a name's derived from it (2 and up)."""
    if endpoint.isascii() and endpoint.isdigit():
        return endpoint
    return str(2 + zlib.crc32(endpoint.encode()) % (1 << 31))


def numbering(cfg: NodeConfig) -> dict[str, int] | None:
    """ipn numbers of this node and those its config names, or None with dtn naming (where dtnd
    would take a node id of digits alone for an ipn number: refused)."""
    o = cfg.agent_options
    if o.get("naming", "dtn") == "ipn":
        return node_numbers(cfg, derived_number)
    for key in ("number", "numbers"):
        if o.get(key):
            raise ConfigError(
                cfg.source,
                f"agent.dtn7.{key}",
                o[key],
                'numbers name nodes only with naming = "ipn"',
                f'add naming = "ipn", or remove {key}',
            )
    named = [("node.id", cfg.id)] + [("agent.peers", p.node) for p in cfg.peers]
    for where, n in named + [("agent.routes", r.via) for r in cfg.routes]:
        if n.isdigit():
            raise ConfigError(
                cfg.source,
                where,
                n,
                "dtnd takes a node id of digits alone for an ipn number",
                'use naming = "ipn" with numbers, or a name',
            )
    return None


def find_dtnd() -> str:
    """dtnd from $C2DTN_DTND, the project's .tools/, the version-keyed cache, or PATH."""
    cands = [
        os.environ.get("C2DTN_DTND", ""),
        str(Path(__file__).resolve().parent.parent.parent / ".tools" / "dtn7" / "bin" / "dtnd"),
        str(cache_dir() / f"dtn7-{DTN7_VERSION}" / "bin" / "dtnd"),
        shutil.which("dtnd") or "",
    ]
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    raise C2Error(
        f"dtnd (dtn7-rs {DTN7_VERSION}) is not installed: run `make tools` "
        f"(cargo install dtn7 --version {DTN7_VERSION} --locked), or set C2DTN_DTND"
    )


def _cla(spec: ClaSpec) -> str:
    return cla_name("dtn7-rs", CLA_NAMES, spec)


def listen_arg(spec: ClaSpec) -> str:
    """`dtnd -C` value: tcp:port=4556:bind=0.0.0.0"""
    if spec.scheme == "http":
        return "http"  # served on dtnd's web port
    return f"{_cla(spec)}:port={spec.port}:bind={spec.host}"


def peer_arg(spec: ClaSpec, node_id: str) -> str:
    """`dtnd -s` value: tcp://10.77.1.2:4556/r2 (ipn naming: the node's number, /2)"""
    return f"{_cla(spec)}://{spec.host}:{spec.port}/{node_id}"


def dtnd_argv(cfg: NodeConfig, dtnd: str) -> list[str]:
    """dtnd's command line for this node."""
    o = cfg.agent_options
    nums = numbering(cfg)
    argv = [
        dtnd,
        "-n",
        str(nums[cfg.id]) if nums else cfg.id,
        "-W",
        str(cfg.agent_dir),
        "-w",
        str(o["web_port"]),
        "-D",
        o["store"],
        "--disable_nd",
        "-j",
        o["janitor"],
        "-e",
        SERVICE if nums else Dtn7Agent.endpoint,
    ]
    # epidemic: every peer that has not seen a bundle gets it (group bundles fan out)
    routes = cfg.agent_dir / "routes"
    argv += ["-r", "epidemic"] if cfg.routing == "epidemic" else ["-r", "static", "-R", f"static.routes={routes}"]
    for spec in cfg.listen:
        argv += ["-C", listen_arg(spec)]
    for p in cfg.peers:
        argv += ["-s", peer_arg(p.cla, str(nums[p.node]) if nums else p.node)]
    return argv


def dtnd_routes(cfg: NodeConfig) -> str:
    """dtnd static routes: `idx src-glob dst-glob via-eid`; glob `**` crosses '/'."""
    nums = numbering(cfg)
    lines = ["# written by c2dtn from " + cfg.source]
    i = 0
    for r in cfg.routes:
        via = f"ipn:{nums[r.via]}.0" if nums else f"dtn://{r.via}/"
        dsts = ["**"] if r.to == "*" else [f"ipn:{nums[r.to]}.*" if nums else f"dtn://{r.to}/**"]
        for dst in dsts:
            i += 1
            lines.append(f"{i} ** {dst} {via}")
    return "\n".join(lines) + "\n"


def node_eid(node: str) -> str:
    return f"dtn://{node}/"


def eid_node(eid: str, names: dict[int, str] | None = None) -> str:
    """dtn://gw1/ or dtn://gw1/x -> gw1; ipn:4.1 -> the node numbered 4 in `names`, else "ipn:4"."""
    if eid.startswith("ipn:"):
        num = eid[4:].split(".", 1)[0]
        ok = num.isascii() and num.isdigit() and len(num) <= 20
        return (names or {}).get(int(num), f"ipn:{num}") if ok else eid
    rest = eid.split("://", 1)[-1].lstrip("/")
    return rest.split("/", 1)[0]


def bundle_payload(raw: bytes, names: dict[int, str] | None = None) -> tuple[str, bytes]:
    """(source node, payload) of a BPv7 bundle (RFC 9171 §4.3: an array of blocks;
    the payload block has type code 1).  Small enough not to need a BPv7 library."""
    try:
        blocks = strict_loads(raw, max_depth=4, indefinite_array=True)
    except StrictCBORError as e:
        raise ValueError(f"not a BPv7 bundle: {e}") from None
    if not isinstance(blocks, list) or not blocks or not isinstance(blocks[0], list):
        raise ValueError("not a BPv7 bundle")
    primary = blocks[0]
    src = primary[4]  # [scheme, ssp]; dtn scheme (1) ssp is "//node/...", ipn (2) ssp is [node, service]
    src_node = "?"
    if isinstance(src, list) and len(src) == 2:
        if src[0] == 1 and isinstance(src[1], str):
            src_node = eid_node(src[1])
        elif src[0] == 2 and isinstance(src[1], list) and src[1] and type(src[1][0]) is int:
            src_node = eid_node(f"ipn:{src[1][0]}.0", names)
    for blk in blocks[1:]:
        if isinstance(blk, list) and len(blk) >= 5 and blk[0] == 1 and isinstance(blk[4], bytes):
            return src_node, blk[4]
    raise ValueError("bundle has no payload block")


OPTIONS = table(
    "agent.dtn7",
    "dtn7-rs's own settings ([its page](agents/dtn7.md)).",
    [
        F(
            "store",
            "string",
            '"sled"',
            "dtnd's bundle store: " + ", ".join(STORES) + " (mem holds nothing over a restart).",
            '"sled"',
        ),
        F("web_port", "integer", "3000", "dtnd's HTTP and WebSocket API on 127.0.0.1 (one per node on a box).", "3000"),
        F("janitor", "duration", '"5s"', "How often dtnd retries bundles it holds (a number and ms, s or m).", '"5s"'),
        F(
            "naming",
            "string",
            '"dtn"',
            "Endpoint names: dtn (dtn://gw1/c2dtn) or ipn (ipn:N.1, numbers as below; smaller bundles "
            "on the link, [decision 0021](decisions/0021-ipn-naming-for-dtn7.md)). Every "
            "node of a network names alike.",
            '"ipn"',
        ),
        F("number", "integer", "0", "With ipn naming: this node's number (0: derived from its id).", "4"),
        F(
            "numbers",
            "table",
            "{}",
            "With ipn naming: every node's number by node id (this one's too, or in number); a node "
            "the config names but numbers not gets one derived from its id.",
            "{ gw1 = 1, r2 = 2 }",
        ),
    ],
)


@register("dtn7")
class Dtn7Agent(BundleAgent):
    # BPv7; dtnd's web API takes a bundle of up to 16 MB; group endpoints (dtn://group/~x);
    # its sled/sneakers stores keep bundles across a SIGKILL; its UDP CLA puts one bundle in one datagram
    @classmethod
    def testbed_options(
        cls, ltp_rates_bps: dict[str, int], store: str, numbers: dict[str, int] | None = None
    ) -> dict[str, Any]:
        # ipn naming with the testbed's small numbers: 1-byte node numbers in every EID on the radio
        o: dict[str, Any] = {"store": store, "web_port": 3000, "janitor": "3s"}
        return {**o, **cls.numbered(numbers)} if numbers else o

    @classmethod
    def numbered(cls, numbers: dict[str, int]) -> dict[str, Any]:
        return {"naming": "ipn", "numbers": dict(numbers)}

    cla_names = CLA_NAMES
    legacy_keys = frozenset({"store", "web_port", "janitor"})
    daemon = "dtnd"

    @classmethod
    def beside(cls, port: int) -> BundleAgent:
        return cls(f"http://127.0.0.1:{port}")

    capabilities = Capabilities(
        beside_overlay=True,
        bp_version=7,
        max_bundle_bytes=16 << 20,
        groups=True,
        own_custody=True,
        clas=("tcpcl", "udp", "mtcp"),
        udphc=True,
        udp_bundle_max=60_000,
    )

    def __init__(self, base_url: str = "http://127.0.0.1:3000", timeout_s: float = 10.0, cfg: NodeConfig | None = None):
        self.base = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.cfg = cfg
        self.nums = numbering(cfg) if cfg is not None else None  # ipn naming: node -> number
        self.names = {v: k for k, v in self.nums.items()} if self.nums else {}
        if self.nums:
            self.endpoint = SERVICE
        self._top = (0, -1)  # the latest creation time this client gave a bundle, the highest sequence number
        self._source: str | None = None  # the first endpoint of its own it registered: its bundles' source

    # -- configuration ---------------------------------------------------------------------
    @classmethod
    def options(cls, source: str, table: dict[str, Any]) -> dict[str, Any]:
        OPTIONS.check(source, "agent.dtn7", table)
        o = {
            "store": table.get("store", "sled"),
            "web_port": table.get("web_port", 3000),
            "janitor": str(table.get("janitor", "5s")),
            "naming": table.get("naming", "dtn"),
            "number": table.get("number", 0),
            "numbers": table.get("numbers", {}),
        }
        if o["naming"] not in NAMINGS:
            raise ConfigError(source, "agent.dtn7.naming", o["naming"], "unknown naming", "dtn or ipn")
        if not isinstance(o["number"], int) or isinstance(o["number"], bool) or not 0 <= o["number"] <= MAX_NUMBER:
            raise ConfigError(source, "agent.dtn7.number", o["number"], "not an ipn node number", f"0 to {MAX_NUMBER}")
        nums = o["numbers"]
        if not isinstance(nums, dict):
            raise ConfigError(source, "agent.dtn7.numbers", nums, "not a table", "write e.g. { gw1 = 1 }")
        for k, v in nums.items():
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_NUMBER:
                raise ConfigError(source, f"agent.dtn7.numbers.{k}", v, "not an ipn node number", f"1 to {MAX_NUMBER}")
        if o["store"] not in STORES:
            raise ConfigError(source, "agent.dtn7.store", o["store"], "unknown store", "stores: " + ", ".join(STORES))
        if not isinstance(o["web_port"], int) or isinstance(o["web_port"], bool) or not 1 <= o["web_port"] <= 65535:
            raise ConfigError(source, "agent.dtn7.web_port", o["web_port"], "not a port", "1 to 65535")
        if not re.fullmatch(r"\d+(ms|s|m)", o["janitor"]):
            raise ConfigError(source, "agent.dtn7.janitor", o["janitor"], "not a duration", 'write e.g. "5s"')
        return o

    @classmethod
    def missing(cls) -> str | None:
        try:
            find_dtnd()
            return None
        except C2Error as e:
            return str(e)

    @classmethod
    def for_node(cls, cfg: NodeConfig) -> Dtn7Agent:
        return cls(f"http://127.0.0.1:{cfg.agent_options['web_port']}", cfg=cfg)

    # -- the daemon ----------------------------------------------------------------------------
    def prepare(self) -> Launch:
        cfg = self._node()
        cfg.agent_dir.mkdir(parents=True, exist_ok=True)
        (cfg.agent_dir / "routes").write_text(dtnd_routes(cfg))
        return Launch(dtnd_argv(cfg, find_dtnd()))

    def owns(self, cmdline: bytes) -> bool:
        return b"dtnd" in cmdline and str(self._node().agent_dir).encode() in cmdline

    async def ready(self) -> None:
        node = (await self._get("/status/nodeid")).strip()
        me = self._node().id
        want = f"ipn:{self.nums[me]}.0" if self.nums else f"dtn://{me}/"
        if node != want:
            raise AgentError(f"dtnd answers as {node}, not as {want} ({me})")

    def _node(self) -> NodeConfig:
        if self.cfg is None:
            raise AgentError("this dtn7 client was made for a dtnd it does not run")
        return self.cfg

    # -- naming ----------------------------------------------------------------------------------
    def group_endpoint(self, group: str) -> str:
        return f"dtn://{group}/~{GROUP_SERVICE}"  # ~: a non-singleton endpoint (RFC 9171 4.2.5.1)

    def destination(self, dst: str, is_group: bool) -> tuple[str, str]:
        return (dst, "~" + GROUP_SERVICE) if is_group else (dst, self.endpoint)

    def naming(self) -> str:
        me = self._node()
        if not self.nums:
            return f"dtn: this node dtn://{me.id}/, the overlay's endpoint dtn://{me.id}/{self.endpoint}"
        given = set(me.agent_options["numbers"]) | ({me.id} if me.agent_options["number"] else set())
        derived = sorted(n for n in self.nums if n not in given)
        return (
            f"ipn: this node ipn:{self.nums[me.id]}.0 (the overlay's endpoint ipn:{self.nums[me.id]}.1); "
            + ", ".join(f"{n} {k}" for n, k in sorted(self.nums.items(), key=lambda x: x[1]))
            + (
                f"; derived, not in numbers: {', '.join(derived)} (every box must give them the same)"
                if derived
                else ""
            )
        )

    def eid(self, node: str, endpoint: str) -> str:
        """The EID of `endpoint` on `node`, or of a group's ("~c2dtn")."""
        if self.nums and not endpoint.startswith("~"):
            return f"ipn:{self.nums.get(node) or derived_number(node)}.{service(endpoint)}"
        return f"{node_eid(node)}{endpoint}"

    def _local(self, endpoint: str) -> str:
        """What dtnd's register and subscribe take for a local endpoint: with ipn naming its service
        number (an endpoint of the node's own id: dtnd keeps a bundle for it until it is taken, where
        one of another id, not yet registered, it would forward), else the name; a full EID as it is."""
        if self.nums and "://" not in endpoint:
            return service(endpoint)
        return endpoint

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

    async def register(self, endpoint: str) -> None:
        if self.cfg is None and not endpoint.isdigit():  # a client beside a node (beside()): its naming unknown
            node = (await self._get("/status/nodeid")).strip()
            if node.startswith("ipn:"):
                raise AgentError(f"dtnd at {self.base} is {node}: name a client beside it with --beside NODE.toml")
        await self._get(f"/register?{self._local(endpoint)}")
        if self._source is None and self.cfg is not None and "://" not in endpoint and not endpoint.startswith("~"):
            self._source = self.eid(self.cfg.id, endpoint)

    def bundle(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float, now_ms: int) -> bytes | None:
        """The bundle as it goes (bpv7.encode_sent; decision 0022), or None where dtnd must make it
        (/send): nothing registered yet to be its source, or a clock before 2000.  Its source is
        the endpoint this client registered first (another client of the node registers its own:
        ids of one source come from one maker); it is created at `now_ms`, and where the clock
        has stepped back to or behind the latest time given, with a sequence number above every
        one given before: ids unique within the process, lifetimes still from the clock.  (A
        restart with the clock put back behind bundles dtnd still holds can repeat an id, as
        dtnd's own /send can; the overlay resends what that drops.)  Hand-written: dtnd's /cts would
        cost a request a bundle."""
        ms = now_ms - bpv7.DTN_EPOCH_MS
        if self._source is None or ms <= 0:
            return None
        seq = 0 if ms > self._top[0] else self._top[1] + 1
        self._top = (max(ms, self._top[0]), max(seq, self._top[1]))
        lifetime_ms = max(1, int(lifetime_s)) * 1000
        return bpv7.encode_sent(self._source, self.eid(dst_node, endpoint), payload, lifetime_ms, ms, seq)

    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float, priority: int = 3) -> None:
        await self.start()
        raw = self.bundle(dst_node, endpoint, payload, lifetime_s, int(time.time() * 1000))
        if raw is None:
            url = f"{self.base}/send?dst={self.eid(dst_node, endpoint)}&lifetime={max(1, int(lifetime_s))}s"
        else:
            url, payload = f"{self.base}/insert", raw
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
                async with self._session.get(f"{self.base}/endpoint?{self._local(endpoint)}") as r:
                    raw = await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                raise AgentError(f"dtnd endpoint poll failed: {e}") from None
            if r.status != 200 or raw.startswith(b"Nothing to receive"):
                break
            try:
                src, payload = bundle_payload(raw, self.names)
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
                async with self._session.ws_connect(
                    self.base.replace("http", "ws", 1) + "/ws",
                    heartbeat=5.0,
                    timeout=aiohttp.ClientWSTimeout(ws_close=5),
                ) as ws:
                    await ws.send_str("/data")
                    await ws.send_str(f"/subscribe {self._local(endpoint)}")
                    backoff = 0.2
                    for d in await self._drain(endpoint):
                        yield d
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            try:
                                rec = strict_loads(msg.data, max_depth=2)
                                src, data = eid_node(rec["src"], self.names), rec["data"]
                                if not isinstance(data, bytes):
                                    raise TypeError(f"data is {type(data).__name__}, not bytes")
                                yield AgentDelivery(src, endpoint, data, str(rec["bid"]))
                            except (
                                ValueError,
                                KeyError,
                                TypeError,
                                AttributeError,
                            ) as e:  # (StrictCBORError: a ValueError)
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
            if self.nums and name.isdigit() and len(name) <= 20:  # dtnd keys an ipn peer by its number
                name = self.names.get(int(name), name)
            addr = p.get("addr", {})
            cla = p.get("cla_list") or [["?", 0]]
            out.append(
                PeerInfo(
                    name,
                    str(addr.get("Ip", addr)),
                    f"{cla[0][0]}:{cla[0][1]}",
                    "static" if p.get("con_type") == "Static" else "discovered",
                )
            )
        return out

    async def stored(self) -> int:
        import json

        return len(json.loads(await self._get("/status/bundles")))
