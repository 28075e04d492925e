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
Outage runs (--outage S, --outage-runs N; on lan, 1 kB bundles): gw1 sends one stamped
bundle a second for 10 s, through an S-second silent cut of r2-r3 and 10 s after it; gw4's
sink takes them for 60 s more.  Per run: bundles delivered (of those sent into the outage),
each one's latency, and how long after the link's return the last one arrived: what the
BPA does with bundles it cannot pass on (holds and retries, or sends them into the void).

Every agent runs through its driver (perf.bare_client --config: the node's own agent,
its own endpoint), on each asked-for CLA it speaks.  A size that cannot finish within
--budget seconds on the profile's rate, that the CLA cannot carry (dtn7's and ION's UDP
CLAs put one bundle in one datagram), an agent x CLA the agent lacks (or that the harness
does not run: ION's TCPCLv3: its driver's testbed_clas) or an agent not built here is
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

from c2dtn.overlay.agents import DEFAULT, agent_class, variants
from c2dtn.perf.bare_client import client_gap
from c2dtn.perf.bare_client import end as _end
from c2dtn.perf.bare_client import result as _result
from c2dtn.perf.bare_client import spawn as _client
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.node_configs import harness_cla, testbed_clas
from c2dtn.topologies.nodes import Nodes
from c2dtn.topologies.profiles import load_builtin_profiles

console = Console(width=None if sys.stdout.isatty() else 150)
BPA = ["gw1", "r2", "r3", "gw4"]
# a CLA with an agent's own custody on top, as the drivers declare them: name -> (the agent, the
# CLA under it, node -> TOML added to its config)
VARIANTS = variants()
CLAS = ("tcpcl", "udp", "mtcp", "ltp", *VARIANTS)
SIZES = {"1k": 1000, "10k": 10_000, "100k": 100_000, "1M": 1_000_000}
LAN_COUNTS = {"1k": 200, "10k": 100, "100k": 30, "1M": 8}


def pairs(agents: list[str], clas: list[str]) -> list[tuple[str, str]]:
    """(agent, cla) to measure: every agent on every plain CLA named, and an `agent:cla` item
    for that agent only (`--cla tcpcl,ion:udp`: each agent on the CLA seed 002 would use)."""
    out = []
    for a in agents:
        for c in clas:
            who, _, cla = c.rpartition(":")
            if who in ("", a) and (a, cla) not in out:
                out.append((a, cla))
    return out


def cannot_run(agent: str, cla: str) -> str | None:
    """Why `agent` cannot be measured over `cla` here (no such CLA, not run by the harness,
    not built), else None."""
    if cla in VARIANTS:
        kind = VARIANTS[cla][0]
        if agent != kind:
            return f"{agent} has no {cla}: it is {kind}'s own (its driver's testbed_variants)"
        cla = VARIANTS[cla][1]
    cls = agent_class(agent)
    if cla not in cls.capabilities.clas:
        return f"{agent} has no {cla} convergence layer (it speaks {', '.join(cls.capabilities.clas)})"
    if harness_cla(agent, cla) != cla:
        return f"{agent} runs over {' or '.join(testbed_clas(agent))} only here (its driver's testbed_clas)"
    return cls.missing()


def too_big(agent: str, cla: str, size: int) -> str | None:
    """Why a `size`-byte bundle cannot go over `agent`'s `cla` (one datagram per bundle), else None."""
    udp_max = agent_class(agent).capabilities.udp_bundle_max
    if cla.startswith("udp") and udp_max and size > udp_max:
        return f"{agent}'s UDP CLA sends a bundle as one datagram (at most ~{udp_max // 1000} kB)"
    return None


def plan_run(
    cla: str, rate_bps: float | None, size: int, name: str, budget: float, agent: str = DEFAULT
) -> tuple[int, int, str | None]:
    """(bundles for throughput, round trips, reason to skip or None) for one size on one link.
    On a rated link the transfer is sized to about a sixth of the budget (at least 3 bundles),
    so that 10 runs of every size and CLA on a 9.8 kbit/s radio take about an hour, not a day."""
    big = too_big(agent, cla, size)
    if big:
        return 0, 0, big
    if not rate_bps:
        return LAN_COUNTS[name], 10, None
    one = link_seconds(size, rate_bps)
    rtts = 3
    if 3 * one + rtts * 2 * one > budget:
        return (
            0,
            0,
            (
                f"{size} B bundles need ~{one:.0f} s each on {rate_bps / 1000:g} kbit/s; 3 transfers and "
                f"3 round trips do not fit the {budget:.0f} s budget"
            ),
        )
    return min(LAN_COUNTS[name], max(3, int(budget / 6 / one))), rtts, None


