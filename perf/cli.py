"""`c2dtn perf …`: benchmarks that print their figures and ratios side by side."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import click

from c2dtn.overlay.agents import DEFAULT


@click.group("perf")
@click.option(
    "--engine",
    type=click.Choice(["namespaces", "core"]),
    default=None,
    help="who builds each campaign's testbed: c2dtn's namespaces or a CORE session  [default: $C2DTN_ENGINE or namespaces]",
)
def perf(engine: str | None) -> None:
    """Benchmarks and measurement campaigns."""
    if engine:
        os.environ["C2DTN_ENGINE"] = engine  # testbed.up's default: every campaign builds on it


@perf.command("emulator")
@click.option("--seconds", default=10.0, show_default=True, help="length of each TCP transfer")
@click.option("--runs", default=3, show_default=True, help="transfers; the median is reported")
@click.option("--delay", default="50ms", show_default=True, help="one-way delay of the emulated link")
def emulator_cmd(seconds: float, runs: int, delay: str) -> None:
    """TCP goodput through the userspace channel emulator and its CPU cost per frame."""
    from c2dtn.perf import emulator_bench

    emulator_bench.main(seconds=seconds, runs=runs, delay=delay)


@perf.command("overlay")
@click.option("--sizes", default="1k,10k,100k,1M", show_default=True, help="payload sizes on lan")
@click.option("--runs", default=3, show_default=True)
@click.option("--tactical-bytes", default=60_000, show_default=True, help="bulk transfer size on the radio link")
@click.option(
    "--radio-profile",
    default="cnr-tactical-2",
    show_default=True,
    help="the radio link's profile (r2-r3 in nps-chain), e.g. hf-1200 (seed 003)",
)
@click.option(
    "--radio-pings",
    type=click.IntRange(0, 1000),
    default=0,
    show_default=True,
    help="round trips (a minimal ping each) across the radio before each bulk transfer",
)
@click.option("--skip-lan", is_flag=True)
@click.option("--skip-tactical", is_flag=True)
@click.option(
    "--cla",
    type=click.Choice(["tcpcl", "mtcp", "udp", "udphc"]),
    default=None,
    help="convergence layer between the BPAs across the cnr-tactical-2 radio link  "
    "[default: the topology's own, udphc in nps-chain]",
)
@click.option(
    "--scheduler",
    "sched",
    multiple=True,
    metavar="KEY=VALUE",
    help="an overlay [scheduler] setting for this run, e.g. aggregate_bytes=65536 (repeatable)",
)
@click.option(
    "--agents",
    default=DEFAULT,
    show_default=True,
    help="the BPAs to run the overlay over, each beside itself bare (comma-separated kinds)",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 1 << 40),
    default=None,
    help="the radio runs' emulator seeds are SEED, SEED+1000, ... (which frames the link loses)  "
    "[default: drawn afresh, printed and kept in the results]",
)
def overlay_cmd(
    sizes: str,
    runs: int,
    tactical_bytes: int,
    radio_profile: str,
    radio_pings: int,
    skip_lan: bool,
    skip_tactical: bool,
    cla: str,
    sched: tuple[str, ...],
    agents: str,
    seed: int | None,
) -> None:
    """The overlay next to its agent bare: round trip and throughput on lan, goodput (and round
    trips, --radio-pings) on a radio link (cnr-tactical-2, or --radio-profile)."""
    from c2dtn.perf import overlay_bench

    bad = [s for s in sizes.split(",") if s not in overlay_bench.SIZES]
    if bad:
        raise click.BadParameter(
            f"unknown size {bad[0]!r}; choose from {', '.join(overlay_bench.SIZES)}", param_hint="--sizes"
        )
    from c2dtn.topologies.nodes import AGENTS
    from c2dtn.topologies.profiles import load_builtin_profiles

    load_builtin_profiles().get(radio_profile, "--radio-profile", "PROFILE")  # a name it knows, or says which
    overlay_bench.main(
        sizes.split(","),
        runs,
        tactical_bytes,
        skip_lan,
        skip_tactical,
        cla,
        _scheduler(sched),
        _list(agents, AGENTS, "agent", "--agents"),
        seed,
        radio_profile,
        radio_pings,
    )


def _scheduler(items: tuple[str, ...]) -> dict[str, int]:
    """--scheduler KEY=VALUE pairs, checked as a node's [scheduler] table is (names and ranges),
    before any namespace is made."""
    import dataclasses

    from c2dtn.errors import ConfigError
    from c2dtn.overlay.config import scheduler_config
    from c2dtn.overlay.scheduler import SchedulerConfig

    known = [f.name for f in dataclasses.fields(SchedulerConfig)]
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or k not in known:
            raise click.BadParameter(
                f"{it!r}: expected KEY=VALUE with KEY one of {', '.join(known)}", param_hint="--scheduler"
            )
        if k in out:
            raise click.BadParameter(f"{it!r}: {k} is given twice", param_hint="--scheduler")
        try:
            out[k] = int(v)
        except ValueError:
            raise click.BadParameter(f"{it!r}: {v!r} is not an integer", param_hint="--scheduler") from None
    try:
        scheduler_config("--scheduler", out)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--scheduler") from None
    return out


def _fills(ctx, param, value: str) -> list[int]:
    out = []
    for v in value.split(","):
        try:
            n = int(float(v))
        except ValueError:
            raise click.BadParameter(f"{v!r} is not a number of envelopes (e.g. 1e4)") from None
        if not 100 <= n <= 10_000_000:
            raise click.BadParameter(f"{v!r}: a fill is 100 to 10,000,000 envelopes")
        out.append(n)
    return out


@perf.command("store")
@click.option(
    "--fills",
    default="1e4,1e5,1e6",
    show_default=True,
    callback=_fills,
    help="envelopes held at each measurement, comma-separated",
)
def store_cmd(fills: list[int]) -> None:
    """What one custody operation costs against the envelopes the store holds (no network)."""
    from rich.console import Console

    from c2dtn.perf import store_bench

    store_bench.main(fills, console=Console())


@perf.command("fsync")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1, 50), help="runs per mode (taking turns)")
@click.option("--clients", default=10, show_default=True, type=click.IntRange(1, 200))
@click.option(
    "--rate",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 1000),
    help="QoS 1 publishes per second per client",
)
@click.option("--duration", default=15.0, show_default=True, type=click.FloatRange(2, 3600), help="seconds per run")
@click.option(
    "--disk-ms",
    default=10,
    show_default=True,
    type=click.IntRange(0, 1000),
    help="how much longer every fsync takes (a slow disk)",
)
def fsync_cmd(runs: int, clients: int, rate: float, duration: float, disk_ms: int) -> None:
    """PUBACK latency on a slow disk: custody fsync on the event loop against the writer thread."""
    from rich.console import Console

    from c2dtn.perf import fsync_bench

    fsync_bench.main(runs, clients, rate, duration, disk_ms, console=Console())


@perf.command("powerloss")
@click.option("--cycles", default=10, show_default=True, type=click.IntRange(1, 1000), help="power cuts per mode")
@click.option("--clients", default=5, show_default=True, type=click.IntRange(1, 200))
@click.option(
    "--rate",
    default=20.0,
    show_default=True,
    type=click.FloatRange(0.1, 1000),
    help="QoS 1 publishes per second per client",
)
@click.option(
    "--disk-ms", default=5, show_default=True, type=click.IntRange(0, 1000), help="how much longer every fsync takes"
)
@click.option("--seed", default=1, show_default=True, type=int, help="when the cuts come")
@click.option(
    "--payload-bytes",
    default=0,
    show_default=True,
    type=click.IntRange(0, 1_000_000),
    help="pad each publish to this size (262144 and up: each body in a file of its own)",
)
def powerloss_cmd(cycles: int, clients: int, rate: float, disk_ms: int, seed: int, payload_bytes: int) -> None:
    """Power cuts under QoS 1 load: is every PUBACKed message in custody after each one?"""
    from rich.console import Console

    from c2dtn.perf import powerloss_bench

    powerloss_bench.main(cycles, clients, rate, disk_ms, seed=seed, console=Console(), payload_bytes=payload_bytes)


@perf.command("diskfull")
@click.option(
    "--cycles",
    default=3,
    show_default=True,
    type=click.IntRange(1, 100),
    help="times the disk fills and frees (each with the link cut)",
)
@click.option(
    "--clients",
    default=4,
    show_default=True,
    type=click.IntRange(2, 200),
    help="QoS 1 publishers, an even number: half MQTT 5, half 3.1.1",
)
@click.option(
    "--rate", default=20.0, show_default=True, type=click.FloatRange(0.1, 1000), help="publishes per second per client"
)
@click.option("--size", default=1024, show_default=True, type=click.IntRange(32, 65536), help="payload bytes")
@click.option(
    "--disk-mb",
    default=16,
    show_default=True,
    type=click.IntRange(4, 4096),
    help="the tmpfs gw1's store and session file are on",
)
@click.option(
    "--full-s",
    default=6.0,
    show_default=True,
    type=click.FloatRange(0.5, 600),
    help="how long the disk stays full each cycle",
)
def diskfull_cmd(cycles: int, clients: int, rate: float, size: int, disk_mb: int, full_s: float) -> None:
    """The custody store's disk fills under QoS 1 traffic: refusals, losses, recovery (root: mounts a tmpfs)."""
    from rich.console import Console

    from c2dtn.perf import diskfull_bench

    if clients % 2:
        raise click.BadParameter(f"{clients}: an even number (half MQTT 5, half 3.1.1)", param_hint="--clients")
    diskfull_bench.main(cycles, clients, rate, size, disk_mb, full_s, console=Console())


