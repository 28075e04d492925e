"""Topology files: nodes, links, LAN segments, addressing, routes and a schedule
of link events, read from TOML and checked before anything is built.

A topology file looks like:

    name = "nps-chain"
    [addressing]
    pool = "10.77.0.0/16"          # each link and LAN gets the next /24 from it

    [[nodes]]
    name = "h1"
    role = "host"                  # host | gateway | router | broker
    agent = "ion"                  # optional: the BPA this node runs (dtn7 if none is named);
                                   #   "relay": one agent per island of neighbours (overlay.relay)

    [[links]]                      # a point-to-point link, emulated by default
    a = "r2"
    b = "r3"
    profile = "cnr-tactical-2"     # a named profile, or an inline table
    reverse_profile = "lan"        # optional: the b -> a direction's own profile
    dil = true                     # `topo up --profile P` applies P to this link
    subnet = "10.77.9.0/24"        # optional
    emulate = true                 # false: a plain veth pair, no emulator
    cla = "udphc"                  # optional: the convergence layer BPAs use across it

    [[lans]]                       # an unemulated broadcast segment (a bridge)
    name = "deu"
    members = ["deu-u1", "deu-gw"]

    [[routes]]                     # optional; shortest-path routes are computed otherwise
    node = "h1"
    to = "10.77.9.0/24"
    via = "gw1"

    [[schedule]]
    at = "30s"                     # after `topo up` finished
    link = "r2-r3"                 # link name (default "<a>-<b>")
    action = "down"                # down | up | set
    carrier = false                # down only: true also drops carrier at both ends
    profile = "cnr-tactical-1"     # set only
    one_way = false                # set only: true changes only the link's a -> b direction
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from c2dtn.errors import ConfigError
from c2dtn.tomlfile import check_name, check_table, read_toml
from c2dtn.topologies.profiles import Profile, ProfileLibrary, load_builtin_profiles, parse_time, profile_from_table

ROLES = ("host", "gateway", "router", "broker")
ACTIONS = ("down", "up", "set")
PREFIX = "c2"
IFNAMSIZ = 15


@dataclass
class Iface:
    node: str
    name: str  # interface name inside the node's namespace
    address: str  # dotted quad
    prefixlen: int
    attached: str  # link or LAN name


@dataclass
class Node:
    name: str
    role: str
    agent: str | None = None  # the BPA it runs where the topology names one ("relay": one per island)
    ifaces: list[Iface] = field(default_factory=list)
    routes: list[tuple[str, str]] = field(default_factory=list)  # (destination subnet, gateway address)

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def address(self) -> str:
        return self.ifaces[0].address if self.ifaces else ""


@dataclass
class Link:
    name: str
    a: str
    b: str
    profile_ab: Profile
    profile_ba: Profile
    subnet: str
    dil: bool
    emulate: bool
    cla: str | None = None  # convergence layer BPAs use across this link (tcpcl, mtcp, udp)
    a_iface: Iface | None = None
    b_iface: Iface | None = None

    @property
    def netns(self) -> str:
        """Namespace of the link's channel emulator (userspace backend)."""
        return f"{PREFIX}e-{self.name}"


@dataclass
class Lan:
    name: str
    members: list[str]
    subnet: str

    @property
    def netns(self) -> str:
        return f"{PREFIX}l-{self.name}"


@dataclass
class Event:
    at_s: float
    link: str
    action: str
    profile: Profile | None = None
    carrier: bool = False
    one_way: bool = False


@dataclass
class Topology:
    name: str
    source: str
    description: str
    nodes: dict[str, Node]
    links: dict[str, Link]
    lans: dict[str, Lan]
    schedule: list[Event]
    profiles: ProfileLibrary

    def node(self, name: str) -> Node:
        if name not in self.nodes:
            raise ConfigError(self.source, "node", name, "no such node", "known: " + ", ".join(self.nodes))
        return self.nodes[name]

    def link_between(self, a: str, b: str) -> Link:
        for link in self.links.values():
            if {link.a, link.b} == {a, b}:
                return link
        raise ConfigError(
            self.source,
            "link",
            f"{a} {b}",
            "no link between these nodes",
            "links: " + ", ".join(f"{l.a}-{l.b}" for l in self.links.values()),
        )

    def find_link(self, name: str) -> Link:
        if name in self.links:
            return self.links[name]
        raise ConfigError(self.source, "link", name, "no such link", "links: " + ", ".join(self.links))


def builtin_dir() -> Path:
    return Path(str(resources.files("c2dtn.topologies").joinpath("data")))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.toml") if p.stem != "profiles")


