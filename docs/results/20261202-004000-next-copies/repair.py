"""How a report lost on its uplink gets to a member, on the virtual radio: one minute of
fmn-4nations at 2 s (perf/radio_sim.fmn, gateways taking a report 30 ms after it arrives).  For
every frame with data lost at its first sending, the reports in it: when each first arrived at
any member (from the lost frame), and whether it was sent again by the scheduler (a resend) or
arrived before any resend (a copy in the next bundle, decision 0042).  It wraps the cores'
methods to watch them: the run is radio_sim.fmn's own.

    PYTHONPATH=<a tree's shim> python repair.py SEED [SEED ...]
"""

import statistics
import sys

from c2dtn.overlay.core import OverlayCore
from c2dtn.perf import radio_sim
from c2dtn.topologies import channel

FRAME = radio_sim.FRAME_OVERHEAD
now = {"ms": 0}
sends: list[tuple[int, str, list[int], int, bytes]] = []  # (ms, node, seqs, resent, payload)
lost: set[bytes] = set()
arrivals: dict[tuple[str, int], int] = {}  # (origin, seq) -> first arrival at any member
poll, dropped, take = OverlayCore.poll, channel.Direction._dropped, OverlayCore.take


def _poll(self, now_ms, *a, **k):
    now["ms"] = now_ms
    out = poll(self, now_ms, *a, **k)
    sends.extend((now_ms, self.codec.node, list(b.seqs), b.retransmissions, b.payload) for b in out)
    return out


def _dropped(self, frame, why):
    lost.add(bytes(frame[: len(frame) - FRAME]))
    return dropped(self, frame, why)


def _take(self, *a, **k):
    out = take(self, *a, **k)
    for d in out:
        arrivals.setdefault((d.origin, d.seq), now["ms"])
    return out


OverlayCore.poll, channel.Direction._dropped, OverlayCore.take = _poll, _dropped, _take


def pct(v: list[int], q: float) -> int:
    return sorted(v)[min(len(v) - 1, int(q * len(v)))]


print(
    "| seed | age p95 | reports lost at first sending | arrived before any resend | after a resend | never | loss to arrival, median / p90 (copy) | (resend) |"
)
print("|---|---|---|---|---|---|---|---|")
totals: dict[str, list[int]] = {"copy": [], "resend": []}
never_all = 0
for seed in map(int, sys.argv[1:]):
    sends.clear(), lost.clear(), arrivals.clear()
    r = radio_sim.fmn(seed, minutes=1.0, consume_ms=30)
    by: dict[str, list[int]] = {"copy": [], "resend": []}
    never = 0
    for i, (t0, node, seqs, resent, payload) in enumerate(sends):
        if not seqs or resent or payload not in lost:
            continue
        for q in seqs:
            again = next((t for t, n, sq, _, _ in sends[i + 1 :] if n == node and q in sq), None)
            came = arrivals.get((node, q))
            if came is None:
                never += 1  # superseded before it arrived, or the run ended first
            elif again is None or came < again:
                by["copy"].append(came - t0)
            else:
                by["resend"].append(came - t0)
    never_all += never
    for k in by:
        totals[k] += by[k]

    def cell(v: list[int]) -> str:
        return f"{statistics.median(v) / 1000:.2f} / {pct(v, 0.9) / 1000:.2f} s" if v else "-"

    n = len(by["copy"]) + len(by["resend"]) + never
    print(
        f"| {seed} | {r['aoi_p95_s']:.2f} s | {n} | {len(by['copy'])} | {len(by['resend'])} | {never} | {cell(by['copy'])} | {cell(by['resend'])} |",
        flush=True,
    )
allv = totals["copy"] + totals["resend"]
print(
    f"\nall: {len(allv) + never_all} reports lost at first sending; {len(totals['copy'])} arrived before any resend, "
    f"{len(totals['resend'])} after one, {never_all} never; loss to arrival median {statistics.median(allv) / 1000:.2f} s, "
    f"p90 {pct(allv, 0.9) / 1000:.2f} s"
)
