"""fmn-4nations at a report every 2 s on the virtual radio (perf/radio_sim.fmn), one minute as
`perf bft`'s 60 s, its gateways taking a report 30 ms after it arrives (as the testbed's do):
the age p95 and the uplink bytes a report, per loss pattern.

    PYTHONPATH=<a tree's shim> python fmn_seeds.py 1 40 [processes]
"""

import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from c2dtn.perf import radio_sim


def one(seed: int) -> tuple[int, float, float, int, int]:
    r = radio_sim.fmn(seed, minutes=1.0, consume_ms=30)
    return seed, r["aoi_p95_s"], r["uplink_bytes_per_report"], r["delivered"], r["sent"]


if __name__ == "__main__":
    first, last = int(sys.argv[1]), int(sys.argv[2])
    procs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    print("| seed | age p95 | uplink bytes a report | deliveries (of 3 x sent) |")
    print("|---|---|---|---|")
    rows = []
    with ProcessPoolExecutor(procs) as ex:
        for seed, age, b, d, n in ex.map(one, range(first, last + 1)):
            rows.append((age, b))
            print(f"| {seed} | {age:.2f} s | {b:.0f} B | {d} of {3 * n} |", flush=True)
    ages = sorted(a for a, _ in rows)
    print(
        f"\n{len(rows)} patterns: age p95 median {statistics.median(ages):.2f} s, mean {statistics.mean(ages):.2f} s, "
        f"max {ages[-1]:.2f} s, over 3.0 s: {sum(a > 3.0 for a in ages)}; "
        f"uplink bytes a report median {statistics.median(b for _, b in rows):.0f} B"
    )
