"""`c2dtn node …`, `c2dtn send`, `c2dtn recv`, `c2dtn ping`."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import click
from rich.console import Console
from rich.table import Table

from c2dtn.errors import C2Error
from overlay.config import load_node_config

console = Console(width=None if sys.stdout.isatty() else 120)


class ApiError(C2Error):
    pass


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP over the node's Unix socket (the standard library has no such client)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def api(config: str, method: str, path: str, body: bytes | None = None, timeout: float = 30.0):
    cfg = load_node_config(config)
    sock = str(cfg.api_socket)
    if not Path(sock).exists():
        raise ApiError(f"node {cfg.id} is not running (no API socket at {sock}): start it with c2dtn node run {config}")
    conn = _UnixHTTP(sock, timeout)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        data = json.loads(r.read() or b"null")
    except (OSError, ValueError) as e:
        raise ApiError(f"node {cfg.id} did not answer on {sock}: {e}") from None
    finally:
        conn.close()
    if r.status != 200:
        raise ApiError(f"node {cfg.id}: {data.get('error') if isinstance(data, dict) else data}")
    return data


@click.group("node")
def node() -> None:
    """Overlay nodes: a BPA under supervision plus persistent end-to-end custody."""


@node.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("-v", "--verbose", is_flag=True)
def run_cmd(config: str, verbose: bool) -> None:
    """Run the node described by CONFIG until SIGTERM or Ctrl-C."""
    import logging

    from overlay.node import run_node

    cfg = load_node_config(config)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format=f"%(asctime)s {cfg.id} %(name)s %(levelname)s %(message)s")
    run_node(cfg)


@node.command("configs")
@click.option("--bpa", required=True, help="nodes that run a BPA, comma-separated (e.g. gw1,r2,r3,gw4)")
@click.option("--overlay", "overlay_nodes", required=True, help="nodes that also run the overlay (e.g. gw1,gw4)")
@click.option("--cla", default="tcpcl", show_default=True, help="tcpcl, mtcp or udp")
@click.option("--store", default="sled", show_default=True, help="agent store: mem, sled or sneakers")
@click.option("--dir", "out_dir", required=True, type=click.Path(file_okay=False), help="where to write them")
def configs_cmd(bpa: str, overlay_nodes: str, cla: str, store: str, out_dir: str) -> None:
    """Write node configurations for the running testbed topology."""
    from overlay.testbed_configs import write_configs
    from topologies import testbed

    st = testbed.read_state()
    if st is None:
        raise testbed.TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    paths = write_configs(st, bpa.split(","), overlay_nodes.split(","), out_dir, cla, store)
    for n, p in paths.items():
        click.echo(f"{n}: {p}")


@node.command("status")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def status_cmd(config: str, as_json: bool) -> None:
    """Peers, queues per class and destination, custody counts, agent state."""
    st = api(config, "GET", "/status")
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    console.print(f"[bold]{st['node']}[/bold]: agent {st['agent']} pid {st['agent_pid']}, "
                  f"{st['agent_restarts']} restarts, up {st['uptime_s']:.0f} s, agent stores {st.get('agent_stored', '?')} bundles")
    if st.get("agent_error"):
        console.print(f"[red]agent: {st['agent_error']}[/red]")
    t = Table(title="peers")
    for c in ("node", "address", "cla", "kind"):
        t.add_column(c)
    for p in st.get("peers", []):
        t.add_row(p["node"], p["address"], p["cla"], p["kind"])
    console.print(t)
    if "counters" in st:
        q = Table(title="custody queue (held until the destination acks)")
        for c in ("destination", "class", "queued", "in flight", "bytes"):
            q.add_column(c)
        for r in st["queues"]:
            q.add_row(r["dst"], r["priority"], str(r["queued"]), str(r["in_flight"]), str(r["bytes"]))
        console.print(q)
        c = Table(title="counters")
        c.add_column("name")
        c.add_column("value", justify="right")
        for k, v in sorted(st["counters"].items()):
            if not k.startswith(("next_seq", "cseq:")):
                c.add_row(k, str(v))
        console.print(c)


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
    qs = {"dst": dst, "priority": priority, "lifetime": lifetime, "app": app}
    if supersede:
        qs["supersede"] = supersede
    r = api(config, "POST", "/send?" + urlencode(qs), body)
    click.echo(f"{r['origin']}:{r['seq']}")


@click.command("recv")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--count", default=0, help="stop after this many (0: take what is there)")
@click.option("--timeout", default=30.0, show_default=True, help="seconds to wait for --count")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
def recv_cmd(config, count, timeout, as_json) -> None:
    """Print envelopes delivered to this node, then acknowledge them to their origin."""
    got = 0
    deadline = time.monotonic() + timeout
    while True:
        wait = max(0.0, deadline - time.monotonic()) if count else 0
        items = api(config, "GET", f"/recv?wait={min(wait, 10):.1f}&max={max(1, (count - got) if count else 1000)}",
                    timeout=wait + 30)
        for d in items:
            if as_json:
                click.echo(json.dumps(d))
            else:
                body = base64.b64decode(d["body"])
                click.echo(f"{d['origin']}:{d['seq']} [{d['priority']}] {body.decode(errors='replace')}")
        if items:
            api(config, "POST", "/consumed", json.dumps({"ids": [d["id"] for d in items]}).encode())
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
    for i in range(count):
        stamp = f"{time.time_ns()}:{i}:".encode()
        body = stamp + bytes(max(0, size - len(stamp)))
        t0 = time.monotonic()
        api(config, "POST", "/send?" + urlencode({"dst": dst, "priority": "flash", "app": "ping",
                                                  "lifetime": timeout}), body)
        deadline = t0 + timeout
        answered = False
        while time.monotonic() < deadline and not answered:
            items = api(config, "GET", f"/recv?app=pong&wait={min(5.0, deadline - time.monotonic()):.1f}",
                        timeout=timeout + 10)
            answered = any(base64.b64decode(d["body"]).startswith(stamp) for d in items)
            rtt = time.monotonic() - t0  # the answer is in hand; taking it off the inbox follows
            if items:
                api(config, "POST", "/consumed", json.dumps({"ids": [d["id"] for d in items]}).encode())
        if answered:
            rtts.append(rtt)
            click.echo(f"{size} bytes from {dst}: seq={i} time={rtt * 1000:.1f} ms")
        else:
            click.echo(f"seq={i}: no answer within {timeout:.0f} s")
        if i + 1 < count:
            time.sleep(interval)
    if rtts:
        click.echo(f"{len(rtts)}/{count} answered; rtt min/median/max = {min(rtts) * 1000:.1f}/"
                   f"{statistics.median(rtts) * 1000:.1f}/{max(rtts) * 1000:.1f} ms")
    if len(rtts) < count:
        sys.exit(1)
