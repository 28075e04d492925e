"""A box installed from nothing: a clean Debian 12 root (debootstrap minbase with python3-venv,
`make box-root`), the way docs/install.md says a box is set up: c2dtn from its wheel into a
venv with the box's pinned dependencies, dtnd on PATH, `c2dtn node init`, `c2dtn node check`,
then the node started as its systemd unit would start it, in a network namespace of its own
(loopback only), with a notify socket standing in for systemd (no systemd runs as PID 1 here):
READY=1, `node status` and /metrics from inside the root, then SIGTERM and exit status 0.
The root is an overlay mount over the cached one: each run starts clean."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from c2dtn.overlay.agents.builds import cache_dir
from c2dtn.overlay.agents.dtn7 import find_dtnd
from c2dtn.topologies.nodes import agent_missing

pytestmark = [pytest.mark.netns, pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing()))]

ROOT = Path(__file__).resolve().parent.parent
BOX_ROOT = cache_dir() / "debian12-root-1"  # (the Makefile's BOX_ROOT)
NETNS = "c2-box"
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
}


def _why_no_root() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mounts, chroot, a network namespace)"
    if (BOX_ROOT / ".built").exists():
        return None
    failed = BOX_ROOT.with_name(BOX_ROOT.name + ".failed")
    if failed.exists():
        return failed.read_text().strip()
    return f"no Debian 12 root at {BOX_ROOT}: `make box-root` builds it"


def sh(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture
def box(tmp_path):
    """The clean root, mounted; yields the chroot's folder; everything undone after (also
    after a failure, and safe to repeat)."""
    why = _why_no_root()
    if why:
        pytest.skip(why)
    merged, upper, work = tmp_path / "root", tmp_path / "upper", tmp_path / "work"
    for d in (merged, upper, work):
        d.mkdir()
    mounts: list[Path] = []
    try:
        r = sh(
            "mount",
            "-t",
            "overlay",
            "c2-box",
            "-o",
            f"lowerdir={BOX_ROOT / 'rootfs'},upperdir={upper},workdir={work}",
            str(merged),
        )
        if r.returncode != 0:
            pytest.skip(f"overlay mount failed: {r.stderr.strip()}")
        mounts.append(merged)
        sh("mount", "-t", "proc", "proc", str(merged / "proc"), timeout=30).check_returncode()
        mounts.append(merged / "proc")
        sh("mount", "--bind", "/dev", str(merged / "dev"), timeout=30).check_returncode()
        mounts.append(merged / "dev")
        pip_cache = Path.home() / ".cache" / "pip"  # the host's downloads, so that a run is not a minute of them
        pip_cache.mkdir(parents=True, exist_ok=True)
        (merged / "root" / ".cache" / "pip").mkdir(parents=True)
        sh("mount", "--bind", str(pip_cache), str(merged / "root" / ".cache" / "pip"), timeout=30).check_returncode()
        mounts.append(merged / "root" / ".cache" / "pip")
        shutil.copy("/etc/resolv.conf", merged / "etc" / "resolv.conf")
        # the host's trust store: where egress re-signs TLS (these machines' does), a box on that
        # network needs its CA too, and pip is told to use the system's store (PIP_CERT below)
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", merged / "etc" / "ssl" / "certs" / "ca-certificates.crt")
        sh("ip", "netns", "del", NETNS, timeout=30)  # (one left by a run that was killed)
        sh("ip", "netns", "add", NETNS, timeout=30).check_returncode()
        sh("ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up", timeout=30).check_returncode()
        yield merged
    finally:
        sh("ip", "netns", "del", NETNS, timeout=30)
        for m in reversed(mounts):
            sh("umount", "-l", str(m), timeout=60)


def _wheel(tmp_path: Path) -> Path:
    """c2dtn's wheel, built from a copy of the checkout (setuptools writes into the tree it builds)."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".tools", "results", "docs", "build", "*.egg-info", "__pycache__"
        ),
    )
    out = tmp_path / "wheels"
    r = sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",  # (built in isolation: pip fetches what pyproject's build-system names)
        "-w",
        str(out),
        str(src),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return next(out.glob("c2dtn-*.whl"))