@perf.command("forgery")
@click.option(
    "--attempts",
    default=10_000,
    show_default=True,
    type=click.IntRange(10, 10_000_000),
    help="hostile bundles per class",
)
@click.option("--seed", default=1, show_default=True, type=int)
def forgery_cmd(attempts: int, seed: int) -> None:
    """Forged, tampered and replayed bundles against a group member's overlay core: how many get through."""
    from rich.console import Console

    from c2dtn.perf import forgery_bench

    forgery_bench.main(attempts, seed, console=Console())


@perf.command("paho-interop")
@click.option(
    "--suite",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a checkout of github eclipse/paho.mqtt.testing (or its interoperability/ folder)",
)
def paho_interop_cmd(suite: Path) -> None:
    """Eclipse Paho's MQTT 5.0 and 3.1.1 interoperability client tests, Mosquitto alone and through gw1."""
    from rich.console import Console

    from c2dtn.perf import paho_interop

    try:
        paho_interop.main(suite, console=Console())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--suite") from None


@perf.command("chaos")
@click.option("--minutes", default=20.0, show_default=True, type=click.FloatRange(1, 600))
@click.option(
    "--kills",
    default=30,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="SIGKILLs at random moments, at least 15 s apart",
)
@click.option(
    "--rate",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.05, 100),
    help="messages per second from each of the QoS 1 and the QoS 2 publisher",
)
@click.option("--profile", default="cnr-tactical-2", show_default=True, help="the r2=r3 radio link's profile")
@click.option("--outage-s", default=30.0, show_default=True, type=click.FloatRange(0, 3600))
@click.option("--outage-every", default=180.0, show_default=True, type=click.FloatRange(10, 36000))
@click.option("--agent", default=DEFAULT, show_default=True, help="the BPA on every node")
@click.option(
    "--targets",
    default="all",
    show_default=True,
    type=click.Choice(["all", "agents"]),
    help="all: gateways (a box's power cut) and BPA daemons; agents: BPA daemons alone",
)
@click.option("--seed", default=1, show_default=True, type=int, help="when the kills come and what they hit")
def chaos_cmd(minutes, kills, rate, profile, outage_s, outage_every, agent, targets, seed) -> None:
    """Kill anywhere: QoS 1 and 2 through the gateways on nps-chain while gateways and BPA daemons are SIGKILLed."""
    from rich.console import Console

    from c2dtn.perf import chaos_bench

    try:
        chaos_bench.main(
            minutes, kills, rate, profile, outage_s, outage_every, seed, agent, console=Console(), targets=targets
        )
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--kills") from None


