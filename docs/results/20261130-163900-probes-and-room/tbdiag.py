"""One perf-overlay radio transfer with the r2-r3 link captured into the folder argv[2]: the
counters and RESULT line come from decision 0036's diag.py, run after the capture is set up."""

import os
import runpy
import sys
from pathlib import Path

from c2dtn.perf import overlay_bench as ob
from c2dtn.topologies import testbed

DIAG = Path(__file__).resolve().parents[1] / "20261130-145400-window-copies" / "diag.py"
out = Path(sys.argv.pop(2))
out.mkdir(parents=True, exist_ok=True)
os.chmod(out, 0o755)
orig = ob._nodes


def _nodes(*a, **k):
    n = orig(*a, **k)
    print("capture", testbed.capture(["r2-r3"], out), flush=True)
    so = n.stop_all

    def stop_all():
        testbed.capture(["r2-r3"], None)
        so()

    n.stop_all = stop_all
    return n


ob._nodes = _nodes
runpy.run_path(str(DIAG), run_name="__main__")
