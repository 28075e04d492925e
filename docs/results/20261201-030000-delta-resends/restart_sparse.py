"""Receiver restart, sparse reports (one unit, one report every `gap` s): age at delivery of each
report after the restart, refusals, link bytes to gw4."""

import sys

from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.perf import radio_sim


def report(k):  # as tests/test_delta_bodies._report-ish
    return (
        b'{"topic":"c2/pos/unit1","lat":48.%05d,"lon":11.%05d,"alt":%d,"spd":%d}'
        % (k * 37 % 99999, k * 53 % 99999, 500 + k, k % 40)
    ) * 1


gap = int(sys.argv[1]) if len(sys.argv) > 1 else 20
for seed in (1, 2, 3):
    r = radio_sim.Radio(radio_sim.profile(), seed)
    gw1 = r.cores["gw1"]
    sub = {}
    for k in range(1, 13):
        t = k * gap * 1000
        r.step(t)
        if k == 4:
            core = r.cores["gw4"]
            core.codec = core.sched.codec = Codec("gw4", dict(core.codec.keys))
        sub[gw1.submit("gw4", report(k), t, 600_000, Priority.ROUTINE, supersede="u1")] = (k, t)
    r.step(13 * gap * 1000 + 120_000)
    ages = {sub[d.seq][0]: ms - sub[d.seq][1] for ms, d in r.delivered["gw4"] if d.seq in sub}
    refused = r.cores["gw4"].store.count("rejected:no-reference")
    print(
        f"seed {seed}: refused {refused}, bytes to gw4 {r.frame_bytes['gw4']}, envelopes {r.envelopes['gw4']}, "
        f"ages after restart (k: ms) {[(k, ages.get(k)) for k in range(4, 8)]}, max age {max(ages.values())}"
    )