def link_seconds(size: int, rate_bps: float | None) -> float:
    """Seconds one bundle of `size` bytes needs on the link (with ~20 % for headers); 0 unrated."""
    return size * 8 * 1.2 / rate_bps if rate_bps else 0.0


def ack_timeouts(size: int, rate_bps: float | None, window: int, count: int) -> tuple[float, float]:
    """(seconds to wait for one round trip, seconds before a data-mode bundle counts as lost):
    15 s of slack plus the link time of what may be queued ahead of it."""
    one = link_seconds(size, rate_bps)
    return 15 + 4 * one, 15 + 2 * (min(window, count) + 1) * one


def _chain(agent: str, cla: str, profile: str, run: int, workdir: Path) -> tuple[Nodes, dict]:
    """nps-chain afresh, `agent` on every BPA node over `cla`, all ready; and the --config
    arguments of the clients on gw1 and gw4.  The caller stops the nodes and the testbed."""
    testbed.down()
    st = testbed.up("nps-chain", profile=profile, seed=run)
    cla, options = VARIANTS[cla][1:] if cla in VARIANTS else (cla, {})
    nodes = Nodes(st, BPA, [], workdir, cla=cla, per_link_cla=False, agent=agent, options=options)
    nodes.start_all(BPA)
    return nodes, {n: ("--config", str(nodes.paths[n])) for n in ("gw1", "gw4")}


def one_run(agent: str, cla: str, profile: str, name: str, run: int, window: int, budget: float, workdir: Path) -> dict:
    size = SIZES[name]
    rate = load_builtin_profiles().get(profile, "--profiles", "profile").rate_bps
    row = {"agent": agent, "cla": cla, "profile": profile, "size": name, "bytes": size, "run": run}
    skip = cannot_run(agent, cla)
    count, rtt_n, skip = (0, 0, skip) if skip else plan_run(cla, rate, size, name, budget, agent)
    if skip:
        return {**row, "skipped": skip}
    nodes, conf = _chain(agent, cla, profile, run, workdir / f"{agent}-{cla}-{profile}-{name}-{run}")
    try:
        echo = _client("gw4", "echo", "--timeout", str(budget), *conf["gw4"])
        time.sleep(1.0)
        rtt_wait, lost_after = ack_timeouts(size, rate, window, count)
        r = _result(
            _client(
                "gw1",
                "rtt",
                "--dst",
                "gw4",
                "--size",
                str(size),
                "--count",
                str(rtt_n),
                "--timeout",
                str(rtt_wait),
                *conf["gw1"],
            ),
            budget * 2,
        )
        _end(echo, client_gap(agent))
        sink = _client("gw4", "sink", "--count", str(count), "--timeout", str(budget), "--ack", *conf["gw4"])
        time.sleep(1.0)
        d = _result(
            _client(
                "gw1",
                "data",
                "--dst",
                "gw4",
                "--size",
                str(size),
                "--count",
                str(count),
                "--window",
                str(window),
                "--timeout",
                str(budget),
                "--ack-timeout",
                str(lost_after),
                *conf["gw1"],
            ),
            budget * 2,
        )
        _end(sink)
    finally:
        nodes.stop_all()
        testbed.down()
    secs = d["end"] - d["start"]
    row.update(
        count=count,
        acked=d["acked"],
        lost=d["lost"],
        late=d["late"],
        seconds=secs,
        rtts=r["rtts"],
        rtts_lost=rtt_n - len(r["rtts"]),
        rtt_s=statistics.median(r["rtts"]) if r["rtts"] else None,
        throughput_bps=d["acked"] * size * 8 / secs if d["acked"] and secs > 0 else 0.0,
        link_bps=rate,
    )
    if d["acked"] < count:
        row["note"] = f"{d['acked']} of {count} acknowledged"
    return row


