"""What a coalition member or anyone with a radio can do to a node with crafted bundles: the
reviewer's attacks (security page, docs/security.md), each driven through the receiving core."""

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_groups import codec, make
from test_send_before_sync import serve_api_to

from c2dtn import strict_cbor
from c2dtn.overlay.envelope import CONTAINER_VERSION, BadTag, Codec, Envelope, Kind, Priority, encode_ack_body
from c2dtn.overlay.relay import RelayCore, Unroutable, payload_destination


def sharing_bomb(levels: int) -> bytes:
    """CBOR value sharing (tags 28/29): `levels` nested pairs of references to the level
    below, 9 bytes a level, decoding to a structure of 2**levels leaves."""
    items = [bytes.fromhex("d81c820000")]  # shareable [0, 0]
    for k in range(1, levels):
        ref = b"\xd8\x1d" + cbor2.dumps(k - 1)
        items.append(b"\xd8\x1c\x82" + ref + ref)
    return b"\x98" + bytes([levels]) + b"".join(items)


def genuine_group_bundle(tmp_path, body=b"pos deu"):
    deu = make(tmp_path, "deu")
    deu.submit("fmn", body, 0, priority=Priority.ROUTINE)
    out = deu.poll(0)
    assert len(out) == 1
    return deu, out[0].payload


def resealed(genuine: bytes, extra: Envelope, keep_tags: bool) -> bytes:
    """nor, a member holding the group key, opens deu's genuine group bundle, adds `extra` in
    deu's name and seals it all again under the group key; with deu's own origin tags kept, or
    with the tags nor can make (under its own pair keys)."""
    nor = codec("nor")
    forger = Codec("deu", {**nor.keys, "nor": bytes(32)}, {"fmn": ("nor", "prt")})  # prt's tag under nor's key
    c = nor.open_container(genuine)
    maps = nor.open_items(c) + [forger.map_bytes(extra, stamp=c.stamp)]
    forged = cbor2.loads(forger.container(maps, "fmn", c.stamp))
    if keep_tags:
        forged[-1] = cbor2.loads(genuine)[-1]
    return cbor2.dumps(forged)


@pytest.mark.parametrize("keep_tags", [True, False])
def test_a_member_cannot_add_an_order_to_anothers_bundle(tmp_path, keep_tags):
    """Defect (container version 4): an item that was a byte string holding [map, tag] was
    opened but not covered by the origin tags, and nor appended a FLASH order "from deu" to
    deu's genuine bundle.  Now nor can seal deu's envelopes and its own again under the group
    key, but the origin tags cover the seal: the bundle is refused whole."""
    _, genuine = genuine_group_bundle(tmp_path)
    prt = make(tmp_path, "prt")
    lie = Envelope(Kind.DATA, "deu", 999, "fmn", 0, 60_000, Priority.FLASH, body=b"deu: withdraw now")
    res = prt.on_bundle(resealed(genuine, lie, keep_tags), 10)
    assert res.taken == 0 and len(res.rejected) == 1 and "origin tag" in res.rejected[0]
    assert prt.take() == []
    assert prt.on_bundle(genuine, 20).taken == 1  # the genuine bundle itself is taken
    assert [d.body for d in prt.take()] == [b"pos deu"]


def test_a_member_cannot_forge_a_done_ack_in_anothers_name(tmp_path):
    """Defect (container version 4): nor wrapped an ack "from deu" as a byte string into deu's
    genuine bundle, and prt released a report deu never got."""
    prt, nor = make(tmp_path, "prt"), make(tmp_path, "nor")
    seq = prt.submit("fmn", b"pos prt", 0)
    (report,) = prt.poll(0)
    nor.on_bundle(report.payload, 5)  # nor got it; deu's link is cut: deu never does
    nor.consumed([d.id for d in nor.take()])
    for b in nor.poll(60_000):
        prt.on_bundle(b.payload, 60_010)
    assert prt.store.held_out()[0] == 1  # nor's ack alone does not release a group report
    _, genuine = genuine_group_bundle(tmp_path)
    forged = Envelope(
        Kind.ACK, "deu", 1000, "fmn", 0, 60_000, Priority.FLASH, body=encode_ack_body({prt.store.source: ([seq], [])})
    )
    for keep_tags in (True, False):
        res = prt.on_bundle(resealed(genuine, forged, keep_tags), 60_020)
        assert res.acks == 0 and len(res.rejected) >= 1
        assert prt.store.held_out()[0] == 1, "a forged ack released a report deu never got"