@perf.command("radio-sim")
@click.option("--runs", default=5, show_default=True, type=click.IntRange(1, 100), help="loss patterns")
@click.option(
    "--seed", type=click.IntRange(0, 1 << 40), default=None, help="loss patterns SEED, SEED+1000, ... [default: fresh]"
)
@click.option(
    "--minutes",
    default=None,
    type=click.FloatRange(0.5, 120),
    help="overload run length [default: 4]; with --frontier, fmn-4nations' reports [default: 1, as perf bft's 60 s]",
)
@click.option(
    "--bulk-runs",
    default=200,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="loss patterns of the bulk transfer alone (its tail)",
)
@click.option(
    "--frontier",
    is_flag=True,
    help="instead: make demo's bytes per report against fmn-4nations' age p95 for each linger and ack delay "
    "(--runs loss patterns; --bulk-runs does not apply)",
)
def radio_sim_cmd(runs, seed, minutes, bulk_runs, frontier) -> None:
    """The scheduler on a virtual cnr-tactical-2 radio: bulk goodput and orders under overload, with and without its path model."""
    from c2dtn.perf import radio_sim

    if frontier:
        radio_sim.frontier(runs, seed, minutes or 1.0)
    else:
        radio_sim.main(runs, seed, minutes or 4.0, bulk_runs=bulk_runs)


