"""udphc: bundles over UDP with their blocks compressed on the air (cla-adapters/udphc.py, the
codec; overlay/hclink.py, the sockets around an agent)."""

from __future__ import annotations

import asyncio
import socket
import struct

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c2dtn.cla_adapters import bpv7, udphc
from c2dtn.errors import ConfigError
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.hclink import HcLink, agent_port

NOW = 849_333_979_410  # DTN ms, a day of 2026
DAY = 86_400_000


def with_previous(bundle: bytes, node: int, number: int = 2) -> bytes:
    """The bundle as dtnd forwards it: a previous node block before the payload block."""
    blocks = cbor2.loads(bundle)
    prev = [6, number, 0, 0, cbor2.dumps([2, [node, 0]])]
    return b"\x9f" + b"".join(cbor2.dumps(b) for b in [blocks[0], prev, *blocks[1:]]) + b"\xff"


def dtn7_bundle(payload: bytes = b"x" * 100, created: int = NOW, seq: int = 0, life: int = 3_600_000) -> bytes:
    return with_previous(bpv7.encode_sent("ipn:2.1", "ipn:4.1", payload, life, created, seq), 2)


def test_a_forwarded_dtn7_bundle_loses_most_of_its_blocks_and_comes_back_byte_for_byte():
    b = dtn7_bundle()
    f = udphc.encode(b)
    assert udphc.decode(f) == b
    # 56 bytes around the payload (primary block 36, previous node block 11, the payload
    # block's head 7, the array's 2) go as 21
    assert (len(b) - 100, len(f) - 100) == (56, 21)
    assert udphc.header_bytes(f) == len(f) - 100


@settings(max_examples=300, deadline=None)
@given(
    payload=st.binary(max_size=1500),
    created=st.one_of(st.integers(1, 2**40), st.integers(2**48 - 2, 2**64 - 1)),
    seq=st.integers(0, 2**64 - 1),
    life=st.integers(0, 2**64 - 1),
    nodes=st.tuples(*[st.integers(0, 10**19 - 1)] * 4),  # (encode_sent reads up to 19 digits)
    prev=st.one_of(st.none(), st.tuples(st.integers(2, 2**64 - 1), st.integers(0, 2**64 - 1))),
    crc32=st.booleans(),
)
def test_any_bundle_of_the_shape_round_trips(payload, created, seq, life, nodes, prev, crc32):
    src, dst = f"ipn:{nodes[0]}.{nodes[1]}", f"ipn:{nodes[2]}.{nodes[3]}"
    if crc32:  # the CRC-32C form, with a report-to endpoint
        b = bpv7.encode((nodes[0], nodes[1]), (nodes[2], nodes[3]), payload, life, created, seq)
    else:
        b = bpv7.encode_sent(src, dst, payload, life, created, seq)
    if prev is not None:
        b = with_previous(b, prev[1], prev[0])
    f = udphc.encode(b)
    assert f[0] == udphc.MARK and len(f) < len(b)
    assert udphc.decode(f) == b


@pytest.mark.parametrize(
    "what,bundle",
    [
        ("BPv6", b"\x06\x10" + bytes(40)),
        ("dtn-scheme endpoints", bpv7.encode_sent("dtn://a/x", "dtn://b/y", b"p", 1000, NOW, 1)),
        (
            "a hop count block",
            b"\x9f"
            + cbor2.dumps(cbor2.loads(bpv7.encode_sent("ipn:1.1", "ipn:2.1", b"p", 1000, NOW, 1))[0])
            + cbor2.dumps([10, 2, 0, 0, cbor2.dumps([30, 0])])
            + cbor2.dumps([1, 1, 0, 0, b"p"])
            + b"\xff",
        ),
        ("a lifetime not in its shortest CBOR form", None),
        ("no CRC on the primary block", None),
        ("empty", b""),
    ],
)
def test_a_datagram_of_another_shape_goes_uncompressed_and_is_handed_on_as_it_came(what, bundle):
    if what == "a lifetime not in its shortest CBOR form":
        b = bpv7.encode_sent("ipn:1.1", "ipn:2.1", b"p", 1000, NOW, 1)
        i = b.index(cbor2.dumps(1000))
        bundle = b[:i] + b"\x1a" + struct.pack(">I", 1000) + b[i + 3 :]
    if what == "no CRC on the primary block":
        p = [7, 4, 0, [2, [1, 1]], [2, [2, 1]], [1, 0], [NOW, 1], 1000]
        bundle = b"\x9f" + cbor2.dumps(p) + cbor2.dumps([1, 1, 0, 0, b"p"]) + b"\xff"
    assert udphc.encode(bundle) == bundle
    assert udphc.decode(bundle) == bundle


