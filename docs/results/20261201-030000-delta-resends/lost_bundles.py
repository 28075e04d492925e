"""Where a lost report's time goes, on the virtual radio: one minute of fmn-4nations at 2 s
(perf/radio_sim.fmn, gateways taking a report 30 ms after it arrives).  For every bundle with
data lost on its nation's uplink at its first sending: when its sender's next bundle with data
went (its send numbers show the members the gap), when the last report in it was sent again,
and when that report first arrived at a member; the medians, and the mean size of frames with
data sent first and sent again.  It wraps the cores' methods to watch them (a copy of nothing:
the run is radio_sim.fmn's own).

    PYTHONPATH=<a tree's shim> python lost_bundles.py SEED
"""

import statistics
import sys
from collections import defaultdict

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
seed = int(sys.argv[1])
r = radio_sim.fmn(seed, minutes=1.0, consume_ms=30)
by_node = defaultdict(list)
for s in sends:
    by_node[s[1]].append(s)
steps: dict[str, list[int]] = defaultdict(list)
for node, ss in by_node.items():
    for i, (t0, _, seqs, resent, payload) in enumerate(ss):
        if not seqs or resent or payload not in lost:
            continue
        q = seqs[-1]
        nxt = next((t for t, _, sq, _, _ in ss[i + 1 :] if sq), None)
        again = next((t for t, _, sq, _, _ in ss[i + 1 :] if q in sq), None)
        came = arrivals.get((node, q))
        if nxt is None or again is None or came is None:
            continue  # superseded before it went again, or the run ended first
        steps["next bundle with data"].append(nxt - t0)
        steps["from it to the resend (the gap's ack)"].append(again - nxt)
        steps["from the resend to its arrival"].append(came - again)
        steps["first sending to arrival"].append(came - t0)
print(f"seed {seed}: age p95 {r['aoi_p95_s']:.2f} s, {len(steps['first sending to arrival'])} lost bundles traced")
for k, v in steps.items():
    print(f"  {k}: median {statistics.median(v)} ms, p90 {sorted(v)[int(0.9 * len(v))]} ms")
first = [len(p) + FRAME for _, _, sq, rs, p in sends if sq and not rs]
again = [len(p) + FRAME for _, _, sq, rs, p in sends if sq and rs]
print(
    f"  frames with data: first sendings {statistics.mean(first):.0f} B, with resends {statistics.mean(again):.0f} B (mean)"
)
