"""Bundle throughput and round trip per agent x convergence layer x profile x size
(`c2dtn perf bundles`), the seed 002 method: for every run the network is built
afresh and the daemons start on empty stores.

nps-chain, a BPA on gw1, r2, r3 and gw4 (every hop on the chosen CLA), the radio hop
r2-r3 on the chosen profile (the LAN hops stay lan).  Per run:
  round trip  bping style: gw1 sends a bundle to an echo on gw4 and waits for it to
              come back; the median of the run's round trips
  throughput  dtnperf-style data mode: gw1 sends bundles with at most --window
              unacknowledged (gw4 answers each with a small ack bundle); payload bits
              over the time from the first send to the last ack
Every agent runs through its driver (perf.dtnd_client --config: the node's own agent,
its own endpoint), on each asked-for CLA it speaks.  A size that cannot finish within
--budget seconds on the profile's rate, that the CLA cannot carry (dtn7's and ION's UDP
CLAs put one bundle in one datagram), an agent x CLA the agent lacks (or that the harness
does not run: ION's TCPCLv3, topologies.nodes.UDP_ONLY) or an agent not built here is
reported as skipped, with the reason.  Writes results/<time>-bundles/: runs.jsonl, summary.json,
summary.csv, report.md, plot.png.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c2dtn.overlay.agents import agent_class
from c2dtn.topologies.nodes import AGENTS, UDP_ONLY, Nodes
from c2dtn.perf.dtnd_client import result as _result
from c2dtn.perf.dtnd_client import spawn as _client
from c2dtn.topologies import testbed
from c2dtn.topologies.profiles import load_builtin_profiles
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir

console = Console(width=None if sys.stdout.isatty() else 150)
BPA = ["gw1", "r2", "r3", "gw4"]
CLAS = ("tcpcl", "udp", "mtcp")
SIZES = {"1k": 1000, "10k": 10_000, "100k": 100_000, "1M": 1_000_000}
LAN_COUNTS = {"1k": 200, "10k": 100, "100k": 30, "1M": 8}


def cannot_run(agent: str, cla: str) -> str | None:
    """Why `agent` cannot be measured over `cla` here (no such CLA, not run by the harness,
    not built), else None."""
    cls = agent_class(agent)
    if cla not in cls.capabilities.clas:
        return f"{agent} has no {cla} convergence layer (it speaks {', '.join(cls.capabilities.clas)})"
    if agent in UDP_ONLY and cla != "udp":
        return f"{agent} runs over UDP only here (see topologies.nodes.UDP_ONLY)"
    return cls.missing()


def plan_run(cla: str, rate_bps: float | None, size: int, name: str, budget: float,
             agent: str = "dtn7") -> tuple[int, int, str | None]:
    """(bundles for throughput, round trips, reason to skip or None) for one size on one link.
    On a rated link the transfer is sized to about a sixth of the budget (at least 3 bundles),
    so that 10 runs of every size and CLA on a 9.8 kbit/s radio take about an hour, not a day."""
    udp_max = agent_class(agent).capabilities.udp_bundle_max
    if cla == "udp" and udp_max and size > udp_max:
        return 0, 0, f"{agent}'s UDP CLA sends a bundle as one datagram (at most ~{udp_max // 1000} kB)"
    if not rate_bps:
        return LAN_COUNTS[name], 10, None
    one = link_seconds(size, rate_bps)
    rtts = 3
    if 3 * one + rtts * 2 * one > budget:
        return 0, 0, (f"{size} B bundles need ~{one:.0f} s each on {rate_bps / 1000:g} kbit/s; 3 transfers and "
                      f"3 round trips do not fit the {budget:.0f} s budget")
    return min(LAN_COUNTS[name], max(3, int(budget / 6 / one))), rtts, None


def link_seconds(size: int, rate_bps: float | None) -> float:
    """Seconds one bundle of `size` bytes needs on the link (with ~20 % for headers); 0 unrated."""
    return size * 8 * 1.2 / rate_bps if rate_bps else 0.0


def ack_timeouts(size: int, rate_bps: float | None, window: int, count: int) -> tuple[float, float]:
    """(seconds to wait for one round trip, seconds before a data-mode bundle counts as lost):
    15 s of slack plus the link time of what may be queued ahead of it."""
    one = link_seconds(size, rate_bps)
    return 15 + 4 * one, 15 + 2 * (min(window, count) + 1) * one


def one_run(agent: str, cla: str, profile: str, name: str, run: int, window: int, budget: float,
            workdir: Path) -> dict:
    size = SIZES[name]
    rate = load_builtin_profiles().get(profile, "--profiles", "profile").rate_bps
    row = {"agent": agent, "cla": cla, "profile": profile, "size": name, "bytes": size, "run": run}
    skip = cannot_run(agent, cla)
    count, rtt_n, skip = (0, 0, skip) if skip else plan_run(cla, rate, size, name, budget, agent)
    if skip:
        return {**row, "skipped": skip}
    testbed.down()
    st = testbed.up("nps-chain", profile=profile, seed=run)
    nodes = Nodes(st, BPA, [], workdir / f"{agent}-{cla}-{profile}-{name}-{run}", cla=cla, per_link_cla=False,
                  agent=agent)
    conf = {n: ("--config", str(nodes.paths[n])) for n in ("gw1", "gw4")}
    try:
        for n in BPA:
            nodes.start(n, wait=False)
        for n in BPA:
            nodes.wait_ready(n)
        echo = _client("gw4", "echo", "--timeout", str(budget), *conf["gw4"])
        time.sleep(1.0)
        rtt_wait, lost_after = ack_timeouts(size, rate, window, count)
        r = _result(_client("gw1", "rtt", "--dst", "gw4", "--size", str(size), "--count", str(rtt_n),
                            "--timeout", str(rtt_wait), *conf["gw1"]), budget * 2)
        _end(echo)
        sink = _client("gw4", "sink", "--count", str(count), "--timeout", str(budget), "--ack", *conf["gw4"])
        time.sleep(1.0)
        d = _result(_client("gw1", "data", "--dst", "gw4", "--size", str(size), "--count", str(count),
                            "--window", str(window), "--timeout", str(budget), "--ack-timeout", str(lost_after),
                            *conf["gw1"]), budget * 2)
        _end(sink)
    finally:
        nodes.stop_all()
        testbed.down()
    secs = d["end"] - d["start"]
    row.update(count=count, acked=d["acked"], lost=d["lost"], late=d["late"], seconds=secs, rtts=r["rtts"],
               rtts_lost=rtt_n - len(r["rtts"]),
               rtt_s=statistics.median(r["rtts"]) if r["rtts"] else None,
               throughput_bps=d["acked"] * size * 8 / secs if d["acked"] and secs > 0 else 0.0,
               link_bps=rate)
    if d["acked"] < count:
        row["note"] = f"{d['acked']} of {count} acknowledged"
    return row


def _end(p) -> None:
    """End a client that serves until its timeout (echo, sink) before the next one opens the
    same endpoint: SIGTERM first, so that ION's helper it runs detaches from the node."""
    p.terminate()
    try:
        p.wait(5)
    except Exception:
        p.kill()
        p.wait()