@pytest.mark.parametrize("where", ["version", "sender", "item", "origin tags"])
def test_a_200_byte_value_sharing_bomb_is_refused_at_its_first_tag(tmp_path, where, caplog):
    """Defect: tags 28/29 made ~200 bytes decode into a structure that doubles every 9 bytes,
    expanded by error messages' repr (seconds of CPU on the event loop; ~370 bytes: days)."""
    bomb = sharing_bomb(20)
    parts = {
        "version": [bomb, b"cgw1", b"\x80"],
        "sender": [b"\x01", bomb, b"\x80"],
        "item": [b"\x01", b"cgw1", bomb],
        "origin tags": [b"\x01", b"cgw1", b"\x80", bomb],
    }[where]
    payload = bytes([0x80 | len(parts)]) + b"".join(parts)
    assert len(payload) < 200
    prt = make(tmp_path, "prt")
    res = prt.on_bundle(payload, 0)
    assert len(res.rejected) == 1 and "tag 28" in res.rejected[0] and "no tags are accepted" in res.rejected[0]
    assert all(len(r.getMessage()) < 300 for r in caplog.records)


def test_the_relay_refuses_a_sharing_bomb_before_it_routes(tmp_path):
    """The relay holds no keys: before this, 211 bytes cost 2.7 s in RelayCore.accept."""
    as_dst = b"\x84\x02\x63deu" + sharing_bomb(20) + b"\x80"  # [2, "deu", bomb, []]
    as_version = b"\x84" + sharing_bomb(20) + b"\x63deu\x63prt\x80"
    with pytest.raises(Unroutable, match="tag 28 at offset 8: no tags are accepted"):
        payload_destination(as_dst)
    with pytest.raises(Unroutable, match="tag 28 at offset 3: no tags are accepted"):
        payload_destination(as_version)
    c = RelayCore.open(tmp_path / "r.db", {"a": {"deu"}, "b": {"prt"}})
    assert c.accept("a", [as_dst, as_version], 1) == [] and c.counters["unroutable"] == 2
    c.close()


@pytest.mark.parametrize(
    "data, why",
    [
        (cbor2.dumps({(1, 2): 3}), "map key of major type 4"),
        (cbor2.dumps({b"k": 3}), "map key of major type 2"),
        (b"\x81" * 20 + b"\x00", "nested deeper than 8"),
        (b"\x9f\x00\xff", "indefinite length"),
        (b"\xc1\x00", "tag 1"),
        (b"\x9a\xff\xff\xff\xff", "cannot fit"),
        (b"\x5a\xff\xff\xff\xff", "runs past the end"),
        (b"\x00\x00", "1 bytes after the item"),
        (b"\xe0", "simple value 0"),
    ],
)
def test_the_strict_subset_names_what_it_refuses(data, why):
    with pytest.raises(strict_cbor.StrictCBORError, match=why):
        strict_cbor.loads(data)


