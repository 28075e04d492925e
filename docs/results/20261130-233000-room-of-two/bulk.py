"""`perf overlay`'s radio run on the virtual radio (perf/radio_sim.py) for seeds LO..HI, one
line a seed: seed, fraction of the link, frames offered, seconds; then the median and how
many runs fell below 0.85.  The code under test is the c2dtn on PYTHONPATH (a folder holding
a link `c2dtn` to a worktree); run it from outside the worktree:
    PYTHONPATH=/tmp/shim python bulk.py 1 300 > bulk-CODE-1.log"""

import statistics
import sys

from c2dtn.perf import radio_sim

lo, hi = int(sys.argv[1]), int(sys.argv[2])
fractions = []
for seed in range(lo, hi + 1):
    r = radio_sim.bulk(seed)
    fractions.append(r["fraction"])
    print(f"{seed} {r['fraction']:.3f} {r['frames']} {r['seconds']:.1f}", flush=True)
print(f"# median {statistics.median(fractions):.3f} below0.85 {sum(f < 0.85 for f in fractions)}/{len(fractions)}")
