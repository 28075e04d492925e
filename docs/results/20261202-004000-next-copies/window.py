"""fmn-4nations on the virtual radio (as fmn_seeds.py: one minute at a report every 2 s,
gateways taking a report 30 ms after it arrives) with the copies' window set to each of
WINDOW_MS (scheduler.COPY_NEXT_WITHIN_MS; 0: no copies): the age p95 per loss pattern, then its
median, mean and maximum and the uplink bytes a report, a line per window.

    PYTHONPATH=<a tree's shim> python window.py FIRST LAST PROCESSES WINDOW_MS [WINDOW_MS ...]
"""

import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from c2dtn.overlay import scheduler
from c2dtn.perf import radio_sim


def one(job: tuple[int, int]) -> tuple[int, int, float, float]:
    window, seed = job
    scheduler.COPY_NEXT_WITHIN_MS = window
    r = radio_sim.fmn(seed, minutes=1.0, consume_ms=30)
    return window, seed, r["aoi_p95_s"], r["uplink_bytes_per_report"]


if __name__ == "__main__":
    first, last, procs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    windows = [int(w) for w in sys.argv[4:]]
    jobs = [(w, s) for w in windows for s in range(first, last + 1)]
    got: dict[int, list[tuple[float, float]]] = {w: [] for w in windows}
    with ProcessPoolExecutor(procs) as ex:
        for w, s, age, b in ex.map(one, jobs):
            got[w].append((age, b))
            print(f"window {w} ms, seed {s}: age p95 {age:.2f} s, {b:.0f} B a report", file=sys.stderr, flush=True)
    print("| window | age p95 median | mean | max | patterns over 3.0 s | uplink bytes a report (median) |")
    print("|---|---|---|---|---|---|")
    for w in windows:
        ages = sorted(a for a, _ in got[w])
        print(
            f"| {w} ms | {statistics.median(ages):.2f} s | {statistics.mean(ages):.2f} s | {ages[-1]:.2f} s | "
            f"{sum(a > 3.0 for a in ages)} of {len(ages)} | {statistics.median(b for _, b in got[w]):.0f} B |"
        )
