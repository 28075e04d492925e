"""The CoAP gateway on real daemons: nps-chain, r2=r3 on cnr-tactical-2, an aiocoap server
on h4 behind gw4, aiocoap clients on h1 sending to h4's server, intercepted by TPROXY at
gw1 (and once to gw1's explicit CoAP listener, standing for h4's server).  The radio link
is cut for 60 s while 100 confirmable POSTs cross, and gw1 (gateway, overlay node and
dtnd) is SIGKILLed and restarted inside the cut: every request reaches the server exactly
once and every client gets its response, from the server's address."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from c2dtn.topologies import testbed
from c2dtn.topologies.nodes import Nodes, agent_missing

pytestmark = [pytest.mark.netns, pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing()))]

BPA = ["gw1", "r2", "r3", "gw4"]


def coap(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "c2dtn.perf.coap_clients", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def tables(h4: str) -> dict[str, str]:
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    return {
        "gw1": f'[gateway]\n\n[gateway.coap]\nlisten = "0.0.0.0:5683"\nserver = "{h4}:5683"\ntproxy = true\n\n'
        '[[gateway.coap.resource]]\npath = "/secret/*"\nallow = false\n\n'
        '[[gateway.coap.resource]]\npath = "/orders/*"\npriority = "immediate"\nlifetime = 3600\n\n'
        '[[gateway.coap.resource]]\npath = "/clock"\npriority = "priority"\nlifetime = 3600\n\n'
        '[[gateway.coap.resource]]\npath = "/big"\n\n'
        '[[gateway.coap.resource]]\npath = "/time"\n\n'
        f'[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n',
        "gw4": "[gateway]\n\n[gateway.coap]\n",
    }


@pytest.fixture(scope="module")
def coap_chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coap")
    testbed.down()
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=13)
    h4, gw1 = testbed.node_address(st, "h4"), testbed.node_address(st, "gw1")
    nodes = Nodes(st, BPA, ["gw1", "gw4"], tmp / "nodes", gateways=tables(h4))
    server = coap("h4", "server", "--host", h4)
    cut: dict = {}
    try:
        assert "listening" in server.stdout.readline(), server.stderr.read()[-1500:]
        for n in BPA:
            nodes.start(n, wait=False)
        for n in BPA:
            nodes.wait_ready(n, timeout=60)
        yield nodes, server, gw1, h4, cut
    finally:
        if "observer" in cut and cut["observer"].poll() is None:
            cut["observer"].kill()
        nodes.stop_all()
        server.terminate()
        server.wait(10)
        testbed.down()


def rows(p: subprocess.Popen, timeout: float) -> list[dict]:
    out, err = p.communicate(timeout=timeout)
    got = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert got, f"client printed nothing: {err[-1500:]}"
    return got


def server_lines(server: subprocess.Popen, want: int, timeout: float) -> list[dict]:
    """What the server printed until `want` requests or `timeout` (read on a thread: the pipe blocks)."""
    got: list[dict] = []

    def read():
        while len(got) < want:
            line = server.stdout.readline()
            if not line:
                return
            got.append(json.loads(line))

    th = threading.Thread(target=read, daemon=True)
    th.start()
    th.join(timeout)
    return list(got)


def follow(p: subprocess.Popen, match, want: int, timeout: float) -> list[dict]:
    """A running client's lines until `want` of them match (or it ends, or `timeout`); then it is stopped."""
    got: list[dict] = []

    def read():
        while sum(map(match, got)) < want:
            line = p.stdout.readline()
            if not line:
                return
            if line.startswith("{"):
                got.append(json.loads(line))

    th = threading.Thread(target=read, daemon=True)
    th.start()
    th.join(timeout)
    p.terminate()
    p.wait(10)
    assert got, f"client printed nothing: {p.stderr.read()[-1500:]}"
    return list(got)


