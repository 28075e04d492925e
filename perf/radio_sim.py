"""Two overlay cores across an emulated radio, in virtual time (I/O-free).

The scheduler's benchmark and tests on the radio without namespaces, agents or the wall
clock: gw1 and gw4 are OverlayCores on in-memory stores; each bundle they hand over becomes
one frame of its payload plus `frame_overhead` bytes (the agent's bundle blocks and the
UDP, IP and Ethernet headers) on a topologies.channel Direction, the same core the
testbed's emulator runs (rate on the whole frame, loss decided when a frame is offered,
a tail-drop transmit queue, delay).  Time jumps from one deadline to the next, so a
20-minute overload runs in seconds and every run with the same seed is the same run.

Three workloads, the radio parts of `perf overlay`, `perf overload` and `make demo`:
- bulk(): `count` incompressible envelopes of `body` bytes at once; goodput is their
  bytes over the time from submit to the last delivery, as a share of the link's rate;
- overload(): `units` position reports ("priority", superseded per unit) offering
  `factor` times the link, and an "immediate" order every `order_every_s`; each order's
  latency and the positions' age of information at the receiver;
- reports(): `units` position reports every `period_s` in the MQTT gateway's body, superseded
  per unit; link bytes per delivered report (frames whole, both ways) and their age (main()
  runs it at the demo's 2 s and at 10 s, where a lost report is not superseded soon);
- fmn(): fmn-4nations: each nation's reports to the group of the other three; all a nation
  sends (reports, acks) crosses its own radio uplink (a loss there is every member's), then a
  LAN to each destination, as the topology's reverse_profile has it; the reports' ages.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import Custody, Quota
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store import open_store
from c2dtn.topologies.channel import Direction, LinkActivity
from c2dtn.topologies.profiles import Profile, load_builtin_profiles

KEY = b"s" * 32
# what a bundle of a dtn7-rs agent costs on the radio beyond its payload: its blocks as udphc
# sends them (21 bytes, decision 0034) and the UDP, IP and Ethernet headers (42), as a capture of
# the radio hop shows them (docs/perf/radio-sim.md)
FRAME_OVERHEAD = 63
# the scheduler settings `c2dtn node configs` writes for a node behind a radio link
RADIO_CFG = SchedulerConfig(aggregate_bytes=1200, linger_ms=1500, ack_delay_ms=250)


def profile(name: str = "cnr-tactical-2") -> Profile:
    return load_builtin_profiles().get(name, "radio_sim", "profile")


@dataclass
class Radio:
    """gw1 and gw4 and the link between them; step() runs virtual time to a deadline."""

    link: Profile
    seed: int
    cfg: SchedulerConfig = RADIO_CFG
    frame_overhead: int = FRAME_OVERHEAD
    now_ms: int = 0
    delivered: dict[str, list] = field(default_factory=lambda: {"gw1": [], "gw4": []})  # (ms, Delivery)

    def __post_init__(self) -> None:
        self.cores = {
            a: OverlayCore(Custody(open_store("memory"), a, Quota()), Codec(a, {b: KEY}), self.cfg)
            for a, b in (("gw1", "gw4"), ("gw4", "gw1"))
        }
        # the testbed seeds a link's two directions with seed and seed + 1
        shared = LinkActivity()  # one link: either way keeps it up (Profile.link_idle_s)
        self.dirs = {
            "gw4": Direction(self.link, self.seed, activity=shared),
            "gw1": Direction(self.link, self.seed + 1, activity=shared),
        }
        self.frames = {"gw4": 0, "gw1": 0}  # frames offered toward each node
        self.frame_bytes = {"gw4": 0, "gw1": 0}
        self.envelopes = {"gw4": 0, "gw1": 0}  # data envelopes offered toward each node (copies count)
        self.seqs: dict[str, set[int]] = {"gw4": set(), "gw1": set()}  # ... of them, each once

    def _send(self, node: str) -> None:
        for b in self.cores[node].poll(self.now_ms):
            frame = b.payload + bytes(self.frame_overhead)
            self.frames[b.dst] += 1
            self.envelopes[b.dst] += len(b.seqs)
            self.seqs[b.dst].update(b.seqs)
            self.frame_bytes[b.dst] += len(frame)
            self.dirs[b.dst].offer(frame, self.now_ms / 1000)

    def _receive(self, node: str) -> bool:
        frames = self.dirs[node].due(self.now_ms / 1000)
        core = self.cores[node]
        for f in frames:
            core.on_bundle(f[: len(f) - self.frame_overhead], self.now_ms)
        items = core.take()
        if items:
            self.delivered[node].extend((self.now_ms, d) for d in items)
            core.consumed([d.id for d in items], self.now_ms)
        return bool(frames)

    def step(self, until_ms: int) -> None:
        """Run until until_ms: at each moment, deliver what the link has due, then let both
        cores send; then jump to the next deadline (a core's wake-up or a frame's arrival)."""
        while True:
            for node in self.cores:
                self._receive(node)
            for node in self.cores:
                self._send(node)
            nexts = [until_ms]
            for node, core in self.cores.items():
                w = core.next_wakeup_ms()
                if w is not None:
                    nexts.append(w)
                d = self.dirs[node].next_deadline()
                if d is not None:
                    nexts.append(int(d * 1000) + (d * 1000 % 1 > 0))  # no earlier than it is due
            nxt = max(self.now_ms + 1, min(nexts))
            if self.now_ms >= until_ms:
                return
            self.now_ms = min(nxt, until_ms)


def bulk(seed: int, count: int = 60, body: int = 1000, link: str = "cnr-tactical-2", **kw) -> dict:
    """`perf overlay`'s radio run: goodput of `count` envelopes of `body` random bytes."""
    r = Radio(profile(link), seed, **kw)
    rng = random.Random(seed)
    for _ in range(count):
        r.cores["gw1"].submit("gw4", rng.randbytes(body), 0)
    while len(r.delivered["gw4"]) < count and r.now_ms < 3600_000:
        r.step(r.now_ms + 1000)
    secs = max(t for t, _ in r.delivered["gw4"]) / 1000
    rate = r.link.rate_bps or 0
    return {
        "seed": seed,
        "seconds": secs,
        "fraction": count * body * 8 / secs / rate,
        "frames": r.frames["gw4"],
        "frame_bytes": r.frame_bytes["gw4"],
        "delivered": len(r.delivered["gw4"]),
        "counters": dict(r.cores["gw1"].store.counters()),
    }