OUTAGE_AT = 10.0  # seconds of the paced stream before the cut
OUTAGE_TAIL = 10.0  # ... and after the link's return
OUTAGE_DRAIN = 60.0  # the sink waits this long after the last send
OUTAGE_BYTES = 1000


def outage_run(agent: str, cla: str, run: int, outage_s: float, workdir: Path) -> dict:
    """One paced stream through a cut of the radio hop (see the module's docstring)."""
    row = {
        "agent": agent,
        "cla": cla,
        "profile": f"lan, {outage_s:g} s outage",
        "mode": "outage",
        "size": "1k",
        "bytes": OUTAGE_BYTES,
        "run": run,
        "outage_s": outage_s,
    }
    skip = cannot_run(agent, cla)
    if skip:
        return {**row, "skipped": skip}
    count = int(OUTAGE_AT + outage_s + OUTAGE_TAIL)  # one a second
    nodes, conf = _chain(agent, cla, "lan", run, workdir / f"{agent}-{cla}-outage-{run}")
    try:
        sink = _client(
            "gw4", "sink", "--count", str(count), "--timeout", str(count + OUTAGE_DRAIN + 5), "--stamps", *conf["gw4"]
        )
        time.sleep(1.0)
        src = _client(
            "gw1",
            "source",
            "--dst",
            "gw4",
            "--size",
            str(OUTAGE_BYTES),
            "--count",
            str(count),
            "--interval",
            "1",
            *conf["gw1"],
        )
        time.sleep(OUTAGE_AT + 0.5)  # the client's start takes about half a second
        down_at = time.monotonic()
        testbed.change_link("r2", "r3", "down")
        console.print(f"[dim]  r2-r3 down for {outage_s:g} s[/dim]")
        time.sleep(outage_s)
        testbed.change_link("r2", "r3", "up")
        up_at = time.monotonic()
        s = _result(src, count + 60)
        k = _result(sink, count + OUTAGE_DRAIN + 60)
    finally:
        nodes.stop_all()
        testbed.down()
    return {**row, **outage_figures(k.get("stamps", []), s["sent"], s.get("refused", 0), down_at, up_at)}


def outage_figures(stamps: list[list[float]], sent: int, refused: int, down_at: float, up_at: float) -> dict:
    """From the sink's [number, sent, received] list: what arrived, of what went into the cut,
    latencies, and the last arrival of those after the link's return (seconds)."""
    lat = [r - s for _, s, r in stamps]
    into = [x for x in stamps if down_at <= x[1] < up_at]
    n_into = max(0, round(up_at - down_at))  # one a second went into the cut
    return {
        "sent": sent,
        "refused": refused,
        "delivered": len(stamps),
        "lost": sent - len(stamps),
        "into_outage": n_into,
        "into_outage_delivered": len(into),
        "latency_s": statistics.median(lat) if lat else None,
        "latency_max_s": max(lat) if lat else None,
        "cleared_after_up_s": (max(r for _, _, r in into) - up_at) if into else None,
        "stamps": [[round(s - down_at, 3), round(r - s, 3)] for _, s, r in stamps],
    }


class _Rows(list):
    """The runs so far, each also appended to `path` as it ends (a stopped campaign keeps them)."""

    def __init__(self, path: Path | None):
        super().__init__()
        self.path = path

    def append(self, row: dict) -> None:
        super().append(row)
        if self.path:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(row) + "\n")

    def extend(self, rows) -> None:
        for r in rows:
            self.append(r)


