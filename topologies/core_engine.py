"""The CORE engine's shell: a CORE daemon (started on loopback, or one the user names), the
session topologies/core_plan.py works out, sent through CORE's own gRPC client
(topologies/core_session.py, run by CORE's Python), and each CORE node's namespace given the
testbed's name (`ip netns attach c2-<node> <vnoded pid>`), so that everything that runs in a
node's namespace by name (agents, gateways, probes, perf campaigns) works on either engine.

Decision record: docs/decisions/0019-core-engine.md.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agents import builds
from c2dtn.topologies import netns

MAKE_DIR = Path(__file__).parent / "make"
SESSION_SCRIPT = Path(__file__).parent / "core_session.py"
DAEMON_PIDFILE = "core-daemon.pid"  # in the run folder: found again by `topo down` after a crash
# CORE's daemon under the testbed's process name (comm c2core-daemon), its argv as its own
DAEMON_MAIN = (
    "import ctypes, sys; ctypes.CDLL(None).prctl(15, b'c2core-daemon', 0, 0, 0); "  # 15: PR_SET_NAME
    "sys.argv[0] = 'core-daemon'; from core.scripts.daemon import main; main()"
)


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


def daemon_dir(run_dir: Path) -> Path:
    """The testbed's own daemon's folder: its gRPC socket (a file only root reaches: CORE's API
    runs anything as root and has no authentication), its config, and where its sessions'
    folder is (tmpdir)."""
    return run_dir / "core"


def check_address(address: str) -> str:
    """A daemon the user names must be on this machine (its sessions' folders and nodes are
    read and named here): a unix: socket path, or a loopback host and port."""
    if address.startswith("unix:/"):
        return address
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        ok = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host).is_loopback and 0 < int(port) < 65536
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(
            "--core-address",
            "--core-address",
            address,
            "not a CORE daemon on this machine",
            "unix:/PATH, or 127.0.0.1:PORT (nodes are named and configured here; remote servers go in --servers)",
        )
    return address


def start_daemon(
    run_dir: Path, say: Callable[[str], None], controller: str | None = None, timeout_s: float = 30.0
) -> tuple[str, int]:
    """A CORE daemon of the testbed's own, on a unix socket in a root-only folder, its sessions'
    folders in a fresh root-only one (TMPDIR), logging into the run folder; returns its gRPC address and PID once
    it answers.  controller: distributed_address, the address servers reach it at."""
    r = root()
    d = daemon_dir(run_dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, mode=0o700)
    d.chmod(0o700)
    # its sessions' folders: fresh and root's only, outside /run (CORE mounts a private dir
    # over each node's /var/run, that is /run); `down` removes it
    tmp = tempfile.mkdtemp(prefix="c2core-", dir="/tmp")
    (d / "tmpdir").write_text(tmp)
    conf = (r / "etc" / "core.conf").read_text()
    if controller:
        conf = conf.replace("[core-daemon]\n", f"[core-daemon]\ndistributed_address = {controller}\n", 1)
    (d / "core.conf").write_text(conf)
    log = open(run_dir / "core-daemon.log", "w")
    path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    env = dict(os.environ, PATH=f"{r / 'bin'}:{path}", TMPDIR=tmp)
    argv = [
        str(r / "venv" / "bin" / "python"),
        "-c",
        DAEMON_MAIN,
        "-c",
        str(d / "core.conf"),
        "-l",
        str(r / "etc" / "logging.conf"),
        "--grpc-address",
        f"unix:{d}/grpc",
        "--grpc-port",
        "sock",  # (CORE listens on "<address>:<port>": the socket is <d>/grpc:sock)
    ]
    p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    log.close()
    (run_dir / DAEMON_PIDFILE).write_text(str(p.pid))
    address = f"unix:{d}/grpc:sock"
    say(f"CORE daemon started on {address} (pid {p.pid}; log {run_dir / 'core-daemon.log'})")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise CoreError(f"the CORE daemon exited at start: {_tail(run_dir / 'core-daemon.log')}")
        if (d / "grpc:sock").exists():
            with contextlib.suppress(CoreError):
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
    try:
        exe = os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    with contextlib.suppress(builds.NotBuilt):
        ours = exe == os.path.realpath(root() / "venv" / "bin" / "python") and b"core.scripts.daemon" in cmd
        if ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30  # its shutdown deletes its sessions
            while netns._alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            netns.stop_pids([pid], grace_s=0.5)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    with contextlib.suppress(OSError):
        tmp = (daemon_dir(run_dir) / "tmpdir").read_text()
        if tmp.startswith("/tmp/c2core-") and "/" not in tmp[len("/tmp/") :]:
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(daemon_dir(run_dir), ignore_errors=True)


def node_pid(session_dir: str, name: str, host: str | None = None) -> int:
    """The PID of a CORE node's vnoded (its namespace), from the pid file CORE writes: here, a
    root-owned regular file (not a link), read without following one."""
    path = f"{session_dir}/{name}.pid"
    if host is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise CoreError(f"CORE node {name}: pid file {path}: {e.strerror}") from None
        with os.fdopen(fd) as fh:
            info = os.fstat(fd)
            if info.st_uid != 0 or not stat.S_ISREG(info.st_mode):
                raise CoreError(f"CORE node {name}: pid file {path} is not a root-owned file")
            text = fh.read(64)
    else:
        text = remote(host, ["cat", path]).stdout
    try:
        return int(text.strip())
    except ValueError:
        raise CoreError(f"CORE node {name}: pid file {path} holds {text[:40]!r}") from None


def remote(host: str, argv: list[str]) -> subprocess.CompletedProcess:
    """A command on a CORE server over root SSH (distributed mode)."""
    r = subprocess.run(ssh(host, argv), capture_output=True, text=True, timeout=60)
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


def ssh(host: str, argv: list[str]) -> list[str]:
    """argv run on `host` (an IP address, servers file) as root: one word for the remote shell,
    quoted, so it runs exactly argv."""
    return ["ssh", "-o", "BatchMode=yes", f"root@{host}", "--", shlex.join(argv)]


def exec_argv(host: str | None, ns: str, argv: list[str]) -> list[str]:
    """argv run in a node's namespace: here, or on its server over SSH."""
    local = ["ip", "netns", "exec", ns, *argv]
    return local if host is None else ssh(host, local)


