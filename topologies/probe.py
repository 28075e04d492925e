"""UDP traffic probes between two nodes of a running topology.

Both ends run in this process: the sockets are made inside the nodes'
namespaces, and one clock (CLOCK_MONOTONIC, shared by every namespace) stamps
sending and arrival, so one-way delay is measured directly.

Frame bytes are counted as netem counts them: the L2 frame, i.e. the UDP
payload plus 8 (UDP) + 20 (IPv4) + 14 (Ethernet) bytes.
"""

from __future__ import annotations

import select
import socket
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from c2dtn.topologies import netns, testbed

HEADER = struct.Struct("!IQ")  # sequence number, send time (ns, CLOCK_MONOTONIC)
FRAME_OVERHEAD = 8 + 20 + 14
PORT = 47001

Tick = Callable[[float, str], None]  # fraction done, text


@dataclass
class Arrival:
    seq: int
    sent: float
    received: float
    frame_bytes: int

    @property
    def delay(self) -> float:
        return self.received - self.sent


@dataclass
class ProbeRun:
    sent: dict[int, float] = field(default_factory=dict)
    arrivals: list[Arrival] = field(default_factory=list)
    duplicates: int = 0

    def received_seqs(self) -> set[int]:
        return {a.seq for a in self.arrivals}

    def loss(self) -> float:
        return 1 - len(self.received_seqs()) / len(self.sent) if self.sent else 0.0


def _pair(st: dict[str, Any], src: str, dst: str, port: int) -> tuple[socket.socket, socket.socket, tuple[str, int]]:
    dst_addr = testbed.node_address(st, dst)
    rx = netns.socket_in(testbed.node_netns(st, dst))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind(("0.0.0.0", port))
    rx.setblocking(False)
    tx = netns.socket_in(testbed.node_netns(st, src))
    tx.setblocking(False)
    return tx, rx, (dst_addr, port)


def _drain(rx: socket.socket, run: ProbeRun, seen: set[int]) -> None:
    while True:
        try:
            data = rx.recv(65536)
        except BlockingIOError:
            return
        now = time.monotonic()
        if len(data) < HEADER.size:
            continue
        seq, sent_ns = HEADER.unpack_from(data)
        if seq in seen:
            run.duplicates += 1
            continue
        seen.add(seq)
        run.arrivals.append(Arrival(seq, sent_ns / 1e9, now, len(data) + FRAME_OVERHEAD))


def send_stream(
    st: dict[str, Any],
    src: str,
    dst: str,
    *,
    count: int | None = None,
    duration_s: float | None = None,
    interval_s: float,
    payload: int = 12,
    drain_s: float = 2.0,
    port: int = PORT,
    on_tick: Tick | None = None,
) -> ProbeRun:
    """Send datagrams from src to dst every `interval_s` (for `count` datagrams or
    `duration_s` seconds), then keep receiving for `drain_s`."""
    if payload < HEADER.size:
        raise ValueError(f"payload {payload} is smaller than the {HEADER.size}-byte probe header")
    tx, rx, addr = _pair(st, src, dst, port)
    run = ProbeRun()
    seen: set[int] = set()
    pad = bytes(payload - HEADER.size)
    start = time.monotonic()
    end_send = start + duration_s if duration_s is not None else None
    seq = 0
    next_send = start
    last_tick = 0.0
    try:
        while True:
            now = time.monotonic()
            sending = (count is None or seq < count) and (end_send is None or now < end_send)
            if sending and now >= next_send:
                try:
                    tx.sendto(HEADER.pack(seq, time.monotonic_ns()) + pad, addr)
                    run.sent[seq] = now
                except (BlockingIOError, OSError):
                    run.sent[seq] = now  # the sender's own stack dropped it: counts as sent and lost
                seq += 1
                next_send += interval_s
                continue
            if not sending:
                if now >= (last_send_end := max(run.sent.values(), default=start)) + drain_s:
                    break
            timeout = max(0.0, (next_send if sending else last_send_end + drain_s) - now)
            r, _, _ = select.select([rx], [], [], min(timeout, 0.2))
            if r:
                _drain(rx, run, seen)
            if on_tick and now - last_tick > 0.25:
                last_tick = now
                frac = seq / count if count else (now - start) / (duration_s or 1)
                on_tick(min(frac, 1.0), f"sent {seq}, received {len(run.arrivals)}")
        _drain(rx, run, seen)
    finally:
        tx.close()
        rx.close()
    return run