def test_100_con_posts_through_tproxy_across_a_60s_outage_with_the_near_gateway_killed_each_reach_the_server_once(
    coap_chain,
):
    nodes, server, gw1, h4, cut = coap_chain
    # an observation runs through the same cut (asserted in the test after this one)
    cut["observer"] = coap("h1", "observe", "--host", h4, "--path", "/clock", "--duration", "400")
    for _ in range(60):  # registered at the server (the first envelope of a fresh path can take a while)
        if nodes.status("gw4")["coap"]["counters"].get("observations"):
            break
        time.sleep(1)
    for _ in range(60):  # and notifications flow (a fixed sleep saw only 4 in CI, 2026-11-23)
        if nodes.status("gw1")["coap"]["counters"].get("notifications", 0) >= 6:
            break
        time.sleep(1)
    client = coap("h1", "post", "--host", h4, "--count", "100", "--interval", "0.2", "--timeout", "300")
    time.sleep(3)
    testbed.change_link("r2", "r3", "down")
    cut["down"] = time.time()
    t0 = time.monotonic()
    try:
        time.sleep(20)
        nodes.kill("gw1")  # gateway, overlay and its dtnd: SIGKILL, as a power cut
        time.sleep(5)
        nodes.start("gw1")
        time.sleep(max(0.0, 60 - (time.monotonic() - t0)))
    finally:
        testbed.change_link("r2", "r3", "up")
        cut["up"] = time.time()
    got = rows(client, 320)
    answered = {r["n"]: r for r in got if "code" in r}
    failed = [r for r in got if "error" in r]
    seen = server_lines(server, 100, 30)
    paths = [s["path"] for s in seen if s["path"].startswith("/orders/")]
    print("client:", got[-1], "gw1:", nodes.status("gw1").get("coap"), "gw4:", nodes.status("gw4").get("coap"))
    assert not failed, f"{len(failed)} requests failed at the client: {failed[:5]}"
    assert sorted(answered) == list(range(100)), f"unanswered: {sorted(set(range(100)) - set(answered))[:10]}"
    assert all(r["code"] == "2.04 Changed" and r["payload"] == f"ack order {n}" for n, r in answered.items())
    assert len(paths) == len(set(paths)), (
        f"a request reached the server twice: {sorted(p for p in paths if paths.count(p) > 1)[:5]}"
    )
    assert sorted(paths) == sorted(f"/orders/{n}" for n in range(100))
    assert max(r["s"] for r in answered.values()) > 55  # the responses really waited for the link
    # every one was intercepted at gw1 and replayed by gw4 (none went past gw1 on its own)
    assert nodes.status("gw4")["coap"]["counters"]["replayed"] == 100


def test_an_observation_through_the_60s_outage_gives_the_newest_state_first_not_the_backlog(coap_chain):
    """The observation that ran through the previous test's cut (gw1 SIGKILLed in it too)."""
    nodes, server, gw1, h4, cut = coap_chain
    if "up" not in cut:
        pytest.skip("the outage test before this one did not run its cut")
    up, down = cut["up"], cut["down"]
    got = follow(cut["observer"], lambda r: "payload" in r and r["t"] > up, 12, 200)
    print(
        "observer (s after link-up, state's age):",
        [(round(r["t"] - up, 1), round(r["t"] - float(r["payload"]), 1)) for r in got if "payload" in r],
        "gw1:",
        nodes.status("gw1").get("coap"),
        "gw4:",
        nodes.status("gw4").get("coap"),
    )
    assert not [r for r in got if "error" in r or ("code" in r and r["code"] != "2.05 Content")], got[-3:]
    notes = [r for r in got if "payload" in r]
    assert len([r for r in notes if r["t"] < down]) >= 4, "notifications did not flow before the cut"
    after = [r for r in notes if r["t"] > up]
    assert len(after) >= 10, "the observation did not go on after the cut"
    first = after[0]
    wait = first["t"] - up
    print(
        f"first notification {wait:.1f} s after link-up, its state made {first['t'] - float(first['payload']):.1f} s "
        "before it arrived"
    )
    # the newest state there was when it left gw4, not the oldest of the cut's backlog: no
    # notification after it carries older state, and it was made after the cut's first half
    assert all(float(r["payload"]) >= float(first["payload"]) for r in after)
    assert float(first["payload"]) > down + 30
    assert wait < 30  # the issue asks for 10 s; measured 1.8 s (2026-11-23), the margin is for a noisy CI machine


def test_a_request_no_rule_releases_is_refused_at_once_and_never_reaches_the_server(coap_chain):
    nodes, server, gw1, *_ = coap_chain
    got = rows(coap("h1", "post", "--host", gw1, "--count", "1", "--path", "/secret/plan", "--timeout", "10"), 30)
    assert got[0]["code"] == "4.03 Forbidden" and got[0]["s"] < 1
    assert nodes.status("gw1")["coap"]["counters"]["forbidden"] == 1


def test_a_20kB_blockwise_get_across_the_radio_link_arrives_intact(coap_chain):
    import hashlib

    from c2dtn.perf.coap_clients import BIG

    nodes, server, gw1, h4, _ = coap_chain
    got = rows(coap("h1", "get", "--host", h4, "--path", "/big", "--timeout", "120"), 150)
    assert got[0].get("code") == "2.05 Content", got
    assert got[0]["size"] == len(BIG) == 20_000 and got[0]["sha256"] == hashlib.sha256(BIG).hexdigest()