def _nodes(v) -> int:
    if isinstance(v, dict):
        return 1 + sum(_nodes(k) + _nodes(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return 1 + sum(_nodes(x) for x in v)
    return 1


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_what_the_strict_subset_takes_has_at_most_one_object_per_byte(data):
    try:
        v = strict_cbor.loads(data)
    except strict_cbor.StrictCBORError:
        return
    assert _nodes(v) <= len(data)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8) | st.binary(max_size=8),
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.integers(0, 30) | st.text(max_size=4), kids, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_the_strict_subset_takes_what_c2dtn_writes(value):
    assert strict_cbor.loads(cbor2.dumps(value)) == value


def test_short_names_a_peer_value_without_its_whole_repr():
    assert strict_cbor.short("x" * 10_000).endswith("... (10000 characters)")
    assert strict_cbor.short(list(range(10**6))) == "list of 1000000"
    assert strict_cbor.short(2**200) == "an integer of 201 bits" and strict_cbor.short(5) == "5"


def test_an_ack_naming_a_trillion_ids_releases_what_is_held_and_costs_what_it_names(tmp_path):
    """Defect: ack runs were expanded to lists of ids (a 94-byte bundle took a node to 185 MB)."""
    import tracemalloc

    deu, prt = make(tmp_path, "deu"), make(tmp_path, "prt")
    seqs = [deu.submit("prt", b"report %d" % i, 0) for i in range(3)]
    deu.poll(0)
    others = [[f"x{i}", 1, [[0, 2**40]], []] for i in range(3)]
    body = cbor2.dumps([["deu", deu.store.inc, [[0, 2**40]], [[0, 2**40]]], *others])
    ack = Envelope(Kind.ACK, "prt", 1, "deu", 0, 60_000, Priority.FLASH, body=body)
    payload = prt.codec.bundle([ack], "deu")
    assert len(payload) < 200
    tracemalloc.start()
    res = deu.on_bundle(payload, 10)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert res.acks == 1 and deu.store.held_out()[0] == 0 and seqs
    assert peak < 2 << 20, peak


def test_stores_are_their_owners_alone_whatever_the_umask(tmp_path):
    """Defect: custody.db, its WAL/SHM and mqtt-sessions.cbor were 0644 in a 0755 folder."""
    import os
    import stat

    from c2dtn.ip_gateway import sessions_file
    from c2dtn.overlay.custody import CustodyStore

    def mode(p):
        return stat.S_IMODE(os.stat(p).st_mode)

    old = os.umask(0)  # the most permissive umask a service manager could hand down
    try:
        stale = tmp_path / "old"
        stale.mkdir(mode=0o755)
        (stale / "custody.db").touch(mode=0o644)  # as an older version left it
        for folder in (tmp_path / "new" / "gw1", stale):
            st = CustodyStore(folder / "custody.db", "gw1")
            st.submit("gw4", b"FLASH: hold at phase line red", 0, 60_000, Priority.FLASH, None, "raw")
            assert mode(folder) == 0o700
            for f in ("custody.db", "custody.db-wal", "custody.db-shm"):
                assert mode(folder / f) == 0o600, (folder / f, oct(mode(folder / f)))
            st.close()
        sessions_file.write(tmp_path / "new" / "gw1" / "mqtt-sessions.cbor", b"\xa0")
        assert mode(tmp_path / "new" / "gw1" / "mqtt-sessions.cbor") == 0o600
        r = RelayCore.open(tmp_path / "relay" / "relay.db", {"a": {"deu"}})
        assert mode(tmp_path / "relay") == 0o700 and mode(tmp_path / "relay" / "relay.db") == 0o600
        r.close()
    finally:
        os.umask(old)


@pytest.mark.parametrize("version", [5, 4])
def test_a_publish_the_far_side_could_not_take_is_refused_at_the_near_side_not_pubacked(version):
    """Defect: the sender took 256 MB packets and 16 MB API sends while receivers refuse
    envelopes over 1 MiB: such a message was acknowledged, resent for its lifetime, then expired."""
    from test_near_core import Net, policy

    from c2dtn.ip_gateway import mqtt as m
    from c2dtn.ip_gateway import near_core as nc
    from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES

    net = Net(nc.NearCore(policy(), max_packet_size=4 << 20))
    cid, ack = net.connect("u1", version=version)
    assert ack.reason == 0
    net.send(cid, m.Publish("c2/orders", b"o" * MAX_MESSAGE_BYTES, 1, packet_id=7), version)
    got = net.take(cid)
    assert not any(isinstance(p, m.PubAck) for p in got) and cid in net.closed
    assert "pub" not in net.ops()  # nothing of it went into custody
    if version == 5:
        assert [p.reason for p in got] == [m.Reason.PACKET_TOO_LARGE]
    cid2, _ = net.connect("u2", version=version)
    net.send(cid2, m.Publish("c2/orders", b"o" * (MAX_MESSAGE_BYTES - 200), 1, packet_id=8), version)
    assert [type(p) for p in net.take(cid2)] == [m.PubAck]  # just under the limit: carried


def test_custody_refuses_a_message_over_the_one_limit_naming_its_size(tmp_path):
    from c2dtn.overlay.custody import CustodyStore
    from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES
    from c2dtn.overlay.store import TooLarge

    st = CustodyStore(tmp_path / "c.db", "gw1")
    with pytest.raises(TooLarge, match=f"a message of {MAX_MESSAGE_BYTES + 1} bytes for gw4 is over"):
        st.submit_many(
            [
                ("gw4", b"x", 60_000, Priority.FLASH, None, "raw"),
                ("gw4", b"x" * (MAX_MESSAGE_BYTES + 1), 60_000, Priority.FLASH, None, "raw"),
            ],
            0,
        )
    assert st.held_out()[0] == 0  # nothing of the batch
    st.submit("gw4", b"x" * MAX_MESSAGE_BYTES, 0, 60_000)
    st.close()


def test_a_message_at_the_limit_is_opened_by_its_receiver_whatever_its_content():
    import os

    from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES

    a = Codec("gw1", {"gw4": b"k" * 32})
    b = Codec("gw4", {"gw1": b"k" * 32})
    for body in (os.urandom(MAX_MESSAGE_BYTES), b"\0" * MAX_MESSAGE_BYTES):
        env = Envelope(Kind.DATA, "gw1", 1, "gw4", 0, 60_000, supersede="x" * 40, body=body, app="mqtt")
        assert b.open_bundle(a.bundle([env]))[0].body == body


def test_a_gateway_config_cannot_take_packets_the_overlay_cannot_carry():
    from c2dtn.errors import ConfigError
    from c2dtn.ip_gateway.policy import parse_gateway

    with pytest.raises(ConfigError, match="max_packet_size' = 268435456: must be 64 to 1048576 bytes"):
        parse_gateway("gw.toml", {"max_packet_size": 268435456})
    assert parse_gateway("gw.toml", {"max_packet_size": 1 << 20}).max_packet_size == 1 << 20


def test_the_node_api_answers_413_for_a_message_over_the_limit_and_takes_one_at_it(tmp_path):
    import asyncio

    from c2dtn.overlay.client import ApiError, NodeClient
    from c2dtn.overlay.config import load_node_config
    from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES
    from c2dtn.overlay.node import OverlayNode

    p = tmp_path / "gw1.toml"
    p.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[agent]\nkind = "ion"\n[keys]\ngw4 = "{"ab" * 32}"\n'
    )
    p.chmod(0o600)
    node = OverlayNode(load_node_config(p))
    got: dict = {}

    def client():
        c = NodeClient(node.cfg.api_socket, "gw1")
        try:
            c.send("gw4", b"x" * (MAX_MESSAGE_BYTES + 1))
        except ApiError as e:
            got["over"] = str(e)
        got["at"] = c.send("gw4", b"x" * MAX_MESSAGE_BYTES)

    asyncio.run(serve_api_to(node, client))
    held = node.core.store.held_out()[0]
    node.core.store.close()
    assert f"a message of {MAX_MESSAGE_BYTES + 1} bytes is over the overlay's limit" in got["over"]
    assert got["at"]["seq"] and held == 1


