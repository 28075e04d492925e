"""The relay between agent islands: one box, one agent per island, bundles carried across.

A BPv6 agent (IBR-DTN) and a BPv7 one (dtn7-rs, ION) cannot exchange bundles, and agents
of different kinds do not share EID schemes, CLAs or routing; a mission whose nations
bring different BPAs meets at a relay.  The relay runs one agent per island (each from an
ordinary node configuration, its own ports and storage) and forwards the overlay's bundle
payloads between them unchanged:

    [relay]
    id = "tacnet"
    storage = "/var/lib/c2dtn/tacnet"          # the relay's durable queue (relay.db)
    netns = "c2-tacnet"                        # optional
    islands = ["tacnet.dtn7.toml", "tacnet.ibrdtn.toml"]   # node configs, one per agent kind
    max_bytes = 268435456                      # optional bound on what it holds

An island's members are the nodes its node configuration names (peers, route targets); a
route to "*" makes an island the one for every node no island names.  An overlay node of
one island reaches a node of another by addressing the relay (`[relays] prt-gw = "tacnet"`
in its node configuration).

Why the relay needs no keys: a container carries its sender and destination in the clear
beside the seal of its envelopes (overlay.envelope); the relay reads the destination, never
opens or changes anything, and the end nodes check the seal with the keys only they share.
Acknowledgements are envelopes too and cross the same way, so custody stays end to end: the
relay holds a payload durably from the moment its agent delivered it until the other island's
agent has taken it, and what it loses in a crash before its commit the origin sends again.

RelayCore is the I/O-free part (which island a payload goes to, what the queue holds);
Relay is the asyncio shell that supervises the agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agent import AgentError
from c2dtn.overlay.config import NodeConfig, load_node_config, parse_listen
from c2dtn.overlay.envelope import TAG_BYTES, EnvelopeError, split_container
from c2dtn.overlay.store.queue import QueueError, SqliteQueue
from c2dtn.private import private_dir
from c2dtn.tomlfile import check_name, read_toml

log = logging.getLogger("c2dtn.relay")

FORWARD_BATCH = 64  # rows taken from the queue per round
HOLD_S = 3600.0  # what an island's agent has not taken in an hour is dropped (its origin resends)


class Unroutable(C2Error):
    """A payload the relay cannot carry: names why (malformed, unknown destination, a loop)."""


@dataclass
class RelayConfig:
    source: str
    id: str
    storage: Path
    islands: list[NodeConfig]
    netns: str | None = None
    max_bytes: int = 256 << 20
    metrics_listen: tuple[str, int] | None = None  # [relay] metrics: Prometheus (overlay/metrics.py)

    @property
    def db(self) -> Path:
        return self.storage / "relay.db"


RELAY_TOP = table(
    "(top level)",
    "A relay config has one table.",
    [
        F("relay", "table", None, "The relay.", '{ id = "tacnet", storage = "/var/lib/c2dtn/tacnet", islands = [] }'),
    ],
    doc="relay",
)
RELAY = table(
    "relay",
    "One box, one agent per island, bundles carried across unchanged ([the bundle overlay](design.md)).",
    [
        F("id", "name", None, "The relay's node id (what [relays] in the nodes' configs name).", '"tacnet"'),
        F("storage", "path", None, "The relay's durable queue (relay.db).", '"/var/lib/c2dtn/tacnet"'),
        F("netns", "string", "(none)", "Run inside this network namespace.", '"c2-tacnet"'),
        F(
            "islands",
            "array of paths",
            None,
            "Node configs, one per agent kind (at least two; relative to this file).",
            '["tacnet.bpv7.toml", "tacnet.bpv6.toml"]',
        ),
        F(
            "max_bytes",
            "integer",
            str(RelayConfig.max_bytes),
            "Bound on what the relay holds (at least 65536).",
            "268435456",
            "bytes",
        ),
        F(
            "metrics",
            "string",
            "(none: off)",
            "Serve Prometheus metrics here (address:port, as a node's [metrics] listen): what it holds per "
            "island, what it accepted, forwarded and dropped, and its agents.",
            '"127.0.0.1:9465"',
        ),
    ],
    doc="relay",
)


def load_relay_config(path: str | Path) -> RelayConfig:
    src = str(path)
    data = read_toml(path)
    RELAY_TOP.check(src, "(top level)", data)
    r = RELAY.check(src, "relay", data["relay"])
    isl = r["islands"]
    if not isinstance(isl, list) or len(isl) < 2 or not all(isinstance(p, str) for p in isl):
        raise ConfigError(src, "relay.islands", isl, "must list at least two node configuration files")
    base = Path(src).parent
    islands = [load_node_config(p if Path(p).is_absolute() else base / p) for p in isl]
    kinds = Counter(c.agent for c in islands)
    dup = next((k for k, n in kinds.items() if n > 1), None)
    if dup:
        raise ConfigError(src, "relay.islands", isl, f"two islands run {dup}: one island per agent kind")
    stores = Counter(c.storage.resolve() for c in islands)
    if any(n > 1 for n in stores.values()):
        raise ConfigError(src, "relay.islands", isl, "each island needs its own [node] storage")
    cfg = RelayConfig(src, check_name(src, "relay.id", r["id"]), Path(str(r["storage"])), islands)
    if "netns" in r:
        if not isinstance(r["netns"], str) or not r["netns"]:
            raise ConfigError(src, "relay.netns", r["netns"], "must be a namespace name")
        cfg.netns = r["netns"]
    mb = r.get("max_bytes", cfg.max_bytes)
    if not isinstance(mb, int) or isinstance(mb, bool) or mb < 1 << 16:
        raise ConfigError(src, "relay.max_bytes", mb, "must be a whole number of at least 65536")
    cfg.max_bytes = mb
    if "metrics" in r:
        cfg.metrics_listen = parse_listen(src, "relay.metrics", r["metrics"])
    return cfg


def island_members(cfg: NodeConfig) -> set[str]:
    """The nodes an island's node configuration names (its agent reaches them)."""
    return ({p.node for p in cfg.peers} | {r.to for r in cfg.routes}) - {cfg.id}


