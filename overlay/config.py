"""Node configuration (TOML): one file per gateway or relay box.

Every table and field, with its type, default and an example, is in the configuration
reference (docs/configuration.md, `c2dtn node config-reference`), rendered from the
`table(...)` declarations below, which are also the keys the loader accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c2dtn.cla_adapters import ClaSpec, parse_cla
from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agents import DEFAULT, agent_class, kinds
from c2dtn.overlay.envelope import MAX_CONTAINER_BYTES
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store import SYNC_MODES, Quota
from c2dtn.tomlfile import check_name, check_private, read_toml

ROUTING = ("static", "epidemic")

TOP = table(
    "(top level)",
    "The tables of a node config; only [node] is required.",
    [
        F(
            "node",
            "table",
            None,
            "This box: its id and where its state lives.",
            '{ id = "gw1", storage = "/var/lib/c2dtn/gw1" }',
        ),
        F(
            "agent",
            "table",
            f"({DEFAULT}, tcpcl on 4556)",
            "The bundle protocol agent the node runs and its neighbours.",
            f'{{ kind = "{DEFAULT}" }}',
        ),
        F("keys", "table", "{}", "Keys shared with the overlay nodes and groups this node talks to.", "{}"),
        F("groups", "table", "{}", "Groups one bundle reaches every member of.", "{}"),
        F("relays", "table", "{}", "Nodes of another agent's island, reached through a relay.", "{}"),
        F("scheduler", "table", "{}", "The overlay's sending window, aggregation and timers.", "{}"),
        F("quota", "table", "{}", "Bounds of the custody store.", "{}"),
        F("metrics", "table", "(none: no metrics)", "A Prometheus endpoint for this node.", "{}"),
        F("gateway", "table", "(none: no gateway)", "The MQTT and CoAP gateway (`c2dtn gateway run`).", "{}"),
    ],
)
NODE = table(
    "node",
    "This box.",
    [
        F(
            "id",
            "name",
            None,
            "The node's id (1-40 letters, digits, '-' or '_'); each agent's endpoint for it, dtn://<id>/ "
            "or an ipn number, is derived from it (agents/).",
            '"gw1"',
        ),
        F(
            "storage",
            "path",
            None,
            "The folder of the custody database, the agent's store, the API socket and logs (created mode 0700).",
            '"/var/lib/c2dtn/gw1"',
        ),
        F("netns", "string", "(none)", "Run inside this network namespace (the testbed's nodes).", '"c2-gw1"'),
        F("overlay", "boolean", "true", "false: run only the agent, no custody or API (a relay such as r2).", "true"),
        F(
            "api_group",
            "string",
            "(the owner's)",
            "The API socket's group: the socket becomes mode 0660 and the "
            "storage folder 0710 for that group, so that a gateway or client running as another user of the group "
            "reaches the socket and nothing else; the group must exist on this machine.",
            '"root"',
        ),
        F(
            "keys_file",
            "path",
            "(none)",
            "Read [keys] and [groups] from this file (relative to this one; mode 0600) instead of from this one.",
            '"gw1.keys.toml"',
        ),
        F(
            "fsync",
            "string",
            '"auto"',
            'Where custody commits are fsynced before anything is acknowledged: "auto" '
            'on the event loop while fsyncs take under 2 ms, by a writer thread once one is slower; "thread": '
            'always the thread; "loop": each commit on the event loop.',
            '"auto"',
        ),
    ],
)
AGENT = table(
    "agent",
    "The bundle protocol agent (BPA) this node runs. Its own settings are in [agent.<kind>] "
    "(below); some agents also read them from [agent] itself, as configs older than "
    "[agent.<kind>] have them (agents/).",
    [
        F(
            "kind",
            "string",
            f'"{DEFAULT}"',
            "Which agent: one of those overlay.agents registers (agents/ lists them).",
            f'"{DEFAULT}"',
        ),
        F(
            "listen",
            "array of CLA specs",
            '["tcpcl://0.0.0.0:4556"]',
            "The convergence layers the agent listens on (tcpcl://, udp://, udphc://, ltp://, mtcp:// with "
            "address:port). udphc:// is UDP with each bundle's blocks compressed on the air, run by the node "
            "around the agent's UDP; both ends of a link must use it (decision 0034).",
            '["udp://0.0.0.0:4556"]',
        ),
        F(
            "routing",
            "string",
            '"static"',
            "static: [[agent.routes]]; epidemic: every bundle to every peer (groups need it on some agents: agents/).",
            '"static"',
        ),
        F("peers", "array of tables", "[]", "The neighbours the agent keeps contact with ([[agent.peers]]).", "[]"),
        F("routes", "array of tables", "[]", "Static routes ([[agent.routes]]).", "[]"),
    ],
)
PEER = table(
    "agent.peers",
    "A neighbour the agent keeps contact with.",
    [
        F("node", "name", None, "The neighbour's node id.", '"r2"'),
        F("cla", "CLA spec", None, "How to reach it: convergence layer, address and port.", '"tcpcl://10.77.1.2:4556"'),
    ],
    array=True,
)
ROUTE = table(
    "agent.routes",
    "Static routing: bundles for `to` go via the peer `via`.",
    [
        F("to", 'name or "*"', None, 'A node id, or "*" for every node no other route names.', '"gw4"'),
        F("via", "name", None, "One of [[agent.peers]]' node ids.", '"r2"'),
    ],
    array=True,
)
KEY = F(
    "<node or group id>",
    "string",
    "(none)",
    "The key this node shares with that overlay node (or with every "
    "member of that group): 32 to 128 hex digits. A file holding keys must be mode 0600. "
    "Make one with `openssl rand -hex 32`, or `c2dtn keys`.",
    '"<64 hex digits>"',
)
GROUP = F(
    "<group id>",
    "array of names",
    "(none)",
    "The group's members, this node among them; the group needs "
    'its own key and every other member a pair key; some agents need routing = "epidemic" (agents/).',
    '["deu-gw", "nor-gw", "prt-gw"]',
)
KEYS = table(
    "keys",
    "Keys shared with the overlay nodes this node talks to: envelopes are sealed "
    "(AES-GCM-SIV) with the key of their destination ([security](security.md)).",
    [],
    free=KEY,
)
GROUPS = table(
    "groups",
    "Multicast groups: one bundle reaches every member (an agent without group endpoints gets one bundle per member).",
    [],
    free=GROUP,
)
RELAYS = table(
    "relays",
    "Nodes of another agent's island (a BPv6 one, say), reached through a relay (`c2dtn relay`).",
    [],
    free=F("<node id>", "name", "(none)", "The relay the node's bundles go to.", '"tacnet"'),
)
KEYS_TOP = table(
    "(top level)",
    "The keys file's tables; [keys] is required.",
    [
        F("keys", "table", None, "As the node config's [keys].", '{ gw4 = "<64 hex digits>" }'),
        F("groups", "table", "{}", "As the node config's [groups].", "{}"),
    ],
    doc="keys",
)
_S = SchedulerConfig()
SCHEDULER = table(
    "scheduler",
    "The overlay's sender, per destination: a congestion window over what is in "
    "flight, aggregation of envelopes into bundles, and end-to-end retransmission timers. "
    "The defaults suit a LAN; `c2dtn node configs` sets linger and ack delay on radio links.",
    [
        F(
            "init_window",
            "integer",
            str(_S.init_window),
            "Bytes in flight to a destination before its first ack.",
            "16384",
            "bytes",
        ),
        F("min_window", "integer", str(_S.min_window), "The window never shrinks below this.", "1024", "bytes"),
        F("max_window", "integer", str(_S.max_window), "The window never grows above this.", "4194304", "bytes"),
        F(
            "aggregate_bytes",
            "integer",
            str(_S.aggregate_bytes),
            "Envelopes share one bundle up to this many bytes (at most half the largest container a receiver takes).",
            "16384",
            "bytes",
        ),
        F(
            "aggregate_large_bytes",
            "integer",
            str(_S.aggregate_large_bytes),
            "Envelopes over aggregate_bytes share "
            "bundles up to this (0: each goes alone); for a LAN, where an agent's cost is per bundle.",
            "1048576",
            "bytes",
        ),
        F(
            "initial_rto_ms",
            "integer",
            str(_S.initial_rto_ms),
            "End-to-end retransmission timeout before a round trip "
            "is measured. Generous: the agents hold bundles through an outage hop by hop.",
            "60000",
            "ms",
        ),
        F("min_rto_ms", "integer", str(_S.min_rto_ms), "Lower bound of the retransmission timeout.", "20000", "ms"),
        F("max_rto_ms", "integer", str(_S.max_rto_ms), "Upper bound of the retransmission timeout.", "600000", "ms"),
        F(
            "linger_ms",
            "integer",
            str(_S.linger_ms),
            "Priority and routine envelopes wait up to this long for company "
            "in a bundle (flash and immediate never wait; 0: no linger). Longer: fewer bytes a "
            "report, older reports. On a radio link the testbed writes 1500 (decision 0035).",
            "1500",
            "ms",
        ),
        F(
            "ack_delay_ms",
            "integer",
            str(_S.ack_delay_ms),
            "Acks wait this long for data to ride on or for more acks (0: at once). On a radio link "
            "the testbed writes 250: an ack that falls due takes the lingering envelopes with it (decision 0035).",
            "250",
            "ms",
        ),
        F(
            "queue_target_ms",
            "integer",
            str(_S.queue_target_ms),
            "Queueing below the overlay the window allows on top of the path's round trip, at its "
            "measured delivery rate (0: no model; the window grows as TCP Reno's).",
            "1000",
            "ms",
        ),
    ],
)
QUOTA = table(
    "quota",
    "Bounds of the custody store: past either, new messages are refused (MQTT 0x97, "
    "CoAP 5.03, HTTP 507), never dropped once taken.",
    [
        F(
            "max_envelopes",
            "integer",
            str(Quota().max_envelopes),
            "Envelopes held (in custody and delivered-not-acked).",
            "100000",
        ),
        F("max_bytes", "integer", str(Quota().max_bytes), "Bytes of messages held.", "268435456", "bytes"),
    ],
)

METRICS = table(
    "metrics",
    "A Prometheus endpoint: GET /metrics answers the text format with what `c2dtn node status` "
    "shows (docs/operations.md lists the metrics). Off unless listen is set; it serves no other path.",
    [
        F(
            "listen",
            "string",
            "(none: off)",
            "The address and port to serve on. Anyone who reaches it reads the node's peers, queues and "
            "counters: keep it on loopback or a management network.",
            '"127.0.0.1:9464"',
        ),
    ],
)


def check_udphc(src: str, cfg: NodeConfig) -> None:
    """udphc:// is run by the node in front of the agent (overlay/hclink.py, decision 0034):
    only an agent whose UDP takes bundles on loopback, and only with a radio socket to send from."""
    used = [f"agent.listen[{i}]" for i, s in enumerate(cfg.listen) if s.scheme == "udphc"]
    peers = [(i, p) for i, p in enumerate(cfg.peers) if p.cla.scheme == "udphc"]
    if not used and not peers:
        return
    kind = agent_class(cfg.agent)
    if not kind.capabilities.udphc:
        where, value = (used[0], "udphc") if used else (f"agent.peers[{peers[0][0]}].cla", str(peers[0][1].cla))
        raise ConfigError(
            src,
            where,
            value,
            f"udphc:// is run only in front of an agent whose UDP takes bundles on loopback ({kind.label()}'s does not)",
            "use udp://",
        )
    if peers and not used:
        i, p = peers[0]
        raise ConfigError(
            src,
            f"agent.peers[{i}].cla",
            str(p.cla),
            "a udphc:// peer needs a udphc:// spec in [agent] listen (the address its frames go out from)",
            'e.g. listen = ["udphc://0.0.0.0:4560"]',
        )


def parse_listen(src: str, where: str, v: Any) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); the host an IP address."""
    import ipaddress

    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([0-9.]+):(\d{1,5})", v) if isinstance(v, str) else None
    try:
        if m is None:
            raise ValueError
        host = m.group(1) or m.group(3)
        ipaddress.ip_address(host)
        port = int(m.group(2) or m.group(4))
        if not 1 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise ConfigError(
            src, where, v, "must be an IP address and a port from 1 to 65535", 'e.g. "127.0.0.1:9464" or "[::1]:9464"'
        ) from None
    return host, port


