"""systemd's service notifications (sd_notify(3)): READY=1 once the node serves (its agent
answered, its endpoints registered, its API and gateways listening), WATCHDOG=1 while its
event loop runs, STOPPING=1 when it stops.  Each is one datagram to $NOTIFY_SOCKET; written
here because the library that sends them (systemd-python) needs libsystemd's headers to build,
which a box need not have.  Without $NOTIFY_SOCKET (not under systemd) nothing is sent."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("c2dtn.node")


_sock: socket.socket | None = None  # connected by connect(), before the node enters a namespace


def _address(env: Mapping[str, str]) -> str | None:
    addr = env.get("NOTIFY_SOCKET", "")
    if not addr:
        return None
    if addr[0] == "@":  # an abstract socket
        return "\0" + addr[1:]
    if addr[0] != "/":
        log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract socket: not notifying", addr)
        return None
    return addr


def connect(env: Mapping[str, str] = os.environ) -> None:
    """Connect to the manager's socket now: an abstract one belongs to the network namespace it
    was made in, which a node with [node] netns is about to leave."""
    global _sock
    addr = _address(env)
    if addr is None:
        return
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        s.connect(addr)
        _sock = s
    except OSError as e:
        log.warning("connecting to the service manager's socket failed: %s", e)


def notify(state: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send `state` ("READY=1", ...); False when there is no manager to tell or it failed."""
    try:
        if _sock is not None:
            _sock.sendall(state.encode())
            return True
        addr = _address(env)
        if addr is None:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("notifying the service manager (%s) failed: %s", state.split("=")[0], e)
        return False


def watchdog_interval(env: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1 (half the manager's WatchdogSec), or None when it asks
    for none, or asks it of another process."""
    usec, owner = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and (not owner.isdigit() or int(owner) != (pid if pid is not None else os.getpid())):
        return None
    return int(usec) / 2e6
