"""Node configurations for a running testbed topology.

Given the nodes that run a BPA (relays and gateways) and the ones that also run
the overlay, write one node TOML each: the BPA neighbours each node reaches
without passing another BPA node become its peers, static routes follow the IP
path, and every pair of overlay nodes gets a fresh shared key.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from c2dtn.errors import ConfigError
from cla_adapters.spec import DEFAULT_PORTS
from topologies import testbed


def node_path(st: dict[str, Any], src: str, dst: str) -> list[str]:
    """The nodes an IP packet from src to dst passes, both ends included."""
    nodes = [src]
    for ls, d in testbed.path_between(st, src, dst):
        nodes.append(ls["b"] if d == "ab" else ls["a"])
    if nodes[-1] != dst:  # the last hops were over LANs: walk the routes
        nodes.append(dst)
    return nodes


def _facing(st: dict[str, Any], node: str, towards: str) -> tuple[str, str | None]:
    """node's address on the link toward `towards` (else its first address), and that link's CLA."""
    for ls in st["links"].values():
        if {ls["a"], ls["b"]} == {node, towards}:
            return (ls["a_addr"] if ls["a"] == node else ls["b_addr"]), ls.get("cla")
    return testbed.node_address(st, node), None


def write_configs(st: dict[str, Any], bpa_nodes: list[str], overlay_nodes: list[str], out_dir: str | Path,
                  cla: str = "tcpcl", store: str = "sled", extra: str | dict[str, str] = "",
                  per_link_cla: bool = True, groups: dict[str, list[str]] | None = None,
                  scheduler: dict[str, int] | None = None) -> dict[str, Path]:
    """per_link_cla: follow the links' own `cla` (else use `cla` everywhere).
    scheduler: [scheduler] settings for every overlay node, over the defaults written here.
    groups: group name -> overlay nodes; each member gets the group's key, and every BPA
    routes by epidemic so that one bundle for the group reaches all members."""
    groups = groups or {}
    if cla not in DEFAULT_PORTS or cla == "http":
        raise ConfigError("--cla", "--cla", cla, "unknown convergence layer", "tcpcl, mtcp or udp")
    for n in bpa_nodes + overlay_nodes:
        testbed.node_netns(st, n)
    missing = [n for n in overlay_nodes if n not in bpa_nodes]
    if missing:
        raise ConfigError("--overlay", "--overlay", ",".join(missing), "overlay nodes must also run a BPA")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys: dict[frozenset, str] = {}
    for i, a in enumerate(overlay_nodes):
        for b in overlay_nodes[i + 1:]:
            keys[frozenset((a, b))] = secrets.token_hex(32)
    for g, members in groups.items():
        if any(m not in overlay_nodes for m in members):
            raise ConfigError("--group", f"--group {g}", ",".join(members), "group members must run the overlay")
        keys[frozenset((g,))] = secrets.token_hex(32)
    any_udp = cla == "udp" or (per_link_cla and any(ls.get("cla") == "udp" for ls in st["links"].values()))
    rated = any(((ls.get(d) or {}).get("rate_bps")) for ls in st["links"].values() for d in ("profile_ab", "profile_ba"))
    paths = {}
    for n in bpa_nodes:
        peers: dict[str, tuple[str, str]] = {}  # node -> (address, cla)
        routes: list[tuple[str, str]] = []
        for m in bpa_nodes:
            if m == n:
                continue
            path = node_path(st, n, m)
            first = next(x for x in path[1:] if x in bpa_nodes)
            if first == m:
                prev = path[path.index(m) - 1]
                addr, link_cla = _facing(st, m, prev)
                peers[m] = (addr, (link_cla if per_link_cla else None) or cla)
            routes.append((m, first))
        lines = [
            f"# c2dtn node {n} on topology {st['topology']} (written by c2dtn node configs)",
            "[node]", f'id = "{n}"', f'storage = "{(out / n).resolve()}"',
            f'netns = "{testbed.node_netns(st, n)}"', f"overlay = {'true' if n in overlay_nodes else 'false'}", "",
            "[agent]", 'kind = "dtn7"', f'store = "{store}"', "web_port = 3000",
        ]
        # listen on every convergence layer a neighbour uses toward this node
        schemes = sorted({cla} | {c for _, c in peers.values()})
        lines += ["listen = [" + ", ".join(f'"{c}://0.0.0.0:{DEFAULT_PORTS[c]}"' for c in schemes) + "]",
                  'janitor = "3s"'] + (['routing = "epidemic"'] if groups else []) + [""]
        for m, (addr, c) in peers.items():
            lines += ["[[agent.peers]]", f'node = "{m}"', f'cla = "{c}://{addr}:{DEFAULT_PORTS[c]}"', ""]
        for m, via in routes:
            lines += ["[[agent.routes]]", f'to = "{m}"', f'via = "{via}"', ""]
        if n in overlay_nodes:
            lines.append("[keys]")
            for m in overlay_nodes:
                if m != n:
                    lines.append(f'{m} = "{keys[frozenset((n, m))]}"')
            mine = {g: ms for g, ms in groups.items() if n in ms}
            lines += [f'{g} = "{keys[frozenset((g,))]}"' for g in mine] + [""]
            if mine:
                lines += ["[groups]"] + [f"{g} = {json.dumps(list(ms))}" for g, ms in mine.items()] + [""]
        sched = {}
        if any_udp:
            # a bundle must fit one datagram on a 1500-byte MTU anywhere on its way: no IP fragments to lose;
            # on a radio link a second of linger and ack delay lets several envelopes and acks share a bundle
            sched = {"aggregate_bytes": 1200, "linger_ms": 1000, "ack_delay_ms": 1000}
        elif not rated:
            # no link with a rate limit anywhere (a LAN): 64 kB bundles, so that 10 kB messages share
            # them and the BPAs handle a sixth as many (measured: 0.58 -> 0.91 of bare dtnd's throughput);
            # where a radio is on the way, a big bundle would hold flash traffic behind it for minutes
            sched = {"aggregate_bytes": 65536}
        sched.update(scheduler or {})
        if sched and n in overlay_nodes:
            lines += ["[scheduler]"] + [f"{k} = {int(v)}" for k, v in sched.items()] + [""]
        more = extra.get(n, "") if isinstance(extra, dict) else extra  # TOML for every node, or per node
        if more:
            lines.append(more)
        p = out / f"{n}.toml"
        p.write_text("\n".join(lines) + "\n")
        p.chmod(0o600)  # holds keys
        paths[n] = p
    return paths
