"""C2 orders between two platoons (seed 004, Tables II and III): a 97-message script on
the `platoons` topology as MQTT QoS 1 publications, CoAP CON POSTs and HTTP POSTs, each
directly across the links and (MQTT and CoAP) through c2dtn gateways at the leaders.

Seed 004 ran a scripted military scenario of 97 messages between ten units in two
groups, 17 of them crossing the 15 kbit/s narrowband link between the group leaders;
its script is not published, so ours is generated (seeded, `script()`): the same counts,
times spread over the run, messages of 105 to 420 bytes (seed 004's Table I sizes).

MQTT: one broker, at a-lead (platoon A's leader); every unit subscribes to
c2/orders/<unit>.  direct: every unit connects to it, platoon B's across the narrowband
link; overlay: b-lead intercepts (TPROXY) its units' MQTT and carries it as bundles to
a-lead's gateway, which talks to the broker; b-lead's own client uses its gateway's
explicit listener.  CoAP and HTTP (seed 004's Military Messaging service): a server on
every unit, and each order POSTed to its recipient's server (`perf/orders_unit.py`).
CoAP overlay: each leader's gateway intercepts CoAP routed through it to the other
platoon's units (a route per unit) and carries it as bundles; a leader's own client
reaches the other platoon through its gateway's listener as a forward proxy (Proxy-Uri).
The overlay carries MQTT and CoAP: HTTP runs direct only, as seed 004's baseline.

`outage` (START, END) s into the script: the leaders' link carries nothing between them.

Figures per run, for all messages and for those crossing the narrowband link: sent,
lost (not received by the end of the drain), answered (the sender got its response;
request/response only), received twice, delay (first receipt - publication) min / median
/ max, and bytes the leaders' link carried per delivered message.  Writes
results/<time>-orders/: events.jsonl, summary.json, summary.csv, report.md (beside seed
004's Tables II and III), delays.png (each message's delay over the run) and delay_box.png.
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from c2dtn.perf import bft
from c2dtn.perf.bft import _client, console
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.nodes import Nodes

UNITS = [f"{g}-{u}" for g in ("a", "b") for u in ("lead", "v1", "v2", "v3", "v4")]
PROTOCOLS = ("mqtt", "coap", "http")
PATHS = ("direct", "overlay")
LINK = "leaders"
WORDS = (
    "advance to phase line",
    "hold position at",
    "report contact grid",
    "resupply at",
    "move to checkpoint",
    "observe sector",
    "casualty at grid",
    "fuel state",
    "ammunition state",
    "enemy vehicles sighted near",
)
# seed 004's Tables II (all 97 messages) and III (the 17 across the narrowband link), the rows
# of the protocols run here: (messages, lost %, delay min, median, max in s)
SEED004 = {
    "HTTP/JSON": {"all": (97, 6.19, 0.33, 0.72, 17.31), "narrowband": (17, 35.29, 1.22, 1.36, 17.31)},
    "CoAP/UDP/CBOR": {"all": (97, 1.04, 0.07, 0.24, 25.87), "narrowband": (17, 5.88, 0.16, 0.36, 25.87)},
}


def runs(protocols: tuple[str, ...], paths: tuple[str, ...]) -> list[str]:
    """The runs' names ("coap-overlay"): every protocol on every path, but HTTP only direct."""
    return [f"{p}-{w}" for p in protocols for w in paths if not (p == "http" and w == "overlay")]


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
        out.append(
            {
                "id": f"m{i + 1:03d}",
                "t": round(5 + span * i / messages + rnd.uniform(0, span / messages), 2),
                "from": src,
                "to": dst,
                "text": text.strip(),
            }
        )
    return out


def crosses(m: dict) -> bool:
    return m["from"][0] != m["to"][0]


def lead(unit: str) -> str:
    return f"{unit[0]}-lead"


