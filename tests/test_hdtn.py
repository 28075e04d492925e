"""The HDTN driver's cores without HDTN: BPv7 bundles, a TCPCLv4 session against a peer built
from RFC 9174's formats (virtual time), and the node's hdtn.json and contact plan."""

from __future__ import annotations

import json
import struct

import cbor2
import crc32c
import pytest
from test_agents import _node

from c2dtn.cla_adapters import bpv7, tcpcl4
from c2dtn.errors import ConfigError
from c2dtn.overlay.agents import make_agent
from c2dtn.overlay.agents.hdtn import app_number, derived_number, hdtn_files

# -- BPv7 ---------------------------------------------------------------------------------------


def test_a_bundle_encodes_with_a_primary_crc_and_decodes_to_what_went_in():
    raw = bpv7.encode((11, 1), (23, 1), b"order 7", lifetime_ms=60_000, created_ms=123_456, seq=3)
    assert raw[0] == 0x9F and raw[-1] == 0xFF  # an indefinite-length array of blocks
    b = bpv7.decode(raw)
    assert (b.src, b.dst, b.created_ms, b.seq, b.lifetime_ms, b.payload) == (
        (11, 1),
        (23, 1),
        123_456,
        3,
        60_000,
        b"order 7",
    )
    primary = cbor2.loads(raw)[0]
    assert primary[:3] == [7, bpv7.MUST_NOT_FRAGMENT, bpv7.CRC32C]
    crc = primary[-1]
    primary[-1] = b"\0\0\0\0"
    assert struct.unpack(">I", crc)[0] == crc32c.crc32c(cbor2.dumps(primary))  # RFC 9171 §4.2.1


def test_a_received_bundle_with_more_blocks_gives_its_payload():
    primary = [7, 0, 0, [2, [5, 1]], [2, [9, 1]], [2, [9, 1]], [7, 0], 3600_000]
    hop = [10, 2, 0, 0, cbor2.dumps([30, 0])]  # a hop count block ahead of the payload
    raw = b"\x9f" + cbor2.dumps(primary) + cbor2.dumps(hop) + cbor2.dumps([1, 1, 0, 0, b"x" * 300]) + b"\xff"
    b = bpv7.decode(raw)
    assert b.src == (9, 1) and b.dst == (5, 1) and b.payload == b"x" * 300


@pytest.mark.parametrize(
    "raw, says",
    [
        (b"\xff\x00", "not strict CBOR"),
        (b"\x9f" + cbor2.dumps([1, 1, 0, 0, b""]), "does not end with a break"),
        (b"\x9f\xd8\x1c\x80\xff", "tag 28"),
        (cbor2.dumps({"a": 1}), "array of blocks"),
        (cbor2.dumps([[6, 0, 0, 0, 0, 0, [0, 0], 0], [1, 1, 0, 0, b""]]), "version 6"),
        (cbor2.dumps([[7, 0, 0, [1, 0], [2, [1, 1]], [2, [1, 1]], [0, 0], 9], [1, 1, 0, 0, b""]]), "destination"),
        (cbor2.dumps([[7, 0, 0, [2, [2, 1]], [2, [1, 1]], [2, [1, 1]], [0, 0], 9], [7, 2, 0, 0, b""]]), "no payload"),
        (cbor2.dumps([[7, 0, 0, [2, [2, 1]], [2, [1, 1]], [2, [1, 1]], "now", 9], [1, 1, 0, 0, b""]]), "creation"),
    ],
)
def test_what_is_not_a_bundle_is_refused_naming_why(raw, says):
    with pytest.raises(bpv7.BundleError, match=says):
        bpv7.decode(raw)


# -- TCPCLv4 -------------------------------------------------------------------------------------


def sess_init(node: str, keepalive: int = 15, seg_mru: int = 100, xfer_mru: int = 1 << 20) -> bytes:
    n = node.encode()
    return struct.pack(">BHQQH", 7, keepalive, seg_mru, xfer_mru, len(n)) + n + struct.pack(">I", 0)


def segment(flags: int, tid: int, data: bytes) -> bytes:
    head = struct.pack(">BBQ", 1, flags, tid) + (struct.pack(">I", 0) if flags & 2 else b"")
    return head + struct.pack(">Q", len(data)) + data


def open_session(now: float = 0.0, keepalive: int = 15, seg_mru: int = 100) -> tcpcl4.Session:
    s = tcpcl4.Session("ipn:43.0", now, keepalive_s=keepalive)
    assert s.start() == b"dtn!\x04\x00"
    out, ev = s.feed(b"dtn!\x04\x00", now)
    assert out[0] == 7 and b"ipn:43.0" in out and ev == []  # our SESS_INIT once the peer's header is in
    out, ev = s.feed(sess_init("ipn:42.0", keepalive, seg_mru), now)
    assert ev == [tcpcl4.Established("ipn:42.0", keepalive, seg_mru, 1 << 20)] and s.established
    return s


