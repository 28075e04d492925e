"""Gateway policy (I/O-free): which gateway serves which brokers and servers, and what crosses the link.

The [gateway] tables' fields are declared below (`table(...)`) and rendered in the
configuration reference (docs/configuration.md).

The far side holds one broker session per origin client.  It ends when the client's
session does (a clean 3.1.1 session or an MQTT 5 session expiry of 0 at its disconnect,
else its expiry interval after it), not before; a 3.1.1 session that is not clean never
expires, as the standard says.  Past `far_queue` messages for one session, or
`max_far_sessions` sessions, what arrives stays in custody (counted as `far_queue_full`
and `far_sessions_full`) and is taken, in order, when room frees: refused, never dropped.

In bridge mode, too, a publication crosses only if a [[gateway.topic]] rule releases
it (and that rule gives its priority, lifetime and supersession).

Where the issue left it open: a topic that matches no rule is not released
across the link (the allow-list is the list of rules); it is answered locally
(PUBACK) and counted as "held_local", so clients behave the same either way.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import ConfigError
from c2dtn.ip_gateway.auth import Auth, load_auth
from c2dtn.ip_gateway.mqtt import MqttError, check_topic_filter, topic_matches
from c2dtn.overlay.port import MAX_MESSAGE_BYTES, Priority
from c2dtn.tomlfile import check_name


@dataclass(frozen=True)
class TopicRule:
    filter: str
    priority: Priority = Priority.ROUTINE
    lifetime_s: int = 3600
    supersede: str | None = None  # None | "topic"

    def key(self, topic: str) -> str | None:
        return f"mqtt:{topic}" if self.supersede == "topic" else None


@dataclass
class Policy:
    routes: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = field(default_factory=list)
    topics: list[TopicRule] = field(default_factory=list)
    # topic -> its rule: every publish asks, and a gateway sees the same topics again and
    # again (the rules are fixed once the policy is made; bounded, cleared when full)
    _rules: dict[str, TopicRule | None] = field(default_factory=dict, repr=False, compare=False)

    def gateway_for(self, ip: str) -> str | None:
        """The far gateway serving a broker address (longest prefix wins)."""
        addr = ipaddress.ip_address(ip)
        best = None
        for net, via in self.routes:
            if addr in net and (best is None or net.prefixlen > best[0].prefixlen):
                best = (net, via)
        return best[1] if best else None

    def rule_for(self, topic: str) -> TopicRule | None:
        try:
            return self._rules[topic]
        except KeyError:
            pass
        rule = next((r for r in self.topics if topic_matches(r.filter, topic)), None)
        if len(self._rules) >= 4096:
            self._rules.clear()
        self._rules[topic] = rule
        return rule


@dataclass
class BridgeConfig:
    broker: tuple[str, int]
    peers: list[str]
    out: list[str]
    in_: list[str]
    qos: int = 1
    client_id: str | None = None


@dataclass
class CoapConfig:
    listen: tuple[str, int] | None = None
    server: tuple[str, int] | None = None
    resources: list = field(default_factory=list)  # coap_core.ResourceRule, first match wins
    tproxy: bool = False
    tproxy_port: int = 15683


@dataclass
class SessionLimits:
    """[gateway] max_sessions, max_connections_per_address, persistent_client_expiration (s)."""

    max_sessions: int = 1000
    max_connections_per_address: int = 0  # 0: no limit
    persistent_client_expiration: float = 0.0  # 0: sessions without expiry are kept (3.1.1 clean session 0)


@dataclass
class GatewayConfig:
    listen: tuple[str, int] | None = None
    broker: tuple[str, int] | None = None
    tproxy: bool = False
    tproxy_port: int = 11883
    policy: Policy = field(default_factory=Policy)
    max_packet_size: int = 1 << 20
    far_queue: int = 1000
    max_far_sessions: int = 10_000
    # Default: a QoS 1 message reaches the broker at QoS 1, so a subscriber gets
    # min(publish QoS, subscription QoS) as from the broker itself (at least once: a far
    # gateway killed between the broker's PUBACK and its custody commit publishes it again).
    # true: published at QoS 2, so that resend (same packet id, DUP) meets the broker's QoS 2
    # dedupe; the cost is a QoS 2 subscriber getting it at QoS 2 and one more round trip.
    # See docs/decisions/0002-qos1-transparent.md.
    qos1_once: bool = False
    batch_bytes: int | None = None  # None: half the node's aggregate_bytes (NearSide)
    # password_file / acl_file / allow_anonymous, as Mosquitto names them (ip-gateway/auth.py);
    # None: none set, every client and topic allowed
    auth: Auth | None = None
    limits: SessionLimits = field(default_factory=SessionLimits)  # max_sessions, ... (near side; far: expiration)
    bridge: BridgeConfig | None = None
    coap: CoapConfig | None = None


_PRIO = "flash, immediate, priority or routine (flash and immediate go first and never linger)"
GATEWAY = table(
    "gateway",
    "The MQTT and CoAP gateways (`c2dtn gateway run`): the near side takes clients' "
    "packets off IP into custody, the far side delivers them to the broker or server they meant "
    "([MQTT](mqtt.md), [CoAP](coap.md)). A box can be both.",
    [
        F(
            "listen",
            "host:port",
            "(none)",
            "Explicit listener: clients point here and mean `broker`.",
            '"0.0.0.0:1883"',
        ),
        F(
            "broker",
            "host:port",
            "(none)",
            "The broker an explicit listener stands for (needed with listen).",
            '"10.77.9.2:1883"',
        ),
        F(
            "tproxy",
            "boolean",
            "false",
            "Intercept MQTT (TCP 1883) crossing the box to brokers a [[gateway.route]] names (TPROXY; needs root).",
            "false",
        ),
        F("tproxy_port", "integer", str(GatewayConfig.tproxy_port), "Where intercepted flows land.", "11883"),
        F(
            "max_packet_size",
            "integer",
            str(GatewayConfig.max_packet_size),
            "Largest MQTT packet taken from a client (64 up to the largest message the overlay carries).",
            "1048576",
            "bytes",
        ),
        F(
            "far_queue",
            "integer",
            str(GatewayConfig.far_queue),
            "Far side: messages waiting for one client's broker "
            "connection; past it they stay in custody, refused, never dropped.",
            "1000",
        ),
        F(
            "max_far_sessions",
            "integer",
            str(GatewayConfig.max_far_sessions),
            "Far side: broker sessions held for origin clients.",
            "10000",
        ),
        F(
            "qos1_once",
            "boolean",
            "false",
            "Far side: publish QoS 1 messages to the broker at QoS 2, so a resend after "
            "a crash meets the broker's dedupe (decision 0002).",
            "false",
        ),
        F(
            "batch_bytes",
            "integer",
            "(half the node's aggregate_bytes)",
            "Near side: QoS 0/1 publishes read together "
            "share an envelope up to this many payload bytes (0: one envelope each).",
            "8192",
            "bytes",
        ),
        F(
            "password_file",
            "path",
            "(none)",
            "Near side: clients log in against this file (mosquitto_passwd's format).",
            '"/etc/mosquitto/passwd"',
        ),
        F(
            "acl_file",
            "path",
            "(none)",
            "Near side: topic access by user (Mosquitto's ACL format).",
            '"/etc/mosquitto/acl"',
        ),
        F(
            "allow_anonymous",
            "boolean",
            "(false with a password_file, else true)",
            "Whether a client without a username may connect.",
            "false",
        ),
        F(
            "max_sessions",
            "integer",
            str(SessionLimits.max_sessions),
            "Near side: client sessions held; a new client "
            "past it is refused at CONNECT (MQTT 5 0x97, 3.1.1 code 3) before anything is acknowledged.",
            "1000",
        ),
        F(
            "max_connections_per_address",
            "integer",
            "0",
            "Near side: connections from one address (0: no limit).",
            "16",
        ),
        F(
            "persistent_client_expiration",
            "period",
            "(never)",
            "Both sides: a session without expiry (3.1.1 clean "
            'session 0) ends this long after its client left; Mosquitto\'s form ("12h", "7d", "2w", "1m", "1y") '
            "or seconds.",
            '"7d"',
        ),
        F("route", "array of tables", "[]", "Which gateway serves which brokers ([[gateway.route]]).", "[]"),
        F("topic", "array of tables", "[]", "What crosses the link ([[gateway.topic]]).", "[]"),
        F(
            "bridge",
            "table",
            "(none)",
            "Bridge mode ([gateway.bridge]).",
            '{ broker = "127.0.0.1:1883", peers = ["gw4"], out = ["bft/#"] }',
        ),
        F("coap", "table", "(none)", "The CoAP gateway ([gateway.coap]).", "{}"),
    ],
)
GW_ROUTE = table(
    "gateway.route",
    "Brokers (and CoAP servers) in `prefix` are served by the gateway node `via`.",
    [
        F("prefix", "IP prefix", None, "The brokers' addresses.", '"10.77.9.0/24"'),
        F("via", "name", None, "The far gateway's node id.", '"gw4"'),
    ],
    array=True,
)
GW_TOPIC = table(
    "gateway.topic",
    "What crosses the link: the first rule whose filter matches a topic gives its "
    "priority and lifetime; a topic no rule matches stays local (acknowledged, counted held_local).",
    [
        F("filter", "MQTT topic filter", None, "Topics this rule releases.", '"bft/+/+/+/location"'),
        F("priority", "string", '"routine"', _PRIO + ".", '"priority"'),
        F("lifetime", "integer", "3600", "How long the message may take to arrive.", "600", "s"),
        F(
            "supersede",
            "string",
            "(none)",
            '"topic": a newer message on the same topic replaces a queued older one.',
            '"topic"',
        ),
    ],
    array=True,
)
GW_BRIDGE = table(
    "gateway.bridge",
    "Bridge mode: the gateway is a client of a local broker and exchanges "
    "publications with its peers' bridges (a [[gateway.topic]] rule must release each).",
    [
        F("broker", "host:port", None, "The local broker.", '"127.0.0.1:1883"'),
        F("peers", "array of names", None, "The gateways whose bridges it exchanges with.", '["gw4"]'),
        F(
            "out",
            "array of topic filters",
            None,
            "Filters subscribed here and sent to every peer.",
            '["bft/+/+/+/location"]',
        ),
        F(
            "in",
            "array of topic filters",
            "(as out)",
            "Filters accepted from peers and published here.",
            '["bft/+/+/+/location"]',
        ),
        F("qos", "integer", "1", "QoS of the bridge's subscriptions (0-2).", "1"),
        F(
            "client_id",
            "string",
            '"c2bridge-<node id>"',
            "The bridge's client id at the local broker.",
            '"c2bridge-gw1"',
        ),
    ],
)
GW_COAP = table(
    "gateway.coap",
    "The CoAP gateway ([CoAP](coap.md)); an empty table: far side only.",
    [
        F("listen", "host:port", "(none)", "Explicit listener: clients send here ...", '"0.0.0.0:5683"'),
        F(
            "server",
            "host:port",
            "(none)",
            "... and mean this server (a Proxy-Uri names another; no server: those only).",
            '"10.77.9.2:5683"',
        ),
        F(
            "tproxy",
            "boolean",
            "false",
            "Intercept CoAP (UDP 5683) crossing the box to servers a [[gateway.route]] names (TPROXY; needs root).",
            "false",
        ),
        F("tproxy_port", "integer", str(CoapConfig.tproxy_port), "Where intercepted datagrams land.", "15683"),
        F("resource", "array of tables", "[]", "What crosses the link ([[gateway.coap.resource]]).", "[]"),
    ],
)
GW_RESOURCE = table(
    "gateway.coap.resource",
    "The first rule whose path matches a request gives its priority and "
    "lifetime; a request no rule matches is answered here with 4.03 Forbidden.",
    [
        F(
            "path",
            "string",
            None,
            'Shell-style pattern on the Uri-Path, starting with "/" ("*" also spans "/").',
            '"/orders/*"',
        ),
        F("priority", "string", '"routine"', _PRIO + ".", '"immediate"'),
        F("lifetime", "integer", "3600", "How long the request may take to arrive.", "3600", "s"),
        F("allow", "boolean", "true", "false: answered here with 4.03 Forbidden.", "true"),
    ],
    array=True,
)


def _hostport(src: str, where: str, v: Any) -> tuple[str, int]:
    if not isinstance(v, str) or ":" not in v:
        raise ConfigError(src, where, v, 'must be "address:port"')
    host, port = v.rsplit(":", 1)
    try:
        ipaddress.ip_address(host)
        p = int(port)
        if not 0 < p < 65536:
            raise ValueError
    except ValueError:
        raise ConfigError(src, where, v, 'must be "address:port" with an IP address and a port 1-65535') from None
    return host, p


def _filters(src: str, where: str, v: Any) -> list[str]:
    if not isinstance(v, list) or not v:
        raise ConfigError(src, where, v, "must be a non-empty list of MQTT topic filters")
    for f in v:
        if not isinstance(f, str):
            raise ConfigError(src, where, f, "must be an MQTT topic filter (a string)")
        try:
            check_topic_filter(f)
        except MqttError as e:
            raise ConfigError(src, where, f, f"not an MQTT topic filter ({e})") from None
    return list(v)


def parse_bridge(src: str, raw: Any) -> BridgeConfig:
    b = GW_BRIDGE.check(src, "gateway.bridge", raw)
    peers = b["peers"]
    if not isinstance(peers, list) or not peers:
        raise ConfigError(src, "gateway.bridge.peers", peers, "must be a non-empty list of gateway node names")
    peers = [check_name(src, "gateway.bridge.peers", x) for x in peers]
    out = _filters(src, "gateway.bridge.out", b["out"])
    qos = b.get("qos", 1)
    if qos not in (0, 1, 2) or isinstance(qos, bool):
        raise ConfigError(src, "gateway.bridge.qos", qos, "must be 0, 1 or 2")
    cid = b.get("client_id")
    if cid is not None and (not isinstance(cid, str) or not cid or len(cid.encode()) > 65535):
        raise ConfigError(src, "gateway.bridge.client_id", cid, "must be a non-empty string")
    return BridgeConfig(
        _hostport(src, "gateway.bridge.broker", b["broker"]),
        peers,
        out,
        _filters(src, "gateway.bridge.in", b["in"]) if "in" in b else out,
        qos,
        cid,
    )


_UNITS = {"h": 3600, "d": 86400, "w": 7 * 86400, "m": 30 * 86400, "y": 365 * 86400}


def _duration(src: str, where: str, v: Any) -> float:
    """Mosquitto's form of a period: a number and h, d, w, m (30 days) or y; or seconds."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return float(v)
    if isinstance(v, str) and len(v) > 1 and v[:-1].isdigit() and v[-1] in _UNITS and int(v[:-1]) > 0:
        return float(int(v[:-1]) * _UNITS[v[-1]])
    raise ConfigError(src, where, v, 'a period as Mosquitto writes it ("12h", "7d", "2w", "1m", "1y") or seconds')