REPORT_BYTES = 214
ORDER_BYTES = 200


def overload(
    seed: int,
    minutes: float = 10.0,
    factor: float = 3.0,
    units: int = 24,
    order_every_s: float = 10.0,
    link: str = "cnr-tactical-2",
    drain_s: float = 120.0,
    **kw,
) -> dict:
    """`perf overload`'s traffic: order latencies and the positions' ages at the receiver."""
    r = Radio(profile(link), seed, **kw)
    rate = r.link.rate_bps or 0
    period_ms = units * REPORT_BYTES * 8 / (factor * rate) * 1000
    rng = random.Random(seed)
    end = int(minutes * 60_000)
    events: list[tuple[int, int, int]] = []  # (ms, kind 0 order / 1 report, unit)
    for u in range(units):
        t0 = rng.uniform(0, period_ms)
        events += [(int(t0 + k * period_ms), 1, u) for k in range(int((end - t0) // period_ms) + 1)]
    events += [(int(o * order_every_s * 1000), 0, o) for o in range(1, int(end / 1000 / order_every_s))]
    events.sort()
    gw1 = r.cores["gw1"]
    sent_orders: dict[bytes, int] = {}
    for t, kind, n in events:
        r.step(t)
        if kind == 0:
            body = b"order %06d " % n
            body += rng.randbytes(ORDER_BYTES - len(body))
            sent_orders[body[:12]] = t
            gw1.submit("gw4", body, t, 86400_000, Priority.IMMEDIATE)
        else:
            body = b"pos %03d %09d " % (n, t)
            body += rng.randbytes(REPORT_BYTES - len(body))
            gw1.submit("gw4", body, t, 600_000, Priority.PRIORITY, supersede=f"unit{n}")
    r.step(end)
    busy = r.dirs["gw4"].stats.delivered_bytes * 8 / (end / 1000) / rate  # frames that arrived, while loaded
    ages = _ages(r.delivered["gw4"], units, min(60_000, end // 2), end)  # after a warm-up
    r.step(end + int(drain_s * 1000))
    got = {d.body[:12]: t for t, d in r.delivered["gw4"] if d.body.startswith(b"order")}
    lat = sorted((got[k] - t) / 1000 for k, t in sent_orders.items() if k in got)
    return {
        "seed": seed,
        "orders": len(sent_orders),
        "orders_lost": len(sent_orders) - len(lat),
        "order_p50_s": statistics.median(lat) if lat else None,
        "order_p95_s": _p95(lat),
        "order_max_s": lat[-1] if lat else None,
        "aoi_p95_s": _p95(ages),
        "reports_delivered": sum(1 for _, d in r.delivered["gw4"] if d.body.startswith(b"pos")),
        "frames": r.frames["gw4"],
        "frame_bytes": r.frame_bytes["gw4"],
        "link_share": busy,
    }


def reports(
    seed: int, units: int = 8, period_s: float = 2.0, minutes: float = 2.0, link: str = "cnr-tactical-2", **kw
) -> dict:
    """`make demo`'s traffic without its outage: `units` position reports every `period_s` (each
    unit at its own phase), in the MQTT gateway's body, "priority" (as perf bft marks them) and
    superseded per unit; link bytes (both ways, frames whole) per delivered report, envelopes
    per bundle, and the reports' ages."""
    r = Radio(profile(link), seed, **kw)
    rng = random.Random(seed)
    end = int(minutes * 60_000)
    plan = _report_plan(rng, units, period_s, minutes, "NOR")
    gw1 = r.cores["gw1"]
    stamps: dict[int, int] = {}
    unit_of: dict[int, int] = {}
    for t, u, topic, body in plan:
        r.step(t)
        seq = gw1.submit("gw4", body, t, 600_000, Priority.PRIORITY, supersede="mqtt:" + topic, app="mqtt")
        stamps[seq] = t
        unit_of[seq] = u
    r.step(end + 30_000)
    got = [(t, d) for t, d in r.delivered["gw4"]]
    delays = sorted((t - stamps[d.seq]) / 1000 for t, d in got if d.seq in stamps)
    arrivals = sorted((t, unit_of[d.seq], stamps[d.seq]) for t, d in got if d.seq in stamps)
    ages = _report_ages(arrivals, units, end)
    frames = r.frames["gw4"] + r.frames["gw1"]
    link_bytes = r.dirs["gw4"].stats.delivered_bytes + r.dirs["gw1"].stats.delivered_bytes
    return {
        "seed": seed,
        "sent": len(plan),
        "delivered": len(got),
        "bytes_per_report": link_bytes / len(got) if got else None,
        "frames": frames,
        "envelopes_per_bundle": r.envelopes["gw4"] / max(1, r.frames["gw4"]),
        "bundles_of_acks_alone": r.frames["gw1"],
        # envelopes that went more than once (retransmissions and tail probes)
        "resent": r.envelopes["gw4"] - len(r.seqs["gw4"]),
        "delay_p95_s": _p95(delays),
        "delay_median_s": statistics.median(delays) if delays else None,
        "aoi_p95_s": _p95(ages),
        "units": units,
        # units whose last report arrived (by the end of the drain)
        "newest_delivered": len({u for _, u, stamp in arrivals if stamp == max(t for t, v, *_ in plan if v == u)}),
    }


def demo(
    seed: int,
    units: int = 8,
    period_s: float = 2.0,
    seconds: int = 100,
    cut_s: tuple[int, int] | None = (20, 80),
    drain_s: int = 60,
    link: Profile | None = None,
    **kw,
) -> dict:
    """`make demo` itself: `units` reports every `period_s` for `seconds`, the radio down (both
    ways) from cut_s[0] to cut_s[1], `drain_s` after the last report; link bytes (frames whole,
    both ways, those that arrived) per delivered report, as the demo counts them on the testbed."""
    r = Radio(link or profile(), seed, **kw)
    rng = random.Random(seed)
    plan = _report_plan(rng, units, period_s, seconds / 60, "NOR")
    end = seconds * 1000 + drain_s * 1000
    cuts = [(cut_s[0] * 1000, False), (cut_s[1] * 1000, True)] if cut_s else []
    gw1 = r.cores["gw1"]
    stamps: dict[int, tuple[int, int]] = {}  # seq -> (stamp, unit)
    arrived_in_cut = 0  # frames that arrived while the radio was down (none should)

    def cut_until(t: int) -> None:
        nonlocal arrived_in_cut
        while cuts and cuts[0][0] <= t:
            at, up = cuts.pop(0)
            r.step(at)
            arrived = sum(d.stats.delivered for d in r.dirs.values())
            arrived_in_cut += arrived if up else -arrived
            for d in r.dirs.values():
                d.set_up(up, at / 1000)

    for t, u, topic, body in plan:
        cut_until(t)
        r.step(t)
        seq = gw1.submit("gw4", body, t, 600_000, Priority.PRIORITY, supersede="mqtt:" + topic, app="mqtt")
        stamps[seq] = (t, u)
    cut_until(end)  # a cut that ends in the drain ends there
    r.step(end)
    got = [(t, d) for t, d in r.delivered["gw4"] if d.seq in stamps]
    delays = sorted((t - stamps[d.seq][0]) / 1000 for t, d in got)
    last = {u: t for t, u, *_ in plan}  # each unit's last report
    link_bytes = r.dirs["gw4"].stats.delivered_bytes + r.dirs["gw1"].stats.delivered_bytes
    return {
        "seed": seed,
        "sent": len(plan),
        "delivered": len(got),
        "link_bytes": link_bytes,
        "data_bytes": r.dirs["gw4"].stats.delivered_bytes,
        "ack_bytes": r.dirs["gw1"].stats.delivered_bytes,
        "bytes_per_report": link_bytes / len(got) if got else None,
        "data_frames": r.dirs["gw4"].stats.delivered,
        "ack_frames": r.dirs["gw1"].stats.delivered,
        "arrived_in_cut": arrived_in_cut,
        # units whose last report arrived by the end of the drain
        "newest_delivered": len({stamps[d.seq][1] for _, d in got if stamps[d.seq][0] == last[stamps[d.seq][1]]}),
        "delay_p95_s": _p95(delays),
    }


def _report_plan(rng: random.Random, units: int, period_s: float, minutes: float, nation: str) -> list:
    """(ms, unit, topic, body) of `units` units reporting every `period_s`, each at its own phase,
    in the MQTT gateway's body (as perf bft's units publish them)."""
    from c2dtn.ip_gateway import bodies
    from c2dtn.perf.train_dict import position_report, report_times, report_topic

    times = report_times(rng, units, period_s, minutes * 60)
    pos = {u: (59.9 + rng.random() / 10, 10.7 + rng.random() / 10) for u in range(1, units + 1)}
    n = dict.fromkeys(pos, 0)
    out = []
    for ts, u in times:
        t = int(ts * 1000)
        n[u] += 1
        lat, lon = pos[u]
        pos[u] = (lat + rng.uniform(-1e-4, 1e-4), lon + rng.uniform(-1e-4, 1e-4))
        topic = report_topic(nation, u, u)
        p = position_report(nation, u, u, n[u], t, lat, lon)
        body = bodies.pack("pub", f"c2bft-{nation}-{u}", "10.0.4.2:1883", t=topic, p=p, q=1, r=False, x={})
        out.append((t, u, topic, body))
    return out


def _report_ages(arrivals: list[tuple[int, int, int]], units: int, end_ms: int) -> list[float]:
    """Age of information from (ms, unit, stamp) arrivals at one receiver: each second after the
    first minute's tenth, the age of each unit's newest report there."""
    newest: dict[int, int] = {}
    ages: list[float] = []
    i = 0
    for at in range(6000, end_ms + 1, 1000):
        while i < len(arrivals) and arrivals[i][0] <= at:
            newest[arrivals[i][1]] = max(newest.get(arrivals[i][1], 0), arrivals[i][2])
            i += 1
        ages += [(at - newest[u]) / 1000 for u in range(1, units + 1) if u in newest]
    return ages


def fmn(
    seed: int,
    units: int = 8,
    period_s: float = 2.0,
    minutes: float = 2.0,
    nations: int = 4,
    uplink: Profile | None = None,
    frame_overhead: int = FRAME_OVERHEAD,
    consume_ms: int = 0,
    **kw,
) -> dict:
    """fmn-4nations in virtual time: each of `nations` gateways sends its `units` reports every
    `period_s` to the group of the others (each taken by its application `consume_ms` after it
    arrived: on the testbed the gateway's broker answers first).  Whatever a nation sends (its reports, its acks of the
    others') crosses its own `cnr-tactical-2` uplink to tacnet once (a frame lost there is lost to
    every member), then a LAN to each destination (the topology's reverse_profile).  The reports'
    ages at every other nation, and the uplink bytes per report sent."""
    import hashlib

    cfg = kw.get("cfg", RADIO_CFG)
    nodes = [f"n{i}" for i in range(nations)]

    def key(a: str, b: str) -> bytes:
        return hashlib.sha256("-".join(sorted((a, b))).encode()).digest()

    def core(name: str) -> OverlayCore:
        groups = {"fmn": tuple(n for n in nodes if n != name)}
        codec = Codec(name, {n: key(name, n) for n in nodes if n != name} | {"fmn": KEY}, groups)
        return OverlayCore(Custody(open_store("memory"), name, Quota(), groups=groups), codec, cfg)

    cores = {n: core(n) for n in nodes}
    lan = profile("lan")
    # a link's two directions draw from seed and seed + 1, as on the testbed; a nation's link from
    # seed + 10 i here (the testbed's link i: seed + 2 i), so seeds 10 apart share draws
    up = {n: Direction(uplink or profile(), seed + 10 * i) for i, n in enumerate(nodes)}
    down = {n: Direction(lan, seed + 10 * i + 1) for i, n in enumerate(nodes)}
    rng = random.Random(seed)
    end = int(minutes * 60_000)
    plan = sorted(
        (t, k, u, topic, body)
        for k in range(nations)
        for t, u, topic, body in _report_plan(rng, units, period_s, minutes, f"N{k}")
    )
    sent: dict[tuple[str, int], tuple[int, int]] = {}  # (origin, seq) -> (stamp, unit)
    got: dict[str, list] = {n: [] for n in nodes}
    now = i = 0
    taking: list[tuple[int, str, list[int]]] = []  # (when, node, ids) the application takes
    while now <= end + 30_000:
        while i < len(plan) and plan[i][0] <= now:
            t, k, u, topic, body = plan[i]
            i += 1
            seq = cores[nodes[k]].submit(
                "fmn", body, t, 600_000, Priority.PRIORITY, supersede="mqtt:" + topic, app="mqtt"
            )
            sent[(nodes[k], seq)] = (t, u)
        for n in nodes:
            for f in up[n].due(now / 1000):  # at tacnet: on to the group's members, or to one node
                dst = nodes[f[-1]] if f[-1] < nations else None
                for m in nodes:
                    if m != n and dst in (None, m):
                        down[m].offer(f, now / 1000)
        for n in nodes:
            for f in down[n].due(now / 1000):
                cores[n].on_bundle(f[: len(f) - frame_overhead], now)
            waiting = {x for j in taking if j[1] == n for x in j[2]}  # taken, not yet consumed
            items = [d for d in cores[n].take() if d.id not in waiting]
            if items:
                got[n] += [(now, d) for d in items]
                taking.append((now + consume_ms, n, [d.id for d in items]))
            for job in [j for j in taking if j[0] <= now and j[1] == n]:
                taking.remove(job)
                cores[n].consumed(job[2], now)
            for b in cores[n].poll(now):
                # the frame's last overhead byte names its destination for tacnet (255: the group)
                to = nodes.index(b.dst) if b.dst in nodes else 255
                up[n].offer(b.payload + bytes(frame_overhead - 1) + bytes([to]), now / 1000)
        nexts = [end + 30_001] + ([plan[i][0]] if i < len(plan) else []) + [j[0] for j in taking]
        nexts += [w for c in cores.values() if (w := c.next_wakeup_ms()) is not None]
        nexts += [math.ceil(d * 1000) for x in (*up.values(), *down.values()) if (d := x.next_deadline()) is not None]
        now = max(now + 1, min(nexts))
    ages: list[float] = []
    delays: list[float] = []
    for n in nodes:
        for origin in nodes:
            if origin == n:
                continue
            arrivals = sorted(
                (t, *sent[(origin, d.seq)][::-1]) for t, d in got[n] if d.origin == origin and (origin, d.seq) in sent
            )
            delays += [(t - stamp) / 1000 for t, _, stamp in arrivals]
            ages += _report_ages(arrivals, units, end)
    return {
        "seed": seed,
        "sent": len(plan),
        "delivered": sum(len(g) for g in got.values()),
        "aoi_p95_s": _p95(ages),
        "delay_p95_s": _p95(delays),
        "uplink_bytes_per_report": sum(d.stats.delivered_bytes for d in up.values()) / len(plan),
    }


def _p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def _ages(delivered: list, units: int, start_ms: int, end_ms: int) -> list[float]:
    """Each second from start_ms: the age of each unit's newest position at the receiver."""
    newest: dict[int, int] = {}
    reports = sorted((t, int(d.body[4:7]), int(d.body[8:17])) for t, d in delivered if d.body.startswith(b"pos"))
    out: list[float] = []
    i = 0
    for s in range(start_ms, end_ms + 1, 1000):
        while i < len(reports) and reports[i][0] <= s:
            _, u, stamp = reports[i]
            newest[u] = max(newest.get(u, stamp), stamp)
            i += 1
        out += [(s - newest[u]) / 1000 if u in newest else (s - start_ms) / 1000 + 60 for u in range(units)]
    return out


def seeds(n: int, seed: int | None = None) -> list[int]:
    base = seed if seed is not None else int.from_bytes(os.urandom(3), "big")
    return [base + 1000 * i for i in range(n)]


# -- `c2dtn perf radio-sim` ----------------------------------------------------------------

CONFIGS = {
    "model": RADIO_CFG,
    # the window without the path model: grows with every ack as TCP Reno's, halves on a timeout
    "no model (queue_target_ms 0)": dataclasses.replace(RADIO_CFG, queue_target_ms=0),
}


def ceiling(body: int = 1000) -> float:
    """The share of the link a frame leaves for the body of one envelope of `body` bytes."""
    r = Radio(profile(), 0)
    r.cores["gw1"].submit("gw4", random.Random(0).randbytes(body), 0)
    (b,) = r.cores["gw1"].poll(0 + RADIO_CFG.linger_ms)
    return body / (len(b.payload) + FRAME_OVERHEAD)


BULK_BELOW = 0.80  # a bulk run under this share of the link is counted as a stall in the tail


def main(runs: int = 5, seed: int | None = None, minutes: float = 4.0, console=None, bulk_runs: int = 200) -> Path:
    """Bulk goodput and overload on the virtual radio, each loss pattern under each
    scheduler configuration; a table, report.md, summary.json and plot.png.  bulk_runs: the
    bulk transfer alone on that many loss patterns (the first `runs` of them the same), for
    its tail: a stall is one pattern in tens."""
    from rich.console import Console
    from rich.table import Table

    from c2dtn.perf.runs import progress, run_dir

    console = console or Console()
    out = run_dir("radio-sim")  # (its run.json names the code as it starts, not as it ends)
    run_seeds = seeds(runs, seed)
    console.print(f"loss patterns (seeds) {', '.join(map(str, run_seeds))} (--seed {run_seeds[0]} repeats them)")
    cap = ceiling()
    rows: dict[str, dict] = {}
    many = seeds(max(bulk_runs, runs), run_seeds[0])
    with progress(console, "runs") as bar:
        task = bar.add_task("virtual radio", total=(5 * runs + len(many) - runs) * len(CONFIGS))
        for name, cfg in CONFIGS.items():
            rows[name] = {"bulk": [], "overload": [], "reports": [], "reports_10s": [], "fmn": []}
            for s in run_seeds:
                rows[name]["bulk"].append(bulk(s, cfg=cfg))
                bar.advance(task)
                rows[name]["overload"].append(overload(s, minutes=minutes, cfg=cfg))
                bar.advance(task)
                rows[name]["reports"].append(reports(s, minutes=minutes, cfg=cfg))
                bar.advance(task)
                rows[name]["reports_10s"].append(reports(s, minutes=minutes, period_s=10, cfg=cfg))
                bar.advance(task)
                rows[name]["fmn"].append(fmn(s, minutes=minutes, cfg=cfg))
                bar.advance(task)
            rows[name]["bulk_many"] = [x["fraction"] for x in rows[name]["bulk"]]
            for s in many[runs:]:
                rows[name]["bulk_many"].append(bulk(s, cfg=cfg)["fraction"])
                bar.advance(task)
    for rs_ in rows.values():
        for r in rs_["bulk"]:
            r.pop("counters", None)
    (out / "summary.json").write_text(
        json.dumps(
            {"seeds": run_seeds, "bulk_seeds": many, "minutes": minutes, "ceiling": cap, "configs": rows}, indent=1
        )
        + "\n"
    )
    t = Table(title=f"virtual radio (cnr-tactical-2, frames of the body + {FRAME_OVERHEAD} B), {runs} loss patterns")
    cols = [
        "scheduler",
        "bulk goodput, median (min-max)",
        "of the ceiling",
        "orders p95, median (max)",
        "orders lost",
        "AoI p95, median",
        "link busy, median",
        "demo: link bytes per report, median",
        "demo: AoI p95, median",
        "every 10 s: link bytes per report, median",
        "every 10 s: delay p95, median",
        "every 10 s: AoI p95, median",
        "fmn: AoI p95, median (max)",
        "fmn: uplink bytes per report, median",
    ]
    for c in cols:
        t.add_column(c, justify="right")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, r in rows.items():
        fr = [x["fraction"] for x in r["bulk"]]
        p95 = [x["order_p95_s"] or float("inf") for x in r["overload"]]
        cells = [
            name,
            f"{statistics.median(fr):.3f} ({min(fr):.3f}-{max(fr):.3f})",
            f"{statistics.median(fr) / cap:.2f}",
            f"{statistics.median(p95):.1f} s ({max(p95):.1f} s)",
            str(sum(x["orders_lost"] for x in r["overload"])),
            f"{statistics.median(x['aoi_p95_s'] or 0 for x in r['overload']):.1f} s",
            f"{statistics.median(x['link_share'] for x in r['overload']):.2f}",
            f"{statistics.median(x['bytes_per_report'] for x in r['reports']):.0f} B",
            f"{statistics.median(x['aoi_p95_s'] for x in r['reports']):.2f} s",
            f"{statistics.median(x['bytes_per_report'] for x in r['reports_10s']):.0f} B",
            f"{statistics.median(x['delay_p95_s'] for x in r['reports_10s']):.2f} s",
            f"{statistics.median(x['aoi_p95_s'] for x in r['reports_10s']):.2f} s",
            f"{statistics.median(x['aoi_p95_s'] for x in r['fmn']):.2f} s ({max(x['aoi_p95_s'] for x in r['fmn']):.2f} s)",
            f"{statistics.median(x['uplink_bytes_per_report'] for x in r['fmn']):.0f} B",
        ]
        t.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(t)
    tail_cols = ["scheduler", "loss patterns", "median", "p10", "min", f"runs below {BULK_BELOW:.2f}"]
    tail = Table(title=f"bulk goodput alone, {len(many)} loss patterns")
    for c in tail_cols:
        tail.add_column(c, justify="right")
    tail_lines = ["| " + " | ".join(tail_cols) + " |", "|" + "---|" * len(tail_cols)]
    for name, r in rows.items():
        fr = sorted(r["bulk_many"])
        cells = [
            name,
            str(len(fr)),
            f"{statistics.median(fr):.3f}",
            f"{fr[len(fr) // 10]:.3f}",
            f"{fr[0]:.3f}",
            f"{sum(f < BULK_BELOW for f in fr)}",
        ]
        tail.add_row(*cells)
        tail_lines.append("| " + " | ".join(cells) + " |")
    console.print(tail)
    console.print(
        f"ceiling: {cap:.3f} of the link (1000 B of each frame); overload {minutes:g} min at 3x the link; "
        f"demo: 8 units every 2 s for {minutes:g} min (and every 10 s); fmn: 4 nations each reporting so to the "
        "group of the others, all a nation sends across its own radio uplink"
    )
    (out / "report.md").write_text(
        f"# perf radio-sim\n\nLoss patterns (seeds): {', '.join(map(str, run_seeds))}; overload {minutes:g} "
        f"minutes at 3x the link; demo traffic (8 units every 2 s, and every 10 s) {minutes:g} minutes; fmn-4nations "
        "(4 nations of 8 units every 2 s, each to the group of the others; all a nation sends, reports and acks, "
        "crosses its own radio uplink, then a LAN to each destination; AoI at every other nation); ceiling "
        f"{cap:.3f} of the link.\n\n"
        + "\n".join(lines)
        + f"\n\nBulk goodput alone on {len(many)} loss patterns (seeds {many[0]}, {many[0] + 1000}, ...; the first "
        f"{runs} are those above), share of the link:\n\n" + "\n".join(tail_lines) + "\n"
    )
    _plot(rows, run_seeds, cap, out / "plot.png")
    console.print(f"results in {out}")
    return out


def _plot(rows: dict, run_seeds: list[int], cap: float, path: Path) -> None:
    from c2dtn.perf.plots import pyplot, save_figure

    plt = pyplot()
    fig, (a, b, c, e, d) = plt.subplots(1, 5, figsize=(25, 4))
    x = list(range(len(run_seeds)))
    for name, r in rows.items():
        a.plot(x, [v["fraction"] for v in r["bulk"]], "o-", label=name)
        b.plot(x, [v["order_p95_s"] for v in r["overload"]], "o-", label=name)
        c.plot(x, [v["bytes_per_report"] for v in r["reports"]], "o-", label=name)
        e.plot(x, [v["aoi_p95_s"] for v in r.get("fmn", [])], "o-", label=name)
        many = sorted(r.get("bulk_many", []))
        d.plot([(i + 1) / len(many) for i in range(len(many))], many, "-", label=name)
    a.axhline(cap, color="grey", linestyle=":", label="ceiling (frame overhead)")
    a.set(title="bulk goodput, share of the link", xlabel="loss pattern", ylim=(0, 1))
    b.set(title="orders under 3x overload, p95 (s)", xlabel="loss pattern", ylim=(0, None))
    c.set(title="demo traffic: link bytes per delivered report", xlabel="loss pattern", ylim=(0, None))
    e.set(title="fmn-4nations, a report every 2 s: AoI p95 (s)", xlabel="loss pattern", ylim=(0, None))
    d.axhline(cap, color="grey", linestyle=":", label="ceiling (frame overhead)")
    d.set(
        title="bulk goodput alone, every loss pattern, sorted",
        xlabel="share of the loss patterns at or below",
        ylim=(0, 1),
    )
    for ax in (a, b, c, e, d):
        ax.legend(fontsize=8)
    save_figure(fig, path)


# -- `c2dtn perf radio-sim --frontier` ---------------------------------------------------------

# the knobs that trade a report's bytes against its age (decision 0032): how long reports wait
# for company in a bundle, and how long acks wait for data or more acks
FRONTIER_LINGER_MS = (0, 100, 250, 500, 1000, 1500, 2500)
FRONTIER_ACK_DELAY_MS = (100, 250, 500, 1000, 2000)
# the lossless radio and the one without IP headers run at these ack delays (each a run of its own)
FRONTIER_SIDE_ACK_DELAY_MS = (250, 1000)
FRONTIER_BYTES = 100  # make demo's link bytes per delivered report
FRONTIER_AGE_S = 3.0  # fmn-4nations' age of information p95 at a report every 2 s


# a radio that sends no UDP, IP or Ethernet header (as header compression nearly does): what the
# bytes around a bundle would be with the agent's blocks alone
NO_HEADERS = FRAME_OVERHEAD - 42


def _frontier_point(job: tuple[int, int, float, int, tuple[int, ...], float]) -> dict:
    linger, ack, loss, overhead, run_seeds, minutes = job
    cfg = dataclasses.replace(RADIO_CFG, linger_ms=linger, ack_delay_ms=ack)
    link = dataclasses.replace(profile(), loss=loss)
    return {
        "linger_ms": linger,
        "ack_delay_ms": ack,
        "loss": loss,
        "frame_overhead": overhead,
        "demo": [demo(s, cfg=cfg, link=link, frame_overhead=overhead) for s in run_seeds],
        "fmn": [fmn(s, minutes=minutes, cfg=cfg, uplink=link, frame_overhead=overhead) for s in run_seeds],
    }


def frontier(
    runs: int = 4,
    seed: int | None = None,
    minutes: float = 1.0,
    lingers: tuple[int, ...] = FRONTIER_LINGER_MS,
    ack_delays: tuple[int, ...] = FRONTIER_ACK_DELAY_MS,
    side_ack_delays: tuple[int, ...] = FRONTIER_SIDE_ACK_DELAY_MS,
    console=None,
    workers: int | None = None,
) -> Path:
    """make demo's bytes per delivered report against fmn-4nations' age p95 (`minutes` of reports,
    as the testbed's 60 s), for each linger and ack delay with the same emulator seeds, and on a
    radio that loses nothing and one without IP headers (at side_ack_delays): the two goals'
    trade, as a table, report.md, summary.json and plot.png."""
    from concurrent.futures import ProcessPoolExecutor

    from rich.console import Console
    from rich.table import Table

    from c2dtn.perf.runs import progress, run_dir

    console = console or Console()
    out = run_dir("radio-frontier")
    run_seeds = tuple(seeds(runs, seed))
    loss = profile().loss
    console.print(f"loss patterns (seeds) {', '.join(map(str, run_seeds))} (--seed {run_seeds[0]} repeats them)")
    jobs = [(lg, ad, loss, FRAME_OVERHEAD, run_seeds, minutes) for ad in ack_delays for lg in lingers]
    jobs += [(lg, ad, 0.0, FRAME_OVERHEAD, run_seeds, minutes) for ad in side_ack_delays for lg in lingers]
    jobs += [(lg, ad, loss, NO_HEADERS, run_seeds, minutes) for ad in side_ack_delays for lg in lingers]
    points: list[dict] = []
    with progress(console, "settings") as bar, ProcessPoolExecutor(workers or os.cpu_count() or 1) as pool:
        task = bar.add_task("linger x ack delay", total=len(jobs))
        for p in pool.map(_frontier_point, jobs):
            points.append(p)
            bar.advance(task)
    rows = []
    for p in points:
        d = [x["bytes_per_report"] for x in p["demo"]]
        a = [x["aoi_p95_s"] for x in p["fmn"]]
        p["demo_bytes_median"] = statistics.median(d)
        p["fmn_age_p95_median"] = statistics.median(a)
        both = p["both_goals"] = p["demo_bytes_median"] <= FRONTIER_BYTES and p["fmn_age_p95_median"] <= FRONTIER_AGE_S
        rows.append(
            [
                f"{p['loss']:.0%}",
                f"{p['frame_overhead']} B",
                f"{p['linger_ms']} ms",
                f"{p['ack_delay_ms']} ms",
                f"{p['demo_bytes_median']:.0f} B ({min(d):.0f}-{max(d):.0f})",
                f"{statistics.median(x['ack_frames'] for x in p['demo']):.0f}",
                f"{p['fmn_age_p95_median']:.2f} s ({min(a):.2f}-{max(a):.2f})",
                f"{statistics.median(x['uplink_bytes_per_report'] for x in p['fmn']):.0f} B",
                "yes" if both else "no",
            ]
        )
    cols = [
        "loss",
        "frame beyond the bundle's payload",
        "linger",
        "ack delay",
        "demo: link bytes per delivered report, median (min-max)",
        "demo: frames of acks alone, median",
        "fmn: AoI p95, median (min-max)",
        "fmn: uplink bytes per report, median",
        f"both goals (<= {FRONTIER_BYTES} B, <= {FRONTIER_AGE_S:g} s)",
    ]
    t = Table(title=f"virtual radio: bytes against age, {runs} loss patterns")
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*r)
    console.print(t)
    (out / "summary.json").write_text(
        json.dumps({"seeds": list(run_seeds), "minutes": minutes, "points": points}, indent=1) + "\n"
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(r) + " |" for r in rows]
    (out / "report.md").write_text(
        f"# perf radio-sim --frontier\n\nLoss patterns (seeds): {', '.join(map(str, run_seeds))}. Demo: `make demo`'s "
        "traffic (8 units every 2 s for 100 s, the radio down 20-80 s, 60 s of drain); link bytes (frames whole, "
        f"both ways) per delivered report. fmn: fmn-4nations at a report every 2 s for {minutes:g} minutes; the age "
        f"of information p95 at every other nation. Goals: <= {FRONTIER_BYTES} B and <= {FRONTIER_AGE_S:g} s. "
        f"Loss 0 %: the same radio losing nothing; a frame of {NO_HEADERS} B beyond the bundle's payload: the "
        f"agent's blocks without UDP, IP and Ethernet headers ({FRAME_OVERHEAD} B with them); both at ack delays "
        f"of {', '.join(map(str, side_ack_delays))} ms. The same emulator seeds for every setting (the frames "
        "differ, so the losses fall on other frames).\n\n" + "\n".join(lines) + "\n"
    )
    _plot_frontier(points, out / "plot.png")
    console.print(f"results in {out}")
    return out


def _plot_frontier(points: list[dict], path: Path) -> None:
    """Left: the radio at its loss, a line per ack delay. Right: the lossless radio and the one
    without IP headers beside it, at the side series' ack delays."""
    from c2dtn.perf.plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(16, 6.5), sharey=True)
    series: dict[tuple, list[dict]] = {}
    for p in points:
        series.setdefault((p["loss"], p["frame_overhead"], p["ack_delay_ms"]), []).append(p)
    lossy = max(p["loss"] for p in points)
    side = {ack for loss, overhead, ack in series if not loss or overhead != FRAME_OVERHEAD}
    for ax, part in zip(axes, ("lossy", "side"), strict=True):
        ax.fill_between([0, FRONTIER_BYTES], 0, FRONTIER_AGE_S, color="tab:green", alpha=0.12, label="both goals")
        for (loss, overhead, ack), ps in sorted(series.items(), key=lambda kv: (-kv[0][0], -kv[0][1], kv[0][2])):
            plain = loss == lossy and overhead == FRAME_OVERHEAD
            if not (plain if part == "lossy" else ack in side):
                continue
            ps = sorted(ps, key=lambda p: p["linger_ms"])
            xs = [p["demo_bytes_median"] for p in ps]
            ys = [p["fmn_age_p95_median"] for p in ps]
            style = "s--" if not loss else "^:" if overhead != FRAME_OVERHEAD else "o-"
            what = "" if overhead == FRAME_OVERHEAD else f", no UDP/IP/Ethernet headers ({overhead} B a frame)"
            ax.plot(xs, ys, style, label=f"loss {loss:.0%}, ack delay {ack} ms{what}")
            for p, x, y in zip(ps, xs, ys, strict=True):
                ax.annotate(f"{p['linger_ms']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
            if plain and ack == RADIO_CFG.ack_delay_ms:
                for p in ps:
                    if p["linger_ms"] == RADIO_CFG.linger_ms:
                        ax.plot(
                            p["demo_bytes_median"],
                            p["fmn_age_p95_median"],
                            "k*",
                            markersize=14,
                            label="node configs now",
                        )
        ax.set(
            title=f"loss {lossy:.0%}, every ack delay"
            if part == "lossy"
            else "a radio losing nothing, and one without IP headers",
            xlabel="make demo: link bytes per delivered report (median of the loss patterns)",
            xlim=(0, None),
            ylim=(0, None),
        )
        ax.legend(fontsize=7)
    axes[0].set_ylabel("fmn-4nations, a report every 2 s: AoI p95 (s, median)")
    fig.suptitle("make demo's bytes against fmn-4nations' age, per linger (ms, beside each point)")
    save_figure(fig, path)
