"""Orders (IMMEDIATE, 200 B) one every 5 s (plus up to 1 s) for 50 s, submitted while a
60 x 1 kB bulk transfer is queued, on the virtual radio, seeds 1-20: their latencies' p50,
p95 and max.  PYTHONPATH as for bulk.py:  PYTHONPATH=/tmp/shim python orders_during_bulk.py"""

import random
import statistics

from c2dtn.overlay.envelope import Priority
from c2dtn.perf import radio_sim as rs

lat = []
for seed in range(1, 21):
    r = rs.Radio(rs.profile(), seed)
    rng = random.Random(seed)
    gw1 = r.cores["gw1"]
    for _ in range(60):
        gw1.submit("gw4", rng.randbytes(1000), 0)
    sent = {}
    for k in range(1, 11):
        t = k * 5000 + rng.randrange(1000)
        r.step(t)
        body = b"order %04d " % k + rng.randbytes(188)
        sent[body[:10]] = t
        gw1.submit("gw4", body, t, 86400_000, Priority.IMMEDIATE)
    r.step(200_000)
    got = {d.body[:10]: t for t, d in r.delivered["gw4"] if d.body.startswith(b"order")}
    lat += [(got[k] - t) / 1000 for k, t in sent.items() if k in got]
lat.sort()
print(f"orders {len(lat)} p50 {statistics.median(lat):.2f} p95 {lat[int(0.95 * len(lat))]:.2f} max {lat[-1]:.2f}")
