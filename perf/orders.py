"""C2 orders between two platoons (seed 004, Tables II and III): a 97-message script at
QoS 1 on the `platoons` topology, through c2dtn gateways next to direct MQTT.

Seed 004 ran a scripted military scenario of 97 messages between ten units in two
groups, 17 of them crossing the 15 kbit/s narrowband link between the group leaders;
its script is not published, so ours is generated (seeded, `script()`): the same counts,
times spread over the run, messages of 105 to 420 bytes (seed 004's Table I sizes).

One broker, at a-lead (platoon A's leader).  mqtt: every unit connects to it directly;
platoon B's units reach it across the narrowband link.  overlay: b-lead intercepts
(TPROXY) its units' MQTT and carries it as bundles; a-lead's gateway talks to the broker.
Each unit is an MQTT client in its own namespace, subscribed to c2/orders/<unit>.

Figures per mode, for all messages and for those crossing the narrowband link: sent,
lost (not delivered by the end of the drain), delay (receipt - publication) min / median
/ max.  Writes results/<time>-orders/: events.jsonl, summary.json, summary.csv,
report.md, delays.png (each message's delay over the run) and delay_box.png.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from c2dtn.perf import bft
from c2dtn.perf.bft import _client, console
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.nodes import Nodes
from c2dtn.topologies import testbed
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir

UNITS = [f"{g}-{u}" for g in ("a", "b") for u in ("lead", "v1", "v2", "v3", "v4")]
MODES = ("overlay", "mqtt")
WORDS = ("advance to phase line", "hold position at", "report contact grid", "resupply at", "move to checkpoint",
         "observe sector", "casualty at grid", "fuel state", "ammunition state", "enemy vehicles sighted near")


def script(seed: int = 4, messages: int = 97, crossing: int = 17, span: float = 240.0) -> list[dict]:
    """`messages` messages in `span` s, `crossing` of them between the platoons."""
    rnd = random.Random(seed)
    cross = set(rnd.sample(range(messages), crossing))
    out = []
    for i in range(messages):
        src = rnd.choice(UNITS)
        same = [u for u in UNITS if u[0] == src[0] and u != src]
        other = [u for u in UNITS if u[0] != src[0]]
        dst = rnd.choice(other if i in cross else same)
        size = rnd.randint(105, 420)
        text = ""
        while len(text) < size - 90:  # the JSON around it is about 90 bytes
            text += rnd.choice(WORDS) + f" {rnd.randrange(10**5, 10**6)} "
        out.append({"id": f"m{i + 1:03d}", "t": round(5 + span * i / messages + rnd.uniform(0, span / messages), 2),
                    "from": src, "to": dst, "text": text.strip()})
    return out


def crosses(m: dict) -> bool:
    return m["from"][0] != m["to"][0]


def run_mode(mode: str, profile: str, msgs: list[dict], drain: float, seed: int, workdir: Path,
             events: list) -> dict:
    testbed.down()
    st = testbed.up("platoons", profile=profile, seed=seed)
    procs, nodes, clients, readers = [], None, [], []
    try:
        broker = testbed.node_address(st, "a-lead")
        procs.append(start_mosquitto("c2-a-lead", workdir / mode / "broker", broker))
        if mode == "overlay":
            rule = '[[gateway.topic]]\nfilter = "c2/orders/#"\npriority = "immediate"\nlifetime = 3600\n'
            nodes = Nodes(st, ["a-lead", "b-lead"], ["a-lead", "b-lead"], workdir / mode / "nodes", gateways={
                "b-lead": f'[gateway]\ntproxy = true\nlisten = "127.0.0.1:1884"\nbroker = "{broker}:1883"\n\n'
                          f'[[gateway.route]]\nprefix = "{broker}/32"\nvia = "a-lead"\n\n' + rule,
                "a-lead": "[gateway]\n\n" + rule})
            for n in nodes.paths:
                nodes.start(n, wait=False)
            for n in nodes.paths:
                nodes.wait_ready(n)
        path = workdir / mode / "script.json"
        path.write_text(json.dumps(msgs))
        end = max(m["t"] for m in msgs) + drain
        start = time.time() + 3.0  # every unit connected and subscribed before the first message
        mine: list[dict] = []
        for u in UNITS:
            # b-lead's own client does not cross b-lead's forwarding path (nothing to intercept):
            # in overlay mode it uses the gateway's explicit listener instead
            host, port = ("127.0.0.1", "1884") if mode == "overlay" and u == "b-lead" else (broker, "1883")
            c = _client(u, "script", "--unit", u, "--script", str(path), "--start", str(start), "--linger", str(end),
                        "--host", host, "--port", port, "--client-id", "c2orders", "--qos", "1")
            clients.append(c)
            readers.append(bft._reader(c, mine, mode))
        due = len(msgs)
        while time.time() < start + end:
            got = len({e["id"] for e in mine if e.get("ev") == "recv" and "id" in e})
            sent = sum(1 for e in mine if e.get("ev") == "sent")
            line = f"{mode:8s} t={time.time() - start:5.0f} s  sent {sent:3d} of {due}  delivered {got:3d}"
            if console.is_terminal:
                console.print("\r" + line, end="", highlight=False)
            elif int(time.time() - start) % 10 == 0:
                console.print(line, highlight=False)
            if sent == due and got == due:
                break
            time.sleep(1.0)
        console.print()
        bft._stop_clients(clients, readers)
        events.extend(mine)
        return {"mode": mode}
    finally:
        if nodes:
            nodes.stop_all()
        for p in procs:
            p.terminate()
            p.wait(10)
        testbed.down()


def summarize(events: list[dict], msgs: list[dict], mode: str) -> list[dict]:
    """Two rows per mode: all messages, and those crossing the narrowband link."""
    sent = {e["id"]: e for e in events if e["mode"] == mode and e.get("ev") == "sent"}
    first: dict[str, float] = {}
    for e in events:
        if e["mode"] == mode and e.get("ev") == "recv" and e.get("id") in sent and e["id"] not in first:
            first[e["id"]] = e["t"] - sent[e["id"]]["t"]
    rows = []
    for scope, sel in (("all", lambda m: True), ("narrowband", crosses)):
        ids = [m["id"] for m in msgs if sel(m)]
        delays = sorted(first[i] for i in ids if i in first)
        lost = len(ids) - len(delays)
        rows.append({"mode": mode, "scope": scope, "messages": len(ids), "sent": sum(1 for i in ids if i in sent),
                     "lost": lost, "lost_pct": 100 * lost / len(ids) if ids else 0.0,
                     "delay_min_s": delays[0] if delays else None,
                     "delay_median_s": statistics.median(delays) if delays else None,
                     "delay_max_s": delays[-1] if delays else None})
    return rows


def report(out: Path, profile: str, msgs: list[dict], events: list[dict], rows: list[dict]) -> None:
    from rich.table import Table

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    (out / "script.json").write_text(json.dumps(msgs, indent=1))
    title = f"C2 orders on platoons (seed 004's script shape: {len(msgs)} messages), leaders' link {profile}, QoS 1"
    cols = ["mode", "messages", "sent", "lost", "lost %", "delay min", "median", "max"]
    t = Table(title=title)
    t.add_column("scope")
    for c in cols:
        t.add_column(c, justify="right")
    md = ["# " + title, "", "| scope | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    f = lambda v: "-" if v is None else f"{v:.2f} s"  # noqa: E731
    for r in rows:
        cells = [r["scope"], r["mode"], str(r["messages"]), str(r["sent"]), str(r["lost"]), f"{r['lost_pct']:.1f}",
                 f(r["delay_min_s"]), f(r["delay_median_s"]), f(r["delay_max_s"])]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(t)
    md += ["", "all: every message (seed 004 Table II); narrowband: those between the platoons, which cross the "
           "leaders' link (Table III). Lost: not delivered by the end of the drain. Computed from events.jsonl.",
           "", "![delay of each message](delays.png)", "", "![delay per mode and scope](delay_box.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps({"profile": profile, "rows": rows}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plots(out, msgs, events, [r["mode"] for r in rows if r["scope"] == "all"])
    console.print(f"results in {out}")


def plots(out: Path, msgs: list[dict], events: list[dict], modes: list[str]) -> None:
    plt = pyplot()

    by_id = {m["id"]: m for m in msgs}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    box, labels = [], []
    for mode, color in zip(modes, ("tab:blue", "tab:orange")):
        sent = {e["id"]: e["t"] for e in events if e["mode"] == mode and e.get("ev") == "sent"}
        t0 = min(sent.values(), default=0.0)
        first: dict[str, float] = {}
        for e in events:
            if e["mode"] == mode and e.get("ev") == "recv" and e.get("id") in sent and e["id"] not in first:
                first[e["id"]] = e["t"] - sent[e["id"]]
        for scope, marker in (("inside a platoon", "o"), ("narrowband", "^")):
            ids = [i for i in first if (scope == "narrowband") == crosses(by_id[i])]
            ax.scatter([sent[i] - t0 for i in ids], [first[i] for i in ids], marker=marker, color=color, s=18,
                       label=f"{mode}, {scope}")
            box.append([first[i] for i in ids])
            labels.append(f"{mode}\n{scope}")
    ax.set_xlabel("sent at (s into the script)")
    ax.set_ylabel("delay (s)")
    ax.set_title("Delay of each C2 message (lost ones are absent)")
    ax.legend(fontsize=8)
    save_figure(fig, out / "delays.png")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.boxplot([b or [0.0] for b in box])
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("delay (s)")
    ax.set_title("Delay per mode and scope")
    save_figure(fig, out / "delay_box.png")


def main(profile: str = "narrowband-15k", modes: tuple[str, ...] = MODES, drain: float = 60.0, seed: int = 4,
         span: float = 240.0) -> Path:
    msgs = script(seed, span=span)
    out = run_dir("orders")
    events: list[dict] = []
    with tempfile.TemporaryDirectory() as td:
        for mode in modes:
            console.print(f"[bold]{mode}[/bold]: {len(msgs)} messages over {span:g} s")
            run_mode(mode, profile, msgs, drain, seed, Path(td), events)
    rows = [r for mode in modes for r in summarize(events, msgs, mode)]
    report(out, profile, msgs, events, rows)
    return out


if __name__ == "__main__":  # pragma: no cover
    main(*sys.argv[1:2])
