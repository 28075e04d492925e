"""Envelope codec: round trips, compression, authentication, and typed errors for bad input."""

import dataclasses

import cbor2
import pytest

from c2dtn.overlay import envelope as E
from c2dtn.overlay.envelope import Codec, Envelope, Kind, Priority

KEYS = {"gw1": b"k1" * 16, "gw4": b"k4" * 16}
REPORT = (
    b'{"type": "Feature", "geometry": {"type": "Point", "coordinates": [38.74691, -9.156418, 0]}, '
    b'"properties": {"country": "PRT", "unit": "PRT-UNIT001", "node_id": "PRT-S003", '
    b'"msg_id": "PRT-S003_28", "timestamp": 1588759108433}}'
)


def pair():
    # gw1 and gw4 share one key; each codec knows the key by the peer's name
    shared = b"s" * 32
    return Codec("gw1", {"gw4": shared}), Codec("gw4", {"gw1": shared})


def env(**kw):
    d = dict(
        kind=Kind.DATA,
        origin="gw1",
        seq=7,
        dst="gw4",
        created_ms=1_700_000_000_000,
        lifetime_ms=60_000,
        priority=Priority.IMMEDIATE,
        supersede="PRT-S003",
        body=REPORT,
        app="mqtt",
        cseq=3,
        floor=2,
    )
    d.update(kw)
    return Envelope(**d)


def test_round_trip_through_a_container_with_compression():
    a, b = pair()
    e1, e2 = env(), env(seq=8, body=b"short", supersede=None, cseq=4)
    payload = a.bundle([e1, e2])
    c = b.open_container(payload)
    assert c.sender == "gw1" and c.origin_tags is None
    got = [b.open(c, m) for m in b.open_items(c)]
    assert got[0] == Envelope(**{**e1.__dict__, "compression": got[0].compression})
    assert got[0].compression != E.Compression.NONE  # a 255-byte GeoJSON report compresses
    assert got[1].body == b"short" and got[1].compression == E.Compression.NONE
    assert len(a.map_bytes(e1)) < len(REPORT)


def test_one_seal_a_bundle_costs_its_tag_once_however_many_envelopes():
    a, b = pair()
    envs = [env(seq=7 + i, supersede=f"u{i}") for i in range(5)]
    one = len(a.bundle(envs[:1]))
    five = len(a.bundle(envs))
    maps = sum(len(a.map_bytes(e)) for e in envs[1:])
    assert five - one <= maps + 2  # the four maps more, and at most the headers growing
    assert [g.seq for g in b.open_bundle(a.bundle(envs))] == [7, 8, 9, 10, 11]


def _with_seal(payload: bytes, seal: object, sender: str | None = None) -> bytes:
    obj = cbor2.loads(payload)
    obj[E.SEAL_AT] = seal
    if sender is not None:
        obj[1] = sender
    return cbor2.dumps(obj)


def test_bad_tag_wrong_key_and_missing_tag_are_rejected():
    a, b = pair()
    payload = a.bundle([env(), env(seq=8, supersede="x")])
    seal = cbor2.loads(payload)[E.SEAL_AT]
    ct, tag = seal[:-16], seal[-16:]
    for bad in (ct + bytes(16), ct + tag[:8] + bytes(8), seal[:-1]):
        with pytest.raises(E.BadTag):
            b.open_bundle(_with_seal(payload, bad))
    with pytest.raises(E.Malformed, match="seal"):
        b.open_bundle(_with_seal(payload, tag))  # a tag and no ciphertext
    with pytest.raises(E.Malformed, match="seal"):
        b.open_bundle(_with_seal(payload, [ct, tag]))  # version 4's form of one envelope
    tampered = bytearray(seal)
    tampered[3] ^= 0x01
    with pytest.raises(E.BadTag):
        b.open_bundle(_with_seal(payload, bytes(tampered)))
    other = Codec("gw4", {"gw1": b"x" * 32})
    with pytest.raises(E.BadTag):
        other.open_bundle(payload)
    with pytest.raises(E.UnknownPeer, match="gw9"):
        b.open_bundle(_with_seal(payload, seal, sender="gw9"))


