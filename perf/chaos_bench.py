"""Kill anywhere: QoS 1 and QoS 2 through the gateways while processes die at random.

`c2dtn perf chaos` (the kill-anywhere campaign).  nps-chain, the r2=r3 radio link
on --profile (cnr-tactical-2), cut for --outage-s every --outage-every s.  Mosquitto on
h4; gw1 intercepts (TPROXY) MQTT from h1 bound for it, gw4 publishes there.  Two
paho-mqtt publishers on h1 (QoS 1 and QoS 2, --rate messages a second each, for
--minutes) and a QoS 2 subscriber at h4's broker.  Meanwhile a chaos loop SIGKILLs, at
--kills random moments (at least 15 s apart), one of: the near gateway (gateway, overlay
node and its BPA daemon: a power cut of the box; restarted 3 s later), the far gateway
likewise, or one BPA daemon alone (gw1's, r2's, r3's, gw4's; its node's supervisor
restarts it), taking turns in a shuffled order.  `--targets agents` kills BPA daemons
alone (a SIGKILL of each agent's daemon mid-transfer, with --agent ion, ibrdtn
or hdtn on every node).

Figures per QoS: published, PUBACKed (or PUBCOMPed) at the publisher, delivered at the
subscriber once, delivered more than once, lost (published, acknowledged and never
delivered), and the delivery latency p50 / p95 / max.  Both must arrive once: QoS 1 too,
as gw4 publishes it to the broker at QoS 2 (`qos1_once = true` in its [gateway]).  Writes
results/<time>-chaos/ with report.md, summary.json, events.jsonl (kills, outages,
deliveries) and plot.png (+ .json).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from c2dtn.overlay.agents import DEFAULT
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.nodes import Nodes

BPA = ["gw1", "r2", "r3", "gw4"]
TARGETS = ["gw1", "gw4", "agent:gw1", "agent:r2", "agent:r3", "agent:gw4"]
TARGET_SETS = {"all": TARGETS, "agents": [t for t in TARGETS if t.startswith("agent:")]}
RESTART_AFTER_S = 3.0
MIN_GAP_S = 15.0


def _mqtt(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "c2dtn.perf.mqtt_clients", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_times(rng: random.Random, kills: int, duration: float) -> list[float]:
    """`kills` moments in [MIN_GAP_S, duration - MIN_GAP_S], each at least MIN_GAP_S from the next."""
    span = duration - 2 * MIN_GAP_S - (kills - 1) * MIN_GAP_S
    if span < 0:
        raise ValueError(f"{kills} kills at least {MIN_GAP_S:.0f} s apart do not fit in {duration:.0f} s")
    free = sorted(rng.uniform(0, span) for _ in range(kills))
    return [MIN_GAP_S + f + i * MIN_GAP_S for i, f in enumerate(free)]


def kill(nodes: Nodes, target: str) -> str:
    """SIGKILL the target; returns what was killed (pids), for the events."""
    if target.startswith("agent:"):
        n = target.split(":", 1)[1]
        pid = int((nodes.cfg(n).storage / "agent.pid").read_text())
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return f"{n}'s agent (pid {pid}) was already gone"
        return f"{n}'s agent daemon (pid {pid}); its supervisor restarts it"
    pid = nodes.procs[target].pid
    nodes.kill(target)
    time.sleep(RESTART_AFTER_S)
    nodes.start(target, wait=False)
    return f"{target}: gateway, node and agent (pid {pid}), restarted {RESTART_AFTER_S:.0f} s later"


class Subscriber:
    """The QoS 2 subscriber at h4's broker, its lines read as they come."""

    def __init__(self, total: int, timeout: float):
        self.p = _mqtt(
            "h4",
            "sub",
            "--host",
            "127.0.0.1",
            "--topic",
            "c2/chaos/#",
            "--qos",
            "2",
            "--count",
            str(10 * total),
            "--timeout",
            str(int(timeout)),
            "--client-id",
            "c2chaos-sub",
        )
        self.rows: list[dict] = []
        self.subscribed = threading.Event()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            if "subscribed" in d:
                self.subscribed.set()
            elif "topic" in d:
                self.rows.append(d)

    def unique(self) -> set[tuple[int, int]]:
        return {_key(r) for r in list(self.rows)}

    def stop(self) -> None:
        self.p.terminate()
        self.p.wait(10)
        self._t.join(5)


def _key(r: dict) -> tuple[int, int]:
    """(qos of the publisher, message number) from the topic c2/chaos/<qos>/<n>."""
    _, _, q, n = r["topic"].split("/")
    return int(q), int(n)