def _client_reuses_an_acked_packet_id(net, store, answered: bool):
    """u1 publishes "hello" with packet id 5 and hears PUBACK; later it publishes "hello" again
    with id 5 (legal once PUBACKed), whose first transmission is lost: it arrives with DUP.
    The shell's part is played here: Submit into custody with its marks, Answered drops them."""
    from c2dtn.ip_gateway import mqtt as m
    from c2dtn.ip_gateway import near_core as nc

    taken = []

    def run(evs):
        for ev in evs:
            if isinstance(ev, nc.Submit):
                taken.extend(
                    store.submit_many([(d, b, life, p, k, "mqtt") for d, b, life, p, k in ev.envelopes], 0, ev.marks)
                )
                run(net.core.committed(ev.conn, True, net.now))
            elif isinstance(ev, nc.Answered) and answered:
                store.marks_answered(ev.keys)
            elif isinstance(ev, nc.Write):
                net.inbox[ev.conn] += net.readers[ev.conn].feed(ev.data)

    cid, _ = net.connect("u1", version=4)
    for dup in (False, True):
        run(net.core.data(cid, m.encode(m.Publish("c2/orders", b"hello", 1, packet_id=5, dup=dup), 4), net.now))
    return [p for p in net.take(cid) if isinstance(p, m.PubAck)], taken[-2:]


def test_a_dup_reusing_a_pubacked_packet_id_is_a_new_message(tmp_path):
    """Defect: the mark (client, packet id, content hash) was kept 7 days, so the second message
    was PUBACKed and never entered custody."""
    from test_near_core import Net, policy

    from c2dtn.ip_gateway import near_core as nc
    from c2dtn.overlay.custody import CustodyStore

    st = CustodyStore(tmp_path / "c.db", "gw1")
    acks, seqs = _client_reuses_an_acked_packet_id(Net(nc.NearCore(policy())), st, answered=True)
    assert len(acks) == 2 and all(s is not None for s in seqs), seqs
    assert st.held_out()[0] == 2  # both messages
    st.close()


