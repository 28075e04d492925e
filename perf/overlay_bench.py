"""Overlay benchmark: the overlay next to bare dtnd, same daemons, same run.

On `lan` (nps-chain, dtnd on gw1, r2, r3, gw4, the overlay on gw1 and gw4):
round trip (bping style: the far end answers) and throughput (a stream of
bundles or envelopes, first sent to last received) for payloads of 1 kB,
10 kB, 100 kB and 1 MB, overlay / bare ratios printed side by side (targets of
issue 14: throughput >= 0.9 x bare, round trip <= 1.3 x bare).  On `cnr-tactical-2`:
goodput of a bulk transfer as a fraction of the 9.8 kbit/s link (target >= 0.75).

Writes results/<time>-overlay-bench/ with summary.json, summary.csv and plot.png.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c2dtn.topologies.nodes import Nodes
from c2dtn.perf.dtnd_client import answer as _answer
from c2dtn.perf.dtnd_client import result as _result
from c2dtn.perf.dtnd_client import spawn as _client
from c2dtn.topologies import testbed
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir

console = Console(width=None if sys.stdout.isatty() else 140)
BPA = ["gw1", "r2", "r3", "gw4"]
SIZES = {"1k": 1000, "10k": 10_000, "100k": 100_000, "1M": 1_000_000}
# envelopes (and bundles) per throughput run: about 3 s of transfer each, so that a stall of
# a few hundred milliseconds on a shared machine does not decide a run (at 40 x 100 kB, runs
# of 1.5 s, the same code measured 0.57 to 1.14 of bare)
COUNTS = {"1k": 800, "10k": 400, "100k": 100, "1M": 24}


def rtt_pairs(nodes: Nodes, size: int, count: int) -> tuple[list[float], list[float]]:
    """(bare, overlay) round trips, `count` of each, taking turns: one bare dtnd ping
    (perf.dtnd_client rtt --stepped, answered by an echo client on gw4), then one
    through the overlay, and so on, so that both see the same moments of a noisy
    machine (run one after the other, the bare figures of two runs differed by 20 %)."""
    echo = _client("gw4", "echo", "--timeout", str(60 + count * 10))
    pinger = _client("gw1", "rtt", "--dst", "gw4", "--size", str(size), "--timeout", "30", "--stepped", stdin=True)
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


def bare_throughput(size: int, count: int) -> float:
    sink = _client("gw4", "sink", "--count", str(count), "--timeout", "300")
    time.sleep(1.0)
    src = _result(_client("gw1", "source", "--dst", "gw4", "--size", str(size), "--count", str(count)), 600)
    snk = _result(sink, 600)
    if snk["received"] < count or not snk["last"]:
        raise RuntimeError(f"bare dtnd: {snk['received']} of {count} bundles arrived")
    return snk["bytes"] * 8 / (snk["last"] - src["start"])


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


SCHEDULER: dict[str, int] = {}  # --scheduler settings for the overlay nodes of this invocation


def _nodes(profile: str, workdir: Path, seed: int = 5, cla: str = "tcpcl", per_link_cla: bool = True,
           radio_cla: str | None = None) -> Nodes:
    testbed.down()
    st = testbed.up("nps-chain", profile=profile, seed=seed)
    if radio_cla:
        st["links"]["r2-r3"]["cla"] = radio_cla  # the BPAs' CLA across the radio link, for this run
    nodes = Nodes(st, BPA, ["gw1", "gw4"], workdir, cla=cla, per_link_cla=per_link_cla, scheduler=SCHEDULER)
    for n in BPA:
        nodes.start(n, wait=False)
    for n in BPA:
        nodes.wait_ready(n)
    return nodes


def lan(sizes: list[str], runs: int, rtt_count: int = 40) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as td:
        # on a LAN every hop speaks TCPCL (a megabyte bundle fits no UDP datagram)
        nodes = _nodes("lan", Path(td), cla="tcpcl", per_link_cla=False)
        try:
            for name in sizes:
                size, count = SIZES[name], COUNTS[name]
                for r in range(runs):
                    console.print(f"[dim]lan {name}: run {r + 1}/{runs}[/dim]")
                    row = {"size": name, "bytes": size, "run": r + 1}
                    bare, over = rtt_pairs(nodes, size, rtt_count)
                    row["bare_rtt_s"], row["overlay_rtt_s"] = statistics.median(bare), statistics.median(over)
                    row["bare_rtts"], row["overlay_rtts"] = bare, over
                    row["bare_bps"] = bare_throughput(size, count)
                    row["overlay_bps"], _ = overlay_throughput(nodes, size, count)
                    rows.append(row)
        finally:
            nodes.stop_all()
            testbed.down()
    return rows


def tactical(profile: str = "cnr-tactical-2", total_bytes: int = 60_000, body: int = 1000,
             cla: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as td:
        # the radio link (r2-r3) carries what the topology says (nps-chain: UDP) unless --cla
        # names another; the LAN hops keep TCPCL
        nodes = _nodes(profile, Path(td), cla="tcpcl", radio_cla=cla)
        try:
            count = total_bytes // body
            console.print(f"[dim]{profile}: bulk transfer of {count} x {body} B incompressible envelopes[/dim]")
            bps, secs = overlay_throughput(nodes, body, count, timeout=1800)
            link = testbed.read_state()["links"]["r2-r3"]
            st = testbed.status()["links"]["r2-r3"]["live"]
        finally:
            nodes.stop_all()
            testbed.down()
    rate = link["profile_ab"]["rate_bps"]
    return {"profile": profile, "cla": cla or link.get("cla") or "tcpcl", "payload_bytes": count * body, "seconds": secs, "goodput_bps": bps,
            "link_bps": rate, "fraction": bps / rate, "link_frames_ab": st["ab"]["delivered"],
            "link_bytes_ab": st["ab"]["delivered_bytes"]}


def report(rows: list[dict], tac: dict | None, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t = Table(title="overlay vs bare dtnd on lan (nps-chain, 4 dtnd hops): medians over runs, ratios per run "
                    "(round trips: bare and overlay pings taking turns)")
    for c in ("payload", "bare throughput", "overlay throughput", "ratio (>= 0.9)", "min-max", "bare RTT",
              "overlay RTT", "ratio (<= 1.3)", "min-max", "runs"):
        t.add_column(c, justify="right")
    summary = []
    for name in dict.fromkeys(r["size"] for r in rows):
        rs = [r for r in rows if r["size"] == name]
        med = {k: statistics.median(r[k] for r in rs) for k in ("bare_bps", "overlay_bps", "bare_rtt_s", "overlay_rtt_s")}
        trs = sorted(r["overlay_bps"] / r["bare_bps"] for r in rs)
        rrs = sorted(r["overlay_rtt_s"] / r["bare_rtt_s"] for r in rs)
        tr, rr = statistics.median(trs), statistics.median(rrs)
        summary.append({"size": name, **med, "throughput_ratio": tr, "rtt_ratio": rr, "runs": len(rs),
                        "throughput_ratio_min": trs[0], "throughput_ratio_max": trs[-1],
                        "rtt_ratio_min": rrs[0], "rtt_ratio_max": rrs[-1]})
        t.add_row(name, f"{med['bare_bps'] / 1e6:.2f} Mbit/s", f"{med['overlay_bps'] / 1e6:.2f} Mbit/s",
                  f"{tr:.2f}", f"{trs[0]:.2f}-{trs[-1]:.2f}", f"{med['bare_rtt_s'] * 1000:.1f} ms",
                  f"{med['overlay_rtt_s'] * 1000:.1f} ms", f"{rr:.2f}", f"{rrs[0]:.2f}-{rrs[-1]:.2f}", str(len(rs)))
    if rows:
        console.print(t)
    if tac:
        g = Table(title=f"bulk goodput on {tac['profile']} over {tac['cla']}")
        for c in ("payload", "time (median)", "goodput (median)", "link rate", "fraction (>= 0.75)", "min", "max",
                  "runs"):
            g.add_column(c, justify="right")
        g.add_row(f"{tac['payload_bytes']} B", f"{tac['seconds']:.0f} s", f"{tac['goodput_bps'] / 1e3:.2f} kbit/s",
                  f"{tac['link_bps'] / 1e3:.1f} kbit/s", f"{tac['fraction']:.2f}", f"{tac.get('fraction_min', 0):.2f}",
                  f"{tac.get('fraction_max', 0):.2f}", str(tac.get("runs", 1)))
        console.print(g)
    (out / "summary.json").write_text(json.dumps({"lan_runs": rows, "lan": summary, "tactical": tac,
                                                  "scheduler": SCHEDULER}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        cols = ["size", "bare_bps", "overlay_bps", "throughput_ratio", "throughput_ratio_min", "throughput_ratio_max",
                "bare_rtt_s", "overlay_rtt_s", "rtt_ratio", "rtt_ratio_min", "rtt_ratio_max", "runs"]
        w.writerow(cols)
        for s in summary:
            w.writerow([s[c] for c in cols])
    if summary:
        plt = pyplot()

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        xs = [s["size"] for s in summary]
        a1.plot(xs, [s["bare_bps"] / 1e6 for s in summary], "o-", label="bare dtnd")
        a1.plot(xs, [s["overlay_bps"] / 1e6 for s in summary], "s-", label="c2dtn overlay")
        a1.set_yscale("log")
        a1.set_xlabel("payload")
        a1.set_ylabel("throughput (Mbit/s)")
        a1.set_title("Throughput by payload size (lan, 4 hops)")
        a1.legend()
        a2.plot(xs, [s["bare_rtt_s"] * 1000 for s in summary], "o-", label="bare dtnd")
        a2.plot(xs, [s["overlay_rtt_s"] * 1000 for s in summary], "s-", label="c2dtn overlay")
        a2.set_yscale("log")
        a2.set_xlabel("payload")
        a2.set_ylabel("round trip (ms)")
        a2.set_title("Round trip by payload size (lan, 4 hops)")
        a2.legend()
        save_figure(fig, out / "plot.png")
    console.print(f"results in {out}")


def main(sizes: list[str], runs: int, tactical_bytes: int, skip_lan: bool = False, skip_tactical: bool = False,
         cla: str | None = None, scheduler: dict[str, int] | None = None) -> None:
    out = run_dir("overlay-bench")
    SCHEDULER.clear()
    SCHEDULER.update(scheduler or {})
    rows = [] if skip_lan else lan(sizes, runs)
    tac = None
    if not skip_tactical:
        tacs = [tactical(total_bytes=tactical_bytes, cla=cla) for _ in range(runs)]
        tac = dict(tacs[0])
        fr = sorted(t["fraction"] for t in tacs)
        tac.update(fraction=statistics.median(fr), fraction_min=fr[0], fraction_max=fr[-1], runs=len(tacs),
                   goodput_bps=statistics.median(t["goodput_bps"] for t in tacs),
                   seconds=statistics.median(t["seconds"] for t in tacs), all_runs=tacs)
    report(rows, tac, out)
