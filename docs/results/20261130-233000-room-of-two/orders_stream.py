"""A bulk transfer on the virtual radio, 20 s of quiet, then 100 orders (IMMEDIATE, 200 B) one
every 200 ms, more than the radio carries (the review's case), seeds 1-3: frames they took,
and their latencies' p50, p95 and max.  PYTHONPATH as for bulk.py."""

import random
import statistics

from c2dtn.overlay.envelope import Priority
from c2dtn.perf import radio_sim as rs

lat: list[float] = []
frames = 0
for seed in (1, 2, 3):
    r = rs.Radio(rs.profile(), seed)
    gw1 = r.cores["gw1"]
    rng = random.Random(seed)
    for _ in range(60):
        gw1.submit("gw4", rng.randbytes(1000), 0)
    while len(r.delivered["gw4"]) < 60:
        r.step(r.now_ms + 1000)
    r.step(r.now_ms + 20_000)
    f0, sent = r.frames["gw4"], {}
    for k in range(100):
        r.step(r.now_ms + 200)
        body = b"order %06d " % k + rng.randbytes(187)
        sent[body[:12]] = r.now_ms
        gw1.submit("gw4", body, r.now_ms, 86400_000, Priority.IMMEDIATE)
    r.step(r.now_ms + 120_000)
    got = {d.body[:12]: t for t, d in r.delivered["gw4"] if d.body.startswith(b"order")}
    lat += [(got[k] - t) / 1000 for k, t in sent.items() if k in got]
    frames += r.frames["gw4"] - f0
lat.sort()
print(
    f"orders {len(lat)} of 300, frames {frames}, p50 {statistics.median(lat):.2f} p95 {lat[int(0.95 * len(lat))]:.2f} max {lat[-1]:.2f} s"
)
