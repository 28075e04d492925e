"""`c2dtn node …`, `c2dtn send`, `c2dtn recv`, `c2dtn ping`."""

from __future__ import annotations

import base64
import json
import statistics
import sys
import time

import click

from c2dtn.overlay.client import ApiError, NodeClient
from c2dtn.overlay.config import load_node_config
from c2dtn.tables import render


def api(config: str, method: str, path: str, body: bytes | None = None, timeout: float = 30.0):
    """One request to the API of the node that CONFIG describes (ApiError names what failed)."""
    return NodeClient.for_config(config).request(method, path, body, timeout)


@click.group("node")
def node() -> None:
    """Overlay nodes: a BPA under supervision plus persistent end-to-end custody."""


@node.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("-v", "--verbose", is_flag=True)
@click.option(
    "--gateways",
    is_flag=True,
    help="run the MQTT and CoAP gateways of the config's [gateway] table too, when it has one "
    "(what the systemd unit runs; `c2dtn gateway run` requires the table)",
)
def run_cmd(config: str, verbose: bool, gateways: bool) -> None:
    """Run the node described by CONFIG until SIGTERM or Ctrl-C.  Under systemd (Type=notify)
    it says READY=1 once its agent answers and it serves, and WATCHDOG=1 while it runs."""
    from c2dtn.overlay.service import run_node

    cfg = load_node_config(config)
    _log_as(cfg.id, verbose)
    if gateways and cfg.gateway is not None:
        from c2dtn.ip_gateway.cli import gateway_makers
        from c2dtn.overlay.port import run

        run(cfg, gateway_makers(config))
    else:
        run_node(cfg)


def _log_as(node_id: str, verbose: bool) -> None:
    """A daemon's log lines, each naming its node."""
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {node_id} %(name)s %(levelname)s %(message)s",
    )


@node.command("check")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
def check_cmd(config: str) -> None:
    """Load CONFIG as `node run` and `gateway run` would (keys, [gateway] and the agent's own
    table included), check its keys' file modes and that this machine has the agent, and say
    what the node would do, without starting anything.  Exit status: 0 ready to run, 2 a bad
    value (named), 3 the config is right but this machine cannot run its agent."""
    from c2dtn.overlay.box import describe

    cfg = load_node_config(config)
    lines, runnable = describe(config, cfg)
    parts = [f"node {cfg.id}", f"agent {cfg.agent}", f"{len(cfg.peers)} peer(s)", f"{len(cfg.keys)} key(s)"]
    click.echo(f"{config}: ok: " + "; ".join(parts))
    click.echo(render(["what", "would be"], lines))
    if not runnable:
        raise SystemExit(3)


