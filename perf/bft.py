"""The blue-force-tracking experiment (seed 000): GeoJSON position reports across
emulated tactical links, through c2dtn gateways next to plain MQTT on the same links,
measured in the same run.  Every figure comes from events.jsonl (one line per report
sent and one per report received); nothing is modelled.

Topologies:
  nps-chain     (`make demo`) 8 units on h1 publish to the broker on h4, across r2-r3
                (default: cnr-tactical-2, down from 20 s to 80 s).  overlay: gw1
                intercepts (TPROXY), gw4 publishes at the broker.  mqtt-bridge: a
                mosquitto on h1 bridged to h4's broker.  One receiver: a subscriber on h4.
  fmn-2nations, fmn-4nations  (seed 000 settings 1 and 2) 8 units per nation, a broker
                per nation, every unit subscribed to every unit's reports.  overlay: each
                nation's gateway bridges its broker (bridge mode) to every other
                nation's gateway, through the group.  mqtt-bridge: the other nations'
                brokers bridge to the first nation's (a star, as seed 000's Mosquitto set-up).
                mqtt-single: one broker, the first nation's; every unit connects to it
                across the links (nps-chain: h1's units straight to h4's broker).
                mqtt-sn (nps-chain only; seed 001's baseline): h1's units publish MQTT-SN
                over UDP across the link to the Paho MQTT-SN gateway beside h4's broker
                (perf/mqtt_sn.py; `make bpas` builds the gateway).  The 8 units of
                a nation run in one process in the namespace of its unit 1 (the units
                share the nation's unlimited LAN, so this changes nothing on the links).
  fmn-4nations-mixed  fmn-4nations with a BPA per nation (DEU, USA dtn7-rs; NOR ION; PRT
                IBR-DTN) and the relay at tacnet: each report goes to each other nation's gateway.
                The gateways form one overlay group ("fmn"): a report crosses its nation's
                link once and fans out at tacnet (dtnd epidemic routing).

Figures per mode (deliveries count receiver x report pairs across an emulated link:
every receiver in another nation than the report's):
  sent, expected deliveries, delivered, superseded (modes that supersede: not
  delivered, but a newer report of the same unit reached that receiver), lost (neither),
  delay (receipt - the report's own timestamp) min / median / p95 / max, age of
  information (at each second, for each receiver and each unit of another nation: now -
  timestamp of the newest report of that unit the receiver has) mean and p95, bytes on
  the emulated links per delivery, and goodput (distinct reports that reached another
  nation, as bits, over the emulated links' capacity for the run).

Writes results/<time>-bft/: events.jsonl, summary.json, summary.csv, report.md and
plot.png (delay of each delivery), delay_box.png (per sender -> receiver nation),
aoi.png (age of information over time).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c2dtn.perf import capture
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.node_configs import override_agents, topology_agents
from c2dtn.topologies.nodes import Nodes

console = Console(width=None if sys.stdout.isatty() else 150)
MODES = ("overlay", "mqtt-bridge")  # what perf bft and perf matrix run unless told
ALL_MODES = MODES + ("mqtt-single", "mqtt-sn")
NPS_ONLY = ("mqtt-sn",)  # modes nps-chain alone has
TOPOLOGIES = ("nps-chain", "fmn-2nations", "fmn-4nations", "fmn-4nations-mixed")
REPORT_FILTER = "/+/+/+/location"
GROUP = "fmn"  # the overlay group of the nations' gateways


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
    topology: str = "nps-chain"
    agents: dict[str, str] = field(default_factory=dict)  # node -> agent, instead of the topology's (--agent)
    observers: int = 0  # fmn: only this many units per nation subscribe (0: every unit; perf scale)
    capture: bool = True  # capture the emulated links (the report's layer split)
    view: int = 0  # serve the drill view on this port of 127.0.0.1 during the run (0: no)
    pcap: str = ""  # capture every emulated link into this folder, <mode>/<link>.pcapng ("": the radio links only)
    engine: str = field(default_factory=testbed.default_engine)  # who builds the testbed (perf --engine)
    scheduler: dict[str, int] = field(default_factory=dict)  # overlay [scheduler] settings over the generated ones


# -- processes ------------------------------------------------------------------
def _reader(p: subprocess.Popen, sink: list, mode: str, rx: str | None = None) -> threading.Thread:
    """Collect a client's JSON lines as events; a plain `sub` client's messages become recv events."""

    def run():
        for line in p.stdout:
            if not line.startswith("{"):
                continue
            ev = json.loads(line)
            if rx is not None and "payload" in ev:
                try:
                    rep = json.loads(ev["payload"])["properties"]
                    ev = {
                        "ev": "recv",
                        "rx": rx,
                        "rx_nation": rx,
                        "id": rep["msg_id"],
                        "from": rep["country"],
                        "ts": rep["timestamp"] / 1000,
                        "t": ev["t"],
                    }
                except (ValueError, KeyError, TypeError):
                    ev = {"ev": "recv", "rx": rx, "rx_nation": rx, "bad": ev.get("topic"), "t": ev["t"]}
            ev["mode"] = mode
            sink.append(ev)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _client(node: str, *args: str, module: str = "mqtt_clients") -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", f"c2dtn.perf.{module}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _topic_rule() -> str:
    return (
        f'[[gateway.topic]]\nfilter = "{REPORT_FILTER}"\npriority = "priority"\nlifetime = 600\nsupersede = "topic"\n'
    )


def _mosquitto_bridge(remote: str, name: str, direction: str, qos: int) -> str:
    # a bridge as seed 000 ran it: the location topics forwarded to the remote broker
    return (
        f"connection {name}\naddress {remote}:1883\ntopic {REPORT_FILTER} {direction} {qos}\n"
        "cleansession false\ntry_private true\nbridge_protocol_version mqttv311\nkeepalive_interval 60\n"
        "restart_timeout 2 10\n"
    )


@dataclass
class Setup:
    procs: list
    nodes: Nodes | None
    publishers: list[tuple[str, str, str, str]]  # (node, nation, broker address, subscribe filter or "")
    receivers: list[tuple[str, str]]  # (receiver id, its nation)
    plain_subs: list[tuple[str, str]]  # (node, receiver id): a plain subscriber at a broker
    outage_link: tuple[str, str]
    dil_links: list[str]
    supersedes: bool


def _nations(st: dict) -> list[str]:
    return sorted({n.split("-")[0] for n in st["nodes"] if n.endswith("-broker")})


def setup(mode: str, plan: Plan, st: dict, workdir: Path) -> Setup:
    procs: list = []
    nodes = None
    dil = [k for k, ls in st["links"].items() if ls.get("dil")] or list(st["links"])
    if plan.topology == "nps-chain":
        h4 = testbed.node_address(st, "h4")
        procs.append(start_mosquitto("c2-h4", workdir / "broker-h4", "127.0.0.1"))
        if mode == "overlay":
            prefix = h4.rsplit(".", 1)[0] + ".0/24"
            bpa = ["gw1", "r2", "r3", "gw4"]
            nodes = Nodes(
                st,
                bpa,
                ["gw1", "gw4"],
                workdir / "nodes",
                gateways={
                    "gw1": f'[gateway]\ntproxy = true\n\n[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n\n'
                    + _topic_rule(),
                    "gw4": "[gateway]\n\n" + _topic_rule(),
                },
                scheduler=plan.scheduler or None,
            )
            target = h4
        elif mode == "mqtt-single":  # the units publish straight to h4's broker, across the link
            target = h4
        elif mode == "mqtt-sn":  # MQTT-SN over UDP, across the link, to the Paho gateway beside h4's broker
            from c2dtn.perf.mqtt_sn import start_gateway

            procs.append(start_gateway("c2-h4", workdir / "mqttsn-h4"))
            target = h4
        else:
            procs.append(
                start_mosquitto(
                    "c2-h1",
                    workdir / "broker-h1",
                    "127.0.0.1",
                    extra=_mosquitto_bridge(h4, "c2bridge-h1", "out", plan.qos),
                )
            )
            target = "127.0.0.1"
        return Setup(
            procs,
            nodes,
            [("h1", "NOR", target, "")],
            [("h4-sub", "h4")],
            [("h4", "h4-sub")],
            ("r2", "r3"),
            ["r2-r3"],
            mode == "overlay",
        )
    if mode in NPS_ONLY:
        raise ValueError(f"mode {mode} runs on nps-chain only")
    nations = _nations(st)
    brokers = {n: testbed.node_address(st, f"{n}-broker") for n in nations}
    main = nations[0]
    for n in nations:
        if mode == "mqtt-single" and n != main:
            continue  # one broker for all: every unit connects to the first nation's, across the links
        extra = ""
        if mode == "mqtt-bridge" and n != main:
            extra = _mosquitto_bridge(brokers[main], f"c2bridge-{n}", "both", plan.qos)
        procs.append(start_mosquitto(f"c2-{n}-broker", workdir / f"broker-{n}", brokers[n], extra=extra))
    if mode == "overlay":
        # the nations' gateways form one group: a report crosses its nation's uplink once and
        # fans out at tacnet (see README, "Groups"); where the nations run different agents
        # (fmn-4nations-mixed), which have no common group endpoints, each report goes to each
        # other nation's gateway, through the relay at tacnet
        gws = [f"{n}-gw" for n in nations]
        mixed = topology_agents(st)[1] is not None
        peers = {g: [x for x in gws if x != g] if mixed else [GROUP] for g in gws}
        tables = {
            f"{n}-gw": (
                f'[gateway]\n\n[gateway.bridge]\nbroker = "{brokers[n]}:1883"\n'
                f'peers = {json.dumps(peers[f"{n}-gw"])}\nout = ["{REPORT_FILTER}"]\n'
                f"qos = {plan.qos}\n\n" + _topic_rule()
            )
            for n in nations
        }
        routers = [n for n, v in st["nodes"].items() if v.get("role") == "router"]
        nodes = Nodes(
            st,
            gws + routers,
            gws,
            workdir / "nodes",
            gateways=tables,
            groups=None if mixed else {GROUP: gws},
            scheduler=plan.scheduler or None,
        )
    pubs = [(f"{n}-u1", n.upper(), brokers[main if mode == "mqtt-single" else n], REPORT_FILTER) for n in nations]
    watch = min(plan.units, plan.observers or plan.units)
    receivers = [(f"{n.upper()}-S{u:03d}", n.upper()) for n in nations for u in range(1, watch + 1)]
    return Setup(procs, nodes, pubs, receivers, [], (f"{main}-gw", "tacnet"), dil, mode == "overlay")


def _link_bytes(names: list[str]) -> dict[str, int]:
    """Bytes each emulated link has delivered so far, per direction ("<link> ab" / "<link> ba")."""
    out = {}
    for name, ls in testbed.status()["links"].items():
        live = ls.get("live") or {}
        if name in names and "error" not in live:
            for d in ("ab", "ba"):
                out[f"{name} {d}"] = (live.get(d) or {}).get("delivered_bytes", 0)
    return out


def _capture(links: list[str], where: Path) -> dict[str, Path]:
    """Capture what the links carry, link -> its pcapng (the userspace emulator only; netem's
    are not)."""
    if testbed.read_state().get("backend") != "userspace":
        return {}
    where.mkdir(parents=True, exist_ok=True)
    return {k: Path(p) for k, p in testbed.capture(links, where).items()}


def _layers(pcaps: list[Path], configs: dict[str, Path]) -> dict:
    """The captured link bytes split by layer (perf/capture.py), with what was counted."""
    sp = capture.split_run(pcaps, capture.codecs_of(configs))
    return {
        "bytes": dict(sp.bytes),
        "frames": sp.frames,
        "bundles": sp.bundles,
        "ack_only_bundles": sp.ack_only_bundles,
        "data_envelopes": sp.data_envelopes,
        "retransmitted": sp.retransmitted,
        "unopened": sp.unopened,
        "dropped": sp.dropped,
        "dropped_bytes": sp.dropped_bytes,
    }


def _box_pids(s: Setup) -> list[int]:
    """What the nations run besides their units: the brokers, and the overlay's nodes and BPAs."""
    pids = [p.pid for p in s.procs]  # (ip netns exec and bash exec: the pid is mosquitto's)
    if s.nodes:
        for n, p in s.nodes.procs.items():
            pids.append(p.pid)
            agent = s.nodes.cfg(n).storage / "agent.pid"
            if agent.exists():
                pids.append(int(agent.read_text()))
    return pids


