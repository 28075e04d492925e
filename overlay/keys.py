"""Keys for a set of boxes: a pair key for every two overlay nodes and a key per group,
each box's share in a file of its own (I/O-free but for write_shares).

A box's share is a TOML file with its `[keys]` (one per other node, one per group it is in)
and its `[groups]`; a node config names it with `[node] keys_file`, so the config itself
holds no secret and may be readable by all, while the share is mode 0600."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from c2dtn.errors import ConfigError
from c2dtn.tomlfile import NAME

KEY_BYTES = 32  # HMAC-SHA256 keys (overlay.envelope)


def make_keys(nodes: list[str], groups: dict[str, list[str]]) -> dict[frozenset, str]:
    """A fresh key for every pair of nodes and for every group (hex)."""
    for n in list(nodes) + list(groups):
        if not NAME.fullmatch(n):
            raise ConfigError("c2dtn keys", "node", n, "a name is 1-40 letters, digits, '-' or '_'")
    if len(set(nodes)) != len(nodes):
        raise ConfigError("c2dtn keys", "node", ",".join(nodes), "a node is named twice")
    keys: dict[frozenset, str] = {}
    for i, a in enumerate(nodes):
        for b in nodes[i + 1 :]:
            keys[frozenset((a, b))] = secrets.token_hex(KEY_BYTES)
    for g, members in groups.items():
        if g in nodes:
            raise ConfigError("c2dtn keys", "--group", g, "a group's name must not be a node's")
        strangers = [m for m in members if m not in nodes]
        if strangers or len(set(members)) < 2:
            raise ConfigError(
                "c2dtn keys",
                f"--group {g}",
                ",".join(members),
                "a group has at least two members, all of them nodes named here",
            )
        keys[frozenset((g,))] = secrets.token_hex(KEY_BYTES)
    return keys


def share_tables(n: str, nodes: list[str], keys: dict[frozenset, str], groups: dict[str, list[str]]) -> list[str]:
    """Node n's [keys] (one per other node and per group of n's) and [groups], as TOML lines."""
    lines = ["[keys]"] + [f'{m} = "{keys[frozenset((n, m))]}"' for m in nodes if m != n]
    mine = {g: ms for g, ms in groups.items() if n in ms}
    lines += [f'{g} = "{keys[frozenset((g,))]}"' for g in mine] + [""]
    if mine:
        lines += ["[groups]"] + [f"{g} = {json.dumps(list(ms))}" for g, ms in mine.items()] + [""]
    return lines


def write_shares(
    out_dir: str | Path, nodes: list[str], groups: dict[str, list[str]], force: bool = False
) -> dict[str, Path]:
    """<out_dir>/<node>.keys.toml for every node, mode 0600 (the folder 0700).  Refuses to
    replace shares already there unless `force`: new keys cut every box still on the old."""
    out = Path(out_dir)
    paths = {n: out / f"{n}.keys.toml" for n in nodes}
    there = [str(p) for p in paths.values() if p.exists()]
    if there and not force:
        raise ConfigError(
            "c2dtn keys",
            "OUT_DIR",
            str(out),
            f"shares already there ({', '.join(there)})",
            "new keys cut every box still holding the old ones; --force replaces them",
        )
    keys = make_keys(nodes, groups)
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    for n, p in paths.items():
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
            fh.write(
                f"# c2dtn keys for {n} (written by c2dtn keys): keep it mode 0600\n"
                + "\n".join(share_tables(n, nodes, keys, groups))
            )
    return paths