@node.command("init")
@click.argument("node_id", required=False)
@click.option("--id", "id_opt", metavar="ID", help="the node's id (or give it as the argument)")
@click.option("--agent", "kind", default=None, help="the bundle agent (default: the default agent)")
@click.option(
    "--listen", multiple=True, metavar="CLA", help="the agent listens here (repeatable; default tcpcl://0.0.0.0:4556)"
)
@click.option(
    "--peer", "peers", multiple=True, metavar="NODE=CLA", help="a neighbour and where it listens (repeatable)"
)
@click.option(
    "--keys-file",
    type=click.Path(exists=True, dir_okay=False),
    help="this node's share from `c2dtn keys` (copied); without it, a fresh pair key per --peer",
)
@click.option("--metrics", metavar="ADDR:PORT", help="serve Prometheus metrics here ([metrics] listen)")
@click.option(
    "--number",
    "numbers",
    multiple=True,
    metavar="NODE=N",
    help="name nodes by ipn number: this node's and each peer's (repeatable; every box of a network gives the same)",
)
@click.option("--config-dir", default="/etc/c2dtn", show_default=True, type=click.Path(file_okay=False))
@click.option("--state-dir", default="/var/lib/c2dtn", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--unit-dir",
    default="/etc/systemd/system",
    show_default=True,
    help="where the systemd unit template goes ('' : none)",
)
@click.option("--force", is_flag=True, help="replace this node's config and keys if they are there")
def init_cmd(
    node_id: str | None,
    id_opt: str | None,
    kind: str | None,
    listen: tuple[str, ...],
    peers: tuple[str, ...],
    keys_file: str | None,
    metrics: str | None,
    numbers: tuple[str, ...],
    config_dir: str,
    state_dir: str,
    unit_dir: str,
    force: bool,
) -> None:
    """Set a box up for node NODE_ID: CONFIG_DIR/<id>.toml and <id>.keys.toml (mode 0600), its
    state in STATE_DIR/<id>, and the systemd unit template c2dtn@.service that runs it."""
    import os
    import shutil
    from pathlib import Path

    from c2dtn.cla_adapters import parse_cla
    from c2dtn.errors import ConfigError
    from c2dtn.overlay.agents import DEFAULT
    from c2dtn.overlay.box import describe, init
    from c2dtn.tomlfile import check_name

    src = "c2dtn node init"
    if (node_id is None) == (id_opt is None):
        raise click.UsageError("give the node's id once: `node init gw1` or `node init --id gw1`")
    node_id = check_name(src, "ID", node_id or id_opt)
    cla = [parse_cla(v, src, "--listen") for v in listen or ("tcpcl://0.0.0.0:4556",)]
    peer_list = []
    for p in peers:
        name, sep, spec = p.partition("=")
        if not sep:
            raise ConfigError(src, "--peer", p, "a peer is NODE=CLA", "e.g. gw4=tcpcl://10.0.0.4:4556")
        peer_list.append((check_name(src, "--peer", name), parse_cla(spec, src, f"--peer {name}")))
    number_map: dict[str, int] = {}
    for n in numbers:
        name, sep, num = n.partition("=")
        if not sep or not (num.isascii() and num.isdigit()) or not 1 <= int(num) < 1 << 63:
            raise ConfigError(src, "--number", n, "a number is NODE=N, N from 1 to 2**63 - 1", "e.g. gw1=1")
        name = check_name(src, "--number", name)
        if number_map.get(name, int(num)) != int(num):
            raise ConfigError(src, "--number", n, f"{name} is numbered {number_map[name]} already")
        number_map[name] = int(num)
    here = Path(sys.executable).parent / "c2dtn"  # this install's command, not whatever PATH finds first
    c2dtn = str(here) if os.access(here, os.X_OK) else shutil.which("c2dtn") or "c2dtn"
    written, cfg = init(
        node_id,
        kind or DEFAULT,
        Path(config_dir),
        Path(state_dir),
        Path(unit_dir) if unit_dir else None,
        c2dtn,
        cla,
        peer_list,
        Path(keys_file) if keys_file else None,
        metrics,
        force,
        number_map,
    )
    rows = [("config", str(written.config), "0600"), ("keys", str(written.keys), "0600")]
    if written.unit is not None:
        rows.append(("systemd unit", str(written.unit), "0644"))
    click.echo(render(["what", "written", "mode"], rows))
    lines, runnable = describe(str(written.config), cfg)
    click.echo(render(["what", "would be"], lines))
    for n in written.fresh_keys:
        click.echo(
            f"{n}'s box must hold the same pair key: under [keys] in its keys file, {node_id} = "
            f"the value of {n} in {written.keys} (or make every box's keys with `c2dtn keys` and "
            "pass --keys-file)"
        )
    if written.unit is not None:
        click.echo(f"start it: systemctl daemon-reload && systemctl enable --now c2dtn@{node_id}")
    if not runnable:
        raise SystemExit(3)


@node.command("config-reference")
def config_reference_cmd() -> None:
    """Print every table and field of the node, keys and relay configs (Markdown), as the docs show it."""
    from c2dtn.confref import markdown

    click.echo(markdown())


@node.command("renew-incarnation")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
def renew_incarnation_cmd(config: str) -> None:
    """Give the custody store of the node CONFIG describes a new incarnation.

    Do this, with the node stopped, after putting its store back from a copy: the copy
    reuses ids the receivers have seen, and under its old incarnation they would take its
    new envelopes for duplicates.  What the store holds is sent again under the new one
    (a receiver may then get some of it twice; nothing is lost)."""
    from c2dtn.overlay.custody import CustodyStore

    cfg = load_node_config(config)
    try:
        NodeClient.for_config(config).request("GET", "/status", timeout=2)
    except ApiError:
        pass  # not running: the store is ours
    else:
        raise click.ClickException(f"node {cfg.id} is running: stop it before renewing its store's incarnation")
    if not cfg.custody_db.exists():
        raise click.ClickException(f"no custody store at {cfg.custody_db} (a new store gets an incarnation of its own)")
    st = CustodyStore(cfg.custody_db, cfg.id)
    try:
        old, new = st.inc, st.renew_incarnation()
    finally:
        st.close()
    click.echo(f"{cfg.id}: custody store {cfg.custody_db}: incarnation {old:08x} -> {new:08x}")


@node.command("status")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def status_cmd(config: str, as_json: bool) -> None:
    """Peers, queues per class and destination, custody counts, agent state."""
    st = api(config, "GET", "/status")
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    click.echo(
        f"{st['node']}: agent {st['agent']} pid {st['agent_pid']}, {st['agent_restarts']} restarts, "
        f"up {st['uptime_s']:.0f} s, agent stores {st.get('agent_stored', '?')} bundles"
    )
    if st.get("agent_error"):
        click.echo(f"agent: {st['agent_error']}")
    click.echo()
    click.echo(
        render(
            ("node", "address", "cla", "kind"),
            [(p["node"], p["address"], p["cla"], p["kind"]) for p in st.get("peers", [])],
            title="peers",
        )
    )
    if "counters" in st:
        click.echo()
        click.echo(
            render(
                ("destination", "class", "queued", "in flight", "bytes"),
                [(r["dst"], r["priority"], r["queued"], r["in_flight"], r["bytes"]) for r in st["queues"]],
                title="custody queue (held until the destination acks)",
                right=(2, 3, 4),
            )
        )
        click.echo()
        click.echo(
            render(
                ("name", "value"),
                [(k, v) for k, v in sorted(st["counters"].items()) if not k.startswith(("next_seq", "cseq:"))],
                title="counters",
                right=(1,),
            )
        )


