"""One timeline of a vdiag.py folder: gw1's bundles handed to the agent (envelopes, acks), gw4's,
and the radio's frames (ab: gw1 to gw4, ba: back; DROP: the emulator lost it, stamped when
offered; the others when delivered).  Seconds from the first line.  Usage: timeline.py DIR"""

import datetime as dt
import re
import sys

from scapy.utils import PcapNgReader

d = sys.argv[1]
lines = []
sent = re.compile(r"^(\S+ \S+) (gw\d) c2dtn.node DEBUG bundle to \S+: (\d+) bytes, envelopes (\[.*?\]), acks (.*)$")
for n in ("gw1", "gw4"):
    for line in open(f"{d}/{n}.node.log"):
        m = sent.match(line.strip())
        if m:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.timezone.utc).timestamp()
            acks = re.sub(r"'gw\d/[0-9a-f]+': ", "", m.group(5))
            lines.append((t, f"{n} SEND {m.group(3)}B env {m.group(4)} acks {acks}"))
with PcapNgReader(f"{d}/r2-r3.pcapng") as r:
    for p in r:
        dropped = getattr(p, "comments", None) or getattr(p, "comment", None)
        lines.append((float(p.time), f"   radio {p.sniffed_on[-2:]} {len(p)}B {'DROP' if dropped else ''}"))
lines.sort()
for t, s in lines:
    print(f"{t - lines[0][0]:7.2f} {s}")
