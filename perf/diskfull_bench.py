"""Disk full under traffic: clear refusals, nothing held lost, traffic back when space frees.

`c2dtn perf diskfull` (the disk-full campaign).  A near MQTT gateway (gw1:
ip_gateway.MqttGateway on its custody store, the writer thread on) keeps its store and its
session file on a tmpfs of --disk-mb, as an edge box keeps them on a small card.  Its
overlay core talks to a far core (gw4, on an ordinary disk) over an in-memory link of
100 ms each way, the pump doing what the node's does (plan, wait for the fsync, hand
over; a bundle that arrives while the store is full is not taken and comes again).
--clients MQTT clients publish QoS 1 (--size bytes) --rate times a second each, half of
them MQTT 5 and half MQTT 3.1.1 (clean session off, as a client that must not lose what
it sent).  Each of --cycles cycles: the link is cut (gw1 holds what it takes), a ballast
file fills the disk, it stays full for --full-s, the ballast goes, the link comes back.

A user must see:
  - MQTT 5 publishers get PUBACK 0x97 (Quota exceeded) for what the full disk refused; an
    MQTT 3.1.1 publisher (its protocol has no refusal) is disconnected, reconnects with
    its session and sends again what had no PUBACK;
  - every PUBACKed message is delivered at gw4 once (lost 0, twice 0), none refused is
    delivered (nothing half kept), and gw1 holds nothing at the end;
  - once space frees, PUBACK 0 again, and every 3.1.1 message is finally PUBACKed.

The clients are written here on c2dtn's MQTT codec, not paho: a refusal must be seen per
message (paho reports a PUBACK's reason to its callback but then forgets the message).
Writes results/<time>-diskfull/ with report.md, summary.json, timeline.csv and plot.png
(+ .json).
"""

from __future__ import annotations

import asyncio
import csv
import errno
import json
import logging
import subprocess
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from c2dtn.ip_gateway import bodies
from c2dtn.ip_gateway import mqtt as m
from c2dtn.overlay.port import Port
from c2dtn.perf.fsync_bench import _free_port, gateway_config
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir, tally_logs

KEY = b"d" * 32
LINK_DELAY_MS = 100
RECONNECT_S = 0.3
SAMPLE_S = 0.25
log = logging.getLogger("c2dtn.perf.diskfull")


@dataclass
class Phases:
    """One cycle: the link is cut at `cut` s, the disk filled at `fill` s; it stays full until
    `full_s` after the store first refused (the store first fills what room its own files
    still have: pages freed by deliveries, a WAL grown earlier; at most `slack_max_s`); the
    space is freed, the link comes back `back_after_free` s later and runs `tail` s more."""

    cut: float = 2.0
    fill: float = 4.0
    full_s: float = 6.0
    slack_max_s: float = 120.0
    back_after_free: float = 2.0
    tail: float = 6.0


