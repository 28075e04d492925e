"""Power loss under load: is every PUBACKed message still in custody after the cut?

`c2dtn perf powerloss` (the power-loss campaign).  The near MQTT gateway of
`perf fsync` (fsync_bench.serve: the gateway on its custody store, no BPA) runs in a
child process with perf/slow_fsync.c preloaded: every fsync copies the file as it then
is aside (C2_DURABLE_DIR), which is what a disk that keeps exactly what was fsynced, and
nothing else, still holds after a power cut.  --clients MQTT clients publish QoS 1 at
--rate a second each; at a random moment 1-4 s in, the child is SIGKILLed, and its
custody files are put back as the disk would have them (the fsynced copies; a file never
fsynced is gone, the -shm index too).  The store is then opened as the gateway would open
it on the next boot, checked (PRAGMA integrity_check), and every message whose PUBACK a
client received is looked for in it.

Modes, --cycles cuts each, taking turns:
  loop      `[node] fsync = "loop"`: each commit fsyncs on the event loop
  thread    `[node] fsync = "thread"`: the writer thread, replies after its fsync
  auto      `[node] fsync = "auto"` (the default): as thread, the fsync on the event loop
            while the disk's fsyncs take under 2 ms (overlay/syncer.py): with --disk-ms 1
            the cuts land while fsyncs run on the loop, with 5 or more in the thread
  unsynced  a control: commits as in thread mode, but the replies do not wait for any fsync
            (the bug the writer thread must not have); it must show losses, or the
            campaign could not see one

The model keeps, per file, the contents at its last fsync: a real disk may keep more of
what was not fsynced, or tear a page; SQLite's WAL checksums cover the torn tail.
Directory entries are not modelled (the custody files are created once, at the first
start; a body file is fsynced, and its folder, before the COMMIT naming it).  With
--payload-bytes of 262144 and up each body is a file of its own (store_sqlite.FILE_BODY_BYTES),
put back as last fsynced too.  Writes results/<time>-powerloss/ with report.md, summary.json and plot.png.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from c2dtn.ip_gateway import mqtt as m
from c2dtn.perf.fsync_bench import _connect, _free_port, read_pubacks, shim
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir

MODES = ("loop", "thread", "auto", "unsynced")
CUSTODY_FILES = ("custody.db", "custody.db-wal")
BODY_FILES = "custody.db.bodies"  # large bodies, a file each (--payload-bytes 262144 and up: store/sqlite.py)


async def _publisher(i: int, port: int, rate: float, acked: set, sent: list, payload_bytes: int = 0) -> None:
    r, w, parser = await _connect(port, f"c2power-{i}")
    pending: dict[int, str] = {}
    rd = asyncio.create_task(read_pubacks(r, parser, pending, acked.add))
    t0 = time.monotonic() + i / (rate * 16)
    k = 0
    try:
        while not rd.done():
            await asyncio.sleep(max(0.0, t0 + k / rate - time.monotonic()))
            msg = f"{i}:{k}"
            pending[k % 65535 + 1] = msg
            body = msg.encode().ljust(payload_bytes, b".")  # the message's name, then padding
            w.write(m.encode(m.Publish(f"c2/power/{i}", body, qos=1, packet_id=k % 65535 + 1), 4))
            sent.append(msg)
            k += 1
            await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        rd.cancel()
        w.close()


def restore(storage: Path, durable: Path) -> list[str]:
    """The custody files as the disk would hold them after the cut; returns what was done."""
    done = []
    for name in CUSTODY_FILES:
        f = storage / name
        copy = durable / str(f).replace("/", "%")
        if copy.exists():
            shutil.copyfile(copy, f)
            done.append(f"{name}: as last fsynced ({copy.stat().st_size} B)")
        elif f.exists():
            f.unlink()
            done.append(f"{name}: never fsynced, gone")
    (storage / "custody.db-shm").unlink(missing_ok=True)
    # body files likewise, each as last fsynced (its own fsync, before the COMMIT naming it)
    folder = storage / BODY_FILES
    prefix = str(folder).replace("/", "%") + "%"
    kept = {
        p.name[len(prefix) :] for p in durable.iterdir() if p.name.startswith(prefix) and not p.name.endswith(".tmp")
    }
    there = set(os.listdir(folder)) if folder.is_dir() else set()
    for name in kept:
        shutil.copyfile(durable / (prefix + name), folder / name)
    for name in there - kept:
        (folder / name).unlink()
    if kept or there:
        done.append(f"{BODY_FILES}: {len(kept)} files as last fsynced, {len(there - kept)} never fsynced, gone")
    return done


def read_back(storage: Path) -> tuple[set[str], str]:
    """The MQTT payloads the store holds after the cut, and SQLite's integrity check."""
    from c2dtn.ip_gateway import bodies
    from c2dtn.overlay.custody import CustodyStore

    store = CustodyStore(storage / "custody.db", "c2gw1")  # as the gateway's next boot opens it
    try:
        integrity = store.records.db.execute("PRAGMA integrity_check").fetchone()[0]
        held = set()
        for (body,) in store.records.db.execute("SELECT body FROM bodies"):
            held.update(
                x["p"].rstrip(b".").decode() for x in bodies.publishes(bodies.unpack(store.records.body_of(body)))
            )
        return held, integrity
    finally:
        store.close()