def campaign(
    minutes: float,
    kills: int,
    rate: float,
    profile: str,
    outage_s: float,
    outage_every: float,
    seed: int,
    agent: str,
    work: Path,
    events: list,
    bar=None,
    logs: Path | None = None,
    targets: str = "all",
) -> dict:
    rng = random.Random(seed)
    duration = minutes * 60
    count = int(rate * duration)
    plan = kill_times(rng, kills, duration)  # before anything is set up: a bad --kills fails at once
    order: list[str] = []
    while len(order) < kills:
        batch = TARGET_SETS[targets][:]
        rng.shuffle(batch)
        order += batch
    testbed.down()
    st = testbed.up("nps-chain", profile=profile, seed=seed)
    h4 = testbed.node_address(st, "h4")
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    rule = '[[gateway.topic]]\nfilter = "c2/#"\npriority = "immediate"\nlifetime = 86400\n'
    nodes = Nodes(
        st,
        BPA,
        ["gw1", "gw4"],
        work / "nodes",
        agent=agent,
        gateways={
            "gw1": f'[gateway]\ntproxy = true\n\n[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n\n{rule}',
            "gw4": f"[gateway]\nqos1_once = true\n\n{rule}",
        },
    )
    broker = start_mosquitto("c2-h4", work / "broker", h4)
    sub = None
    t0 = time.monotonic()

    def ev(kind: str, **kw) -> None:
        events.append({"ev": kind, "t": round(time.monotonic() - t0, 2), **kw})

    try:
        for n in BPA:
            nodes.start(n, wait=False)
        for n in BPA:
            nodes.wait_ready(n, timeout=60)
        drain = max(600.0, duration)
        sub = Subscriber(2 * count, duration + drain + 120)
        if not sub.subscribed.wait(30):
            raise RuntimeError("the subscriber at h4's broker never subscribed")
        t0 = time.monotonic()
        t0_wall = time.time()
        ev("start", count=count, rate=rate, kills=kills, duration=duration)
        pubs = {
            q: _mqtt(
                "h1",
                "pub",
                "--host",
                h4,
                "--topic",
                f"c2/chaos/{q}/{{n}}",
                "--qos",
                str(q),
                "--count",
                str(count),
                "--interval",
                str(1 / rate),
                "--timeout",
                str(int(drain)),
                "--client-id",
                f"c2chaos-q{q}",
            )
            for q in (1, 2)
        }
        cuts = [(s, s + outage_s) for s in _frange(outage_every, duration, outage_every)]
        steps = sorted(
            [(t, "kill", target) for t, target in zip(plan, order)]
            + [(a, "down", None) for a, _ in cuts]
            + [(b, "up", None) for _, b in cuts]
        )
        task = bar.add_task("chaos: kills", total=kills) if bar else None
        for at, what, target in steps:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if what == "kill":
                ev("kill", target=target, what=kill(nodes, target))
                if bar:
                    bar.update(task, advance=1, description=f"chaos: killed {target} at {at:.0f} s")
            else:
                testbed.change_link("r2", "r3", what)
                ev(f"link_{what}")
        for n in ("gw1", "gw4"):  # a node restarted by the last kill is up before the drain is judged
            nodes.wait_ready(n, timeout=60)
        ev("traffic_end")
        want = {(q, n) for q in (1, 2) for n in range(count)}
        dtask = bar.add_task("chaos: draining", total=len(want)) if bar else None
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline:
            got = sub.unique()
            if bar:
                bar.update(dtask, completed=len(got & want))
            if want <= got:
                break
            time.sleep(2)
        time.sleep(10)  # late duplicates
        results = {}
        for q, p in pubs.items():
            try:
                out, err = p.communicate(timeout=drain)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            results[q] = rows[-1] if rows else {"error": err[-500:]}
        status = {n: nodes.status(n) for n in ("gw1", "gw4")}
    finally:
        if sub is not None:
            sub.stop()
        nodes.stop_all()
        if logs is not None:  # what each node said, kept with the figures (a loss is explained from them)
            logs.mkdir(parents=True, exist_ok=True)
            for f in (work / "nodes").glob("*.node.log"):
                shutil.copyfile(f, logs / f.name)
        broker.terminate()
        broker.wait(10)
        testbed.down()
    for r in sub.rows:
        events.append(
            {
                "ev": "delivered",
                "t": round(r["t"] - t0_wall, 2),
                "qos": _key(r)[0],
                "n": _key(r)[1],
                "latency_s": round(r["t"] - int(r["payload"].split()[1]) / 1e9, 3),
            }
        )
    return summarize(count, results, sub.rows, events, status)


def _frange(a: float, b: float, step: float):
    while a < b:
        yield a
        a += step