def bench(agents, clas, profiles, sizes, runs, window, budget) -> list[dict]:
    rows = []
    total = len(agents) * len(clas) * len(profiles) * len(sizes) * runs
    with tempfile.TemporaryDirectory() as td:
        for profile in profiles:  # one profile at a time: the lan runs are not slowed by anything else
            for agent in agents:
                for cla in clas:
                    for name in sizes:
                        for run in range(1, runs + 1):
                            console.print(f"[dim][{len(rows) + 1}/{total}] {agent} {cla} {profile} {name} "
                                          f"run {run}/{runs}[/dim]")
                            row = one_run(agent, cla, profile, name, run, window, budget, Path(td))
                            if "skipped" in row:
                                console.print(f"[yellow]  skipped: {row['skipped']}[/yellow]")
                                rows.append(row)
                                rows.extend({**row, "run": r} for r in range(run + 1, runs + 1))
                                break
                            console.print(f"[dim]  {row['throughput_bps'] / 1e3:.1f} kbit/s, round trip "
                                          f"{(row['rtt_s'] or 0) * 1000:.0f} ms, {row['lost']} of {row['count']} "
                                          f"bundles lost[/dim]")
                            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    keys = list(dict.fromkeys((r["agent"], r["cla"], r["profile"], r["size"]) for r in rows))
    for k in keys:
        rs = [r for r in rows if (r["agent"], r["cla"], r["profile"], r["size"]) == k]
        s = {"agent": k[0], "cla": k[1], "profile": k[2], "size": k[3], "bytes": rs[0]["bytes"], "runs": len(rs)}
        done = [r for r in rs if "skipped" not in r]
        if not done:
            s["skipped"] = rs[0]["skipped"]
            out.append(s)
            continue
        tp = sorted(r["throughput_bps"] for r in done)
        rt = sorted(r["rtt_s"] for r in done if r["rtt_s"] is not None)
        s.update(throughput_bps=statistics.median(tp), throughput_min=tp[0], throughput_max=tp[-1],
                 rtt_s=statistics.median(rt) if rt else None, rtt_min=rt[0] if rt else None,
                 rtt_max=rt[-1] if rt else None, link_bps=done[0]["link_bps"],
                 sent=sum(r.get("count", 0) for r in done), lost=sum(r.get("lost", 0) for r in done),
                 rtts_lost=sum(r.get("rtts_lost", 0) for r in done))
        out.append(s)
    return out


