"""What ships to a gateway box: `pip install .` without extras into a clean venv (from
the box lock file), then the node and the gateway run, and nothing of the testbed,
perf or tests comes along.  Also the import graph that makes that possible."""

from __future__ import annotations

import ast
import grp
import os
import shutil
import signal
import subprocess
import time
import venv
from pathlib import Path

import pytest

from c2dtn.overlay.agents.dtn7 import find_dtnd
from c2dtn.topologies.nodes import agent_missing

ROOT = Path(__file__).resolve().parent.parent
DEPLOYABLE = {"overlay": "c2dtn.overlay", "ip-gateway": "c2dtn.ip_gateway", "cla-adapters": "c2dtn.cla_adapters"}
HARNESS = ("c2dtn.topologies", "c2dtn.perf", "c2dtn.cli")


def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module)
            mods |= {f"{node.module}.{a.name}" for a in node.names}
    return mods


def test_deployable_packages_import_nothing_of_the_testbed_or_perf():
    wrong = []
    for folder in DEPLOYABLE:
        for f in sorted((ROOT / folder).rglob("*.py")):
            for mod in _imports(f):
                if mod.startswith(HARNESS) or mod.split(".")[0] in (
                    "overlay",
                    "perf",
                    "topologies",
                    "ip_gateway",
                    "cla_adapters",
                    "matplotlib",
                    "rich",
                    "paho",
                ):
                    wrong.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not wrong, "\n".join(wrong)


@pytest.fixture(scope="module")
def box_venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("box") / "venv"
    venv.create(d, with_pip=True)
    py = d / "bin" / "python"
    # built from a copy: setuptools leaves build/ and *.egg-info in the tree it builds
    src = tmp_path_factory.mktemp("src") / "c2dtn"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".tools", "results", "docs", "build", "*.egg-info", "__pycache__", ".pytest_cache"
        ),
    )
    for args in (["-r", str(ROOT / "requirements" / "box.lock")], ["--no-deps", str(src)]):
        r = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    return d


def _run(venv_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv_dir / "bin" / args[0]), *args[1:]], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_a_box_install_has_no_generic_names_and_no_harness(box_venv, tmp_path):
    # run from an empty directory, so the checkout's folders are not on the path
    r = _run(box_venv, "python", "-c", "import overlay", cwd=tmp_path)
    assert r.returncode != 0 and "No module named 'overlay'" in r.stderr
    for mod in ("perf", "topologies", "ip_gateway", "cla_adapters", "matplotlib", "rich", "paho"):
        r = _run(box_venv, "python", "-c", f"import {mod}", cwd=tmp_path)
        assert r.returncode != 0, f"{mod} is importable in a box install"
    r = _run(
        box_venv,
        "python",
        "-c",
        "import c2dtn.overlay.node, c2dtn.ip_gateway.gateway, c2dtn.cla_adapters",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    r = _run(box_venv, "c2dtn", "perf", "bft", cwd=tmp_path)
    assert r.returncode != 0 and "[perf]" in r.stderr and "is part of the testbed" in r.stderr


@pytest.mark.bpa
@pytest.mark.skipif(agent_missing() is not None, reason=f"{agent_missing()}")
def test_a_box_install_runs_the_gateway_and_shows_its_status(box_venv, tmp_path):
    """`c2dtn gateway run` from the box install on loopback (no namespaces), with one
    peer configured; `c2dtn gateway status` lists it (it once read a field peers lack)."""
    store = tmp_path / "gwbox"
    cfg = tmp_path / "gwbox.toml"
    cfg.write_text(f"""[node]
id = "gwbox"
storage = "{store}"
api_group = "daemon"

[agent]
kind = "dtn7"
store = "mem"
web_port = 3990
listen = ["tcpcl://127.0.0.1:4990"]

[[agent.peers]]
node = "gwfar"
cla = "tcpcl://127.0.0.1:4991"

[keys]
gwfar = "{"ab" * 32}"

[gateway]
listen = "127.0.0.1:18830"
broker = "127.0.0.1:18831"

[[gateway.topic]]
filter = "c2/#"
""")
    cfg.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("C2DTN_DTND", find_dtnd())
    log = open(tmp_path / "gw.log", "wb")
    p = subprocess.Popen(
        [str(box_venv / "bin" / "c2dtn"), "gateway", "run", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            r = _run(box_venv, "c2dtn", "gateway", "status", str(cfg), cwd=tmp_path)
            if r.returncode == 0 or time.monotonic() > deadline or p.poll() is not None:
                break
            time.sleep(0.3)
        out = (tmp_path / "gw.log").read_text(errors="replace")
        assert r.returncode == 0, f"status failed: {r.stderr}\ngateway log:\n{out[-3000:]}"
        assert "gateway gwbox: MQTT sessions" in r.stdout
        assert "peers: gwfar (" in r.stdout
        r = _run(box_venv, "c2dtn", "node", "status", str(cfg), cwd=tmp_path)
        assert r.returncode == 0 and "gwfar" in r.stdout and "127.0.0.1" in r.stdout, r.stdout + r.stderr
        # the API socket: its owner and the api_group, nobody else
        st = os.stat(store / "api.sock")
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, grp.getgrnam("daemon").gr_gid)
        # ... reached through the storage folder, which that group may pass through but not list
        st = os.stat(store)
        assert (st.st_mode & 0o777, st.st_gid) == (0o710, grp.getgrnam("daemon").gr_gid)
        assert (os.stat(store / "custody.db").st_mode & 0o777) == 0o600
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0, (tmp_path / "gw.log").read_text(errors="replace")[-3000:]
