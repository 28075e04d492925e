"""Overload: far more offered than the radio link carries, for a long time.

`c2dtn perf overload [--minutes 20] [--factor 10]`: nps-chain, the r2=r3 link on --profile
(cnr-tactical-2: 9.8 kbit/s, 10 % loss).  On h1, --units GeoJSON position reporters
(seed 000's reports, QoS 1, one topic per unit) together offer --factor times the link's
rate in MQTT payload bits (reports go compressed, most as the edits of the one before, so the
link is asked for less than that: the report says what share of the positions it carried;
at the default 10x about a third), and one orders publisher sends a QoS 1 order
(c2/orders/<n>, 200 B) every --order-every s.  gw1 intercepts (TPROXY); positions are
"priority" and superseded per topic, orders "immediate"; gw4 publishes at h4's broker,
where one subscriber takes everything.  Every 5 s: the RSS of gw1's and gw4's node
process (overlay node and MQTT gateway in one), what gw1's custody holds (envelopes,
bytes, custody.db with its WAL) and its counters.

What it shows: the offered load against the link; orders published, PUBACKed, delivered,
lost (PUBACKed and never delivered, after a drain of up to --drain s) and their latency;
positions sent, delivered, superseded at gw1 (never sent: a newer report of the same unit
replaced it), and the age of the newest position of each unit at h4 (each second after
the warm-up: now - the timestamp of the newest report of that unit the subscriber has);
gw1's RSS after the warm-up and at the end, its slope (MB/h, least squares over the
samples after the warm-up) and its largest value; the envelopes gw1 held at most against
its quota.  Writes results/<time>-overload/ with report.md, summary.json, samples.csv,
events.jsonl and plot.png (+ .json).
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.nodes import Nodes

BPA = ["gw1", "r2", "r3", "gw4"]
REPORT_BYTES = 214  # a seed 000 position report (perf/train_dict.position_report)
ORDER_BYTES = 200
SAMPLE_EVERY_S = 5.0


def _mqtt(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "c2dtn.perf.mqtt_clients", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _lines(p: subprocess.Popen, sink: list, ready: threading.Event | None = None) -> threading.Thread:
    def run():
        for line in p.stdout:
            if line.startswith("{"):
                d = json.loads(line)
                if ready is not None and "subscribed" in d:
                    ready.set()
                sink.append(d)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def period_for(units: int, factor: float, link_bps: float) -> float:
    """Each unit's report period for `units` reporters to offer factor x link_bps in payload."""
    return units * REPORT_BYTES * 8 / (factor * link_bps)