def _usage(pids: list[int]) -> dict[int, tuple[float, int]]:
    """pid -> (CPU seconds used, resident bytes), of those still running."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    out = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        out[pid] = ((int(stat[11]) + int(stat[12])) / tick, rss)
    return out


def _box_use(before: dict[int, tuple[float, int]], after: dict[int, tuple[float, int]]) -> dict:
    return {
        "cpu_s": sum(cpu - before.get(pid, (0.0, 0))[0] for pid, (cpu, _) in after.items()),
        "rss_bytes": sum(rss for _, rss in after.values()),
        "processes": len(after),
    }


def _stop_clients(clients: list, readers: list) -> None:
    """End the MQTT client processes and wait until their readers have taken every line."""
    for c in clients:
        if c.poll() is None:
            c.terminate()
    for c in clients:
        c.wait(30)
    for r in readers:
        r.join(5)


def run_mode(mode: str, plan: Plan, workdir: Path, events: list) -> dict:
    testbed.down()
    st = testbed.up(plan.topology, profile=plan.profile, seed=plan.seed, engine=plan.engine)
    if st.get("backend") != "userspace":  # netem draws its own losses
        console.print(f"[yellow]links on {st.get('backend')}: the seed sets the units' timing, not the losses[/yellow]")
    s = None
    try:
        override_agents(st, plan.agents)
        s = setup(mode, plan, st, workdir / mode)
        if s.nodes:
            for n in s.nodes.paths:
                s.nodes.start(n, wait=False)
            for n in s.nodes.paths:
                s.nodes.wait_ready(n)
        bytes0 = _link_bytes(s.dil_links)
        box = _box_pids(s)
        use0 = _usage(box)
        # the radio links for the report's split; with --pcap every emulated link, into that folder
        links = [k for k, ls in st["links"].items() if ls.get("control")] if plan.pcap else s.dil_links
        where = Path(plan.pcap) / mode if plan.pcap else workdir / mode / "capture"
        captured = _capture(links, where) if plan.capture or plan.pcap else {}
        pcaps = [p for k, p in captured.items() if k in s.dil_links]
        mine: list[dict] = []
        if LIVE.get("view") is not None:  # the drill view follows this mode's reports and nodes
            LIVE["view"].follow(mode, mine, dict(s.nodes.paths) if s.nodes else {})
        clients, readers = [], []
        for node, rx in s.plain_subs:
            c = _client(
                node,
                "sub",
                "--host",
                "127.0.0.1",
                "--topic",
                REPORT_FILTER,
                "--qos",
                str(plan.qos),
                "--timeout",
                str(plan.duration + plan.drain + 10),
                "--client-id",
                f"c2bft-{rx}",
            )
            clients.append(c)
            readers.append(_reader(c, mine, mode, rx))
        time.sleep(1.0)
        for i, (node, nation, host, flt) in enumerate(s.publishers):
            args = [
                "units",
                "--host",
                host,
                "--nation",
                nation,
                "--units",
                str(plan.units),
                "--period",
                str(plan.period),
                "--duration",
                str(plan.duration),
                "--qos",
                str(plan.qos),
                "--timeout",
                str(plan.drain),
                "--client-id",
                "c2bft",
                "--seed",
                str(plan.seed + i),
            ]
            if flt:
                args += ["--subscribe", flt, "--linger", str(plan.drain + 5)]
                if plan.observers:
                    args += ["--observers", str(plan.observers)]
            c = _client(node, *args, module="mqtt_sn" if mode == "mqtt-sn" else "mqtt_clients")
            clients.append(c)
            readers.append(_reader(c, mine, mode))
        t0 = time.monotonic()
        link = "up"
        expected_per_report = {nat: sum(1 for _, rn in s.receivers if rn != nat) for _, nat, _, _ in s.publishers}
        while True:
            t = time.monotonic() - t0
            if plan.outage and link == "up" and plan.outage[0] <= t < plan.outage[1]:
                testbed.change_link(*s.outage_link, "down")
                link = "down"
            elif plan.outage and link == "down" and t >= plan.outage[1]:
                testbed.change_link(*s.outage_link, "up")
                link = "up"
            snap = list(mine)
            sent = [e for e in snap if e.get("ev") == "sent"]
            due = sum(expected_per_report.get(e["nation"], 0) for e in sent)
            got = sum(1 for e in snap if e.get("ev") == "recv" and "id" in e and e["from"] != e["rx_nation"])
            line = (
                f"{mode:12s} t={t:5.0f} s  link {link:4s}  reports sent {len(sent):5d}  deliveries {got:6d} of {due:6d}"
            )
            if console.is_terminal:
                console.print("\r" + line, end="", highlight=False)
            elif int(t) % 10 == 0:  # a log file gets a line every 10 s
                console.print(line, highlight=False)
            if t >= plan.duration and (got >= due or t >= plan.duration + plan.drain):
                break
            time.sleep(1.0)
        console.print()
        info = {
            "mode": mode,
            "supersedes": s.supersedes,
            "receivers": s.receivers,
            "link_bytes_by_dir": {k: v - bytes0.get(k, 0) for k, v in _link_bytes(s.dil_links).items()},
            "dil_links": s.dil_links,
            "link_bps": sum((st["links"][k].get("profile_ab") or {}).get("rate_bps") or 0 for k in s.dil_links),
            "run_s": time.monotonic() - t0,
            "box": _box_use(use0, _usage(box)),
        }
        info["link_bytes"] = sum(info["link_bytes_by_dir"].values())
        if captured:
            testbed.capture(list(captured), None)
        if pcaps:
            info["layers"] = _layers(pcaps, s.nodes.paths if s.nodes else {})
        if s.nodes:
            status = {n: s.nodes.status(n) for n in s.nodes.gateways}
            info["gateway_counters"] = {n: st_.get("mqtt", {}).get("counters", {}) for n, st_ in status.items()}
            info["overlay_counters"] = {n: st_.get("counters", {}) for n, st_ in status.items()}
        _stop_clients(clients, readers)
        events.extend(mine)
        return info
    finally:
        if plan.outage and s is not None:
            testbed.change_link(*s.outage_link, "up")
        if s is not None:
            if s.nodes:
                s.nodes.stop_all()
            for p in s.procs:
                p.terminate()
            for p in s.procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:  # (the MQTT-SN gateway's threads can hang on SIGTERM)
                    p.kill()
                    p.wait(5)
        testbed.down()


# -- figures ------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(events: list[dict], mode: str, info: dict, period: float = 2.0) -> dict:
    receivers = [tuple(r) for r in info["receivers"]]
    sent = {e["id"]: e for e in events if e["mode"] == mode and e.get("ev") == "sent"}
    unit_of = {mid: mid.rsplit("_", 1)[0] for mid in sent}
    seq_of = {mid: int(mid.rsplit("_", 1)[1]) for mid in sent}
    first: dict[tuple[str, str], float] = {}  # (rx, id) -> receipt time
    ts: dict[str, float] = {}
    dup = 0
    for e in events:
        if e["mode"] != mode or e.get("ev") != "recv" or "id" not in e or e["id"] not in sent:
            continue
        if e["from"] == e["rx_nation"]:
            continue  # the nation's own LAN: not across a link
        k = (e["rx"], e["id"])
        if k in first:
            dup += 1
            continue
        first[k] = e["t"]
        ts[e["id"]] = e["ts"]
    expected = [(rx, mid) for mid, e in sent.items() for rx, rn in receivers if rn != e["nation"]]
    delivered = [k for k in expected if k in first]
    delays = sorted(first[k] - ts[k[1]] for k in delivered)
    newest: dict[tuple[str, str], int] = {}  # (rx, unit) -> newest seq delivered
    for rx, mid in delivered:
        key = (rx, unit_of[mid])
        newest[key] = max(newest.get(key, 0), seq_of[mid])
    sup = None
    if info.get("supersedes"):
        sup = sum(
            1 for rx, mid in expected if (rx, mid) not in first and newest.get((rx, unit_of[mid]), 0) > seq_of[mid]
        )
    lost = len(expected) - len(delivered) - (sup or 0)
    last_sent = max((e["t"] for e in sent.values()), default=0.0)
    in_drain = sum(1 for k in delivered if first[k] > last_sent)  # arrived after the last report was sent
    ages, series = age_of_information(sent, first, ts, receivers, period)
    report_bytes = 230  # a seed 000 report is about 255 characters; ours are 226-232
    reached = {mid for _, mid in delivered}
    link_bps, run_s = info.get("link_bps") or 0, info.get("run_s") or 0
    return {
        "mode": mode,
        "sent": len(sent),
        "expected": len(expected),
        "delivered": len(delivered),
        "duplicates": dup,
        "superseded": sup,
        "lost": lost,
        "in_drain": in_drain,
        "lost_pct": 100 * lost / len(expected) if expected else 0.0,
        "delay_min_s": delays[0] if delays else None,
        "delay_median_s": statistics.median(delays) if delays else None,
        "delay_p95_s": _pct(delays, 0.95),
        "delay_max_s": delays[-1] if delays else None,
        "aoi_mean_s": statistics.fmean(ages) if ages else None,
        "aoi_p95_s": _pct(ages, 0.95),
        "newest_age_max_s": _newest_age_max(sent, delivered, ts, receivers),
        "link_bytes": info.get("link_bytes"),
        "link_bytes_by_dir": info.get("link_bytes_by_dir"),
        "link_bytes_per_delivery": info["link_bytes"] / len(delivered)
        if delivered and info.get("link_bytes")
        else None,
        # what one report costs its sender's uplink (the links' a-to-b direction, the rated one),
        # whoever receives it: the bytes that went up, over the reports sent
        "uplink_bytes_per_report": sum(v for k, v in (info.get("link_bytes_by_dir") or {}).items() if k.endswith(" ab"))
        / len(sent)
        if sent and info.get("link_bytes_by_dir")
        else None,
        "layers": info.get("layers"),
        "goodput_fraction": len(reached) * report_bytes * 8 / (link_bps * run_s) if link_bps and run_s else None,
        "aoi_series": series,
        # each gateway's own counters (overlay custody and MQTT), for tracing a figure back
        "counters": {
            n: {"overlay": info.get("overlay_counters", {}).get(n, {}), "mqtt": c}
            for n, c in (info.get("gateway_counters") or {}).items()
        },
    }


def _newest_age_max(sent: dict, delivered: list, ts: dict, receivers: list) -> float | None:
    """At the end of the run, the oldest 'newest position' any receiver holds of any unit of
    another nation, against the last report sent (a unit never heard of counts from its first report)."""
    if not sent:
        return None
    last_sent = max(e["t"] for e in sent.values())
    have: dict[tuple[str, str], float] = {}
    for rx, mid in delivered:
        k = (rx, mid.rsplit("_", 1)[0])
        have[k] = max(have.get(k, 0.0), ts[mid])
    first_of: dict[str, tuple[float, str]] = {}
    for mid, e in sent.items():
        u = mid.rsplit("_", 1)[0]
        if u not in first_of or e["t"] < first_of[u][0]:
            first_of[u] = (e["t"], e["nation"])
    return max(
        (last_sent - have.get((rx, u), t0) for rx, rn in receivers for u, (t0, nat) in first_of.items() if nat != rn),
        default=None,
    )


def age_of_information(
    sent: dict, first: dict, ts: dict, receivers: list, period: float
) -> tuple[list[float], list[tuple[float, float, float]]]:
    """Samples (one per second, per receiver and unit of another nation) of now - timestamp of
    the newest report of that unit the receiver holds; and per second (t, mean, max)."""
    if not sent:
        return [], []
    units: dict[str, list[dict]] = defaultdict(list)
    for mid, e in sent.items():
        units[mid.rsplit("_", 1)[0]].append(e)
    got: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)  # (rx, unit) -> [(t, ts)]
    for (rx, mid), t in first.items():
        got[(rx, mid.rsplit("_", 1)[0])].append((t, ts[mid]))
    t0 = min(e["t"] for e in sent.values())
    t_end = max(e["t"] for e in sent.values())
    grid = [t0 + period + i for i in range(int(t_end - t0 - period) + 1)]
    per_t: dict[float, list[float]] = defaultdict(list)
    samples = []
    for rx, rn in receivers:
        for u, es in units.items():
            if es[0]["nation"] == rn:
                continue
            start = min(e["t"] for e in es)
            recs = sorted(got.get((rx, u), []))
            i, best = 0, None
            for t in grid:
                while i < len(recs) and recs[i][0] <= t:
                    best = recs[i][1] if best is None else max(best, recs[i][1])
                    i += 1
                age = t - (best if best is not None else start)
                samples.append(age)
                per_t[t].append(age)
    series = [(t - t0, statistics.fmean(v), max(v)) for t, v in sorted(per_t.items())]
    return samples, series


def _fmt(v, unit="s", nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f} {unit}".strip()


def _delay(r: dict) -> str:
    if r["delay_median_s"] is None:
        return "-"
    return " / ".join(f"{r[k]:.1f}" for k in ("delay_min_s", "delay_median_s", "delay_p95_s", "delay_max_s")) + " s"


def _aoi(r: dict) -> str:
    return "-" if r["aoi_mean_s"] is None else f"{r['aoi_mean_s']:.1f} / {r['aoi_p95_s']:.1f} s"


# One row per figure, one column per mode: full names that fit 100 columns, the same
# table on the terminal, in report.md and in the README.
FIGURES: list[tuple[str, object]] = [
    ("reports sent", lambda r: str(r["sent"])),
    ("deliveries due (receiver x report)", lambda r: str(r["expected"])),
    ("delivered", lambda r: str(r["delivered"])),
    ("  of them after the last report was sent", lambda r: str(r.get("in_drain", "-"))),
    ("superseded (a newer report arrived)", lambda r: "-" if r["superseded"] is None else str(r["superseded"])),
    ("not delivered by the end of the drain", lambda r: f"{r['lost']} ({r['lost_pct']:.1f} %)"),
    ("delay min / median / p95 / max", _delay),
    ("age of information mean / p95", _aoi),
    ("link bytes per delivery", lambda r: _fmt(r["link_bytes_per_delivery"], "B", 0)),
    ("uplink bytes per report sent", lambda r: _fmt(r.get("uplink_bytes_per_report"), "B", 0)),
    ("goodput / link capacity", lambda r: _fmt(r["goodput_fraction"], "", 2)),
]


def figure_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's table: a row per figure, a column per mode."""
    return ["figure"] + [r["mode"] for r in rows], [[name] + [fn(r) for r in rows] for name, fn in FIGURES]


