"""The Bundle Protocol Agents a node can run, by `[agent] kind`.

Each driver module registers its class (`@register("dtn7")`); `agent_class(kind)`
finds it and `make_agent(cfg)` builds the one a node config names.  Nothing
outside a driver knows an agent's daemon, ports, EIDs or configuration files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from c2dtn.errors import C2Error

if TYPE_CHECKING:
    from c2dtn.overlay.agent import BundleAgent
    from c2dtn.overlay.config import NodeConfig

AGENTS: dict[str, type[BundleAgent]] = {}


def register(kind: str) -> Callable[[type[BundleAgent]], type[BundleAgent]]:
    def deco(cls: type[BundleAgent]) -> type[BundleAgent]:
        cls.name = kind
        AGENTS[kind] = cls
        return cls

    return deco


def _load() -> None:
    from c2dtn.overlay.agents import dtn7, hdtn, ibrdtn, ion  # noqa: F401  (the drivers register themselves)


def kinds() -> list[str]:
    _load()
    return sorted(AGENTS)


def agent_class(kind: str) -> type[BundleAgent]:
    _load()
    try:
        return AGENTS[kind]
    except KeyError:
        raise C2Error(f"no driver for agent {kind!r}: agents are {', '.join(sorted(AGENTS))}") from None


def make_agent(cfg: NodeConfig) -> BundleAgent:
    """The driver of the agent `cfg` names, for that node."""
    return agent_class(cfg.agent).for_node(cfg)