def campaign(
    minutes: float,
    factor: float,
    units: int,
    order_every: float,
    profile: str,
    drain: float,
    seed: int,
    work: Path,
    events: list,
    samples: list,
    bar=None,
) -> dict:
    duration = minutes * 60
    testbed.down()
    st = testbed.up("nps-chain", profile=profile, seed=seed)
    link_bps = (st["links"]["r2-r3"].get("profile_ab") or {}).get("rate_bps")
    if not link_bps:
        testbed.down()
        raise ValueError(f"profile {profile!r} has no rate: overload is a multiple of the link's rate")
    period = period_for(units, factor, link_bps)
    h4 = testbed.node_address(st, "h4")
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    rules = (
        '[[gateway.topic]]\nfilter = "c2/#"\npriority = "immediate"\nlifetime = 86400\n\n'
        '[[gateway.topic]]\nfilter = "/+/+/+/location"\npriority = "priority"\nlifetime = 600\n'
        'supersede = "topic"\n'
    )
    nodes = Nodes(
        st,
        BPA,
        ["gw1", "gw4"],
        work / "nodes",
        gateways={
            "gw1": f'[gateway]\ntproxy = true\n\n[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n\n{rules}',
            "gw4": f"[gateway]\n\n{rules}",
        },
    )
    broker = start_mosquitto("c2-h4", work / "broker", h4)
    procs: list[subprocess.Popen] = []
    rx: list[dict] = []
    sent: list[dict] = []
    t0 = time.monotonic()
    t0_wall = time.time()
    quota = nodes.cfg("gw1").quota.max_envelopes
    try:
        for n in BPA:
            nodes.start(n, wait=False)
        for n in BPA:
            nodes.wait_ready(n, timeout=60)
        ready = threading.Event()
        sub = _mqtt(
            "h4",
            "sub",
            "--host",
            "127.0.0.1",
            "--topic",
            "#",
            "--qos",
            "1",
            "--timeout",
            str(int(duration + drain + 120)),
            "--client-id",
            "c2overload-sub",
        )
        procs.append(sub)
        readers = [_lines(sub, rx, ready)]
        if not ready.wait(30):
            raise RuntimeError("the subscriber at h4's broker never subscribed")
        orders = int(duration / order_every)
        t0, t0_wall = time.monotonic(), time.time()
        pos = _mqtt(
            "h1",
            "units",
            "--host",
            h4,
            "--nation",
            "NOR",
            "--units",
            str(units),
            "--period",
            f"{period:.4f}",
            "--duration",
            str(duration),
            "--qos",
            "1",
            "--timeout",
            str(int(drain)),
            "--client-id",
            "c2overload",
            "--seed",
            str(seed),
        )
        ordp = _mqtt(
            "h1",
            "pub",
            "--host",
            h4,
            "--topic",
            "c2/orders/{n}",
            "--qos",
            "1",
            "--count",
            str(orders),
            "--interval",
            str(order_every),
            "--size",
            str(ORDER_BYTES),
            "--timeout",
            str(int(drain)),
            "--client-id",
            "c2overload-orders",
        )
        procs += [pos, ordp]
        readers += [_lines(pos, sent), _lines(ordp, sent)]
        task = bar.add_task("overload", total=int(duration)) if bar else None
        pids = {n: nodes.procs[n].pid for n in ("gw1", "gw4")}
        db = Path(nodes.cfg("gw1").custody_db)
        while True:
            t = time.monotonic() - t0
            status = nodes.status("gw1")
            q = [r for r in status.get("queues", []) if r["dst"] == "gw4"]
            samples.append(
                {
                    "t": round(t, 1),
                    "gw1_rss_mb": rss_mb(pids["gw1"]),
                    "gw4_rss_mb": rss_mb(pids["gw4"]),
                    "held": sum(r["queued"] + r["in_flight"] for r in q),
                    "held_bytes": sum(r["bytes"] for r in q),
                    "db_mb": sum(f.stat().st_size for f in db.parent.glob(db.name + "*")) / 1e6,
                    "superseded": status.get("counters", {}).get("superseded", 0),
                }
            )
            if bar:
                got = sum(1 for r in rx if "topic" in r)
                bar.update(
                    task,
                    completed=min(int(t), int(duration)),
                    description=f"overload: {samples[-1]['held']} held at gw1, {got} delivered",
                )
            if t >= duration:
                break
            time.sleep(SAMPLE_EVERY_S)
        events.append({"ev": "traffic_end", "t": round(time.monotonic() - t0, 1)})
        want = {str(i) for i in range(orders)}
        deadline = time.monotonic() + drain
        dtask = bar.add_task("overload: orders draining", total=orders) if bar else None
        while time.monotonic() < deadline:
            got = {r["payload"].split()[0] for r in list(rx) if r.get("topic", "").startswith("c2/orders/")}
            if bar:
                bar.update(dtask, completed=len(got & want))
            if want <= got:
                break
            time.sleep(2)
        time.sleep(5)
        for p in (pos, ordp):
            try:
                p.wait(drain)
            except subprocess.TimeoutExpired:
                p.kill()
        final = {n: nodes.status(n) for n in ("gw1", "gw4")}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(10)
        nodes.stop_all()
        broker.terminate()
        broker.wait(10)
        testbed.down()
    for r in readers:
        r.join(5)
    params = {
        "minutes": minutes,
        "factor": factor,
        "units": units,
        "period_s": round(period, 3),
        "order_every_s": order_every,
        "profile": profile,
        "link_bps": link_bps,
        "drain_s": drain,
        "seed": seed,
        "quota_envelopes": quota,
    }
    for r in rx:
        if "topic" in r:
            events.append({"ev": "recv", "t": round(r["t"] - t0_wall, 2), "topic": r["topic"], "delay_s": _delay(r)})
    return summarize(params, sent, rx, samples, final, t0_wall)


