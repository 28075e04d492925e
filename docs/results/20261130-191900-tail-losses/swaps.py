"""Envelopes gw4 got after one sent later, in vdiag.py folders: for each envelope gw1 sent
once, the first ack of gw4's that names it gives the order they arrived in; each pair that
arrived in the other order than it went is printed with the seconds between their sends.
Usage: swaps.py DIR..."""

import datetime as dt
import re
import sys


def stamp(line: str) -> float:
    return dt.datetime.strptime(" ".join(line.split()[:2]), "%Y-%m-%d %H:%M:%S,%f").timestamp()


for d in sys.argv[1:]:
    went: dict[int, float] = {}
    times: dict[int, int] = {}
    for line in open(f"{d}/gw1.node.log"):
        m = re.search(r"bundle to gw4: \d+ bytes, envelopes \[(.+?)\]", line)
        if m:
            for q in map(int, m.group(1).split(",")):
                went.setdefault(q, stamp(line))
                times[q] = times.get(q, 0) + 1
    first: dict[int, int] = {}
    for k, line in enumerate(open(f"{d}/gw4.node.log")):
        m = re.search(r"acks \{.*?\(\[(.*?)\], \[(.*?)\]\)\}", line)
        if m:
            for q in filter(None, (m.group(1) + "," + m.group(2)).split(",")):
                first.setdefault(int(q), k)
    once = sorted((q for q in went if times[q] == 1 and q in first), key=went.get)
    swaps = [(a, b, round(went[b] - went[a], 3)) for i, a in enumerate(once) for b in once[i + 1 :] if first[b] < first[a]]
    print(d.rstrip("/").split("/")[-1], swaps)