def test_a_session_opens_and_a_bundle_goes_in_segments_the_peer_can_take():
    s = open_session(seg_mru=100)
    tid, data = s.send(b"b" * 250, 1.0)
    segs, at = [], 0
    while at < len(data):  # read back what a passive peer gets
        flags, t = struct.unpack_from(">BQ", data, at + 1)
        at += 10 + (4 if flags & 2 else 0)
        n = struct.unpack_from(">Q", data, at)[0]
        segs.append((flags, t, n))
        at += 8 + n
    assert segs == [(2, tid, 100), (0, tid, 100), (1, tid, 50)]  # START, middle, END
    _, ev = s.feed(struct.pack(">BBQQ", 2, 0, tid, 100), 1.1)
    assert ev == []  # a partial acknowledgement is not the transfer's
    _, ev = s.feed(struct.pack(">BBQQ", 2, 1, tid, 250), 1.2)
    assert ev == [tcpcl4.Acked(tid)]
    with pytest.raises(tcpcl4.ProtocolError, match="transfer MRU"):
        s.send(b"x" * ((1 << 20) + 1), 2.0)


def test_an_incoming_transfer_is_acked_segment_by_segment_and_delivered_once_whole_however_cut():
    s = open_session()
    wire = segment(2, 9, b"hello ") + segment(1, 9, b"world") + struct.pack(">BBQ", 3, 4, 12)
    acks, events = b"", []
    for i in range(len(wire)):  # one byte at a time
        out, ev = s.feed(wire[i : i + 1], 5.0)
        acks += out
        events += ev
    assert events == [tcpcl4.Received(b"hello world"), tcpcl4.Refused(12, 4)]
    assert acks == struct.pack(">BBQQ", 2, 2, 9, 6) + struct.pack(">BBQQ", 2, 1, 9, 11)  # cumulative lengths


def test_keepalives_go_when_idle_and_a_silent_peer_ends_the_session():
    s = open_session(now=0.0, keepalive=10)
    assert s.deadline() == 10.0 and s.tick(5.0) == b""
    assert s.tick(10.0) == b"\x04"
    s.feed(b"\x04", 12.0)  # the peer's keepalive
    assert s.tick(25.0) == b"\x04"
    with pytest.raises(tcpcl4.ProtocolError, match="no message from the peer for 21 s"):
        s.tick(33.0)


def test_the_peer_ending_or_breaking_the_session_is_told_apart():
    s = open_session()
    out, ev = s.feed(struct.pack(">BBB", 5, 0, 1), 1.0)
    assert out == struct.pack(">BBB", 5, 1, 1) and ev == [tcpcl4.Ended("the peer ended the session (reason 1)")]
    assert not s.established
    with pytest.raises(tcpcl4.ProtocolError, match="TCPCL version 3"):
        tcpcl4.Session("ipn:1.0", 0).feed(b"dtn!\x03\x00", 0)
    with pytest.raises(tcpcl4.ProtocolError, match="b'HTTP'"):
        tcpcl4.Session("ipn:1.0", 0).feed(b"HTTP/1.1 400", 0)
    with pytest.raises(tcpcl4.ProtocolError, match="without its start"):
        open_session().feed(segment(1, 4, b"tail"), 1)
    with pytest.raises(tcpcl4.ProtocolError, match="unknown message type 99"):
        open_session().feed(b"\x63", 1)


# -- the node's files -------------------------------------------------------------------------------


