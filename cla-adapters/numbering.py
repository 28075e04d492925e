"""ipn node numbers: the agents that name nodes by number (ION, HDTN) give every node its
configured number or one derived from its name by the driver's own rule, and refuse two nodes
with the same number, naming them."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from c2dtn.errors import ConfigError
from c2dtn.tomlfile import NAME

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig


def derived_number(node: str) -> int:
    """A node's ipn number where its config gives none, as ION's and dtn7-rs's drivers derive it
    (HDTN's keeps to even numbers: its own rule)."""
    return 1 + zlib.crc32(node.encode()) % (1 << 31)


def node_numbers(cfg: NodeConfig, derive: Callable[[str], int]) -> dict[str, int]:
    """ipn node number of this node and of every node its config names or numbers (`[agent.<kind>]`
    number and numbers, else `derive(id)`): peers, routes, relays and their targets, the nodes it
    shares keys with (not its groups: a group has no node number)."""
    o = cfg.agent_options
    field = f"agent.{cfg.agent}"
    for n in o["numbers"]:
        if not NAME.fullmatch(str(n)):
            raise ConfigError(cfg.source, f"{field}.numbers", n, "not a node id", "letters, digits, '-' or '_'")
    if o["number"] and o["numbers"].get(cfg.id, o["number"]) != o["number"]:
        raise ConfigError(
            cfg.source,
            f"{field}.number",
            o["number"],
            f"numbers gives {cfg.id!r} {o['numbers'][cfg.id]}",
            "give this node one number, in number or in numbers",
        )
    names = (
        {cfg.id}
        | {p.node for p in cfg.peers}
        | {r.to for r in cfg.routes if r.to != "*"}
        | {r.via for r in cfg.routes}
        | set(cfg.relays)
        | set(cfg.relays.values())
        | set(o["numbers"])
        | set(cfg.keys)
    ) - set(cfg.groups)
    nums = {n: o["numbers"].get(n) or derive(n) for n in sorted(names)}
    if o["number"]:
        nums[cfg.id] = o["number"]
    seen: dict[int, str] = {}
    for n, k in nums.items():
        if k in seen:
            where = "number" if o["number"] and cfg.id in (n, seen[k]) else "numbers"
            raise ConfigError(
                cfg.source,
                f"{field}.{where}",
                k,
                f"nodes {seen[k]!r} and {n!r} have the same ipn number",
                f"give one of them its own in [{field}] numbers",
            )
        seen[k] = n
    return nums
