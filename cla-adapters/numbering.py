"""ipn node numbers: the agents that name nodes by number (ION, HDTN) give every node its
configured number or one derived from its name by the driver's own rule, and refuse two nodes
with the same number, naming them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from c2dtn.errors import ConfigError

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig


def node_numbers(cfg: NodeConfig, derive: Callable[[str], int]) -> dict[str, int]:
    """ipn node number of this node and of every node its config names (`[agent.<kind>]` number
    and numbers, else `derive(id)`)."""
    o = cfg.agent_options
    names = (
        {cfg.id}
        | {p.node for p in cfg.peers}
        | {r.to for r in cfg.routes if r.to != "*"}
        | {r.via for r in cfg.routes}
        | set(cfg.keys)
    )
    nums = {n: o["numbers"].get(n) or derive(n) for n in sorted(names)}
    if o["number"]:
        nums[cfg.id] = o["number"]
    seen: dict[int, str] = {}
    for n, k in nums.items():
        if k in seen:
            raise ConfigError(
                cfg.source,
                f"agent.{cfg.agent}.numbers",
                k,
                f"nodes {seen[k]!r} and {n!r} have the same ipn number",
                f"give one of them its own in [agent.{cfg.agent}] numbers",
            )
        seen[k] = n
    return nums
