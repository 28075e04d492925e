"""The blue-force-tracking job (seed 000): position reports across a cut radio link,
through c2dtn gateways next to plain MQTT (a Mosquitto bridge) on the same emulated
link, measured in the same run.  `make demo` runs it on its defaults:

  nps-chain, radio hop r2-r3 on cnr-tactical-2 (9.8 kbit/s, 100 ms, 10 % loss);
  8 units on h1, each publishing a GeoJSON report (QoS 1) every 2 s for 100 s;
  the broker (mosquitto) on h4, with a subscriber to every unit's location;
  the radio link down from t=20 s to t=80 s; then up to 60 s for the backlog.

Modes, one after the other on a fresh testbed each:
  overlay      the units publish to h4's broker; gw1 intercepts (TPROXY), holds each
               report in custody and sends it over the overlay; gw4 publishes it at the
               broker.  Position reports supersede per unit (topic) while queued.
  mqtt-bridge  the units publish to a mosquitto on h1, bridged to h4's broker (QoS 1,
               persistent bridge session), the bridge's TCP connection across the link.

Reported per mode: sent, delivered, superseded (overlay only: not delivered, but a newer
report of the same unit was: supersession replaced it on the way), lost (neither), delay
(receipt time - the report's own timestamp) min / median / p95 / max, and how old each
unit's newest position delivered by the end of the run is, against the last report sent.  Every figure
comes from events.jsonl (one line per report sent and per report received).
Writes results/<time>-bft/: events.jsonl, summary.json, summary.csv, report.md, plot.png.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ip_gateway.broker import start_mosquitto
from overlay.testbed_nodes import Nodes
from topologies import testbed

console = Console(width=None if sys.stdout.isatty() else 150)
BPA = ["gw1", "r2", "r3", "gw4"]
MODES = ("overlay", "mqtt-bridge")
REPORT_FILTER = "/+/+/+/location"


@dataclass
class Plan:
    profile: str = "cnr-tactical-2"
    units: int = 8
    period: float = 2.0
    duration: float = 100.0
    outage: tuple[float, float] | None = (20.0, 80.0)
    drain: float = 60.0
    qos: int = 1
    seed: int = 7


def _reader(p: subprocess.Popen, sink: list, mode: str, role: str) -> threading.Thread:
    def run():
        for line in p.stdout:
            if line.startswith("{"):
                ev = json.loads(line)
                ev.update(mode=mode, role=role)
                sink.append(ev)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _client(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "perf.mqtt_clients", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _gateway_tables(h4: str) -> dict[str, str]:
    rule = (f'[[gateway.topic]]\nfilter = "{REPORT_FILTER}"\npriority = "priority"\nlifetime = 600\n'
            'supersede = "topic"\n')
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    return {"gw1": f'[gateway]\ntproxy = true\n\n[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n\n{rule}',
            "gw4": f"[gateway]\n\n{rule}"}


def _bridge_conf(h4: str, qos: int) -> str:
    # the bridge as seed 000 ran it: the local broker forwards the location topics to the remote one
    return (f"connection c2bridge-h1\naddress {h4}:1883\ntopic {REPORT_FILTER} out {qos}\ncleansession false\n"
            "bridge_protocol_version mqttv311\nkeepalive_interval 60\nrestart_timeout 2 10\n")


def run_mode(mode: str, plan: Plan, workdir: Path, events: list) -> dict:
    testbed.down()
    st = testbed.up("nps-chain", profile=plan.profile, seed=plan.seed)  # the profile of the radio hop
    h4 = testbed.node_address(st, "h4")
    procs: list[subprocess.Popen] = []
    nodes = None
    extra = {}
    try:
        procs.append(start_mosquitto("c2-h4", workdir / mode / "broker4", "127.0.0.1"))
        if mode == "overlay":
            nodes = Nodes(st, BPA, ["gw1", "gw4"], workdir / mode / "nodes", gateways=_gateway_tables(h4))
            for n in BPA:
                nodes.start(n, wait=False)
            for n in BPA:
                nodes.wait_ready(n)
            target = h4
        else:
            procs.append(start_mosquitto("c2-h1", workdir / mode / "broker1", "127.0.0.1",
                                         extra=_bridge_conf(h4, plan.qos)))
            target = "127.0.0.1"
        sub = _client("h4", "sub", "--host", "127.0.0.1", "--topic", REPORT_FILTER, "--qos", str(plan.qos),
                      "--timeout", str(plan.duration + plan.drain + 5), "--client-id", "c2bft-sub")
        mine: list[dict] = []
        readers = [_reader(sub, mine, mode, "sub")]
        time.sleep(1.0)
        pub = _client("h1", "units", "--host", target, "--nation", "NOR", "--units", str(plan.units),
                      "--period", str(plan.period), "--duration", str(plan.duration), "--qos", str(plan.qos),
                      "--timeout", str(plan.drain), "--client-id", "c2bft", "--seed", str(plan.seed))
        readers.append(_reader(pub, mine, mode, "pub"))
        t0 = time.monotonic()
        link = "up"
        while True:
            t = time.monotonic() - t0
            if plan.outage and link == "up" and plan.outage[0] <= t < plan.outage[1]:
                testbed.change_link("r2", "r3", "down")
                link = "down"
            elif plan.outage and link == "down" and t >= plan.outage[1]:
                testbed.change_link("r2", "r3", "up")
                link = "up"
            sent = sum(1 for e in mine if e.get("ev") == "sent")
            got = sum(1 for e in mine if "topic" in e and e["role"] == "sub")
            line = f"{mode:12s} t={t:5.0f} s  link {link:4s}  sent {sent:4d}  delivered {got:4d}"
            if console.is_terminal:
                console.print("\r" + line, end="", highlight=False)
            elif int(t) % 10 == 0:  # a log file gets a line every 10 s
                console.print(line, highlight=False)
            if t >= plan.duration and (got >= sent or t >= plan.duration + plan.drain):
                break
            time.sleep(1.0)
        console.print()
        if nodes:
            c = nodes.status("gw1").get("counters", {})
            extra = {"supersedes": True, "gw1_superseded_reports": c.get("superseded", 0),
                     "gw1_expired_reports": c.get("expired", 0)}
        for p in (pub, sub):
            if p.poll() is None:
                p.terminate()
        for p in (pub, sub):
            p.wait(30)
        for r in readers:
            r.join(5)
        events.extend(mine)
    finally:
        if plan.outage:
            testbed.change_link("r2", "r3", "up")
        if nodes:
            nodes.stop_all()
        for p in procs:
            p.terminate()
            p.wait(10)
        testbed.down()
    return {"mode": mode, **extra, "end_t": time.time()}


def summarize(events: list[dict], mode: str, info: dict) -> dict:
    sent = {e["id"]: e for e in events if e["mode"] == mode and e.get("ev") == "sent"}
    first: dict[str, float] = {}
    dup = 0
    newest: dict[str, float] = {}  # unit -> report time of its newest position known at the subscriber
    for e in events:
        if e["mode"] != mode or e["role"] != "sub" or "topic" not in e:
            continue
        rep = json.loads(e["payload"])["properties"]
        mid = rep["msg_id"]
        if mid in first:
            dup += 1
            continue
        first[mid] = e["t"] - rep["timestamp"] / 1000
        newest[rep["unit"]] = max(newest.get(rep["unit"], 0), rep["timestamp"] / 1000)
    delays = sorted(first.values())
    # a report not delivered is superseded when the mode supersedes and a newer report of the
    # same unit was delivered (the unit's position got there); otherwise it is lost
    sup = None
    if info.get("supersedes"):
        newest_seq: dict[str, int] = {}
        for mid in first:
            node, n = mid.rsplit("_", 1)
            newest_seq[node] = max(newest_seq.get(node, 0), int(n))
        sup = sum(1 for mid in sent if mid not in first
                  and newest_seq.get(mid.rsplit("_", 1)[0], 0) > int(mid.rsplit("_", 1)[1]))
    lost = len(sent) - len([m for m in first if m in sent]) - (sup or 0)
    last_sent = max((e["t"] for e in sent.values()), default=0)
    ages = [last_sent - t for t in newest.values()]
    q = statistics.quantiles(delays, n=20) if len(delays) > 1 else delays * 19
    return {"mode": mode, "sent": len(sent), "delivered": len(first), "duplicates": dup,
            "gw1_superseded_reports": info.get("gw1_superseded_reports"),
            "superseded": sup, "lost": lost, "lost_pct": 100 * lost / len(sent) if sent else 0.0,
            "delay_min_s": delays[0] if delays else None, "delay_median_s": statistics.median(delays) if delays else None,
            "delay_p95_s": q[18] if delays else None, "delay_max_s": delays[-1] if delays else None,
            "units_known": len(newest), "newest_age_max_s": max(ages) if ages else None}


def _fmt(v, unit="s") -> str:
    return "-" if v is None else f"{v:.1f} {unit}"


def report(out: Path, plan: Plan, events: list[dict], rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    title = (f"BFT: {plan.units} units, report every {plan.period:g} s for {plan.duration:g} s, QoS {plan.qos}, "
             f"nps-chain r2-r3 {plan.profile}"
             + (f", link down {plan.outage[0]:g}-{plan.outage[1]:g} s" if plan.outage else ""))
    t = Table(title=title)
    cols = ("mode", "sent", "delivered", "superseded", "lost", "lost %", "delay min", "median", "p95", "max",
            "newest position: age vs last report sent (worst unit)")
    for c in cols:
        t.add_column(c, justify="right")
    md = ["# " + title, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["mode"], str(r["sent"]), str(r["delivered"]), "-" if r["superseded"] is None else str(r["superseded"]),
                 str(r["lost"]), f"{r['lost_pct']:.1f}", _fmt(r["delay_min_s"]), _fmt(r["delay_median_s"]),
                 _fmt(r["delay_p95_s"]), _fmt(r["delay_max_s"]),
                 f"{_fmt(r['newest_age_max_s'])} ({r['units_known']}/{plan.units} units)"]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(t)
    md += ["", "superseded (modes that supersede): not delivered, but a newer report of the same unit was. "
           "lost = sent - delivered - superseded. Delay = receipt at the subscriber - the report's "
           "timestamp. Every figure is computed from events.jsonl.", "", "![delay of each report](plot.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps({"plan": plan.__dict__, "modes": rows}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(out / "plot.png", plan, events)
    console.print(f"results in {out}")


def plot(path: Path, plan: Plan, events: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for mode, marker in zip(MODES, "os"):
        sent = [e for e in events if e["mode"] == mode and e.get("ev") == "sent"]
        if not sent:
            continue
        t0 = min(e["t"] for e in sent)
        got = {}
        for e in events:
            if e["mode"] == mode and e["role"] == "sub" and "topic" in e:
                rep = json.loads(e["payload"])["properties"]
                got.setdefault(rep["msg_id"], (rep["timestamp"] / 1000 - t0, e["t"] - rep["timestamp"] / 1000))
        xs, ys = zip(*got.values()) if got else ((), ())
        ax.scatter(xs, ys, s=10, marker=marker, label=f"{mode}: {len(got)}/{len(sent)} delivered")
    if plan.outage:
        ax.axvspan(*plan.outage, color="grey", alpha=0.2, label="radio link down")
    ax.set_xlabel("report sent at (s into the run)")
    ax.set_ylabel("delay to the subscriber (s)")
    ax.set_title("Delay of each position report, overlay vs Mosquitto bridge")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(plan: Plan, modes: list[str]) -> Path:
    out = Path("results") / (time.strftime("%Y%m%d-%H%M%S") + "-bft")
    events: list[dict] = []
    infos = []
    with tempfile.TemporaryDirectory() as td:
        for mode in modes:
            console.print(f"[bold]{mode}[/bold]: starting")
            infos.append(run_mode(mode, plan, Path(td), events))
    rows = [summarize(events, i["mode"], i) for i in infos]
    report(out, plan, events, rows)
    return out
