"""`c2dtn gateway run CONFIG` and `c2dtn gateway status CONFIG`."""

from __future__ import annotations

import json

import click

from c2dtn.errors import ConfigError
from c2dtn.tables import render


@click.group()
def gateway() -> None:
    """MQTT and CoAP split-session gateway over the overlay (explicit listeners, or TPROXY interception of MQTT)."""


def _load(config: str):
    from c2dtn.ip_gateway.policy import parse_gateway
    from c2dtn.overlay.port import load_config

    cfg = load_config(config)
    if cfg.gateway is None:
        raise ConfigError(config, "gateway", None, "no [gateway] table", "see ip_gateway.policy for its fields")
    if not cfg.overlay:
        raise ConfigError(config, "node.overlay", False, "a gateway needs the overlay (overlay = true)")
    return cfg, parse_gateway(config, cfg.gateway)


def gateway_makers(config: str, cfg=None, gcfg=None) -> list:
    """The gateways the config's [gateway] table describes, each made from the node's port."""
    from c2dtn.ip_gateway.gateway import MqttGateway

    if gcfg is None:
        cfg, gcfg = _load(config)
    makers = [lambda port: MqttGateway(port, gcfg)]
    if gcfg.coap is not None:
        from c2dtn.ip_gateway.coap import CoapGateway

        makers.append(lambda port: CoapGateway(port, gcfg))
    return makers


@gateway.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("-v", "--verbose", is_flag=True, help="debug logging (every bundle handed to the agent)")
def run_cmd(config: str, verbose: bool) -> None:
    """Run the node with its MQTT gateway (and CoAP gateway, with [gateway.coap]) until SIGTERM."""
    import logging

    from c2dtn.overlay.port import run

    cfg, gcfg = _load(config)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {cfg.id} %(name)s %(levelname)s %(message)s",
    )
    run(cfg, gateway_makers(config, cfg, gcfg))


@gateway.command("status")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the raw status")
def status_cmd(config: str, as_json: bool) -> None:
    """Client sessions, queues per class and destination, custody counts, link state."""
    from c2dtn.overlay.port import request

    st = request(config, "GET", "/status")
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    g = st.get("mqtt", {})
    rows = [(cl, "near", "", "yes", "") for cl in g.get("clients", [])]
    rows += [
        (k, "far", f["broker"], "yes" if f["connected"] else "no", ", ".join(f["subs"]))
        for k, f in g.get("sessions_far", {}).items()
    ]
    click.echo(
        render(
            ("client", "side", "broker", "connected", "subscriptions"),
            rows,
            title=f"gateway {st['node']}: MQTT sessions",
        )
    )
    click.echo()
    click.echo(
        render(
            ("destination", "class", "queued", "in flight", "bytes"),
            [(r["dst"], r["priority"], r["queued"], r["in_flight"], r["bytes"]) for r in st.get("queues", [])],
            title="queues (custody)",
            right=(2, 3, 4),
        )
    )
    click.echo()
    peers = ", ".join(f"{p['node']} ({p['cla']})" for p in st.get("peers", [])) or "none"
    click.echo(f"peers: {peers}")
    click.echo(
        "counters: "
        + ", ".join(f"{k} {v}" for k, v in sorted({**st.get("counters", {}), **g.get("counters", {})}.items()))
    )