def _delay(r: dict) -> float | None:
    """Receipt - sending time: an order carries "<n> <time_ns>", a position its timestamp (ms)."""
    try:
        if r["topic"].startswith("c2/orders/"):
            return round(r["t"] - int(r["payload"].split()[1]) / 1e9, 3)
        return round(r["t"] - json.loads(r["payload"])["properties"]["timestamp"] / 1000, 3)
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def _slope_per_hour(pts: list[tuple[float, float]]) -> float | None:
    if len(pts) < 3:
        return None
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return None if not den else sum((x - mx) * (y - my) for x, y in pts) / den * 3600


def _quarters(pts: list[tuple[float, float]], start: float, end: float) -> list[float | None]:
    """The median of the samples around each quarter mark from start to end (1/4 .. 4/4)."""
    out = []
    for q in (1, 2, 3, 4):
        at = start + (end - start) * q / 4
        near = [y for x, y in pts if abs(x - at) <= max(15.0, (end - start) / 40)]
        out.append(statistics.median(near) if near else None)
    return out


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def warmup_s(duration: float) -> float:
    return min(120.0, duration / 4)


def ages(receipts: list[tuple[float, str, float]], units: list[str], start: float, end: float) -> list[float]:
    """Each second from start to end (s since the traffic began), for each unit: that second
    - the timestamp of the newest report of the unit received by then (units with none yet
    are left out)."""
    receipts = sorted(receipts)
    newest: dict[str, float] = {}
    out, i = [], 0
    s = start
    while s <= end:
        while i < len(receipts) and receipts[i][0] <= s:
            _, u, ts = receipts[i]
            newest[u] = max(newest.get(u, ts), ts)
            i += 1
        out += [s - newest[u] for u in units if u in newest]
        s += 1.0
    return out