@perf.command("scale")
@click.option(
    "--sizes", default="8,32,100,200", show_default=True, help="units per nation, comma-separated (each 1 to 500)"
)
@click.option(
    "--period", default=10.0, show_default=True, type=click.FloatRange(1, 600), help="s between a unit's reports"
)
@click.option(
    "--duration", default=120.0, show_default=True, type=click.FloatRange(10, 3600), help="s of reports per run"
)
@click.option("--drain", default=30.0, show_default=True, type=click.FloatRange(0, 3600))
@click.option(
    "--observers", default=2, show_default=True, type=click.IntRange(1, 500), help="subscribing units per nation"
)
@click.option("--profile", default="cnr-tactical-2", show_default=True, help="each nation's uplink")
@click.option(
    "--modes", default="overlay,mqtt-bridge", show_default=True, help="any of overlay, mqtt-bridge, mqtt-single"
)
@click.option("--seed", default=None, type=click.IntRange(0, 1 << 30), help="loss patterns [default: fresh]")
def scale_cmd(sizes, period, duration, drain, observers, profile, modes, seed) -> None:
    """Cost as units grow (fmn-4nations): age of information against the round-robin floor, link bytes, box CPU and memory."""
    import random

    from c2dtn.errors import ConfigError
    from c2dtn.perf import bft, scale
    from c2dtn.topologies.profiles import load_builtin_profiles

    try:
        load_builtin_profiles().get(profile, "--profile", "profile")
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--profile") from None
    try:
        ns = tuple(int(x) for x in sizes.split(","))
    except ValueError:
        raise click.BadParameter(f"{sizes!r} is not a comma-separated list of numbers", param_hint="--sizes") from None
    bad = [n for n in ns if not 1 <= n <= 500]
    if bad or not ns:
        raise click.BadParameter(
            f"{bad[0] if bad else sizes!r}: units per nation go from 1 to 500", param_hint="--sizes"
        )
    ms = tuple(modes.split(","))
    for m_ in ms:
        if m_ not in bft.ALL_MODES:
            raise click.BadParameter(
                f"unknown mode {m_!r}; choose from {', '.join(bft.ALL_MODES)}", param_hint="--modes"
            )
    seed = random.randrange(1 << 30) if seed is None else seed
    scale.main(scale.ScalePlan(ns, period, duration, drain, profile, seed, observers, modes=ms))


@perf.command("overload")
@click.option("--minutes", default=20.0, show_default=True, type=click.FloatRange(1, 600))
@click.option(
    "--factor",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 100),
    help="offered MQTT payload as a multiple of the radio link's rate (reports go compressed: the report says what share the link carried)",
)
@click.option("--units", default=24, show_default=True, type=click.IntRange(1, 500), help="position reporters on h1")
@click.option(
    "--order-every", default=10.0, show_default=True, type=click.FloatRange(0.1, 3600), help="s between QoS 1 orders"
)
@click.option("--profile", default="cnr-tactical-2", show_default=True, help="the r2=r3 radio link's profile")
@click.option(
    "--drain",
    default=600.0,
    show_default=True,
    type=click.FloatRange(0, 36000),
    help="s the orders may take to arrive after the load ends",
)
@click.option("--seed", default=1, show_default=True, type=int)
def overload_cmd(minutes, factor, units, order_every, profile, drain, seed) -> None:
    """Overload: positions and orders at --factor x the radio link for --minutes; RSS, custody, losses, freshness."""
    from rich.console import Console

    from c2dtn.perf import overload_bench

    try:
        overload_bench.main(minutes, factor, units, order_every, profile, drain, seed, console=Console())
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--profile") from None