def _gateways(protocol: str, addr: dict[str, str]) -> dict[str, str]:
    """The leaders' gateway tables for an overlay run."""
    if protocol == "mqtt":
        rule = '[[gateway.topic]]\nfilter = "c2/orders/#"\npriority = "immediate"\nlifetime = 3600\n'
        broker = addr["a-lead"]
        return {
            "b-lead": f'[gateway]\ntproxy = true\nlisten = "127.0.0.1:1884"\nbroker = "{broker}:1883"\n\n'
            f'[[gateway.route]]\nprefix = "{broker}/32"\nvia = "a-lead"\n\n' + rule,
            "a-lead": "[gateway]\n\n" + rule,
        }
    out = {}
    for me in ("a-lead", "b-lead"):
        other = "b-lead" if me == "a-lead" else "a-lead"
        routes = "".join(
            f'[[gateway.route]]\nprefix = "{addr[u]}/32"\nvia = "{other}"\n\n' for u in UNITS if lead(u) == other
        )
        out[me] = (
            "[gateway]\n\n" + routes + '[gateway.coap]\ntproxy = true\nlisten = "127.0.0.1:5684"\n\n'
            '[[gateway.coap.resource]]\npath = "/orders/*"\npriority = "immediate"\nlifetime = 3600\n'
        )
    return out


def _unit(
    protocol: str, path: str, u: str, addr: dict[str, str], script_file: Path, start: float, end: float
) -> subprocess.Popen:
    """One unit's client (and for CoAP and HTTP its server) in its namespace."""
    if protocol == "mqtt":
        # b-lead's own client does not cross b-lead's forwarding path (nothing to intercept):
        # in overlay mode it uses the gateway's explicit listener instead
        host, port = ("127.0.0.1", "1884") if path == "overlay" and u == "b-lead" else (addr["a-lead"], "1883")
        return _client(
            u,
            "script",
            "--unit",
            u,
            "--script",
            str(script_file),
            "--start",
            str(start),
            "--linger",
            str(end),
            "--host",
            host,
            "--port",
            port,
            "--client-id",
            "c2orders",
            "--qos",
            "1",
        )
    args = [
        protocol,
        "--unit",
        u,
        "--script",
        str(script_file),
        "--start",
        str(start),
        "--linger",
        str(end),
        "--peers",
        json.dumps(addr),
    ]
    if path == "overlay" and u == lead(u):  # a leader's own client: the other platoon through its gateway
        args += ["--proxy", "127.0.0.1:5684", "--proxied", ",".join(v for v in UNITS if v[0] != u[0])]
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{u}", sys.executable, "-m", "c2dtn.perf.orders_unit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def run_mode(
    mode: str,
    profile: str,
    msgs: list[dict],
    drain: float,
    seed: int,
    workdir: Path,
    events: list,
    outage: tuple[float, float] | None = None,
) -> dict:
    protocol, path = mode.split("-")
    testbed.down()
    st = testbed.up("platoons", profile=profile, seed=seed)
    procs, nodes, clients, readers = [], None, [], []
    link = "up"
    try:
        addr = {u: testbed.node_address(st, u) for u in UNITS}
        if protocol == "mqtt":
            procs.append(start_mosquitto("c2-a-lead", workdir / mode / "broker", addr["a-lead"]))
        if path == "overlay":
            nodes = Nodes(
                st,
                ["a-lead", "b-lead"],
                ["a-lead", "b-lead"],
                workdir / mode / "nodes",
                gateways=_gateways(protocol, addr),
            )
            for n in nodes.paths:
                nodes.start(n, wait=False)
            for n in nodes.paths:
                nodes.wait_ready(n)
        script_file = workdir / mode / "script.json"
        script_file.parent.mkdir(parents=True, exist_ok=True)
        script_file.write_text(json.dumps(msgs))
        end = max(m["t"] for m in msgs) + drain
        start = time.time() + 3.0  # every unit connected, subscribed or serving before the first message
        mine: list[dict] = []
        if bft.LIVE.get("view") is not None:  # the drill view follows this mode's orders and nodes
            bft.LIVE["view"].follow(mode, mine, dict(nodes.paths) if nodes else {})
        for u in UNITS:
            c = _unit(protocol, path, u, addr, script_file, start, end)
            clients.append(c)
            readers.append(bft._reader(c, mine, mode))
        bytes0 = bft._link_bytes([LINK])
        due = len(msgs)
        while time.time() < start + end:
            t = time.time() - start
            if outage and link == "up" and outage[0] <= t < outage[1]:
                testbed.change_link(LINK, None, "down")
                link = "down"
            elif outage and link == "down" and t >= outage[1]:
                testbed.change_link(LINK, None, "up")
                link = "up"
            got = len({e["id"] for e in mine if e.get("ev") == "recv" and "id" in e})
            sent = sum(1 for e in mine if e.get("ev") == "sent")
            line = f"{mode:13s} t={t:5.0f} s  link {link:4s}  sent {sent:3d} of {due}  delivered {got:3d}"
            if console.is_terminal:
                console.print("\r" + line, end="", highlight=False)
            elif int(t) % 10 == 0:
                console.print(line, highlight=False)
            if sent == due and got == due and (not outage or t >= outage[1]):
                break
            time.sleep(1.0)
        console.print()
        link_bytes = sum(v - bytes0.get(k, 0) for k, v in bft._link_bytes([LINK]).items())
        bft._stop_clients(clients, readers)
        events.extend(mine)
        events.append({"mode": mode, "ev": "link", "bytes": link_bytes})
        return {"mode": mode, "link_bytes": link_bytes}
    finally:
        if outage and link == "down":
            testbed.change_link(LINK, None, "up")
        if nodes:
            nodes.stop_all()
        for p in procs:
            p.terminate()
            p.wait(10)
        for c in clients:
            if c.poll() is None:
                c.kill()
        testbed.down()


