"""BundleAgent: the one interface the overlay uses for any BPA.

A driver per agent implements it and registers under its `[agent] kind`
(overlay.agents: dtn7 for dtn7-rs), as dtn7-rs registers its CLAs.  A driver
owns everything particular to its agent: its `[agent.<kind>]` settings, the
daemon's configuration files and command line (the supervisor starts, watches
and stops whatever `prepare` says), readiness, the translation of the CLA specs
and the naming of endpoints.  Node ids are plain names ("gw4"); each driver
maps them to its agent's EIDs (dtn://gw4/..., ipn:N.M).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig


@dataclass(frozen=True)
class AgentDelivery:
    src_node: str  # the node that sent the bundle
    endpoint: str  # local endpoint it was delivered to
    payload: bytes
    bundle_id: str = ""


@dataclass(frozen=True)
class PeerInfo:
    node: str
    address: str
    cla: str
    kind: str  # "static" or "discovered"


class AgentError(Exception):
    """The agent refused or could not be reached."""


@dataclass(frozen=True)
class Capabilities:
    """What an agent can do, for the node and the tests to ask rather than assume."""

    bp_version: int  # 6 or 7
    max_bundle_bytes: int  # the largest payload it takes in one bundle
    groups: bool  # non-singleton endpoints: one bundle reaches every member
    own_custody: bool  # bundles it holds survive a SIGKILL of its daemon (persistent store)
    delivery_ack: bool = False  # a delivery must be acknowledged to it (IBR-DTN's `bundle delivered`)
    clas: tuple[str, ...] = ("tcpcl", "udp")  # the convergence layers (c2dtn's scheme names) it speaks
    udp_bundle_max: int | None = None  # its UDP CLA sends a bundle as one datagram of at most this many
    # bytes (None: it fragments larger bundles)
    beside_overlay: bool = False  # serves many endpoints per node: a bare client can run beside an overlay node
    # its UDP CLA takes bundles on a loopback port, so the node can run udphc:// around it
    # (overlay/hclink.py; IBR-DTN binds UDP only on the namespace's other interfaces)
    udphc: bool = False


SEED_002 = "NPS 2017: over the agent's TCP CLA, memory storage, a LAN testbed, 10 runs per size, dtnperf"


@dataclass(frozen=True)
class Published:
    """A figure a source paper gives for an agent, shown by the benchmarks beside their own."""

    source: str  # "seed 002"
    figure: str  # "round trip" (low, high in ms) or "throughput at 1 MB" (low, high in bit/s)
    text: str  # as the paper puts it: "70-99 ms"
    low: float
    high: float
    setting: str = ""  # how the paper measured it


@dataclass(frozen=True)
class Launch:
    """How to start an agent's daemon: the supervisor runs this and watches it."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the node's environment
    cwd: Path | None = None