def test_a_dup_whose_pubacks_was_never_written_is_still_a_resend(tmp_path):
    """The case marks exist for: custody took it, the gateway died before the PUBACK went out."""
    from test_near_core import Net, policy

    from c2dtn.ip_gateway import near_core as nc
    from c2dtn.overlay.custody import CustodyStore

    st = CustodyStore(tmp_path / "c.db", "gw1")
    acks, seqs = _client_reuses_an_acked_packet_id(Net(nc.NearCore(policy())), st, answered=False)
    assert len(acks) == 2 and seqs[0] is not None and seqs[1] is None and st.held_out()[0] == 1
    st.close()


def test_a_coap_message_id_reused_after_exchange_lifetime_is_a_new_request(tmp_path):
    """Defect: a CoAP message id reused after EXCHANGE_LIFETIME (RFC 7252 allows it) was ACKed
    and never forwarded: the custody mark outlived the exchange by days."""
    from c2dtn.ip_gateway.coap_core import EXCHANGE_LIFETIME_MS
    from c2dtn.overlay.custody import CustodyStore

    st = CustodyStore(tmp_path / "c.db", "gw1")
    mark = ("coap:10.0.0.2:40000:17", b"d" * 8, EXCHANGE_LIFETIME_MS)
    first = st.submit_many([("gw4", b"POST /orders", 60_000, Priority.FLASH, None, "coap")], 0, [mark])
    again = st.submit_many([("gw4", b"POST /orders", 60_000, Priority.FLASH, None, "coap")], 200_000, [mark])
    later = st.submit_many(
        [("gw4", b"POST /orders", 60_000, Priority.FLASH, None, "coap")], 200_000 + EXCHANGE_LIFETIME_MS + 1, [mark]
    )
    assert first[0] is not None and again == [None] and later[0] is not None
    st.close()


def test_a_member_cannot_speak_as_the_group_itself(tmp_path):
    """Review finding: a bundle whose sender is the group's name, sealed with the group key as if
    it were a pair key, released prt's group report and put an order "from fmn" in its inbox."""
    prt, nor = make(tmp_path, "prt"), make(tmp_path, "nor")
    seq = prt.submit("fmn", b"pos prt", 0)
    prt.poll(0)
    as_group = Codec("fmn", {"prt": nor.codec.keys["fmn"]})
    ack = Envelope(
        Kind.ACK, "fmn", 1, "prt", 0, 60_000, Priority.FLASH, body=encode_ack_body({prt.store.source: ([seq], [])})
    )
    order = Envelope(Kind.DATA, "fmn", 2, "prt", 0, 60_000, Priority.FLASH, body=b"all units: withdraw now")
    res = prt.on_bundle(as_group.bundle([ack, order]), 10)
    assert res.acks == 0 and res.taken == 0 and "is a group, not a node" in res.rejected[0]
    assert prt.store.held_out()[0] == 1 and prt.take() == []
    assert prt.store.ack_from("fmn", [seq], []) == ([], [])  # and custody takes no ack "from" a group


# -- what the attacker's review of the first fixes found -------------------------------------


def test_an_ack_body_travels_plain_and_a_compressed_one_is_refused(tmp_path):
    """Finding: an ack body was decompressed before it was decoded: 209 bytes inflated to 4 MiB
    of CBOR (2.1 s, +297 MB)."""
    import zstandard

    deu, prt = make(tmp_path, "deu"), make(tmp_path, "prt")
    big = encode_ack_body({f"n{i}/1": (list(range(0, 400, 2)), []) for i in range(4)})
    sealed = prt.codec.map_bytes(Envelope(Kind.ACK, "prt", 1, "deu", 0, 60_000, Priority.FLASH, body=big))
    assert len(sealed) > len(big)  # sent as it is, not compressed
    bomb = zstandard.ZstdCompressor().compress(b"\x9a\x00\x40\x00\x00" + b"\xa0" * (4 << 20))
    m = {1: 1, 3: 2, 4: 0, 5: 60_000, 9: 2, 8: bomb}
    payload = prt.codec.container([cbor2.dumps(m)], "deu")
    assert cbor2.loads(payload)[0] == CONTAINER_VERSION
    assert len(payload) < 400
    res = deu.on_bundle(payload, 0)
    assert res.acks == 0 and "acks travel plain" in res.rejected[0]


