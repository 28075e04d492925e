"""The CORE engine's shell: a CORE daemon (started on loopback, or one the user names), the
session topologies/core_plan.py works out, sent through CORE's own gRPC client
(topologies/core_session.py, run by CORE's Python), and each CORE node's namespace given the
testbed's name (`ip netns attach c2-<node> <vnoded pid>`), so that everything that runs in a
node's namespace by name (agents, gateways, probes, perf campaigns) works on either engine.

Decision record: docs/decisions/0019-core-engine.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from c2dtn.errors import C2Error
from c2dtn.overlay.agents import builds
from c2dtn.topologies import netns

MAKE_DIR = Path(__file__).parent / "make"
SESSION_SCRIPT = Path(__file__).parent / "core_session.py"
DAEMON_PIDFILE = "core-daemon.pid"  # in the run folder: found again by `topo down` after a crash


class CoreError(C2Error):
    pass


def root() -> Path:
    """CORE's build: $C2DTN_CORE, else the cache folder `make core` builds into."""
    env = os.environ.get("C2DTN_CORE")
    if env:
        return Path(env)
    return builds.built("core", MAKE_DIR)


def missing() -> str | None:
    """Why CORE cannot be used here (its build's own error line), else None."""
    try:
        r = root()
    except builds.NotBuilt as e:
        return str(e).replace("make bpas", "make core")
    if not (r / "venv" / "bin" / "core-daemon").exists() or not (r / "bin" / "vnoded").exists():
        return f"CORE at {r} has no core-daemon or vnoded (`make core` builds it)"
    return None


def call(address: str, command: str, req: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """One request to the CORE daemon at `address` through CORE's client (core_session.py)."""
    py = root() / "venv" / "bin" / "python"
    try:
        r = subprocess.run(
            [str(py), str(SESSION_SCRIPT), address, command],
            input=json.dumps(req or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise CoreError(f"CORE daemon at {address}: {command} took over {timeout:.0f} s") from None
    try:
        ans = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    except ValueError:
        ans = {}
    if r.returncode != 0 or "error" in ans:
        why = ans.get("error") or (r.stderr.strip().splitlines() or ["no answer"])[-1]
        raise CoreError(f"CORE daemon at {address}: {command} failed: {why}")
    return ans


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(run_dir: Path, say: Callable[[str], None], timeout_s: float = 30.0) -> tuple[str, int]:
    """A CORE daemon of the testbed's own on 127.0.0.1 (a free port), logging into the run
    folder; returns its gRPC address and PID once it answers."""
    r = root()
    port = _free_port()
    log = open(run_dir / "core-daemon.log", "w")
    env = dict(os.environ, PATH=f"{r / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
    argv = [
        str(r / "venv" / "bin" / "core-daemon"),
        "-c",
        str(r / "etc" / "core.conf"),
        "-l",
        str(r / "etc" / "logging.conf"),
        "--grpc-address",
        "127.0.0.1",
        "--grpc-port",
        str(port),
    ]
    p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    log.close()
    (run_dir / DAEMON_PIDFILE).write_text(str(p.pid))
    address = f"127.0.0.1:{port}"
    say(f"CORE daemon started on {address} (pid {p.pid}; log {run_dir / 'core-daemon.log'})")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise CoreError(f"the CORE daemon exited at start: {_tail(run_dir / 'core-daemon.log')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            call(address, "ping", timeout=20)
            return address, p.pid
        time.sleep(0.2)
    stop_daemon(run_dir, p.pid)
    raise CoreError(f"the CORE daemon did not answer on {address} within {timeout_s:.0f} s")


def _tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip()
    except OSError:
        return "(no log)"


def stop_daemon(run_dir: Path, pid: int | None = None) -> None:
    """SIGTERM the testbed's own CORE daemon (it then shuts its sessions down), by its PID and
    only if that PID still runs core-daemon."""
    pidfile = run_dir / DAEMON_PIDFILE
    if pid is None:
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            return
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmd = b""
    if b"core-daemon" in cmd:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while netns._alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        netns.stop_pids([pid], grace_s=0.5)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()


def node_pid(session_dir: str, name: str, host: str | None = None) -> int:
    """The PID of a CORE node's vnoded (its namespace), from the pid file CORE writes."""
    path = f"{session_dir}/{name}.pid"
    if host is None:
        text = Path(path).read_text()
    else:
        text = remote(host, ["cat", path]).stdout
    try:
        return int(text.strip())
    except ValueError:
        raise CoreError(f"CORE node {name}: pid file {path} holds {text[:40]!r}") from None


def remote(host: str, argv: list[str]) -> subprocess.CompletedProcess:
    """A command on a CORE server over root SSH (distributed mode)."""
    r = subprocess.run(
        ["ssh", "-o", "BatchMode=yes", f"root@{host}", shlex.join(argv)], capture_output=True, text=True, timeout=60
    )
    if r.returncode != 0:
        raise CoreError(f"on {host}: {shlex.join(argv)} failed: {r.stderr.strip() or r.returncode}")
    return r


def attach(ns: str, pid: int, host: str | None = None) -> None:
    """Name a CORE node's namespace as the testbed names its own (ip netns attach)."""
    argv = ["ip", "netns", "attach", ns, str(pid)]
    if host is not None:
        remote(host, argv)
        return
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise CoreError(f"ip netns attach {ns} {pid}: {r.stderr.strip()}")


def exec_prefix(host: str | None, ns: str) -> list[str]:
    """How to run a command in a node's namespace: here, or on its server over SSH."""
    local = ["ip", "netns", "exec", ns]
    return local if host is None else ["ssh", "-o", "BatchMode=yes", f"root@{host}", *local]