def test_origin_must_be_the_sender():
    c = Codec("gw4", {"gw1": b"s" * 32, "gw2": b"s" * 32})
    gw2 = Codec("gw2", {"gw4": b"s" * 32})
    with pytest.raises(ValueError, match="gw1"):
        gw2.bundle([env()])  # gw2 cannot seal an envelope naming gw1 as its origin
    # nor can it write one: the origin is not in the map, it is the bundle's sender
    (got,) = c.open_bundle(gw2.bundle([dataclasses.replace(env(), origin="gw2")]))
    assert got.origin == "gw2"
    with pytest.raises(E.BadTag):  # gw1's bundle, passed off as gw2's
        c.open_bundle(_with_seal(pair()[0].bundle([env()]), cbor2.loads(pair()[0].bundle([env()]))[E.SEAL_AT], "gw2"))


@pytest.mark.parametrize(
    "payload, error",
    [
        (b"", E.Malformed),
        (b"\xff\xfe garbage", E.Malformed),
        (cbor2.dumps({"not": "an array"}), E.Malformed),
        (cbor2.dumps([1, "gw1", "gw4", []]), E.BadVersion),
        (cbor2.dumps([2, "gw1", "gw4", []]), E.BadVersion),
        (cbor2.dumps([3, "gw1", "gw4", []]), E.BadVersion),
        (cbor2.dumps([4, "gw1", "gw4", 0, 0, [[b"x", bytes(16)]]]), E.BadVersion),  # version 4: a seal each
        (cbor2.dumps([5, "gw1", "gw4", 0, 0, bytes(17)]), E.BadVersion),  # version 5: no edits
        (cbor2.dumps([6, "gw1", "gw4", []]), E.Malformed),  # version 3's shape
        (cbor2.dumps([6, 5, "gw4", 0, 0, bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", 0, 0, "x"]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", 0, 0, []]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", 0, 0, bytes(16)]), E.Malformed),  # a tag alone
        (cbor2.dumps([6, "gw1", "gw4", 0, 0, bytes(17)])[:-1], E.Malformed),
        (cbor2.dumps([6, "gw1", "gw9", 0, 0, bytes(17)]), E.Misrouted),
        (cbor2.dumps([6, "gw1", 4, 0, 0, bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", -1, 0, bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", E.MAX_BASE_S + 1, 0, bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", 0, 1 << 32, bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", True, 0, bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", 0, "1", bytes(17)]), E.Malformed),
        (cbor2.dumps([6, "gw1", "gw4", 0, 0, bytes(17), [bytes(8)], 1]), E.Malformed),
        (bytes(E.MAX_CONTAINER_BYTES + 1), E.Oversize),
    ],
)
def test_malformed_containers_raise_typed_errors(payload, error):
    _, b = pair()
    with pytest.raises(error):
        b.open_container(payload)


def _seal_map(m, key=b"s" * 32, stamp=E.NO_STAMP):
    """A bundle payload holding one map as it is (one container() would never write)."""
    return Codec("gw1", {"gw4": key}).container([cbor2.dumps(m)], "gw4", stamp)


@pytest.mark.parametrize(
    "m, match",
    [
        ({1: 0, 3: "seven", 4: 1, 5: 1}, "seq"),
        ({1: 9, 3: 1, 4: 1, 5: 1}, "kind"),
        ({1: 0, 3: 1, 4: 1}, "lifetime"),
        ({3: -1, 4: 1, 5: 1}, "range"),
        ({3: 1, 4: 1, 5: 1, 9: max(E.Compression) + 1, 8: b"x"}, "compression"),
        ({3: 1, 4: 1, 5: 1, 9: 1, 8: b"not zlib"}, "decompress"),
        ({0: 1, 1: 0, 2: "gw1", 3: 1, 4: 1, 5: 1}, "retired"),  # container version 2's map
        ({3: 1, 4: 1, 15: 1, 5: 1000}, "lifetime twice"),
        ({3: 1, 4: 1, 15: -1}, "lifetime in s -1"),
        ({3: 1, 4: 1, 15: 1 << 41}, "lifetime"),
        ({3: 1, 4: 1, 15: 1, 12: 5, 16: 6}, "floor back from cseq 6"),
        ({3: 1, 4: 1, 15: 1, 12: 5, 16: 1, 13: 4}, "floor twice"),
        ({3: 1, 4: 1, 15: 1, 11: 99}, "app code 99"),
        ({3: 1, 4: 1, 15: 1, 11: 2.5}, "app"),
        ({3: 1, 4: 1, 15: 1, 7: b"short"}, "supersession key"),
        ({3: 1, 4: 1, 15: 1, 18: 24}, "send number 24"),
        ({3: 1, 4: 1, 15: 1, 18: -1}, "send number -1"),
        ({3: 1, 4: 1, 15: 1, 18: "1"}, "send number"),
        ([1, 2, 3], "not a map"),
    ],
)
def test_malformed_envelopes_name_the_problem(m, match):
    _, b = pair()
    with pytest.raises(E.EnvelopeError, match=match):
        b.open_bundle(_seal_map(m))


def test_sealed_envelopes_that_are_not_an_array_of_maps_refuse_the_bundle_naming_it():
    a, b = pair()
    for plain, match, error in (
        (cbor2.dumps({3: 1, 4: 1, 15: 1}), "not an array", E.Malformed),
        (b"\x9f" + cbor2.dumps({3: 1, 4: 1, 15: 1}) + b"\xff", "not an array", E.Malformed),  # indefinite
        (b"\x81" + cbor2.dumps({3: 1, 4: 1, 15: 1}) + b"\x00", "an array of 1 holding 2", E.Malformed),
        (cbor2.dumps([{3: 1, 4: 1, 15: [1]}]), "strict CBOR", E.Malformed),  # nested deeper than a map's values
        (b"\x82" + cbor2.dumps({3: 1, 4: 1, 15: 1}), "an array of 2 holding 1", E.Malformed),
        (b"\x80", "no envelopes", E.Malformed),
        (b"\x9a\xff\xff\xff\xff", "4294967295 envelopes", E.Oversize),  # refused before anything is read
        (b"\x99", "cut short", E.Malformed),
    ):
        with pytest.raises(error, match=match):
            b.open_bundle(a.container_of(plain, "gw4"))
    # one bad map among good ones: the node refuses that envelope and takes the others (core)
    c = b.open_container(a.container([cbor2.dumps({3: 1}), a.map_bytes(env())], "gw4"))
    bad, good = b.open_items(c)
    with pytest.raises(E.Malformed, match="creation time"):
        b.open(c, bad)
    assert b.open(c, good).seq == 7


def test_zip_bomb_is_refused():
    import zlib

    _, b = pair()
    bomb = zlib.compress(bytes(E.MAX_BODY_BYTES + 10))
    with pytest.raises(E.Oversize):
        b.open_bundle(_seal_map({3: 1, 4: 1, 5: 1, 9: 1, 8: bomb}))


def test_ack_bodies_are_runs_per_source():
    src = E.source_key("gw1", 0x1F2E3D4C)
    body = E.encode_ack_body({src: ([5, 1, 2, 3, 9, 10], [12, 13]), "gw9": ([4], [])})
    assert cbor2.loads(body) == [["gw1", 0x1F2E3D4C, [[1, 3], [5, 5], [9, 10]], [[12, 13]]], ["gw9", 0, [[4, 4]], []]]
    ack = E.decode_ack_body(body, src)
    assert ack.found and ack.done == [(1, 3), (5, 5), (9, 10)] and ack.got == [(12, 13)]
    assert ack.sources == {src, "gw9"}
    assert not E.decode_ack_body(body, "gw1").found  # another incarnation's entry is not ours
    assert E.source_node(src) == "gw1" and E.source_key("gw1", 0) == "gw1"
    assert len(E.encode_ack_body({src: (list(range(1, 501)), [])})) < 20  # 500 ids in one short ack
    # the form before decision 0017, a map keyed by the source key's text, is refused
    with pytest.raises(E.Malformed, match="not an array"):
        E.decode_ack_body(cbor2.dumps({src: [[[1, 3]], []], "": {src: 40}}), src)
    for bad, named in (
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [[3, 1]], []]]), "bad ack run"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [["a", 1]], []]]), "bad ack run"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, 1, []]]), "not \\[done runs"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [[1, 2]]]]), "ack entry"),
        (cbor2.dumps([["gw1", 1 << 32, [], []]]), "ack entry"),
        (cbor2.dumps([["gw1", -1, [], []]]), "ack entry"),
        (cbor2.dumps([["gw/1", 1, [], []]]), "ack entry"),
        (cbor2.dumps([[7, 1, [], []]]), "ack entry"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], -5]]), "ack hold"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], True]]), "ack hold"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], []], ["gw1", 0x1F2E3D4C, [[1, 1]], []]]), "twice"),
        (cbor2.dumps(7), "not an array"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], None]]), "ack hold"),
        (b"\xff", "strict CBOR"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [[0, 1 << 64]], []]]), "strict CBOR"),  # (a bignum tag)
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [[0, (1 << 64) - 1]], []]]), "bad ack run"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], None, E.SN_MOD * E.HEARD_ECHO_MS]]), "send number heard"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], None, -1]]), "send number heard"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], None, True]]), "send number heard"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], "40", 3]]), "ack hold"),
        (cbor2.dumps([["gw1", 0x1F2E3D4C, [], [], None, 3, 0]]), "ack entry"),
    ):
        with pytest.raises(E.Malformed, match=named):
            E.decode_ack_body(bad, src)