def _priority(src: str, where: str, v: Any) -> Priority:
    try:
        return Priority.parse(v)
    except ValueError as e:
        raise ConfigError(src, where, v, str(e)) from None


def _lifetime(src: str, where: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(src, where, v, "must be a positive number of seconds")
    return v


def _tproxy(src: str, where: str, t: dict, port: int) -> tuple[bool, int]:
    on = t.get("tproxy", False)
    if not isinstance(on, bool):
        raise ConfigError(src, where + ".tproxy", on, "must be true or false")
    if "tproxy_port" in t:
        port = _hostport(src, where + ".tproxy_port", f"0.0.0.0:{t['tproxy_port']}")[1]
    return on, port


def parse_coap(src: str, raw: Any) -> CoapConfig:
    from c2dtn.ip_gateway.coap_core import ResourceRule

    c = GW_COAP.check(src, "gateway.coap", raw)
    cfg = CoapConfig()
    cfg.tproxy, cfg.tproxy_port = _tproxy(src, "gateway.coap", c, cfg.tproxy_port)
    if "listen" in c:
        cfg.listen = _hostport(src, "gateway.coap.listen", c["listen"])  # no server: forward-proxy requests only
    if "server" in c:
        cfg.server = _hostport(src, "gateway.coap.server", c["server"])
    rules = c.get("resource", [])
    if not isinstance(rules, list):
        raise ConfigError(src, "gateway.coap.resource", rules, "must be an array of tables ([[gateway.coap.resource]])")
    for i, r in enumerate(rules):
        w = f"gateway.coap.resource[{i}]"
        GW_RESOURCE.check(src, w, r)
        if not isinstance(r["path"], str) or not r["path"].startswith("/"):
            raise ConfigError(
                src, w + ".path", r["path"], 'must be a path pattern starting with "/"', 'e.g. "/orders/*"'
            )
        allow = r.get("allow", True)
        if not isinstance(allow, bool):
            raise ConfigError(src, w + ".allow", allow, "must be true or false")
        cfg.resources.append(
            ResourceRule(
                r["path"],
                _priority(src, w + ".priority", r.get("priority", "routine")),
                _lifetime(src, w + ".lifetime", r.get("lifetime", 3600)),
                allow,
            )
        )
    return cfg


def parse_gateway(src: str, raw: Any) -> GatewayConfig:
    g = GATEWAY.check(src, "gateway", raw)
    cfg = GatewayConfig()
    if "listen" in g:
        cfg.listen = _hostport(src, "gateway.listen", g["listen"])
    if "broker" in g:
        cfg.broker = _hostport(src, "gateway.broker", g["broker"])
    if cfg.listen and not cfg.broker:
        raise ConfigError(
            src,
            "gateway.broker",
            None,
            "an explicit listener needs the broker it stands for",
            'add broker = "address:1883"',
        )
    cfg.tproxy, cfg.tproxy_port = _tproxy(src, "gateway", g, cfg.tproxy_port)
    if "max_packet_size" in g:
        v = g["max_packet_size"]
        if not isinstance(v, int) or isinstance(v, bool) or not 64 <= v <= MAX_MESSAGE_BYTES:
            raise ConfigError(
                src,
                "gateway.max_packet_size",
                v,
                f"must be 64 to {MAX_MESSAGE_BYTES} bytes (the largest message the overlay carries)",
            )
        cfg.max_packet_size = v
    for k, lo, hi in (
        ("far_queue", 1, 1 << 20),
        ("max_far_sessions", 1, 1 << 20),
        ("batch_bytes", 0, MAX_MESSAGE_BYTES // 2),
    ):
        if k in g:
            v = g[k]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ConfigError(src, f"gateway.{k}", v, f"must be a whole number from {lo} to {hi}")
            setattr(cfg, k, v)
    for k in ("password_file", "acl_file"):
        if k in g and (not isinstance(g[k], str) or not g[k]):
            raise ConfigError(src, f"gateway.{k}", g[k], "must be the path of a file (Mosquitto's format)")
    if "allow_anonymous" in g and not isinstance(g["allow_anonymous"], bool):
        raise ConfigError(src, "gateway.allow_anonymous", g["allow_anonymous"], "must be true or false")
    cfg.auth = load_auth(g.get("password_file"), g.get("acl_file"), g.get("allow_anonymous"), src)
    for k, lo, hi in (("max_sessions", 1, 1 << 20), ("max_connections_per_address", 0, 1 << 16)):
        if k in g:
            v = g[k]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ConfigError(src, f"gateway.{k}", v, f"must be a whole number from {lo} to {hi}")
            setattr(cfg.limits, k, v)
    if "persistent_client_expiration" in g:
        cfg.limits.persistent_client_expiration = _duration(
            src, "gateway.persistent_client_expiration", g["persistent_client_expiration"]
        )
    if "qos1_once" in g:
        if not isinstance(g["qos1_once"], bool):
            raise ConfigError(src, "gateway.qos1_once", g["qos1_once"], "must be true or false")
        cfg.qos1_once = g["qos1_once"]
    if "bridge" in g:
        cfg.bridge = parse_bridge(src, g["bridge"])
    if "coap" in g:
        cfg.coap = parse_coap(src, g["coap"])
    for i, r in enumerate(g.get("route", [])):
        w = f"gateway.route[{i}]"
        GW_ROUTE.check(src, w, r)
        try:
            net = ipaddress.ip_network(r["prefix"], strict=False)
        except (ValueError, TypeError):
            raise ConfigError(
                src, w + ".prefix", r["prefix"], "not an IP prefix", 'write e.g. "10.77.9.0/24"'
            ) from None
        cfg.policy.routes.append((net, check_name(src, w + ".via", r["via"])))
    for i, t in enumerate(g.get("topic", [])):
        w = f"gateway.topic[{i}]"
        GW_TOPIC.check(src, w, t)
        if not isinstance(t["filter"], str):
            raise ConfigError(src, w + ".filter", t["filter"], "must be an MQTT topic filter (a string)")
        try:
            check_topic_filter(t["filter"])
        except MqttError as e:
            raise ConfigError(src, w + ".filter", t["filter"], f"not an MQTT topic filter ({e})") from None
        prio = _priority(src, w + ".priority", t.get("priority", "routine"))
        life = _lifetime(src, w + ".lifetime", t.get("lifetime", 3600))
        sup = t.get("supersede")
        if sup not in (None, "topic"):
            raise ConfigError(src, w + ".supersede", sup, 'the only supersession key is "topic"')
        cfg.policy.topics.append(TopicRule(t["filter"], prio, life, sup))
    return cfg