def summarize(count: int, pubs: dict, rows: list[dict], events: list, status: dict) -> dict:
    out = {
        "count": count,
        "kills": [e for e in events if e["ev"] == "kill"],
        "outages": sum(1 for e in events if e["ev"] == "link_down"),
        "qos": {},
        "far_counters": status["gw4"].get("mqtt", {}).get("counters", {}),
        "near_counters": status["gw1"].get("mqtt", {}).get("counters", {}),
    }
    for q in (1, 2):
        mine = [r for r in rows if _key(r)[0] == q]
        seen: dict[int, int] = {}
        for r in mine:
            seen[_key(r)[1]] = seen.get(_key(r)[1], 0) + 1
        lat = sorted(r["t"] - int(r["payload"].split()[1]) / 1e9 for r in mine)
        p = pubs.get(q, {})
        out["qos"][q] = {
            "published": p.get("sent"),
            "acked": p.get("acked"),
            "publisher_disconnects": len(p.get("disconnects", [])),
            "delivered_once": sum(1 for v in seen.values() if v == 1),
            "delivered_twice_or_more": sum(1 for v in seen.values() if v > 1),
            "lost": sorted(set(range(count)) - set(seen))[:50],
            "lost_count": len(set(range(count)) - set(seen)),
            "latency_p50_s": statistics.median(lat) if lat else None,
            "latency_p95_s": lat[int(0.95 * (len(lat) - 1))] if lat else None,
            "latency_max_s": lat[-1] if lat else None,
        }
    return out


def report(out: Path, res: dict, params: dict, events: list) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"params": params, **res}, indent=1) + "\n")
    with open(out / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    kills = res["kills"]
    by_target: dict[str, int] = {}
    for k in kills:
        by_target[k["target"]] = by_target.get(k["target"], 0) + 1
    md = [
        "# Kill anywhere: QoS 1 and QoS 2 through the gateways while processes die (`c2dtn perf chaos`)",
        "",
        f"nps-chain, r2=r3 on {params['profile']} (agent {params['agent']}), cut for {params['outage_s']:g} s every "
        f"{params['outage_every']:g} s ({res['outages']} cuts); two publishers on h1 at {params['rate']:g} messages/s "
        f"each for {params['minutes']:g} min; {len(kills)} SIGKILLs ("
        + ", ".join(f"{t} x{n}" for t, n in sorted(by_target.items()))
        + ").",
        "",
        "| QoS | published | acknowledged to the publisher | delivered once | delivered twice or more | lost | "
        "latency p50 | p95 | max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for q, r in res["qos"].items():

        def fmt(v):
            return "-" if v is None else f"{v:.1f} s"

        md.append(
            f"| {q} | {r['published']} | {r['acked']} | {r['delivered_once']} | {r['delivered_twice_or_more']} | "
            f"**{r['lost_count']}** | {fmt(r['latency_p50_s'])} | {fmt(r['latency_p95_s'])} | "
            f"{fmt(r['latency_max_s'])} |"
        )
    md += ["", "Kills:", "", "| at | target | what |", "|---:|---|---|"]
    md += [f"| {k['t']:.0f} s | {k['target']} | {k['what']} |" for k in kills]
    md += [
        "",
        f"Far gateway counters at the end: {json.dumps(res['far_counters'])}",
        "",
        "![deliveries, kills and cuts](plot.png)",
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for q, mark in ((1, "."), (2, "x")):
        d = [e for e in events if e["ev"] == "delivered" and e["qos"] == q]
        ax.plot([e["t"] for e in d], [e["latency_s"] for e in d], mark, ms=3, label=f"QoS {q} delivered")
    downs = [e["t"] for e in events if e["ev"] == "link_down"]
    ups = [e["t"] for e in events if e["ev"] == "link_up"]
    for a, b in zip(downs, ups):
        ax.axvspan(a, b, color="grey", alpha=0.2)
    for k in kills:
        ax.axvline(k["t"], color="red", lw=0.8, alpha=0.6)
    ax.set_xlabel("s since the traffic started (grey: radio link cut; red: a SIGKILL)")
    ax.set_ylabel("delivery latency (s)")
    ax.set_title("Kill anywhere: every message's latency, kills and cuts")
    ax.legend()
    save_figure(fig, out / "plot.png")
    return "\n".join(md[:6])


def main(
    minutes: float,
    kills: int,
    rate: float,
    profile: str,
    outage_s: float,
    outage_every: float,
    seed: int,
    agent: str = DEFAULT,
    out: Path | None = None,
    console=None,
    targets: str = "all",
) -> Path:
    if targets not in TARGET_SETS:
        raise ValueError(f"targets {targets!r}: one of " + ", ".join(TARGET_SETS))
    out = out or run_dir("chaos")
    params = {
        "minutes": minutes,
        "kills": kills,
        "rate": rate,
        "profile": profile,
        "outage_s": outage_s,
        "outage_every": outage_every,
        "seed": seed,
        "agent": agent,
        "targets": targets,
    }
    events: list = []
    with tempfile.TemporaryDirectory(prefix="c2chaos-") as td, progress(console) as bar:
        res = campaign(
            minutes,
            kills,
            rate,
            profile,
            outage_s,
            outage_every,
            seed,
            agent,
            Path(td),
            events,
            bar,
            logs=out / "logs",
            targets=targets,
        )
    text = report(out, res, params, events)
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out