def test_hdtn_node_files_follow_the_node_config(tmp_path):
    cfg = _node(tmp_path, "hdtn")
    files = hdtn_files(cfg)
    conf = json.loads(files["hdtn.json"])
    me, r2, r5, gw4 = (derived_number(n) for n in ("gw1", "r2", "r5", "gw4"))
    assert all(n % 2 == 0 and 0 < n < 2**31 - 1 for n in (me, r2, r5, gw4))
    assert conf["myNodeId"] == me and conf["storageConfig"]["tryToRestoreFromDisk"]
    inducts = {(i["convergenceLayer"], i["boundPort"]) for i in conf["inductsConfig"]["inductVector"]}
    assert inducts == {("tcpcl_v4", 4560), ("tcpcl_v4", 4556), ("udp", 4556)}  # the overlay's own, then listen
    outducts = {
        (o["convergenceLayer"], o["remoteHostname"], o["remotePort"], o["nextHopNodeId"])
        for o in conf["outductsConfig"]["outductVector"]
    }
    assert outducts == {("tcpcl_v4", "10.77.1.2", 4556, r2), ("udp", "10.77.5.2", 4600, r5)}
    contacts = {(c["source"], c["dest"]) for c in json.loads(files["contacts.json"])["contacts"]}
    # to each neighbour and on to its overlay endpoint; gw4's endpoint through r2, as the route says
    assert contacts == {(me, r2), (r2, app_number(r2)), (me, r5), (r5, app_number(r5)), (r2, app_number(gw4))}
    agent = make_agent(cfg)
    assert agent.me == app_number(me) and agent.names[app_number(gw4)] == "gw4"
    # a default route: every node the config names and no route reaches, through r5
    cfg = _node(tmp_path, "hdtn", 'fob = "' + "cd" * 32 + '"\n[[agent.routes]]\nto = "*"\nvia = "r5"\n')
    contacts = {(c["source"], c["dest"]) for c in json.loads(hdtn_files(cfg)["contacts.json"])["contacts"]}
    assert (r5, app_number(derived_number("fob"))) in contacts and (r5, app_number(gw4)) not in contacts


def test_hdtn_over_ltp_gets_an_induct_per_ltp_neighbour_on_its_one_port_and_paced_outducts(tmp_path):
    from c2dtn.cla_adapters.spec import parse_cla

    cfg = _node(tmp_path, "hdtn", "[agent.hdtn]\nrates_bits = { r5 = 8640 }\n")
    cfg.listen.append(parse_cla("ltp://0.0.0.0", "t", "listen"))  # the default port: 1113
    cfg.peers[1].cla = parse_cla("ltp://10.77.5.2:1200", "t", "peer")
    conf = json.loads(hdtn_files(cfg)["hdtn.json"])
    me, r5 = derived_number("gw1"), derived_number("r5")
    ltp_in = [i for i in conf["inductsConfig"]["inductVector"] if i["convergenceLayer"] == "ltp_over_udp"]
    # one induct for r5's engine on the node's LTP port, reporting back to r5's own LTP port
    assert [
        (i["boundPort"], i["thisLtpEngineId"], i["remoteLtpEngineId"], i["ltpRemoteUdpHostname"], i["ltpRemoteUdpPort"])
        for i in ltp_in
    ] == [(1113, me, r5, "10.77.5.2", 1200)]
    out = next(o for o in conf["outductsConfig"]["outductVector"] if o["nextHopNodeId"] == r5)
    assert (out["convergenceLayer"], out["remoteHostname"], out["remotePort"]) == ("ltp_over_udp", "10.77.5.2", 1200)
    assert (out["thisLtpEngineId"], out["remoteLtpEngineId"], out["ltpSenderBoundPort"]) == (me, r5, 1113)
    assert out["ltpSenderPingSecondsOrZeroToDisable"] > 0  # a cut link is noticed, its bundles stored
    tcp = next(o for o in conf["outductsConfig"]["outductVector"] if o["nextHopNodeId"] == derived_number("r2"))
    assert tcp["convergenceLayer"] == "tcpcl_v4" and "thisLtpEngineId" not in tcp  # HDTN refuses LTP keys elsewhere
    # HDTN paces the LTP outduct by the contact's rate: r5's own, the others unlimited
    rates = {
        (c["source"], c["dest"]): c["rateBitsPerSec"] for c in json.loads(hdtn_files(cfg)["contacts.json"])["contacts"]
    }
    assert rates[(me, r5)] == 8640 and rates[(me, derived_number("r2"))] == 0
    cfg.listen.pop()  # LTP leaves from the node's own LTP port: none, refused naming the fix
    with pytest.raises(ConfigError, match="listen.*LTP port.*ltp://0.0.0.0:1113"):
        hdtn_files(cfg)
    with pytest.raises(ConfigError, match="agent.hdtn.rates_bits.*bits per second"):
        _node(tmp_path, "hdtn", '[agent.hdtn]\nrates_bits = { r2 = "fast" }\n')


def test_hdtn_refuses_settings_it_cannot_use_naming_them(tmp_path):
    with pytest.raises(ConfigError, match="agent.hdtn.numbers.*even"):
        _node(tmp_path, "hdtn", "[agent.hdtn]\nnumbers = { gw4 = 7 }\n")
    with pytest.raises(ConfigError, match="agent.hdtn.app_port"):
        _node(tmp_path, "hdtn", "[agent.hdtn]\napp_port = 70000\n")
    cfg = _node(tmp_path, "hdtn", "[agent.hdtn]\nnumbers = { gw4 = 8, r2 = 8 }\n")
    with pytest.raises(ConfigError, match="same ipn number"):
        make_agent(cfg)