def bench(
    agents,
    clas,
    profiles,
    sizes,
    runs,
    window,
    budget,
    outage_s: float = 0,
    outage_runs: int = 0,
    log: Path | None = None,
) -> list[dict]:
    rows = _Rows(log)
    total = len(pairs(agents, clas)) * (len(profiles) * len(sizes) * runs + (outage_runs if outage_s else 0))
    with tempfile.TemporaryDirectory() as td:
        for profile in profiles:  # one profile at a time: the lan runs are not slowed by anything else
            for agent, cla in pairs(agents, clas):
                for name in sizes:
                    for run in range(1, runs + 1):
                        console.print(
                            f"[dim][{len(rows) + 1}/{total}] {agent} {cla} {profile} {name} run {run}/{runs}[/dim]"
                        )
                        row = one_run(agent, cla, profile, name, run, window, budget, Path(td))
                        if "skipped" in row:
                            console.print(f"[yellow]  skipped: {row['skipped']}[/yellow]")
                            rows.append(row)
                            rows.extend({**row, "run": r} for r in range(run + 1, runs + 1))
                            break
                        console.print(
                            f"[dim]  {row['throughput_bps'] / 1e3:.1f} kbit/s, round trip "
                            f"{(row['rtt_s'] or 0) * 1000:.0f} ms, {row['lost']} of {row['count']} "
                            f"bundles lost[/dim]"
                        )
                        rows.append(row)
        for agent, cla in pairs(agents, clas) if outage_s else ():
            for run in range(1, outage_runs + 1):
                console.print(
                    f"[dim][{len(rows) + 1}/{total}] {agent} {cla} lan, {outage_s:g} s outage "
                    f"run {run}/{outage_runs}[/dim]"
                )
                row = outage_run(agent, cla, run, outage_s, Path(td))
                rows.append(row)
                if "skipped" in row:
                    console.print(f"[yellow]  skipped: {row['skipped']}[/yellow]")
                    rows.extend({**row, "run": r} for r in range(run + 1, outage_runs + 1))
                    break
                console.print(
                    f"[dim]  {row['delivered']} of {row['sent']} delivered, "
                    f"{row['into_outage_delivered']} of {row['into_outage']} sent into the outage; "
                    f"latency median {row['latency_s'] or 0:.1f} s, max {row['latency_max_s'] or 0:.1f} s"
                    f"[/dim]"
                )
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    rows = [r for r in rows if r.get("mode") != "outage"]
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
        s.update(
            throughput_bps=statistics.median(tp),
            throughput_min=tp[0],
            throughput_max=tp[-1],
            rtt_s=statistics.median(rt) if rt else None,
            rtt_min=rt[0] if rt else None,
            rtt_max=rt[-1] if rt else None,
            link_bps=done[0]["link_bps"],
            sent=sum(r.get("count", 0) for r in done),
            lost=sum(r.get("lost", 0) for r in done),
            rtts_lost=sum(r.get("rtts_lost", 0) for r in done),
        )
        out.append(s)
    return out


def _rate(bps) -> str:
    return "-" if bps is None else (f"{bps / 1e6:.2f} Mbit/s" if bps >= 1e6 else f"{bps / 1e3:.2f} kbit/s")


def _lost(s: dict) -> str:
    return f"{s['lost']} of {s['sent']} ({100 * s['lost'] / s['sent']:.1f} %)" if s["sent"] else "-"


def published(summary: list[dict]) -> list[list[str]]:
    """Rows (agent, figure, source, published, ours on lan) for what the drivers say source
    papers measured of the agents measured here on lan (BundleAgent.published)."""
    lan = [s for s in summary if s["profile"] == "lan" and "skipped" not in s]
    out = []
    for agent in dict.fromkeys(s["agent"] for s in lan):
        for p in agent_class(agent).published:
            mine = [s for s in lan if s["agent"] == agent]
            if p.figure == "round trip":
                rt = [s["rtt_s"] * 1000 for s in mine if s["rtt_s"] is not None and s["bytes"] <= 10_000]
                if rt:
                    ours = f"{min(rt):.0f}-{max(rt):.0f} ms (1k and 10k, medians of CLAs and sizes)"
                    out.append([agent, "round trip, small bundles", p.source, p.text, ours])
            else:
                one_m = [s for s in mine if s["size"] == "1M"]
                why = too_big(agent, harness_cla(agent, "tcpcl"), SIZES["1M"]) or "no 1 MB run"
                ours = ", ".join(f"{_rate(s['throughput_bps'])} over {s['cla']}" for s in one_m)
                out.append([agent, p.figure, p.source, p.text, ours or f"not measured: {why}"])
    return out


