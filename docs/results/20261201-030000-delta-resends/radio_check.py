"""Lossy radio, 3 units, reports every 1.5 s (priority, supersede per unit) for 90 s, gw4's codec
reset at 30 s and 60 s: every delivered body is the body submitted under that seq; refusals,
bytes, age p95."""

import logging
import sys

logging.disable(logging.WARNING)
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.perf import radio_sim


def body(u, k):
    return b'{"topic":"c2/pos/u%d","lat":48.%05d,"lon":11.%05d,"alt":%d,"spd":%d,"hdg":%d}' % (
        u,
        (k * 37 + u) % 99999,
        (k * 53 + u) % 99999,
        500 + k,
        k % 40,
        (k * 7) % 360,
    )


GAP = int(sys.argv[1])
RESTARTS = (20, 40) if len(sys.argv) < 3 else ()
tot = {"env": 0, "seqs": 0, "bad": 0, "refused": 0, "bytes": 0, "deliv": 0}
ages_all = []
gaps = []
for seed in (1, 2, 3, 4):
    r = radio_sim.Radio(radio_sim.profile(), seed)
    gw1 = r.cores["gw1"]
    sub = {}
    for k in range(1, 61):
        t = k * GAP
        r.step(t)
        if k in RESTARTS:
            core = r.cores["gw4"]
            core.codec = core.sched.codec = Codec("gw4", dict(core.codec.keys))
        for u in (1, 2, 3):
            b = body(u, k)
            sub[gw1.submit("gw4", b, t, 600_000, Priority.PRIORITY, supersede=f"u{u}")] = (b, t)
    r.step(61 * GAP + 120_000)
    bad = sum(1 for _, d in r.delivered["gw4"] if d.seq in sub and d.body != sub[d.seq][0])
    ages = sorted(ms - sub[d.seq][1] for ms, d in r.delivered["gw4"] if d.seq in sub)
    ages_all += ages
    for u in (1, 2, 3):
        ts = sorted(ms for ms, d in r.delivered["gw4"] if d.seq in sub and d.supersede == f"u{u}")
        gaps.append(max(b - a for a, b in zip(ts, ts[1:])))
    tot["bad"] += bad
    tot["refused"] += r.cores["gw4"].store.count("rejected:no-reference")
    tot["bytes"] += r.frame_bytes["gw4"]
    tot["deliv"] += len(ages)
    tot["env"] += r.envelopes["gw4"]
    tot["seqs"] += len(r.seqs["gw4"])
    assert not gw1.store.has_pending({"gw4"}), seed
ages_all.sort()
print("largest gaps between deliveries of a unit (s):", sorted(g // 1000 for g in gaps)[-8:])
print(
    tot,
    "bytes/delivered %.0f" % (tot["bytes"] / tot["deliv"]),
    "age p50 %d p95 %d" % (ages_all[len(ages_all) // 2], ages_all[int(len(ages_all) * 0.95)]),
)