@click.command("send")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst")
@click.argument("message", required=False)
@click.option("--priority", default="routine", show_default=True, help="flash, immediate, priority or routine")
@click.option("--lifetime", default=3600.0, show_default=True, help="seconds")
@click.option("--supersede", default=None, help="a newer envelope with this key replaces a queued older one")
@click.option("--app", default="raw", show_default=True)
def send_cmd(config, dst, message, priority, lifetime, supersede, app) -> None:
    """Hand MESSAGE (or standard input) to the node for DST; prints its id once it is in custody."""
    body = message.encode() if message is not None else sys.stdin.buffer.read()
    r = NodeClient.for_config(config).send(dst, body, priority, lifetime, supersede, app)
    click.echo(f"{r['origin']}:{r['seq']}")


@click.command("recv")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--count", default=0, help="stop after this many (0: take what is there)")
@click.option("--timeout", default=30.0, show_default=True, help="seconds to wait for --count")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
def recv_cmd(config, count, timeout, as_json) -> None:
    """Print envelopes delivered to this node, then acknowledge them to their origin."""
    client = NodeClient.for_config(config)
    got = 0
    deadline = time.monotonic() + timeout
    while True:
        wait = max(0.0, deadline - time.monotonic()) if count else 0
        items = client.recv(min(wait, 10), max(1, (count - got) if count else 1000), timeout=wait + 30)
        for d in items:
            if as_json:
                click.echo(json.dumps({**d, "body": base64.b64encode(d["body"]).decode()}))
            else:
                click.echo(f"{d['origin']}:{d['seq']} [{d['priority']}] {d['body'].decode(errors='replace')}")
        client.consumed(items)
        got += len(items)
        if not count or got >= count or time.monotonic() >= deadline:
            break
    if count and got < count:
        raise ApiError(f"received {got} of {count} within {timeout:.0f} s")


@click.command("ping")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst")
@click.option("--size", default=64, show_default=True, help="payload bytes")
@click.option("--count", default=5, show_default=True)
@click.option("--interval", default=1.0, show_default=True)
@click.option("--timeout", default=60.0, show_default=True, help="seconds to wait for each answer")
def ping_cmd(config, dst, size, count, interval, timeout) -> None:
    """Round trips through the overlay, like bping: DST's node answers each ping."""
    rtts = []
    pings = NodeClient.for_config(config).pings(dst, size, count, timeout, interval)
    for i, rtt in enumerate(pings):
        if rtt is not None:
            rtts.append(rtt)
            click.echo(f"{size} bytes from {dst}: seq={i} time={rtt * 1000:.1f} ms")
        else:
            click.echo(f"seq={i}: no answer within {timeout:.0f} s")
    if rtts:
        click.echo(
            f"{len(rtts)}/{count} answered; rtt min/median/max = {min(rtts) * 1000:.1f}/"
            f"{statistics.median(rtts) * 1000:.1f}/{max(rtts) * 1000:.1f} ms"
        )
    if len(rtts) < count:
        sys.exit(1)


@click.group("relay")
def relay() -> None:
    """Relays between agent islands (a BPv6 IBR-DTN island and a BPv7 one, say)."""


@relay.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("-v", "--verbose", is_flag=True)
def relay_run_cmd(config: str, verbose: bool) -> None:
    """Run the relay CONFIG describes (one agent per island) until SIGTERM or Ctrl-C."""
    from c2dtn.overlay.relay import load_relay_config, run_relay

    cfg = load_relay_config(config)
    _log_as(cfg.id, verbose)
    run_relay(cfg)


@click.command("keys")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.argument("nodes", nargs=-1, required=True)
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="NAME=A,B,...",
    help="a group and its members (repeatable); each member gets the group's key",
)
@click.option("--force", is_flag=True, help="replace shares already in OUT_DIR (cuts boxes still on the old keys)")
def keys_cmd(out_dir: str, nodes: tuple[str, ...], groups: tuple[str, ...], force: bool) -> None:
    """New keys for the overlay NODES: a pair key for every two of them and one per group.

    Writes each box's share, OUT_DIR/<node>.keys.toml (mode 0600), for its node config's
    `[node] keys_file`."""
    from c2dtn.errors import ConfigError
    from c2dtn.overlay.keys import write_shares

    parsed: dict[str, list[str]] = {}
    for g in groups:
        name, sep, members = g.partition("=")
        if not sep or not name or not members:
            raise ConfigError("c2dtn keys", "--group", g, "a group is NAME=MEMBER,MEMBER,...")
        parsed[name] = [m for m in members.split(",") if m]
    paths = write_shares(out_dir, list(nodes), parsed, force)
    rows = [
        (n, str(p), len(nodes) - 1, ", ".join(g for g, ms in parsed.items() if n in ms) or "-")
        for n, p in paths.items()
    ]
    click.echo(render(["node", "share (mode 0600)", "pair keys", "groups"], rows, right=[2]))
