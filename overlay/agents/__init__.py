"""The Bundle Protocol Agents a node can run, by `[agent] kind`.

Each driver module in this package registers its class (`@register("dtn7")`);
`agent_class(kind)` finds it and `make_agent(cfg)` builds the one a node config names.
Nothing outside this package and cla-adapters/ names an agent (tests/test_structure.py):
an agent is one driver file here, and the rest of c2dtn reads what the drivers declare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from c2dtn.errors import C2Error

if TYPE_CHECKING:
    from c2dtn.overlay.agent import BundleAgent
    from c2dtn.overlay.config import NodeConfig

AGENTS: dict[str, type[BundleAgent]] = {}
DEFAULT = "dtn7"  # the agent of a node whose config names none, and of the testbed's nodes


def register(kind: str) -> Callable[[type[BundleAgent]], type[BundleAgent]]:
    def deco(cls: type[BundleAgent]) -> type[BundleAgent]:
        cls.name = kind
        AGENTS[kind] = cls
        return cls

    return deco


def _load() -> None:
    """Import every driver module of this package (each registers itself)."""
    import importlib
    import pkgutil

    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in NOT_DRIVERS:
            importlib.import_module(f"{__name__}.{mod.name}")
    _loaded = True


_loaded = False

NOT_DRIVERS = {"builds"}  # the package's helper modules


def variants() -> dict[str, tuple[str, str, dict[str, str]]]:
    """The benchmark variants the drivers declare: name -> (agent, the CLA under it, node -> TOML)."""
    return {v: (k, cla, opts) for k in kinds() for v, (cla, opts) in agent_class(k).testbed_variants.items()}


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
