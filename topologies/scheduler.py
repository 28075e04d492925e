"""Schedule runner: applies a topology's link events (down, up, set) at their
times, counted from the moment `topo up` finished.  Started by `topo up` when
the topology (or --schedule) has events; exits after the last one.  It goes
through the same path as `c2dtn topo link`, so both backends behave alike."""

from __future__ import annotations

import logging
import sys
import time

from c2dtn.topologies import testbed
from c2dtn.topologies.profiles import Profile

log = logging.getLogger("c2sched")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s c2sched[%(process)d] %(message)s")
    st = testbed.read_state()
    if st is None:
        log.error("no topology is up; nothing to schedule")
        return 1
    try:
        import setproctitle

        setproctitle.setproctitle(f"c2sched {st['topology']}")
    except ImportError:  # cosmetic only
        pass
    t0 = st["started_monotonic"]
    for ev in st["schedule"]:
        wait = t0 + ev["at_s"] - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        prof = Profile.from_dict(ev["profile"]) if ev.get("profile") else None
        try:
            testbed.change_link(
                ev["link"], None, ev["action"], prof, carrier=ev.get("carrier", False), one_way=ev.get("one_way", False)
            )
            log.info("t=%.1fs %s %s %s", time.monotonic() - t0, ev["link"], ev["action"], prof.name if prof else "")
        except Exception as e:  # a failed event is logged; the later ones still run
            log.error("t=%.1fs %s %s failed: %s", time.monotonic() - t0, ev["link"], ev["action"], e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
