"""Copies on a narrow radio that reports keep busy (decision 0042's review).  Each direction a
FIFO of RATE bytes a second (frames wait behind those before them, drop-tail at 3,000 bytes),
200 ms of flight, a tenth of frames lost; gw1 sends a 60-byte incompressible report every
250 ms over 4 units for a minute, gw4 only acks.  Per rate and loss pattern, with copies and
without (scheduler.COPY_NEXT_WITHIN_MS = 0): the age of the reports gw4 takes (median, p95,
max), the radio's deepest queue, the uplink's bytes and the copies sent.

    PYTHONPATH=<a tree's shim> python busy_radio.py
"""

import random
import statistics

from c2dtn.overlay import scheduler
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import Custody, Quota
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store.memory import MemoryStore

KEY = b"k" * 32


class Radio:
    def __init__(self, rate: int, seed: int):
        self.rate, self.rng, self.free_at = rate, random.Random(seed), 0.0
        self.q: list[tuple[float, int]] = []
        self.deepest = self.bytes = 0

    def send(self, payload: bytes, now: int) -> float | None:
        self.q = [x for x in self.q if x[0] > now]
        backlog = sum(s for _, s in self.q)
        self.deepest = max(self.deepest, backlog)
        if backlog + len(payload) > 3000:
            return None  # drop-tail
        self.free_at = max(now, self.free_at) + len(payload) * 1000 / self.rate
        self.q.append((self.free_at, len(payload)))
        self.bytes += len(payload)
        return None if self.rng.random() < 0.1 else self.free_at + 200


def run(rate: int, seed: int, copies: bool) -> dict:
    scheduler.COPY_NEXT_WITHIN_MS = 500 if copies else 0
    cfg = SchedulerConfig(ack_delay_ms=250, aggregate_bytes=1200, queue_target_ms=500)
    a = OverlayCore(Custody(MemoryStore(), "gw1", Quota()), Codec("gw1", {"gw4": KEY}), cfg)
    b = OverlayCore(Custody(MemoryStore(), "gw4", Quota()), Codec("gw4", {"gw1": KEY}), cfg)
    up, down = Radio(rate, seed), Radio(rate, seed + 100)
    flight: list[tuple[float, str, bytes]] = []
    ages: list[int] = []
    for t in range(0, 60_000, 10):
        if t % 250 == 0 and t < 55_000:
            a.submit("gw4", random.Random(t).randbytes(60), t, priority=Priority.PRIORITY, supersede=f"u{t % 1000}")
        for src, dst, radio in ((a, "gw4", up), (b, "gw1", down)):
            for o in src.poll(t):
                if (at := radio.send(o.payload, t)) is not None:
                    flight.append((at, dst, o.payload))
        for f in sorted(f for f in flight if f[0] <= t):
            flight.remove(f)
            {"gw4": b, "gw1": a}[f[1]].on_bundle(f[2], t)
        got = b.take()
        ages += [t - d.created_ms for d in got]
        b.consumed([d.id for d in got], t)
        a.consumed([d.id for d in a.take()], t)
    ages.sort()
    return {
        "median": statistics.median(ages),
        "p95": ages[int(0.95 * len(ages))],
        "max": ages[-1],
        "deepest": up.deepest,
        "bytes": up.bytes,
        "copies": a.store.count("next_copies"),
    }


if __name__ == "__main__":
    print("| rate | seed | copies | age median | p95 | max | deepest queue | uplink bytes | copies sent |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rate in (600, 700, 900, 1200):
        for seed in (1, 2):
            for copies in (False, True):
                r = run(rate, seed, copies)
                print(
                    f"| {rate} B/s | {seed} | {'on' if copies else 'off'} | {r['median'] / 1000:.2f} s | {r['p95'] / 1000:.2f} s | "
                    f"{r['max'] / 1000:.2f} s | {r['deepest']} B | {r['bytes']} | {r['copies']} |",
                    flush=True,
                )