def summarize_outage(rows: list[dict]) -> list[dict]:
    out = []
    rows = [r for r in rows if r.get("mode") == "outage"]
    for k in dict.fromkeys((r["agent"], r["cla"], r["profile"]) for r in rows):
        rs = [r for r in rows if (r["agent"], r["cla"], r["profile"]) == k]
        s = {"agent": k[0], "cla": k[1], "profile": k[2], "runs": len(rs)}
        done = [r for r in rs if "skipped" not in r]
        if not done:
            out.append({**s, "skipped": rs[0]["skipped"]})
            continue
        lat = [r["latency_s"] for r in done if r["latency_s"] is not None]
        clear = [r["cleared_after_up_s"] for r in done if r["cleared_after_up_s"] is not None]
        s.update(
            sent=sum(r["sent"] for r in done),
            delivered=sum(r["delivered"] for r in done),
            into_outage=sum(r["into_outage"] for r in done),
            into_outage_delivered=sum(r["into_outage_delivered"] for r in done),
            latency_s=statistics.median(lat) if lat else None,
            latency_max_s=max((r["latency_max_s"] for r in done if r["latency_max_s"] is not None), default=None),
            cleared_after_up_s=statistics.median(clear) if clear else None,
        )
        out.append(s)
    return out


def _secs(v) -> str:
    return "-" if v is None else f"{v:.1f} s"