@perf.command("gateway")
@click.option(
    "--count", default=20_000, show_default=True, type=click.IntRange(100, 10_000_000), help="messages per run"
)
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option("--qos", "qos", default="0,1", show_default=True, help="QoS levels to measure")
def gateway_cmd(count: int, runs: int, qos: str) -> None:
    """Messages per second through the c2dtn MQTT gateways next to mosquitto alone (lan, 256 B)."""
    from c2dtn.perf import gateway_bench

    levels = []
    for q in qos.split(","):
        if q.strip() not in ("0", "1", "2"):
            raise click.BadParameter(f"QoS {q!r} is not 0, 1 or 2", param_hint="--qos")
        levels.append(int(q))
    gateway_bench.main(count, runs, levels)


def _seconds(text: str) -> tuple[float, float] | None:
    """START-END in seconds, 0 <= START < END, or None when it is not that."""
    try:
        a, b = (float(x) for x in text.split("-"))
    except ValueError:
        return None
    return (a, b) if 0 <= a < b else None


def _outage(ctx, param, value: str):
    if value == "auto":
        return value
    if value in ("", "none"):
        return None
    span = _seconds(value)
    if span is None:
        raise click.BadParameter(f"{value!r} is not START-END in seconds (e.g. 20-80) or none")
    return span