def server_paths(server: subprocess.Popen, prefix: str, want: int, timeout: float) -> list[str]:
    """The paths starting with `prefix` the server printed, until `want` of them or `timeout`."""
    got: list[str] = []

    def read():
        while len(got) < want:
            line = server.stdout.readline()
            if not line:
                return
            path = json.loads(line)["path"]
            if path.startswith(prefix):
                got.append(path)

    th = threading.Thread(target=read, daemon=True)
    th.start()
    th.join(timeout)
    return list(got)


def test_a_flood_of_malformed_datagrams_is_dropped_and_counted_while_a_good_client_loses_nothing(coap_chain):
    """3,000 datagrams of RFC 7252's format errors (bad version, token length 9-15, truncated
    options, option delta or length 15, payload marker with no payload) at 1,000 a second from
    h1 to h4's server, intercepted at gw1, while 20 well-formed POSTs go the same way."""
    nodes, server, gw1, h4, _ = coap_chain
    before = nodes.status("gw1")["coap"]["counters"].get("malformed", 0)
    good = coap(
        "h1", "post", "--host", h4, "--count", "20", "--interval", "0.15", "--path", "/orders/f{n}", "--timeout", "120"
    )
    flood = rows(coap("h1", "flood", "--host", h4, "--count", "3000", "--rate", "1000"), 60)[-1]
    got = rows(good, 150)
    answered = {r["n"]: r for r in got if "code" in r}
    assert flood["sent"] == 3000 and len(flood["kinds"]) == 5
    assert sorted(answered) == list(range(20)), got[-3:]
    assert all(r["code"] == "2.04 Changed" and r["payload"] == f"ack order {n}" for n, r in answered.items())
    seen = server_paths(server, "/orders/f", 20, 30)
    assert sorted(seen) == sorted(f"/orders/f{n}" for n in range(20))  # each once, nothing of the flood
    st = nodes.status("gw1")["coap"]["counters"]
    assert st["malformed"] - before == 3000, st
    log = nodes.log("gw1")
    lines = [x for x in log.splitlines() if "malformed CoAP datagram from" in x]
    assert 1 <= len(lines) <= 3, lines[:5]  # named, but the log is not flooded (one line per source per 10 s)


@pytest.mark.skipif(
    shutil.which("coap-client-notls") is None or shutil.which("coap-server-notls") is None,
    reason="libcoap's coap-client-notls / coap-server-notls missing (make test installs libcoap3-bin)",
)
def test_libcoap_client_and_server_work_through_the_gateways(coap_chain):
    """libcoap's own client and server (Debian's libcoap3-bin), not aiocoap: its client POSTs to
    h4's server through gw1's interception, and observes its server's /time (on gw4's LAN
    address, across the link) for 15 s."""
    nodes, server, gw1, h4, _ = coap_chain
    st = testbed.read_state()
    lan = h4.rsplit(".", 1)[0] + "."
    far = next(i["address"] for i in st["nodes"]["gw4"]["ifaces"] if i["address"].startswith(lan))
    ex = lambda node, *cmd: ["ip", "netns", "exec", f"c2-{node}", *cmd]  # noqa: E731
    srv = subprocess.Popen(
        ex("gw4", "coap-server-notls", "-A", far, "-p", "5683"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = subprocess.run(
            ex(
                "h1",
                "coap-client-notls",
                "-m",
                "post",
                "-e",
                "order libcoap",
                "-B",
                "150",
                f"coap://{h4}/orders/libcoap",
            ),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.stdout.strip() == "ack order libcoap", (out.returncode, out.stdout, out.stderr[-500:])
        assert server_paths(server, "/orders/libcoap", 1, 10) == ["/orders/libcoap"]
        out = subprocess.run(
            ex("h1", "coap-client-notls", "-m", "get", "-s", "15", "-B", "30", f"coap://{far}/time"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        stamps = re.findall(r"\w{3} +\d+ \d\d:\d\d:\d\d(?!\.)", out.stdout)
        assert len(stamps) >= 5, (out.returncode, out.stdout, out.stderr[-500:])  # its server notifies once a second
        assert len(set(stamps)) == len(stamps) and stamps == sorted(stamps), stamps  # each newer, none twice
    finally:
        srv.terminate()
        srv.wait(10)
