"""BundleAgent: the one interface the overlay uses for any BPA.

A driver per agent implements it (overlay.agents.dtn7 for dtn7-rs).  Node ids
are plain names ("gw4"); each driver maps them to its agent's EIDs.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass


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


class BundleAgent(abc.ABC):
    name: str = "abstract"

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect to the (running) agent; idempotent."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def register(self, endpoint: str) -> None:
        """Register a local endpoint (e.g. "c2dtn") so bundles for it are kept for us."""

    @abc.abstractmethod
    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float,
                   priority: int = 3) -> None:
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