def summarize(events: list[dict], msgs: list[dict], mode: str) -> list[dict]:
    """Two rows per run: all messages, and those crossing the narrowband link."""
    sent = {e["id"]: e for e in events if e["mode"] == mode and e.get("ev") == "sent"}
    first: dict[str, float] = {}
    copies: dict[str, int] = {}
    answered = {
        e["id"]
        for e in events
        if e["mode"] == mode and e.get("ev") == "answered" and str(e.get("code", "")).startswith(("2", "204"))
    }
    for e in events:
        if e["mode"] == mode and e.get("ev") == "recv" and e.get("id") in sent:
            copies[e["id"]] = copies.get(e["id"], 0) + 1
            if e["id"] not in first:
                first[e["id"]] = e["t"] - sent[e["id"]]["t"]
    link_bytes = sum(e["bytes"] for e in events if e["mode"] == mode and e.get("ev") == "link")
    rr = not mode.startswith("mqtt")  # request/response: the sender's receipt is the response
    rows = []
    for scope, sel in (("all", lambda m: True), ("narrowband", crosses)):
        ids = [m["id"] for m in msgs if sel(m)]
        delays = sorted(first[i] for i in ids if i in first)
        lost = len(ids) - len(delays)
        rows.append(
            {
                "mode": mode,
                "scope": scope,
                "messages": len(ids),
                "sent": sum(1 for i in ids if i in sent),
                "lost": lost,
                "lost_pct": 100 * lost / len(ids) if ids else 0.0,
                "answered": sum(1 for i in ids if i in answered) if rr else None,
                "twice": sum(1 for i in ids if copies.get(i, 0) > 1),
                "delay_min_s": delays[0] if delays else None,
                "delay_median_s": statistics.median(delays) if delays else None,
                "delay_max_s": delays[-1] if delays else None,
                # every byte the leaders' link carried in the run, per message delivered
                "link_bytes_per_msg": (link_bytes / len(first) if first else None) if scope == "all" else None,
            }
        )
    return rows


