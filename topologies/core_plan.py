"""A topology as a CORE session: the nodes, links and servers `topo up --engine core` asks
CORE's daemon for (topologies/core_engine.py sends it), worked out without any I/O.

What a CORE session of a c2dtn topology holds:
- one CORE node (type DEFAULT, no model, so no services: the testbed installs the routes) per
  topology node, named as the node is;
- per emulated link, either an emulator node `c2e-<link>` between the two ends, with ports
  c2a (facing a) and c2b (facing b), where c2dtn's userspace channel emulator runs (the
  "userspace" link mode: these machines have no netem), or one direct CORE link whose link
  options carry the profile both ways (the "netem" mode: CORE's options are netem);
- per LAN one CORE switch;
- in distributed mode, a server per node: the CORE daemon puts each node on its server and
  joins each link's bridge on every server to the controlling host's with GRE taps (a star):
  a link's frames cross hosts only when its ends are on different ones.  Emulator nodes
  stay on the host whose daemon builds the session (where `topo link`, the schedule and
  captures reach their control sockets): what is emulated is emulated on one server, and a
  tunnel carries a radio link's frames only to or from its emulator, at LAN speed.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c2dtn.errors import ConfigError
from c2dtn.tomlfile import check_name, check_table
from c2dtn.topologies.model import Topology
from c2dtn.topologies.profiles import Profile

LINK_MODES = ("userspace", "netem")


@dataclass
class Server:
    name: str
    host: str  # its IP address (CORE's tunnels are made to an address)
    patterns: list[str] = field(default_factory=list)  # node names (fnmatch) placed on this server


@dataclass
class Servers:
    """A servers file: where the controlling host is reached from the servers, and the servers."""

    source: str
    controller: str  # CORE's distributed_address: the controlling host's address the servers reach
    servers: list[Server]


def _ip(src: str, where: str, v: Any) -> str:
    try:
        return str(ipaddress.ip_address(v if isinstance(v, str) else ""))
    except ValueError:
        raise ConfigError(src, where, v, "must be an IP address (CORE makes its tunnels to an address)") from None


def load_servers(path: str | Path) -> Servers:
    """A servers file: `controller` (the controlling host's address on the lab network) and
    [[server]] tables of name, host (an IP address) and nodes (names or fnmatch patterns).
    Nodes no pattern names stay on the controlling host."""
    src = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(src, "-", src, "no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(src, "-", src, f"not TOML: {e}") from None
    check_table(src, "(top level)", data, {"controller", "server"}, {"controller", "server"})
    controller = _ip(src, "controller", data["controller"])
    raw = data["server"]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(src, "server", raw, "must be a non-empty array of [[server]] tables")
    out: list[Server] = []
    for i, s in enumerate(raw):
        where = f"server[{i}]"
        check_table(src, where, s, {"name", "host", "nodes"}, {"name", "host", "nodes"})
        name = check_name(src, f"{where}.name", s["name"])
        host = _ip(src, f"{where}.host", s["host"])
        nodes = s["nodes"]
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
            raise ConfigError(src, f"{where}.nodes", nodes, "must be a non-empty list of node names or patterns")
        if any(o.name == name for o in out):
            raise ConfigError(src, f"{where}.name", name, "named twice")
        if host == controller or any(o.host == host for o in out):
            raise ConfigError(src, f"{where}.host", host, "a second server at this address")
        out.append(Server(name, host, list(nodes)))
    return Servers(src, controller, out)


def place(topo: Topology, servers: Servers | None) -> dict[str, str | None]:
    """Each topology node's server (None: the controlling host).  A node two servers claim, or
    a pattern that names no node, is an error naming it and the file."""
    where: dict[str, str | None] = {n: None for n in topo.nodes}
    for s in servers.servers if servers else []:
        src = servers.source if servers else ""
        for pat in s.patterns:
            hits = [n for n in topo.nodes if fnmatch.fnmatchcase(n, pat)]
            if not hits:
                raise ConfigError(
                    src, f"{s.name}.nodes", pat, "names no node of " + topo.name, "nodes: " + ", ".join(topo.nodes)
                )
            for n in hits:
                if where[n] not in (None, s.name):
                    raise ConfigError(src, f"{s.name}.nodes", pat, f"puts {n} on a second server ({where[n]})")
                where[n] = s.name
    return where


def link_options(p: Profile) -> dict[str, Any]:
    """A profile as CORE's link options (netem on the sending node's interface): rate in bit/s,
    delay and jitter in microseconds, loss and duplication in percent, the queue in packets.
    CORE's options have no burst loss, reordering, corruption or link set-up: a profile that
    uses one is refused, naming it, rather than run as something else."""
    unexpressed = (
        ("gilbert_elliott", p.gilbert_elliott, p.gilbert_elliott is not None),
        ("reorder", p.reorder, p.reorder > 0),
        ("corrupt", p.corrupt, p.corrupt > 0),
        ("link_setup", p.link_setup_s, p.link_setup_s > 0),
        ("queue_bytes", p.queue_bytes, p.queue_bytes is not None),
        # (CORE takes whole percents of duplication)
        ("duplicate", p.duplicate, abs(p.duplicate * 100 - round(p.duplicate * 100)) > 1e-9),
    )
    for what, value, used in unexpressed:
        if used:
            raise ConfigError(
                "profile " + p.name,
                what,
                value,
                "CORE's link options cannot express it",
                "run the link in an emulator node (--link-backend userspace)",
            )
    return {
        "bandwidth": int(p.rate_bps) if p.rate_bps else 0,
        "delay": int(round(p.delay_s * 1e6)),
        "jitter": int(round(p.jitter_s * 1e6)),
        "loss": round(p.loss * 100, 6),
        "dup": int(round(p.duplicate * 100)),
        "buffer": int(p.queue_packets),
        "unidirectional": True,
    }


OUTAGE_OPTIONS = {"loss": 100.0}  # a silent outage under CORE's link options: every frame lost


def _iface(name: str, mac: str, address: str | None = None, prefixlen: int = 0, iface_id: int = 0) -> dict[str, Any]:
    d: dict[str, Any] = {"id": iface_id, "name": name, "mac": mac}
    if address:
        d["ip4"], d["ip4_mask"] = address, prefixlen
    return d


def session_plan(topo: Topology, mode: str, servers: Servers | None = None) -> dict[str, Any]:
    """The session CORE's daemon is asked to build: {"servers", "nodes", "links"} as plain data
    (topologies/core_session.py turns it into gRPC calls), plus what the testbed needs after:
    the emulator nodes per link and the links whose two ends are on different hosts
    ("crossing": their frames go through CORE's tunnels)."""
    if mode not in LINK_MODES:
        raise ConfigError("--link-backend", "--link-backend", mode, "unknown link mode on CORE", "userspace or netem")
    where = place(topo, servers)
    nodes: list[dict[str, Any]] = []
    ids: dict[str, int] = {}
    ifids: dict[str, int] = {}

    def add(name: str, kind: str, server: str | None, x: float, y: float) -> None:
        if name in ids:  # a topology node named as an emulator or switch node would be
            raise ConfigError(
                topo.source, "nodes", name, "on CORE this name is an emulator's or a LAN switch's", "rename the node"
            )
        ids[name] = len(nodes) + 1
        ifids[name] = 0
        nodes.append({"id": ids[name], "name": name, "type": kind, "server": server, "x": round(x), "y": round(y)})

    def next_if(name: str) -> int:
        ifids[name] += 1
        return ifids[name] - 1

    def mac(name: str) -> str:
        # locally administered, unique per (node, interface): both ends of an emulated link are
        # told each other's MAC before anything runs (no ARP crosses a radio)
        n, i = ids[name], ifids[name] - 1
        return f"02:c2:{n >> 8 & 0xFF:02x}:{n & 0xFF:02x}:{i >> 8 & 0xFF:02x}:{i & 0xFF:02x}"

    def new_iface(name: str, ifname: str, address: str | None = None, prefixlen: int = 0) -> dict[str, Any]:
        i = next_if(name)
        return _iface(ifname, mac(name), address, prefixlen, i)

    # positions only matter to a person looking at the session in CORE's GUI: nodes on a circle
    names = list(topo.nodes)
    pos = {}
    for i, n in enumerate(names):
        a = 2 * math.pi * i / max(len(names), 1)
        pos[n] = (500 + 400 * math.cos(a), 500 + 400 * math.sin(a))
        add(n, "DEFAULT", where[n], *pos[n])

    links: list[dict[str, Any]] = []
    emulators: dict[str, str] = {}
    for link in topo.links.values():
        a, b = link.a, link.b
        ai, bi = link.a_iface, link.b_iface
        assert ai is not None and bi is not None
        ia = new_iface(a, ai.name, ai.address, ai.prefixlen)
        ib = new_iface(b, bi.name, bi.address, bi.prefixlen)
        if link.emulate and mode == "userspace":
            e = link.netns
            (xa, ya), (xb, yb) = pos[a], pos[b]
            add(e, "DEFAULT", None, (xa + xb) / 2, (ya + yb) / 2)
            emulators[link.name] = e
            links.append({"link": link.name, "node1": a, "node2": e, "iface1": ia, "iface2": new_iface(e, "c2a")})
            links.append({"link": link.name, "node1": e, "node2": b, "iface1": new_iface(e, "c2b"), "iface2": ib})
        elif link.emulate:
            links.append(
                {
                    "link": link.name,
                    "node1": a,
                    "node2": b,
                    "iface1": ia,
                    "iface2": ib,
                    "options_ab": link_options(link.profile_ab),
                    "options_ba": link_options(link.profile_ba),
                }
            )
        else:
            links.append({"link": link.name, "node1": a, "node2": b, "iface1": ia, "iface2": ib})
    switches: dict[str, str] = {}
    for lan in topo.lans.values():
        sw = f"c2l-{lan.name}"
        # on the server most of its members are on (ties: the first member's)
        counts: dict[str | None, int] = {}
        for m in lan.members:
            counts[where[m]] = counts.get(where[m], 0) + 1
        home = max(counts, key=lambda s: (counts[s], s == where[lan.members[0]]))
        xs = [pos[m][0] for m in lan.members]
        ys = [pos[m][1] for m in lan.members]
        add(sw, "SWITCH", home, sum(xs) / len(xs), sum(ys) / len(ys))
        switches[lan.name] = sw
        for m in lan.members:
            mi = next(x for x in topo.nodes[m].ifaces if x.attached == lan.name)
            links.append(
                {
                    "link": lan.name,
                    "node1": m,
                    "node2": sw,
                    "iface1": new_iface(m, mi.name, mi.address, mi.prefixlen),
                    "iface2": {"id": next_if(sw)},  # the switch's port (CORE numbers it; unnamed)
                }
            )
    server_of = {n["name"]: n["server"] for n in nodes}
    crossing = [f"{l['node1']} - {l['node2']}" for l in links if server_of[l["node1"]] != server_of[l["node2"]]]
    return {
        "servers": [{"name": s.name, "host": s.host} for s in servers.servers] if servers else [],
        "nodes": nodes,
        "links": links,
        "ids": ids,
        "emulators": emulators,
        "switches": switches,
        "crossing": crossing,
        "mode": mode,
    }


def per_server(plan: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """What each server runs of a plan: its nodes, and the links whose frames cross between it
    and another host ("" is the controlling host).  (CORE 9.2 puts every link's bridge on every
    server, joined to the controlling host's by GRE; a link's frames cross only between hosts
    where its ends are, floods excepted.)"""
    out: dict[str, dict[str, list[str]]] = {}
    server_of = {n["name"]: n["server"] or "" for n in plan["nodes"]}
    for n in plan["nodes"]:
        out.setdefault(server_of[n["name"]], {"nodes": [], "crossing": []})["nodes"].append(n["name"])
    for l in plan["links"]:
        s1, s2 = server_of[l["node1"]], server_of[l["node2"]]
        if s1 != s2:
            for s in (s1, s2):
                out[s]["crossing"].append(f"{l['node1']} - {l['node2']}")
    return out


# every namespace of a topology, on either engine: no IPv6 (no ND/MLD chatter on kbit/s links);
# a node's also forwards, without reverse-path filtering
QUIET = {"net.ipv6.conf.all.disable_ipv6": 1, "net.ipv6.conf.default.disable_ipv6": 1}
FORWARD = {"net.ipv4.ip_forward": 1, "net.ipv4.conf.all.rp_filter": 0, "net.ipv4.conf.default.rp_filter": 0}


def _sysctl(settings: dict[str, int]) -> list[str]:
    return ["sysctl", "-q", "-w", *[f"{k}={v}" for k, v in settings.items()]]


def node_commands(topo: Topology, plan: dict[str, Any]) -> dict[str, list[list[str]]]:
    """What runs inside each CORE node's namespace (by its testbed name) once CORE made its
    interfaces and addresses, as the namespaces engine sets its own: sysctls, each interface's
    MTU from its link's profile, the emulator ports promiscuous, static neighbours across an
    emulated link, offloads off where the userspace emulator reads frames, and the routes."""
    out: dict[str, list[list[str]]] = {}
    macs = {}
    for l in plan["links"]:
        for end in ("1", "2"):
            i = l["iface" + end]
            if "mac" in i:  # (a switch's port has none of its own)
                macs[(l["node" + end], i["name"])] = i["mac"]
    for node in topo.nodes.values():
        out[node.netns] = [_sysctl(QUIET | FORWARD)]
    for e in plan["emulators"].values():
        out[e] = [_sysctl(QUIET)]
    for link in topo.links.values():
        ai, bi = link.a_iface, link.b_iface
        assert ai is not None and bi is not None
        na, nb = topo.nodes[link.a].netns, topo.nodes[link.b].netns
        out[na].append(["ip", "link", "set", "dev", ai.name, "mtu", str(link.profile_ab.mtu), "up"])
        out[nb].append(["ip", "link", "set", "dev", bi.name, "mtu", str(link.profile_ba.mtu), "up"])
        if not link.emulate:
            continue
        for ns, me, peer, peer_node in ((na, ai, bi, link.b), (nb, bi, ai, link.a)):
            mac = macs[(peer_node, peer.name)]
            out[ns].append(["ip", "neigh", "replace", peer.address, "lladdr", mac, "dev", me.name, "nud", "permanent"])
        e = plan["emulators"].get(link.name)
        if e is not None:  # the userspace emulator between the ends: it sees whole, real frames
            mtu = str(max(link.profile_ab.mtu, link.profile_ba.mtu))
            for port in ("c2a", "c2b"):
                out[e].append(["ip", "link", "set", "dev", port, "mtu", mtu, "promisc", "on", "up"])
                out[e].append(["ethtool", "-K", port, "tx", "off", "tso", "off", "gso", "off", "gro", "off"])
            for ns, me in ((na, ai), (nb, bi)):
                out[ns].append(["ethtool", "-K", me.name, "tx", "off", "tso", "off", "gso", "off", "gro", "off"])
    for node in topo.nodes.values():
        for dst, gw in node.routes:
            out[node.netns].append(["ip", "route", "replace", dst, "via", gw])
    return out