def _where(plan: Plan) -> str:
    if plan.topology == "nps-chain":
        return f"{plan.units} units on h1 reporting to the broker on h4"
    return f"{plan.units} units per nation"


def _place(plan: Plan, nation: str) -> str:
    """How plots name a sender or receiver: on nps-chain, the hosts (the units' nation is
    only a topic level there)."""
    return "h1" if plan.topology == "nps-chain" and nation == "NOR" else nation


def title_of(plan: Plan) -> str:
    return (
        f"BFT on {plan.topology}: {_where(plan)}, report every {plan.period:g} s for "
        f"{plan.duration:g} s (drain {plan.drain:g} s), QoS {plan.qos}, links {plan.profile}"
        + (f", link down {plan.outage[0]:g}-{plan.outage[1]:g} s" if plan.outage else "")
        + (f", on {plan.engine}" if plan.engine != "namespaces" else "")
        + (
            ", agent " + ", ".join(f"{k}" if n == "*" else f"{n}={k}" for n, k in sorted(plan.agents.items()))
            if plan.agents
            else ""
        )
        + (", scheduler " + ", ".join(f"{k}={v}" for k, v in sorted(plan.scheduler.items())) if plan.scheduler else "")
        + (f", seed {plan.seed}" if plan.seed != Plan.seed else "")
    )