def delays(run: ProbeRun) -> list[float]:
    return sorted(a.delay for a in run.arrivals)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[k]


def goodput_bps(run: ProbeRun, warmup_s: float = 1.0) -> float:
    """Frame bits per second at the receiver while the sender kept the link saturated."""
    if len(run.arrivals) < 3 or not run.sent:
        return 0.0
    first = run.arrivals[0].received + warmup_s
    last_sent = max(run.sent.values())
    window = [a for a in run.arrivals if first < a.received <= last_sent]
    if len(window) < 2:
        return 0.0
    span = window[-1].received - first
    return sum(a.frame_bytes for a in window) * 8 / span if span > 0 else 0.0


def check(
    st: dict[str, Any], src: str, dst: str, probes: int = 300, saturate_s: float = 12.0, on_tick: Tick | None = None
) -> dict[str, Any]:
    """Measure delay and loss with paced probes, then rate at saturation, on the
    path src -> dst; return measured figures next to what the links' profiles say."""
    hops = testbed.path_between(st, src, dst)
    expect = testbed.path_profile(hops)
    probe_frame = 12 + FRAME_OVERHEAD
    ser = testbed.serialization_s(hops, probe_frame)
    interval = max(0.01, 1.3 * max((probe_frame * 8 / expect.rate_bps) if expect.rate_bps else 0, 0))
    drain = 2 * expect.delay_s + ser + 2 * expect.jitter_s + 1.0

    def tick(phase: str, share: float, lo: float, hi: float) -> Tick:
        return lambda f, text: on_tick(lo + (hi - lo) * f, f"{phase}: {text}") if on_tick else None

    # Warm-up: the first packets wait for ARP on every hop, and an ARP exchange lost
    # on a lossy link holds them for a second; measure the steady state instead.
    send_stream(
        st,
        src,
        dst,
        count=8,
        interval_s=0.25,
        payload=12,
        drain_s=drain,
        port=PORT + 2,
        on_tick=tick("warm-up (ARP on every hop)", 0, 0.0, 0.1),
    )
    run = send_stream(
        st,
        src,
        dst,
        count=probes,
        interval_s=interval,
        payload=12,
        drain_s=drain,
        on_tick=tick("delay and loss", 0, 0.1, 0.6),
    )
    ds = delays(run)
    out: dict[str, Any] = {
        "src": src,
        "dst": dst,
        "path": expect.name,
        "probes_sent": len(run.sent),
        "probes_received": len(run.received_seqs()),
        "loss": run.loss(),
        "delay_median_s": statistics.median(ds) if ds else float("nan"),
        "delay_p95_s": percentile(ds, 0.95),
        "duplicates": run.duplicates,
        "expected_rate_bps": expect.rate_bps,
        "expected_delay_s": expect.delay_s + ser,
        "expected_delay_profile_s": expect.delay_s,
        "serialization_s": ser,
        "expected_loss": expect.loss,
        "probe_frame_bytes": probe_frame,
    }
    if expect.rate_bps:
        sat_payload = 200
        sat_interval = (sat_payload + FRAME_OVERHEAD) * 8 / (1.5 * expect.rate_bps)
        sat = send_stream(
            st,
            src,
            dst,
            duration_s=saturate_s,
            interval_s=sat_interval,
            payload=sat_payload,
            drain_s=0.5,
            port=PORT + 1,
            on_tick=tick("rate at saturation", 0, 0.6, 1.0),
        )
        out["rate_bps"] = goodput_bps(sat)
    else:
        out["rate_bps"] = None
    if on_tick:
        on_tick(1.0, "done")
    return out