def _rate(bps) -> str:
    return "-" if bps is None else (f"{bps / 1e6:.2f} Mbit/s" if bps >= 1e6 else f"{bps / 1e3:.2f} kbit/s")


def _lost(s: dict) -> str:
    return f"{s['lost']} of {s['sent']} ({100 * s['lost'] / s['sent']:.1f} %)" if s["sent"] else "-"


def report(rows: list[dict], out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    cols = ("agent", "CLA", "profile", "payload", "throughput median (min-max)", "of link", "round trip median "
            "(min-max)", "runs", "bundles lost", "note")
    t = Table(title="Bundles: dtnperf-style throughput and bping round trip (nps-chain, 4 BPA hops)")
    for c in cols:
        t.add_column(c, justify="right")
    md = ["# Bundle throughput and round trip (nps-chain, 4 BPA hops; fresh network and stores per run)", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in summary:
        if "skipped" in s:
            cells = [s["agent"], s["cla"], s["profile"], s["size"], "skipped", "-", "-", str(s["runs"]), "-",
                     s["skipped"]]
        else:
            frac = f"{s['throughput_bps'] / s['link_bps']:.2f}" if s["link_bps"] else "-"
            rtt = ("-" if s["rtt_s"] is None else
                   f"{s['rtt_s'] * 1000:.0f} ms ({s['rtt_min'] * 1000:.0f}-{s['rtt_max'] * 1000:.0f})")
            cells = [s["agent"], s["cla"], s["profile"], s["size"],
                     f"{_rate(s['throughput_bps'])} ({_rate(s['throughput_min'])}-{_rate(s['throughput_max'])})",
                     frac, rtt, str(s["runs"]), _lost(s),
                     f"{s['rtts_lost']} round trips timed out" if s["rtts_lost"] else ""]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(t)
    (out / "report.md").write_text("\n".join(md) + "\n\n![throughput and round trip](plot.png)\n")
    with open(out / "runs.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        fields = sorted({k for s in summary for k in s})
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(summary)
    plot(summary, out / "plot.png")
    console.print(f"results in {out}")
    return summary


def plot(summary: list[dict], path: Path) -> None:
    plt = pyplot()

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key in dict.fromkeys((s["agent"], s["cla"], s["profile"]) for s in summary):
        ss = [s for s in summary if (s["agent"], s["cla"], s["profile"]) == key and "skipped" not in s]
        if not ss:
            continue
        xs = [s["bytes"] for s in ss]
        label = " ".join(key)
        a1.errorbar(xs, [s["throughput_bps"] / 1e3 for s in ss], capsize=3, marker="o", label=label,
                    yerr=[[(s["throughput_bps"] - s["throughput_min"]) / 1e3 for s in ss],
                          [(s["throughput_max"] - s["throughput_bps"]) / 1e3 for s in ss]])
        rt = [s for s in ss if s["rtt_s"] is not None]
        a2.errorbar([s["bytes"] for s in rt], [s["rtt_s"] * 1000 for s in rt], capsize=3, marker="s", label=label,
                    yerr=[[(s["rtt_s"] - s["rtt_min"]) * 1000 for s in rt],
                          [(s["rtt_max"] - s["rtt_s"]) * 1000 for s in rt]])
    for ax, ylabel, title in ((a1, "throughput (kbit/s)", "Throughput by payload size (median, min-max)"),
                              (a2, "round trip (ms)", "Round trip by payload size (median, min-max)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bundle payload (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(agents, clas, profiles, sizes, runs, window, budget) -> Path:
    out = run_dir("bundles")
    report(bench(agents, clas, profiles, sizes, runs, window, budget), out)
    return out