def test_the_acks_of_one_bundle_look_at_what_is_held_once(tmp_path):
    """Finding: each ~75-byte ack naming every id cost a scan of all that was held (40 of them
    in 3.6 kB: 10 s with 20,000 held)."""
    deu, prt = make(tmp_path, "deu"), make(tmp_path, "prt")
    seqs = [deu.submit("prt", b"r%d" % i, 0) for i in range(5)]
    deu.poll(0)
    scans = []
    real = deu.store.outbox.seqs_between
    deu.store.outbox.seqs_between = lambda lo, hi, dsts=None: scans.append((lo, hi)) or real(lo, hi, dsts)
    acks = [
        prt.codec.map_bytes(
            Envelope(
                Kind.ACK,
                "prt",
                i,
                "deu",
                0,
                60_000,
                Priority.FLASH,
                body=encode_ack_body({deu.store.source: (list(range(0, 9000, 2)), [])}),
            )
        )
        for i in range(40)
    ]
    res = deu.on_bundle(prt.codec.container(acks, "deu"), 10)
    assert res.acks == 40 and len(scans) == 1
    assert deu.store.held_out()[0] == 5 - len([s for s in seqs if s % 2 == 0])


def test_a_bundle_opens_to_at_most_8_mib_of_bodies_and_senders_keep_within_it(tmp_path):
    """Finding: 40 envelopes of 4 MiB bodies compressed to 200 bytes each held 160 MiB at once."""
    from c2dtn.overlay.envelope import MAX_BUNDLE_PLAIN_BYTES, MAX_MESSAGE_BYTES
    from c2dtn.overlay.scheduler import SchedulerConfig

    cfg = SchedulerConfig(aggregate_bytes=1 << 20, aggregate_large_bytes=4 << 20, init_window=1 << 30)
    deu, prt = make(tmp_path, "deu", cfg), make(tmp_path, "prt", cfg)
    for i in range(20):
        deu.submit("prt", bytes([i]) * MAX_MESSAGE_BYTES, 0)  # each compresses to a few hundred bytes
    out = deu.poll(0)
    assert len(out) >= 3 and all(len(b.payload) < 64 << 10 for b in out)
    for b in out:
        assert prt.on_bundle(b.payload, 10).taken == len(b.seqs)  # each of the sender's bundles is taken whole
    hostile = Codec("deu", {"prt": prt.codec.keys["deu"]})  # a compromised deu box, packing by hand
    forged = [
        hostile.map_bytes(Envelope(Kind.DATA, "deu", 100 + i, "prt", 0, 60_000, body=bytes([i]) * MAX_MESSAGE_BYTES))
        for i in range(12)
    ]
    res = prt.on_bundle(hostile.container(forged), 20)
    assert res.taken == MAX_BUNDLE_PLAIN_BYTES // MAX_MESSAGE_BYTES and len(res.rejected) == 12 - res.taken
    assert "this bundle may still open to" in res.rejected[0]


def test_a_ping_flood_is_answered_up_to_a_bound_with_one_log_line(tmp_path, caplog):
    """Finding: 17 kB of pings with 10-year lifetimes filled prt's 256 MiB quota with answers,
    and 500 unanswered pings wrote 500 lines."""
    from c2dtn.overlay.core import PONG_LIFETIME_MAX_MS, PONGS_HELD_MAX

    nor, prt = make(tmp_path, "nor"), make(tmp_path, "prt")
    pings = [
        nor.codec.map_bytes(
            Envelope(
                Kind.DATA,
                "nor",
                i + 1,
                "prt",
                0,
                10 * 365 * 86_400_000,
                Priority.FLASH,
                body=b"p" * 100,
                app="ping",
                inc=nor.store.inc,
            )
        )
        for i in range(500)
    ]
    res = prt.on_bundle(nor.codec.container(pings, "prt"), 0)
    assert res.taken == 500
    held = prt.store.held(list(range(1, 10_000)))
    assert len(held) == PONGS_HELD_MAX and prt.store.counters()["pings_unanswered"] == 500 - PONGS_HELD_MAX
    assert all(it.expires_ms <= PONG_LIFETIME_MAX_MS for it in held.values())
    assert len([r for r in caplog.records if "pings not answered" in r.getMessage()]) == 1