def report(out: Path, plan: Plan, events: list[dict], rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    title = title_of(plan)
    header, table = figure_rows(rows)
    t = Table(title=title)
    for i, c in enumerate(header):
        t.add_column(c, justify="left" if i == 0 else "right")
    md = ["# " + title, "", "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for cells in table:
        t.add_row(*cells)
        md.append(
            "| " + " | ".join(c.replace("  ", "&nbsp;&nbsp;", 1) if c.startswith("  ") else c for c in cells) + " |"
        )
    console.print(t)
    md += layer_table(rows)
    md += [
        "",
        "Deliveries count receiver x report pairs across an emulated link. superseded (modes that "
        "supersede): not delivered, but a newer report of the same unit reached that receiver. Not delivered = "
        "due - delivered - superseded, counted when the drain ended (a report still on its way then counts "
        "here; 'after the last report was sent' shows how many came in the drain). Delay = receipt - the report's timestamp. AoI: at each second, for each "
        "receiver and unit of another nation, now - timestamp of the newest report held. Every figure is "
        "computed from events.jsonl.",
        "",
        "![delay of each delivery](plot.png)",
        "",
        "![delay per sender and receiver nation](delay_box.png)",
        "",
        "![age of information](aoi.png)",
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps({"plan": asdict(plan), "modes": rows}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(
            fh,
            fieldnames=[k for k in rows[0] if k not in ("aoi_series", "counters", "link_bytes_by_dir", "layers")],
            extrasaction="ignore",
        )
        w.writeheader()
        w.writerows(rows)
    plots(out, plan, events, rows)
    console.print(f"results in {out}")


def layer_table(rows: list[dict]) -> list[str]:
    """Markdown lines: the captured link bytes per layer and per delivery, a column per mode."""
    have = [r for r in rows if r.get("layers")]
    if not have:
        return []
    keys = [(k, name) for k, name in capture.LAYERS if any(r["layers"]["bytes"].get(k) for r in have)]
    md = [
        "",
        "## Where the link bytes go",
        "",
        "From captures of what the emulated links delivered, both ways, split by layer (perf/capture.py); "
        "bytes per delivery (receiver x report pair). The captures are beside this report "
        "(`<mode>-<link>.pcapng`, one interface per direction, the frames the emulator dropped in them too, "
        "each with a comment saying why: Wireshark shows them with `frame.comment`); the envelopes in them "
        "were opened with the run's keys, which did not outlive it.",
        "",
        "| layer | " + " | ".join(r["mode"] for r in have) + " |",
        "|---|" + "---:|" * len(have),
    ]
    for k, name in keys + [("", "all")]:
        cells = []
        for r in have:
            b = r["layers"]["bytes"]
            v = sum(b.values()) if not k else b.get(k, 0)
            cells.append(f"{v / r['delivered']:.1f}" if r["delivered"] else "-")
        md.append(f"| {name} | " + " | ".join(cells) + " |")
    counts = "; ".join(
        f"{r['mode']}: {r['layers']['frames']:,} frames, {r['layers']['bundles']:,} bundles "
        f"({r['layers']['ack_only_bundles']:,} of acks alone), {r['layers']['data_envelopes']:,} data envelopes "
        f"and {r['layers']['retransmitted']:,} retransmitted; "
        f"{r['layers'].get('dropped', 0):,} frames ({r['layers'].get('dropped_bytes', 0):,} bytes) dropped by the "
        "emulator, not counted above"
        for r in have
    )
    md += ["", f"Counted: {counts}."]
    return md


def _deliveries(events: list[dict], mode: str) -> list[tuple[str, str, float, float]]:
    """(sender nation, receiver nation, sent at, delay) of each first delivery across a link."""
    sent = {e["id"]: e for e in events if e["mode"] == mode and e.get("ev") == "sent"}
    seen, out = set(), []
    for e in events:
        if (
            e["mode"] == mode
            and e.get("ev") == "recv"
            and e.get("id") in sent
            and e["from"] != e["rx_nation"]
            and (e["rx"], e["id"]) not in seen
        ):
            seen.add((e["rx"], e["id"]))
            out.append((e["from"], e["rx_nation"], e["ts"], e["t"] - e["ts"]))
    return out


def _finish(fig, ax, plan: Plan, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """A plot over the run's time: the outage shaded, labels, legend, saved and closed."""
    if plan.outage:
        ax.axvspan(*plan.outage, color="grey", alpha=0.2, label="link down")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left")
    save_figure(fig, path)


def plots(out: Path, plan: Plan, events: list[dict], rows: list[dict]) -> None:
    plt = pyplot()

    modes = [r["mode"] for r in rows]
    t0 = min((e["t"] for e in events if e.get("ev") == "sent"), default=0.0)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for mode, marker in zip(modes, "os^"):
        d = _deliveries(events, mode)
        t0m = min((e["t"] for e in events if e["mode"] == mode and e.get("ev") == "sent"), default=t0)
        r = next(x for x in rows if x["mode"] == mode)
        ax.scatter(
            [x[2] - t0m for x in d],
            [x[3] for x in d],
            s=8,
            marker=marker,
            label=f"{mode}: {r['delivered']}/{r['expected']} delivered",
        )
    _finish(
        fig,
        ax,
        plan,
        out / "plot.png",
        "report sent at (s into the run)",
        "delay to the receiver (s)",
        "Delay of each position report delivery",
    )

    fig, ax = plt.subplots(figsize=(10, 4.5))
    data, labels = [], []
    for mode in modes:
        groups: dict[str, list[float]] = defaultdict(list)
        for a, b, _, d in _deliveries(events, mode):
            groups[f"{_place(plan, a)}->{_place(plan, b)}"].append(d)
        for g in sorted(groups):
            data.append(groups[g])
            labels.append(f"{mode}\n{g}")
    if data:
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(labels) + 1), labels)
    ax.set_ylabel("delay (s)")
    ax.set_title("Delay per sender -> receiver nation")
    ax.tick_params(axis="x", labelsize=7)
    save_figure(fig, out / "delay_box.png")

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in rows:
        if r["aoi_series"]:
            xs, mean, mx = zip(*r["aoi_series"])
            (line,) = ax.plot(xs, mean, label=f"{r['mode']}: mean")
            ax.plot(xs, mx, ls="--", color=line.get_color(), label=f"{r['mode']}: worst pair")
    _finish(
        fig,
        ax,
        plan,
        out / "aoi.png",
        "time into the run (s)",
        "age of newest position held (s)",
        "Age of information: each unit's newest position at each receiver",
    )


# the drill view of this run (--view), when there is one (topologies/view.py)
LIVE: dict = {}


def main(plan: Plan, modes: list[str]) -> Path:
    out = run_dir("bft")
    events: list[dict] = []
    infos = []
    if plan.view:
        from c2dtn.topologies.view import Live

        LIVE["view"] = Live(plan.view, "bft", plan.period)
        LIVE["view"].start()
        console.print(f"drill view on http://127.0.0.1:{plan.view}/")
    with tempfile.TemporaryDirectory() as td:
        try:
            for mode in modes:
                console.print(f"[bold]{mode}[/bold]: starting")
                infos.append(run_mode(mode, plan, Path(td), events))
        finally:
            if LIVE.get("view") is not None:
                LIVE.pop("view").stop()
        for mode in modes:  # the captures the layer split was read from, beside the report
            folder = Path(plan.pcap) / mode if plan.pcap else Path(td) / mode / "capture"
            dil = {n for i in infos if i["mode"] == mode for n in i.get("dil_links", [])}
            for pcap in sorted(folder.glob("*.pcapng")):
                if pcap.stem in dil:
                    shutil.copyfile(pcap, out / f"{mode}-{pcap.name}")
    rows = [summarize(events, i["mode"], i, plan.period) for i in infos]
    report(out, plan, events, rows)
    return out