@perf.command("bft")
@click.option(
    "--topology",
    type=click.Choice(["nps-chain", "fmn-2nations", "fmn-4nations", "fmn-4nations-mixed"]),
    default="nps-chain",
    help="fmn-4nations-mixed: a different BPA per nation, a relay at tacnet",
    show_default=True,
)
@click.option(
    "--profile",
    default="cnr-tactical-2",
    show_default=True,
    help="profile of the emulated links (nps-chain: r2-r3; fmn: each nation's)",
)
@click.option("--units", default=8, show_default=True, type=click.IntRange(1, 64))
@click.option("--period", default=2.0, show_default=True, type=click.FloatRange(0.1, 600), help="seconds")
@click.option("--duration", default=100.0, show_default=True, type=click.FloatRange(5, 7200), help="seconds")
@click.option(
    "--outage",
    default="auto",
    show_default=True,
    callback=_outage,
    help="a link down from START to END seconds (nps-chain: r2-r3; fmn: the first nation's), or none; "
    "auto: 20-80 on nps-chain, none on fmn",
)
@click.option(
    "--drain",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, 7200),
    help="seconds allowed after publishing ends for the backlog",
)
@click.option("--qos", default=1, show_default=True, type=click.IntRange(0, 2))
@click.option(
    "--modes",
    default="overlay,mqtt-bridge",
    show_default=True,
    help="any of overlay, mqtt-bridge (a broker per nation, bridged), mqtt-single (one broker for all), "
    "mqtt-sn (nps-chain: MQTT-SN over the radio to the Paho gateway beside h4's broker; `make bpas` builds it)",
)
@click.option(
    "--agent",
    "agents",
    multiple=True,
    metavar="[NODE=]KIND",
    help="run every node on agent KIND (a topology without a relay), or NODE on KIND "
    "instead of the topology's (fmn-4nations-mixed: e.g. usa-gw=KIND)",
)
@click.option(
    "--view",
    type=click.IntRange(1, 65535),
    default=None,
    metavar="PORT",
    help="serve the drill view on http://127.0.0.1:PORT/ during the run: links, queues, each unit's age "
    "of information at each receiver, live; links can be taken down from it",
)
@click.option(
    "--pcap",
    type=click.Path(file_okay=False),
    default=None,
    help="capture every emulated link into DIR/<mode>/<link>.pcapng (the radio links' go beside the report anyway)",
)
@click.option(
    "--scheduler",
    "sched",
    multiple=True,
    metavar="KEY=VALUE",
    help="an overlay [scheduler] setting for the gateways of this run, over what `c2dtn node configs` writes, "
    "e.g. linger_ms=1500 (repeatable)",
)
@click.option(
    "--seed",
    default=None,
    show_default="7",
    type=click.IntRange(0, 2**31 - 1),
    help="the userspace emulator's loss draws (link i draws from SEED + 2i and SEED + 2i + 1, so runs meant to "
    "differ need seeds far apart, e.g. 100, 200) and the units' timing",
)
def bft_cmd(
    topology: str,
    profile: str,
    units: int,
    period: float,
    duration: float,
    outage,
    drain: float,
    qos: int,
    modes: str,
    agents: tuple[str, ...],
    view: int | None,
    pcap: str | None,
    sched: tuple[str, ...],
    seed: int | None,
) -> None:
    """Position reports (seed 000) across tactical links: c2dtn gateways next to Mosquitto bridges."""
    from c2dtn.errors import ConfigError
    from c2dtn.perf import bft
    from c2dtn.topologies.profiles import load_builtin_profiles

    try:
        load_builtin_profiles().get(profile, "--profile", "profile")
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--profile") from None
    ms = modes.split(",")
    for m_ in ms:
        if m_ not in bft.ALL_MODES:
            raise click.BadParameter(
                f"unknown mode {m_!r}; choose from {', '.join(bft.ALL_MODES)}", param_hint="--modes"
            )
    if topology != "nps-chain" and set(ms) & set(bft.NPS_ONLY):
        raise click.BadParameter(
            f"mode {sorted(set(ms) & set(bft.NPS_ONLY))[0]} runs on nps-chain only", param_hint="--modes"
        )
    if "mqtt-sn" in ms and qos != 1:
        raise click.BadParameter(f"mqtt-sn publishes at QoS 1 only, not {qos}", param_hint="--qos")
    if "mqtt-sn" in ms:
        from c2dtn.perf.mqtt_sn import gateway_missing

        if gateway_missing():
            raise click.UsageError(f"mode mqtt-sn: {gateway_missing()}")
    if outage == "auto":
        outage = (20.0, 80.0) if topology == "nps-chain" else None
    if outage and outage[1] > duration:
        raise click.BadParameter(
            f"the outage {outage[0]:g}-{outage[1]:g} s ends after the run ({duration:g} s)", param_hint="--outage"
        )
    chosen = {}
    for a in agents:
        node, eq, kind = a.partition("=")
        if not eq:
            node, kind = "*", node  # a bare KIND: every node
        if not (node and kind):
            raise click.BadParameter(f"{a!r} is not KIND or NODE=KIND (e.g. usa-gw=KIND)", param_hint="--agent")
        chosen[node] = kind
    if chosen:  # named nodes and agents checked before any namespace is made
        from c2dtn.topologies import testbed
        from c2dtn.topologies.model import load
        from c2dtn.topologies.node_configs import override_agents

        try:
            override_agents(testbed.state_of(load(topology), "userspace"), chosen)
        except ConfigError as e:
            raise click.BadParameter(str(e), param_hint="--agent") from None
    plan = bft.Plan(
        profile,
        units,
        period,
        duration,
        outage,
        drain,
        qos,
        topology=topology,
        agents=chosen,
        scheduler=_scheduler(sched),
        **({} if seed is None else {"seed": seed}),
    )
    plan.view = view or 0
    plan.pcap = str(Path(pcap).resolve()) if pcap else ""
    bft.main(plan, ms)