def test_a_clean_debian_12_root_installs_inits_checks_and_starts_a_node(box, tmp_path):
    wheel = _wheel(tmp_path)
    shutil.copy(wheel, box / "tmp" / wheel.name)
    shutil.copy(ROOT / "requirements" / "box.lock", box / "tmp" / "box.lock")
    shutil.copy(find_dtnd(), box / "usr" / "local" / "bin" / "dtnd")  # docs/install.md: cargo install --root /usr/local

    def chroot(*args: str, netns: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
        pre = ["ip", "netns", "exec", NETNS] if netns else []
        return sh(
            *pre,
            "chroot",
            str(box),
            *args,
            timeout=timeout,
            env=ENV,
        )

    print("installing c2dtn into the clean root", flush=True)
    for step in (
        ["python3", "-m", "venv", "/opt/c2dtn"],
        ["/opt/c2dtn/bin/pip", "install", "-q", "--disable-pip-version-check", "-r", "/tmp/box.lock"],
        ["/opt/c2dtn/bin/pip", "install", "-q", "--disable-pip-version-check", "--no-deps", f"/tmp/{wheel.name}"],
    ):
        r = chroot(*step)
        assert r.returncode == 0, f"{step}: {r.stderr[-3000:]}"
    r = chroot(
        "/opt/c2dtn/bin/c2dtn", "node", "init", "c2box",
        "--agent", "dtn7",
        "--listen", "tcpcl://127.0.0.1:4556",
        "--peer", "c2far=tcpcl://127.0.0.1:4557",
        "--metrics", "127.0.0.1:9464",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    etc = box / "etc" / "c2dtn"
    assert {p.name: p.stat().st_mode & 0o777 for p in etc.iterdir()} == {"c2box.toml": 0o600, "c2box.keys.toml": 0o600}
    unit = (box / "etc" / "systemd" / "system" / "c2dtn@.service").read_text()
    assert "ExecStart=/opt/c2dtn/bin/c2dtn node run --gateways /etc/c2dtn/%i.toml" in unit
    r = chroot("/opt/c2dtn/bin/c2dtn", "node", "check", "/etc/c2dtn/c2box.toml")
    assert r.returncode == 0 and "/var/lib/c2dtn/c2box" in r.stdout and "NOT USABLE" not in r.stdout, (
        r.stdout + r.stderr
    )

    # started as the unit starts it: ExecStart under a notify socket
    notify = box / "run" / "c2-notify.sock"
    mgr = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    mgr.bind(str(notify))
    mgr.settimeout(60)
    log = open(tmp_path / "node.log", "wb")
    p = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            NETNS,
            "chroot",
            str(box),
            *unit.split("ExecStart=")[1].split("\n")[0].replace("%i", "c2box").split(),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**ENV, "NOTIFY_SOCKET": "/run/c2-notify.sock"},
    )
    try:
        heard = mgr.recv(4096).decode()
        assert heard.startswith("READY=1"), heard
        r = chroot("/opt/c2dtn/bin/c2dtn", "node", "status", "--json", "/etc/c2dtn/c2box.toml", netns=True, timeout=60)
        assert r.returncode == 0 and '"node": "c2box"' in r.stdout, r.stdout + r.stderr
        r = chroot(
            "/opt/c2dtn/bin/python", "-c",
            "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=10).read().decode())",
            netns=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0 and "c2dtn_agent_up 1.0" in r.stdout, r.stdout + r.stderr
        assert (box / "var" / "lib" / "c2dtn" / "c2box").stat().st_mode & 0o777 == 0o700
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
        mgr.close()
        time.sleep(0.2)
    assert p.returncode == 0, (tmp_path / "node.log").read_text(errors="replace")[-3000:]