@dataclass
class Peer:
    node: str
    cla: ClaSpec


@dataclass
class Route:
    to: str
    via: str


@dataclass
class NodeConfig:
    source: str
    id: str
    storage: Path
    netns: str | None = None
    overlay: bool = True
    agent: str = DEFAULT
    agent_options: dict = field(default_factory=dict)  # [agent.<kind>], checked by the agent's driver
    listen: list[ClaSpec] = field(default_factory=list)
    peers: list[Peer] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    routing: str = "static"
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> members other than this node
    relays: dict[str, str] = field(default_factory=dict)  # node of another island -> the relay its bundles go to
    keys: dict[str, bytes] = field(default_factory=dict)
    api_gid: int | None = None  # the API socket's group ([node] api_group)
    fsync: str = "auto"  # [node] fsync: where custody commits are fsynced (store.SYNC_MODES)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    quota: Quota = field(default_factory=Quota)
    gateway: dict | None = None  # the [gateway] table, read by ip_gateway.policy.parse_gateway
    metrics_listen: tuple[str, int] | None = None  # [metrics] listen: (host, port), or off

    @property
    def api_socket(self) -> Path:
        return self.storage / "api.sock"

    @property
    def custody_db(self) -> Path:
        return self.storage / "custody.db"

    @property
    def agent_dir(self) -> Path:
        return self.storage / self.agent


