"""The overlay node: the asyncio shell that runs overlay/machine.py's events.

It feeds the machine the agent's deliveries, the applications' submits and the clock, and does
what the machine says: fsync, then hand bundles to the agent; wake the applications; one timer
for the next deadline.  The gateways use it through its `port` (overlay/port.py); the process
around it (supervisor, receive loops, local API) is overlay/service.py.  The core answers
envelopes of app "ping" with "pong".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from c2dtn.overlay.agent import AgentError, BundleAgent
from c2dtn.overlay.agents import make_agent
from c2dtn.overlay.config import NodeConfig
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import CustodyStore
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.overlay.machine import AppsReady, Event, HandOver, NodeMachine
from c2dtn.overlay.port import Port, now_ms
from c2dtn.overlay.syncer import Syncer
from c2dtn.private import private_dir

log = logging.getLogger("c2dtn.node")

# The exit status of a node that stopped because its custody store failed an fsync: a service
# manager restarts it (EX_TEMPFAIL), and it reopens the store from what is on disk.
EXIT_STORE_FAILED = 75


class OverlayNode:
    def __init__(self, cfg: NodeConfig, agent: BundleAgent | None = None):
        self.cfg = cfg
        self.failed = False  # an fsync failed (_store_failed)
        self.closing = False
        self.exit_code = 0
        self.on_failure: Callable[[], None] = lambda: None  # the process stops (overlay/service.py)
        private_dir(cfg.storage)  # custody, sessions and the agent's store: orders in every one
        self.agent = agent or make_agent(cfg)
        self.core: OverlayCore | None = None
        self.machine: NodeMachine | None = None
        self.syncer: Syncer | None = None  # [node] fsync = "auto" or "thread": overlay/syncer.py
        if cfg.overlay:
            store = CustodyStore(
                cfg.custody_db, cfg.id, cfg.quota, cfg.groups, background_checkpoints=True, sync=cfg.fsync
            )
            self.core = OverlayCore(store, Codec(cfg.id, cfg.keys, cfg.groups), cfg.scheduler)
            # deadlines on the monotonic clock, envelopes stamped with the wall clock's
            self.machine = NodeMachine(self.core, time.monotonic(), lambda _t: now_ms())
            if cfg.fsync != "loop":
                self.syncer = Syncer(store.records, inline=cfg.fsync == "auto")
                self.syncer.on_failure = self._store_failed
            # what the gateways may use of this node (overlay/port.py)
            self.port = Port(self.core, self.syncer, cfg.storage, self.submitted, self.consumed)
        self.inbox_event = asyncio.Event()  # set when envelopes arrive for GET /recv
        self._handing = asyncio.Lock()  # hand-overs one at a time, in the order the machine gave them
        self._handovers: set[asyncio.Task] = set()
        self._timer: asyncio.Handle | None = None
        self._timer_at: float | None = None
        self.started_ms = now_ms()
        self.send_errors = 0
        # bundles (and their payload bytes) to and from the agent since the process started
        self.bundles = {"to_agent": 0, "to_agent_bytes": 0, "from_agent": 0, "from_agent_bytes": 0}
        self.udphc: dict | None = None  # the counts of the node's udphc link, when it runs one (overlay/hclink.py)
        self.extensions: list = []  # objects with async start() and stop(), run inside the node (gateways)

    @property
    def app_handlers(self) -> dict[str, Callable[[], None]]:
        """app -> callback run when envelopes of that app arrive (the gateways, Port.subscribe);
        their envelopes are not handed out by GET /recv."""
        return self.port.handlers if self.core is not None else {}

    def _store_failed(self, err: OSError) -> None:
        """An fsync failed: nothing more is acknowledged or handed to the agent, and the node stops
        (exit status EXIT_STORE_FAILED), to be restarted on what its store holds on disk."""
        if self.failed:
            return
        self.failed = True
        self.exit_code = EXIT_STORE_FAILED
        log.critical(
            "custody fsync failed (%s): nothing more is acknowledged or sent; node %s stops so that its "
            "store is reopened from what is on disk (exit status %d: restart it)",
            err,
            self.cfg.id,
            EXIT_STORE_FAILED,
        )
        self.on_failure()

    def start(self) -> None:
        """The machine's first deadline armed (the pump's first look)."""
        self._arm()

    async def close(self) -> None:
        """No timer and no hand-over from here on; those under way cancelled."""
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
        while self._handovers:
            tasks = list(self._handovers)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._handovers.difference_update(tasks)

    def close_store(self) -> None:
        if self.syncer is not None:
            self.syncer.stop()
        if self.core is not None:
            self.core.store.close()

    def endpoints(self) -> list[str]:
        """Our own endpoint, and one group endpoint per group we are in (named by the agent's
        driver: every member registers it)."""
        return self.agent.endpoints(list(self.cfg.groups))

    def _destinations(self, dst: str) -> list[tuple[str, str]]:
        # a node of another agent's island: the bundle goes to the relay, which reads the
        # destination from the container and carries it across (overlay.relay)
        members = self.cfg.groups.get(dst)
        return self.agent.destinations(self.cfg.relays.get(dst, dst), members)

    # -- inputs to the machine ---------------------------------------------------------------
    def submit_now(
        self, dst: str, body: bytes, lifetime_ms: int, priority: Priority, supersede: str | None, app: str
    ) -> tuple[int, list[asyncio.Task]]:
        """An application's envelope into custody; returns its seq and the hand-overs planned at
        once with it (flash, immediate), for the caller to wait on."""
        seq, events = self.machine.submit(dst, body, lifetime_ms, priority, supersede, app, time.monotonic())
        return seq, self._do(events)

    def submitted(self, priority: Priority) -> None:
        """Envelopes of this priority went into custody through the port (a gateway)."""
        self._do(self.machine.submitted(priority, time.monotonic()))

    def consumed(self, ids: list[int]) -> None:
        """The application took these (API, gateways): their acks are owed."""
        self._do(self.machine.consumed(ids, time.monotonic()))

    def wake(self) -> None:
        """Plan again (the agent restarted: its endpoints are registered again)."""
        self.machine.wake()
        self._arm()

    def take(self, batch: list) -> None:
        """Bundles the agent delivered, taken in one commit."""
        t0 = time.monotonic()
        self.bundles["from_agent"] += len(batch)
        self.bundles["from_agent_bytes"] += sum(len(d.payload) for d in batch)
        events = self.machine.bundles([d.payload for d in batch], time.monotonic())
        if log.isEnabledFor(logging.DEBUG):  # on the receive path: build the line only for -v
            ms, srcs = (time.monotonic() - t0) * 1000, ",".join(sorted({d.src_node for d in batch}))
            log.debug("took %d bundles from %s in one commit, %.1f ms", len(batch), srcs, ms)
        self._do(events)

    async def synced(self) -> None:
        """Every custody commit made so far is on disk (at once with [node] fsync = "loop").
        Raises OSError when the fsync failed: what waited must not be acknowledged."""
        if self.core is not None:
            await self.port.synced()

    # -- what the machine says -----------------------------------------------------------------
    def _do(self, events: list[Event]) -> list[asyncio.Task]:
        started = []
        for ev in events:
            if isinstance(ev, HandOver):
                if self.closing:  # (what it carries stays in custody for the next run)
                    self.machine.handed_over(ev, time.monotonic())
                    continue
                task = asyncio.get_running_loop().create_task(self._hand_over_locked(ev))
                self._handovers.add(task)
                # done, failed or cancelled (even before its first step): the machine hears of it
                task.add_done_callback(lambda t, h=ev: self._handed_over(t, h))
                started.append(task)
            elif isinstance(ev, AppsReady):  # the applications first (their GET /recv, handlers)
                self.inbox_event.set()
                for app, handler in self.app_handlers.items():
                    try:
                        handler()
                    except Exception:  # a bug in one application must not stop the node
                        log.exception("the %s handler failed", app)
        self._arm()
        return started

    def _arm(self) -> None:
        """One timer, at the machine's next deadline."""
        due = self.machine.next_deadline() if self.machine is not None and not self.closing else None
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = due
        if due is not None:
            loop, wait = asyncio.get_running_loop(), due - time.monotonic()
            # due now: after what is ready (a woken GET /recv first; a loop's timers run before it)
            self._timer = loop.call_soon(self._tick) if wait <= 0 else loop.call_at(loop.time() + wait, self._tick)

    def _tick(self) -> None:
        self._timer, self._timer_at = None, None
        try:
            self._do(self.machine.tick(time.monotonic()))
        except Exception:  # a bug (or a store error) must not leave the node with no timer
            log.exception("the node's timer failed")
            self._arm()

    def _handed_over(self, task: asyncio.Task, h: HandOver) -> None:
        self._handovers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("handing bundles to the agent failed", exc_info=task.exception())
        try:
            self._do(self.machine.handed_over(h, time.monotonic()))
        except Exception:
            log.exception("the node's machine failed after a hand-over")
            self._arm()

    async def _hand_over_locked(self, h: HandOver) -> None:
        async with self._handing:
            await self._hand_over(h.bundles, h.unsynced)

    async def _hand_over(self, out: list, unsynced: bool = False) -> None:
        if self.failed:  # the store is not what is on disk any more: nothing of it goes out
            return
        if out and not unsynced:
            # the bundles carry envelopes (their seqs must never be reused, as a power cut before
            # the fsync would) and acks (a peer releases custody on them): on disk first, unless
            # planned to go before it (custody module doc: reserved seqs, no fresh acks or marks)
            try:
                await self.synced()
            except OSError:  # logged by the syncer; the envelopes go again at their retry time
                return
        for b in out:
            if self.failed:
                return
            log.debug("bundle to %s: %d bytes, envelopes %s, acks %s", b.dst, len(b.payload), b.seqs, b.acks)
            for node, endpoint in self._destinations(b.dst):
                try:
                    await self.agent.send(node, endpoint, b.payload, lifetime_s=self.agent.bundle_lifetime_s)
                    self.bundles["to_agent"] += 1
                    self.bundles["to_agent_bytes"] += len(b.payload)
                except AgentError as e:
                    # custody keeps the envelopes; they go again at their retransmission time
                    self.send_errors += 1
                    log.warning("%s", e)
        if out and unsynced:
            # what they came from goes to disk now: the acks held back for it then ride the next
            # bundle (an answer's acks, the next answer) instead of going alone after the ack delay
            with contextlib.suppress(OSError):  # (logged by the syncer)
                await self.synced()