def test_deliveries_reconnect_when_hdtn_died_without_ending_the_session(tmp_path):
    # HDTN SIGKILLed sends no SESS_TERM: the session still says established, the writer is closed
    import asyncio
    from types import SimpleNamespace

    agent = make_agent(_node(tmp_path, "hdtn"))
    agent._session = SimpleNamespace(established=True)
    agent._writer = SimpleNamespace(is_closing=lambda: True)
    tried = asyncio.Event()

    async def start():
        tried.set()

    agent.start = start

    async def main():
        it = agent.deliveries(agent.endpoint).__aiter__()
        task = asyncio.ensure_future(it.__anext__())
        await asyncio.wait_for(tried.wait(), 3)
        task.cancel()

    asyncio.run(main())


def test_a_new_session_waits_until_hdtn_has_let_go_of_the_last_one(tmp_path, monkeypatch):
    # HDTN 1.3.1 holds every bundle for a node whose new session opened within a second of its
    # last one ending (the old session's end removes the new one's link): the driver waits
    import asyncio
    import time

    from c2dtn.overlay.agents import hdtn

    monkeypatch.setattr(hdtn.HdtnAgent, "session_gap_s", 0.5)
    agent = make_agent(_node(tmp_path, "hdtn"))
    opened: list[float] = []
    ended: list[float] = []

    async def induct(reader, writer):  # a peer speaking RFC 9174 as HDTN's induct does
        opened.append(time.monotonic())
        await reader.readexactly(6)  # the driver's contact header
        writer.write(b"dtn!\x04\x00" + sess_init("ipn:42.0"))
        await reader.read(1024)  # its SESS_INIT
        if len(opened) == 1:  # HDTN ends the first session
            writer.close()
            ended.append(time.monotonic())
        else:
            await reader.read(1024)

    async def main():
        server = await asyncio.start_server(induct, "127.0.0.1", 0)
        agent.port = server.sockets[0].getsockname()[1]
        t0 = time.monotonic()
        await agent.start()
        assert opened[0] - t0 < 0.4  # the first session waits for nothing
        for _ in range(100):
            if not agent._connected():
                break
            await asyncio.sleep(0.01)
        await agent.start()
        assert agent._connected()
        await agent.stop()
        server.close()

    asyncio.run(main())
    assert len(opened) == 2 and opened[1] - ended[0] >= 0.45


def test_the_benchmarks_next_client_of_an_hdtn_node_waits_longer_than_the_driver_would():
    # a benchmark client is a process of its own: it cannot see when the last one's session
    # ended, so the benchmark waits the driver's gap and more; other agents need no wait
    from c2dtn.overlay.agents import hdtn
    from c2dtn.perf.bare_client import client_gap

    assert client_gap("hdtn") > hdtn.HdtnAgent.session_gap_s >= 1.0
    assert client_gap("dtn7") == client_gap("ion") == client_gap("ibrdtn") == 0.0


def test_hdtn_sessions_between_nodes_outlive_a_silent_cut_and_the_setting_is_checked(tmp_path):
    # HDTN 1.3.1 releases nothing for a next hop whose session a silent cut ended (hdtn.py,
    # Keepalive): between HDTN nodes the keepalive is minutes; the overlay's own session 15 s
    conf = json.loads(hdtn_files(_node(tmp_path, "hdtn"))["hdtn.json"])
    keepalives = {
        i["boundPort"]: i["keepAliveIntervalSeconds"]
        for i in conf["inductsConfig"]["inductVector"]
        if i["convergenceLayer"] == "tcpcl_v4"
    }
    assert keepalives == {4560: 15, 4556: 600}
    assert [
        o["keepAliveIntervalSeconds"]
        for o in conf["outductsConfig"]["outductVector"]
        if o["convergenceLayer"] == "tcpcl_v4"
    ] == [600]
    conf = json.loads(hdtn_files(_node(tmp_path, "hdtn", "[agent.hdtn]\nkeepalive_s = 3600\n"))["hdtn.json"])
    assert {o["keepAliveIntervalSeconds"] for o in conf["outductsConfig"]["outductVector"] if "tryUseTls" in o} == {
        3600
    }
    with pytest.raises(ConfigError, match="agent.hdtn.keepalive_s.*70000"):
        _node(tmp_path, "hdtn", "[agent.hdtn]\nkeepalive_s = 70000\n")
