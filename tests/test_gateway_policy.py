"""Gateway policy: routes by broker prefix, topic rules, allow-list, and config errors."""

import pytest

from c2dtn.errors import ConfigError
from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway.policy import parse_gateway
from c2dtn.overlay.envelope import Priority

GOOD = {
    "tproxy": True,
    "route": [{"prefix": "10.77.0.0/16", "via": "gw4"}, {"prefix": "10.77.9.0/24", "via": "gw9"}],
    "topic": [
        {"filter": "bft/+/+/+/location", "priority": "priority", "lifetime": 600, "supersede": "topic"},
        {"filter": "c2/#", "priority": "flash"},
    ],
}


def test_routes_take_the_longest_prefix_and_topics_the_first_rule():
    cfg = parse_gateway("gw.toml", GOOD)
    assert cfg.policy.gateway_for("10.77.9.2") == "gw9"
    assert cfg.policy.gateway_for("10.77.1.2") == "gw4"
    assert cfg.policy.gateway_for("192.0.2.1") is None
    r = cfg.policy.rule_for("bft/NOR/u3/n1/location")
    assert (r.priority, r.lifetime_s, r.key("bft/NOR/u3/n1/location")) == (
        Priority.PRIORITY,
        600,
        "mqtt:bft/NOR/u3/n1/location",
    )
    assert cfg.policy.rule_for("c2/orders/7").priority == Priority.FLASH
    assert cfg.policy.rule_for("chat/general") is None  # not on the allow-list: stays local


@pytest.mark.parametrize(
    "change,field,value",
    [
        ({"route": [{"prefix": "10.77.0.0/33", "via": "gw4"}]}, "gateway.route[0].prefix", "10.77.0.0/33"),
        ({"topic": [{"filter": "a/#/b"}]}, "gateway.topic[0].filter", "a/#/b"),
        ({"topic": [{"filter": "a", "priority": "urgent"}]}, "gateway.topic[0].priority", "urgent"),
        ({"topic": [{"filter": "a", "lifetime": -5}]}, "gateway.topic[0].lifetime", "-5"),
        ({"listen": "0.0.0.0:1883"}, "gateway.broker", "None"),
        ({"listen": "gw1:1883", "broker": "10.0.0.1:1883"}, "gateway.listen", "gw1:1883"),
        ({"tproxy_port": 70000}, "gateway.tproxy_port", "70000"),
        ({"qos1_once": "yes"}, "gateway.qos1_once", "yes"),
        ({"batch_bytes": -1}, "gateway.batch_bytes", "-1"),
        ({"batch_bytes": "64k"}, "gateway.batch_bytes", "64k"),
        ({"bridge": {"broker": "127.0.0.1:1883", "peers": ["gw4"]}}, "gateway.bridge.out", "None"),
        ({"bridge": {"broker": "127.0.0.1:1883", "peers": [], "out": ["a/#"]}}, "gateway.bridge.peers", "[]"),
        ({"bridge": {"broker": "127.0.0.1:1883", "peers": ["gw4"], "out": ["a/#/b"]}}, "gateway.bridge.out", "a/#/b"),
        (
            {"bridge": {"broker": "127.0.0.1:1883", "peers": ["gw4"], "out": ["a"], "in": ["x+"]}},
            "gateway.bridge.in",
            "x+",
        ),
        ({"bridge": {"broker": "localhost", "peers": ["gw4"], "out": ["a"]}}, "gateway.bridge.broker", "localhost"),
        ({"bridge": {"broker": "127.0.0.1:1883", "peers": ["gw4"], "out": ["a"], "qos": 3}}, "gateway.bridge.qos", "3"),
        (
            {"bridge": {"broker": "127.0.0.1:1883", "peers": ["gw4"], "out": ["a"], "topics": []}},
            "gateway.bridge.topics",
            "[]",
        ),
    ],
)
def test_bad_gateway_config_names_field_and_value(change, field, value):
    with pytest.raises(ConfigError) as ei:
        parse_gateway("gw.toml", {**GOOD, **change})
    msg = str(ei.value)
    assert "gw.toml" in msg and field in msg and value in msg


def test_bodies_from_a_peer_gateway_are_checked():
    body = s.pack(
        "pub",
        "c1",
        "10.0.0.1:1883",
        t="a/b",
        p=b"x",
        q=1,
        r=False,
        x={"user_property": [("k", "v")], "message_expiry_interval": 5},
    )
    d = s.unpack(body)
    assert d["x"]["user_property"] == [("k", "v")] and d["q"] == 1
    for bad in (
        b"\xff",
        s.pack("pub", "c1", "b", t="a", q=3),
        s.pack("nope", "c", "b"),
        s.pack("pub", "c1", "b", t=5),
        s.pack("pub", "c", "b", t="a", x={"no_such": 1}),
    ):
        with pytest.raises(s.BodyError):
            s.unpack(bad)


def test_bridge_in_filters_default_to_out_and_only_they_are_published_here():
    cfg = parse_gateway(
        "gw.toml", {"bridge": {"broker": "127.0.0.1:1883", "peers": ["gw4", "gw7"], "out": ["/+/+/+/location"]}}
    )
    b = cfg.bridge
    assert (b.broker, b.peers, b.in_, b.qos, b.client_id) == (
        ("127.0.0.1", 1883),
        ["gw4", "gw7"],
        ["/+/+/+/location"],
        1,
        None,
    )
    body = s.pack(
        "bpub", "c2bridge-gw4", "127.0.0.1:1883", t="/NOR/NOR-UNIT001/NOR-S001/location", p=b"{}", q=1, r=False
    )
    assert s.unpack(body)["op"] == "bpub"