def report(rows: list[dict], out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    cols = (
        "agent",
        "CLA",
        "profile",
        "payload",
        "throughput median (min-max)",
        "of link",
        "round trip median (min-max)",
        "runs",
        "bundles lost",
        "note",
    )
    t = Table(title="Bundles: dtnperf-style throughput and bping round trip (nps-chain, 4 BPA hops)")
    for c in cols:
        t.add_column(c, justify="right")
    md = [
        "# Bundle throughput and round trip (nps-chain, 4 BPA hops; fresh network and stores per run)",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for s in summary:
        if "skipped" in s:
            cells = [
                s["agent"],
                s["cla"],
                s["profile"],
                s["size"],
                "skipped",
                "-",
                "-",
                str(s["runs"]),
                "-",
                s["skipped"],
            ]
        else:
            frac = f"{s['throughput_bps'] / s['link_bps']:.2f}" if s["link_bps"] else "-"
            rtt = (
                "-"
                if s["rtt_s"] is None
                else f"{s['rtt_s'] * 1000:.0f} ms ({s['rtt_min'] * 1000:.0f}-{s['rtt_max'] * 1000:.0f})"
            )
            cells = [
                s["agent"],
                s["cla"],
                s["profile"],
                s["size"],
                f"{_rate(s['throughput_bps'])} ({_rate(s['throughput_min'])}-{_rate(s['throughput_max'])})",
                frac,
                rtt,
                str(s["runs"]),
                _lost(s),
                f"{s['rtts_lost']} round trips timed out" if s["rtts_lost"] else "",
            ]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(t)
    md += ["", "![throughput and round trip](plot.png)", ""]
    seed = published(summary)
    if seed:
        settings = {(p.source, p.setting) for a in dict.fromkeys(r[0] for r in seed) for p in agent_class(a).published}
        md += [
            "## Published figures beside these runs",
            "",
            "Each as its source measured it: "
            + "; ".join(f"{src}: {how}" for src, how in sorted(settings))
            + ". These runs use disk stores and 4 BPA hops.",
            "",
            "| agent | figure | source | published | here (lan) |",
            "|---|---|---|---|---|",
        ]
        md += ["| " + " | ".join(r) + " |" for r in seed] + [""]
    outage = summarize_outage(rows)
    if outage:
        cols = (
            "agent",
            "CLA",
            "profile",
            "runs",
            "delivered",
            "of those sent into the outage",
            "latency median",
            "latency max",
            "last of the outage's after the link's return",
        )
        t = Table(title="Bundles sent into an outage of the radio hop (1 kB, one a second)")
        for c in cols:
            t.add_column(c, justify="right")
        md += [
            "## Bundles sent into an outage (1 kB, one a second, the radio hop r2-r3 silently cut)",
            "",
            "| " + " | ".join(cols) + " |",
            "|" + "---|" * len(cols),
        ]
        for s in outage:
            cells = (
                [s["agent"], s["cla"], s["profile"], str(s["runs"]), "skipped: " + s["skipped"], "-", "-", "-", "-"]
                if "skipped" in s
                else [
                    s["agent"],
                    s["cla"],
                    s["profile"],
                    str(s["runs"]),
                    f"{s['delivered']} of {s['sent']}",
                    f"{s['into_outage_delivered']} of {s['into_outage']}",
                    _secs(s["latency_s"]),
                    _secs(s["latency_max_s"]),
                    _secs(s["cleared_after_up_s"]),
                ]
            )
            t.add_row(*cells)
            md.append("| " + " | ".join(cells) + " |")
        console.print(t)
        md += ["", "![latency of each bundle by when it was sent](outage.png)", ""]
        (out / "outage-summary.json").write_text(json.dumps(outage, indent=1))
        plot_outage([r for r in rows if r.get("mode") == "outage"], out / "outage.png")
    (out / "report.md").write_text("\n".join(md) + "\n")
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
        a1.errorbar(
            xs,
            [s["throughput_bps"] / 1e3 for s in ss],
            capsize=3,
            marker="o",
            label=label,
            yerr=[
                [(s["throughput_bps"] - s["throughput_min"]) / 1e3 for s in ss],
                [(s["throughput_max"] - s["throughput_bps"]) / 1e3 for s in ss],
            ],
        )
        rt = [s for s in ss if s["rtt_s"] is not None]
        a2.errorbar(
            [s["bytes"] for s in rt],
            [s["rtt_s"] * 1000 for s in rt],
            capsize=3,
            marker="s",
            label=label,
            yerr=[[(s["rtt_s"] - s["rtt_min"]) * 1000 for s in rt], [(s["rtt_max"] - s["rtt_s"]) * 1000 for s in rt]],
        )
    agents = dict.fromkeys(s["agent"] for s in summary if s["profile"] == "lan")
    for agent in agents:  # what source papers give for an agent measured here
        for p in agent_class(agent).published:
            label = f"{p.source}: {agent} {p.figure} {p.text}"
            if p.figure == "round trip":
                a2.axhspan(p.low, p.high, alpha=0.15)  # the range it gives, its middle labelled
                a2.axhline((p.low + p.high) / 2, linestyle=":", linewidth=1, label=label)
            else:
                a1.plot([1e6], [p.low / 1e3], marker="*", markersize=12, linestyle="none", label=label)
    for ax, ylabel, title in (
        (a1, "throughput (kbit/s)", "Throughput by payload size (median, min-max)"),
        (a2, "round trip (ms)", "Round trip by payload size (median, min-max)"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bundle payload (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_outage(rows: list[dict], path: Path) -> None:
    """Each delivered bundle's latency against when it was sent (0: the cut), every run."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    outage_s = max((r["outage_s"] for r in rows), default=60)
    ax.axvspan(0, outage_s, color="0.85", label=f"radio hop down ({outage_s:g} s)")
    markers = iter("osD^v<>ph*")
    for key in dict.fromkeys((r["agent"], r["cla"]) for r in rows):
        pts = [p for r in rows if (r["agent"], r["cla"]) == key and "skipped" not in r for p in r["stamps"]]
        if pts:
            ax.scatter(
                [p[0] for p in pts], [p[1] for p in pts], s=12, marker=next(markers, "o"), label=f"{key[0]} {key[1]}"
            )
    ax.set_yscale("log")
    ax.set_xlabel("sent at (s, relative to the cut)")
    ax.set_ylabel("latency (s)")
    ax.set_title("Latency of bundles by when they were sent (lost ones are absent)")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main(agents, clas, profiles, sizes, runs, window, budget, outage_s: float = 0, outage_runs: int = 0) -> Path:
    out = run_dir("bundles")
    out.mkdir(parents=True, exist_ok=True)
    report(
        bench(agents, clas, profiles, sizes, runs, window, budget, outage_s, outage_runs, out / "runs-so-far.jsonl"),
        out,
    )
    (out / "runs-so-far.jsonl").unlink(missing_ok=True)  # report() wrote runs.jsonl
    return out