def test_a_bundle_to_a_group_compresses_its_blocks_and_keeps_the_group_name():
    """fmn-4nations' reports go to dtn://fmn/~c2dtn from ipn sources: the name stays (12 bytes
    and its length), the rest of the blocks go as for a pair: 34 bytes fewer."""
    b = with_previous(bpv7.encode_sent("ipn:1.1", "dtn://fmn/~c2dtn", b"r" * 200, 3_600_000, NOW, 0), 4)
    f = udphc.encode(b)
    assert f[1] & udphc.DST_DTN and udphc.decode(f) == b
    assert len(b) - len(f) == 34, len(b) - len(f)
    bad = f.replace(b"//fmn/~c2dtn", b"//fmn/\xff\xfec2dtn"[:12])
    with pytest.raises(udphc.HcError, match="not UTF-8"):
        udphc.decode(bad)


def test_a_creation_time_of_any_age_rebuilds_without_the_clocks():
    """Six bytes hold any DTN time until the year 10900: neither end's clock is read, so a
    receiver whose clock was reset (a box's RTC back at 2000) rebuilds what it is sent."""
    for created in (NOW, NOW - 30 * DAY, 1, 2**48 - 1):
        b = dtn7_bundle(created=created)
        f = udphc.encode(b)
        assert not f[1] & udphc.TIME_FULL and udphc.decode(f) == b
    far = dtn7_bundle(created=2**48)
    f = udphc.encode(far)
    assert f[1] & udphc.TIME_FULL and udphc.decode(f) == far


def test_damaged_or_hostile_frames_are_refused_by_name():
    b = dtn7_bundle()
    f = udphc.encode(b)
    head = udphc.header_bytes(f)
    for cut in range(1, head):
        with pytest.raises(udphc.HcError, match="frame ends|CRC"):
            udphc.decode(f[:cut])
    # a flipped bit in any of the primary block's fields (bytes 2-16 here) is refused by its
    # CRC; the previous node block and the payload have no CRC, as on plain UDP (the seal inside
    # the payload is the overlay's check)
    for i in range(2, 17):
        with pytest.raises(udphc.HcError):
            udphc.decode(f[:i] + bytes([f[i] ^ 0x01]) + f[i + 1 :])
    with pytest.raises(udphc.HcError, match="bits this codec does not know"):
        udphc.decode(bytes([udphc.MARK, 0x80]) + f[2:])
    with pytest.raises(udphc.HcError, match="shortest"):
        udphc.decode(bytes([udphc.MARK, 0, 0x81, 0x00]) + f[3:])  # flags padded to 2 bytes
    with pytest.raises(udphc.HcError, match="past 10 bytes"):
        udphc.decode(bytes([udphc.MARK, 0]) + b"\xff" * 11)


def test_a_rebuilt_bundle_is_at_most_90_bytes_longer_than_its_frame():
    """The widest growth: every integer at 2^32 (5 LEB128 bytes, 9 of CBOR), a lifetime whose ms
    pass 2^32, every optional part there."""
    v = 1 << 32
    b = bpv7.encode((v, v), (v, v), b"p" * 300, 4_294_968_000, v, v)  # report-to, CRC-32C
    b = with_previous(b, v, v)
    blocks = cbor2.loads(b)
    blocks[0][1] = v  # processing flags too (the CRC made again)
    blocks[0][8] = b"\0\0\0\0"
    blank = cbor2.dumps(blocks[0])
    blocks[0][8] = udphc._crc(blank[:-4], 2)
    b = b"\x9f" + b"".join(cbor2.dumps(x) for x in blocks) + b"\xff"
    f = udphc.encode(b)
    assert f[0] == udphc.MARK and udphc.decode(f) == b
    assert 70 <= len(b) - len(f) <= 90, len(b) - len(f)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_from_the_radio_give_a_bundle_or_an_hc_error(junk):
    frame = bytes([udphc.MARK]) + junk
    try:
        out = udphc.decode(frame)
    except udphc.HcError:
        return
    assert out[:1] == b"\x9f" and len(out) <= len(frame) + 90


def write_cfg(tmp_path, name, listen, peers):
    p = tmp_path / f"{name}.toml"
    peer_tables = "".join(f'[[agent.peers]]\nnode = "{n}"\ncla = "{c}"\n' for n, c in peers)
    p.write_text(
        f'[node]\nid = "{name}"\nstorage = "{tmp_path / name}"\noverlay = false\n'
        f'[agent]\nkind = "dtn7"\nlisten = {listen!r}\n'.replace("'", '"')
        + peer_tables
    )
    return load_node_config(p)


def test_a_node_with_udphc_gives_its_agent_loopback_udp_and_refuses_a_peer_without_a_radio_socket(tmp_path):
    cfg = write_cfg(tmp_path, "a", ["udphc://127.0.0.1:0", "tcpcl://0.0.0.0:4556"], [("b", "udphc://127.0.0.1:4999")])
    link = HcLink(cfg)
    try:
        got = link.agent_cfg
        assert [str(s) for s in got.listen][0] == "tcpcl://0.0.0.0:4556"
        assert got.listen[1].scheme == "udp" and got.listen[1].host == "127.0.0.1"
        assert got.peers[0].node == "b" and got.peers[0].cla.scheme == "udp" and got.peers[0].cla.host == "127.0.0.1"
        assert cfg.listen[0].scheme == "udphc"  # the node's own view is unchanged
    finally:
        link.close_sockets()
    with pytest.raises(ConfigError) as e:  # refused when the config is read (node check too)
        write_cfg(tmp_path, "c", ["udp://0.0.0.0:4556"], [("b", "udphc://127.0.0.1:4999")])
    assert (e.value.field, e.value.value) == ("agent.peers[0].cla", "udphc://127.0.0.1:4999")
    assert "needs a udphc:// spec in [agent] listen" in str(e.value)


