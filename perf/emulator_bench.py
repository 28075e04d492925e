"""Benchmark of the userspace channel emulator.

Two nodes joined by one emulated link with no rate limit and a fixed one-way
delay (50 ms each way by default); a TCP bulk transfer from one to the other.
Prints, per run and as the median: goodput, frames forwarded (both directions),
and the emulator's CPU time per forwarded frame, next to the target
(>= 100 Mbit/s through 50 ms).  Replaces whatever topology is up.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from c2dtn.topologies import netns, testbed

TARGET_MBPS = 100.0
PORT = 47100

TOPOLOGY = """
name = "emu-bench"
description = "two nodes, one emulated link without rate limit"
[addressing]
pool = "10.81.0.0/16"
[[nodes]]
name = "bench-a"
[[nodes]]
name = "bench-b"
[[links]]
a = "bench-a"
b = "bench-b"
profile = {{ delay = "{delay}" }}
"""


def _transfer(st: dict, seconds: float, on_tick) -> tuple[int, float]:
    """TCP from bench-a to bench-b for `seconds`; returns (bytes, seconds) seen by the receiver."""
    srv = netns.socket_in(testbed.node_netns(st, "bench-b"), socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", PORT))
    srv.listen(1)
    result = {}

    def receive() -> None:
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        total = 0
        first = None
        while True:
            n = conn.recv_into(view)
            if not n:
                break
            if first is None:
                first = time.monotonic()
            total += n
        result["bytes"] = total
        result["secs"] = time.monotonic() - (first or time.monotonic())
        conn.close()

    rx = threading.Thread(target=receive, daemon=True)
    rx.start()
    cli = netns.socket_in(testbed.node_netns(st, "bench-a"), socket.AF_INET, socket.SOCK_STREAM)
    cli.connect((testbed.node_address(st, "bench-b"), PORT))
    chunk = bytes(256 * 1024)
    start = time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        cli.sendall(chunk)
        on_tick(min(1.0, (now - start) / seconds))
    cli.shutdown(socket.SHUT_WR)
    rx.join(timeout=30)
    cli.close()
    srv.close()
    return result.get("bytes", 0), result.get("secs", 0.0)


def main(seconds: float = 10.0, runs: int = 3, delay: str = "50ms") -> dict:
    console = Console()
    netns.require_root()
    with tempfile.TemporaryDirectory() as td:
        path = Path(td) / "emu-bench.toml"
        path.write_text(TOPOLOGY.format(delay=delay))
        st = testbed.up(str(path), backend="userspace", progress=lambda m: console.print(f"[dim]topo:[/dim] {m}"))
    ctl = next(iter(st["links"].values()))["control"]
    rows = []
    try:
        with Progress(
            TextColumn("[bold]TCP through the emulator[/bold] {task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=console,
        ) as prog:
            task = prog.add_task("", total=runs)
            for i in range(runs):
                before = testbed.emu_call(ctl, {"cmd": "status"})
                nbytes, secs = _transfer(
                    st, seconds, lambda f, i=i: prog.update(task, completed=i + f, description=f"run {i + 1}/{runs}")
                )
                after = testbed.emu_call(ctl, {"cmd": "status"})
                frames = sum(after[d]["delivered"] - before[d]["delivered"] for d in ("ab", "ba"))
                cpu = after["cpu_s"] - before["cpu_s"]
                rows.append(
                    {
                        "goodput_mbps": nbytes * 8 / secs / 1e6 if secs else 0.0,
                        "frames": frames,
                        "cpu_us_per_frame": cpu / frames * 1e6 if frames else float("nan"),
                        "cpu_s": cpu,
                        "secs": secs,
                    }
                )
                prog.update(task, completed=i + 1)
    finally:
        testbed.down()
    t = Table(title=f"userspace emulator: TCP through {delay} one-way delay, no rate limit")
    for c in ("run", "goodput", "frames forwarded", "emulator CPU", "CPU per frame", "goodput / target"):
        t.add_column(c, justify="right")
    for i, r in enumerate(rows, 1):
        t.add_row(
            str(i),
            f"{r['goodput_mbps']:.1f} Mbit/s",
            f"{r['frames']:,}",
            f"{r['cpu_s']:.2f} s",
            f"{r['cpu_us_per_frame']:.1f} µs",
            f"{r['goodput_mbps'] / TARGET_MBPS:.2f}",
        )
    med = {k: statistics.median(r[k] for r in rows) for k in ("goodput_mbps", "cpu_us_per_frame", "frames")}
    t.add_row(
        "median",
        f"{med['goodput_mbps']:.1f} Mbit/s",
        f"{med['frames']:,.0f}",
        "",
        f"{med['cpu_us_per_frame']:.1f} µs",
        f"{med['goodput_mbps'] / TARGET_MBPS:.2f}",
        style="bold",
    )
    console.print(t)
    console.print(
        f"target: at least {TARGET_MBPS:.0f} Mbit/s of TCP goodput through {delay}; "
        f"median ratio {med['goodput_mbps'] / TARGET_MBPS:.2f} "
        f"({'met' if med['goodput_mbps'] >= TARGET_MBPS else 'NOT met'})"
    )
    return {"runs": rows, "median": med}


if __name__ == "__main__":
    main()