def one_cut(
    mode: str,
    cycle: int,
    clients: int,
    rate: float,
    disk_ms: int,
    lib: Path,
    rng: random.Random,
    payload_bytes: int = 0,
) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="c2power-") as td:
        storage, durable = Path(td) / "store", Path(td) / "durable"
        storage.mkdir()
        durable.mkdir()
        env = dict(os.environ, LD_PRELOAD=str(lib), C2_FSYNC_DELAY_MS=str(disk_ms), C2_DURABLE_DIR=str(durable))
        child = subprocess.Popen(
            [sys.executable, "-m", "c2dtn.perf.fsync_bench", "serve", mode, str(storage), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        acked: set[str] = set()
        sent: list[str] = []
        cut_after = rng.uniform(1.0, 4.0)
        try:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the {mode} gateway did not start (exit {child.wait(10)})")

            async def load() -> None:
                pubs = [
                    asyncio.create_task(_publisher(i, port, rate, acked, sent, payload_bytes)) for i in range(clients)
                ]
                await asyncio.sleep(cut_after)
                child.send_signal(signal.SIGKILL)  # the power cut: nothing more reaches the disk
                await asyncio.wait_for(asyncio.gather(*pubs, return_exceptions=True), 30)

            asyncio.run(load())
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
        steps = restore(storage, durable)
        try:
            held, integrity = read_back(storage)
        except Exception as e:  # a store the next boot cannot open: everything it held is lost
            held, integrity = set(), f"unreadable: {e}"
    lost = sorted(acked - held)
    return {
        "mode": mode,
        "cycle": cycle,
        "cut_after_s": round(cut_after, 2),
        "published": len(sent),
        "acked": len(acked),
        "held": len(held & set(sent)),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "kept_unacked": len((held & set(sent)) - acked),
        "integrity": integrity,
        "restore": steps,
    }


def summarize(rows: list[dict]) -> dict:
    out = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if mine:
            out[mode] = {
                "cuts": len(mine),
                "published": sum(r["published"] for r in mine),
                "acked": sum(r["acked"] for r in mine),
                "lost": sum(r["lost"] for r in mine),
                "cuts_with_loss": sum(1 for r in mine if r["lost"]),
                "kept_unacked": sum(r["kept_unacked"] for r in mine),
                "integrity_failures": sum(1 for r in mine if r["integrity"] != "ok"),
            }
    return out


LABEL = {
    "loop": "fsync on the loop",
    "thread": "writer thread",
    "auto": "auto: loop while fast (default)",
    "unsynced": "control: replies not waiting",
}


def report(out: Path, rows: list[dict], params: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    tot = summarize(rows)
    (out / "summary.json").write_text(json.dumps({"params": params, "cuts": rows, "total": tot}, indent=1) + "\n")
    md = [
        "# Power loss under load: PUBACKed messages after the cut (`c2dtn perf powerloss`)",
        "",
        f"{params['clients']} clients x {params['rate']:g} QoS 1 publishes/s"
        + (f" of {params['payload_bytes']:,} bytes" if params.get("payload_bytes") else "")
        + f", the gateway SIGKILLed 1-4 s in and its custody files put back as last fsynced; every fsync "
        f"{params['disk_ms']} ms slower.",
        "",
        "| mode | cuts | published | PUBACKed | PUBACKed and lost | cuts with a loss | kept, not PUBACKed | "
        "integrity failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, t in tot.items():
        md.append(
            f"| {LABEL[mode]} | {t['cuts']} | {t['published']} | {t['acked']} | **{t['lost']}** | "
            f"{t['cuts_with_loss']} | {t['kept_unacked']} | {t['integrity_failures']} |"
        )
    md += [
        "",
        "Each cut:",
        "",
        "| mode | cut | after | published | PUBACKed | lost | kept, not PUBACKed | integrity |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    md += [
        f"| {r['mode']} | {r['cycle']} | {r['cut_after_s']} s | {r['published']} | {r['acked']} | {r['lost']} | "
        f"{r['kept_unacked']} | {r['integrity']} |"
        for r in rows
    ]
    md += ["", "![lost per cut](plot.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for mode in tot:
        mine = [r for r in rows if r["mode"] == mode]
        ax.plot([r["acked"] for r in mine], [r["lost"] for r in mine], "o", label=LABEL[mode])
    ax.set_xlabel("messages PUBACKed before the cut")
    ax.set_ylabel("of those, missing after it")
    ax.set_title("Power cut under QoS 1 load: what the gateway acknowledged and then lost")
    ax.legend()
    save_figure(fig, out / "plot.png")
    return "\n".join(md[: len(tot) + 6])


def main(
    cycles: int,
    clients: int,
    rate: float,
    disk_ms: int,
    modes=MODES,
    seed: int = 1,
    out: Path | None = None,
    console=None,
    payload_bytes: int = 0,
) -> Path:
    lib = shim()
    out = out or run_dir("powerloss")
    rng = random.Random(seed)
    rows: list[dict] = []
    with progress(console, "cuts") as bar:
        task = bar.add_task("power cuts", total=cycles * len(modes))
        for c in range(cycles):
            for mode in modes:
                bar.update(task, description=f"cut {c + 1}: {mode}")
                rows.append(one_cut(mode, c, clients, rate, disk_ms, lib, rng, payload_bytes))
                bar.advance(task)
    text = report(
        out,
        rows,
        {
            "cycles": cycles,
            "clients": clients,
            "rate": rate,
            "disk_ms": disk_ms,
            "modes": list(modes),
            "seed": seed,
            "payload_bytes": payload_bytes,
        },
    )
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out
