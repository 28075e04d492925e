"""Bridge mode: the gateway as one client of a local broker (a nation keeping its own
broker), exchanging publications with peer gateways' bridges."""

from __future__ import annotations

from typing import TYPE_CHECKING

from c2dtn.ip_gateway import bodies as s
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway.far import FarSession
from c2dtn.ip_gateway.near_core import Envelope, lifetime_ms
from c2dtn.ip_gateway.policy import BridgeConfig, TopicRule

if TYPE_CHECKING:
    from c2dtn.ip_gateway.gateway import MqttGateway


class BridgeSession(FarSession):
    """Bridge mode: the gateway is one client of the local broker.  It subscribes there
    to the `out` filters (MQTT 5, no-local, so what it publishes itself never comes
    back) and sends each publication the allow-list releases to every peer gateway as
    a "bpub" envelope; "bpub" envelopes from peers whose topic matches an `in` filter it
    publishes here.  The broker keeps its session (clean start off, 7-day expiry) so
    publications queue there while the gateway restarts."""

    always_subscribe = True  # the config, not a remembered session, says what is bridged

    def __init__(self, gw: "MqttGateway", cfg: BridgeConfig):
        super().__init__(
            gw,
            "",
            cfg.client_id or f"c2bridge-{gw.port.node_id}",
            f"{cfg.broker[0]}:{cfg.broker[1]}",
            {
                "params": {"v": 5, "cs": False, "ka": 60, "sx": 7 * 24 * 3600},
                "subs": {f: [cfg.qos, True, True, 0] for f in cfg.out},
                "present": True,
            },
        )
        self.cfg = cfg

    def key(self) -> str:
        return f"bridge/{self.client}"

    def _envelopes(self, p: m.Publish, rule: TopicRule) -> list[Envelope]:
        self.gw.counters["bridged_out"] += 1
        body = s.pack(
            "bpub", self.client, self.broker, t=p.topic, p=p.payload, q=p.qos, r=p.retain, x=s.props_out(p.properties)
        )
        return [(peer, body, lifetime_ms(rule, p), rule.priority, rule.key(p.topic)) for peer in self.cfg.peers]

    def accepts(self, topic: str) -> bool:
        return any(m.topic_matches(f, topic) for f in self.cfg.in_)
