"""`c2dtn gateway run CONFIG` and `c2dtn gateway status CONFIG`."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from c2dtn.errors import ConfigError


@click.group()
def gateway() -> None:
    """MQTT split-session gateway over the overlay (explicit listener or TPROXY interception)."""


def _load(config: str):
    from ip_gateway.policy import parse_gateway
    from overlay.config import load_node_config

    cfg = load_node_config(config)
    if cfg.gateway is None:
        raise ConfigError(config, "gateway", None, "no [gateway] table", "see ip_gateway.policy for its fields")
    if not cfg.overlay:
        raise ConfigError(config, "node.overlay", False, "a gateway needs the overlay (overlay = true)")
    return cfg, parse_gateway(config, cfg.gateway)


@gateway.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("-v", "--verbose", is_flag=True, help="debug logging (every bundle handed to the agent)")
def run_cmd(config: str, verbose: bool) -> None:
    """Run the node with its MQTT gateway until SIGTERM."""
    import logging

    from ip_gateway.gateway import MqttGateway
    from overlay.node import run_node

    cfg, gcfg = _load(config)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=f"%(asctime)s {cfg.id} %(name)s %(levelname)s %(message)s")
    run_node(cfg, [lambda node: MqttGateway(node, gcfg)])


@gateway.command("status")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the raw status")
def status_cmd(config: str, as_json: bool) -> None:
    """Client sessions, queues per class and destination, custody counts, link state."""
    from overlay.cli import api

    st = api(config, "GET", "/status")
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    c = Console()
    g = st.get("mqtt", {})
    t = Table(title=f"gateway {st['node']}: MQTT sessions")
    for col in ("client", "side", "broker", "connected", "subscriptions"):
        t.add_column(col)
    for cl in g.get("clients", []):
        t.add_row(cl, "near", "", "yes", "")
    for k, f in g.get("sessions_far", {}).items():
        t.add_row(k, "far", f["broker"], "yes" if f["connected"] else "no", ", ".join(f["subs"]))
    c.print(t)
    q = Table(title="queues (custody)")
    for col in ("destination", "class", "queued", "in flight", "bytes"):
        q.add_column(col, justify="right")
    for r in st.get("queues", []):
        q.add_row(r["dst"], r["priority"], str(r["queued"]), str(r["in_flight"]), str(r["bytes"]))
    c.print(q)
    peers = ", ".join(f"{p['name']} ({p['cla']})" for p in st.get("peers", [])) or "none"
    c.print(f"peers: {peers}")
    c.print("counters: " + ", ".join(f"{k} {v}" for k, v in sorted({**st.get('counters', {}),
                                                                     **g.get('counters', {})}.items())))
