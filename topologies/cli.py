"""`c2dtn topo …`: build, inspect, change and remove emulated DIL networks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from c2dtn.topologies import core_engine, model, testbed
from c2dtn.topologies.profiles import Profile, format_rate, load_builtin_profiles

console = Console(width=None if sys.stdout.isatty() else 120)  # pipes and CI logs get full tables


def _say(msg: str) -> None:
    console.print(f"[dim]topo:[/dim] {msg}")


@click.group("topo")
def topo() -> None:
    """Named DIL networks in Linux network namespaces (built by c2dtn, or by CORE), with emulated links."""


@topo.command("list")
def list_cmd() -> None:
    """The topologies and link profiles that ship with c2dtn."""
    t = Table(title="topologies")
    t.add_column("name")
    t.add_column("nodes", justify="right")
    t.add_column("links", justify="right")
    t.add_column("description")
    for name in model.builtin_names():
        tp = model.load(name)
        t.add_row(name, str(len(tp.nodes)), str(len(tp.links)), tp.description)
    console.print(t)
    p = Table(title="link profiles (one direction)")
    for c in ("name", "rate", "delay", "jitter", "loss", "description"):
        p.add_column(c)
    for name, pr in load_builtin_profiles().profiles.items():
        p.add_row(
            name,
            format_rate(pr.rate_bps),
            f"{pr.delay_s * 1000:g} ms",
            f"{pr.jitter_s * 1000:g} ms",
            f"{pr.loss * 100:g} %",
            pr.description,
        )
    console.print(p)


@topo.command("up")
@click.argument("topology")
@click.option("--profile", "-p", default=None, help="profile for the links marked dil (e.g. cnr-tactical-2)")
@click.option(
    "--link-backend",
    type=click.Choice(testbed.BACKENDS),
    default="auto",
    show_default=True,
    help="netem where the kernel has it, else the userspace channel emulator",
)
@click.option(
    "--schedule", type=click.Path(dir_okay=False), default=None, help="TOML file with [[schedule]] link events to add"
)
@click.option("--seed", type=int, default=None, help="seed the emulators' random loss, for repeatable runs")
@click.option(
    "--pcap",
    type=click.Path(file_okay=False),
    default=None,
    help="capture every emulated link into DIR/<link>.pcapng (both ways; dropped frames marked) until `topo down`",
)
@click.option(
    "--engine",
    type=click.Choice(testbed.ENGINES),
    default=None,
    help="who builds the nodes and links: c2dtn's own namespaces, or a CORE session  [default: $C2DTN_ENGINE or namespaces]",
)
@click.option(
    "--core-address",
    default=None,
    metavar="ADDRESS",
    help="--engine core: a CORE daemon of yours on this machine, unix:/PATH or 127.0.0.1:PORT "
    "(default: the testbed's own, on a root-only unix socket)",
)
@click.option(
    "--servers",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="--engine core: a servers file placing nodes on CORE servers (distributed mode; docs/core.md)",
)
def up_cmd(
    topology: str,
    profile: str | None,
    link_backend: str,
    schedule: str | None,
    seed: int | None,
    pcap: str | None,
    engine: str | None,
    core_address: str | None,
    servers: str | None,
) -> None:
    """Build TOPOLOGY (a shipped name or a .toml file); cleans up leftovers first."""
    st = testbed.up(
        topology,
        profile=profile,
        backend=link_backend,
        schedule=schedule,
        seed=seed,
        progress=_say,
        engine=engine,
        core_address=core_address,
        servers=servers,
    )
    _print_status(st, live=False)
    if pcap is not None:
        links = [n for n, ls in st["links"].items() if ls.get("control")]
        if not links:
            raise click.ClickException(f"no link of {topology} is emulated in userspace ({st['backend']}): no capture")
        Path(pcap).mkdir(parents=True, exist_ok=True)
        for name, path in testbed.capture(links, Path(pcap).resolve()).items():
            _say(f"capturing {name} to {path}")


@topo.command("view")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="loopback address to serve the page on (it changes links)"
)
@click.option("--port", type=int, default=8088, show_default=True)
@click.option(
    "--nodes",
    "nodes_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="a folder of node configs (`node configs --dir`): their custody queues are shown",
)
def view_cmd(host: str, port: int, nodes_dir: str | None) -> None:
    """Serve the drill view until Ctrl-C: the topology with each link's state, profile and
    bytes a second, the nodes' custody queues; take a link down or up, or change its profile,
    from the page."""
    import asyncio

    from c2dtn.topologies.view import DrillView

    configs = {}
    for p in sorted(Path(nodes_dir).glob("*.toml")) if nodes_dir else []:
        if not p.name.endswith(".keys.toml"):
            configs[p.stem] = p

    try:
        v = DrillView(host, port, configs)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--host") from None

    async def main() -> None:
        await v.start()
        _say(f"drill view on http://{host}:{port}/ (Ctrl-C stops it)")
        try:
            await asyncio.Event().wait()
        finally:
            await v.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


@topo.command("down")
def down_cmd() -> None:
    """Remove every namespace, link and emulator of the testbed (safe to repeat)."""
    removed = testbed.down(progress=_say)
    _say("nothing was up" if not removed else "down")


@topo.command("status")
@click.option("--json", "as_json", is_flag=True, help="machine-readable state")
def status_cmd(as_json: bool) -> None:
    """Nodes, addresses, links with their profiles, state, backend and counters."""
    st = testbed.status()
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    _print_status(st, live=True)


def _print_status(st: dict, live: bool) -> None:
    engine = st.get("engine", "namespaces")
    if engine == "core":
        c = st["core"]
        engine += f" (session {c['session']} of the CORE daemon at {c['address']}"
        engine += f", {len(set(c['hosts'].values()))} other servers)" if c.get("hosts") else ")"
    console.print(f"[bold]{st['topology']}[/bold] ({st['source']}), engine: {engine}, link backend: {st['backend']}")
    n = Table(title="nodes")
    for c in ("node", "role", "namespace", "addresses (interface)"):
        n.add_column(c)
    for name, node in st["nodes"].items():
        n.add_row(name, node["role"], node["netns"], " ".join(f"{i['address']} ({i['name']})" for i in node["ifaces"]))
    console.print(n)
    t = Table(title=f"links (backend: {st['backend']})")
    cols = ["link", "ends (a → b)", "a→b profile", "b→a profile", "state"]
    if live:
        cols += ["a→b delivered/offered", "b→a delivered/offered", "queued"]
    for c in cols:
        t.add_column(c)
    used: dict[str, Profile] = {}
    for ls in st["links"].values():
        pab, pba = Profile.from_dict(ls["profile_ab"]), Profile.from_dict(ls["profile_ba"])
        used[pab.name], used[pba.name] = pab, pba
        state = ls["state"] if ls["emulate"] else "up (plain veth)"
        row = [ls["name"], f"{ls['a']} → {ls['b']}", pab.name, pba.name, state]
        if live:
            lv = ls.get("live") or {}
            if "ab" in lv:
                row += [
                    f"{lv['ab']['delivered']}/{lv['ab']['offered']}",
                    f"{lv['ba']['delivered']}/{lv['ba']['offered']}",
                    f"{lv['ab']['queued']}+{lv['ba']['queued']}",
                ]
            else:
                row += [lv.get("error", "-"), "", ""]
        t.add_row(*row)
    console.print(t)
    pt = Table(title="profiles in use (one direction)")
    for c in ("profile", "rate", "delay", "loss"):
        pt.add_column(c)
    for name, pr in used.items():
        loss = pr.gilbert_elliott.mean_loss() if pr.gilbert_elliott else pr.loss
        pt.add_row(
            name,
            format_rate(pr.rate_bps),
            f"{pr.delay_s * 1000:g} ms" + (f" ± {pr.jitter_s * 1000:g}" if pr.jitter_s else ""),
            f"{loss * 100:.3g} %" + (" (bursts)" if pr.gilbert_elliott else ""),
        )
    console.print(pt)
    if st.get("schedule"):
        s = Table(title="schedule (seconds after up)")
        for c in ("at", "link", "action", "profile"):
            s.add_column(c)
        for ev in st["schedule"]:
            s.add_row(
                f"{ev['at_s']:g}",
                ev["link"],
                ev["action"] + (" (carrier)" if ev.get("carrier") else ""),
                (ev.get("profile") or {}).get("name", ""),
            )
        console.print(s)


@topo.command("addr")
@click.argument("node")
@click.option("--all", "all_", is_flag=True, help="every address of the node, one per line")
def addr_cmd(node: str, all_: bool) -> None:
    """Print NODE's address."""
    st = testbed.read_state()
    if st is None:
        raise testbed.TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    if all_:
        testbed.node_netns(st, node)
        for i in st["nodes"][node]["ifaces"]:
            click.echo(f"{i['address']} {i['name']} {i['attached']}")
    else:
        click.echo(testbed.node_address(st, node))