# -- the clients -----------------------------------------------------------------------
@dataclass
class Client:
    """One QoS 1 publisher, open loop: message k is due at start + k / rate whether or not it
    is connected then (if not, it goes on the next connection)."""

    name: str
    version: int
    port: int
    rate: float
    size: int
    t0: float
    events: list
    pending: dict = field(default_factory=dict)  # packet id -> message, sent and not answered
    backlog: deque = field(default_factory=deque)  # messages due while not connected
    acked: set = field(default_factory=set)
    refused: set = field(default_factory=set)
    sent: list = field(default_factory=list)
    disconnects: int = 0
    resent: int = 0  # sent again on a new connection, having had no answer on the last one
    writer: asyncio.StreamWriter | None = None
    pending_before_cut: int = 0

    def _ev(self, kind: str, n: int = 1) -> None:
        self.events.append((round(time.monotonic() - self.t0, 3), self.name, self.version, kind, n))

    def _publish(self, msg: str, dup: bool = False) -> None:
        pid = int(msg.split(":")[1]) % 65535 + 1
        self.pending[pid] = msg
        body = msg.encode().ljust(self.size, b".")
        self.writer.write(
            m.encode(m.Publish(f"c2/disk/{self.name}", body, qos=1, dup=dup, packet_id=pid), self.version)
        )

    async def _connection(self) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            w.write(m.encode(m.Connect(self.name, clean_start=self.version == 5, keepalive=60, version=self.version)))
            parser = m.Parser(version=self.version)
            ack = None
            while ack is None:
                data = await r.read(65536)
                if not data:
                    raise ConnectionError("closed before CONNACK")
                pkts = parser.feed(data)
                ack = pkts[0] if pkts else None
            if not isinstance(ack, m.ConnAck) or ack.reason:
                raise ConnectionError(f"CONNACK {ack}")
            self.writer = w
            # what had no answer on the last connection goes again (3.1.1: DUP, the session kept
            # its packet ids; MQTT 5 with a clean start: as new publishes, refused or taken anew)
            again = sorted(self.pending.values(), key=lambda s: int(s.split(":")[1])) + list(self.backlog)
            self.pending_before_cut = len(self.pending) if self.disconnects else 0
            self.pending.clear()
            self.backlog.clear()
            for msg in again:
                self._publish(msg, dup=self.version == 4)
            if self.pending_before_cut:
                self.resent += self.pending_before_cut
                self._ev("resent", self.pending_before_cut)
            await w.drain()
            while True:
                data = await r.read(65536)
                if not data:
                    return
                for p in parser.feed(data):
                    if isinstance(p, m.PubAck) and p.packet_id in self.pending:
                        msg = self.pending.pop(p.packet_id)
                        if p.reason < 0x80:
                            self.acked.add(msg)
                            self._ev("acked")
                        else:
                            self.refused.add(msg)
                            self._ev(f"refused 0x{p.reason:02x}")
        finally:
            self.writer = None
            w.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Publish, connected or not, until `stop` is set."""
        conn = asyncio.create_task(self._keep_connected())
        try:
            start = time.monotonic()
            k = 0
            while not stop.is_set():
                await asyncio.sleep(max(0.0, start + k / self.rate - time.monotonic()))
                msg = f"{self.name}:{k}"
                self.sent.append(msg)
                if self.writer is not None and not self.writer.is_closing():
                    self._publish(msg)
                else:
                    self.backlog.append(msg)
                k += 1
        except BaseException:
            conn.cancel()
            raise
        self._conn = conn

    async def settle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (self.pending or self.backlog) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        self._conn.cancel()

    async def _keep_connected(self) -> None:
        while True:
            try:
                await self._connection()
            except (ConnectionError, OSError) as e:
                log.debug("%s: %s", self.name, e)
            self.disconnects += 1
            self._ev("disconnected")
            await asyncio.sleep(RECONNECT_S)


# -- the gateway pair and the disk ------------------------------------------------------
def mount_tmpfs(path: Path, mb: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mb}m", "c2-diskfull", str(path)], capture_output=True, text=True
    )
    if r.returncode:
        raise RuntimeError(f"cannot mount a {mb} MB tmpfs at {path} (root needed): {r.stderr.strip()}")


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> int:
    """Write a ballast file until the disk refuses; returns its size."""
    n = 0
    with open(path, "wb", buffering=0) as fh:
        while True:
            try:
                n += fh.write(b"\0" * 65536)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        while True:  # the last few pages
            try:
                n += fh.write(b"\0" * 512)
            except OSError:
                return n


def disk_free(path: Path) -> int:
    import os

    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Pair:
    """gw1 (the near gateway on the small disk) and gw4 (a far core), linked in memory."""

    def __init__(self, disk: Path, far_dir: Path, port: int):
        from c2dtn.ip_gateway.gateway import MqttGateway
        from c2dtn.overlay.core import OverlayCore
        from c2dtn.overlay.custody import CustodyStore, Quota
        from c2dtn.overlay.envelope import Codec
        from c2dtn.overlay.syncer import Syncer

        self.disk = disk
        # the quota far above the disk: what refuses here is the disk, not the count
        self.store = CustodyStore(
            disk / "custody.db", "c2gw1", Quota(10_000_000, 1 << 40), background_checkpoints=True, sync="thread"
        )
        self.core = OverlayCore(self.store, Codec("c2gw1", {"c2gw4": KEY}))
        self.syncer = Syncer(self.store.records)
        self.syncer.start()
        self.node = Port(self.core, self.syncer, disk)
        self.gw = MqttGateway(self.node, gateway_config(port))
        self.far = OverlayCore(CustodyStore(far_dir / "custody.db", "c2gw4"), Codec("c2gw4", {"c2gw1": KEY}))
        self.up = True
        self.air: deque = deque()  # (due ms, to, payload)
        self.delivered: Counter = Counter()  # message -> times delivered at gw4
        self.counts = Counter()

    async def start(self) -> None:
        await self.gw.start()

    def _take(self, core, name: str, payloads: list, now: int) -> None:
        from c2dtn.overlay.store import StoreFull

        try:
            core.on_bundles(payloads, now)
        except StoreFull:  # as the node: not taken, so not acked; its origin sends it again
            self.counts[f"bundles not taken at {name} (disk full)"] += len(payloads)

    async def pump(self, stop: asyncio.Event) -> None:
        from c2dtn.overlay.store import StoreFull

        while not stop.is_set():
            await asyncio.sleep(0.02)
            now = int(time.time() * 1000)
            try:
                out = self.core.poll(now)
            except StoreFull:
                self.counts["plans put off at gw1 (disk full)"] += 1
                out = []
            if out:
                await self.node.synced()
            for b in out:
                self.counts["bundles gw1 to gw4"] += 1
                if self.up:
                    self.air.append((now + LINK_DELAY_MS, "gw4", b.payload))
            for b in self.far.poll(now):
                self.counts["bundles gw4 to gw1"] += 1
                if self.up:
                    self.air.append((now + LINK_DELAY_MS, "gw1", b.payload))
            due = {"gw1": [], "gw4": []}
            while self.air and self.air[0][0] <= now:
                _, to, payload = self.air.popleft()
                if self.up:  # a cut link loses what is on the air
                    due[to].append(payload)
            if due["gw4"]:
                self._take(self.far, "gw4", due["gw4"], now)
            if due["gw1"]:
                self._take(self.core, "gw1", due["gw1"], now)
            items = self.far.take()
            for d in items:
                for x in bodies.publishes(bodies.unpack(d.body)):
                    self.delivered[x["p"].split(b".", 1)[0].decode()] += 1
            if items:
                self.far.consumed([d.id for d in items])

    async def checkpoints(self, stop: asyncio.Event) -> None:  # as the node's, off the loop
        while not stop.is_set():
            await asyncio.sleep(0.5)
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.store.records.checkpoint)
            except Exception as e:  # a full disk: the WAL stays as it is until space frees
                self.counts["checkpoints failed"] += 1
                log.debug("checkpoint: %s", e)

    async def stop(self) -> None:
        await self.gw.stop()
        self.syncer.stop()

    def close(self) -> dict:
        import os

        files = {f.name: os.stat(f).st_size for f in sorted(self.disk.glob("custody.db*"))}
        free_kb = disk_free(self.disk) // 1024
        held = self.store.held_out()[0]
        integrity = self.store.records.db.execute("PRAGMA integrity_check").fetchone()[0]
        counters = dict(self.gw.near.core.counters) if hasattr(self.gw, "near") else {}
        self.store.close()
        self.far.store.close()
        return {
            "held_at_end": held,
            "integrity": integrity,
            "gateway_counters": counters,
            "store_files": files,
            "disk_free_kb_at_end": free_kb,
        }


async def _campaign(
    disk: Path,
    far_dir: Path,
    clients: int,
    rate: float,
    size: int,
    cycles: int,
    phases: Phases,
    drain_s: float,
    bar=None,
) -> dict:
    port = _free_port()
    pair = Pair(disk, far_dir, port)
    await pair.start()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(pair.pump(stop)), asyncio.create_task(pair.checkpoints(stop))]
    t0 = time.monotonic()
    events: list = []
    timeline: list = []
    marks: list = []
    publishing = asyncio.Event()
    cl = [
        Client(f"c2disk-{'v5' if i % 2 == 0 else 'v3'}-{i}", 5 if i % 2 == 0 else 4, port, rate, size, t0, events)
        for i in range(clients)
    ]
    ballast = disk / "ballast"

    def mark(kind: str, **kw) -> None:
        marks.append({"t": round(time.monotonic() - t0, 2), "ev": kind, **kw})

    async def sampler() -> None:
        while True:
            timeline.append(
                {
                    "t": round(time.monotonic() - t0, 2),
                    "held": pair.store.held_out()[0],
                    "disk_free_kb": disk_free(disk) // 1024,
                    "acked": sum(len(c.acked) for c in cl),
                    "refused": sum(len(c.refused) for c in cl),
                    "disconnects": sum(c.disconnects for c in cl),
                    "delivered": sum(pair.delivered.values()),
                    "link_up": int(pair.up),
                }
            )
            await asyncio.sleep(SAMPLE_S)

    def refusals() -> int:
        return pair.gw.near.core.counters["refused_quota"]

    async def faults() -> None:
        task = bar.add_task("diskfull: cycles", total=cycles) if bar else None
        for c in range(cycles):
            await asyncio.sleep(phases.cut)
            pair.up = False
            mark("link_down", cycle=c + 1)
            await asyncio.sleep(phases.fill - phases.cut)
            n = await asyncio.to_thread(fill, ballast)
            full_at, before = time.monotonic(), refusals()
            mark("disk_full", cycle=c + 1, ballast_mb=round(n / 1e6, 2), free_kb=disk_free(disk) // 1024)
            while refusals() == before and time.monotonic() - full_at < phases.slack_max_s:
                await asyncio.sleep(0.05)
            mark(
                "first_refusal" if refusals() > before else "no_refusal",
                cycle=c + 1,
                after_s=round(time.monotonic() - full_at, 2),
            )
            await asyncio.sleep(phases.full_s)
            ballast.unlink()
            mark("disk_freed", cycle=c + 1, free_kb=disk_free(disk) // 1024)
            await asyncio.sleep(phases.back_after_free)
            pair.up = True
            mark("link_up", cycle=c + 1)
            await asyncio.sleep(phases.tail)
            if bar:
                bar.update(task, advance=1, description=f"diskfull: cycle {c + 1} of {cycles}")
        publishing.set()

    samp = asyncio.create_task(sampler())
    try:
        await asyncio.gather(faults(), *(c.run(publishing) for c in cl))
        mark("traffic_end")
        await asyncio.gather(*(c.settle(drain_s) for c in cl))
        want = set().union(*(c.acked for c in cl))
        dtask = bar.add_task("diskfull: draining", total=len(want)) if bar else None
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and (not want <= set(pair.delivered) or pair.store.held_out()[0]):
            if bar:
                bar.update(dtask, completed=len(want & set(pair.delivered)))
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # late duplicates
        mark("drained")
    finally:
        samp.cancel()
        stop.set()
        for t in tasks:
            t.cancel()
        await pair.stop()
    end = pair.close()
    return summarize(cl, pair.delivered, pair.counts, end, events, timeline, marks)


def cycles_table(marks: list, events: list) -> list[dict]:
    """Per cycle: how long the store took what its own files had room for after the disk
    filled, what it took meanwhile, and what was refused (0x97) or cut off (3.1.1) while full."""
    out = []
    for c in sorted({x["cycle"] for x in marks if "cycle" in x}):
        at = {x["ev"]: x for x in marks if x.get("cycle") == c}
        full, freed = at["disk_full"]["t"], at["disk_freed"]["t"]
        first = at.get("first_refusal", at.get("no_refusal"))
        slack_end = full + first["after_s"]

        def n(kind: str, a: float, b: float, version: int | None = None) -> int:
            return sum(
                e[4] for e in events if e[3].startswith(kind) and a <= e[0] < b and (version is None or e[2] == version)
            )

        out.append(
            {
                "cycle": c,
                "ballast_mb": at["disk_full"]["ballast_mb"],
                "refused": "first_refusal" in at,
                "slack_s": first["after_s"],
                "taken_into_slack": n("acked", full, slack_end),
                "full_s": round(freed - slack_end, 1),
                "refused_0x97": n("refused", full, freed, 5),
                "v311_disconnects": n("disconnected", full, freed, 4),
                "taken_while_full": n("acked", slack_end, freed),
            }
        )
    return out


def summarize(
    cl: list[Client], delivered: Counter, counts: Counter, end: dict, events: list, timeline: list, marks: list
) -> dict:
    rows = {}
    for v in (5, 4):
        mine = [c for c in cl if c.version == v]
        sent = {s for c in mine for s in c.sent}
        acked = {s for c in mine for s in c.acked}
        refused = {s for c in mine for s in c.refused}
        reasons = Counter(e[3] for e in events if e[2] == v and e[3].startswith("refused"))
        rows["MQTT 5" if v == 5 else "MQTT 3.1.1"] = {
            "clients": len(mine),
            "published": len(sent),
            "acked": len(acked),
            "refused": len(refused),
            "refusal_reasons": dict(reasons),
            "disconnects": sum(c.disconnects for c in mine),
            "resent": sum(c.resent for c in mine),
            "no_answer": len(sent - acked - refused),
            "acked_lost": len([s for s in acked if delivered[s] == 0]),
            "delivered_twice_or_more": len([s for s in sent if delivered[s] > 1]),
            "refused_delivered": len([s for s in refused if delivered[s]]),
            "lost_examples": sorted(s for s in acked if delivered[s] == 0)[:10],
        }
    fills = [x for x in marks if x["ev"] == "disk_full"]
    return {
        "per_version": rows,
        "counts": dict(counts),
        **end,
        "fills": len(fills),
        "ballast_mb": [x["ballast_mb"] for x in fills],
        "cycles": cycles_table(marks, events),
        "marks": marks,
        "timeline": timeline,
    }


def report(out: Path, res: dict, params: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    timeline = res.pop("timeline")
    (out / "summary.json").write_text(json.dumps({"params": params, **res}, indent=1) + "\n")
    with open(out / "timeline.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(timeline[0]))
        w.writeheader()
        w.writerows(timeline)
    md = [
        "# Disk full under traffic (`c2dtn perf diskfull`)",
        "",
        f"gw1's custody store and session file on a {params['disk_mb']} MB tmpfs; {params['clients']} QoS 1 "
        f"publishers ({params['size']} B, {params['rate']:g}/s each; half MQTT 5, half 3.1.1 with a kept session); "
        f"{params['cycles']} cycles of: link cut, disk filled by a ballast file, full for {params['full_s']:g} s, "
        f"ballast removed, link back.",
        "",
        "| client | published | PUBACK 0 | refused (reason) | disconnected | resent on reconnect | never answered | "
        "PUBACKed and lost | delivered twice or more | refused yet delivered |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in res["per_version"].items():
        why = ", ".join(f"{k}: {n}" for k, n in r["refusal_reasons"].items()) or "-"
        md.append(
            f"| {name} | {r['published']} | {r['acked']} | {r['refused']} ({why}) | {r['disconnects']} | "
            f"{r['resent']} | {r['no_answer']} | **{r['acked_lost']}** | {r['delivered_twice_or_more']} | "
            f"{r['refused_delivered']} |"
        )
    md += [
        "",
        "Each cycle: the ballast written; how long the store went on taking publishes in room its own files "
        "had (pages freed by deliveries, the WAL grown before) and how many; then, for the time the disk stayed "
        "full, MQTT 5 refusals, 3.1.1 disconnects and publishes taken (should be 0):",
        "",
        "| cycle | ballast | store took into its own room | for | full, refusing | refused 0x97 | "
        "3.1.1 disconnects | taken while refusing |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    md += [
        f"| {r['cycle']} | {r['ballast_mb']} MB | {r['taken_into_slack']} | {r['slack_s']} s | {r['full_s']} s | "
        f"{r['refused_0x97']} | {r['v311_disconnects']} | {r['taken_while_full']} |"
        for r in res["cycles"]
    ]
    md += [
        "",
        f"gw1 at the end: {res['held_at_end']} envelopes held; `PRAGMA integrity_check`: {res['integrity']}; "
        "its files: "
        + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in res["store_files"].items())
        + f"; {res['disk_free_kb_at_end'] / 1024:.1f} MB of the {params['disk_mb']} MB disk free.",
        "",
        "| the overlay while full | count |",
        "|---|---:|",
    ]
    md += [f"| {k} | {v} |" for k, v in sorted(res["counts"].items())]
    md += [
        "",
        f"Gateway counters: {json.dumps(res['gateway_counters'])}",
        "",
        "What c2dtn logged (by message; the first three of each in [gateway.log](gateway.log)):",
        "",
        "| times | message |",
        "|---:|---|",
    ]
    md += [f"| {n} | `{k}` |" for k, n in res.get("logged", {}).items()]
    md += ["", "| at | event |", "|---:|---|"]
    md += [
        f"| {x['t']:.1f} s | {x['ev']}" + "".join(f", {k} {v}" for k, v in x.items() if k not in ("t", "ev")) + " |"
        for x in res["marks"]
    ]
    md += ["", "![acknowledged, refused and held over time](plot.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    ts = [p["t"] for p in timeline]
    for key, label in (
        ("acked", "PUBACK 0 (all clients)"),
        ("refused", "refused, 0x97 (MQTT 5)"),
        ("delivered", "delivered at gw4"),
        ("disconnects", "3.1.1 disconnects"),
    ):
        ax.plot(ts, [p[key] for p in timeline], label=label)
    ax.set_ylabel("messages (cumulative)")
    ax.legend(fontsize=8)
    ax2.plot(ts, [p["held"] for p in timeline], label="envelopes held at gw1")
    ax2b = ax2.twinx()
    ax2b.plot(ts, [p["disk_free_kb"] / 1024 for p in timeline], color="grey", ls=":", label="disk free (MB)")
    ax2b.set_ylabel("disk free (MB)")
    ax2.set_ylabel("held")
    ax2.set_xlabel("s (grey: disk full, ballast written; hatched: link cut)")
    fulls = [x["t"] for x in res["marks"] if x["ev"] == "disk_full"]
    frees = [x["t"] for x in res["marks"] if x["ev"] == "disk_freed"]
    downs = [x["t"] for x in res["marks"] if x["ev"] == "link_down"]
    ups = [x["t"] for x in res["marks"] if x["ev"] == "link_up"]
    for a0 in (ax, ax2):
        for a, b in zip(fulls, frees):
            a0.axvspan(a, b, color="grey", alpha=0.25)
        for a, b in zip(downs, ups):
            a0.axvspan(a, b, fill=False, hatch="//", alpha=0.15)
    ax.set_title("Disk full under QoS 1 traffic: refused while full, delivered once after")
    save_figure(fig, out / "plot.png")
    res["timeline"] = timeline
    return "\n".join(md[:8])


def main(
    cycles: int = 3,
    clients: int = 4,
    rate: float = 20.0,
    size: int = 1024,
    disk_mb: int = 16,
    full_s: float = 6.0,
    drain_s: float = 120.0,
    out: Path | None = None,
    console=None,
) -> tuple[Path, dict]:
    if clients < 2 or clients % 2:
        raise ValueError(f"--clients {clients}: an even number from 2 (half MQTT 5, half 3.1.1)")
    out = out or run_dir("diskfull")
    phases = Phases(full_s=full_s, tail=6.0 if cycles > 1 else 2.0)
    params = {
        "cycles": cycles,
        "clients": clients,
        "rate": rate,
        "size": size,
        "disk_mb": disk_mb,
        "full_s": full_s,
        "phases": phases.__dict__,
        "link_delay_ms": LINK_DELAY_MS,
    }
    with tempfile.TemporaryDirectory(prefix="c2diskfull-") as td, progress(console) as bar:
        disk, far = Path(td) / "c2-small-disk", Path(td) / "far"
        far.mkdir()
        mount_tmpfs(disk, disk_mb)
        try:
            with tally_logs() as tally:  # counted into the report, not one console line per refusal
                res = asyncio.run(_campaign(disk, far, clients, rate, size, cycles, phases, drain_s, bar))
        finally:
            umount(disk)
    res["logged"] = dict(tally.counts.most_common())
    out.mkdir(parents=True, exist_ok=True)
    (out / "gateway.log").write_text("\n".join(tally.first) + "\n")
    text = report(out, res, params)
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out, res
