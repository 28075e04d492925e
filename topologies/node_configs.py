"""Node configurations for a running testbed topology.

Given the nodes that run a BPA (relays and gateways) and the ones that also run
the overlay, write one node TOML each: the BPA neighbours each node reaches
without passing another BPA node become its peers, static routes follow the IP
path, and every pair of overlay nodes gets a fresh shared key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from c2dtn.cla_adapters.spec import DEFAULT_PORTS
from c2dtn.errors import ConfigError
from c2dtn.overlay.agents import DEFAULT, agent_class
from c2dtn.overlay.envelope import Priority
from c2dtn.overlay.keys import make_keys, share_tables
from c2dtn.topologies import testbed


def node_path(st: dict[str, Any], src: str, dst: str) -> list[str]:
    """The nodes an IP packet from src to dst passes, both ends included."""
    nodes = [src]
    for ls, d in testbed.path_between(st, src, dst):
        nodes.append(ls["b"] if d == "ab" else ls["a"])
    if nodes[-1] != dst:  # the last hops were over LANs: walk the routes
        nodes.append(dst)
    return nodes


def _link(st: dict[str, Any], a: str, b: str) -> dict[str, Any] | None:
    """The link between nodes a and b, if they share one."""
    return next((ls for ls in st["links"].values() if {ls["a"], ls["b"]} == {a, b}), None)


def _ltp_rates(st: dict[str, Any], node: str, peers: list[str]) -> dict[str, int]:
    """Bits per second of LTP data `node` may send to each peer across a rated link: 90 % of
    the link's rate (which counts each frame's Ethernet, IP and UDP headers, and LTP adds its
    own to every 1 kB segment)."""
    out = {}
    for other in peers:
        ls = _link(st, node, other)
        prof = ls and (ls.get("profile_ab") if ls["a"] == node else ls.get("profile_ba"))
        if prof and prof.get("rate_bps"):
            out[other] = max(8, int(prof["rate_bps"] * 0.9))
    return out


def _facing(st: dict[str, Any], node: str, towards: str) -> tuple[str, str | None]:
    """node's address on the link toward `towards` (else its first address), and that link's CLA."""
    ls = _link(st, node, towards)
    if ls is not None:
        return (ls["a_addr"] if ls["a"] == node else ls["b_addr"]), ls.get("cla")
    return testbed.node_address(st, node), None


def testbed_clas(kind: str) -> tuple[str, ...]:
    """The CLAs the testbed runs agent `kind` on, its default first, where not every one it
    speaks (the driver's BundleAgent.testbed_clas); empty: any."""
    return agent_class(kind).testbed_clas


def harness_cla(kind: str, cla: str) -> str:
    """The CLA the harness runs agent `kind` on when `cla` is asked for."""
    allowed = testbed_clas(kind)
    return cla if not allowed or cla in allowed else allowed[0]


def _toml_table(name: str, table: dict[str, Any]) -> list[str]:
    """A driver's testbed settings as TOML lines (strings, integers and flat tables of them:
    what BundleAgent.testbed_options gives; no library here writes TOML)."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, bool):
            return "true" if v else "false"
        return f'"{v}"' if isinstance(v, str) else str(int(v))

    return [f"[{name}]", *(f"{k} = {value(v)}" for k, v in table.items()), ""] if table else []


def topology_agents(st: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The BPA the topology names per node (a node it names none for runs the default), and its
    relay node (`agent = "relay"`), if it has one."""
    named = {n: v["agent"] for n, v in st["nodes"].items() if v.get("agent")}
    relays = sorted(n for n, a in named.items() if a == "relay")
    if len(relays) > 1:
        raise ConfigError(
            st.get("source", st["topology"]),
            "nodes.agent",
            ", ".join(relays),
            "one relay node per topology: islands meet there",
        )
    return {n: a for n, a in named.items() if a != "relay"}, (relays[0] if relays else None)


def override_agents(st: dict[str, Any], agents: dict[str, str]) -> None:
    """Run each named node on another agent than the topology says (`perf bft --agent
    usa-gw=hdtn`): only a node the topology already puts on an island of its relay, so the
    islands still meet there.  Node "*" (`--agent ion`): every node, where the topology has
    no relay."""
    from c2dtn.overlay.agents import kinds

    named, relay = topology_agents(st)
    if "*" in agents:  # every node on one agent: a topology of one island
        kind = agents["*"]
        if relay is not None or len(agents) > 1:
            raise ConfigError(
                "--agent",
                "--agent",
                kind,
                f"{st['topology']} has islands of different agents",
                "name nodes on its relay's islands (NODE=KIND)",
            )
        if kind not in kinds():
            raise ConfigError("--agent", "--agent", kind, f"unknown agent; one of {', '.join(kinds())}")
        for v in st["nodes"].values():
            v["agent"] = kind
        return
    for node, kind in agents.items():
        if node not in named or relay is None:
            raise ConfigError(
                "--agent",
                "node",
                node,
                "names no node on an island of this topology's relay",
                f"those are {', '.join(sorted(named))}" if named else f"{st['topology']} has no relay",
            )
        if kind not in kinds():
            raise ConfigError("--agent", node, kind, f"unknown agent; one of {', '.join(kinds())}")
        st["nodes"][node]["agent"] = kind


def write_configs(
    st: dict[str, Any],
    bpa_nodes: list[str],
    overlay_nodes: list[str],
    out_dir: str | Path,
    cla: str = "tcpcl",
    store: str = "sled",
    extra: str | dict[str, str] = "",
    per_link_cla: bool = True,
    groups: dict[str, list[str]] | None = None,
    scheduler: dict[str, int] | None = None,
    agent: str | dict[str, str] = DEFAULT,
    relay: str | None = None,
) -> dict[str, Path]:
    """agent: the BPA every node runs (`[agent] kind`), or node -> kind (the others run the
    default agent).
    Nodes of one kind form an island; islands of different kinds meet at `relay` (a BPA node
    that runs one agent per island, each on its own ports: overlay.relay), whose file is a
    relay configuration naming one node configuration per island.
    per_link_cla: follow the links' own `cla` (else use `cla` everywhere); an agent in
    the driver runs on its testbed CLAs (BundleAgent.testbed_clas) everywhere (`cla` if it is one).
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
    islands: dict[str, list[str]] = {}  # agent kind -> its nodes (the relay is in every island)
    for n in bpa_nodes:
        if n != relay:
            islands.setdefault(agent if isinstance(agent, str) else agent.get(n, DEFAULT), []).append(n)
    if relay is not None:
        if relay not in bpa_nodes or relay in overlay_nodes:
            raise ConfigError("--relay", "--relay", relay, "the relay must be a BPA node that runs no overlay")
        if len(islands) < 2 or groups:
            raise ConfigError(
                "--relay",
                "--relay",
                relay,
                "a relay joins islands of different agents (without groups)",
                f"agents here: {', '.join(islands)}",
            )
    elif len(islands) > 1:
        raise ConfigError(
            "--agent",
            "--agent",
            agent,
            "nodes of different agents cannot exchange bundles",
            "name a relay node between their islands",
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for g, members in groups.items():
        if any(m not in overlay_nodes for m in members):
            raise ConfigError("--group", f"--group {g}", ",".join(members), "group members must run the overlay")
    keys = make_keys(overlay_nodes, groups)
    any_udp = (
        cla == "udp"
        or any(harness_cla(k, cla) == "udp" for k in islands if testbed_clas(k))
        or (per_link_cla and any(ls.get("cla") in ("udp", "udphc") for ls in st["links"].values()))
    )
    rated = any(
        ((ls.get(d) or {}).get("rate_bps")) for ls in st["links"].values() for d in ("profile_ab", "profile_ba")
    )
    paths = {}
    relay_files = []
    # the nodes running an agent, numbered in name order: one CBOR byte a number up to 23
    numbers = {n: i for i, n in enumerate(sorted(bpa_nodes), 1)}
    for k_index, (kind, members) in enumerate(sorted(islands.items())):
        island = members + ([relay] if relay else [])
        k_cla, k_per_link = (harness_cla(kind, cla), False) if testbed_clas(kind) else (cla, per_link_cla)

        def port(node: str, c: str, k_index: int = k_index) -> int:  # the relay's agents: a port each
            return DEFAULT_PORTS[c] + (k_index if node == relay else 0)

        for n in island:
            peers: dict[str, tuple[str, str]] = {}  # node -> (address, cla)
            routes: list[tuple[str, str]] = []
            for m in island:
                if m == n:
                    continue
                path = node_path(st, n, m)
                first = next(x for x in path[1:] if x in island)
                if first == m:
                    prev = path[path.index(m) - 1]
                    addr, link_cla = _facing(st, m, prev)
                    if link_cla == "udphc" and (relay or not agent_class(kind).capabilities.udphc):
                        link_cla = "udp"  # a relay's process runs no udphc link, nor an agent not behind one
                    peers[m] = (addr, (link_cla if k_per_link else None) or k_cla)
                routes.append((m, first))
            name = f"{n}.{kind}" if n == relay else n
            lines = [
                f"# c2dtn node {n} on topology {st['topology']} (written by c2dtn node configs)"
                + (f": the relay's {kind} island" if n == relay else ""),
                "[node]",
                f'id = "{n}"',
                f'storage = "{(out / name).resolve()}"',
                f'netns = "{testbed.node_netns(st, n)}"',
                f"overlay = {'true' if n in overlay_nodes else 'false'}",
                "",
                "[agent]",
                f'kind = "{kind}"',
            ]
            # listen on every convergence layer a neighbour uses toward this node
            schemes = sorted({k_cla} | {c for _, c in peers.values()})
            lines += ["listen = [" + ", ".join(f'"{c}://0.0.0.0:{port(n, c)}"' for c in schemes) + "]"]
            lines += (['routing = "epidemic"'] if groups else []) + [""]
            rates = _ltp_rates(st, n, [m for m, (_, c) in peers.items() if c == "ltp"])
            lines += _toml_table(f"agent.{kind}", agent_class(kind).testbed_options(rates, store, numbers))
            for m, (addr, c) in peers.items():
                lines += ["[[agent.peers]]", f'node = "{m}"', f'cla = "{c}://{addr}:{port(m, c)}"', ""]
            for m, via in routes:
                lines += ["[[agent.routes]]", f'to = "{m}"', f'via = "{via}"', ""]
            if n in overlay_nodes:
                lines += share_tables(n, overlay_nodes, keys, groups)
                far = [m for m in overlay_nodes if m not in island]
                if far:
                    lines += ["[relays]"] + [f'{m} = "{relay}"' for m in far] + [""]
                sched = {}
                if any_udp:
                    # a bundle must fit one datagram on a 1500-byte MTU anywhere on its way: no IP fragments to lose
                    sched = {"aggregate_bytes": 1200}
                    if rated:  # on a radio link linger and ack delay let several envelopes and acks share a bundle
                        sched.update(linger_ms=1500, ack_delay_ms=250)  # (decisions 0013, 0035)
                elif not rated:
                    # no link with a rate limit anywhere (a LAN): 64 kB bundles, larger envelopes share
                    # bundles up to a megabyte; where a radio is on the way, a big bundle would hold
                    # flash traffic behind it for minutes (decision 0006)
                    sched = {"aggregate_bytes": 65536, "aggregate_large_bytes": 1 << 20}
                sched.update(scheduler or {})
                if sched:
                    lines += ["[scheduler]"] + [f"{k} = {int(v)}" for k, v in sched.items()] + [""]
            more = extra.get(n, "") if isinstance(extra, dict) else extra  # TOML for every node, or per node
            if more and n != relay:
                lines.append(more)
            p = out / f"{name}.toml"
            p.write_text("\n".join(lines) + "\n")
            p.chmod(0o600)  # holds keys
            if n == relay:
                relay_files.append(p.name)
            else:
                paths[n] = p
    if relay:
        p = out / f"{relay}.relay.toml"
        p.write_text(
            f"# c2dtn relay {relay} on topology {st['topology']} (written by c2dtn node configs)\n"
            f'[relay]\nid = "{relay}"\nstorage = "{(out / relay).resolve()}"\n'
            f'netns = "{testbed.node_netns(st, relay)}"\n'
            "islands = [" + ", ".join(f'"{f}"' for f in relay_files) + "]\n"
        )
        paths[relay] = p
    return paths


# -- [gateway] tables -----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicSpec:
    """One [[gateway.topic]] rule, from the CLI's FILTER[=PRIORITY[,LIFETIME[,supersede]]]."""

    filter: str
    priority: str = "routine"
    lifetime: int = 3600
    supersede: bool = False

    @classmethod
    def parse(cls, spec: str) -> TopicSpec:
        filt, _, rest = spec.partition("=")
        parts = [x.strip() for x in rest.split(",")] if rest else []
        prio = parts[0] if parts else "routine"
        try:
            Priority.parse(prio)
            life = int(parts[1]) if len(parts) > 1 else 3600
            if life <= 0:
                raise ValueError("a lifetime is a positive number of seconds")
        except ValueError as e:
            raise ConfigError(
                "--topic", "--topic", spec, str(e), "write FILTER=PRIORITY,LIFETIME_S[,supersede]"
            ) from None
        if len(parts) > 2 and parts[2:] != ["supersede"] or not filt:
            raise ConfigError(
                "--topic",
                "--topic",
                spec,
                "not FILTER[=PRIORITY[,LIFETIME_S[,supersede]]]",
                'e.g. "bft/+/+/+/location=priority,600,supersede"',
            )
        return cls(filt, prio, life, len(parts) > 2)

    def toml(self) -> str:
        return (
            f'[[gateway.topic]]\nfilter = {json.dumps(self.filter)}\npriority = "{self.priority}"\n'
            f"lifetime = {self.lifetime}\n" + ('supersede = "topic"\n' if self.supersede else "")
        )


def gateway_routes(st: dict[str, Any], node: str, overlay_nodes: list[str]) -> list[tuple[str, str]]:
    """(prefix, via) for an intercepting gateway: every host of the topology whose IP path from
    `node` passes another overlay node is served by the last overlay node on that path."""
    routes = []
    for h, v in sorted(st["nodes"].items()):
        if h in overlay_nodes or v.get("role") not in ("host", "broker"):
            continue
        path = node_path(st, node, h)
        via = [x for x in path[1:] if x in overlay_nodes]
        if via:
            routes.append((f"{testbed.node_address(st, h)}/32", via[-1]))
    return routes


def gateway_tables(
    st: dict[str, Any],
    overlay_nodes: list[str],
    gateways: list[str],
    tproxy: list[str] = (),
    listen: dict[str, str] | None = None,
    bridge: dict[str, str] | None = None,
    topics: list[TopicSpec] = (),
) -> dict[str, str]:
    """A [gateway] table per gateway node (far side for all of them; `tproxy`: intercept MQTT
    crossing the node, routes from the topology; `listen`: node -> "ADDR:PORT>BROKER:PORT", an
    explicit listener; `bridge`: node -> "BROKER:PORT", bridge mode with the other gateways as
    peers and the topic filters as what goes out).  A gateway releases only what a topic rule
    allows, so `topics` is required."""
    listen, bridge = listen or {}, bridge or {}
    named = set(tproxy) | set(listen) | set(bridge)
    for n in named - set(gateways):
        raise ConfigError("--gateway", "--gateway", n, "a --tproxy/--listen/--bridge node must be one of --gateway")
    for n in gateways:
        if n not in overlay_nodes:
            raise ConfigError("--gateway", "--gateway", n, "a gateway must also run the overlay (--overlay)")
    if gateways and not topics:
        raise ConfigError(
            "--topic",
            "--topic",
            None,
            "gateways carry only topics a rule releases",
            'give at least one --topic, e.g. --topic "#=routine"',
        )
    rules = "\n".join(t.toml() for t in topics)
    out = {}
    for n in gateways:
        lines = ["[gateway]"]
        if n in tproxy:
            lines.append("tproxy = true")
        if n in listen:
            addr, sep, broker = listen[n].partition(">")
            if not sep:
                raise ConfigError("--listen", "--listen", listen[n], "must be NODE=ADDR:PORT>BROKER:PORT")
            lines += [f'listen = "{addr}"', f'broker = "{broker}"']
        lines.append("")
        if n in tproxy:
            for prefix, via in gateway_routes(st, n, overlay_nodes):
                lines += ["[[gateway.route]]", f'prefix = "{prefix}"', f'via = "{via}"', ""]
        if n in bridge:
            peers = [g for g in gateways if g != n]
            lines += [
                "[gateway.bridge]",
                f'broker = "{bridge[n]}"',
                f"peers = {json.dumps(peers)}",
                f"out = {json.dumps([t.filter for t in topics])}",
                "",
            ]
        out[n] = "\n".join(lines) + "\n" + rules
    return out