def summarize(params: dict, sent: list[dict], rx: list[dict], samples: list[dict], final: dict, t0_wall: float) -> dict:
    duration = params["minutes"] * 60
    warm = warmup_s(duration)
    ord_rows = [r for r in sent if "acked" in r and "sent" in r and "ev" not in r]
    pos_done = next((r for r in sent if r.get("ev") == "done"), {})
    pos_sent = [r for r in sent if r.get("ev") == "sent"]
    orders_rx = [r for r in rx if r.get("topic", "").startswith("c2/orders/")]
    seen: dict[str, int] = {}
    lat = []
    for r in orders_rx:
        n, ns = r["payload"].split()[:2]
        seen[n] = seen.get(n, 0) + 1
        lat.append(r["t"] - int(ns) / 1e9)
    ordp = ord_rows[-1] if ord_rows else {}
    n_orders = ordp.get("sent", 0)
    receipts = []
    for r in rx:
        if r.get("topic", "").endswith("/location"):
            try:
                p = json.loads(r["payload"])["properties"]
                receipts.append((r["t"] - t0_wall, p["node_id"], p["timestamp"] / 1000 - t0_wall))
            except (ValueError, KeyError, TypeError):
                pass
    units = sorted({e["unit"] for e in pos_sent})
    aoi = ages(receipts, units, warm, duration)
    after = [(s["t"], s["gw1_rss_mb"]) for s in samples if s["t"] >= warm and s["gw1_rss_mb"] is not None]
    first = [y for _, y in after[:6]]
    last = [y for _, y in after[-6:]]
    half = [pt for pt in after if pt[0] >= (warm + duration) / 2]  # the second half after the warm-up
    c1 = final["gw1"].get("counters", {})
    return {
        "params": params,
        "offered_payload_bps": (len(pos_sent) * REPORT_BYTES + n_orders * ORDER_BYTES) * 8 / duration,
        "orders": {
            "published": n_orders,
            "acked": ordp.get("acked"),
            "delivered": len(seen),
            "twice": sum(1 for v in seen.values() if v > 1),
            "lost": sorted(set(map(str, range(n_orders))) - set(seen), key=int)[:50],
            "lost_count": len(set(map(str, range(n_orders))) - set(seen)),
            "publisher_disconnects": len(ordp.get("disconnects", [])),
            "latency_p50_s": _pct(lat, 0.5),
            "latency_p95_s": _pct(lat, 0.95),
            "latency_max_s": max(lat, default=None),
        },
        "positions": {
            "sent": len(pos_sent),
            "acked": pos_done.get("acked"),
            "delivered": len(receipts),
            "superseded_at_gw1": c1.get("superseded", 0),
            # the overload as the radio saw it: the factor is of payload, and reports go compressed
            "carried_share": len(receipts) / len(pos_sent) if pos_sent else None,
            "age_p50_s": _pct(aoi, 0.5),
            "age_p95_s": _pct(aoi, 0.95),
            "age_max_s": max(aoi, default=None),
        },
        "gw1_rss_mb": {
            "after_warmup": statistics.median(first) if first else None,
            "end": statistics.median(last) if last else None,
            "max": max((y for _, y in after), default=None),
            "slope_mb_per_h": _slope_per_hour(after),
            "slope_second_half_mb_per_h": _slope_per_hour(half),
            "quarters": _quarters(after, warm, duration),
        },
        "gw4_rss_mb_max": max((s["gw4_rss_mb"] for s in samples if s["gw4_rss_mb"] is not None), default=None),
        "gw1_held_max": max((s["held"] for s in samples), default=0),
        "gw1_held_bytes_max": max((s["held_bytes"] for s in samples), default=0),
        "gw1_db_mb_max": max((s["db_mb"] for s in samples), default=0),
        "gw1_counters": c1,
        "gw1_mqtt": final["gw1"].get("mqtt", {}).get("counters", {}),
    }