def resolve_path(name_or_file: str) -> Path:
    p = Path(name_or_file)
    if p.suffix == ".toml" or p.exists():
        if not p.exists():
            raise ConfigError(name_or_file, "-", name_or_file, "no such file")
        return p
    cand = builtin_dir() / f"{name_or_file}.toml"
    if name_or_file == "profiles" or not cand.exists():
        raise ConfigError(
            "topology",
            "name",
            name_or_file,
            "no such topology",
            "built in: " + ", ".join(builtin_names()) + "; or give a .toml file",
        )
    return cand


def _profile(src: str, where: str, v: Any, lib: ProfileLibrary) -> Profile:
    if isinstance(v, str):
        return lib.get(v, src, where)
    if isinstance(v, dict):
        return profile_from_table(f"custom:{where}", v, src, f"{where}.")
    raise ConfigError(src, where, v, "must be a profile name or a table of profile fields")


def load(name_or_file: str, profile_override: str | None = None, schedule_file: str | None = None) -> Topology:
    path = resolve_path(name_or_file)
    src = str(path)
    data = read_toml(path)
    check_table(
        src,
        "(top level)",
        data,
        {"name", "description", "addressing", "profiles", "nodes", "links", "lans", "routes", "schedule"},
        {"nodes"},
    )
    lib = load_builtin_profiles()
    if "profiles" in data:
        lib.add_tables(data["profiles"], src)
    topo_name = check_name(src, "name", data.get("name", path.stem))

    addressing = data.get("addressing", {})
    check_table(src, "addressing", addressing, {"pool"}, set())
    pool_s = addressing.get("pool", "10.77.0.0/16")
    try:
        pool = ipaddress.ip_network(pool_s)
    except ValueError:
        raise ConfigError(src, "addressing.pool", pool_s, "not an IPv4 network", 'write e.g. "10.77.0.0/16"') from None
    if pool.version != 4 or pool.prefixlen > 24 or not pool.is_private:
        raise ConfigError(
            src,
            "addressing.pool",
            pool_s,
            "must be a private IPv4 network of /24 or larger",
            "test networks use private addresses inside their own namespaces",
        )
    free_subnets = pool.subnets(new_prefix=24)
    used: set[ipaddress.IPv4Network] = set()

    def take_subnet(where: str, given: Any) -> ipaddress.IPv4Network:
        if given is not None:
            try:
                net = ipaddress.ip_network(given)
            except ValueError:
                raise ConfigError(src, where, given, "not an IPv4 network") from None
            if net.version != 4 or net.num_addresses < 4 or not net.is_private:
                raise ConfigError(src, where, given, "must be a private IPv4 subnet with room for hosts")
        else:
            for net in free_subnets:
                if not any(net.overlaps(u) for u in used):
                    break
            else:
                raise ConfigError(src, "addressing.pool", pool_s, "too small for every link and LAN")
        if any(net.overlaps(u) for u in used):
            raise ConfigError(src, where, str(net), "overlaps another link's or LAN's subnet")
        used.add(net)
        return net

    # Nodes
    nodes: dict[str, Node] = {}
    raw_nodes = data["nodes"]
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(src, "nodes", raw_nodes, "must be a non-empty array of [[nodes]] tables")
    for i, n in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        check_table(src, where, n, {"name", "role", "agent"}, {"name"})
        nm = check_name(src, f"{where}.name", n["name"])
        if len(f"{PREFIX}-{nm}") > 40:
            raise ConfigError(src, f"{where}.name", nm, "too long")
        if nm in nodes:
            raise ConfigError(src, f"{where}.name", nm, "duplicate node name")
        role = n.get("role", "host")
        if role not in ROLES:
            raise ConfigError(src, f"{where}.role", role, "unknown role", "roles: " + ", ".join(ROLES))
        agent = n.get("agent")
        if agent is not None:
            from c2dtn.overlay.agents import kinds

            if agent not in kinds() + ["relay"]:
                raise ConfigError(
                    src, f"{where}.agent", agent, "unknown agent", "agents: " + ", ".join(kinds() + ["relay"])
                )
        nodes[nm] = Node(nm, role, agent)

    def node_ref(where: str, v: Any) -> str:
        if v not in nodes:
            raise ConfigError(src, where, v, "no such node", "nodes: " + ", ".join(nodes))
        return v

    def add_iface(node: str, peer: str, address: str, prefixlen: int, attached: str, where: str) -> Iface:
        ifname = f"{PREFIX}-{peer}"[:IFNAMSIZ]
        if any(x.name == ifname for x in nodes[node].ifaces):
            raise ConfigError(
                src,
                where,
                peer,
                f"interface name {ifname!r} on node {node!r} is taken",
                "names of a node's neighbours must differ in their first 12 characters",
            )
        iface = Iface(node, ifname, address, prefixlen, attached)
        nodes[node].ifaces.append(iface)
        return iface

    # Links
    links: dict[str, Link] = {}
    for i, l in enumerate(data.get("links", [])):
        where = f"links[{i}]"
        check_table(
            src,
            where,
            l,
            {"name", "a", "b", "profile", "reverse_profile", "dil", "subnet", "emulate", "cla"},
            {"a", "b"},
        )
        a = node_ref(f"{where}.a", l["a"])
        b = node_ref(f"{where}.b", l["b"])
        if a == b:
            raise ConfigError(src, f"{where}.b", b, "a link needs two different nodes")
        lname = check_name(src, f"{where}.name", l.get("name", f"{a}-{b}"))
        if len(f"{PREFIX}e-{lname}") > 40:
            raise ConfigError(src, f"{where}.name", lname, "too long for a namespace name")
        if lname in links:
            raise ConfigError(src, f"{where}.name", lname, "duplicate link name")
        if any({x.a, x.b} == {a, b} for x in links.values()):
            raise ConfigError(src, where, f"{a}-{b}", "a second link between the same two nodes")
        pab = _profile(src, f"{where}.profile", l.get("profile", "lan"), lib)
        pba = _profile(src, f"{where}.reverse_profile", l["reverse_profile"], lib) if "reverse_profile" in l else pab
        dil = l.get("dil", False)
        emulate = l.get("emulate", True)
        for key, v in (("dil", dil), ("emulate", emulate)):
            if not isinstance(v, bool):
                raise ConfigError(src, f"{where}.{key}", v, "must be true or false")
        cla = l.get("cla")
        if cla is not None and cla not in ("tcpcl", "mtcp", "udp", "udphc"):
            raise ConfigError(src, f"{where}.cla", cla, "unknown convergence layer", "tcpcl, mtcp, udp or udphc")
        net = take_subnet(f"{where}.subnet", l.get("subnet"))
        hosts = net.hosts()
        link = Link(lname, a, b, pab, pba, str(net), dil, emulate, cla)
        link.a_iface = add_iface(a, b, str(next(hosts)), net.prefixlen, lname, f"{where}.b")
        link.b_iface = add_iface(b, a, str(next(hosts)), net.prefixlen, lname, f"{where}.a")
        links[lname] = link

    # LAN segments
    lans: dict[str, Lan] = {}
    for i, s in enumerate(data.get("lans", [])):
        where = f"lans[{i}]"
        check_table(src, where, s, {"name", "members", "subnet"}, {"name", "members"})
        sname = check_name(src, f"{where}.name", s["name"])
        if sname in lans or sname in nodes:
            raise ConfigError(src, f"{where}.name", sname, "duplicate name (LANs and nodes share one namespace)")
        members = s["members"]
        if not isinstance(members, list) or len(members) < 2:
            raise ConfigError(src, f"{where}.members", members, "a LAN needs at least two member nodes")
        for j, m in enumerate(members):
            node_ref(f"{where}.members[{j}]", m)
        if len(set(members)) != len(members):
            raise ConfigError(src, f"{where}.members", members, "a node is listed twice")
        net = take_subnet(f"{where}.subnet", s.get("subnet"))
        if net.num_addresses - 2 < len(members):
            raise ConfigError(src, f"{where}.subnet", str(net), "too small for its members")
        hosts = net.hosts()
        for m in members:
            add_iface(m, sname, str(next(hosts)), net.prefixlen, sname, f"{where}.members")
        lans[sname] = Lan(sname, list(members), str(net))

    for nm, node in nodes.items():
        if not node.ifaces:
            raise ConfigError(src, "nodes", nm, "node is on no link or LAN")

    # --profile: replaces the profile of the links marked dil (the reverse too,
    # unless the file gave the reverse direction its own profile).
    if profile_override is not None:
        prof = lib.get(profile_override, "--profile", "--profile")
        dil_links = [l for l in links.values() if l.dil]
        if not dil_links:
            raise ConfigError(src, "links", "dil", "--profile given, but no link is marked dil = true")
        for l in data.get("links", []):
            link = links[l.get("name", f"{l['a']}-{l['b']}")]
            if link.dil:
                link.profile_ab = prof
                if "reverse_profile" not in l:
                    link.profile_ba = prof

    _compute_routes(nodes, links, lans)
    for i, r in enumerate(data.get("routes", [])):
        where = f"routes[{i}]"
        check_table(src, where, r, {"node", "to", "via"}, {"node", "to", "via"})
        nm = node_ref(f"{where}.node", r["node"])
        via = node_ref(f"{where}.via", r["via"])
        try:
            dst = str(ipaddress.ip_network(r["to"]))
        except ValueError:
            raise ConfigError(src, f"{where}.to", r["to"], "not an IPv4 network") from None
        gw = _neighbour_address(nodes, nm, via)
        if gw is None:
            raise ConfigError(src, f"{where}.via", via, f"not a neighbour of {nm}")
        nodes[nm].routes = [(d, g) for d, g in nodes[nm].routes if d != dst] + [(dst, gw)]

    schedule = _load_schedule(data.get("schedule", []), src, links, lib)
    if schedule_file:
        sdata = read_toml(Path(schedule_file))
        check_table(schedule_file, "(top level)", sdata, {"schedule", "profiles"}, {"schedule"})
        if "profiles" in sdata:
            lib.add_tables(sdata["profiles"], schedule_file)
        schedule = sorted(schedule + _load_schedule(sdata["schedule"], schedule_file, links, lib), key=lambda e: e.at_s)
    return Topology(topo_name, src, str(data.get("description", "")), nodes, links, lans, schedule, lib)