def quiet_host_side(namespaces: list[str]) -> int:
    """Turn IPv6 off on the host-side ends CORE gave these nodes' interfaces and on the bridges
    they join (CORE leaves them in the host's namespace with IPv6 on: their router
    solicitations and MLD reports would cross the emulated radios); returns how many."""
    peers: set[int] = set()
    for ns in namespaces:
        with netns.ipr(ns) as ip:
            for link in ip.get_links():
                peer = link.get_attr("IFLA_LINK")
                if peer and link.get_attr("IFLA_IFNAME") != "lo":
                    peers.add(peer)
    names: set[str] = set()
    with IPRoute() as ip:
        for idx in peers:
            for link in ip.get_links(idx):
                names.add(link.get_attr("IFLA_IFNAME"))
                master = link.get_attr("IFLA_MASTER")
                if master:
                    names.update(m.get_attr("IFLA_IFNAME") for m in ip.get_links(master))
    for name in names:
        with contextlib.suppress(OSError):  # (a name that went away meanwhile)
            Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
    return len(names)


def check_servers(hosts: dict[str, str]) -> None:
    """Each server answers root SSH without a prompt (what CORE and the testbed both need),
    tried before anything is built or torn down; the first that does not is named."""
    for name, host in hosts.items():
        try:
            r = subprocess.run(
                ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{host}", "--", "true"],
                capture_output=True,
                text=True,
                timeout=15,
            )
            why = None if r.returncode == 0 else (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
        if why is not None:
            raise CoreError(
                f"CORE server {name} ({host}): root SSH without a prompt fails: {why} "
                "(distributed mode needs `ssh -o BatchMode=yes root@HOST` to work; docs/core.md)"
            )
