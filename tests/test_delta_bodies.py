"""Delta bodies (decision 0013): a report goes compressed against the newest of its key the
destination acked, and so does its first retransmission (decision 0040); a receiver that lacks
that one refuses it unacked, and the second retransmission goes whole."""

import dataclasses

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c2dtn.overlay import envelope as E
from c2dtn.overlay.envelope import Codec, Envelope, Kind, Priority

KEY = b"s" * 32


def _report(k: int) -> bytes:
    return (
        b'{"type": "Feature", "geometry": {"type": "Point", "coordinates": [59.9%05d, 10.7%05d, 0]}, '
        b'"properties": {"country": "NOR", "unit": "NOR-UNIT003", "node_id": "NOR-S003", '
        b'"msg_id": "NOR-S003_%d", "timestamp": %d}}' % (31 * k % 99991, 17 * k % 99991, k, 1795833889591 + 2000 * k)
    )


def _env(k: int, key: str = "mqtt:/NOR/NOR-UNIT003/NOR-S003/location", dst: str = "gw4") -> Envelope:
    return Envelope(Kind.DATA, "gw1", k, dst, 1_800_000_000_000, 60_000, Priority.ROUTINE, key, _report(k), inc=9)


def test_a_report_goes_against_the_one_acked_before_it_and_opens_the_same():
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    whole, delta = [], []
    for k in range(1, 11):
        s = gw1.bundle([_env(k)], delta=True)
        got = gw4.open_bundle(s)[0]
        assert got.body == _report(k) and got.supersede == E.received_key(_env(k).supersede)
        (delta if got.compression in E.DELTAS else whole).append(len(s))
        gw1.acked("gw4", [k])
    assert len(whole) == 1  # the first: nothing acked before it
    print(f"sealed report: whole {whole[0]} B, against the one acked before {sorted(delta)[4]} B (median)")
    assert sorted(delta)[len(delta) // 2] < whole[0] - 5  # (a bare report; a gateway body saves more)


def test_nothing_acked_nothing_referred_to_and_a_resend_goes_whole():
    gw1 = Codec("gw1", {"gw4": KEY})
    gw1.bundle([_env(1)], delta=True)
    assert cbor2.loads(gw1.map_bytes(_env(2), delta=True)).get(E.K_REF) is None  # 1 not acked yet
    gw1.acked("gw4", [1])
    assert cbor2.loads(gw1.map_bytes(_env(3), delta=True))[E.K_REF] == 2  # seq 1, two back from 3
    assert E.K_REF not in cbor2.loads(gw1.map_bytes(_env(3), delta=False))  # a retransmission
    # another key, another destination: not referred to
    assert E.K_REF not in cbor2.loads(gw1.map_bytes(_env(4, key="mqtt:/NOR/other/location"), delta=True))


def test_a_delta_leaves_out_what_its_reference_says_and_opens_with_it():
    """Decision 0022: a delta's key is its reference's, and its lifetime, priority and app are
    written only where they differ from the reference's."""
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    first = dataclasses.replace(_env(1), priority=Priority.PRIORITY, app="mqtt")
    gw4.open_bundle(gw1.bundle([first], delta=True))
    gw1.acked("gw4", [1])
    same = dataclasses.replace(_env(2), priority=Priority.PRIORITY, app="mqtt")
    m = cbor2.loads(gw1.map_bytes(same, delta=True))
    assert m[E.K_REF] == 1 and not {E.K_SUPERSEDE, E.K_LIFETIME_S, E.K_LIFETIME, E.K_PRIORITY, E.K_APP} & set(m)
    whole = cbor2.loads(gw1.map_bytes(same, delta=False))  # a resend names them all
    assert {E.K_SUPERSEDE, E.K_LIFETIME_S, E.K_PRIORITY, E.K_APP} <= set(whole)
    got = gw4.open_bundle(gw1.bundle([dataclasses.replace(same, seq=3)], delta=True))[0]
    assert got.compression in E.DELTAS
    assert (got.supersede, got.lifetime_ms, got.priority, got.app) == (
        E.received_key(same.supersede),
        60_000,
        Priority.PRIORITY,
        "mqtt",
    )
    # what differs from the reference travels, the default included
    other = dataclasses.replace(_env(4), lifetime_ms=90_500, priority=Priority.ROUTINE, app="")
    m = cbor2.loads(gw1.map_bytes(other, delta=True))
    assert (m[E.K_LIFETIME], m[E.K_PRIORITY], m[E.K_APP]) == (
        90_500,
        int(Priority.ROUTINE),
        "",
    ) and E.K_SUPERSEDE not in m
    got = gw4.open_bundle(gw1.bundle([dataclasses.replace(other, seq=5)], delta=True))[0]
    assert (got.lifetime_ms, got.priority, got.app) == (90_500, Priority.ROUTINE, "")
    assert got.supersede == E.received_key(same.supersede)


def test_a_delta_for_a_seq_held_under_no_key_is_not_opened():
    """A reference the receiver holds under another stream (another incarnation, destination
    or sender) gives no key: the delta is refused unacked, its resend goes whole."""
    gw1, gw4 = Codec("gw1", {"gw4": KEY, "gw7": KEY}), Codec("gw4", {"gw1": KEY, "gw7": KEY})
    gw7 = Codec("gw7", {"gw4": KEY})
    gw4.open_bundle(gw7.bundle([dataclasses.replace(_env(1), origin="gw7")], delta=True))  # gw7's seq 1
    gw1.bundle([_env(1)], delta=True)  # gw1's seq 1, lost on the way
    gw1.acked("gw4", [1])
    with pytest.raises(E.NoReference, match="envelope 1"):
        gw4.open_bundle(gw1.bundle([_env(2)], delta=True))


def test_a_receiver_without_the_reference_refuses_it_and_takes_the_resend():
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    gw4.open_bundle(gw1.bundle([_env(1)], delta=True))
    gw1.acked("gw4", [1])
    restarted = Codec("gw4", {"gw1": KEY})  # (its references were in memory)
    with pytest.raises(E.NoReference, match="envelope 1"):
        restarted.open_bundle(gw1.bundle([_env(2)], delta=True))
    assert restarted.open_bundle(gw1.bundle([_env(2)], delta=False))[0].body == _report(2)
    # and it is a reference from then on
    gw1.acked("gw4", [2])
    assert restarted.open_bundle(gw1.bundle([_env(3)], delta=True))[0].compression in E.DELTAS


def test_another_incarnation_or_key_is_not_a_reference():
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    gw4.open_bundle(gw1.bundle([_env(1)], delta=True))
    gw1.acked("gw4", [1])
    m = cbor2.loads(gw1.map_bytes(_env(2), delta=True))
    m[E.K_INC] = 10  # the sender's store was lost: its ids (and references) start again
    with pytest.raises(E.NoReference):
        gw4.open_bundle(gw1.container([cbor2.dumps(m)], "gw4"))
    m[E.K_INC] = 9
    m[E.K_SUPERSEDE] = "other"  # a delta's key is its reference's: naming one is refused
    with pytest.raises(E.Malformed, match="with a supersession key"):
        gw4.open_bundle(gw1.container([cbor2.dumps(m)], "gw4"))


@pytest.mark.parametrize(
    "change, match",
    [
        ({E.K_REF: None, E.K_COMPRESSION: int(E.Compression.EDITS)}, "without its reference"),
        ({E.K_REF: None, E.K_COMPRESSION: int(E.Compression.DELTA2)}, "without its reference"),
        ({E.K_SUPERSEDE: "NOR"}, "with a supersession key"),
        ({E.K_COMPRESSION: int(E.Compression.ZSTD)}, "not a delta"),
        ({E.K_REF: "one"}, "reference has the wrong type"),
        ({E.K_REF: 0}, "0 seqs back"),
        ({E.K_REF: 3}, "3 seqs back from seq 2"),
    ],
)
def test_malformed_delta_bodies_name_the_problem(change, match):
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    gw4.open_bundle(gw1.bundle([_env(1)], delta=True))
    gw1.acked("gw4", [1])
    m = cbor2.loads(gw1.map_bytes(_env(2), delta=True))
    for k, v in change.items():
        if v is None:
            del m[k]
        else:
            m[k] = v
    with pytest.raises(E.Malformed, match=match):
        gw4.open_bundle(gw1.container([cbor2.dumps(m)], "gw4"))


def test_what_each_end_keeps_is_bounded():
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    body = bytes(range(256)) * 16  # 4 kB, the most kept per body
    n = 3 * E.DELTA_BYTES_MAX // len(body)
    for k in range(1, n + 1):
        e = Envelope(Kind.DATA, "gw1", k, "gw4", 0, 60_000, Priority.ROUTINE, f"key{k}", body, inc=9)
        gw4.open_bundle(gw1.bundle([e], delta=True))
        gw1.acked("gw4", [k])
    for refs in (gw1._acked, gw4._came["gw1"]):
        assert refs.nbytes <= E.DELTA_BYTES_MAX
        held = [v for seqs in refs.by_key.values() for v in seqs.values()]
        charged = sum(len(body) + len(meta[2]) + E.DELTA_ENTRY_BYTES for body, meta in held)
        keys_and_streams = list(refs.by_key) + list(refs.at)
        assert refs.nbytes == charged + sum(sum(map(len, k)) + E.DELTA_ENTRY_BYTES for k in keys_and_streams)
        assert sum(map(len, refs.at.values())) == len(held)  # the index of seqs holds what is kept, no more
    assert len(gw1._sealed) <= E.DELTA_PENDING_MAX
    # the newest keys are the ones kept
    assert (("gw4", f"key{n}")) in gw1._acked.by_key and ("gw4", "key1") not in gw1._acked.by_key


def test_a_group_goes_against_what_every_member_took():
    members = {"fmn": ("gw4", "gw7")}
    gw1 = Codec("gw1", {"gw4": KEY, "gw7": KEY, "fmn": KEY}, members)
    gw1.bundle([_env(1, dst="fmn")], delta=True)
    assert E.K_REF not in cbor2.loads(gw1.map_bytes(_env(2, dst="fmn"), delta=True))  # nobody took 1 yet
    gw1.acked("gw4", [1])  # a member's own ack is not the group's: the scheduler says when all took it
    assert E.K_REF not in cbor2.loads(gw1.map_bytes(_env(2, dst="fmn"), delta=True))
    gw1.acked("fmn", [1])
    assert cbor2.loads(gw1.map_bytes(_env(3, dst="fmn"), delta=True))[E.K_REF] == 2


def test_no_reference_older_than_the_receivers_keep():
    """A reference acked late (a group's last "done", or an ack delayed past many reports) is
    not used once more bodies of its key were sealed after it than a receiver keeps."""
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    for k in range(1, 11):
        gw4.open_bundle(gw1.bundle([_env(k)], delta=True))
    gw1.acked("gw4", [1])  # nine newer bodies went since: gw4 kept the 8 newest
    got = gw4.open_bundle(gw1.bundle([_env(11)], delta=True))[0]
    assert got.body == _report(11) and got.compression not in E.DELTAS
    gw1.acked("gw4", [9])  # two newer since 9: still held
    assert gw4.open_bundle(gw1.bundle([_env(12)], delta=True))[0].compression in E.DELTAS


# -- on the virtual radio (perf/radio_sim.py: two cores, the emulator's channel, virtual time) --


def test_on_the_radio_delta_bodies_cost_less_and_every_report_still_arrives(monkeypatch):
    from c2dtn.perf import radio_sim

    with_delta = radio_sim.reports(11, minutes=1.0)
    monkeypatch.setattr(E, "DELTA_MAX_BODY", 0)  # no body is kept as a reference: all go whole
    whole = radio_sim.reports(11, minutes=1.0)
    print(
        f"link bytes per delivered report: {with_delta['bytes_per_report']:.0f} against {whole['bytes_per_report']:.0f}"
    )
    assert with_delta["bytes_per_report"] < 0.9 * whole["bytes_per_report"]
    for r in (with_delta, whole):
        # every unit's newest report arrives (older ones may be superseded)
        assert r["newest_delivered"] == r["units"], r


def test_a_receiver_that_lost_its_references_takes_every_report_whole_again():
    """gw4 restarts mid-run with no references (they are kept in memory): the deltas that
    follow are refused unacked, and their retransmissions go whole (the second: the first is a
    delta too)."""
    from c2dtn.perf import radio_sim

    r = radio_sim.Radio(radio_sim.profile(), 5)
    gw1 = r.cores["gw1"]
    sent = []
    for k in range(1, 61):  # 2 units, a report each every second, a minute
        r.step(k * 1000)
        for u in (1, 2):
            sent.append(gw1.submit("gw4", _report(100 * u + k), k * 1000, 600_000, Priority.ROUTINE, supersede=f"u{u}"))
        if k == 30:
            core = r.cores["gw4"]
            core.codec = core.sched.codec = Codec("gw4", dict(core.codec.keys))
    r.step(120_000)
    got = {d.seq for _, d in r.delivered["gw4"]}
    assert {sent[-1], sent[-2]} <= got  # the newest of each unit arrived
    assert not gw1.store.has_pending({"gw4"})  # nothing left unacked
    assert len(got) > 40
    refused = r.cores["gw4"].store.count("rejected:no-reference")
    print(f"{refused} deltas refused after the restart; then whole reports, and deltas again")
    assert 0 < refused <= 2 * E.DELTA_OPEN_MAX  # per unit: the deltas under way, then a whole one


@pytest.mark.parametrize("restarted", [False, True])
def test_a_lost_reports_first_resend_goes_as_a_delta_where_the_receiver_took_a_later_one(restarted):
    """Decision 0040: a report whose frame was lost goes again as a delta once its receiver took
    a delta sent after it (its references are still there), at a delta's cost on the radio; the
    second resend goes whole.  A receiver that restarted (its references live in memory) refuses
    deltas unacked and cannot say so: nothing proves its references, and the first resend goes
    whole, as every resend did before."""
    from c2dtn.overlay.core import OverlayCore
    from c2dtn.overlay.custody import Custody, Quota
    from c2dtn.overlay.scheduler import SchedulerConfig
    from c2dtn.overlay.store import open_store

    cfg = SchedulerConfig(linger_ms=0, ack_delay_ms=100, min_rto_ms=1000, initial_rto_ms=1000)
    gw1, gw4 = (
        OverlayCore(Custody(open_store("memory"), a, Quota()), Codec(a, {b: KEY}), cfg)
        for a, b in (("gw1", "gw4"), ("gw4", "gw1"))
    )
    keys = {u: f"mqtt:/NOR/NOR-UNIT00{u}/NOR-S00{u}/location" for u in (1, 2)}
    plan = {0: [(1, 1), (2, 1)], 1000: [(1, 2)], 1200: [(2, 2)]}  # ms -> (unit, report)
    seqs: dict[tuple[int, int], int] = {}
    sendings: list[tuple[bool, int]] = []  # unit 1's second report's: (a delta?, sealed bytes)
    delivered: list[int] = []
    flight: list[tuple[int, OverlayCore, bytes]] = []
    for t in range(0, 30_000, 10):
        if restarted and t == 900:  # both first reports arrived and were acked: references, lost
            gw4.codec = gw4.sched.codec = Codec("gw4", {"gw1": KEY})
        for u, k in plan.get(t, []):
            seqs[(u, k)] = gw1.submit("gw4", _report(10 * u + k), t, 600_000, Priority.PRIORITY, supersede=keys[u])
        for b in gw1.poll(t):
            if seqs.get((1, 2)) in b.seqs:
                try:
                    Codec("gw4", {"gw1": KEY}).open_bundle(b.payload)  # no references: a delta is refused
                    sendings.append((False, len(b.payload)))
                except E.NoReference:
                    sendings.append((True, len(b.payload)))
                if not restarted and len(sendings) <= 2:
                    continue  # the first sending and the first resend are lost on the way
            flight.append((t + 100, gw4, b.payload))
        for b in gw4.poll(t):
            flight.append((t + 100, gw1, b.payload))
        for due in [f for f in flight if f[0] <= t]:
            flight.remove(due)
            due[1].on_bundle(due[2], t)
        items = gw4.take()
        delivered += [d.seq for d in items]
        gw4.consumed([d.id for d in items], t)
        if len(seqs) == 4 and set(seqs.values()) <= set(delivered) and not gw1.store.has_pending({"gw4"}):
            break
    print(f"unit 1's second report's sendings (a delta?, sealed bytes): {sendings}")
    if restarted:
        assert [d for d, _ in sendings] == [True, False]  # refused, then whole
    else:
        assert [d for d, _ in sendings] == [True, True, False]
        assert sendings[1][1] < sendings[2][1] - 20  # the delta resend is much smaller than the whole one
    assert sorted(delivered) == sorted(seqs.values())  # and every report arrives


def test_a_members_ack_of_a_copy_that_once_went_whole_proves_nothing_of_its_references():
    """Found by review (decision 0040): an ack does not say which copy it answers.  gw4 restarted
    after report 2 and takes only whole bodies from then on; report 23 went whole, then again
    as a delta, and gw4 acked it (the whole copy).  That must not count as gw4 taking a delta:
    it would renew gw4's place in the group's window at every such report, and resends to the
    group would go as deltas gw4 refuses.  Only one that went as a delta every time counts."""
    members = {"fmn": ("gw4", "gw7")}
    gw1 = Codec("gw1", {"gw4": KEY, "gw7": KEY, "fmn": KEY}, members)
    other = "mqtt:/NOR/other/location"

    def seal(seq: int, delta: bool = True, key: str = _env(1).supersede) -> bool:
        m = cbor2.loads(gw1.map_bytes(dataclasses.replace(_env(seq, dst="fmn"), supersede=key), delta=delta))
        return E.K_REF in m  # went as a delta

    def took(member: str, seq: int) -> None:
        gw1.took("fmn", member, [seq])

    for seq in (1, 2):  # 1 whole (nothing acked), 2 a delta; both members take both
        seal(seq)
        took("gw4", seq), took("gw7", seq)
        gw1.acked("fmn", [seq])
    for seq in range(3, 23):  # 20 reports of another key, whole; gw4 has restarted meanwhile
        assert not seal(seq, key=other)
        took("gw7", seq)
    assert not seal(23, delta=False) and seal(23)  # whole, then as a delta
    took("gw4", 23), took("gw7", 23)
    assert seal(24) and seal(25)  # 24 is lost; gw7 takes 25, a delta sealed after it
    took("gw7", 25)
    assert not gw1.references_held("fmn", 24)  # gw4 took no delta for 20 sealings: 24 goes whole
    took("gw4", 25)  # (were gw4 to take 25, it would hold its references)
    assert gw1.references_held("fmn", 24)


def test_empty_bodies_under_many_keys_fill_the_budget_too():
    """Found by review: bodies of 0 bytes under fresh keys were charged nothing (24 MB for 50,000)."""
    import tracemalloc

    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    tracemalloc.start()
    for i in range(20_000):
        m = {E.K_SEQ: i, E.K_CREATED: 0, E.K_LIFETIME_S: 0, E.K_SUPERSEDE: i.to_bytes(9, "big"), E.K_INC: 1}
        gw4.open_bundle(gw1.container([cbor2.dumps(m)], "gw4"))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert gw4._came["gw1"].nbytes <= E.DELTA_BYTES_MAX
    assert held < 4 * E.DELTA_BYTES_MAX, held


def test_one_peer_cannot_push_out_anothers_references():
    """Found by review: one budget for all peers let a member's 34 kB bundle of compressible
    bodies flush every other sender's references."""
    import os

    mal_key = b"m" * 32
    gw1, mal = Codec("gw1", {"gw4": KEY}), Codec("mal", {"gw4": mal_key})
    gw4 = Codec("gw4", {"gw1": KEY, "mal": mal_key})
    gw4.open_bundle(gw1.bundle([_env(1)], delta=True))
    gw1.acked("gw4", [1])
    for i in range(2 * E.DELTA_BYTES_MAX // 4096):
        m = {E.K_SEQ: i + 1, E.K_CREATED: 0, E.K_LIFETIME_S: 0, E.K_SUPERSEDE: i.to_bytes(9, "big")}
        m[E.K_BODY] = os.urandom(4096)
        gw4.open_bundle(mal.container([cbor2.dumps(m)], "gw4"))
    assert gw4.open_bundle(gw1.bundle([_env(2)], delta=True))[0].compression in E.DELTAS


def test_a_seq_reused_with_another_body_is_refused_not_decoded_wrong():
    """Found by review: a store put back from a copy reuses seqs under the same incarnation; the
    next delta was decoded against the old body of its reference and delivered wrong."""
    before, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    for k in range(1, 11):
        gw4.open_bundle(before.bundle([dataclasses.replace(_env(k), body=_report(1000 + k))], delta=True))
        before.acked("gw4", [k])
    restored = Codec("gw1", {"gw4": KEY})  # same incarnation, seq 10 again with another body
    gw4.open_bundle(restored.bundle([dataclasses.replace(_env(10), body=_report(5010))], delta=True))
    restored.acked("gw4", [10])
    with pytest.raises(E.NoReference):
        gw4.open_bundle(restored.bundle([dataclasses.replace(_env(11), body=_report(5011))], delta=True))
    # and where the receiver holds a different body under the very seq referred to, the frame's
    # checksum refuses it
    other = Codec("gw4", {"gw1": KEY})
    other.open_bundle(before.bundle([dataclasses.replace(_env(10), body=_report(1010))], delta=False))
    with pytest.raises(E.NoReference, match="does not decode"):
        other.open_bundle(restored.bundle([dataclasses.replace(_env(11), body=_report(5011))], delta=True))


@pytest.mark.parametrize(
    "field, value, match",
    [
        (E.K_SEQ, (1 << 64) - 1, "seq"),
        (E.K_CREATED, (1 << 64) - 1, "creation time"),
        (E.K_LIFETIME, (1 << 64) - 1, "lifetime"),
        (E.K_CSEQ, (1 << 64) - 1, "cseq"),
        (E.K_FLOOR_BACK, -1, "floor back"),
        (E.K_SUPERSEDE, "a" * 10, "up to 9 bytes"),
    ],
)
def test_out_of_range_fields_are_refused_naming_them(field, value, match):
    """Found by review: integers past 64 bits reached the SQLite store (OverflowError)."""
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    m = {E.K_SEQ: 5, E.K_CREATED: 0, E.K_LIFETIME_S: 60, E.K_CSEQ: 3, field: value}
    with pytest.raises(E.Malformed, match=match):
        gw4.open_bundle(gw1.container([cbor2.dumps(m)], "gw4"))


# -- the frame without magic number and content size (DELTA2) -----------------------------


def test_a_delta_frame_leaves_out_zstds_magic_number_and_content_size_and_the_old_form_still_opens():
    import zstandard

    ref, body = _report(1), _report(2)
    new = E._delta(body, ref)
    old = zstandard.ZstdCompressor(
        level=19, dict_data=E._raw_dict(ref), write_checksum=True, write_content_size=True, write_dict_id=False
    ).compress(body)
    assert len(new) <= len(old) - 4  # the magic number alone is 4 bytes
    assert E._decompress(E.Compression.DELTA2, new, {}, ref=ref) == body
    assert E._decompress(E.Compression.DELTA, old, {}, ref=ref) == body  # (sent before: still read)
    with pytest.raises(E.Malformed, match="against its reference"):  # the checksum: another reference
        E._decompress(E.Compression.DELTA2, new, {}, ref=bytes(len(ref)))


@pytest.mark.parametrize("budget", [E.DELTA_MAX_BODY, 500])
def test_a_delta_that_would_inflate_past_what_a_delta_may_be_is_refused_by_its_limit(budget):
    """A forged delta frame with no content size: decoding stops at the smaller of the bundle's
    budget and DELTA_MAX_BODY, however far it would inflate."""
    import time

    import zstandard

    params = zstandard.ZstdCompressionParameters.from_level(
        3,
        format=zstandard.FORMAT_ZSTD1_MAGICLESS,
        write_content_size=0,
        write_checksum=1,
        window_log=E.DELTA_WINDOW_LOG,
    )
    bomb = zstandard.ZstdCompressor(compression_params=params).compress(b"\0" * (64 << 20))
    t = time.perf_counter()
    with pytest.raises(E.Malformed, match=f"at most {min(budget, E.DELTA_MAX_BODY)} bytes"):
        E._decompress(E.Compression.DELTA2, bomb, {}, budget=budget, ref=b"r" * 100)
    assert time.perf_counter() - t < 0.5
    big_window = bytearray(E._delta(_report(2), _report(1)))
    big_window[1] = 0xF8  # the window descriptor: 2 GB of look-back
    with pytest.raises(E.Malformed):
        E._decompress(E.Compression.DELTA2, bytes(big_window), {}, ref=_report(1))


def _magicless(body: bytes, ref: bytes | None = None, **kw) -> bytes:
    import zstandard

    params = zstandard.ZstdCompressionParameters.from_level(
        1, format=zstandard.FORMAT_ZSTD1_MAGICLESS, window_log=E.DELTA_WINDOW_LOG, **kw
    )
    return zstandard.ZstdCompressor(compression_params=params, dict_data=E._raw_dict(ref) if ref else None).compress(
        body
    )


def test_a_delta_frame_that_declares_its_size_is_refused_before_it_is_decoded():
    """python-zstandard sizes its output by a declared content size and ignores the limit: a
    peer's frame declaring 200 MB (or 2**45 bytes) is refused as not the frame a sender writes,
    in microseconds, and reaches no allocation."""
    import time

    ref = _report(1)
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    gw4.open_bundle(gw1.bundle([_env(1)]))
    gw1.acked("gw4", [1])
    m = cbor2.loads(gw1.map_bytes(_env(2), delta=True))
    assert E.K_REF in m
    m[E.K_COMPRESSION] = int(E.Compression.DELTA2)  # (a report's delta goes as EDITS: a zstd frame here)
    m[E.K_BODY] = _magicless(b"A" * (200 << 20), ref, write_checksum=1, write_content_size=1)
    c = gw4.open_container(gw1.container([cbor2.dumps(m)], "gw4"))
    (item,) = gw4.open_items(c)
    t = time.perf_counter()
    with pytest.raises(E.EnvelopeError, match="content size"):
        gw4.open(c, item)
    assert time.perf_counter() - t < 0.05
    huge = bytes([0xC4, 0x20]) + (1 << 45).to_bytes(8, "little") + b"\x01\x00\x00\0\0\0\0"
    with pytest.raises(E.Malformed, match="content size"):
        E._decompress(E.Compression.DELTA2, huge, {}, budget=500, ref=ref)


@pytest.mark.parametrize(
    "tail, why", [(b"junk", "bytes after it"), ("twice", "bytes after it"), (-3, "cut short"), (-20, "cut short")]
)
def test_a_delta_frame_with_bytes_after_it_or_cut_short_is_refused(tail, why):
    d = E._delta(_report(2), _report(1))
    data = d + (d if tail == "twice" else tail) if not isinstance(tail, int) else d[:tail]
    with pytest.raises(E.Malformed, match=why):
        E._decompress(E.Compression.DELTA2, data, {}, ref=_report(1))


@pytest.mark.parametrize("budget", [0, -5])
@pytest.mark.parametrize("kind", [E.Compression.ZSTD, E.Compression.DELTA2])
def test_a_compressed_body_where_the_bundle_may_open_to_nothing_more_is_oversize(kind, budget):
    """zstandard reads a max_output_size of 0 as no limit: a bundle whose plain budget is spent
    must refuse any compressed body before decoding it (a frame without a content size would
    inflate unbounded)."""
    body = _magicless(b"A" * 100000, write_checksum=1, write_content_size=0) if kind == E.Compression.DELTA2 else None
    if body is None:
        import zstandard

        body = zstandard.ZstdCompressor(write_content_size=False).compress(b"A" * 100000)
    with pytest.raises(E.Oversize):
        E._decompress(kind, body, {}, budget=budget, ref=b"r" * 10)


def test_every_delta_a_sender_writes_passes_the_receivers_frame_check():
    """Bodies and references up to DELTA_MAX_BODY, random, structured and edited copies: what
    _delta writes, _decompress takes back exactly (the frame check refuses none of them)."""
    import random

    rng = random.Random(7)
    n = E.DELTA_MAX_BODY
    cases = [(rng.randbytes(n), rng.randbytes(n)), (b"\0" * n, b"\0" * n), (_report(1) * 18, _report(2) * 18)]
    for _ in range(40):
        ref = rng.choice([rng.randbytes(rng.randint(1, n)), _report(rng.randint(1, 99)) * rng.randint(1, 18)])[:n]
        body = bytearray(ref[: rng.randint(48, len(ref))] if len(ref) >= 48 else ref + b"x" * 48)
        for _ in range(rng.randint(0, 20)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        cases.append((ref, bytes(body)))
    for ref, body in cases:
        assert E._decompress(E.Compression.DELTA2, E._delta(body, ref), {}, ref=ref) == body


def test_a_reused_seq_held_as_another_message_is_not_a_delta_s_reference():
    """A store put back from a copy reuses seqs; a relay replays the old bundle after the
    receiver dropped both: the receiver then holds the old message at the seq a delta refers
    to. The delta names neither key nor priority (decision 0022), so it must not open against
    it (and take that message's key, priority and lifetime): it is refused unacked."""
    body = b'{"type":"Feature","geometry":{"type":"Point","coordinates":[59.91,10.71,0]},"properties":{"status":"ok"}}'

    def env(seq, key, prio, b=body, life=60_000):
        return Envelope(Kind.DATA, "gw1", seq, "gw4", 1_800_000_000_000, life, prio, key, b, "mqtt", inc=9)

    rcv = Codec("gw4", {"gw1": KEY})
    old = Codec("gw1", {"gw4": KEY}).bundle([env(5, "alarm", Priority.FLASH, life=3_600_000)])
    rcv.open_bundle(old)
    new = Codec("gw1", {"gw4": KEY})  # the copy put back: seq 5 again, another message
    rcv.open_bundle(new.bundle([env(5, "status", Priority.ROUTINE)], delta=True))  # both dropped
    new.acked("gw4", [5])
    rcv.open_bundle(old)  # replayed
    with pytest.raises(E.NoReference, match="envelope 5"):
        rcv.open_bundle(new.bundle([env(6, "status", Priority.ROUTINE, body.replace(b"ok", b"up"))], delta=True))
    got = rcv.open_bundle(new.bundle([env(6, "status", Priority.ROUTINE, body.replace(b"ok", b"up"))], delta=False))[0]
    assert (got.supersede, got.priority, got.lifetime_ms) == ("status", Priority.ROUTINE, 60_000)


@pytest.mark.parametrize("shape", ["keys", "incarnations"])
def test_what_a_receiver_keeps_costs_about_what_it_is_charged(shape):
    """Empty bodies under many keys, or each under an incarnation of its own (a stream each),
    the cheapest to send: the memory the references take stays within a quarter of the budget's
    charge (DELTA_ENTRY_BYTES is what a body's, a key's or a stream's entries cost)."""
    import tracemalloc

    snd, rcv = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})

    def env(s: int) -> Envelope:
        if shape == "keys":
            return Envelope(Kind.DATA, "gw1", s + 1, "gw4", 0, 60_000, Priority.ROUTINE, "k%07d" % (s // 8), b"", inc=7)
        return Envelope(Kind.DATA, "gw1", 1, "gw4", 0, 60_000, Priority.ROUTINE, "", b"", inc=s + 1)

    sealed = [snd.bundle([env(s)]) for s in range(12_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for s in sealed:
            rcv.open_bundle(s)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    refs = rcv._came["gw1"]
    print(f"references: charged {refs.nbytes} B, allocated {used} B")
    assert refs.nbytes <= E.DELTA_BYTES_MAX and used <= 1.25 * refs.nbytes


# -- a delta as the edits of its reference (EDITS, decision 0025) ---------------------------


def test_a_report_goes_as_the_edits_of_the_one_before_smaller_than_a_zstd_frame_and_opens_the_same():
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    gw4.open_bundle(gw1.bundle([_env(1)], delta=True))
    sizes = []
    for k in range(2, 30):
        gw1.acked("gw4", [k - 1])
        m = cbor2.loads(gw1.map_bytes(_env(k), delta=True))
        assert E.K_COMPRESSION not in m and m[E.K_REF] == 1  # (no compression named: the edits)
        got = gw4.open_bundle(gw1.container([cbor2.dumps(m)], "gw4"))[0]
        assert got.body == _report(k) and got.compression == E.Compression.EDITS
        sizes.append((len(m[E.K_BODY]), len(E._delta(_report(k), _report(k - 1)))))
    edits, frame = (sorted(x)[len(x) // 2] for x in zip(*sizes))
    print(f"a report against the one before it: edits {edits} B, a zstd frame {frame} B (medians)")
    assert edits < frame - 8


EK = b"e" * 32  # what checks edits (a Codec derives it from the bundle's key)


@settings(max_examples=300, deadline=None)
@given(
    ref=st.binary(max_size=E.EDITS_MAX_BODY),
    body=st.binary(max_size=E.EDITS_MAX_BODY),
    cuts=st.lists(st.integers(0, E.EDITS_MAX_BODY)),
)
def test_every_edits_a_sender_writes_make_its_body_again(ref, body, cuts):
    """Edits of any body against any reference (either empty, up to the largest a sender makes
    edits of), and of bodies made from the reference by cutting, duplicating and changing
    pieces of it (how reports differ), decode to the body exactly."""
    near = bytearray(ref)
    for c in cuts:
        if near and c % 3 == 0:
            del near[c % len(near) : c % len(near) + c % 7]
        elif near and c % 3 == 1:
            near[c % len(near)] = c % 256
        else:
            near[c % (len(near) + 1) : c % (len(near) + 1)] = body[: c % 5]
    for b in (body, bytes(near[: E.EDITS_MAX_BODY]), ref):
        assert E._apply_edits(E._edits(b, ref, EK), ref, EK) == b


def _edits_of(items: list, body: bytes = b"") -> bytes:
    return E._edits_check(EK, body) + cbor2.dumps(items)


@pytest.mark.parametrize(
    "data, exc, match",
    [
        (b"\x00\x01", E.Malformed, "without their 4-byte check"),
        (_edits_of([3, b"x"])[:-1], E.Malformed, "not strict CBOR"),
        (_edits_of({3: b"x"}), E.Malformed, "not an array"),
        (_edits_of([3]), E.Malformed, "edit 0 is not a count"),
        (_edits_of([b"x", 3]), E.Malformed, "edit 0 is not a count"),
        (_edits_of([True, b"x"]), E.Malformed, "edit 0 is not a count"),
        (_edits_of([3, [b"x"]]), E.Malformed, "not strict CBOR"),  # (nested: deeper than an edit goes)
        (_edits_of([0, b"", -2, 1.5]), E.Malformed, "edit 1 is not a count"),
        (_edits_of([99, b"x"]), E.Malformed, "reaches byte 100 of a reference of 10"),
        (_edits_of([0, b"", -100]), E.Malformed, "reaches byte 99 of a reference of 10"),
        (_edits_of([0, b"x" * 23, -1]), E.Malformed, "over the 32 bytes"),  # (23 written, then the 10 of ref)
        (_edits_of([5, b"ab"]), E.Malformed, "another reference"),  # the check of another body
        (_edits_of([0, b"y" * 60]), E.Oversize, "edits of 68 bytes for a body of at most 32"),
    ],
)
def test_edits_that_a_sender_would_not_write_are_refused_naming_what_is_wrong(data, exc, match):
    with pytest.raises(exc, match=match):
        E._apply_edits(data, b"0123456789", EK, 32)


def test_the_check_of_edits_is_keyed_so_bodies_chosen_to_collide_do_not():
    """Found by review: a CRC-32 check is linear, so a client choosing the bodies of a topic could
    make two references (a store put back reuses seqs) give the same check, and the edits made
    against one were taken against the other and delivered wrong. The check is now an HMAC under
    the bundle's key: without it no pair can be chosen to collide."""
    import zlib

    a = b'{"lat": 59.91299, "status": "all clear at grid 32V NM 123 456", "n": 1}'
    b = bytearray(a)
    for i, x in enumerate(bytes.fromhex("410671db01")):  # the CRC-32 generator's bytes XORed in
        b[30 + i] ^= x
    b = bytes(b)
    assert zlib.crc32(a) == zlib.crc32(b) and a != b  # (what a CRC-32 check would have let through)
    body = a.replace(b'n": 1', b'n": 2')
    edits = E._edits(body, a, EK)
    assert E._apply_edits(edits, a, EK) == body
    with pytest.raises(E.Malformed, match="another reference"):
        E._apply_edits(edits, b, EK)
    with pytest.raises(E.Malformed, match="another reference"):  # another key, another check
        E._apply_edits(edits, a, b"f" * 32)


@pytest.mark.parametrize("held", [_report(77), _report(77) * 12, _report(77)[:60]])
def test_edits_against_a_reference_the_receiver_holds_otherwise_are_refused_unacked(held):
    """The check is of the body the edits were made for: a receiver holding another body at the
    seq referred to (a store put back from a copy reuses seqs), shorter, as long or longer (past
    what edits make: found by review, it was refused as oversize), makes another one, and
    refuses it as made against another reference; the retransmission goes whole."""
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    gw4.open_bundle(gw1.bundle([dataclasses.replace(_env(1), body=held)], delta=False))
    other = Codec("gw1", {"gw4": KEY})  # the same seq 1 with another body, acked
    other.bundle([_env(1)], delta=True)
    other.acked("gw4", [1])
    m = cbor2.loads(other.map_bytes(_env(2), delta=True))
    assert E.K_REF in m and E.K_COMPRESSION not in m
    with pytest.raises(E.NoReference, match="does not decode"):
        gw4.open_bundle(other.container([cbor2.dumps(m)], "gw4"))
    assert gw4.open_bundle(other.bundle([_env(2)], delta=False))[0].body == _report(2)
