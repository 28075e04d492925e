"""The node process (`c2dtn node run`, `c2dtn gateway run`): the overlay node (overlay/node.py)
with what keeps it running -- the agent's supervisor, the loops that take what the agent
delivers, the custody store's checkpoints, the local API (overlay/node_api.py) and the
extensions run inside it (the gateways).  A store whose fsync failed stops the process with
EXIT_STORE_FAILED, to be restarted on what is on disk."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from c2dtn.errors import C2Error
from c2dtn.overlay import sdnotify
from c2dtn.overlay.agents import make_agent
from c2dtn.overlay.config import NodeConfig
from c2dtn.overlay.hclink import HcLink
from c2dtn.overlay.malloc import tune_malloc
from c2dtn.overlay.metrics import MetricsServer
from c2dtn.overlay.node import OverlayNode
from c2dtn.overlay.node_api import LocalApi, local_status
from c2dtn.overlay.supervisor import Supervisor

log = logging.getLogger("c2dtn.node")

RECEIVE_BATCH = 64  # bundles taken in one commit at most
CHECKPOINT_EVERY_S = 0.5


class NodeService:
    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.hc = HcLink(cfg)  # udphc:// specs: the agent gets loopback ones in its configuration
        try:
            self.node = OverlayNode(cfg, make_agent(self.hc.agent_cfg))
            self.node.udphc = self.hc.counts if self.hc.used else None
            self.sup = Supervisor(self.hc.agent_cfg, on_restart=self._agent_restarted, agent=self.node.agent)
        except BaseException:
            self.hc.close_sockets()
            raise
        self.api = LocalApi(self.node, self.sup)
        self.metrics: MetricsServer | None = None
        if cfg.metrics_listen is not None:
            self.metrics = MetricsServer(cfg.metrics_listen, lambda: local_status(self.node, self.sup))
        self._tasks: list[asyncio.Task] = []

    async def run(self, stop: asyncio.Event) -> int:
        """Until `stop` is set (or the store fails); returns the exit status."""
        node = self.node
        node.on_failure = stop.set
        if self.metrics is not None:  # first: a port taken stops the node before anything started
            try:
                await self.metrics.start()
            except OSError as e:  # the operator asked for it: a node without it is not what was configured
                await self.metrics.close()
                host, port = self.metrics.listen
                raise C2Error(f"{self.cfg.source}: metrics.listen {host}:{port}: {e.strerror or e}") from None
        await self.hc.start()
        await self.sup.start()
        if node.syncer is not None:
            node.syncer.start()
        if node.core is not None:
            for ep in node.endpoints():
                await node.agent.register(ep)
            self._tasks = [asyncio.create_task(self._receive(ep)) for ep in node.endpoints()]
            self._tasks.append(asyncio.create_task(self._checkpoints()))
            node.start()
        await self.api.serve()
        for ext in node.extensions:
            await ext.start()
        log.info(
            "node %s up (overlay %s, agent pid %s)",
            self.cfg.id,
            "on" if node.core else "off",
            self.sup.proc.pid if self.sup.proc else "-",
        )
        sdnotify.notify(f"READY=1\nSTATUS=node {self.cfg.id} up, agent {self.cfg.agent}")
        every = sdnotify.watchdog_interval()
        if every is not None:
            self._tasks.append(asyncio.create_task(self._watchdog(every)))
        await stop.wait()
        sdnotify.notify("STOPPING=1")
        await self.close()
        return node.exit_code

    async def _watchdog(self, every: float) -> None:
        """WATCHDOG=1 while the event loop runs: a loop stuck past WatchdogSec gets the node
        restarted by its service manager."""
        while True:
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(every)

    async def close(self) -> None:
        for ext in self.node.extensions:
            with contextlib.suppress(Exception):
                await ext.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.node.close()
        await self.api.close()
        if self.metrics is not None:
            await self.metrics.close()
        await self.sup.stop()
        await self.hc.stop()
        self.node.close_store()

    async def _agent_restarted(self) -> None:
        if self.node.core is not None:
            for ep in self.node.endpoints():
                await self.node.agent.register(ep)
            self.node.wake()

    async def _receive(self, endpoint: str) -> None:
        """Take what the agent delivers; what arrived while the last commit ran is taken in
        one commit (one fsync for a burst of bundles instead of one each)."""
        q: asyncio.Queue = asyncio.Queue(maxsize=RECEIVE_BATCH)
        ended = object()  # put by the reader when the stream ends (a queue get per bundle, not a task)

        async def read() -> None:
            try:
                async for d in self.node.agent.deliveries(endpoint):
                    await q.put(d)
            finally:
                with contextlib.suppress(asyncio.QueueFull):  # (full: seen below, once drained)
                    q.put_nowait(ended)

        reader = asyncio.create_task(read())
        try:
            while True:
                if q.empty() and reader.done():
                    await reader  # the stream ended: raise what ended it
                    return
                d = await q.get()
                if d is ended:
                    await reader
                    return
                batch = [d]
                while not q.empty() and len(batch) < RECEIVE_BATCH:
                    d = q.get_nowait()
                    if d is ended:
                        q.put_nowait(ended)
                        break
                    batch.append(d)
                self.node.take(batch)
        finally:
            reader.cancel()

    async def _checkpoints(self) -> None:
        """The custody store's WAL copied into its database in a thread, off the message path."""
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            await asyncio.sleep(CHECKPOINT_EVERY_S)
            try:
                await loop.run_in_executor(None, self.node.core.store.checkpoint)
                failing = False
            except Exception as e:  # retried; past the backstop the commits checkpoint themselves
                if not failing:  # one line per run of failures, not one every half second
                    log.warning("custody checkpoint failed (retrying): %s", e)
                failing = True


def run_node(cfg: NodeConfig, extensions: list[Callable[[OverlayNode], object]] = ()) -> None:
    """Run a node until SIGTERM/SIGINT (inside cfg.netns when set), with extensions
    (made from the node, started after it: the gateways)."""
    import resource
    import signal

    # clients, far sessions, the agent's connections and custody's files share one table: the
    # usual soft limit (1024) is reached long before memory is; the hard limit is the box's
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sdnotify.connect()  # (in the namespace the manager is in)
    if cfg.netns:
        from pyroute2 import netns

        netns.setns(cfg.netns)  # the whole process, before any thread or socket exists
    try:
        import setproctitle

        setproctitle.setproctitle(f"c2node {cfg.id}")
    except ImportError:  # cosmetic only
        pass
    if not tune_malloc():
        log.info("not glibc: malloc's thresholds left as they are (large envelopes cost more page faults)")

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        service = NodeService(cfg)
        service.node.extensions = [make(service.node) for make in extensions]
        return await service.run(stop)

    try:
        import uvloop  # a faster event loop: the node's per-envelope overhead is mostly loop and I/O

        code = uvloop.run(main())
    except ImportError:
        code = asyncio.run(main())
    if code:
        raise SystemExit(code)
