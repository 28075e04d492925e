"""The Eclipse Paho MQTT interoperability client tests, through the gateway and against
Mosquitto alone, in one run.

`c2dtn perf paho-interop --suite DIR`: DIR is a checkout of paho.mqtt.testing (github
eclipse/paho.mqtt.testing; on no package registry, so `make test` runs its scenarios
re-written instead: tests/test_conformance_mqtt.py, docs/decisions/0003-mqtt-conformance.md).
nps-chain on the lan profile; two Mosquitto brokers on h4, 1883 behind gw1's explicit
listener (the overlay carries it to gw4) and 1884 reached direct.  Every test of
`client_test5.py` (MQTT 5.0) and `client_test.py` (3.1.1) runs in its own process from h1
with a 60 s limit, first against the broker alone, then through the gateway.  Writes
results/<time>-paho-interop/ with report.md (a table: test, alone, through), summary.json
and each test's output.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from c2dtn.perf.runs import progress, run_dir
from c2dtn.topologies import testbed
from c2dtn.topologies.broker import start_mosquitto
from c2dtn.topologies.nodes import Nodes

LIMIT_S = 60
BPA = ["gw1", "r2", "r3", "gw4"]
SUITES = {"5.0": "client_test5", "3.1.1": "client_test"}
# runs one test of a suite module by name, with the globals its __main__ would set
RUNNER = """
import sys, unittest
sys.argv = [sys.argv[0]]
import {mod} as t
t.host, t.port = {host!r}, {port}
t.topic_prefix = "{mod}/"
t.topics = [t.topic_prefix + x for x in ["TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA"]]
t.wildtopics = [t.topic_prefix + x for x in ["TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#"]]
t.nosubscribe_topics = ("test/nosubscribe",)
r = unittest.TextTestRunner(verbosity=2).run(unittest.defaultTestLoader.loadTestsFromName("Test.{name}", t))
sys.exit(0 if r.wasSuccessful() else 1)
"""


@contextlib.contextmanager
def broker_pair(tmp: Path, topic_filter: str, seed: int):
    """nps-chain (lan) with Mosquitto on h4 at 1883, behind gw1's explicit listener and the
    overlay (gw4 publishes there), and at 1884, reached direct; yields (gw1, h4, nodes).
    Shared with tests/test_conformance_mqtt.py."""
    testbed.down()
    st = testbed.up("nps-chain", profile="lan", seed=seed)
    h4, gw1 = testbed.node_address(st, "h4"), testbed.node_address(st, "gw1")
    topics = f'[[gateway.topic]]\nfilter = "{topic_filter}"\npriority = "immediate"\nlifetime = 600\n'
    gateways = {
        "gw1": f'[gateway]\nlisten = "0.0.0.0:1883"\nbroker = "{h4}:1883"\n\n'
        f'[[gateway.route]]\nprefix = "{h4.rsplit(".", 1)[0]}.0/24"\nvia = "gw4"\n\n{topics}',
        "gw4": f"[gateway]\n\n{topics}",
    }
    brokers = [start_mosquitto("c2-h4", tmp, h4, port) for port in (1883, 1884)]
    nodes = Nodes(st, BPA, ["gw1", "gw4"], tmp / "nodes", gateways=gateways)
    try:
        nodes.start_all(BPA)
        yield gw1, h4, nodes
    finally:
        nodes.stop_all()
        for b in brokers:
            b.terminate()
            b.wait(10)
        testbed.down()


def test_names(suite: Path, mod: str) -> list[str]:
    return re.findall(r"^\s+def (test_\w+)\(self", (suite / f"{mod}.py").read_text(), re.M)


def run_one(suite: Path, mod: str, name: str, host: str, port: int) -> tuple[str, str]:
    code = RUNNER.format(mod=mod, host=host, port=port, name=name)
    try:
        p = subprocess.run(
            ["ip", "netns", "exec", "c2-h1", sys.executable, "-c", code],
            cwd=suite,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stderr or b"").decode(errors="replace")[-3000:] if isinstance(e.stderr, bytes) else ""
    return ("pass" if p.returncode == 0 else "fail"), (p.stdout + p.stderr)[-3000:]


def main(suite: Path, console=None) -> Path:
    suite = Path(suite) / "interoperability" if (Path(suite) / "interoperability").is_dir() else Path(suite)
    if not (suite / "client_test5.py").is_file():
        raise ValueError(f"{suite}: no client_test5.py (give a checkout of paho.mqtt.testing)")
    out = run_dir("paho-interop")
    tmp = Path(tempfile.mkdtemp(prefix="c2paho-"))
    rows = []
    with broker_pair(tmp, "#", 23) as (gw1, h4, nodes):
        plan = [(v, mod, name) for v, mod in SUITES.items() for name in test_names(suite, mod)]
        (out / "logs").mkdir()
        with progress(console, "tests") as bar:
            task = bar.add_task("paho interop: alone, then through gw1", total=len(plan))
            for v, mod, name in plan:
                alone, log_a = run_one(suite, mod, name, h4, 1884)
                through, log_t = run_one(suite, mod, name, gw1, 1883)
                (out / "logs" / f"{mod}.{name}.txt").write_text(
                    f"== alone: {alone}\n{log_a}\n== through gw1: {through}\n{log_t}\n"
                )
                rows.append({"version": v, "test": name, "alone": alone, "through": through})
                bar.advance(task)
    summary = {
        v: {
            "tests": sum(r["version"] == v for r in rows),
            "alone": sum(r["version"] == v and r["alone"] == "pass" for r in rows),
            "through": sum(r["version"] == v and r["through"] == "pass" for r in rows),
            "through_only_failures": [
                r["test"] for r in rows if r["version"] == v and r["alone"] == "pass" and r["through"] != "pass"
            ],
        }
        for v in SUITES
    }
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    (out / "summary.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    lines = [
        "# Paho MQTT interoperability client tests, Mosquitto alone and through gw1",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {commit[:7]}: `c2dtn perf paho-interop --suite DIR`, "
        "nps-chain (lan profile), each test in its own process, 60 s limit.",
        "",
        "| MQTT | tests | pass alone | pass through gw1 | fail only through gw1 |",
        "|---|---|---|---|---|",
    ]
    for v, s in summary.items():
        lines.append(
            f"| {v} | {s['tests']} | {s['alone']} | {s['through']} | "
            f"{', '.join(s['through_only_failures']) or 'none'} |"
        )
    lines += ["", "| MQTT | test | alone | through gw1 |", "|---|---|---|---|"]
    lines += [f"| {r['version']} | {r['test']} | {r['alone']} | {r['through']} |" for r in rows]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    if console is not None:
        console.print("\n".join(lines[: 8 + len(summary)]))
    return out
