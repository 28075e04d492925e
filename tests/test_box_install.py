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
def test_a_box_install_runs_the_gateway_and_shows_its_status_and_metrics(box_venv, tmp_path):
    """`c2dtn gateway run` from the box install on loopback (no namespaces), with one
    peer configured; `c2dtn gateway status` lists it (it once read a field peers lack).  After
    MQTT clients publish a known number of orders (held: the peer is not there), /metrics says
    what status says, and promtool (Debian's) passes it."""
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

[metrics]
listen = "127.0.0.1:19464"

[gateway]
listen = "127.0.0.1:18830"
broker = "127.0.0.1:18831"

[[gateway.route]]
prefix = "127.0.0.0/8"
via = "gwfar"

[[gateway.topic]]
filter = "c2/#"
priority = "immediate"
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
        _publish_orders("127.0.0.1", 18830, 7)
        st, text = _status_and_metrics(box_venv, cfg, tmp_path, "http://127.0.0.1:19464/metrics")
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0, (tmp_path / "gw.log").read_text(errors="replace")[-3000:]
    got = _samples(text)
    mq = st["mqtt"]["counters"]
    assert got[("c2dtn_mqtt_published_total", ())] == mq["published"] == 7
    assert got[("c2dtn_mqtt_puback_latency_seconds_count", ())] == st["mqtt"]["puback_s"]["count"] == 7
    assert got[("c2dtn_mqtt_clients", ())] == len(st["mqtt"]["clients"])
    for k, v in st["counters"].items():  # the custody store's, as status shows them
        if ("c2dtn_store_" + k + "_total", ()) in got:
            assert got[("c2dtn_store_" + k + "_total", ())] == v, k
    # publishes read together share an envelope: 7 orders are 1 to 7 envelopes, all held (the
    # peer is not there), beside the session's own
    assert 2 <= got[("c2dtn_store_accepted_total", ())] == st["counters"]["accepted"] <= 8
    row = next(r for r in st["envelopes"] if (r["peer"], r["priority"]) == ("gwfar", "immediate"))
    assert (
        1 <= got[("c2dtn_envelopes_submitted_total", (("class", "immediate"), ("peer", "gwfar")))] == row["submitted"]
    )
    assert got[("c2dtn_custody_envelopes", ())] == st["custody"]["envelopes"] == st["counters"]["accepted"]
    assert got[("c2dtn_agent_up", ())] == 1
    promtool = ROOT / ".tools" / "promtool"
    if not promtool.exists():
        pytest.skip("promtool: `make promtool` found no prometheus package in apt's lists")
    r = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _publish_orders(host: str, port: int, n: int) -> int:
    """n QoS 1 publishes from a paho client, each PUBACKed; returns n."""
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="box-metrics", protocol=mqtt.MQTTv5)
    c.connect(host, port)
    c.loop_start()
    try:
        infos = [c.publish("c2/orders", f"order {i}".encode(), qos=1) for i in range(n)]
        for i in infos:
            i.wait_for_publish(timeout=20)
            assert i.is_published()
    finally:
        c.disconnect()
        c.loop_stop()
    return n


def _status_and_metrics(box_venv: Path, cfg: Path, cwd: Path, url: str) -> tuple[dict, str]:
    """`gateway status --json` and a scrape, taken once nothing changes between them."""
    import json
    import urllib.request

    for _ in range(20):
        r = _run(box_venv, "c2dtn", "gateway", "status", "--json", str(cfg), cwd=cwd)
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = resp.read().decode()
        again = json.loads(_run(box_venv, "c2dtn", "gateway", "status", "--json", str(cfg), cwd=cwd).stdout)
        if again["counters"] == st["counters"] and again["mqtt"]["counters"] == st["mqtt"]["counters"]:
            return st, text
        time.sleep(0.5)
    raise AssertionError("the gateway's counters kept changing")


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
