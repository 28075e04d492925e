"""fmn-4nations on the virtual radio (perf/radio_sim.fmn, one minute, gateways taking a report
30 ms after it arrives): for each data bundle to the group lost on its sender's uplink, how long
until that sender's next bundle to the group with data, and until its next bundle to the group
of any kind (an ack-only one too).  Decision 0041's context.

    PYTHONPATH=<a tree's shim> python next_frame.py 16 6 20
"""

import collections
import statistics
import sys

from c2dtn.overlay.core import OverlayCore
from c2dtn.perf import radio_sim
from c2dtn.topologies import channel

kind: dict[bytes, tuple[str, str]] = {}  # bundle payload -> (data or ack, destination)
log: dict[int, list] = collections.defaultdict(list)  # uplink -> [(s, kind, lost, destination)]

_poll = OverlayCore.poll
_offer = channel.Direction.offer


def poll(self, now_ms, *a, **k):
    out = _poll(self, now_ms, *a, **k)
    for b in out:
        kind[bytes(b.payload)] = ("ack" if not b.seqs else "data", b.dst)
    return out


def offer(self, frame, now):
    if not self.profile.rate_bps:  # (the LANs from tacnet)
        return _offer(self, frame, now)
    before = self.stats.lost_random
    _offer(self, frame, now)
    k, dst = kind.get(bytes(frame[: len(frame) - radio_sim.FRAME_OVERHEAD]), ("?", None))
    log[id(self)].append((now, k, self.stats.lost_random > before, dst))


OverlayCore.poll = poll
channel.Direction.offer = offer


def q(v: list[float]) -> str:
    v = sorted(v)
    return f"median {statistics.median(v):.3f} s, p90 {v[int(0.9 * len(v))]:.3f} s"


for seed in map(int, sys.argv[1:]):
    log.clear()
    kind.clear()
    r = radio_sim.fmn(seed, minutes=1.0, consume_ms=30)
    data, anything = [], []
    for frames in log.values():
        for i, (t, k, lost, dst) in enumerate(frames):
            if k != "data" or not lost or dst != "fmn":
                continue
            later = [f for f in frames[i + 1 :] if f[3] == "fmn"]
            nd = next((f[0] for f in later if f[1] == "data"), None)
            if nd is not None:
                data.append(nd - t)
            if later:
                anything.append(later[0][0] - t)
    print(f"seed {seed}: age p95 {r['aoi_p95_s']:.2f} s, {len(data)} lost data bundles to the group")
    print(f"  the sender's next bundle with data:   {q(data)}")
    print(f"  its next bundle of any kind:          {q(anything)}")
