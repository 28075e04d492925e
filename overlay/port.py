"""The node's port: all that a gateway (MQTT, CoAP) may use of the overlay node.

The gateways in ip-gateway/ import this module and nothing else of overlay/
(tests/test_structure.py holds them to it), so the node's insides can change without
touching them.  A `Port` is made by the node it serves (`OverlayNode.port`), or around a
bare custody core and syncer where no agent runs (the near-side benchmarks).

    port.submit(items, marks)   -> seqs     envelopes into custody (one durable commit)
    port.commit_mark()          -> int|None what a reply must wait for (None: on disk already)
    await port.durable(mark)                that commit is on disk (OSError: it may be lost)
    port.take(limit, app, after)-> [Delivery]
    port.consumed(ids)                      the application is done with these
    port.marks_answered(keys)               a client heard its publishes were taken
    port.subscribe(app, callback)           envelopes of `app` go to callback, not GET /recv
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from c2dtn.overlay.custody import Mark
from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES, Priority
from c2dtn.overlay.store import Delivery, QuotaExceeded, StoreFull, TooLarge
from c2dtn.overlay.tally import LOCAL_BUCKETS_S, Histogram  # the gateways' own counts for status and metrics

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig
    from c2dtn.overlay.core import OverlayCore
    from c2dtn.overlay.node import OverlayNode
    from c2dtn.overlay.syncer import Syncer

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Delivery",
    "Histogram",
    "Item",
    "LOCAL_BUCKETS_S",
    "Mark",
    "Port",
    "Priority",
    "QuotaExceeded",
    "StoreFull",
    "TooLarge",
    "load_config",
    "now_ms",
    "request",
    "run",
]

# one envelope to submit: (destination, body, lifetime in ms, priority, supersession key, app)
Item = tuple[str, bytes, int, Priority, "str | None", str]


def now_ms() -> int:
    """The node's clock: wall-clock milliseconds (envelopes carry their creation time)."""
    return int(time.time() * 1000)


class Port:
    def __init__(
        self,
        core: OverlayCore,
        syncer: Syncer | None,
        storage: Path,
        on_submitted: Callable[[Priority], None] = lambda _p: None,
        on_consumed: Callable[[list[int]], None] | None = None,
    ):
        """on_submitted: told the most urgent priority of each submit (the node plans);
        on_consumed: told the ids the application is done with (default: the core alone)."""
        self._core, self._syncer = core, syncer
        self._on_submitted = on_submitted
        self._on_consumed = on_consumed or (lambda ids: core.consumed(ids))
        self.storage = storage  # the node's private folder: a gateway keeps its session file here
        self.handlers: dict[str, Callable[[], None]] = {}  # app -> called when its envelopes arrive

    # -- who and what ---------------------------------------------------------------
    @property
    def node_id(self) -> str:
        return self._core.node

    def peers(self) -> list[str]:
        """The nodes (not groups) this node shares a key with: the destinations it may name."""
        codec = self._core.codec
        return [k for k in codec.keys if k not in codec.groups]

    @property
    def aggregate_bytes(self) -> int:
        """How much the scheduler packs into one bundle."""
        return self._core.sched.cfg.aggregate_bytes

    # -- custody ----------------------------------------------------------------------
    def submit(self, items: Iterable[Item], marks: list[Mark] | None = None) -> list[int | None]:
        """Envelopes into custody in one durable commit; their seqs (None: one a mark shows was
        already taken).  Raises QuotaExceeded (StoreFull) or TooLarge, having kept nothing."""
        items = list(items)
        seqs = self._core.store.submit_many(items, now_ms(), marks)
        took = [it[3] for it, seq in zip(items, seqs) if seq is not None]
        if took:
            self._on_submitted(min(took))
        return seqs

    def commit_mark(self) -> int | None:
        """The durable commit a reply to what was just submitted must wait for, or None when every
        commit is on disk already (or each commit makes its own fsync: [node] fsync = "loop")."""
        if self._syncer is None or not self._syncer.pending():
            return None
        return self._syncer.store.commits

    async def durable(self, mark: int | None = None) -> None:
        """Return once the commit `mark` (default: every commit so far) is on disk.  Raises
        OSError when the fsync failed: what waited must not be acknowledged."""
        if mark is not None and self._syncer is not None:
            while self._syncer.synced_upto < mark:
                await self.synced()
            return
        await self.synced()

    async def synced(self) -> None:
        """Every custody commit made so far is on disk (OSError: the fsync failed)."""
        store = self._core.store
        token = store.sync_point()
        if self._syncer is not None:
            await self._syncer.synced()
        store.synced(token)

    def marks_answered(self, keys: Iterable[str]) -> None:
        self._core.store.marks_answered(keys)

    # -- what arrived -------------------------------------------------------------------
    def take(self, limit: int = 1000, app: str | None = None, after: int = 0) -> list[Delivery]:
        """Envelopes waiting for the application, oldest first (of `app`, ids above `after`)."""
        return self._core.take(limit, app, after=after)

    def consumed(self, ids: list[int]) -> None:
        """The application is done with these: they leave the inbox, their origins get acks."""
        self._on_consumed(ids)

    def subscribe(self, app: str, callback: Callable[[], None]) -> None:
        """Envelopes of `app` are this caller's: callback runs when some arrive, and GET /recv
        does not hand them out."""
        self.handlers[app] = callback


# -- running a node with gateways (the `c2dtn gateway` commands) ----------------------------
def load_config(path: str) -> NodeConfig:
    from c2dtn.overlay.config import load_node_config

    return load_node_config(path)


def run(cfg: NodeConfig, gateways: list[Callable[[Port], object]]) -> None:
    """Run the node until SIGTERM/SIGINT with these gateways, each made from its port."""
    from c2dtn.overlay.service import run_node

    def on_port(make: Callable[[Port], object]) -> Callable[[OverlayNode], object]:
        return lambda node: make(node.port)

    run_node(cfg, [on_port(make) for make in gateways])


def request(config: str, method: str, path: str):
    """One request to the local API of the node CONFIG describes (ApiError names what failed)."""
    from c2dtn.overlay.cli import api

    return api(config, method, path)