def _load_schedule(raw: Any, src: str, links: dict[str, Link], lib: ProfileLibrary) -> list[Event]:
    if not isinstance(raw, list):
        raise ConfigError(src, "schedule", raw, "must be an array of [[schedule]] tables")
    events = []
    for i, e in enumerate(raw):
        where = f"schedule[{i}]"
        check_table(src, where, e, {"at", "link", "action", "profile", "carrier", "one_way"}, {"at", "link", "action"})
        at = parse_time(e["at"], src, f"{where}.at")
        if e["link"] not in links:
            raise ConfigError(src, f"{where}.link", e["link"], "no such link", "links: " + ", ".join(links))
        if e["action"] not in ACTIONS:
            raise ConfigError(src, f"{where}.action", e["action"], "unknown action", "actions: down, up, set")
        prof = None
        if e["action"] == "set":
            if "profile" not in e:
                raise ConfigError(src, f"{where}.profile", None, "action 'set' needs a profile")
            prof = _profile(src, f"{where}.profile", e["profile"], lib)
        elif "profile" in e:
            raise ConfigError(src, f"{where}.profile", e["profile"], "only action 'set' takes a profile")
        carrier = e.get("carrier", False)
        if not isinstance(carrier, bool):
            raise ConfigError(src, f"{where}.carrier", carrier, "must be true or false")
        one_way = e.get("one_way", False)
        if not isinstance(one_way, bool):
            raise ConfigError(src, f"{where}.one_way", one_way, "must be true or false")
        events.append(Event(at, e["link"], e["action"], prof, carrier, one_way))
    return sorted(events, key=lambda ev: ev.at_s)


