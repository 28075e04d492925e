"""Conformance: libcoap's own client gets through the gateway what it gets from libcoap's
server direct (Debian's libcoap3-bin).  nps-chain on the lan profile; two
`coap-server-notls -d 10` on h4, one on UDP 5683 (reached through gw1's TPROXY, carried by
the overlay to gw4) and one on UDP 5690 (not intercepted: the reference).  The same
sequence of requests goes to each from h1, one client process a request, and every answer
(exit status, what the client prints) must be the same."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c2dtn.topologies import testbed
from c2dtn.topologies.nodes import Nodes, agent_missing

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing())),
    pytest.mark.skipif(not shutil.which("coap-client-notls"), reason="libcoap3-bin not installed (make apt)"),
]

BPA = ["gw1", "r2", "r3", "gw4"]
THROUGH, DIRECT = 5683, 5690
BIG = 4500  # bytes: 71 blocks of 64


def cases(big: Path) -> list[tuple[str, list[str], str]]:
    """(name, coap-client arguments before the URI, path); run in this order on each server."""
    return [
        ("GET /", [], "/"),
        ("GET /.well-known/core", [], "/.well-known/core"),
        ("GET unknown: 4.04", [], "/c2-none"),
        ("PUT -e hello-c2", ["-m", "put", "-e", "hello-c2"], "/example_data"),
        ("GET after PUT", [], "/example_data"),
        ("POST: 4.05", ["-m", "post", "-e", "x"], "/example_data"),
        ("PUT creates (-d)", ["-m", "put", "-e", "made"], "/c2-made"),
        ("DELETE", ["-m", "delete"], "/c2-made"),
        ("NON GET", ["-N"], "/"),
        ("separate response after 2 s", [], "/async?2"),
        ("query", [], "/time?ticks"),
        ("Block1 PUT -b 64", ["-m", "put", "-b", "64", "-f", str(big)], "/example_data"),
        ("Block2 GET -b 64", ["-b", "64"], "/example_data"),
        ("GET of a large body", [], "/example_data"),
    ]


def answer(host: str, port: int, args: list[str], path: str) -> tuple[int, str, str]:
    p = subprocess.run(
        ["ip", "netns", "exec", "c2-h1", "coap-client-notls", "-B", "60", *args, f"coap://{host}:{port}{path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    # the clock's value and libcoap's own log time stamps differ from run to run
    def norm(t: str) -> str:
        return re.sub(r"\d{6,}", "<n>", re.sub(r"^\w{3} \d\d \d\d:\d\d:\d\d ", "", t, flags=re.M))

    return p.returncode, norm(p.stdout), norm(p.stderr)


def short(a: tuple[int, str, str]) -> str:
    return repr((a[0], a[1][:120] + f"... ({len(a[1])} chars)" if len(a[1]) > 120 else a[1], a[2][-300:]))


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coap-conf")
    testbed.down()
    st = testbed.up("nps-chain", profile="lan", seed=17)
    h4 = testbed.node_address(st, "h4")
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    gateways = {
        "gw1": f'[gateway]\n\n[gateway.coap]\ntproxy = true\n\n[[gateway.coap.resource]]\npath = "/*"\n\n'
        f'[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n',
        "gw4": "[gateway]\n\n[gateway.coap]\n",
    }
    nodes = Nodes(st, BPA, ["gw1", "gw4"], tmp / "nodes", gateways=gateways)
    servers = [
        subprocess.Popen(
            ["ip", "netns", "exec", "c2-h4", "coap-server-notls", "-A", h4, "-p", str(port), "-d", "10"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in (THROUGH, DIRECT)
    ]
    try:
        nodes.start_all(BPA)
        big = tmp / "big.txt"
        big.write_bytes(bytes(0x41 + i % 26 for i in range(BIG)))
        yield h4, nodes, big
    finally:
        nodes.stop_all()
        for s in servers:
            s.terminate()
            s.wait(10)
        testbed.down()


def test_libcoap_client_gets_through_the_gateway_what_it_gets_from_the_server_direct(chain):
    h4, nodes, big = chain
    ref, differ = {}, []
    for name, args, path in cases(big):
        ref[name] = direct = answer(h4, DIRECT, args, path)
        through = answer(h4, THROUGH, args, path)
        if direct != through:
            differ.append(f"{name}: direct {short(direct)}\n    through the gateway {short(through)}")
    assert not differ, "\n".join(differ) + "\n" + nodes.log("gw1")[-2000:]
    # the reference answered as libcoap's server does, so agreeing with it means something
    assert ref["GET after PUT"][:2] == (0, "hello-c2\n") and "4.04" in ref["GET unknown: 4.04"][2]
    assert [len(ref[n][1].strip()) for n in ("Block2 GET -b 64", "GET of a large body")] == [BIG, BIG]
    assert ref["separate response after 2 s"][1].strip() == "done"
    assert nodes.status("gw1")["coap"]["counters"].get("requests"), nodes.status("gw1")["coap"]
