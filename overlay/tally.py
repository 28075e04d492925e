"""Counts kept in memory since the process started, read by `c2dtn node status` and by the
Prometheus endpoint alike (overlay/metrics.py): one source for both.  I/O-free."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

# seconds: from a LAN's milliseconds to a radio's minutes behind an outage
DELAY_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800, 3600)
# seconds: what waits on this box alone (a commit and its fsync)
LOCAL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Histogram:
    """Observations in cumulative buckets (le = upper bound, as Prometheus's).  Written here
    rather than taken from prometheus_client, whose histogram keeps its counts inside its
    registry: status must show the same numbers without a scrape."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Iterable[float] = DELAY_BUCKETS_S):
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1  # the first bound >= v
        self.sum += v
        self.count += 1

    def snapshot(self) -> dict:
        """{"buckets": [[le, cumulative count], ..., ["+Inf", count]], "sum": s, "count": n}"""
        out, n = [], 0
        for le, c in zip([*self.bounds, "+Inf"], self.counts):
            n += c
            out.append([le, n])
        return {"buckets": out, "sum": round(self.sum, 6), "count": self.count}