def test_two_links_carry_a_bundle_compressed_and_a_hostile_frame_stops_neither(tmp_path):
    """Two nodes' links on loopback: what a's agent sends to b arrives at b's agent as it was
    sent, the radio carried fewer bytes, and junk sent to b's radio socket is counted, not fatal."""

    def free_port() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    pa, pb = free_port(), free_port()
    a = HcLink(write_cfg(tmp_path, "a", [f"udphc://127.0.0.1:{pa}"], [("b", f"udphc://127.0.0.1:{pb}")]))
    b = HcLink(write_cfg(tmp_path, "b", [f"udphc://127.0.0.1:{pb}"], [("a", f"udphc://127.0.0.1:{pa}")]))
    agent_b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent_b.bind(("127.0.0.1", b.agent_port))  # b's agent listens where its config says
    agent_b.settimeout(5)
    bundle = with_previous(bpv7.encode_sent("ipn:1.1", "ipn:2.1", b"report", 3_600_000, NOW, 7), 1)

    async def main() -> bytes:
        await a.start()
        await b.start()
        try:
            junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            junk.sendto(bytes([udphc.MARK, 0x13, 0x80]), ("127.0.0.1", pb))  # ends inside a number
            junk.close()
            to_b = a.agent_cfg.peers[0].cla  # where a's agent sends b's bundles
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as agent_a:
                agent_a.sendto(bundle, (to_b.host, to_b.port))
            loop = asyncio.get_running_loop()
            return await asyncio.wait_for(loop.run_in_executor(None, agent_b.recv, 65536), 5)
        finally:
            await a.stop()
            await b.stop()
            agent_b.close()

    got = asyncio.run(main())
    assert got == bundle
    assert a.counts["sent_compressed"] == 1 and a.counts["sent_bytes_saved"] >= 30
    assert b.counts["refused"] == 1 and b.counts["received"] == 1


def test_an_agent_whose_driver_does_not_declare_udphc_is_refused_by_name(tmp_path):
    """IBR-DTN binds its UDP on the namespace's interfaces, never on loopback: behind the link
    it would receive nothing, so the node refuses the config rather than run it."""
    p = tmp_path / "i.toml"
    p.write_text(
        f'[node]\nid = "i"\nstorage = "{tmp_path / "i"}"\n[agent]\nkind = "ibrdtn"\nlisten = ["udphc://0.0.0.0"]\n'
    )
    with pytest.raises(ConfigError) as e:
        load_node_config(p)
    assert (e.value.field, e.value.value) == ("agent.listen[0]", "udphc")
    assert "only in front of an agent whose UDP takes bundles on loopback" in str(e.value) and "ibrdtn" in str(e.value)
    cfg = write_cfg(tmp_path, "a", ["udphc://127.0.0.1:0"], [("b", "udphc://127.0.0.1:4999")])
    cfg.agent = "ibrdtn"
    with pytest.raises(ConfigError, match="only in front of an agent whose UDP takes bundles on loopback .*ibrdtn"):
        HcLink(cfg)


def test_the_testbed_gives_udphc_to_agents_that_take_it_and_udp_to_the_others(tmp_path):
    from c2dtn.topologies import model, testbed
    from c2dtn.topologies.node_configs import write_configs

    st = testbed.state_of(model.load("nps-chain"), "userspace")
    nodes = ["gw1", "r2", "r3", "gw4"]
    for agent, scheme in (("dtn7", "udphc"), ("ibrdtn", "udp")):
        paths = write_configs(st, nodes, ["gw1", "gw4"], tmp_path / agent, agent=agent)
        r2 = load_node_config(paths["r2"])
        assert [p.cla.scheme for p in r2.peers if p.node == "r3"] == [scheme], agent
    # --cla udp everywhere beside a udphc radio link: two listeners, two ports
    paths = write_configs(st, nodes, ["gw1", "gw4"], tmp_path / "both", cla="udp")
    r2 = load_node_config(paths["r2"])
    assert sorted(str(s) for s in r2.listen) == ["udp://0.0.0.0:4556", "udphc://0.0.0.0:4560"]


def test_the_agents_port_is_outside_the_ephemeral_range_whatever_that_range_is():
    for ephemeral in ((32768, 60999), (20000, 65535), (1024, 30000), (1024, 65535)):
        port = agent_port("gw1", ephemeral)
        lo, hi = ephemeral
        assert 1024 <= port <= 65535
        if (lo, hi) != (1024, 65535):  # a range with room beside it: never inside it
            assert not lo <= port <= hi, (ephemeral, port)
    assert agent_port("gw1", (32768, 60999)) == agent_port("gw1", (32768, 60999))  # stable while free
