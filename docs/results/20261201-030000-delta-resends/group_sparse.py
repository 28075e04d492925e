"""A group (tests/test_groups.py fan-out: deu, nor, prt) where prt restarts (references lost) after
three reports of one unit: refusals, deu's bytes after the restart, each member's age of the
reports after it.  Needs TESTS=<the tree's tests folder> (it imports the tests' helpers)."""

import logging
import os
import sys

sys.path.insert(0, os.environ["TESTS"])
logging.disable(logging.WARNING)
import test_groups as G
from test_custody import run

from c2dtn.overlay.envelope import Priority

for gap in (5, 20):
    cores = {n: G.make(None, n) for n in G.NODES} if False else None

    G.STORE["kind"] = "memory"
    cores = {n: G.make(None, n) for n in G.NODES}
    net = G._Sized(G.FanOut())
    when = {}

    def rep(k):
        def f(t):
            body = b'{"unit": "DEU-S001", "msg_id": "DEU-S001_%d", "lat": 59.9%05d, "lon": 10.7%05d, "ts": %d}' % (
                k,
                31 * k,
                17 * k,
                1795833889591 + k,
            )
            when[cores["deu"].submit("fmn", body, t, priority=Priority.PRIORITY, supersede="u1")] = (k, t)

        return f

    acts = [(k * gap * 1000, rep(k)) for k in range(1, 4)]
    got = run(cores, net, 3 * gap * 1000 + 500, actions=acts)
    prt = cores["prt"]
    prt.codec = prt.sched.codec = G.codec("prt")
    t0 = 3 * gap * 1000 + 600
    acts = [(k * gap * 1000, rep(k)) for k in range(4, 8)]
    # deliveries with times: wrap take
    seen = {}
    for name, core in cores.items():
        orig = core.take

        def take(orig=orig, name=name, core=core):
            items = orig()
            for i in items:
                seen.setdefault((name, i.seq), None)
            return items

    b0 = net.bytes.get("deu", 0)
    t = t0
    ages = {}
    # run step by step to record time of delivery at prt
    acts.sort()
    while t <= 8 * gap * 1000 + 60_000:
        while acts and acts[0][0] <= t:
            acts.pop(0)[1](t)
        for core in cores.values():
            net.send(core.poll(t), t)
        for dst, payload in net.due(t):
            cores[dst].on_bundle(payload, t)
        for name, core in cores.items():
            items = core.take()
            for i in items:
                if i.seq in when:
                    ages.setdefault(name, {})[when[i.seq][0]] = t - when[i.seq][1]
            core.consumed([i.id for i in items])
        t += 100
    print(
        f"gap {gap}s: prt refused {prt.store.count('rejected:no-reference')}, deu bytes after restart {net.bytes['deu'] - b0}, "
        f"bundles deu sent {sum(1 for s, d in net.net.sent if s == 'deu')}, ages prt {ages.get('prt')}, nor {ages.get('nor')}"
    )