def test_an_ack_says_the_send_number_heard_beside_its_hold_or_alone():
    """An answer to an announced send number (decision 0041): a sixth item, the hold before it
    null where the ack says none; an entry without it reads as before."""
    src = E.source_key("gw1", 0x1F2E3D4C)
    heard = E.heard_of(7, 1_764_567_890_123)  # number 7, announced at that ms: 7 + 24 x (ms mod 2^16)
    assert heard == 7 + 24 * (1_764_567_890_123 % 65536) and heard != E.heard_of(7, 1_764_567_890_124)
    body = E.encode_ack_body({src: ([], [4]), "gw9": ([1], [])}, holds={"gw9": 30}, heard={src: heard})
    assert cbor2.loads(body) == [["gw1", 0x1F2E3D4C, [], [[4, 4]], None, heard], ["gw9", 0, [[1, 1]], [], 30]]
    ack = E.decode_ack_body(body, src)
    assert (ack.got, ack.hold_ms, ack.heard) == ([(4, 4)], None, heard)
    other = E.decode_ack_body(body, "gw9")
    assert (other.done, other.hold_ms, other.heard) == ([(1, 1)], 30, None)


def test_an_ack_of_a_billion_ids_is_two_integers_not_a_billion():
    """Defect: a 94-byte ack body expanded to 2**20 ids per entry, every entry (185 MB)."""
    import tracemalloc

    src = "gw1"
    entries = [[f"n{i}", 0, [[0, 2**40]], [[0, 2**40]]] for i in range(4)]
    body = cbor2.dumps([[src, 0, [[0, 2**40], [2**41, 2**42]], [[0, 2**40]]], *entries])
    tracemalloc.start()
    ack = E.decode_ack_body(body, src)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert ack.done == [(0, 2**40), (2**41, 2**42)] and E.runs_total(ack.got) == 2**40 + 1
    assert peak < 64 * 1024, peak
    assert E.in_runs([5, 2**40 + 1, 2**41 + 3, 2**43], ack.done) == [5, 2**41 + 3]