def _share(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


def _f(v, unit="", nd=1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}{unit}"


def report(out: Path, res: dict, events: list, samples: list) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(res, indent=1) + "\n")
    with open(out / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    with open(out / "samples.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(samples[0]) if samples else ["t"])
        w.writeheader()
        w.writerows(samples)
    p, o, pos, rss = res["params"], res["orders"], res["positions"], res["gw1_rss_mb"]
    md = [
        "# Overload: the radio link offered more than it carries (`c2dtn perf overload`)",
        "",
        f"nps-chain, r2=r3 on {p['profile']} ({p['link_bps'] / 1000:g} kbit/s); for {p['minutes']:g} min, "
        f"{p['units']} position reporters on h1 (QoS 1, a report every {p['period_s']:g} s each, superseded per "
        f"unit at the gateways) and a QoS 1 order every {p['order_every_s']:g} s: "
        f"**{res['offered_payload_bps'] / 1000:.1f} kbit/s of MQTT payload, "
        f"{res['offered_payload_bps'] / p['link_bps']:.2f}x the link** in payload (the overlay sends reports compressed); the link carried "
        f"{_share(pos.get('carried_share'))} of the positions offered. "
        f"Warm-up: the first {warmup_s(p['minutes'] * 60):.0f} s.",
        "",
        "| what | figure |",
        "|---|---:|",
        f"| orders published / PUBACKed | {o['published']} / {o['acked']} |",
        f"| orders delivered / lost / twice | {o['delivered']} / **{o['lost_count']}** / {o['twice']} |",
        f"| order latency p50 / p95 / max | {_f(o['latency_p50_s'], ' s')} / {_f(o['latency_p95_s'], ' s')} / "
        f"{_f(o['latency_max_s'], ' s')} |",
        f"| positions sent / PUBACKed / delivered | {pos['sent']} / {pos['acked']} / {pos['delivered']} |",
        f"| positions superseded at gw1 (a newer report of the unit went instead) | {pos['superseded_at_gw1']} |",
        f"| positions delivered of those sent (what the link carried) | {_share(pos.get('carried_share'))} |",
        f"| age of each unit's newest position at h4, p50 / p95 / max | {_f(pos['age_p50_s'], ' s')} / "
        f"{_f(pos['age_p95_s'], ' s')} / {_f(pos['age_max_s'], ' s')} |",
        f"| gw1 RSS after warm-up / at the end / max | {_f(rss['after_warmup'], ' MB')} / {_f(rss['end'], ' MB')} / "
        f"{_f(rss['max'], ' MB')} |",
        f"| gw1 RSS slope after warm-up; over the second half | {_f(rss['slope_mb_per_h'], ' MB/h', 2)}; "
        f"{_f(rss.get('slope_second_half_mb_per_h'), ' MB/h', 2)} |",
        f"| gw1 RSS at each quarter after warm-up | {' / '.join(_f(v, ' MB') for v in rss.get('quarters', []))} |",
        f"| gw1 custody: envelopes held at most (quota) | {res['gw1_held_max']:,} ({p['quota_envelopes']:,}) |",
        f"| gw1 custody: bytes held at most; custody.db + WAL at most | {res['gw1_held_bytes_max']:,} B; "
        f"{_f(res['gw1_db_mb_max'], ' MB', 2)} |",
        f"| gw4 RSS max | {_f(res['gw4_rss_mb_max'], ' MB')} |",
        "",
        f"gw1 MQTT counters at the end: {json.dumps(res['gw1_mqtt'])}",
        "",
        "![RSS, custody and positions' age over the run](plot.png)",
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, axs = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ts = [s["t"] for s in samples]
    axs[0].plot(ts, [s["gw1_rss_mb"] for s in samples], label="gw1 node RSS")
    axs[0].plot(ts, [s["gw4_rss_mb"] for s in samples], label="gw4 node RSS")
    axs[0].set_ylabel("MB")
    axs[0].legend()
    axs[1].plot(ts, [s["held"] for s in samples], label="envelopes held at gw1")
    axs[1].set_ylabel("envelopes")
    axs[1].legend()
    for kind, mark, label in (("/location", ".", "position delay at h4"), ("c2/orders/", "x", "order delay")):
        d = [e for e in events if e["ev"] == "recv" and kind in e["topic"] and e["delay_s"] is not None]
        axs[2].plot([e["t"] for e in d], [e["delay_s"] for e in d], mark, ms=3, label=label)
    axs[2].set_ylabel("delay (s)")
    axs[2].set_xlabel("s since the traffic started")
    axs[2].legend()
    fig.suptitle(f"Overload at {res['offered_payload_bps'] / p['link_bps']:.1f}x the link")
    save_figure(fig, out / "plot.png")
    return "\n".join(md[:18])


def main(
    minutes: float,
    factor: float,
    units: int,
    order_every: float,
    profile: str,
    drain: float,
    seed: int,
    out: Path | None = None,
    console=None,
) -> Path:
    out = out or run_dir("overload")
    events: list = []
    samples: list = []
    with tempfile.TemporaryDirectory(prefix="c2overload-") as td, progress(console) as bar:
        res = campaign(minutes, factor, units, order_every, profile, drain, seed, Path(td), events, samples, bar)
    text = report(out, res, events, samples)
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    os.sync()
    return out