def payload_destination(payload: bytes) -> str:
    """The destination node of an overlay bundle payload, read without any key: the container
    names it in the clear (its envelopes are encrypted).  Checked as strictly as a node checks
    it (envelope.split_container): the relay checks no tag, so this is all that stands between
    a peer's bytes and its event loop."""
    try:
        _, dst, seal, _, _ = split_container(payload)
    except EnvelopeError as e:
        raise Unroutable(f"not an overlay container ({e.reason}): {e}") from None
    if len(seal) <= TAG_BYTES + 1:  # (an empty array of maps, sealed)
        raise Unroutable("not an overlay container: no envelopes")
    return dst


@dataclass
class RelayCore:
    """Which island a payload goes to, and the durable queue of what waits for an island's
    agent (store/queue.py: one row per payload).  No sockets, no clock of its own."""

    members: dict[str, set[str]]  # island -> nodes it reaches (may hold "*")
    queue: SqliteQueue
    max_bytes: int = 256 << 20
    held_bytes: int = 0
    counters: Counter = field(default_factory=Counter)

    @classmethod
    def open(cls, path: Path | str, members: dict[str, set[str]], max_bytes: int = 256 << 20) -> RelayCore:
        queue = SqliteQueue(path)
        return cls(members, queue, max_bytes, queue.bytes_held())

    def route(self, from_island: str, payload: bytes) -> tuple[str, str]:
        """(island, destination node) for a payload that arrived from `from_island`."""
        dst = payload_destination(payload)
        to = next((i for i, m in self.members.items() if dst in m), None)
        if to is None:
            to = next((i for i, m in self.members.items() if "*" in m and i != from_island), None)
        if to is None:
            raise Unroutable(
                f"no island reaches node {dst!r} (islands: "
                + "; ".join(f"{i}: {', '.join(sorted(m))}" for i, m in self.members.items())
                + ")"
            )
        if to == from_island:
            raise Unroutable(f"node {dst!r} is in island {from_island}, where the bundle came from (a loop)")
        return to, dst

    def accept(self, from_island: str, payloads: list[bytes], now_ms: int) -> list[str]:
        """Queue what arrived from one island, in one commit; returns the islands to wake.
        A payload that cannot be routed, or that the bound has no room for, is dropped with
        one log line (its origin sends it again)."""
        rows, adding = [], 0
        for p in payloads:
            try:
                to, dst = self.route(from_island, p)
            except Unroutable as e:
                self.counters["unroutable"] += 1
                log.warning("dropped a %d-byte bundle from island %s: %s", len(p), from_island, e)
                continue
            if self.held_bytes + adding + len(p) > self.max_bytes:
                self.counters["dropped_full"] += 1
                log.warning(
                    "dropped a %d-byte bundle for %s: the relay holds %d bytes (max_bytes %d)",
                    len(p),
                    dst,
                    self.held_bytes,
                    self.max_bytes,
                )
                continue
            rows.append((to, dst, p, now_ms))
            adding += len(p)
        if rows:
            self.queue.add(rows)  # QueueError: nothing of it kept, nor counted
            self.held_bytes += adding
            self.counters["accepted"] += len(rows)
        return sorted({r[0] for r in rows})

    def take(self, island: str, limit: int = FORWARD_BATCH) -> list[tuple[int, str, bytes, int]]:
        """The oldest rows waiting for `island`'s agent: (id, dst, payload, held_ms)."""
        return self.queue.take(island, limit)

    def done(self, rows: list[tuple[int, str, bytes, int]], counter: str = "forwarded") -> None:
        """The agent took these (or they expired): they leave the queue."""
        if not rows:
            return
        self.queue.delete([r[0] for r in rows])
        self.held_bytes -= sum(len(r[2]) for r in rows)
        self.counters[counter] += len(rows)

    def held(self) -> dict[str, int]:
        return self.queue.counts()

    def close(self) -> None:
        self.queue.close()


