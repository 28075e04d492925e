"""One perf-overlay radio transfer as ../20261130-163900-probes-and-room/tbdiag.py runs it (the
r2-r3 link captured into OUTDIR, gw1's and gw4's counters and the RESULT line printed), with the
nodes' debug logs on (each bundle handed to the agent: its envelopes and acks), copied into
OUTDIR as gw1.node.log and gw4.node.log.  Usage: vdiag.py SEED OUTDIR"""

import runpy
import shutil
import sys
from pathlib import Path

from c2dtn.topologies import nodes as N

TBDIAG = Path(__file__).resolve().parents[1] / "20261130-163900-probes-and-room" / "tbdiag.py"
out = Path(sys.argv[2])
start_all = N.Nodes.start_all


def verbose_start_all(self, *a, **k):
    self.verbose = True
    r = start_all(self, *a, **k)
    stop_all = self.stop_all

    def stop_and_keep_logs():
        stop_all()
        for n in ("gw1", "gw4"):
            shutil.copy(self._log_path(n), out / f"{n}.node.log")

    self.stop_all = stop_and_keep_logs
    return r


N.Nodes.start_all = verbose_start_all
runpy.run_path(str(TBDIAG), run_name="__main__")