def report(
    out: Path,
    profile: str,
    msgs: list[dict],
    events: list[dict],
    rows: list[dict],
    outage: tuple[float, float] | None = None,
) -> None:
    from rich.table import Table

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    (out / "script.json").write_text(json.dumps(msgs, indent=1))
    cut = f", link down {outage[0]:g}-{outage[1]:g} s" if outage else ""
    title = f"C2 orders on platoons (seed 004's script shape: {len(msgs)} messages), leaders' link {profile}{cut}"
    cols = [
        "run",
        "messages",
        "sent",
        "lost",
        "lost %",
        "answered",
        "twice",
        "delay min",
        "median",
        "max",
        "link B/msg",
    ]
    t = Table(title=title)
    t.add_column("scope")
    for c in cols:
        t.add_column(c, justify="right")
    md = ["# " + title, "", "| scope | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    f = lambda v: "-" if v is None else f"{v:.2f} s"  # noqa: E731
    n = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for r in rows:
        cells = [
            r["scope"],
            r["mode"],
            str(r["messages"]),
            str(r["sent"]),
            str(r["lost"]),
            f"{r['lost_pct']:.1f}",
            n(r["answered"]),
            str(r["twice"]),
            f(r["delay_min_s"]),
            f(r["delay_median_s"]),
            f(r["delay_max_s"]),
            n(r["link_bytes_per_msg"]),
        ]
        t.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(t)
    md += [
        "",
        "all: every message (seed 004 Table II); narrowband: those between the platoons, which cross the "
        "leaders' link (Table III). Lost: not received by its recipient by the end of the drain. Answered: the "
        "sender got a 2.xx response (CoAP, HTTP). Twice: received more than once. Delay: first receipt minus "
        "sending. Link B/msg: bytes the leaders' link carried in the run (both ways, every protocol byte) per "
        "message delivered. Computed from events.jsonl.",
        "",
        "Seed 004 (IST-150, Anglova vignette 2 on its own testbed, no outage), for comparison:",
        "",
        "| scope | protocol | messages | lost % | delay min | median | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for proto, scopes in SEED004.items():
        for scope, (count, lost_pct, lo, med, hi) in scopes.items():
            md.append(f"| {scope} | {proto} | {count} | {lost_pct:.2f} | {lo:.2f} s | {med:.2f} s | {hi:.2f} s |")
    md += ["", "![delay of each message](delays.png)", "", "![delay per run and scope](delay_box.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps({"profile": profile, "outage": outage, "rows": rows}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plots(out, msgs, events, [r["mode"] for r in rows if r["scope"] == "all"], outage)
    console.print(f"results in {out}")


def plots(
    out: Path, msgs: list[dict], events: list[dict], modes: list[str], outage: tuple[float, float] | None = None
) -> None:
    plt = pyplot()

    by_id = {m["id"]: m for m in msgs}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    box, labels = [], []
    for mode, color in zip(modes, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")):
        sent = {e["id"]: e["t"] for e in events if e["mode"] == mode and e.get("ev") == "sent"}
        t0 = min(sent.values(), default=0.0)
        first: dict[str, float] = {}
        for e in events:
            if e["mode"] == mode and e.get("ev") == "recv" and e.get("id") in sent and e["id"] not in first:
                first[e["id"]] = e["t"] - sent[e["id"]]
        for scope, marker in (("inside a platoon", "o"), ("narrowband", "^")):
            ids = [i for i in first if (scope == "narrowband") == crosses(by_id[i])]
            ax.scatter(
                [sent[i] - t0 for i in ids],
                [first[i] for i in ids],
                marker=marker,
                color=color,
                s=18,
                label=f"{mode}, {scope}",
            )
            box.append([first[i] for i in ids])
            labels.append(f"{mode}\n{scope}")
    if outage:  # the script's times start 5 s before its first message
        ax.axvspan(outage[0] - 5, outage[1] - 5, color="grey", alpha=0.2, label="leaders' link down")
    ax.set_xlabel("sent at (s after the first message)")
    ax.set_ylabel("delay (s)")
    ax.set_title("Delay of each C2 message (lost ones are absent)")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, out / "delays.png")
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(labels)), 4.5))
    ax.boxplot([b or [0.0] for b in box])
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.set_ylabel("delay (s)")
    ax.set_title("Delay per run and scope")
    save_figure(fig, out / "delay_box.png")


def main(
    profile: str = "narrowband-15k",
    modes: tuple[str, ...] = tuple(runs(PROTOCOLS, PATHS)),
    drain: float = 60.0,
    seed: int = 4,
    span: float = 240.0,
    outage: tuple[float, float] | None = None,
    view: int = 0,
) -> Path:
    msgs = script(seed, span=span)
    out = run_dir("orders")
    events: list[dict] = []
    if view:  # the drill view: each order's delay, live (topologies/view.py)
        from c2dtn.topologies.view import Live

        bft.LIVE["view"] = Live(view, "orders")
        bft.LIVE["view"].start()
        console.print(f"drill view on http://127.0.0.1:{view}/")
    with tempfile.TemporaryDirectory() as td:
        try:
            for i, mode in enumerate(modes, 1):
                console.print(f"[bold]{mode}[/bold] (run {i} of {len(modes)}): {len(msgs)} messages over {span:g} s")
                run_mode(mode, profile, msgs, drain, seed, Path(td), events, outage)
        finally:
            if bft.LIVE.get("view") is not None:
                bft.LIVE.pop("view").stop()
    rows = [r for mode in modes for r in summarize(events, msgs, mode)]
    report(out, profile, msgs, events, rows, outage)
    return out


if __name__ == "__main__":  # pragma: no cover
    main(*sys.argv[1:2])