def test_a_report_in_a_gateway_body_costs_about_a_fifth_of_its_size_on_the_wire():
    from c2dtn.ip_gateway import bodies as session

    a, b = pair()
    body = session.pack(
        "bpub",
        "c2bridge-prt-gw",
        "10.79.3.5:1883",
        t="/PRT/PRT-UNIT001/PRT-S003/location",
        p=REPORT,
        q=1,
        r=False,
        x={},
    )
    e = env(body=body, supersede="mqtt:/PRT/PRT-UNIT001/PRT-S003/location", app="mqtt")
    sealed = a.map_bytes(e)
    (got,) = b.open_bundle(a.bundle([e]))
    assert got.body == body and got.compression == E.Compression.ZSTD_DICT2
    assert len(sealed) < 130, len(sealed)  # 309-byte body; was 258 sealed with the v1 dictionary
    # the supersession key travels as a digest: equal keys stay equal, different ones differ
    assert got.supersede == E.received_key(e.supersede) and len(got.supersede) == 13
    assert E.received_key("mqtt:/PRT/PRT-UNIT002/PRT-S003/location") != got.supersede
    assert E.wire_key("u1") == "u1" and E.received_key("u1") == "u1"
    assert len(E.wire_key(e.supersede)) == E.KEY_DIGEST_BYTES