@perf.command("orders")
@click.option("--profile", default="narrowband-15k", show_default=True, help="profile of the leaders' link")
@click.option(
    "--protocols",
    default="mqtt,coap,http",
    show_default=True,
    help="MQTT QoS 1, CoAP CON POSTs, HTTP POSTs (HTTP runs direct only: the overlay carries MQTT and CoAP)",
)
@click.option(
    "--modes",
    default="direct,overlay",
    show_default=True,
    help="direct: across the links; overlay: through c2dtn gateways at the leaders",
)
@click.option(
    "--outage",
    default="none",
    show_default=True,
    callback=_outage,
    help="the leaders' link down from START to END seconds into the script (e.g. 60-120), or none",
)
@click.option(
    "--span",
    type=click.FloatRange(10, 7200),
    default=240.0,
    show_default=True,
    help="seconds the 97 messages are spread over",
)
@click.option(
    "--drain",
    type=click.FloatRange(0, 7200),
    default=60.0,
    show_default=True,
    help="seconds allowed after the last message",
)
@click.option("--seed", default=4, show_default=True, help="seeds the script and the links")
@click.option(
    "--view",
    type=click.IntRange(1, 65535),
    default=None,
    metavar="PORT",
    help="serve the drill view on http://127.0.0.1:PORT/ during the run: links, queues, each order's delay, live",
)
def orders_cmd(
    profile: str, protocols: str, modes: str, outage, span: float, drain: float, seed: int, view: int | None
) -> None:
    """C2 orders between the platoons (seed 004's 97-message script shape): MQTT, CoAP and HTTP, direct and
    through the overlay."""
    from c2dtn.errors import ConfigError
    from c2dtn.perf import orders
    from c2dtn.topologies.profiles import load_builtin_profiles

    try:
        load_builtin_profiles().get(profile, "--profile", "profile")
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--profile") from None
    if outage and outage[1] > span + drain:
        raise click.BadParameter(
            f"the outage {outage[0]:g}-{outage[1]:g} s ends after the run ({span + drain:g} s)", param_hint="--outage"
        )
    chosen = orders.runs(
        tuple(_list(protocols, orders.PROTOCOLS, "protocol", "--protocols")),
        tuple(_list(modes, orders.PATHS, "mode", "--modes")),
    )
    if not chosen:
        raise click.BadParameter(
            "HTTP runs direct only (the overlay carries MQTT and CoAP): add mqtt or coap, or --modes direct",
            param_hint="--protocols",
        )
    orders.main(profile, tuple(chosen), drain, seed, span, outage, view or 0)


@perf.command("matrix")
@click.option("--quick", is_flag=True, help="fmn-4nations, a report every 2 s, both profiles, 20 s each (~3 min)")
@click.option(
    "--duration",
    type=click.FloatRange(5, 7200),
    default=None,
    help="seconds of reports per run  [default: 60; --quick: 20]",
)
@click.option(
    "--drain",
    type=click.FloatRange(0, 7200),
    default=None,
    help="seconds allowed after the last report  [default: 30; --quick: 10]",
)
@click.option("--qos", default=1, show_default=True, type=click.IntRange(0, 2))
def matrix_cmd(quick: bool, duration: float | None, drain: float | None, qos: int) -> None:
    """The seed 000 matrix: fmn-2nations and fmn-4nations x cnr-tactical-1 and -2 x every 2 and 10 s."""
    from c2dtn.perf import matrix

    matrix.main(quick, duration, drain, qos)


