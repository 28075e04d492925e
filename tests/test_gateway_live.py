"""The MQTT gateway on real daemons: nps-chain, r2=r3 on cnr-tactical-2, mosquitto on
h4 behind gw4 and on h1 behind gw1, paho-mqtt clients on h1 whose traffic gw1
intercepts (TPROXY), and the two gateways also bridging the brokers on h1 and h4.

One topology for the whole module (building it costs more than the short tests);
every test uses its own client ids and topics, and any test that cuts the link or
kills a gateway puts it back before it ends."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from c2dtn.ip_gateway import mqtt as m
from c2dtn.overlay.config import load_node_config
from c2dtn.topologies import netns, testbed
from c2dtn.topologies.broker import mosquitto_missing, start_mosquitto
from c2dtn.topologies.nodes import Nodes, agent_missing

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(agent_missing() is not None, reason=str(agent_missing())),
    pytest.mark.skipif(mosquitto_missing() is not None, reason=str(mosquitto_missing())),
]

BPA = ["gw1", "r2", "r3", "gw4"]
MAX_PACKET = 65536
EXPLICIT_PORT = 1884  # gw1's explicit listener, standing for h4's broker
TOPICS = (
    '[[gateway.topic]]\nfilter = "c2/#"\npriority = "immediate"\nlifetime = 3600\n\n'
    '[[gateway.topic]]\nfilter = "nat/#"\npriority = "routine"\nlifetime = 3600\n'
)


def gateway_tables(h1: str, h4: str, auth: str = "") -> dict[str, str]:
    """gw1 intercepts clients on h1 bound for h4's broker, and also listens on port 1884 for
    clients pointed at it (explicit mode, standing for h4's broker); both bridge nat/#
    between the brokers.  Only c2/# and nat/# are on the allow-list.  auth: gw1's
    password_file/acl_file lines."""
    prefix = h4.rsplit(".", 1)[0] + ".0/24"
    return {
        "gw1": f"[gateway]\ntproxy = true\nmax_packet_size = {MAX_PACKET}\n{auth}"
        f'listen = "0.0.0.0:{EXPLICIT_PORT}"\nbroker = "{h4}:1883"\n\n'
        f'[gateway.bridge]\nbroker = "{h1}:1883"\npeers = ["gw4"]\nout = ["nat/#"]\n\n'
        f'[[gateway.route]]\nprefix = "{prefix}"\nvia = "gw4"\n\n{TOPICS}',
        "gw4": f'[gateway]\n\n[gateway.bridge]\nbroker = "{h4}:1883"\npeers = ["gw1"]\nout = ["nat/#"]\n\n{TOPICS}',
    }


def _mqtt_chain(tmp, agent: str = "dtn7"):
    testbed.down()
    st = testbed.up("nps-chain", profile="cnr-tactical-2", seed=13)
    h1, h4 = testbed.node_address(st, "h1"), testbed.node_address(st, "h4")
    # gw1 checks logins against a file mosquitto_passwd wrote, and an ACL: anonymous clients (the
    # other tests') may do anything, alice only under c2/alice/
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(tmp / "passwd"), "alice", "s3cret"], check=True)
    (tmp / "acl").write_text("topic readwrite #\n\nuser alice\ntopic readwrite c2/alice/#\n")
    auth = f'password_file = "{tmp / "passwd"}"\nacl_file = "{tmp / "acl"}"\nallow_anonymous = true\n'
    nodes = Nodes(st, BPA, ["gw1", "gw4"], tmp / "nodes", gateways=gateway_tables(h1, h4, auth), agent=agent)
    brokers = [start_mosquitto("c2-h4", tmp / "broker4", h4), start_mosquitto("c2-h1", tmp / "broker1", h1)]
    try:
        for n in BPA:
            nodes.start(n, wait=False)
        for n in BPA:
            nodes.wait_ready(n, timeout=60)
        yield nodes, h1, h4
    finally:
        nodes.stop_all()
        for b in brokers:
            b.terminate()
            b.wait(10)
        testbed.down()


@pytest.fixture(scope="module")
def mqtt_chain(tmp_path_factory):
    yield from _mqtt_chain(tmp_path_factory.mktemp("mqtt"))


def _custody_state(nodes: Nodes) -> str:
    """What the gateways hold, for a failure's message: status, and gw1's receiving side."""
    import sqlite3

    out = []
    for n in ("gw1", "gw4"):
        st = nodes.status(n)
        out.append(
            f"{n}: counters {st.get('counters')}, queues {st.get('queues')}, windows {st.get('windows')}, "
            f"inbox {st.get('inbox')}, mqtt {st.get('mqtt', {}).get('counters')}"
        )
    db = sqlite3.connect(f"file:{load_node_config(nodes.paths['gw1']).custody_db}?mode=ro", uri=True)
    try:
        out.append(
            f"gw1 order {db.execute('SELECT * FROM orderq').fetchall()}, held "
            f"{db.execute('SELECT origin, priority, cseq, seq FROM held').fetchall()}"
        )
    except sqlite3.Error as e:
        out.append(f"gw1 custody.db: {e}")
    finally:
        db.close()
    return "\n".join(out)


def client(node: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "c2dtn.perf.mqtt_clients", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines(p: subprocess.Popen, timeout: float) -> list[dict]:
    out, err = p.communicate(timeout=timeout)
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert rows, f"client printed nothing: {err[-1500:]}"
    return rows


def subscribed(p: subprocess.Popen, timeout: float = 30) -> None:
    """Wait for a sub client's SUBACK line (the rest of its output stays for lines())."""
    deadline = time.monotonic() + timeout
    line = p.stdout.readline()
    while "subscribed" not in line:
        assert time.monotonic() < deadline and line, f"no SUBACK: {p.stderr.read()[-1500:] if not line else line}"
        line = p.stdout.readline()


def far_subscribed(nodes: Nodes, client_id: str, flt: str, timeout: float = 60) -> None:
    """Wait until gw4 holds client_id's subscription to flt at the real broker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        far = nodes.status("gw4")["mqtt"]["sessions_far"]
        if any(k.endswith("/" + client_id) and flt in v["subs"] for k, v in far.items()):
            return
        time.sleep(0.5)
    raise AssertionError(f"gw4 never subscribed {flt} for {client_id}: {nodes.status('gw4')['mqtt']}")


def ids_of(rows: list[dict]) -> list[int]:
    return [int(r["payload"].split()[0]) for r in rows if "topic" in r]


def outage(seconds: float, during=None) -> None:
    testbed.change_link("r2", "r3", "down")
    t0 = time.monotonic()
    try:
        if during:
            during()
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    finally:
        testbed.change_link("r2", "r3", "up")
    print(f"link was down {time.monotonic() - t0:.0f} s", flush=True)


def _300_across_an_outage(nodes: Nodes, h4: str, tag: str, during=None, seconds: float = 40) -> tuple[dict, list[int]]:
    """300 QoS 1 publishes, one per 0.1 s, the radio link cut from the 5th second for `seconds`."""
    sub = client(
        "h4",
        "sub",
        "--host",
        "127.0.0.1",
        "--topic",
        f"c2/{tag}/#",
        "--qos",
        "1",
        "--count",
        "300",
        "--timeout",
        "420",
        "--client-id",
        f"c2sub-{tag}",
    )
    subscribed(sub)
    pub = client(
        "h1",
        "pub",
        "--host",
        h4,
        "--topic",
        f"c2/{tag}/{{n}}",
        "--qos",
        "1",
        "--count",
        "300",
        "--interval",
        "0.1",
        "--timeout",
        "400",
        "--client-id",
        f"c2pub-{tag}",
    )
    time.sleep(5)
    outage(seconds, during)
    p = lines(pub, 480)[-1]
    ids = ids_of(lines(sub, 480))
    print("publisher:", p, "subscriber got", len(ids), "gw1:", nodes.status("gw1").get("mqtt"), flush=True)
    return p, ids


def assert_300_once_unseen(p: dict, ids: list[int]) -> None:
    """The publisher had all 300 acked and never saw the outage; each arrived exactly once."""
    assert p["acked"] == 300 and p["disconnects"] == [], "the publisher saw the outage"
    assert len(ids) == len(set(ids)), "a message arrived twice"
    assert sorted(ids) == list(range(300)), f"missing {sorted(set(range(300)) - set(ids))[:10]}"


# 40 s of outage (60 s until 2026-11-24): every publish after the 5th second still goes into it.
# Over dtn7 it runs with C2DTN_ALL_AGENT_TESTS=1: in `make test` the same test runs over ion
# (test_gateway_agents_live.py; what it asserts is the gateway's, whatever the agent) and
# the SIGKILL test below runs over dtn7, which keeps the suite within its 35 minutes.
@pytest.mark.skipif(
    os.environ.get("C2DTN_ALL_AGENT_TESTS") != "1",
    reason="over dtn7 left out of make test for the suite's 35 minutes (ion runs it); C2DTN_ALL_AGENT_TESTS=1 runs it",
)
def test_300_qos1_publishes_across_a_40s_outage_all_arrive_once_no_disconnect(mqtt_chain):
    nodes, h1, h4 = mqtt_chain
    assert_300_once_unseen(*_300_across_an_outage(nodes, h4, "orders", seconds=40))


# tests/test_chaos.py kills the near gateway (and the far one, and dtnds) under QoS 1 and 2
# traffic in make test; this one runs with C2DTN_ALL_AGENT_TESTS=1, for the suite's time
@pytest.mark.skipif(
    os.environ.get("C2DTN_ALL_AGENT_TESTS") != "1",
    reason="covered by tests/test_chaos.py in make test (the suite's 35 minutes); C2DTN_ALL_AGENT_TESTS=1 runs it",
)
def test_near_gateway_sigkilled_mid_outage_and_restarted_still_all_300_once(mqtt_chain):
    nodes, h1, h4 = mqtt_chain

    def kill_and_restart():
        time.sleep(20)
        nodes.kill("gw1")  # gateway, overlay and its dtnd: SIGKILL, as a power cut
        time.sleep(10)
        nodes.start("gw1")

    p, ids = _300_across_an_outage(nodes, h4, "restart", kill_and_restart, seconds=40)
    # the client's TCP connection ended at the dead gateway: it reconnects (to the restarted
    # gateway, still during the outage) and resends what was not yet acknowledged
    assert p["acked"] == 300
    assert len(ids) == len(set(ids)), "a message arrived twice"
    assert sorted(ids) == list(range(300)), f"missing {sorted(set(range(300)) - set(ids))[:10]}"


def _connect_from_h1(h4: str, port: int, timeout: float) -> str:
    """What a TCP connect from h1 to h4:port comes to: "connected", "refused" or "timeout"."""
    s = netns.socket_in("c2-h1", socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((h4, port))
        return "connected"
    except ConnectionRefusedError:
        return "refused"
    except (socket.timeout, TimeoutError):
        return "timeout"
    finally:
        s.close()


def test_while_the_near_gateway_is_dead_clients_do_not_reach_the_far_broker_past_custody(mqtt_chain):
    """A client reconnecting while gw1's gateway is down must not get through to h4's broker
    directly: its messages would cross without custody, and under the client id gw4 uses for
    it at that broker (which takes the session over from gw4).  nftables' tproxy passes a
    packet on when no transparent socket listens; the rules must stop it instead."""
    nodes, h1, h4 = mqtt_chain
    assert _connect_from_h1(h4, 1883, 5) == "connected"  # intercepted: gw1 answers
    nodes.kill("gw1")
    try:
        assert _connect_from_h1(h4, 1883, 3) != "connected", "the client reached h4's broker past the dead gateway"
    finally:
        nodes.start("gw1")
    assert _connect_from_h1(h4, 1883, 5) == "connected"


def test_near_subscriber_gets_far_publications_across_an_outage(mqtt_chain):
    nodes, h1, h4 = mqtt_chain
    sub = client(
        "h1",
        "sub",
        "--host",
        h4,
        "--topic",
        "c2/news/#",
        "--qos",
        "1",
        "--count",
        "20",
        "--timeout",
        "240",
        "--client-id",
        "c2nearsub",
    )
    subscribed(sub)  # answered by gw1 at once
    far_subscribed(nodes, "c2nearsub", "c2/news/#")

    def publish_at_far_broker():
        time.sleep(2)
        p = lines(
            client(
                "h4",
                "pub",
                "--host",
                "127.0.0.1",
                "--topic",
                "c2/news/{n}",
                "--qos",
                "1",
                "--count",
                "20",
                "--client-id",
                "c2farpub",
            ),
            60,
        )[-1]
        assert p["acked"] == 20

    outage(30, publish_at_far_broker)
    rows = lines(sub, 300)
    ids = ids_of(rows)
    assert sorted(ids) == list(range(20)), f"near subscriber got {ids}; {_custody_state(nodes)}"
    assert rows[-1]["disconnects"] == [], "the near subscriber saw the outage"


def test_what_crosses_the_radio_link_holds_no_message_in_the_clear(mqtt_chain, tmp_path):
    """A capture (tcpdump in the r2-r3 link's emulator namespace) while an order of 400 random
    bytes (compression cannot hide them) goes from h1 to h4's broker through the gateways: the
    order arrives, and no 16 bytes of it are on the air (envelopes are encrypted)."""
    nodes, h1, h4 = mqtt_chain
    st = testbed.read_state()
    (link,) = [ln for ln in st["links"].values() if {ln["a"], ln["b"]} == {"r2", "r3"}]
    pcap, order = tmp_path / "radio.pcap", tmp_path / "order.bin"
    secret = os.urandom(400)
    order.write_bytes(secret)
    cap = subprocess.Popen(
        ["ip", "netns", "exec", link["netns"], "tcpdump", "-i", "any", "-U", "-s", "0", "-w", str(pcap)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1)
        sub = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                "c2-h4",
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-t",
                "c2/capture",
                "-q",
                "1",
                "-C",
                "1",
                "-W",
                "150",
            ],
            stdout=subprocess.PIPE,
        )
        time.sleep(1)
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                "c2-h1",
                "mosquitto_pub",
                "-h",
                h4,
                "-t",
                "c2/capture",
                "-q",
                "1",
                "-i",
                "c2pub-capture",
                "-f",
                str(order),
            ],
            check=True,
            timeout=60,
        )
        got = sub.communicate(timeout=180)[0]
    finally:
        cap.terminate()
        cap.wait(10)
    assert got[:-1] == secret, _custody_state(nodes)  # mosquitto_sub ends the payload with a newline
    air = pcap.read_bytes()
    assert b"gw4" in air and len(air) > len(secret), "the capture did not see the overlay's bundles"
    leaked = [i for i in range(0, len(secret) - 16) if secret[i : i + 16] in air]
    assert leaked == [], f"{len(leaked)} 16-byte pieces of the order on the air"


def test_retained_will_qos2_and_v5_properties_arrive_intact_allow_list_holds(mqtt_chain):
    nodes, h1, h4 = mqtt_chain
    props = {
        "user_property": [["unit", "NOR-UNIT001"], ["cls", "R"]],
        "content_type": "application/geo+json",
        "response_topic": "c2/replies/alpha",
        "message_expiry_interval": 600,
    }
    # three messages are due (the QoS 2 one, c2/alive, the will); chat/secret, published before
    # the last two, would be among them if it crossed
    watch = client(
        "h4",
        "sub",
        "--host",
        "127.0.0.1",
        "--topic",
        "#",
        "--qos",
        "2",
        "--count",
        "3",
        "--timeout",
        "90",
        "--version",
        "5",
        "--client-id",
        "c2watch",
    )
    subscribed(watch)
    # QoS 2, retained, with properties; and one topic that is not on the allow-list
    p = lines(
        client(
            "h1",
            "pub",
            "--host",
            h4,
            "--topic",
            "c2/status/alpha",
            "--qos",
            "2",
            "--count",
            "1",
            "--retain",
            "--version",
            "5",
            "--props",
            json.dumps(props),
            "--client-id",
            "c2qos2",
        ),
        120,
    )[-1]
    assert p["acked"] == 1
    p = lines(
        client(
            "h1", "pub", "--host", h4, "--topic", "chat/secret", "--qos", "1", "--count", "3", "--client-id", "c2chat"
        ),
        60,
    )[-1]
    assert p["acked"] == 3  # answered locally: the client cannot tell
    # a will: the client ends without DISCONNECT
    p = lines(
        client(
            "h1",
            "pub",
            "--host",
            h4,
            "--topic",
            "c2/alive/bravo",
            "--qos",
            "1",
            "--count",
            "1",
            "--version",
            "5",
            "--will-topic",
            "c2/will/bravo",
            "--will-payload",
            "bravo lost",
            "--client-id",
            "c2mortal",
            "--die",
        ),
        60,
    )[-1]
    assert p["acked"] == 1
    got = lines(watch, 120)
    by_topic = {r["topic"]: r for r in got if "topic" in r}
    st = by_topic.get("c2/status/alpha")
    assert st, f"the QoS 2 message never arrived: {got}"
    assert st["qos"] == 2 and st["retain"] is False  # a live subscriber gets it unflagged
    assert st["props"]["user_property"] == props["user_property"]
    assert st["props"]["content_type"] == props["content_type"]
    assert st["props"]["response_topic"] == props["response_topic"]
    assert 500 < st["props"]["message_expiry_interval"] <= 600
    assert by_topic.get("c2/will/bravo", {}).get("payload") == "bravo lost", "the will was not published"
    assert not any(t.startswith("chat/") for t in by_topic), "a topic off the allow-list crossed the link"
    # a late subscriber at the far broker gets the retained message, flagged as retained
    late = lines(
        client(
            "h4",
            "sub",
            "--host",
            "127.0.0.1",
            "--topic",
            "c2/status/#",
            "--qos",
            "1",
            "--count",
            "1",
            "--timeout",
            "20",
            "--version",
            "5",
            "--client-id",
            "c2late",
        ),
        60,
    )
    ret = [r for r in late if "topic" in r]
    assert ret and ret[0]["retain"] is True and ret[0]["payload"].startswith("0 ")
    assert nodes.status("gw1")["mqtt"]["counters"]["held_local"] >= 3
    assert nodes.status("gw4")["mqtt"]["counters"].get("bad_bodies", 0) == 0


def test_clients_log_in_with_the_brokers_password_file_and_acl(mqtt_chain):
    """gw1's password_file is one mosquitto_passwd wrote; a wrong password and a topic the ACL
    denies get the protocol's own codes, and alice's allowed order reaches h4's broker."""
    nodes, h1, h4 = mqtt_chain

    def login(user, password, version):
        s = netns.socket_in("c2-h1", socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect((h4, 1883))
        s.sendall(
            m.encode(m.Connect(f"c2auth{time.monotonic_ns()}", True, 60, user, password, None, version, {}), version)
        )
        return s, m.Parser(version=version).feed(s.recv(4096))[0].reason

    assert login("alice", b"wrong", 5)[1] == 0x86 and login("alice", b"wrong", 4)[1] == 4
    s, reason = login("alice", b"s3cret", 5)
    assert reason == 0
    s.sendall(
        m.encode(m.Publish("c2/bob/orders", b"not hers", 1, packet_id=1), 5)
        + m.encode(m.Subscribe(2, [m.SubOption("c2/bob/#", 1)]), 5)
    )
    got = []
    while len(got) < 2:
        got += m.Parser(version=5).feed(s.recv(4096))
    assert {type(p).__name__: p for p in got}["PubAck"].reason == 0x87
    assert {type(p).__name__: p for p in got}["SubAck"].reasons == [0x87]
    s.close()
    sub = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            "c2-h4",
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-t",
            "c2/alice/#",
            "-q",
            "1",
            "-C",
            "1",
            "-W",
            "120",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            "c2-h1",
            "mosquitto_pub",
            "-h",
            h4,
            "-t",
            "c2/alice/orders",
            "-q",
            "1",
            "-u",
            "alice",
            "-P",
            "s3cret",
            "-m",
            "hold at phase line red",
        ],
        check=True,
        timeout=60,
    )
    assert sub.communicate(timeout=150)[0].strip() == "hold at phase line red", _custody_state(nodes)
    assert nodes.status("gw1")["mqtt"]["counters"]["logins_refused"] >= 2


def _raw(h4: str, version: int = 5) -> socket.socket:
    s = netns.socket_in("c2-h1", socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect((h4, 1883))
    s.sendall(m.encode(m.Connect(f"c2raw{time.monotonic_ns()}", True, 60, None, None, None, version, {}), version))
    ack = m.Parser(version=version).feed(s.recv(4096))
    assert isinstance(ack[0], m.ConnAck) and ack[0].reason == 0
    return s


def _answer(s: socket.socket, version: int = 5) -> tuple[list[m.Packet], bool]:
    """What the gateway sends before closing, and whether it closed."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return m.Parser(version=version).feed(data), True
        if not chunk:
            return m.Parser(version=version).feed(data), True
        data += chunk


@pytest.mark.parametrize(
    "bad,reason",
    [
        (b"\x30\xff\xff\xff\xff\x01", m.Reason.MALFORMED_PACKET),  # remaining length of 5 bytes
        (b"\x30\x06\x00\x03a\xffb\x00", m.Reason.MALFORMED_PACKET),  # topic that is not UTF-8
        (m.encode(m.Publish("c2/+/x", b"x"), 5), m.Reason.TOPIC_NAME_INVALID),  # wildcard in a PUBLISH topic
        (m.encode(m.Publish("c2/a", b"x", properties={"topic_alias": 0}), 5), m.Reason.TOPIC_ALIAS_INVALID),
        # oversize: its fixed header is enough to refuse it (the rest would only be read to be thrown away)
        (m.encode(m.Publish("c2/big", b"x" * (MAX_PACKET + 10)), 5)[:100], m.Reason.PACKET_TOO_LARGE),
    ],
    ids=["bad-remaining-length", "topic-not-utf8", "wildcard-in-publish", "topic-alias-0", "oversize"],
)
def test_malformed_mqtt_closes_only_that_client_with_the_right_reason(mqtt_chain, bad, reason):
    nodes, h1, h4 = mqtt_chain
    tag = f"ok{int(reason)}"
    sub = client(
        "h4",
        "sub",
        "--host",
        "127.0.0.1",
        "--topic",
        f"c2/{tag}/#",
        "--qos",
        "1",
        "--count",
        "20",
        "--timeout",
        "120",
        "--client-id",
        f"c2sub-{tag}",
    )
    subscribed(sub)
    good = client(
        "h1",
        "pub",
        "--host",
        h4,
        "--topic",
        f"c2/{tag}/{{n}}",
        "--qos",
        "1",
        "--count",
        "20",
        "--interval",
        "0.1",
        "--client-id",
        f"c2pub-{tag}",
    )
    errors_before = nodes.status("gw1")["mqtt"]["counters"].get("protocol_errors", 0)
    s = _raw(h4)
    time.sleep(0.5)
    s.sendall(bad)
    pkts, closed = _answer(s)
    s.close()
    assert closed and pkts and isinstance(pkts[-1], m.Disconnect), f"got {pkts}"
    assert pkts[-1].reason == reason, f"DISCONNECT reason 0x{pkts[-1].reason:02x}, expected 0x{reason:02x}"
    p = lines(good, 120)[-1]
    assert p["acked"] == 20 and p["disconnects"] == [], "another client suffered"
    assert sorted(ids_of(lines(sub, 120))) == list(range(20))
    assert nodes.status("gw1")["mqtt"]["counters"]["protocol_errors"] == errors_before + 1


def test_mqtt_311_client_with_bad_packet_is_closed(mqtt_chain):
    nodes, h1, h4 = mqtt_chain
    s = _raw(h4, version=4)
    s.sendall(b"\x30\xff\xff\xff\xff\x01")
    pkts, closed = _answer(s, version=4)
    assert closed and pkts == []  # 3.1.1 has no DISCONNECT from the server: the connection just ends


def test_bridge_mode_carries_configured_topics_both_ways_without_loops(mqtt_chain):
    nodes, h1, h4 = mqtt_chain
    east_watch = client(
        "h4",
        "sub",
        "--host",
        "127.0.0.1",
        "--topic",
        "nat/#",
        "--qos",
        "1",
        "--count",
        "40",
        "--timeout",
        "150",
        "--client-id",
        "c2east",
    )
    west_watch = client(
        "h1",
        "sub",
        "--host",
        "127.0.0.1",
        "--topic",
        "nat/#",
        "--qos",
        "1",
        "--count",
        "40",
        "--timeout",
        "150",
        "--client-id",
        "c2west",
    )
    subscribed(east_watch)
    subscribed(west_watch)
    # each side publishes to its own broker only
    pw = client(
        "h1",
        "pub",
        "--host",
        "127.0.0.1",
        "--topic",
        "nat/west/{n}",
        "--qos",
        "1",
        "--count",
        "20",
        "--interval",
        "0.2",
        "--client-id",
        "c2pw",
    )
    pe = client(
        "h4",
        "pub",
        "--host",
        "127.0.0.1",
        "--topic",
        "nat/east/{n}",
        "--qos",
        "1",
        "--count",
        "20",
        "--interval",
        "0.2",
        "--client-id",
        "c2pe",
    )
    assert lines(pw, 60)[-1]["acked"] == 20 and lines(pe, 60)[-1]["acked"] == 20
    for rows in (lines(east_watch, 200), lines(west_watch, 200)):
        got = [(r["topic"].split("/")[1], int(r["payload"].split()[0])) for r in rows if "topic" in r]
        assert sorted(got) == sorted([("east", i) for i in range(20)] + [("west", i) for i in range(20)]), (
            f"each broker should see both sides' 20 once, got {len(got)}: {got[:50]}"
        )
    c1 = nodes.status("gw1")["mqtt"]["counters"]
    assert c1["bridged_out"] == 20 and c1["bridged_in"] == 20


def test_explicit_listener_clients_pointed_at_the_gateway_reach_the_far_broker(mqtt_chain):
    nodes, h1, h4 = mqtt_chain
    gw1 = testbed.node_address(testbed.read_state(), "gw1")
    sub = client(
        "h4",
        "sub",
        "--host",
        "127.0.0.1",
        "--topic",
        "c2/explicit/#",
        "--qos",
        "1",
        "--count",
        "10",
        "--timeout",
        "120",
        "--client-id",
        "c2sub-explicit",
    )
    subscribed(sub)
    p = lines(
        client(
            "h1",
            "pub",
            "--host",
            gw1,
            "--port",
            str(EXPLICIT_PORT),
            "--topic",
            "c2/explicit/{n}",
            "--qos",
            "1",
            "--count",
            "10",
            "--client-id",
            "c2pub-explicit",
        ),
        60,
    )[-1]
    assert p["acked"] == 10 and p["disconnects"] == []
    assert sorted(ids_of(lines(sub, 150))) == list(range(10))


def _read_packets(s: socket.socket, parser: m.Parser, want: int, timeout: float) -> list[m.Packet]:
    """Packets from the gateway until `want` of them came or `timeout` passed."""
    got: list[m.Packet] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = s.recv(65536)
        except (TimeoutError, socket.timeout):
            break
        if not data:
            break
        got += parser.feed(data)
    return got


def test_mqtt5_limits_and_session_expiry_of_a_client_hold_across_the_link(mqtt_chain):
    """An MQTT 5 client behind gw1 (raw, so every packet is seen): its subscription id comes
    back on publications from h4's broker, a publication over its Maximum Packet Size is
    dropped for it, its Receive Maximum of 1 holds the next publication until it acks, and
    after its connection breaks it gets its session back (Session Present) within the
    Session Expiry Interval."""
    nodes, h1, h4 = mqtt_chain
    cid = "c2v5limits"
    props = {"session_expiry_interval": 300, "receive_maximum": 1, "maximum_packet_size": 300}

    def connect(clean: bool) -> tuple[socket.socket, m.Parser, m.ConnAck]:
        s = netns.socket_in("c2-h1", socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect((h4, 1883))
        s.sendall(m.encode(m.Connect(cid, clean, 60, version=5, properties=props), 5))
        parser = m.Parser(version=5)
        (ack,) = _read_packets(s, parser, 1, 20)
        return s, parser, ack

    s, parser, ack = connect(clean=True)
    assert ack.reason == 0 and ack.session_present is False
    assert ack.properties["topic_alias_maximum"] >= 1
    s.sendall(m.encode(m.Subscribe(1, [m.SubOption("c2/v5live/#", 1)], {"subscription_identifier": [42]}), 5))
    assert _read_packets(s, parser, 1, 20) == [m.SubAck(1, [1])]
    far_subscribed(nodes, cid, "c2/v5live/#")
    before = nodes.status("gw1")["inbox"]  # what gw1 already keeps for clients that are away
    for topic, size in (("c2/v5live/first", 20), ("c2/v5live/big", 600), ("c2/v5live/second", 20)):
        p = lines(
            client(
                "h4",
                "pub",
                "--host",
                "127.0.0.1",
                "--topic",
                topic,
                "--qos",
                "1",
                "--count",
                "1",
                "--size",
                str(size),
                "--client-id",
                f"c2pub-{topic.rsplit('/', 1)[1]}",
            ),
            60,
        )[-1]
        assert p["acked"] == 1
    (first,) = _read_packets(s, parser, 1, 120)
    assert first.topic == "c2/v5live/first" and first.properties["subscription_identifier"] == [42]
    # Receive Maximum 1: nothing more while the first is unacknowledged, though the other two
    # have crossed (they wait in gw1's inbox, in custody)
    deadline = time.monotonic() + 120
    while nodes.status("gw1")["inbox"] < before + 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert nodes.status("gw1")["inbox"] >= before + 3, "the other publications never reached gw1"
    assert _read_packets(s, parser, 1, 2) == []
    s.sendall(m.encode(m.PubAck(first.packet_id), 5))
    (second,) = _read_packets(s, parser, 1, 60)
    assert second.topic == "c2/v5live/second", "the publication over the client's maximum packet size came"
    s.sendall(m.encode(m.PubAck(second.packet_id), 5))
    assert _read_packets(s, parser, 1, 3) == []  # ... and the big one never does
    assert nodes.status("gw1")["mqtt"]["counters"]["too_large_for_client"] >= 1
    s.close()  # no DISCONNECT: the session outlives the connection by 300 s
    time.sleep(1)
    s, parser, ack = connect(clean=False)
    try:
        assert ack.reason == 0 and ack.session_present is True
    finally:
        s.sendall(m.encode(m.Disconnect(0, {"session_expiry_interval": 0}), 5))
        s.close()


def test_a_client_silent_past_its_keep_alive_is_closed_by_the_gateway(mqtt_chain):
    """The near gateway's timer (not the client, not the far side) ends a connection that
    stays silent for 1.5 x its keep alive: MQTT 5 hears DISCONNECT 0x8D."""
    nodes, h1, h4 = mqtt_chain
    s = netns.socket_in("c2-h1", socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect((h4, 1883))
    s.sendall(m.encode(m.Connect("c2silent", True, 2, version=5), 5))
    parser = m.Parser(version=5)
    (ack,) = _read_packets(s, parser, 1, 20)
    assert ack.reason == 0
    t0 = time.monotonic()
    pkts, closed = _answer(s)
    s.close()
    assert closed and pkts == [m.Disconnect(m.Reason.KEEP_ALIVE_TIMEOUT)]
    assert 2.5 <= time.monotonic() - t0 <= 6, f"closed after {time.monotonic() - t0:.1f} s"
