"""PUBACK latency on a slow disk: custody fsyncs on the event loop against the writer thread.

`c2dtn perf fsync` ("one slow disk stalls every client").  A near MQTT gateway
(ip_gateway.MqttGateway on its custody store) runs in a child process whose fsync and
fdatasync take --disk-ms longer (LD_PRELOAD of perf/slow_fsync.c: the SD card or eMMC of
an edge box).  No BPA: what the gateway's pump plans is dropped once the fsync covered
it, as by an agent that takes everything -- the agent is not on a PUBACK's path, the disk
is.  --clients MQTT 3.1.1 clients each publish QoS 1 (256 B) --rate times a second for
--duration s, open loop (each on its time, whatever the acks do); one more client sends a
PINGREQ every 50 ms (a client that asks nothing of the disk).  The two `[node] fsync`
modes take turns, --runs times each:

  loop    each durable commit fsyncs on the event loop (how c2dtn did it first)
  thread  commits return unsynced; one writer thread fsyncs for all commits made
          meanwhile and the replies wait for it (overlay/syncer.py)

Figures per run (the first second left out as warm-up): PUBACK latency p50 / p99 / max,
PINGRESP p99, PUBACKs received of those sent, fsyncs the store asked for per message.
Medians over the runs; thread / loop ratios from the same session.  Writes
results/<time>-fsync/ with report.md, summary.json, latency.csv and plot.png (+ .json).
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import ipaddress
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from c2dtn.ip_gateway import mqtt as m
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir

MODES = ("loop", "thread")
PAYLOAD = 256
WARMUP_S = 1.0
PING_EVERY_S = 0.05
SHIM = Path(__file__).with_name("slow_fsync.c")


# -- the child: a near gateway on its custody store, fsync slowed by the shim ------------
def gateway_config(port: int):
    from c2dtn.ip_gateway.policy import GatewayConfig, Policy, TopicRule
    from c2dtn.overlay.envelope import Priority

    return GatewayConfig(
        listen=("127.0.0.1", port),
        broker=("10.9.9.9", 1883),
        policy=Policy(
            routes=[(ipaddress.ip_network("10.9.9.0/24"), "c2gw4")], topics=[TopicRule("c2/#", Priority.PRIORITY)]
        ),
    )


async def serve(mode: str, storage: Path, port: int) -> dict:
    """Run the gateway until SIGTERM; return the store's counts.  mode: loop, thread, auto or unsynced."""
    from c2dtn.ip_gateway.gateway import MqttGateway
    from c2dtn.overlay.core import OverlayCore
    from c2dtn.overlay.custody import CustodyStore, Quota
    from c2dtn.overlay.envelope import Codec
    from c2dtn.overlay.port import Port
    from c2dtn.overlay.syncer import Syncer

    # "unsynced" (perf powerloss's control): commits as with "thread", but no writer thread and
    # nothing waits -- the replies go before anything is on disk, as a gateway with that bug would
    store = CustodyStore(
        storage / "custody.db",
        "c2gw1",
        Quota(10_000_000, 1 << 40),
        background_checkpoints=True,
        sync="thread" if mode == "unsynced" else mode,
    )
    core = OverlayCore(store, Codec("c2gw1", {"c2gw4": b"k" * 32}))
    syncer = Syncer(store.records, inline=mode == "auto") if mode in ("thread", "auto") else None
    if syncer:
        syncer.start()
    node = Port(core, syncer, storage)  # the gateway's view of a node, with no agent behind it
    gw = MqttGateway(node, gateway_config(port))
    await gw.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    commits0 = store.records.commits

    async def pump() -> None:  # as the node's: plan, wait for the fsync, hand over (here: drop)
        while not stop.is_set():
            await asyncio.sleep(0.02)
            if core.poll(int(time.time() * 1000)):
                await node.synced()

    async def checkpoints() -> None:  # as the node's, off the loop
        while not stop.is_set():
            await asyncio.sleep(0.5)
            await asyncio.get_running_loop().run_in_executor(None, store.records.checkpoint)

    tasks = [asyncio.create_task(pump()), asyncio.create_task(checkpoints())]
    print("ready", flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await gw.stop()
    out = {
        "commits": store.records.commits - commits0,
        "fsyncs": syncer.fsyncs if syncer else store.records.commits - commits0,
        "accepted": store.counters().get("accepted", 0),
    }
    if syncer:
        syncer.stop()
    store.close()
    return out


# -- the parent: clients and figures ------------------------------------------------------------
def shim() -> Path:
    """The slow-fsync library, compiled once per version of its source into the cache."""
    src = SHIM.read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "c2dtn"
    lib = cache / f"slow_fsync-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if not lib.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(".partial")
        r = subprocess.run(
            ["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SHIM), "-ldl"], capture_output=True, text=True
        )
        if r.returncode:
            raise RuntimeError(f"cc could not build {SHIM}: {r.stderr.strip()[-500:]}")
        tmp.replace(lib)
    return lib


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _connect(port: int, cid: str):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(m.encode(m.Connect(cid, clean_start=True, keepalive=60), 4))
    parser = m.Parser(version=4)
    while True:
        pkts = parser.feed(await r.read(65536))
        if pkts:
            assert isinstance(pkts[0], m.ConnAck), pkts
            return r, w, parser


async def read_pubacks(r: asyncio.StreamReader, parser: m.Parser, pending: dict, on_ack) -> None:
    """Until the connection ends: for each PUBACK of a packet id in `pending`, on_ack(what
    pending held for it), the id taken out."""
    while True:
        data = await r.read(65536)
        if not data:
            return
        for p in parser.feed(data):
            if isinstance(p, m.PubAck) and p.packet_id in pending:
                on_ack(pending.pop(p.packet_id))


async def _publisher(i: int, port: int, rate: float, duration: float, t0: float, lat: list) -> tuple[int, int]:
    r, w, parser = await _connect(port, f"c2fsync-{i}")
    sent: dict[int, float] = {}
    body = b"x" * PAYLOAD
    rd = asyncio.create_task(
        read_pubacks(r, parser, sent, lambda t: lat.append((t - t0, (time.monotonic() - t) * 1000)))
    )
    n = int(rate * duration)
    start = t0 + i / (rate * 64)  # the clients spread over the first interval
    for k in range(n):
        await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))
        pid = k % 65535 + 1
        sent[pid] = time.monotonic()
        w.write(m.encode(m.Publish(f"c2/fsync/{i}", body, qos=1, packet_id=pid), 4))
    deadline = time.monotonic() + 30
    while sent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    rd.cancel()
    w.write(m.encode(m.Disconnect(), 4))
    w.close()
    return n, n - len(sent)