class Relay:
    """The asyncio shell: a supervisor per island, a receiver and a forwarder per island."""

    def __init__(self, cfg: RelayConfig):
        from c2dtn.overlay.supervisor import Supervisor

        self.cfg = cfg
        private_dir(cfg.storage)
        # the relay takes each agent's endpoint itself: to the drivers it is the overlay there
        self.islands = {c.agent: dataclasses.replace(c, overlay=True) for c in cfg.islands}
        for c in self.islands.values():
            private_dir(c.storage)
        self.core = RelayCore.open(cfg.db, {k: island_members(c) for k, c in self.islands.items()}, cfg.max_bytes)
        self.sups = {k: Supervisor(c, on_restart=self._restarted(k)) for k, c in self.islands.items()}
        self.wake = {k: asyncio.Event() for k in self.islands}
        self._tasks: list[asyncio.Task] = []
        self.started = time.monotonic()
        self.metrics = None
        if cfg.metrics_listen is not None:
            from c2dtn.overlay.metrics import MetricsServer

            self.metrics = MetricsServer(cfg.metrics_listen, self.status)

    def status(self) -> dict:
        """What the relay's metrics serve (overlay/metrics.py families)."""
        return {
            "node": self.cfg.id,
            "agent": "+".join(sorted(self.islands)),
            "uptime_s": time.monotonic() - self.started,
            "agent_restarts": sum(s.restarts for s in self.sups.values()),
            "send_errors": 0,
            "relay": {
                "counters": dict(self.core.counters),
                "held": self.core.held(),
                "held_bytes": self.core.held_bytes,
                "max_bytes": self.core.max_bytes,
                "agents_up": {k: s.proc is not None and s.proc.returncode is None for k, s in self.sups.items()},
            },
        }

    def _restarted(self, island: str):
        async def again() -> None:
            agent = self.sups[island].agent
            await agent.register(agent.endpoint)
            self.wake[island].set()

        return again

    async def run(self, stop: asyncio.Event) -> None:
        if self.metrics is not None:  # first: a port taken stops the relay before its agents start
            try:
                await self.metrics.start()
            except OSError as e:
                host, port = self.metrics.listen
                raise C2Error(f"{self.cfg.source}: relay.metrics {host}:{port}: {e.strerror or e}") from None
        try:
            await asyncio.gather(*(self._start(sup) for sup in self.sups.values()))  # agents start side by side
            for k in self.islands:
                self._tasks += [asyncio.create_task(self._receive(k)), asyncio.create_task(self._forward(k))]
            log.info(
                "relay %s up: %s",
                self.cfg.id,
                "; ".join(f"{k} island ({', '.join(sorted(self.core.members[k]))})" for k in self.islands),
            )
            held = self.core.held()
            if held:
                log.info("holding from before: %s", ", ".join(f"{n} for {k}" for k, n in held.items()))
            await stop.wait()
        finally:
            await self.close()

    @staticmethod
    async def _start(sup) -> None:
        await sup.start()
        await sup.agent.start()
        await sup.agent.register(sup.agent.endpoint)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for sup in self.sups.values():
            with contextlib.suppress(Exception):
                await sup.stop()
        if self.metrics is not None:
            await self.metrics.close()
        self.core.close()

    async def _receive(self, island: str) -> None:
        agent = self.sups[island].agent
        q: asyncio.Queue = asyncio.Queue(maxsize=FORWARD_BATCH)

        async def read() -> None:
            while True:
                try:
                    async for d in agent.deliveries(agent.endpoint):
                        await q.put(d.payload)
                except AgentError as e:  # the agent is restarting: its supervisor brings it back
                    log.warning("island %s: %s", island, e)
                    await asyncio.sleep(1.0)

        reader = asyncio.create_task(read())
        try:
            while True:
                batch = [await q.get()]
                while not q.empty() and len(batch) < FORWARD_BATCH:
                    batch.append(q.get_nowait())
                try:
                    for to in self.core.accept(island, batch, int(time.time() * 1000)):
                        self.wake[to].set()
                except QueueError:  # a full disk: the origins send again; the relay carries on
                    log.exception("could not queue %d bundles from island %s", len(batch), island)
        finally:
            reader.cancel()

    async def _forward(self, island: str) -> None:
        agent = self.sups[island].agent
        backoff = 0.5
        while True:
            rows = self.core.take(island)
            if not rows:
                self.wake[island].clear()
                await self.wake[island].wait()
                continue
            now = int(time.time() * 1000)
            old = [r for r in rows if now - r[3] > HOLD_S * 1000]
            self.core.done(old, "expired")
            sent = []
            try:
                for r in rows:
                    if r in old:
                        continue
                    await agent.send(r[1], agent.endpoint, r[2], lifetime_s=HOLD_S)
                    sent.append(r)
                backoff = 0.5
            except AgentError as e:  # the agent is down or refuses: keep the rest, try again
                log.warning(
                    "island %s: %s; %d bundles wait (retrying in %.1f s)", island, e, len(rows) - len(sent), backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(10.0, backoff * 2)
            finally:
                self.core.done(sent)


def run_relay(cfg: RelayConfig) -> None:
    import signal

    if cfg.netns:
        from pyroute2 import netns

        netns.setns(cfg.netns)  # the whole process, before any thread or socket exists
    with contextlib.suppress(ImportError):  # cosmetic only
        import setproctitle

        setproctitle.setproctitle(f"c2relay {cfg.id}")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        await Relay(cfg).run(stop)

    asyncio.run(main())