def test_an_ack_run_of_strings_is_named_by_prefix_not_written_whole(tmp_path, caplog):
    """Finding: a 235-byte ack wrote a log line of 16,777,041 characters."""
    deu, prt = make(tmp_path, "deu"), make(tmp_path, "prt")
    body = cbor2.dumps([["deu", deu.store.inc, [["x" * 100_000, "y" * 100_000]], []]])
    res = deu.on_bundle(prt.codec.bundle([Envelope(Kind.ACK, "prt", 1, "deu", 0, 60_000, body=body)], "deu"), 0)
    assert res.acks == 0 and len(res.rejected) == 1 and len(res.rejected[0]) <= 300
    assert all(len(r.getMessage()) <= 400 for r in caplog.records)


def test_a_container_of_millions_of_tiny_items_is_refused_at_the_bound(tmp_path):
    """Finding: an unauthenticated 8 MiB container of empty maps cost 6.4 s and +577 MB."""
    from c2dtn.overlay.envelope import CONTAINER_ITEMS_MAX

    prt = make(tmp_path, "prt")
    for payload, why in (
        (b"\x9a\x00\x10\x00\x00" + b"\x00" * (1 << 20), f"more than {CONTAINER_ITEMS_MAX} items"),
        (b"\x83\x01\x63nor\x9a\x00\x10\x00\x00" + b"\xa0" * (1 << 20), "nested deeper than 2 at offset 11"),
    ):
        res = prt.on_bundle(payload, 0)
        assert why in res.rejected[0]
        with pytest.raises(Unroutable, match=why):
            payload_destination(payload)


def test_mqtt_properties_from_a_peer_are_of_their_type():
    """Finding: a user_property that was a 4 MiB string became 4 million 1-tuples."""
    from c2dtn.ip_gateway import bodies

    ok = bodies.pack(
        "pub",
        "u1",
        "10.0.0.1:1883",
        t="c2/a",
        p=b"x",
        q=1,
        r=False,
        x={"user_property": [["unit", "DEU-1"]], "message_expiry_interval": 60},
    )
    assert bodies.unpack(ok)["x"]["user_property"] == [("unit", "DEU-1")]
    for x, why in (
        ({"user_property": "u" * 1000}, "user_property is not a list"),
        ({"message_expiry_interval": "soon"}, "of the wrong type"),
        ({"message_expiry_interval": 1 << 40}, "of the wrong type"),
        ({"correlation_data": b"c" * 70_000}, "of the wrong type or size"),
    ):
        with pytest.raises(bodies.BodyError, match=why):
            bodies.unpack(bodies.pack("pub", "u1", "10.0.0.1:1883", t="c2/a", p=b"x", q=1, r=False, x=x))


def test_after_a_failed_fsync_nothing_is_acknowledged_or_sent_and_the_node_stops(tmp_path):
    """Defect: the process carried on after an fsync failed; the failed commit stayed in custody
    and was sent, and a later fsync's success acknowledged a resend (Linux may have dropped the
    failed pages: a later fsync proves nothing about them)."""
    import asyncio
    import errno

    from c2dtn.overlay.client import ApiError, NodeClient
    from c2dtn.overlay.config import load_node_config
    from c2dtn.overlay.node import EXIT_STORE_FAILED, OverlayNode

    p = tmp_path / "gw1.toml"
    p.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\nfsync = "thread"\n[agent]\nkind = "ion"\n'
        f'[keys]\ngw4 = "{"ab" * 32}"\n'
    )
    p.chmod(0o600)
    node = OverlayNode(load_node_config(p))
    sent = []

    async def send(dst_node, endpoint, payload, lifetime_s, priority=3):
        sent.append(payload)

    node.agent.send = send
    store = node.core.store.records
    real, calls = store.sync_wal, []

    def flaky():  # the first fsync fails, every later one "succeeds"
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        real()

    store.sync_wal = flaky
    answers = []

    def client():
        c = NodeClient(node.cfg.api_socket, "gw1")
        for i in range(3):
            try:
                answers.append(c.send("gw4", b"order %d" % i, priority="routine"))
            except ApiError as e:
                answers.append(str(e))

    async def main():
        stop = asyncio.Event()
        node.on_failure = stop.set  # (as the node's process does: overlay/service.py)
        await serve_api_to(node, client, then=lambda: node._hand_over(node.core.poll(10**13)))  # the pump's next
        return stop.is_set()

    stopped = asyncio.run(main())
    node.core.store.close()
    assert stopped and node.exit_code == EXIT_STORE_FAILED
    assert all("fsync failed" in str(a) for a in answers), answers  # none of the three acknowledged
    assert sent == []  # and nothing handed to the agent


