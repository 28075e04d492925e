"""One perf-overlay radio transfer with the r2-r3 link captured; prints counters and the pcap path."""

import json
import os
import sys
from pathlib import Path

import c2dtn.overlay.scheduler as S
from c2dtn.perf import overlay_bench as ob
from c2dtn.topologies import testbed

print("scheduler from", S.__file__, flush=True)
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
os.chmod(out, 0o755)
orig = ob._nodes


def _nodes(*a, **k):
    n = orig(*a, **k)
    print("capture", testbed.capture(["r2-r3"], out), flush=True)
    so = n.stop_all

    def stop_all():
        testbed.capture(["r2-r3"], None)
        for x in ("gw1", "gw4"):
            try:
                st = n.status(x)
                print(
                    x, json.dumps({k: v for k, v in st.items() if k in ("counters",)}, default=str)[:3000], flush=True
                )
            except Exception as e:
                print(x, "status failed", e)
        so()

    n.stop_all = stop_all
    return n


ob._nodes = _nodes
r = ob.tactical(seed=int(sys.argv[1]))
print("RESULT", round(r["fraction"], 3), r["link_frames_ab"], round(r["seconds"], 1), flush=True)