def _list(value: str, known, what: str, hint: str) -> list[str]:
    """The comma-separated items of an option, each one of `known` (None: anything)."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    for x in items:
        if known is not None and x not in known:
            raise click.BadParameter(f"unknown {what} {x!r}; choose from {', '.join(known)}", param_hint=hint)
    if not items:
        raise click.BadParameter(f"no {what} given", param_hint=hint)
    return items


@perf.command("bundles")
@click.option(
    "--agents",
    default=DEFAULT,
    show_default=True,
    help="BPAs to compare, each on the asked-for CLAs it speaks (comma-separated kinds)",
)
@click.option(
    "--cla",
    "clas",
    default="tcpcl,udp,mtcp",
    show_default=True,
    help="convergence layers; AGENT:CLA for one agent only (e.g. tcpcl,KIND:udp)",
)
@click.option("--profiles", default="lan,cnr-tactical-1", show_default=True, help="profiles of the radio hop")
@click.option("--sizes", default="1k,10k,100k,1M", show_default=True)
@click.option("--runs", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--window", default=8, show_default=True, type=click.IntRange(1, 10_000), help="bundles in flight in data mode"
)
@click.option(
    "--budget",
    default=180.0,
    show_default=True,
    type=click.FloatRange(10, 36_000),
    help="seconds one run may take; sizes that cannot fit are reported as skipped",
)
@click.option(
    "--outage",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, 3600),
    help="seconds of the radio hop's cut in the outage runs (0: none)",
)
@click.option(
    "--outage-runs",
    default=3,
    show_default=True,
    type=click.IntRange(0, 100),
    help="outage runs per agent and CLA (1 kB bundles, one a second, on lan)",
)
def bundles_cmd(
    agents: str,
    clas: str,
    profiles: str,
    sizes: str,
    runs: int,
    window: int,
    budget: float,
    outage: float,
    outage_runs: int,
) -> None:
    """Bundle throughput and round trip per agent x CLA x profile x size (fresh daemons per run)."""
    from c2dtn.errors import ConfigError
    from c2dtn.perf import bundles_bench as b
    from c2dtn.topologies.nodes import AGENTS
    from c2dtn.topologies.profiles import load_builtin_profiles

    lib = load_builtin_profiles()
    ps = [x.strip() for x in profiles.split(",") if x.strip()]
    for x in ps:
        try:
            lib.get(x, "--profiles", "profile")
        except ConfigError as e:
            raise click.BadParameter(str(e), param_hint="--profiles") from None
    agent_list = _list(agents, AGENTS, "agent", "--agents")
    cla_list = _list(clas, None, "CLA", "--cla")
    for item in cla_list:  # CLA or AGENT:CLA
        agent, _, cla = item.rpartition(":")
        if cla not in b.CLAS:
            raise click.BadParameter(
                f"unknown CLA {cla!r} in {item!r}; choose from {', '.join(b.CLAS)}", param_hint="--cla"
            )
        if agent and agent not in agent_list:
            raise click.BadParameter(
                f"agent {agent!r} of {item!r} is not in --agents ({', '.join(agent_list)})", param_hint="--cla"
            )
    b.main(
        agent_list,
        cla_list,
        ps,
        _list(sizes, list(b.SIZES), "size", "--sizes"),
        runs,
        window,
        budget,
        outage,
        outage_runs,
    )


@perf.command("fuzz")
@click.option("--targets", default=None, help="comma-separated; default: all (perf/fuzz_targets.py)")
@click.option("--runs", default=1_000_000, show_default=True, help="inputs per target")
@click.option("--save", is_flag=True, help="merge what the corpus grew into tests/fuzz_corpus/ (replayed by make test)")
def fuzz_cmd(targets: str | None, runs: int, save: bool) -> None:
    """Coverage-guided fuzzing (atheris) of every input c2dtn takes from a peer or an operator."""
    from rich.console import Console

    from c2dtn.perf import fuzz, fuzz_targets

    names = targets.split(",") if targets else list(fuzz_targets.TARGETS)
    bad = [n for n in names if n not in fuzz_targets.TARGETS]
    if bad:
        raise click.BadParameter(
            f"unknown target(s) {', '.join(bad)}: " + ", ".join(fuzz_targets.TARGETS), param_hint="--targets"
        )
    if runs < 1:
        raise click.BadParameter(f"{runs}: at least 1", param_hint="--runs")
    if "mqtt_diff" in names and importlib.util.find_spec("mqtt5") is None:
        raise click.UsageError("target mqtt_diff needs the mqtt5 codec (the [test] extra: make venv installs it)")
    _, rows = fuzz.main(names, runs, save, console=Console())
    if any(r["crashes"] for r in rows):
        raise SystemExit(1)


def _spans(ctx, param, value: str | None):
    if value is None:
        return None
    out: list[tuple[float, float]] = []
    for part in value.split(","):
        span = _seconds(part)
        if span is None:
            raise click.BadParameter(f"{part!r} is not START-END in seconds (e.g. 8-20)")
        a, b = span
        for c, d in out:
            if a < d and c < b:
                raise click.BadParameter(f"{part!r} overlaps {c:g}-{d:g}: a span's bytes would count twice")
        out.append((a, b))
    return out


@perf.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--plot", "plot", default=None, help="write a PNG comparing the BFT runs here")
@click.option(
    "--spans",
    default=None,
    callback=_spans,
    metavar="A-B,C-D,...",
    help="perf bft runs: link bytes, reports delivered and bytes per delivered report in each span of seconds "
    "from the first report sent, from the run's captures and events (the overlay's)",
)
def report_cmd(dirs: tuple[str, ...], plot: str | None, spans: list[tuple[float, float]] | None) -> None:
    """Put results folders of perf bft / perf bundles side by side."""
    from c2dtn.perf import compare

    if spans:
        if plot:
            raise click.UsageError("--spans prints tables; --plot draws the runs side by side: one at a time")
        compare.spans([Path(d) for d in dirs], spans)
        return
    compare.main(list(dirs), plot)