# -- orders no longer in the clear -------------------------------------------------------------


def _v1_container(sender: str, dst: str, env: Envelope, key: bytes, codec: Codec, origin_tags: int = 0) -> bytes:
    """The bundle the HMAC-tagged form (container version 1) made of the same envelope: the map
    with its destination, a 16-byte HMAC tag, and 9 bytes per origin tag."""
    import hmac

    m = cbor2.loads(codec.map_bytes(env))
    m[10] = dst
    mb = cbor2.dumps(m)
    items = [[mb, hmac.digest(key, mb, "sha256")[:16]]]
    return cbor2.dumps([1, sender, items] + ([[bytes(8)] * origin_tags] if origin_tags else []))


def test_a_sealed_report_hides_its_body_and_costs_no_more_bytes_than_the_hmac_form(capsys):
    """Nothing of a report's topic or body is in the bundle, and the bundle is no larger than
    the authenticated-only form it replaced (printed: pair and group)."""
    from test_envelope import REPORT

    key = b"k" * 32
    sizes = {}
    for dst, groups in (("prt", {}), ("fmn", {"fmn": ("prt", "nor", "usa")})):
        deu = Codec("deu", {"prt": key, "nor": key, "usa": key, "fmn": key}, groups)
        env = Envelope(
            Kind.DATA,
            "deu",
            1234,
            dst,
            1_700_000_000_000,
            600_000,
            Priority.PRIORITY,
            supersede="mqtt:/PRT/PRT-UNIT001/PRT-S003/location",
            body=REPORT,
            app="mqtt",
            cseq=77,
            floor=70,
            inc=0x1F2E3D4C,
        )
        stamp = (env.created_ms // 1000 + 1, env.inc)  # as the scheduler stamps it, a moment later
        payload = deu.bundle([env], dst, stamp)
        plain = deu.map_bytes(env, stamp=stamp)
        for secret in (REPORT[:24], b"PRT-UNIT001", b"Feature", plain[-20:]):
            assert secret not in payload
        old = _v1_container("deu", dst, env, key, deu, len(groups.get(dst, ())))
        sizes[dst] = (len(payload), len(old))
        assert len(payload) <= len(old)
    print(
        f"\n255-byte position report, bundle bytes (AES-GCM-SIV / HMAC form): pair {sizes['prt'][0]} / "
        f"{sizes['prt'][1]}, group of 4 {sizes['fmn'][0]} / {sizes['fmn'][1]}"
    )


def test_only_the_key_holders_read_an_envelope_and_any_flipped_bit_is_refused(tmp_path):
    deu, nor, prt = (codec(n) for n in ("deu", "nor", "prt"))
    env = Envelope(Kind.DATA, "deu", 1, "fmn", 0, 60_000, Priority.FLASH, body=b"FLASH: hold at phase line red")
    group_bundle = deu.bundle([env], "fmn")
    for member in (nor, prt):
        assert member.open_bundle(group_bundle)[0].body == env.body
    pair_bundle = deu.bundle([Envelope(Kind.DATA, "deu", 2, "prt", 0, 60_000, body=b"to prt")], "prt")
    eavesdropper = Codec("prt", {"deu": codec("nor").keys["deu"]})  # nor, relabelled, with its own pair key
    with pytest.raises(BadTag):
        eavesdropper.open_bundle(pair_bundle)
    seal = prt.open_container(pair_bundle).seal
    for i in range(0, len(seal), 7):
        flipped = bytearray(seal)
        flipped[i] ^= 0x40
        obj = cbor2.loads(pair_bundle)
        obj[5] = bytes(flipped)
        with pytest.raises(BadTag):
            prt.open_bundle(cbor2.dumps(obj))
    assert prt.open_bundle(pair_bundle)[0].body == b"to prt"