def scheduler_config(src: str, sch: Any) -> SchedulerConfig:
    """A [scheduler] table, every field checked by name and range (a node's config, `perf --scheduler`)."""
    if isinstance(sch, dict) and "queue_keep_ms" in sch:  # retired with the queue cut (decision 0011)
        raise ConfigError(
            src,
            "scheduler.queue_keep_ms",
            sch["queue_keep_ms"],
            "no longer used: the window follows the path's measured rate (decision 0011)",
            "remove it",
        )
    SCHEDULER.check(src, "scheduler", sch)
    # 0 means "none" for these (no linger, acks at once, no rate model); the rest are sizes and timers
    zero_ok = {"linger_ms", "ack_delay_ms", "queue_target_ms", "aggregate_large_bytes"}
    # a bundle's envelopes must stay within what a receiver takes in one (MAX_CONTAINER_BYTES)
    most = {"aggregate_bytes": MAX_CONTAINER_BYTES // 2, "aggregate_large_bytes": MAX_CONTAINER_BYTES // 2}
    return SchedulerConfig(
        **{k: _int(src, f"scheduler.{k}", v, 0 if k in zero_ok else 1, most.get(k, 1 << 40)) for k, v in sch.items()}
    )


def _int(src: str, where: str, v: Any, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ConfigError(src, where, v, f"must be a whole number from {lo} to {hi}")
    return v


def parse_key(src: str, where: str, v: Any) -> bytes:
    if not isinstance(v, str) or not re.fullmatch(r"(?:[0-9a-fA-F]{2}){16,64}", v):
        raise ConfigError(
            src,
            where,
            "<hidden>" if isinstance(v, str) else v,
            "a key is 32 to 128 hex digits (16 to 64 bytes)",
            "make one with: openssl rand -hex 32",
        )
    return bytes.fromhex(v)


def load_node_config(path: str | Path) -> NodeConfig:
    src = str(path)
    data = read_toml(path)
    TOP.check(src, "(top level)", data)
    node = NODE.check(src, "node", data["node"])
    for k in ("storage", "keys_file"):
        v = node.get(k)
        if v is not None and (not isinstance(v, str) or not v or any(ord(c) < 32 for c in v)):
            raise ConfigError(src, f"node.{k}", v, "must be a path without control characters")
    cfg = NodeConfig(source=src, id=check_name(src, "node.id", node["id"]), storage=Path(str(node["storage"])))
    if "netns" in node:
        if not isinstance(node["netns"], str) or not node["netns"]:
            raise ConfigError(src, "node.netns", node["netns"], "must be a namespace name")
        cfg.netns = node["netns"]
    if "api_group" in node:
        import grp

        try:
            cfg.api_gid = grp.getgrnam(str(node["api_group"])).gr_gid
        except KeyError:
            raise ConfigError(src, "node.api_group", node["api_group"], "no such group on this machine") from None
    if "fsync" in node:
        if node["fsync"] not in SYNC_MODES:
            raise ConfigError(src, "node.fsync", node["fsync"], "must be " + " or ".join(f'"{m}"' for m in SYNC_MODES))
        cfg.fsync = node["fsync"]
    if "overlay" in node:
        if not isinstance(node["overlay"], bool):
            raise ConfigError(src, "node.overlay", node["overlay"], "must be true or false")
        cfg.overlay = node["overlay"]
    agent = data.get("agent", {})
    cfg.agent = agent.get("kind", DEFAULT) if isinstance(agent, dict) else DEFAULT
    try:
        if not isinstance(cfg.agent, str):  # a list or table is no name (found by perf fuzz)
            raise C2Error(cfg.agent)
        driver = agent_class(cfg.agent)
    except C2Error:
        raise ConfigError(
            src, "agent.kind", cfg.agent, "no driver for this agent", "agents: " + ", ".join(kinds())
        ) from None
    legacy = set(driver.legacy_keys)
    agent = AGENT.check(src, "agent", agent, {cfg.agent} | legacy)
    own = agent.get(cfg.agent, {})
    if not isinstance(own, dict):
        raise ConfigError(src, f"agent.{cfg.agent}", own, "must be a table of the agent's settings")
    old = {k: agent[k] for k in legacy if k in agent and k not in own}
    try:
        cfg.agent_options = driver.options(src, {**old, **own})
    except ConfigError as e:  # name the field where the file has it
        key = e.field.rsplit(".", 1)[-1]
        if key in old:
            raise ConfigError(src, f"agent.{key}", e.value, e.problem, e.hint) from None
        raise
    listen = agent.get("listen", ["tcpcl://0.0.0.0:4556"])
    if not isinstance(listen, list) or not listen:
        raise ConfigError(src, "agent.listen", listen, "must be a non-empty array of CLA specs")
    cfg.listen = [parse_cla(v, src, f"agent.listen[{i}]") for i, v in enumerate(listen)]
    cfg.routing = agent.get("routing", "static")
    if cfg.routing not in ROUTING:
        raise ConfigError(src, "agent.routing", cfg.routing, "unknown routing", "routing: " + ", ".join(ROUTING))
    for i, p in enumerate(agent.get("peers", [])):
        PEER.check(src, f"agent.peers[{i}]", p)
        cfg.peers.append(
            Peer(
                check_name(src, f"agent.peers[{i}].node", p["node"]), parse_cla(p["cla"], src, f"agent.peers[{i}].cla")
            )
        )
    check_udphc(src, cfg)
    for i, r in enumerate(agent.get("routes", [])):
        ROUTE.check(src, f"agent.routes[{i}]", r)
        to = r["to"] if r["to"] == "*" else check_name(src, f"agent.routes[{i}].to", r["to"])
        via = check_name(src, f"agent.routes[{i}].via", r["via"])
        if via not in {p.node for p in cfg.peers}:
            raise ConfigError(
                src,
                f"agent.routes[{i}].via",
                via,
                "not one of the agent's peers",
                "peers: " + ", ".join(p.node for p in cfg.peers),
            )
        cfg.routes.append(Route(to, via))
    ksrc = src  # where [keys] and [groups] come from
    if "keys_file" in node:
        if not isinstance(node["keys_file"], str) or not node["keys_file"]:
            raise ConfigError(src, "node.keys_file", node["keys_file"], "must be a file name")
        kf = Path(node["keys_file"])
        ksrc = str(kf if kf.is_absolute() else Path(src).parent / kf)
        share = read_toml(ksrc)
        KEYS_TOP.check(ksrc, "(top level)", share)
        for t in ("keys", "groups"):
            if t in data and t in share:
                raise ConfigError(src, t, "(a table)", f"given here and in keys_file {ksrc}", "keep it in one of them")
        data = {**data, **share}
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise ConfigError(ksrc, "keys", keys, "must be a table of node id = hex key")
    cfg.keys = {check_name(ksrc, f"keys.{k}", k): parse_key(ksrc, f"keys.{k}", v) for k, v in keys.items()}
    if cfg.keys:
        check_private(ksrc, "keys")
    cfg.groups = _groups(ksrc, data.get("groups", {}), cfg)
    relays = data.get("relays", {})
    if not isinstance(relays, dict):
        raise ConfigError(src, "relays", relays, "must be a table of node id = relay node id")
    for k, v in relays.items():
        dst, via = check_name(src, "relays", k), check_name(src, f"relays.{k}", v)
        if dst == cfg.id or via == cfg.id:
            raise ConfigError(src, f"relays.{k}", v, "a node neither relays to itself nor through itself")
        cfg.relays[dst] = via
    cfg.scheduler = scheduler_config(src, data.get("scheduler", {}))
    q = data.get("quota", {})
    QUOTA.check(src, "quota", q)
    cfg.quota = Quota(**{k: _int(src, f"quota.{k}", v, 1, 1 << 50) for k, v in q.items()})
    cfg.gateway = data.get("gateway")
    met = data.get("metrics", {})
    METRICS.check(src, "metrics", met)
    if "listen" in met:
        cfg.metrics_listen = parse_listen(src, "metrics.listen", met["listen"])
    return cfg


def _groups(src: str, groups: Any, cfg: NodeConfig) -> dict[str, tuple[str, ...]]:
    """[groups] name = [members]: this node must be a member, the group needs its own key,
    every other member a pair key (acks travel to each origin alone), and an agent with group
    endpoints (dtnd) must route by epidemic (its static routing hands a bundle to one next hop:
    no fan-out).  An agent without them routes the node's one bundle per member as any other."""
    if not isinstance(groups, dict):
        raise ConfigError(src, "groups", groups, "must be a table of group name = [member node ids]")
    out = {}
    for g, members in groups.items():
        where = f"groups.{check_name(src, 'groups', g)}"
        if not isinstance(members, list) or len(members) < 2:
            raise ConfigError(src, where, members, "must list at least two member node ids")
        members = [check_name(src, where, m) for m in members]
        if g in members or g == cfg.id:
            raise ConfigError(src, where, g, "a group's name must not be a node id")
        if cfg.id not in members:
            raise ConfigError(src, where, members, f"this node ({cfg.id}) is not a member")
        if g not in cfg.keys:
            raise ConfigError(src, f"keys.{g}", None, f"group {g} needs a key shared by its members")
        for m in members:
            if m != cfg.id and m not in cfg.keys:
                raise ConfigError(src, f"keys.{m}", None, f"member {m} of group {g} needs a pair key")
        if cfg.routing != "epidemic" and agent_class(cfg.agent).capabilities.groups:
            raise ConfigError(
                src,
                "agent.routing",
                cfg.routing,
                'groups need routing = "epidemic": static routing sends a bundle to one next hop',
            )
        out[g] = tuple(m for m in members if m != cfg.id)
    return out