@topo.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside NODE:  c2dtn topo exec h1 -- ping 10.77.4.2"""
    st = testbed.read_state()
    if st is None:
        raise testbed.TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    ns = testbed.node_netns(st, node)
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    sys.stdout.flush()
    full = core_engine.exec_argv(st.get("core", {}).get("hosts", {}).get(ns), ns, argv)  # a CORE server's: SSH
    os.execvp(full[0], full)


@topo.command("link")
@click.argument("a")
@click.argument("b")
@click.argument("action", type=click.Choice(["down", "up", "set"]))
@click.argument("profile", required=False)
@click.option("--carrier", is_flag=True, help="down: also drop carrier at both ends (default: a silent fade)")
@click.option("--one-way", is_flag=True, help="set: change only the A -> B direction")
def link_cmd(a: str, b: str, action: str, profile: str | None, carrier: bool, one_way: bool) -> None:
    """Change the live link between nodes A and B: down, up, or set PROFILE."""
    prof = None
    if action == "set":
        if not profile:
            raise click.UsageError("set needs a PROFILE, e.g.: c2dtn topo link r2 r3 set cnr-tactical-1")
        prof = load_builtin_profiles().get(profile, "topo link", "PROFILE")
    elif profile:
        raise click.UsageError(f"{action} takes no profile (got {profile!r})")
    ls = testbed.change_link(a, b, action, prof, carrier=carrier, one_way=one_way)
    pab, pba = Profile.from_dict(ls["profile_ab"]), Profile.from_dict(ls["profile_ba"])
    _say(f"link {ls['name']} is {ls['state']}; {ls['a']}→{ls['b']} {pab.name}, {ls['b']}→{ls['a']} {pba.name}")


@topo.command("check")
@click.argument("src", required=False)
@click.argument("dst", required=False)
@click.option("--probes", default=300, show_default=True, help="paced probes for delay and loss")
@click.option("--saturate", "saturate_s", default=12.0, show_default=True, help="seconds of saturation for the rate")
def check_cmd(src: str | None, dst: str | None, probes: int, saturate_s: float) -> None:
    """Measure rate, delay and loss from SRC to DST next to what the profiles say.

    Without SRC and DST: the first and last node of the topology."""
    st = testbed.read_state()
    if st is None:
        raise testbed.TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    nodes = list(st["nodes"])
    src = src or nodes[0]
    dst = dst or nodes[-1]
    res = run_check(st, src, dst, probes, saturate_s)
    print_check(res)


def run_check(st: dict, src: str, dst: str, probes: int, saturate_s: float) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from c2dtn.topologies import probe

    with Progress(
        TextColumn("[bold]traffic check[/bold] {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
    ) as prog:
        task = prog.add_task(f"{src} → {dst}", total=1.0)
        return probe.check(
            st,
            src,
            dst,
            probes=probes,
            saturate_s=saturate_s,
            on_tick=lambda f, text: prog.update(task, completed=f, description=f"{src} → {dst}: {text}"),
        )


def print_check(res: dict) -> None:
    t = Table(title=f"{res['src']} → {res['dst']} over {res['path']}")
    for c in ("", "measured", "profile", "measured / profile"):
        t.add_column(c, justify="right")

    def ratio(m, e):
        return f"{m / e:.2f}" if m is not None and e else "-"

    t.add_row(
        "rate (frame bits)",
        format_rate(res["rate_bps"]) if res["rate_bps"] else "-",
        format_rate(res["expected_rate_bps"]),
        ratio(res["rate_bps"], res["expected_rate_bps"]),
    )
    t.add_row(
        f"one-way delay, median ({res['probe_frame_bytes']} B frames)",
        f"{res['delay_median_s'] * 1000:.1f} ms",
        f"{res['expected_delay_profile_s'] * 1000:.0f} ms + {res['serialization_s'] * 1000:.1f} ms serialization",
        ratio(res["delay_median_s"], res["expected_delay_s"]),
    )
    t.add_row("one-way delay, p95", f"{res['delay_p95_s'] * 1000:.1f} ms", "", "")
    t.add_row(
        f"loss ({res['probes_sent']} probes)",
        f"{res['loss'] * 100:.1f} %",
        f"{res['expected_loss'] * 100:.1f} %",
        ratio(res["loss"], res["expected_loss"]),
    )
    console.print(t)


@topo.command("demo")
@click.option("--topology", default="nps-chain", show_default=True)
@click.option("--profile", default="cnr-tactical-2", show_default=True)
@click.option("--probes", default=300, show_default=True)
@click.option("--link-backend", type=click.Choice(testbed.BACKENDS), default="auto", show_default=True)
def demo_cmd(topology: str, profile: str, probes: int, link_backend: str) -> None:
    """Bring TOPOLOGY up on PROFILE, measure it end to end, tear it down."""
    st = testbed.up(topology, profile=profile, backend=link_backend, progress=_say)
    try:
        nodes = list(st["nodes"])
        res = run_check(st, nodes[0], nodes[-1], probes, 12.0)
        print_check(res)
    finally:
        testbed.down(progress=_say)


def _pairs(opt: str, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        node, sep, rest = v.partition("=")
        if not sep or not node or not rest:
            raise click.BadParameter(f"{v!r} is not NODE=VALUE", param_hint=opt)
        out[node] = rest
    return out


@click.command("configs")
@click.option("--bpa", required=True, help="nodes that run a BPA, comma-separated (e.g. gw1,r2,r3,gw4)")
@click.option("--overlay", "overlay_nodes", required=True, help="nodes that also run the overlay (e.g. gw1,gw4)")
@click.option("--cla", default="tcpcl", show_default=True, help="tcpcl, mtcp or udp")
@click.option("--store", default="sled", show_default=True, help="agent store: mem, sled or sneakers")
@click.option("--dir", "out_dir", required=True, type=click.Path(file_okay=False), help="where to write them")
@click.option(
    "--gateway",
    "gateways",
    default="",
    help="overlay nodes that run the MQTT gateway too "
    "(`c2dtn gateway run`), comma-separated; each replays what arrives to its brokers",
)
@click.option(
    "--tproxy",
    default="",
    help="gateways that intercept MQTT crossing them (TPROXY); routes to the far gateways follow the topology",
)
@click.option(
    "--listen",
    multiple=True,
    metavar="NODE=ADDR:PORT>BROKER:PORT",
    help="an explicit listener on NODE standing for BROKER (repeatable)",
)
@click.option(
    "--bridge",
    multiple=True,
    metavar="NODE=BROKER:PORT",
    help="bridge mode on NODE: a client of BROKER exchanging the --topic filters with the other gateways",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="FILTER[=PRIORITY[,LIFETIME_S[,supersede]]]",
    help='what crosses the link (repeatable; first match wins), e.g. "bft/+/+/+/location=priority,600,supersede"',
)
def node_configs_cmd(
    bpa: str,
    overlay_nodes: str,
    cla: str,
    store: str,
    out_dir: str,
    gateways: str,
    tproxy: str,
    listen: tuple[str, ...],
    bridge: tuple[str, ...],
    topics: tuple[str, ...],
) -> None:
    """Write node configurations (and [gateway] tables) for the running testbed topology."""
    from c2dtn.topologies.node_configs import TopicSpec, gateway_tables, topology_agents, write_configs

    st = testbed.read_state()
    if st is None:
        raise testbed.TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    split = lambda v: [x for x in v.split(",") if x]  # noqa: E731
    ov = split(overlay_nodes)
    tables = gateway_tables(
        st,
        ov,
        split(gateways),
        split(tproxy),
        _pairs("--listen", listen),
        _pairs("--bridge", bridge),
        [TopicSpec.parse(t) for t in topics],
    )
    agents, relay = topology_agents(st)  # the agents the topology's nodes name (dtn7 where none)
    bpa_nodes = split(bpa)
    relay = relay if relay in bpa_nodes else None
    paths = write_configs(st, bpa_nodes, ov, out_dir, cla, store, extra=tables, agent=agents, relay=relay)
    for n, p in paths.items():
        run = "c2dtn gateway run" if n in tables else "c2dtn relay run" if n == relay else "c2dtn node run"
        click.echo(f"{n}: {p}  (run it with: {run})")