class BundleAgent(abc.ABC):
    name: str = "abstract"
    capabilities: Capabilities = Capabilities(7, 1 << 20, False, False)
    endpoint: str = "c2dtn"  # the overlay's own endpoint on every node
    # the lifetime the node gives every bundle: the overlay resends what is not acked, so a bundle
    # only has to outlive the hops it waits at; a driver whose agent keeps forwarded bundles until
    # they expire (IBR-DTN) makes it shorter
    bundle_lifetime_s: int = 3600
    # seconds the agent needs after one application session of a node ended before the next one
    # may open (HDTN: hdtn.SESSION_GAP_S); the driver waits it out itself, and so must a second
    # process that opens a session of the same node (the benchmarks' clients)
    session_gap_s: float = 0.0
    # the agent's own name for each convergence layer it speaks (cla_adapters.schemes), by scheme
    cla_names: dict[str, str] = {}
    # the convergence layers the testbed runs this agent on, its default first (empty: any of
    # capabilities.clas); what the testbed reads instead of naming agents
    testbed_clas: tuple[str, ...] = ()
    # [agent] keys the driver also reads for its own settings (configs older than [agent.<kind>])
    legacy_keys: frozenset[str] = frozenset()
    daemon: str = ""  # its daemon's name in reports ("" : the agent's name)
    # benchmark variants of this agent: name -> (the CLA under it, testbed node -> TOML added to its config)
    testbed_variants: dict[str, tuple[str, dict[str, str]]] = {}
    published: tuple[Published, ...] = ()  # what source papers measured of it

    @classmethod
    def label(cls) -> str:
        return cls.daemon or cls.name

    @classmethod
    def beside(cls, port: int) -> BundleAgent:
        """A client of this agent's daemon on this node, beside the overlay node that runs it (a
        bare benchmark client; capabilities.beside_overlay); port: the daemon's API port."""
        raise NotImplementedError(f"{cls.name} serves one endpoint per node: no client beside the overlay")

    # -- made from a node's configuration -------------------------------------------------
    @classmethod
    def options(cls, source: str, table: dict[str, Any]) -> dict[str, Any]:
        """Check this agent's own settings (the `[agent.<kind>]` table) and return them with
        defaults filled in; ConfigError names a bad one."""
        if table:
            from c2dtn.errors import ConfigError

            key = next(iter(table))
            raise ConfigError(source, f"agent.{cls.name}.{key}", table[key], f"{cls.name} takes no settings here")
        return {}

    @classmethod
    def testbed_options(
        cls, ltp_rates_bps: dict[str, int], store: str, numbers: dict[str, int] | None = None
    ) -> dict[str, Any]:
        """The `[agent.<kind>]` settings the testbed writes for one of its nodes.  ltp_rates_bps:
        the bits per second the node may send to each LTP neighbour across a rated link; store:
        the storage the testbed asks of agents that offer a choice; numbers: a small number for
        every node of the topology, for agents that can name nodes by number."""
        return {}

    @classmethod
    def numbered(cls, numbers: dict[str, int]) -> dict[str, Any]:
        """The `[agent.<kind>]` settings that name nodes by these ipn numbers (`c2dtn node init
        --number`), or None where the agent does not name nodes by number."""
        return None

    @classmethod
    def missing(cls) -> str | None:
        """Why this agent cannot run on this machine (not installed, not built), else None."""
        return None

    @classmethod
    def for_node(cls, cfg: NodeConfig) -> BundleAgent:
        """The driver of this node's agent (its daemon, its configuration)."""
        return cls(cfg)

    # -- the daemon ----------------------------------------------------------------------------
    def prepare(self) -> Launch:
        """Write the daemon's configuration files; return how to start it."""
        raise NotImplementedError(f"{self.name} has no daemon of its own to start")

    def owns(self, cmdline: bytes) -> bool:
        """Is a process with this command line (found by PID after a crash) this node's daemon?"""
        return False

    async def ready(self) -> None:  # noqa: B027 (a driver whose daemon is ready once started keeps it)
        """Return once the daemon answers as this node; raise AgentError while it does not."""

    async def shutdown(self, proc: asyncio.subprocess.Process) -> None:
        """Stop the daemon the supervisor started (SIGTERM, SIGKILL after 5 s)."""
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()

    # -- naming ----------------------------------------------------------------------------------
    def naming(self) -> str:
        """How this node names its nodes, for `node check` ("": nothing to say)."""
        return ""

    def endpoints(self, groups: list[str]) -> list[str]:
        """Local endpoints to register: the overlay's own, and one per group this node is in
        where the agent has group endpoints."""
        if not self.capabilities.groups:
            return [self.endpoint]
        return [self.endpoint] + [self.group_endpoint(g) for g in groups]

    def group_endpoint(self, group: str) -> str:
        raise AgentError(f"{self.name} has no group endpoints")

    def destination(self, dst: str, is_group: bool) -> tuple[str, str]:
        """(node or group, endpoint) that `send` takes for an overlay destination."""
        if is_group:
            raise AgentError(f"{self.name} cannot send to a group")
        return dst, self.endpoint

    def destinations(self, dst: str, members: tuple[str, ...] | None) -> list[tuple[str, str]]:
        """Every (node or group, endpoint) one bundle for `dst` is sent to: `members` are a
        group's other members (None: dst is a node).  An agent with group endpoints takes one
        bundle for the group; on one without, the node sends a copy to each member's own
        endpoint (each copy crosses the links on its path: a shared radio hop carries it once
        per member, not once).  The receiving core tells a group bundle by its contents, not
        by the endpoint it came to, so custody, acks and origin tags are the same either way."""
        if members is None:
            return [self.destination(dst, False)]
        if self.capabilities.groups:
            return [self.destination(dst, True)]
        return [self.destination(m, False) for m in members]

    # -- bundles -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect to the (running) agent; idempotent."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def register(self, endpoint: str) -> None:
        """Register a local endpoint (e.g. "c2dtn") so bundles for it are kept for us."""

    @abc.abstractmethod
    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float, priority: int = 3) -> None:
        """Hand one bundle to the agent.  Returns once the agent accepted it."""

    @abc.abstractmethod
    def deliveries(self, endpoint: str) -> AsyncIterator[AgentDelivery]:
        """Bundles delivered to `endpoint`, for as long as the caller iterates;
        reconnects by itself when the agent restarts."""

    @abc.abstractmethod
    async def peers(self) -> list[PeerInfo]: ...

    @abc.abstractmethod
    async def stored(self) -> int:
        """Bundles the agent holds in its store."""


async def queued_deliveries(
    agent: BundleAgent, queue: asyncio.Queue, connected, who: str
) -> AsyncIterator[AgentDelivery]:
    """The deliveries a driver's reader task puts on `queue`, for as long as the caller
    iterates; while `connected()` is false, `agent.start()` is tried again every second."""
    log = logging.getLogger(f"c2dtn.{agent.name}")
    while True:
        if not connected():
            try:
                await agent.start()
            except AgentError as e:
                log.info("%s not reachable (%s); retrying", who, e)
                await asyncio.sleep(1.0)
                continue
        try:
            d = await asyncio.wait_for(queue.get(), 1.0)
        except asyncio.TimeoutError:
            continue
        yield d


def static_peers(cfg: NodeConfig, cla_name) -> list[PeerInfo]:
    """The node config's neighbours, each on the agent's name for its convergence layer."""
    return [PeerInfo(p.node, p.cla.host, f"{cla_name(p.cla)}:{p.cla.port}", "static") for p in cfg.peers]
