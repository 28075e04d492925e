"""Kernel netem backend: tc commands that make a link direction follow a Profile.

Both backends share the plumbing: node A - veth - emulator namespace - veth - node B.
With this backend the emulator namespace bridges its two ports and the profile
of A->B sits on the egress of the port that faces B (netem as root for delay,
jitter, loss, duplication, reordering and corruption, TBF below it for the
rate and queue), so that nodes see the same interfaces whichever backend runs.
Used live only where the kernel has sch_netem (`netem_available()`).
"""

from __future__ import annotations

import subprocess
from dataclasses import replace

from c2dtn.topologies.profiles import Profile

ETH_HEADER = 14


def _pct(x: float) -> str:
    return f"{x * 100:.6g}%"


def _ms(s: float) -> str:
    return f"{s * 1000:.6g}ms"


def netem_args(p: Profile) -> list[str]:
    if p.link_setup_s:
        raise ValueError(
            f"profile {p.name}: netem has no link set-up (link_setup); run the userspace emulator (--link-backend userspace)"
        )
    args = ["netem", "limit", str(p.queue_packets)]
    if p.delay_s or p.jitter_s:
        args += ["delay", _ms(p.delay_s)]
        if p.jitter_s:
            args += [_ms(p.jitter_s)]
    if p.gilbert_elliott is not None:
        ge = p.gilbert_elliott
        # netem: loss gemodel p [r [1-h [1-k]]]
        args += ["loss", "gemodel", _pct(ge.p), _pct(ge.r), _pct(ge.loss_bad), _pct(ge.loss_good)]
    elif p.loss:
        args += ["loss", "random", _pct(p.loss)]
    if p.duplicate:
        args += ["duplicate", _pct(p.duplicate)]
    if p.reorder:
        # this share is sent at once, the rest delayed (needs a delay to mean anything)
        args += ["reorder", _pct(p.reorder)]
    if p.corrupt:
        args += ["corrupt", _pct(p.corrupt)]
    return args


def tbf_args(p: Profile) -> list[str]:
    frame = p.mtu + ETH_HEADER
    limit = p.queue_bytes if p.queue_bytes is not None else p.queue_packets * frame
    # burst of one full frame: the radio sends one frame at a time at its rate
    return ["tbf", "rate", f"{p.rate_bps:.0f}bit", "burst", str(max(frame, 1600)), "limit", str(max(limit, frame))]


def tc_commands(ns: str, dev: str, p: Profile) -> list[list[str]]:
    """The commands that put profile `p` on the egress of `dev` in namespace `ns`."""
    cmds = [
        ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *netem_args(p)],
    ]
    if p.rate_bps:
        cmds.append(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *tbf_args(p)])
    else:
        # no rate: remove a TBF left from an earlier profile (ignore "no such qdisc")
        cmds.append(["tc", "-n", ns, "qdisc", "del", "dev", dev, "parent", "1:1", "handle", "10:"])
    return cmds


def outage_profile(p: Profile) -> Profile:
    """A silent outage under netem: everything offered is lost, carrier stays."""
    return replace(p, loss=1.0, gilbert_elliott=None, duplicate=0.0, reorder=0.0)


def bridge_commands(ns: str, a_if: str, b_if: str) -> list[list[str]]:
    return [
        ["ip", "-n", ns, "link", "add", "c2br", "type", "bridge", "stp_state", "0"],
        ["ip", "-n", ns, "link", "set", a_if, "master", "c2br"],
        ["ip", "-n", ns, "link", "set", b_if, "master", "c2br"],
        ["ip", "-n", ns, "link", "set", "c2br", "up"],
    ]


def run(cmds: list[list[str]]) -> None:
    for cmd in cmds:
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 and "del" not in cmd:  # deleting what is absent is fine
            raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")


_available: bool | None = None


def netem_available() -> bool:
    """Does this kernel have sch_netem?  Tried once, on loopback of a scratch namespace."""
    global _available
    if _available is None:
        ns = "c2probe-netem"
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "netns", "add", ns], capture_output=True, check=True)
        try:
            res = subprocess.run(
                ["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                capture_output=True,
                text=True,
            )
            _available = res.returncode == 0
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return _available