def _neighbour_address(nodes: dict[str, Node], node: str, via: str) -> str | None:
    mine = {i.attached for i in nodes[node].ifaces}
    for i in nodes[via].ifaces:
        if i.attached in mine:
            return i.address
    return None


def _compute_routes(nodes: dict[str, Node], links: dict[str, Link], lans: dict[str, Lan]) -> None:
    """Shortest-path (hop count) static routes from every node to every subnet.

    Breadth-first search over the node/segment graph; small enough that a graph
    library would add a dependency for ten lines.
    """
    adj: dict[str, list[str]] = {n: [] for n in nodes}
    for l in links.values():
        adj[l.a].append(l.b)
        adj[l.b].append(l.a)
    for s in lans.values():
        for m in s.members:
            adj[m].extend(x for x in s.members if x != m)
    subnets: dict[str, list[str]] = {}  # subnet -> nodes on it
    for l in links.values():
        subnets[l.subnet] = [l.a, l.b]
    for s in lans.values():
        subnets[s.subnet] = list(s.members)
    for src in nodes:
        # BFS from src, remember the first hop toward every node
        first: dict[str, str] = {src: src}
        q = deque([src])
        while q:
            u = q.popleft()
            for v in adj[u]:
                if v not in first:
                    first[v] = v if u == src else first[u]
                    q.append(v)
        dist: dict[str, int] = {src: 0}
        q = deque([src])
        while q:
            u = q.popleft()
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    q.append(v)
        routes = []
        for net, on in subnets.items():
            if src in on:
                continue
            reachable = [n for n in on if n in dist]
            if not reachable:
                continue
            target = min(reachable, key=lambda n: (dist[n], n))
            hop = first[target]
            gw = _neighbour_address(nodes, src, hop)
            if gw is not None:
                routes.append((net, gw))
        nodes[src].routes = routes
