"""Overlay benchmark: the overlay next to its agent bare, same daemons, same run.

On `lan` (nps-chain, dtnd on gw1, r2, r3, gw4, the overlay on gw1 and gw4):
round trip (bping style: the far end answers) and throughput (a stream of
bundles or envelopes, first sent to last received) for payloads of 1 kB,
10 kB, 100 kB and 1 MB, overlay / bare ratios printed side by side (targets: throughput >= 0.9 x bare, round trip <= 1.3 x bare; decision 0006).  On `cnr-tactical-2`:
goodput of a bulk transfer as a fraction of the 9.8 kbit/s link (target >= 0.75).

With --agents the same on lan for every agent named: dtn7 as above; ION,
IBR-DTN and HDTN serve one endpoint per node, so their bare figures cannot be taken beside a
running overlay node.  Each run of such an agent is two blocks on fresh chains: the agent
bare (perf.bare_client --config on gw1 and gw4: echo and rtt, source and sink, every size),
then the overlay (nodes on gw1 and gw4 over the same agent, every size).  Without turns
the ratios of these agents carry the machine's drift between the two blocks.  An agent whose
harness CLA is UDP (ION here) skips the sizes one datagram cannot carry.

Writes results/<time>-overlay-bench/ with summary.json, summary.csv and plot.png.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c2dtn.overlay.agents import DEFAULT, agent_class
from c2dtn.perf.bare_client import answer as _answer
from c2dtn.perf.bare_client import client_gap
from c2dtn.perf.bare_client import end as _end
from c2dtn.perf.bare_client import result as _result
from c2dtn.perf.bare_client import spawn as _client
from c2dtn.perf.bundles_bench import cannot_run, too_big
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.node_configs import harness_cla
from c2dtn.topologies.nodes import Nodes

console = Console(width=None if sys.stdout.isatty() else 140)
BPA = ["gw1", "r2", "r3", "gw4"]
SIZES = {"1k": 1000, "10k": 10_000, "100k": 100_000, "1M": 1_000_000}
# envelopes (and bundles) per throughput run: about 3 s of transfer each, so that a stall of
# a few hundred milliseconds on a shared machine does not decide a run (at 40 x 100 kB, runs
# of 1.5 s, the same code measured 0.57 to 1.14 of bare)
COUNTS = {"1k": 800, "10k": 400, "100k": 100, "1M": 24}


def rtt_pairs(nodes: Nodes, size: int, count: int, agent: str = DEFAULT) -> tuple[list[float], list[float]]:
    """(bare, overlay) round trips, `count` of each, taking turns: one bare ping of `agent`
    (perf.bare_client rtt --stepped beside the overlay node, answered by an echo client on gw4),
    then one through the overlay, and so on, so that both see the same moments of a noisy
    machine (run one after the other, the bare figures of two runs differed by 20 %)."""
    echo = _client("gw4", "echo", "--timeout", str(60 + count * 10), "--beside", str(nodes.paths["gw4"]))
    pinger = _client(
        "gw1",
        "rtt",
        *("--dst", "gw4", "--size", str(size), "--timeout", "30", "--stepped"),
        *("--beside", str(nodes.paths["gw1"])),
        stdin=True,
    )
    bare: list[float] = []
    over: list[float] = []
    try:
        _answer(pinger)  # registered
        time.sleep(1.0)  # and the echo too
        for _ in range(count):
            pinger.stdin.write("\n")
            pinger.stdin.flush()
            r = _answer(pinger)["rtt"]
            if r is not None:
                bare.append(r)
            over.extend(overlay_rtt(nodes, size, 1))
    finally:
        with contextlib.suppress(OSError):
            pinger.stdin.close()
        with contextlib.suppress(Exception):
            _result(pinger, 60)
        echo.kill()
        echo.wait()
    return bare, over


def bare_throughput(
    size: int, count: int, conf: dict[str, tuple[str, ...]] | None = None, gap: float = 0.0
) -> tuple[float, int]:
    """(bits per second of payload received, bundles received) from the first bundle handed
    over to the last received.  conf: each client's arguments: --config (an agent that serves one
    endpoint per node, through its driver; such an agent may lose bundles fed as fast as it takes
    them, as ION over UDP did: they are counted, not waited for past the sink's timeout), or
    --beside (a client beside the overlay node, which must deliver all)."""
    conf = conf or {}
    beside = not any("--config" in c for c in conf.values())
    wait = 300 if beside else 60 + count * size * 8 / 1e6  # the others: at least 1 Mbit/s, or lost
    sink = _client("gw4", "sink", "--count", str(count), "--timeout", f"{wait:.0f}", *conf.get("gw4", ()))
    time.sleep(1.0)
    src = _result(
        _client("gw1", "source", "--dst", "gw4", "--size", str(size), "--count", str(count), *conf.get("gw1", ())), 600
    )
    snk = _result(sink, 600)
    time.sleep(gap)  # before the next client of the same node (bare_client.client_gap)
    if not snk["last"] or (not conf and snk["received"] < count):
        raise RuntimeError(f"bare agent: {snk['received']} of {count} bundles arrived")
    return snk["bytes"] * 8 / (snk["last"] - src["start"]), snk["received"]


def bare_rtts(size: int, count: int, conf: dict[str, tuple[str, ...]], gap: float = 0.0) -> list[float]:
    """`count` bare round trips through the agent (an echo client on gw4 answers)."""
    echo = _client("gw4", "echo", "--timeout", str(60 + count * 10), *conf["gw4"])
    try:
        time.sleep(1.0)
        r = _result(
            _client(
                "gw1",
                "rtt",
                "--dst",
                "gw4",
                "--size",
                str(size),
                "--count",
                str(count),
                "--timeout",
                "30",
                *conf["gw1"],
            ),
            60 + count * 35,
        )
    finally:
        _end(echo, gap)
    if "gave_up" in r:
        raise RuntimeError(f"bare agent, {size}-byte round trips: {r['gave_up']}")
    return r["rtts"]


def overlay_rtt(nodes: Nodes, size: int, count: int) -> list[float]:
    """Round trips as the bare pinger's: from handing the ping over to having the answer
    in hand (NodeClient.pings: the application's POST /consumed follows, outside the time)."""
    return [r for r in nodes.client("gw1").pings("gw4", size, count, timeout=60) if r is not None]


def overlay_throughput(nodes: Nodes, size: int, count: int, timeout: float = 600) -> tuple[float, float]:
    """(bits per second of payload, seconds) from the first submit to the last delivery."""
    got = []
    done = threading.Event()

    def receive():
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            items = nodes.recv("gw4", wait=1.0)
            now = time.monotonic()
            got.extend((now, len(d["body"])) for d in items)
        done.set()

    th = threading.Thread(target=receive, daemon=True)
    th.start()
    t0 = time.monotonic()
    for _ in range(count):
        nodes.send("gw1", "gw4", os.urandom(size))
    th.join(timeout + 5)
    if len(got) < count:
        raise RuntimeError(f"overlay: {len(got)} of {count} envelopes arrived within {timeout:.0f} s")
    secs = max(t for t, _ in got) - t0
    return sum(n for _, n in got) * 8 / secs, secs


SEED_STRIDE = 1000  # radio run i is seeded SEED + i * this: the testbed seeds link k's emulator SEED + 2k
SCHEDULER: dict[str, int] = {}  # --scheduler settings for the overlay nodes of this invocation


def _nodes(
    profile: str,
    workdir: Path,
    seed: int = 5,
    cla: str = "tcpcl",
    per_link_cla: bool = True,
    radio_cla: str | None = None,
    agent: str = DEFAULT,
    overlay: bool = True,
) -> Nodes:
    testbed.down()
    st = testbed.up("nps-chain", profile=profile, seed=seed)
    if radio_cla:
        st["links"]["r2-r3"]["cla"] = radio_cla  # the BPAs' CLA across the radio link, for this run
    nodes = Nodes(
        st,
        BPA,
        ["gw1", "gw4"] if overlay else [],
        workdir,
        cla=cla,
        per_link_cla=per_link_cla,
        scheduler=SCHEDULER,
        agent=agent,
    )
    nodes.start_all(BPA)
    return nodes


def lan_cla(agent: str) -> str:
    """The CLA of every hop on lan: TCPCL (a megabyte bundle fits no UDP datagram), or UDP for
    what the harness runs an agent on instead (its driver's testbed_clas: ION, UDP)."""
    return harness_cla(agent, "tcpcl")


def cannot_carry(agent: str, size: int) -> str | None:
    """Why the overlay over `agent` cannot be measured at `size` here (None: it can)."""
    return cannot_run(agent, lan_cla(agent)) or too_big(agent, lan_cla(agent), size)


def lan(sizes: list[str], runs: int, rtt_count: int = 40, agent: str = DEFAULT) -> list[dict]:
    if not agent_class(agent).capabilities.beside_overlay:
        return lan_blocks(agent, sizes, runs, rtt_count)
    rows = []
    with tempfile.TemporaryDirectory() as td:
        # on a LAN every hop speaks TCPCL (a megabyte bundle fits no UDP datagram)
        nodes = _nodes("lan", Path(td), cla="tcpcl", per_link_cla=False, agent=agent)
        beside = {n: ("--beside", str(nodes.paths[n])) for n in ("gw1", "gw4")}
        try:
            for name in sizes:
                size, count = SIZES[name], COUNTS[name]
                for r in range(runs):
                    console.print(f"[dim]lan {name}: run {r + 1}/{runs}[/dim]")
                    row = {"agent": agent, "cla": "tcpcl", "size": name, "bytes": size, "run": r + 1}
                    bare, over = rtt_pairs(nodes, size, rtt_count, agent)
                    row["bare_rtt_s"], row["overlay_rtt_s"] = statistics.median(bare), statistics.median(over)
                    row["bare_rtts"], row["overlay_rtts"] = bare, over
                    row["bare_bps"], _ = bare_throughput(size, count, beside)
                    row["overlay_bps"], _ = overlay_throughput(nodes, size, count)
                    rows.append(row)
        finally:
            nodes.stop_all()
            testbed.down()
    return rows


def lan_blocks(agent: str, sizes: list[str], runs: int, rtt_count: int = 40) -> list[dict]:
    """An agent that serves one endpoint per node: per run, the agent bare on a fresh chain
    (every size), then the overlay over it on another (every size)."""
    cla = lan_cla(agent)
    rows: list[dict] = []
    go = []
    for name in sizes:
        skip = cannot_carry(agent, SIZES[name])
        if skip:
            rows.append({"agent": agent, "cla": cla, "size": name, "bytes": SIZES[name], "skipped": skip})
        else:
            go.append(name)
    with tempfile.TemporaryDirectory() as td:
        for r in range(runs):
            got = {name: {"agent": agent, "cla": cla, "size": name, "bytes": SIZES[name], "run": r + 1} for name in go}
            console.print(f"[dim]lan {agent} bare: run {r + 1}/{runs}[/dim]")
            nodes = _nodes(
                "lan", Path(td) / f"bare-{r}", seed=r + 1, cla=cla, per_link_cla=False, agent=agent, overlay=False
            )
            conf = {n: ("--config", str(nodes.paths[n])) for n in ("gw1", "gw4")}
            try:
                for i, name in enumerate(go):
                    row = got[name]
                    try:
                        row["bare_rtts"] = bare_rtts(SIZES[name], rtt_count, conf, client_gap(agent))
                        row["bare_rtt_s"] = statistics.median(row["bare_rtts"])
                        row["bare_bps"], got_n = bare_throughput(SIZES[name], COUNTS[name], conf, client_gap(agent))
                        row["bare_lost"] = COUNTS[name] - got_n
                    except RuntimeError as e:  # the agent stopped answering: this run's chain is not trusted further
                        console.print(f"[red]lan {agent} bare {name}, run {r + 1}: {e}[/red]")
                        row["failed"] = str(e)
                        for later in go[i + 1 :]:
                            got[later]["failed"] = f"not measured: this run's bare chain had failed at {name}"
                        break
            finally:
                nodes.stop_all()
                testbed.down()
            console.print(f"[dim]lan {agent} overlay: run {r + 1}/{runs}[/dim]")
            nodes = _nodes("lan", Path(td) / f"overlay-{r}", seed=r + 1, cla=cla, per_link_cla=False, agent=agent)
            try:
                for name in (n for n in go if "failed" not in got[n]):
                    row = got[name]
                    row["overlay_rtts"] = overlay_rtt(nodes, SIZES[name], rtt_count)
                    row["overlay_rtt_s"] = statistics.median(row["overlay_rtts"])
                    row["overlay_bps"], _ = overlay_throughput(nodes, SIZES[name], COUNTS[name])
            finally:
                nodes.stop_all()
                testbed.down()
            rows.extend(got.values())
    return rows


def tactical(
    profile: str = "cnr-tactical-2",
    total_bytes: int = 60_000,
    body: int = 1000,
    cla: str | None = None,
    agent: str = DEFAULT,
    seed: int = 5,
    pings: int = 0,
) -> dict:
    """One bulk transfer across the radio; `seed` draws the emulator's losses (a run's own).
    pings: that many round trips (a minimal ping each, answered) before it, the first on a
    link idle since the topology came up."""
    with tempfile.TemporaryDirectory() as td:
        # the radio link (r2-r3) carries what the topology says (nps-chain: UDP) unless --cla
        # names another; the LAN hops keep TCPCL
        nodes = _nodes(profile, Path(td), seed=seed, cla=lan_cla(agent), radio_cla=cla, agent=agent)
        try:
            rtts: list[float | None] = []
            if pings:
                console.print(f"[dim]{profile} ({agent}): {pings} round trips[/dim]")
                rtts = list(nodes.client("gw1").pings("gw4", 1, pings, timeout=300))
            count = total_bytes // body
            console.print(
                f"[dim]{profile} ({agent}): bulk transfer of {count} x {body} B incompressible envelopes[/dim]"
            )
            bps, secs = overlay_throughput(nodes, body, count, timeout=1800)
            link = testbed.read_state()["links"]["r2-r3"]
            st = testbed.status()["links"]["r2-r3"]["live"]
        finally:
            nodes.stop_all()
            testbed.down()
    rate = link["profile_ab"]["rate_bps"]
    return {
        "profile": profile,
        "seed": seed,
        "cla": cla or link.get("cla") or "tcpcl",
        "payload_bytes": count * body,
        "seconds": secs,
        "goodput_bps": bps,
        "link_bps": rate,
        "fraction": bps / rate,
        "link_frames_ab": st["ab"]["delivered"],
        "link_bytes_ab": st["ab"]["delivered_bytes"],
        "rtts_s": rtts,
    }


def _agent_label(agent: str) -> str:
    return agent_class(agent).label()


def summarize(rows: list[dict]) -> list[dict]:
    """Per agent and payload: medians over runs and the per-run ratios' median, min and max
    (a skipped size keeps its reason)."""
    summary = []
    agents = list(dict.fromkeys(r.get("agent", DEFAULT) for r in rows))
    keys = sorted(
        dict.fromkeys((r.get("agent", DEFAULT), r["size"]) for r in rows),
        key=lambda k: (agents.index(k[0]), list(SIZES).index(k[1])),
    )
    for agent, name in keys:
        rs = [r for r in rows if (r.get("agent", DEFAULT), r["size"]) == (agent, name)]
        skipped = next((r["skipped"] for r in rs if "skipped" in r), None)
        rs = [r for r in rs if "skipped" not in r]
        failed = [r["failed"] for r in rs if "failed" in r]
        rs = [r for r in rs if "failed" not in r]
        if skipped or not rs:
            why = skipped or (f"every run failed: {failed[0]}" if failed else "no run")
            summary.append({"agent": agent, "size": name, "skipped": why, "runs": 0, "failed": failed})
            continue
        med = {
            k: statistics.median(r[k] for r in rs) for k in ("bare_bps", "overlay_bps", "bare_rtt_s", "overlay_rtt_s")
        }
        trs = sorted(r["overlay_bps"] / r["bare_bps"] for r in rs)
        rrs = sorted(r["overlay_rtt_s"] / r["bare_rtt_s"] for r in rs)
        summary.append(
            {
                "agent": agent,
                "cla": rs[0].get("cla", "tcpcl"),
                "size": name,
                **med,
                "throughput_ratio": statistics.median(trs),
                "rtt_ratio": statistics.median(rrs),
                "runs": len(rs),
                "throughput_ratio_min": trs[0],
                "throughput_ratio_max": trs[-1],
                "rtt_ratio_min": rrs[0],
                "rtt_ratio_max": rrs[-1],
                # fed as fast as it takes them, bundles the bare agent lost (over all runs)
                "bare_lost": sum(r.get("bare_lost", 0) for r in rs),
                "bare_sent": len(rs) * COUNTS[name],
                "failed": failed,
            }
        )  # runs left out: why each failed
    return summary


def report(rows: list[dict], tac: dict | list[dict] | None, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    agents = list(dict.fromkeys(s["agent"] for s in summary))
    only_default = agents in ([], [DEFAULT])
    t = Table(
        title=(
            f"overlay vs bare {_agent_label(DEFAULT)} on lan (nps-chain, 4 {_agent_label(DEFAULT)} hops): "
            "medians over runs, ratios per run (round trips: bare and overlay pings taking turns)"
        )
        if only_default
        else (
            "overlay vs its agent bare on lan (nps-chain, 4 hops): medians over runs, ratios per run "
            "(an agent that serves many endpoints per node: bare and overlay pings taking turns; the "
            "others: a bare block, then an overlay block)"
        )
    )
    cols = (
        "payload",
        "bare throughput",
        "overlay throughput",
        "ratio (>= 0.9)",
        "min-max",
        "bare RTT",
        "overlay RTT",
        "ratio (<= 1.3)",
        "min-max",
        "runs",
    )
    if not only_default:
        t.add_column("agent (CLA)")
        cols += ("bare lost",)
    for c in cols:
        t.add_column(c, justify="right")
    for s in summary:
        head = [] if only_default else [f"{s['agent']} ({s.get('cla', lan_cla(s['agent']))})"]
        if "skipped" in s:
            t.add_row(*head, s["size"], "skipped (below)", *[""] * (len(cols) - 2))
            continue
        t.add_row(
            *head,
            s["size"],
            f"{s['bare_bps'] / 1e6:.2f} Mbit/s",
            f"{s['overlay_bps'] / 1e6:.2f} Mbit/s",
            f"{s['throughput_ratio']:.2f}",
            f"{s['throughput_ratio_min']:.2f}-{s['throughput_ratio_max']:.2f}",
            f"{s['bare_rtt_s'] * 1000:.1f} ms",
            f"{s['overlay_rtt_s'] * 1000:.1f} ms",
            f"{s['rtt_ratio']:.2f}",
            f"{s['rtt_ratio_min']:.2f}-{s['rtt_ratio_max']:.2f}",
            str(s["runs"]),
            *([] if only_default else [f"{s['bare_lost']} of {s['bare_sent']}"]),
        )
    if rows:
        console.print(t)
        for s in summary:
            if "skipped" in s:
                console.print(f"skipped: {s['agent']} {s['size']}: {s['skipped']}")
            elif s.get("failed"):
                console.print(
                    f"left out: {s['agent']} {s['size']}: {len(s['failed'])} run(s) failed: " + "; ".join(s["failed"])
                )
    tacs = [tac] if isinstance(tac, dict) else (tac or [])
    if tacs:
        g = Table(title=f"bulk goodput on {tacs[0]['profile']}")
        for c in (
            "agent",
            "radio CLA",
            "payload",
            "time (median)",
            "goodput (median)",
            "link rate",
            "fraction (>= 0.75)",
            "min",
            "max",
            "runs",
            "emulator seeds",
            "round trip first / later (median)",
        ):
            g.add_column(c, justify="right")
        for x in tacs:
            g.add_row(
                x.get("agent", DEFAULT),
                f"over {x['cla']}",
                f"{x['payload_bytes']} B",
                f"{x['seconds']:.0f} s",
                f"{x['goodput_bps'] / 1e3:.2f} kbit/s",
                f"{x['link_bps'] / 1e3:.1f} kbit/s",
                f"{x['fraction']:.2f}",
                f"{x.get('fraction_min', 0):.2f}",
                f"{x.get('fraction_max', 0):.2f}",
                str(x.get("runs", 1)),
                ", ".join(str(r["seed"]) for r in x.get("all_runs", [x]) if "seed" in r) or "-",
                "-"
                if x.get("rtt_first_s") is None
                else f"{x['rtt_first_s']:.1f} / {x['rtt_later_s'] or 0:.1f} s"
                + (f" ({x['rtt_unanswered']} unanswered)" if x.get("rtt_unanswered") else ""),
            )
        console.print(g)
    (out / "summary.json").write_text(
        json.dumps({"lan_runs": rows, "lan": summary, "tactical": tac, "scheduler": SCHEDULER}, indent=1)
    )
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        cols = [
            "agent",
            "size",
            "bare_bps",
            "overlay_bps",
            "throughput_ratio",
            "throughput_ratio_min",
            "throughput_ratio_max",
            "bare_rtt_s",
            "overlay_rtt_s",
            "rtt_ratio",
            "rtt_ratio_min",
            "rtt_ratio_max",
            "runs",
            "bare_lost",
            "bare_sent",
            "skipped",
            "failed",
        ]
        w.writerow(cols)
        for s in summary:
            w.writerow(["; ".join(s.get(c) or []) if c == "failed" else s.get(c, "") for c in cols])
    drawn = [s for s in summary if "skipped" not in s]
    if drawn:
        plt = pyplot()

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for agent in agents:
            ss = [s for s in drawn if s["agent"] == agent]
            if not ss:
                continue
            xs = [s["size"] for s in ss]
            bare = f"bare {_agent_label(agent)}"
            over = "c2dtn overlay" if only_default else f"overlay on {agent}"
            a1.plot(xs, [s["bare_bps"] / 1e6 for s in ss], "o--" if not only_default else "o-", label=bare)
            a1.plot(xs, [s["overlay_bps"] / 1e6 for s in ss], "s-", label=over)
            a2.plot(xs, [s["bare_rtt_s"] * 1000 for s in ss], "o--" if not only_default else "o-", label=bare)
            a2.plot(xs, [s["overlay_rtt_s"] * 1000 for s in ss], "s-", label=over)
        for a, what, title in ((a1, "throughput (Mbit/s)", "Throughput"), (a2, "round trip (ms)", "Round trip")):
            a.set_yscale("log")
            a.set_xlabel("payload")
            a.set_ylabel(what)
            a.set_title(f"{title} by payload size (lan, 4 hops)")
            a.legend(fontsize=7)
        save_figure(fig, out / "plot.png")
    console.print(f"results in {out}")


def profile_note(agent: str) -> str:
    return f"cnr-tactical-2 over {agent} skipped: {agent_class(agent).missing()}"


def main(
    sizes: list[str],
    runs: int,
    tactical_bytes: int,
    skip_lan: bool = False,
    skip_tactical: bool = False,
    cla: str | None = None,
    scheduler: dict[str, int] | None = None,
    agents: list[str] = (DEFAULT,),
    seed: int | None = None,
    radio_profile: str = "cnr-tactical-2",
    radio_pings: int = 0,
) -> None:
    out = run_dir("overlay-bench")
    if seed is None:  # each invocation its own losses, unless one is asked for again
        seed = random.SystemRandom().randrange(1, 1 << 31)
    console.print(
        f"[dim]radio runs seeded {seed}, {seed + SEED_STRIDE}, ... (--seed {seed} draws the same losses again)[/dim]"
    )
    SCHEDULER.clear()
    SCHEDULER.update(scheduler or {})
    rows: list[dict] = []
    tacs_by_agent: list[dict] = []
    for agent in agents:
        if not skip_lan:
            rows += lan(sizes, runs, agent=agent)
        if not skip_tactical and agent_class(agent).missing():
            console.print(f"[yellow]{profile_note(agent)}[/yellow]")
        elif not skip_tactical:
            tacs = [
                tactical(
                    profile=radio_profile,
                    total_bytes=tactical_bytes,
                    cla=cla,
                    agent=agent,
                    seed=seed + SEED_STRIDE * i,
                    pings=radio_pings,
                )
                for i in range(runs)
            ]
            tac = dict(tacs[0], agent=agent)
            fr = sorted(t["fraction"] for t in tacs)
            firsts = [t["rtts_s"][0] for t in tacs if t.get("rtts_s") and t["rtts_s"][0] is not None]
            later = [r for t in tacs for r in (t.get("rtts_s") or [])[1:] if r is not None]
            tac.update(
                rtt_first_s=statistics.median(firsts) if firsts else None,
                rtt_later_s=statistics.median(later) if later else None,
                rtt_unanswered=sum(1 for t in tacs for r in t.get("rtts_s") or [] if r is None),
            )
            tac.update(
                fraction=statistics.median(fr),
                fraction_min=fr[0],
                fraction_max=fr[-1],
                runs=len(tacs),
                goodput_bps=statistics.median(t["goodput_bps"] for t in tacs),
                seconds=statistics.median(t["seconds"] for t in tacs),
                all_runs=tacs,
            )
            tacs_by_agent.append(tac)
    tac_out = None if not tacs_by_agent else tacs_by_agent[0] if list(agents) == [DEFAULT] else tacs_by_agent
    report(rows, tac_out, out)