def test_bodies_compressed_with_the_v1_dictionary_are_still_read():
    a, b = pair()
    v1 = E._dictionary(E.builtin_dictionary(1))
    kind, data = E._compress(REPORT, v1, E.Compression.ZSTD_DICT)
    m = {
        E.K_SEQ: 1,
        E.K_CREATED: 0,
        E.K_LIFETIME: 1000,
        E.K_BODY: data,
        E.K_COMPRESSION: int(kind),
    }
    assert kind == E.Compression.ZSTD_DICT and b.open_bundle(_seal_map(m))[0].body == REPORT


def test_a_large_body_is_compressed_only_when_a_sample_of_it_compresses(monkeypatch):
    import os

    a, b = pair()
    calls = []
    real = E._zstd

    def counting(level, zdict):
        c = real(level, zdict)

        class Seen:
            def compress(self, data):
                calls.append(len(data))
                return c.compress(data)

        return Seen()

    monkeypatch.setattr(E, "_zstd", counting)
    noise = os.urandom(E.SAMPLE_OVER)
    (got,) = b.open_bundle(a.bundle([env(body=noise)]))
    assert got.body == noise and got.compression == E.Compression.NONE
    assert calls == [E.SAMPLE_BYTES]  # the sample only, not the quarter megabyte
    calls.clear()
    text = REPORT * (E.SAMPLE_OVER // len(REPORT) + 1)
    sealed = a.bundle([env(body=text)])
    (got,) = b.open_bundle(sealed)
    assert got.body == text and got.compression == E.Compression.ZSTD and len(sealed) < len(text) // 20
    assert calls == [E.SAMPLE_BYTES, len(text)]


def test_a_send_number_travels_in_one_byte_and_a_map_without_one_is_still_read():
    a, b = pair()
    env = Envelope(Kind.DATA, "gw1", 7, "gw4", 1000, 60_000, body=b"x")
    sizes = {}
    for sn in (None, 0, 23):
        sealed = a.bundle([dataclasses.replace(env, sn=sn)])
        sizes[sn] = len(sealed)
        assert b.open_bundle(sealed)[0].sn == sn
    assert sizes[0] == sizes[23] == sizes[None] + 2  # the key and the number
    with pytest.raises(ValueError, match="send number 24"):
        a.bundle([dataclasses.replace(env, sn=24)])


# -- the container's stamp (container version 4, decision 0020) --------------------------------


def _stamped(a, envs, stamp):
    return a.bundle(envs, "gw4", stamp)


def test_a_stamped_bundle_carries_creation_times_and_incarnation_once_and_they_come_back():
    a, b = pair()
    inc = 0x1F2E3D4C
    t = 1_700_000_000_000
    # a fresh report, one from a second earlier, and a copy of one sealed an hour ago
    envs = [
        env(seq=7 + i, created_ms=t - back, inc=inc, supersede=f"u{i}") for i, back in enumerate((0, 1500, 3_600_000))
    ]
    stamp = (t // 1000 + 1, inc)
    payload = _stamped(a, envs, stamp)
    c = b.open_container(payload)
    assert c.stamp == stamp
    got = [b.open(c, m) for m in b.open_items(c)]
    assert [(g.created_ms, g.inc, g.seq) for g in got] == [(e.created_ms, e.inc, e.seq) for e in envs]
    # what the link carries: unstamped (as version 3 sealed them), a creation time costs 10
    # bytes and an incarnation 6, keys included; stamped, 3 to 5 and none, for 8 bytes more
    # in the container
    plain = a.bundle(envs, "gw4")
    print(f"\nthree reports: {len(plain)} bytes unstamped, {len(payload)} stamped")
    assert len(plain) - len(payload) >= 3 * 10 - 8


def test_an_ack_only_bundle_names_no_incarnation_and_costs_no_more_than_unstamped():
    a, b = pair()
    t = 1_700_000_000_400
    ack = Envelope(Kind.ACK, "gw1", 0, "gw4", t, 60_000, Priority.FLASH, body=E.encode_ack_body({"gw4/5": ([1], [])}))
    stamped = _stamped(a, [ack], (t // 1000, 0))
    assert len(stamped) <= len(a.bundle([ack], "gw4"))
    assert b.open_bundle(stamped)[0].created_ms == t


@pytest.mark.parametrize("field", [3, 4])
def test_a_changed_stamp_opens_no_envelope_of_the_bundle(field):
    """A relay or anyone on the path who shifts the base second (every creation time with it,
    hence lifetimes and what supersedes what) or the incarnation (message ids) breaks every tag."""
    a, b = pair()
    payload = _stamped(a, [env(inc=9), env(seq=8, inc=9, supersede="x")], (1_700_000_000, 9))
    obj = cbor2.loads(payload)
    obj[field] += 1
    c = b.open_container(cbor2.dumps(obj))
    with pytest.raises(E.BadTag):
        b.open_items(c)


def test_an_envelope_spliced_from_a_bundle_of_another_stamp_does_not_open():
    a, b = pair()
    one = cbor2.loads(_stamped(a, [env(inc=9)], (1_700_000_000, 9)))
    other = cbor2.loads(_stamped(a, [env(seq=30, inc=9)], (1_700_000_100, 9)))
    other[E.SEAL_AT] = one[E.SEAL_AT]
    with pytest.raises(E.BadTag):
        b.open_bundle(cbor2.dumps(other))


@pytest.mark.parametrize(
    "base, off, match",
    [
        (0, -1, "creation time -1 ms from base second 0"),
        (E.MAX_BASE_S, 1 << 40, "out of range"),
        (10, -(E.MAX_TIME_MS + 1), "out of range"),
    ],
)
def test_a_creation_time_outside_what_a_store_keeps_is_refused_naming_it(base, off, match):
    a, b = pair()
    m = {E.K_SEQ: 1, E.K_CREATED: off, E.K_LIFETIME_S: 60}
    with pytest.raises(E.Malformed, match=match):
        b.open_bundle(_seal_map(m, stamp=(base, 0)))


def test_an_envelope_of_another_incarnation_says_so_in_its_map():
    a, b = pair()
    stamp = (1_700_000_000, 9)
    got = b.open_bundle(_stamped(a, [env(inc=9), env(seq=8, inc=4, supersede="y")], stamp))
    assert [g.inc for g in got] == [9, 4]
    with pytest.raises(ValueError, match="stamp"):
        a.bundle([env()], stamp=(-1, 0))


def test_a_seal_of_millions_of_empty_maps_is_refused_before_they_are_decoded():
    """Finding of the attacker's review of decision 0023: a key holder's 8 MiB seal of empty maps
    was decoded whole (577 MB) before its envelope count was checked."""
    import tracemalloc

    a, b = pair()
    n = E.MAX_CONTAINER_BYTES - 64
    payload = a.container_of(E._array_header(n) + b"\xa0" * n, "gw4")
    tracemalloc.start()
    try:
        with pytest.raises(E.Oversize, match=f"{n} envelopes"):
            b.open_bundle(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(payload), peak  # the plaintext and its copy, not a dict per byte
    # at the bound, each map is decoded when it is opened, one at a time
    ok = a.container_of(E._array_header(E.MAX_ENVELOPES_PER_BUNDLE) + b"\xa0" * E.MAX_ENVELOPES_PER_BUNDLE, "gw4")
    c = b.open_container(ok)
    items = b.open_items(c)
    assert len(items) == E.MAX_ENVELOPES_PER_BUNDLE and all(m == b"\xa0" for m in items)


def test_an_envelope_map_is_bounded_in_entries_size_and_app_name():
    """Finding of the same review: one map could take the whole 8 MiB container, and an app name
    of megabytes was stored and handed out."""
    a, b = pair()
    many = {3: 1, 4: 1, 15: 1} | {100 + i: 0 for i in range(E.MAP_ENTRIES_MAX)}
    with pytest.raises(E.Malformed, match="more than"):
        b.open_bundle(_seal_map(many))
    with pytest.raises(E.Oversize, match="envelope of"):
        b.open_bundle(_seal_map({3: 1, 4: 1, 15: 1, 99: "x" * E.MAX_ENVELOPE_BYTES}))
    with pytest.raises(E.Malformed, match="over 64 bytes"):
        b.open_bundle(_seal_map({3: 1, 4: 1, 15: 1, 11: "a" * 65}))
    assert b.open_bundle(_seal_map({3: 1, 4: 1, 15: 1, 11: "a" * 64}))[0].app == "a" * 64


# -- a data envelope's seq and send number follow from the one before it (decision 0026) -------


def _opened(b: Codec, payload: bytes) -> list:
    """Each map of a bundle opened in order: its envelope, or the error that refused it."""
    c = b.open_container(payload)
    out = []
    for m in b.open_items(c):
        try:
            out.append(b.open(c, m))
        except E.EnvelopeError as e:
            out.append(e)
    return out


def test_only_the_first_data_envelope_of_a_run_names_its_seq_and_send_number():
    a, b = pair()
    envs = [env(seq=s, sn=n, supersede=f"u{s}") for s, n in ((7, 22), (8, 23), (9, 0), (12, 1), (13, 5))]
    maps, after = [], None
    for e in envs:
        maps.append(cbor2.loads(a.map_bytes(e, after=after)))
        after = (e.seq, e.sn)
    said = [(E.K_SEQ in m, E.K_SN in m) for m in maps]
    # 8 and 9 follow (the send number wraps at 24); 12 skips seqs; 13's send number skips
    assert said == [(True, True), (False, False), (False, False), (True, False), (False, True)]
    got = b.open_bundle(a.bundle(envs))
    assert [(g.seq, g.sn) for g in got] == [(e.seq, e.sn) for e in envs]
    assert [g.body for g in got] == [e.body for e in envs]
    whole = sum(len(a.map_bytes(e)) for e in envs)
    print(f"5 maps: {sum(len(a.map_bytes(e, after=(e.seq - 1, (e.sn - 1) % 24))) for e in envs)} B chained, {whole} B")


def test_an_ack_between_data_envelopes_leaves_their_run_as_it_was():
    a, b = pair()
    ack = env(kind=E.Kind.ACK, seq=0, body=E.encode_ack_body({"gw4": ([3], [])}), supersede=None, cseq=0, floor=0)
    first, second = env(seq=7, sn=3), env(seq=8, sn=4, supersede="other")
    maps = [a.map_bytes(first), a.map_bytes(ack, after=(7, 3)), a.map_bytes(second, after=(7, 3))]
    assert E.K_SEQ in cbor2.loads(maps[1]) and E.K_SEQ not in cbor2.loads(maps[2])
    got = _opened(b, a.container(maps, "gw4"))
    assert [(g.kind, g.seq, g.sn) for g in got] == [(Kind.DATA, 7, 3), (Kind.ACK, 0, None), (Kind.DATA, 8, 4)]


def test_after_a_map_refused_before_its_seq_is_known_nothing_that_leaves_it_out_opens():
    """A map refused before its seq was read (a seq of the wrong type, a wrong kind, a seq out of range)
    leaves no seq to follow: a map leaving its own out after it is refused, not given a guess;
    one naming its seq opens as before."""
    a, b = pair()
    follows = a.map_bytes(env(seq=9, sn=5), after=(8, 4))
    names = a.map_bytes(env(seq=10, sn=6, supersede="x"))
    many = cbor2.dumps({E.K_SEQ: 8, **{k: 0 for k in range(100, 100 + E.MAP_ENTRIES_MAX)}})  # (found by review:
    huge = cbor2.dumps({E.K_SEQ: 8, E.K_BODY: bytes(E.MAX_ENVELOPE_BYTES)})  # refused before _from_map reads it)
    for bad in (
        cbor2.dumps({E.K_SEQ: "8"}),
        cbor2.dumps({E.K_KIND: 9, E.K_SEQ: 8}),
        cbor2.dumps({E.K_SEQ: -1}),
        many,
        huge,
    ):
        got = _opened(b, a.container([a.map_bytes(env(seq=7, sn=3)), bad, follows, names], "gw4"))
        assert got[0].seq == 7 and isinstance(got[1], (E.Malformed, E.Oversize))
        assert isinstance(got[2], E.Malformed) and "after one that was refused" in str(got[2])
        assert got[3].seq == 10


def test_a_delta_refused_for_its_reference_still_gives_its_seq_to_the_next():
    """After a restart the receiver refuses deltas (no reference) but their seqs are read: the
    envelopes after them in the bundle open with the right seqs, and are not lost with them."""
    a, b = pair()
    whole = env(seq=1, sn=0, body=REPORT)
    b.open_bundle(a.bundle([whole], delta=True))
    a.acked("gw4", [1])
    restarted = Codec("gw4", dict(b.keys))
    delta, next_ = env(seq=2, sn=1), env(seq=3, sn=2, supersede="other", body=b"order")
    got = _opened(restarted, a.bundle([delta, next_], delta=True))
    assert isinstance(got[0], E.NoReference)
    assert (got[1].seq, got[1].sn, got[1].body) == (3, 2, b"order")


def test_a_chain_that_starts_without_a_seq_or_runs_past_the_largest_is_refused():
    a, b = pair()
    m = cbor2.loads(a.map_bytes(env(seq=8, sn=2), after=(7, 1)))
    with pytest.raises(E.Malformed, match="lacks seq"):  # the first data map of a bundle
        b.open_bundle(a.container([cbor2.dumps(m)], "gw4"))
    top = a.map_bytes(env(seq=E.MAX_SEQ, sn=1))
    with pytest.raises(E.Malformed, match="one on from the one before it, is over"):
        b.open_bundle(a.container([top, cbor2.dumps(m)], "gw4"))
    with pytest.raises(ValueError, match="without a send number after one with"):
        a.map_bytes(env(seq=9, sn=None), after=(8, 2))


def test_a_map_made_to_follow_another_opens_a_bundle_of_its_own_with_its_seq_said():
    a, b = pair()
    e = env(seq=8, sn=2)
    first = Codec.first_map(a.map_bytes(e, after=(7, 1)), e)
    (got,) = b.open_bundle(a.container([first], "gw4"))
    assert (got.seq, got.sn, got.body) == (8, 2, REPORT)


@pytest.mark.parametrize("inc", [0, 5])
def test_a_map_sent_again_under_another_stamp_opens_as_the_same_envelope(inc):
    """A copy (decision 0042): a map sealed after another under one stamp, put first in a later
    bundle whose stamp has another base second and, in an ack-only bundle, no incarnation,
    opens as the same envelope: seq, send number, creation time, incarnation and body."""
    a, b = pair()
    e = env(seq=8, sn=2, inc=5, created_ms=1_700_000_000_900)
    sealed = a.map_bytes(e, after=(7, 1), stamp=(1_700_000_000, 5))
    (got,) = b.open_bundle(a.container([Codec.restamp(sealed, e, (1_700_000_001, inc))], "gw4", (1_700_000_001, inc)))
    assert (got.seq, got.sn, got.created_ms, got.inc, got.body) == (8, 2, e.created_ms, 5, REPORT)
