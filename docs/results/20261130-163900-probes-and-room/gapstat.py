import sys

from scapy.utils import PcapNgReader

rows = []
with PcapNgReader(sys.argv[1]) as r:
    for p in r:
        c = getattr(p, "comments", None) or getattr(p, "comment", None)
        rows.append((float(p.time), p.sniffed_on, len(p), bool(c)))
ab = [t for t, i, n, c in rows if i.endswith("ab") and not c and n > 500]
t0 = min(t for t, *_ in rows)
gaps = sorted(((b - a), a - t0) for a, b in zip(ab, ab[1:]))
idle = sum(g - 0.93 for g, _ in gaps if g > 0.93)
print("delivered_data", len(ab), "idle %.1f" % idle, "top gaps", [(round(g, 1), round(at, 1)) for g, at in gaps[-3:]])
