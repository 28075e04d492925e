"""Thin shell over Linux network namespaces: pyroute2 for netlink, `ip netns exec`
for the few things that need a process inside a namespace (sysctl, ethtool)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

from pyroute2 import IPRoute, netns

from c2dtn.errors import C2Error

NETNS_DIR = "/run/netns"
_ns_lock = threading.Lock()


class NetnsError(C2Error):
    pass


def require_root() -> None:
    if os.geteuid() != 0:
        raise NetnsError("building a topology needs root (network namespaces, veth, tc): run as root")


def list_ns(prefixes: tuple[str, ...]) -> list[str]:
    return sorted(n for n in netns.listnetns() if n.startswith(prefixes))


def create_ns(name: str) -> None:
    netns.create(name)


def remove_ns(name: str) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        netns.remove(name)


def ns_inode(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"{NETNS_DIR}/{name}")
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def pids_in(names: list[str]) -> dict[str, list[int]]:
    """PIDs of the processes whose network namespace is one of `names` (like `ip netns pids`)."""
    want = {}
    for n in names:
        ino = ns_inode(n)
        if ino is not None:
            want[ino[1]] = n
    out: dict[str, list[int]] = {n: [] for n in names}
    if not want:
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{entry}/ns/net").st_ino
        except OSError:
            continue
        if ino in want:
            out[want[ino]].append(int(entry))
    return out


def stop_pids(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after `grace_s`."""
    alive = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            alive.append(pid)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def ipr(ns: str) -> IPRoute:
    return IPRoute(netns=ns)


def run_in(ns: str, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run a command inside a namespace and wait for it."""
    res = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise NetnsError(f"in namespace {ns}: {' '.join(argv)} failed: {res.stderr.strip() or res.returncode}")
    return res


def start_ready(
    ns: str,
    script: str,
    log_path: os.PathLike,
    what: str,
    ready: Callable[[], bool],
    waiting_for: str,
    timeout_s: float = 10.0,
    quiet: bool = False,
) -> subprocess.Popen:
    """Start `bash -c script` in a namespace (stderr, and stdout unless quiet, appended to
    log_path) and return once ready() says it serves; C2Error naming `what` and its log if it
    exits first or is not ready within timeout_s (then it is killed)."""
    log = open(log_path, "ab")
    p = subprocess.Popen(
        ["ip", "netns", "exec", ns, "bash", "-c", script],
        stdout=subprocess.DEVNULL if quiet else log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise C2Error(f"{what} in {ns} exited at once; its log: {log.name}")
        if ready():
            return p
        time.sleep(0.1)
    p.kill()
    p.wait()
    raise C2Error(f"{what} in {ns} did not {waiting_for} within {timeout_s:.0f} s; its log: {log.name}")


def sysctl(ns: str, settings: dict[str, str | int]) -> None:
    run_in(ns, ["sysctl", "-q", "-w", *[f"{k}={v}" for k, v in settings.items()]])


def mac_of(ns: str, ifname: str) -> str:
    with ipr(ns) as ip:
        return ip.get_links(ip.link_lookup(ifname=ifname)[0])[0].get_attr("IFLA_ADDRESS")


def static_neighbour(ns: str, ifname: str, address: str, mac: str) -> None:
    """A permanent ARP entry: the kernel never asks for `address` on `ifname`."""
    with ipr(ns) as ip:
        idx = ip.link_lookup(ifname=ifname)[0]
        ip.neigh("replace", dst=address, lladdr=mac, ifindex=idx, state=0x80)  # NUD_PERMANENT


def offloads_off(ns: str, ifnames: list[str]) -> None:
    """Turn off checksum and segmentation offloads, so a packet socket sees real,
    complete frames (no 64 KB super-frames, no half-done checksums)."""
    for ifname in ifnames:
        run_in(ns, ["ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off"])


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """Switch this thread into namespace `ns` for the block (sockets made here stay there)."""
    with _ns_lock:
        netns.pushns(ns)
        try:
            yield
        finally:
            netns.popns()


def socket_in(ns: str, family: int = socket.AF_INET, type: int = socket.SOCK_DGRAM, proto: int = 0) -> socket.socket:
    with inside(ns):
        return socket.socket(family, type, proto)