async def _pinger(port: int, duration: float, t0: float, lat: list) -> None:
    r, w, parser = await _connect(port, "c2fsync-ping")
    while time.monotonic() < t0 + duration:
        t = time.monotonic()
        w.write(m.encode(m.PingReq(), 4))
        while not any(isinstance(p, m.PingResp) for p in parser.feed(await r.read(65536))):
            pass
        lat.append((t - t0, (time.monotonic() - t) * 1000))
        await asyncio.sleep(max(0.0, t + PING_EVERY_S - time.monotonic()))
    w.write(m.encode(m.Disconnect(), 4))
    w.close()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_run(
    mode: str, run: int, clients: int, rate: float, duration: float, disk_ms: int, lib: Path, samples: list
) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="c2fsync-", dir=os.environ.get("C2DTN_FSYNC_DIR")) as td:
        env = dict(os.environ, LD_PRELOAD=str(lib), C2_FSYNC_DELAY_MS=str(disk_ms))
        child = subprocess.Popen(
            [sys.executable, "-m", "c2dtn.perf.fsync_bench", "serve", mode, td, str(port)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the {mode} gateway did not start (exit {child.wait(10)})")
            pub_lat: list = []
            ping_lat: list = []

            async def load():
                t0 = time.monotonic() + 0.2
                ping = asyncio.create_task(_pinger(port, duration, t0, ping_lat))
                counts = await asyncio.gather(
                    *(_publisher(i, port, rate, duration, t0, pub_lat) for i in range(clients))
                )
                await ping
                return counts

            counts = asyncio.run(load())
        finally:
            child.send_signal(signal.SIGTERM)
            tail, _ = child.communicate(timeout=60)
    store = json.loads(tail.strip().splitlines()[-1])
    sent = sum(c[0] for c in counts)
    acked = sum(c[1] for c in counts)
    lat = [ms for t, ms in pub_lat if t >= WARMUP_S]
    pings = [ms for t, ms in ping_lat if t >= WARMUP_S]
    samples += [(mode, run, "puback", round(t, 4), round(ms, 3)) for t, ms in pub_lat]
    samples += [(mode, run, "pingresp", round(t, 4), round(ms, 3)) for t, ms in ping_lat]
    return {
        "mode": mode,
        "run": run,
        "sent": sent,
        "acked": acked,
        "puback_p50_ms": statistics.median(lat),
        "puback_p99_ms": _pct(lat, 0.99),
        "puback_max_ms": max(lat),
        "ping_p50_ms": statistics.median(pings),
        "ping_p99_ms": _pct(pings, 0.99),
        "fsyncs_per_msg": store["fsyncs"] / max(1, acked),
        "commits": store["commits"],
        "fsyncs": store["fsyncs"],
    }


FIGS = [
    ("puback_p50_ms", "PUBACK p50", "ms"),
    ("puback_p99_ms", "PUBACK p99", "ms"),
    ("puback_max_ms", "PUBACK max", "ms"),
    ("ping_p99_ms", "PINGRESP p99", "ms"),
    ("fsyncs_per_msg", "fsyncs / message", ""),
]


def summarize(rows: list[dict]) -> dict:
    med = {mode: {k: statistics.median(r[k] for r in rows if r["mode"] == mode) for k, _, _ in FIGS} for mode in MODES}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        med[mode]["sent"] = sum(r["sent"] for r in mine)
        med[mode]["acked"] = sum(r["acked"] for r in mine)
    med["ratio"] = {k: med["thread"][k] / med["loop"][k] if med["loop"][k] else None for k, _, _ in FIGS}
    return med


def report(out: Path, rows: list[dict], samples: list, params: dict) -> str:
    med = summarize(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"params": params, "runs": rows, "median": med}, indent=1) + "\n")
    with open(out / "latency.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["mode", "run", "kind", "t_s", "latency_ms"])
        wr.writerows(samples)
    md = [
        "# PUBACK latency on a slow disk: fsync on the event loop or in the writer thread (`c2dtn perf fsync`)",
        "",
        f"{params['clients']} clients x {params['rate']:g} QoS 1 publishes/s ({PAYLOAD} B) for "
        f"{params['duration']:g} s, one PINGREQ every {PING_EVERY_S * 1000:.0f} ms, every fsync "
        f"{params['disk_ms']} ms slower; {params['runs']} runs per mode, taking turns; medians of the runs "
        f"(the first {WARMUP_S:g} s of each left out).",
        "",
        "| figure | fsync on the loop | writer thread | thread / loop |",
        "|---|---:|---:|---:|",
    ]
    for k, label, unit in FIGS:
        r = med["ratio"][k]
        md.append(
            f"| {label} | {med['loop'][k]:.2f} {unit} | {med['thread'][k]:.2f} {unit} | "
            f"{'-' if r is None else f'{r:.2f}'} |"
        )
    md.append(
        f"| PUBACKs received / sent (all runs) | {med['loop']['acked']} / {med['loop']['sent']} | "
        f"{med['thread']['acked']} / {med['thread']['sent']} | |"
    )
    md += [
        "",
        "Each run:",
        "",
        "| mode | run | sent | acked | PUBACK p50 | p99 | max | PINGRESP p99 | fsyncs / msg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    md += [
        f"| {r['mode']} | {r['run']} | {r['sent']} | {r['acked']} | {r['puback_p50_ms']:.1f} | "
        f"{r['puback_p99_ms']:.1f} | {r['puback_max_ms']:.1f} | {r['ping_p99_ms']:.1f} | {r['fsyncs_per_msg']:.3f} |"
        for r in rows
    ]
    md += ["", "![latency CDFs](plot.png)", "", "Samples: latency.csv (every PUBACK and PINGRESP, all runs)."]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, kind, title in (
        (axes[0], "puback", "PUBACK latency (QoS 1 publishes)"),
        (axes[1], "pingresp", "PINGRESP latency (a client that writes nothing)"),
    ):
        for mode in MODES:
            xs = sorted(ms for md_, _, k, t, ms in samples if md_ == mode and k == kind and t >= WARMUP_S)
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"fsync {mode}")
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of replies")
        ax.set_title(title)
        ax.legend()
    save_figure(fig, out / "plot.png")
    return "\n".join(md[: len(FIGS) + 6])


def main(
    runs: int, clients: int, rate: float, duration: float, disk_ms: int, out: Path | None = None, console=None
) -> Path:
    lib = shim()
    out = out or run_dir("fsync")
    rows: list[dict] = []
    samples: list = []
    with progress(console, "runs") as bar:
        task = bar.add_task("fsync loop / thread, taking turns", total=runs * len(MODES))
        for run in range(runs):
            for mode in MODES if run % 2 == 0 else MODES[::-1]:
                bar.update(task, description=f"run {run + 1}: fsync {mode}")
                rows.append(one_run(mode, run, clients, rate, duration, disk_ms, lib, samples))
                bar.advance(task)
    text = report(
        out, rows, samples, {"runs": runs, "clients": clients, "rate": rate, "duration": duration, "disk_ms": disk_ms}
    )
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    mode, storage, port = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(serve(mode, storage, port))), flush=True)
