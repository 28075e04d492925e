"""MQTT gateway benchmark: messages per second through the gateways next to mosquitto alone.

On `lan` (nps-chain, every link lan): mosquitto on h4; mosquitto_pub on h1 sends
--count messages of 256 bytes (QoS 0 and QoS 1, -M 200 in flight) to h4's broker;
mosquitto_sub on h4 counts them.  "mosquitto alone": plain IP across gw1, r2, r3, gw4.
"c2dtn": the same clients with gw1 intercepting (TPROXY), custody, the overlay over
four dtnd hops, and gw4 publishing at the broker.  Both in the same run, same daemons
and links.  Figures per mode and QoS (medians over --runs):

  publish rate   messages / time until mosquitto_pub has every PUBACK and exits
  delivery rate  messages / time until mosquitto_sub has the last one
  gw1 msgs/core-s  messages / CPU seconds the near gateway process used (the one-core figure;
                 the target is >= 10,000 QoS 1 messages per gw1 CPU-second)

The C clients keep the clients' own cost out of the figures.  Writes
results/<time>-gateway-bench/ with summary.json, summary.csv and plot.png.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.nodes import Nodes

console = Console(width=None if sys.stdout.isatty() else 150)
BPA = ["gw1", "r2", "r3", "gw4"]
PAYLOAD = 256


def _cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def one_run(h4: str, qos: int, count: int, run: int, gw_pid: int | None, timeout: float = 300) -> dict:
    topic = f"c2/bench/{qos}/{run}"
    sub = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            "c2-h4",
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-t",
            topic,
            "-q",
            str(qos),
            "-C",
            str(count),
            "-W",
            str(int(timeout)),
            "-i",
            f"c2bsub{run}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    lines = b"".join(f"{i:08d} ".encode().ljust(PAYLOAD - 1, b".") + b"\n" for i in range(count))
    cpu0 = _cpu_s(gw_pid) if gw_pid else 0.0
    t0 = time.monotonic()
    pub = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            "c2-h1",
            "mosquitto_pub",
            "-h",
            h4,
            "-t",
            topic,
            "-q",
            str(qos),
            "-l",
            "-M",
            "200",
            "-i",
            f"c2bpub{run}",
        ],
        input=lines,
        capture_output=True,
        timeout=timeout,
    )
    t_pub = time.monotonic() - t0
    got = 0
    for _line in sub.stdout:
        got += 1
    sub.wait()
    t_sub = time.monotonic() - t0
    cpu = (_cpu_s(gw_pid) - cpu0) if gw_pid else None
    if pub.returncode:
        raise RuntimeError(f"mosquitto_pub failed ({pub.returncode}): {pub.stderr.decode()[-500:]}")
    return {
        "qos": qos,
        "run": run,
        "count": count,
        "delivered": got,
        "publish_s": t_pub,
        "deliver_s": t_sub,
        "publish_rate": count / t_pub,
        "delivery_rate": got / t_sub,
        "gw1_cpu_s": cpu,
        "gw1_per_core_s": count / cpu if cpu else None,
    }


def bench(count: int, runs: int, qoss: list[int]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as td:
        testbed.down()
        st = testbed.up("nps-chain", profile="lan", seed=3)
        h4 = testbed.node_address(st, "h4")
        broker = start_mosquitto("c2-h4", Path(td) / "broker", "127.0.0.1")
        nodes = None
        try:
            for mode in ("mosquitto alone", "c2dtn"):
                pid = None
                if mode == "c2dtn":
                    prefix = h4.rsplit(".", 1)[0] + ".0/24"
                    rule = '[[gateway.topic]]\nfilter = "c2/#"\npriority = "routine"\n'
                    nodes = Nodes(
                        st,
                        BPA,
                        ["gw1", "gw4"],
                        Path(td) / "nodes",
                        per_link_cla=False,
                        gateways={
                            "gw1": f'[gateway]\ntproxy = true\n\n[[gateway.route]]\nprefix = "{prefix}"\n'
                            f'via = "gw4"\n\n{rule}',
                            "gw4": f"[gateway]\n\n{rule}",
                        },
                    )
                    for n in BPA:
                        nodes.start(n, wait=False)
                    for n in BPA:
                        nodes.wait_ready(n)
                    pid = nodes.procs["gw1"].pid
                for qos in qoss:
                    for r in range(runs):
                        console.print(f"[dim]{mode}: QoS {qos}, run {r + 1}/{runs}, {count} x {PAYLOAD} B[/dim]")
                        row = one_run(h4, qos, count, len(rows), pid)
                        row["mode"] = mode
                        console.print(
                            f"[dim]  publish {row['publish_rate']:.0f}/s, delivered {row['delivered']} "
                            f"at {row['delivery_rate']:.0f}/s[/dim]"
                        )
                        rows.append(row)
        finally:
            if nodes:
                nodes.stop_all()
            broker.terminate()
            broker.wait(10)
            testbed.down()
    return rows


def report(rows: list[dict], out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    for qos in sorted({r["qos"] for r in rows}):
        for mode in ("mosquitto alone", "c2dtn"):
            rs = [r for r in rows if r["qos"] == qos and r["mode"] == mode]
            if not rs:
                continue
            s = {
                "mode": mode,
                "qos": qos,
                "runs": len(rs),
                "count": rs[0]["count"],
                "delivered_min": min(r["delivered"] for r in rs),
            }
            for k in ("publish_rate", "delivery_rate"):
                v = sorted(r[k] for r in rs)
                s[k], s[k + "_min"], s[k + "_max"] = statistics.median(v), v[0], v[-1]
            pc = [r["gw1_per_core_s"] for r in rs if r["gw1_per_core_s"]]
            s["gw1_per_core_s"] = statistics.median(pc) if pc else None
            summary.append(s)
    base = {s["qos"]: s for s in summary if s["mode"] == "mosquitto alone"}
    t = Table(title=f"MQTT through c2dtn gateways vs mosquitto alone (lan, {PAYLOAD} B payloads), medians")
    for c in (
        "QoS",
        "mode",
        "publish msgs/s",
        "delivered msgs/s",
        "ratio to mosquitto",
        "delivered",
        "gw1 msgs per CPU-s (QoS 1 target >= 10,000)",
        "runs",
    ):
        t.add_column(c, justify="right")
    for s in summary:
        b = base.get(s["qos"])
        s["delivery_ratio"] = s["delivery_rate"] / b["delivery_rate"] if b else None
        t.add_row(
            str(s["qos"]),
            s["mode"],
            f"{s['publish_rate']:.0f}",
            f"{s['delivery_rate']:.0f} ({s['delivery_rate_min']:.0f}-{s['delivery_rate_max']:.0f})",
            f"{s['delivery_ratio']:.2f}" if s["delivery_ratio"] else "-",
            f"{s['delivered_min']}/{s['count']}",
            f"{s['gw1_per_core_s']:.0f}" if s["gw1_per_core_s"] else "-",
            str(s["runs"]),
        )
    console.print(t)
    (out / "summary.json").write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    plt = pyplot()

    fig, (ax, ac) = plt.subplots(1, 2, figsize=(12, 4.2))
    qoss = sorted(base)
    width = 0.35
    for i, mode in enumerate(("mosquitto alone", "c2dtn")):
        ss = [next((s for s in summary if s["mode"] == mode and s["qos"] == q), None) for q in qoss]
        ax.bar(
            [q + (i - 0.5) * width for q in qoss],
            [s["delivery_rate"] if s else 0 for s in ss],
            width,
            yerr=[
                [s["delivery_rate"] - s["delivery_rate_min"] if s else 0 for s in ss],
                [s["delivery_rate_max"] - s["delivery_rate"] if s else 0 for s in ss],
            ],
            label=mode,
            capsize=4,
        )
    ax.set_xticks(qoss, [f"QoS {q}" for q in qoss])
    ax.set_ylabel("messages delivered per second")
    ax.set_title(f"Messages/s end to end, {PAYLOAD} B payloads on lan (median, min-max)")
    ax.legend()
    ours = [s for s in summary if s["mode"] == "c2dtn" and s["gw1_per_core_s"]]
    ac.bar([f"QoS {s['qos']}" for s in ours], [s["gw1_per_core_s"] for s in ours], label="gw1 msgs per CPU-s")
    ac.axhline(10_000, color="grey", ls="--", lw=1, label="10,000 (QoS 1 target)")
    ac.set_ylabel("messages per gw1 CPU-second")
    ac.set_title("Messages per CPU-second of the near gateway (median)")
    ac.legend()
    save_figure(fig, out / "plot.png")
    console.print(f"results in {out}")
    return summary


def main(count: int, runs: int, qoss: list[int]) -> None:
    out = run_dir("gateway-bench")
    report(bench(count, runs, qoss), out)
