"""The scheduler's path model on an emulated radio, in virtual time (perf.radio_sim): acks say
how long they were held, the window follows the measured delivery rate, bundles are paced,
RACK orders what went in one millisecond; bulk goodput and orders under overload across
loss patterns (decision 0011)."""

from __future__ import annotations

import dataclasses
import random
import statistics

import pytest

from c2dtn.overlay import scheduler
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import Custody, Quota
from c2dtn.overlay.envelope import MAX_ACK_HOLD_MS, Codec, Malformed, Priority, decode_ack_body, encode_ack_body
from c2dtn.overlay.store import open_store
from c2dtn.perf import radio_sim as rs

KEY = b"k" * 32
SEEDS = [11 + 1000 * i for i in range(8)]


def core(name: str, peer: str, cfg=rs.RADIO_CFG) -> OverlayCore:
    return OverlayCore(Custody(open_store("memory"), name, Quota()), Codec(name, {peer: KEY}), cfg)


# -- acks say how long they were held ----------------------------------------------------


def test_an_ack_carries_its_hold_and_a_reader_of_another_source_is_not_disturbed():
    body = encode_ack_body({"gw1/a": ([1, 2], [4]), "gw2/b": ([7], [])}, {"gw1/a": 830, "gw3/c": 5})
    mine = decode_ack_body(body, "gw1/a")
    assert (mine.done, mine.got, mine.hold_ms) == ([(1, 2)], [(4, 4)], 830)
    other = decode_ack_body(body, "gw2/b")  # its hold was not given: none, and its runs as ever
    assert (other.done, other.hold_ms) == ([(7, 7)], None)
    assert mine.sources == {"gw1/a", "gw2/b"}  # a hold for a source the ack does not answer goes nowhere


@pytest.mark.parametrize(
    "body, named",
    [
        ([["gw1", 10, [[1, 1]], [], "x"]], "ack hold for 'gw1/a'"),
        ([["gw1", 10, [[1, 1]], [], -5]], "ack hold for 'gw1/a'"),
        ([["gw1", 10, [[1, 1]], [], MAX_ACK_HOLD_MS + 1]], "ack hold for 'gw1/a'"),
        ([["gw1", 10, [[1, 1]], [], True]], "ack hold"),
    ],
)
def test_a_bad_hold_is_refused_by_name(body, named):
    import cbor2

    with pytest.raises(Malformed, match=named):
        decode_ack_body(cbor2.dumps(body), "gw1/a")


def test_the_round_trip_leaves_out_the_time_the_receiver_held_its_ack():
    cfg = dataclasses.replace(rs.RADIO_CFG, linger_ms=0, ack_delay_ms=1000)
    a, b = core("gw1", "gw4", cfg), core("gw4", "gw1", cfg)
    a.submit("gw4", b"x" * 100, 0)
    for bd in a.poll(0):
        b.on_bundle(bd.payload, 100)  # 100 ms on the way
    assert not b.poll(500)  # the ack waits for data to ride on (ack_delay_ms)
    (ack,) = b.poll(1100)  # ... 1,000 ms, then goes alone
    a.on_bundle(ack.payload, 1200)
    p = a.sched.paths["gw4"]
    assert p.min_rtt_ms == 200  # 1,200 ms from send to ack, 1,000 of them held at gw4


# -- what goes in one millisecond ---------------------------------------------------------


def test_an_envelope_lost_beside_one_that_arrived_goes_again_a_reordering_window_later():
    """Two envelopes in two bundles handed over in the same millisecond: the first is lost,
    the second's ack comes back.  The first goes again a minimum round trip after that ack
    (RACK's reordering window for what went with the newest envelope acked: the agent may
    have put it on the air a frame later, decision 0038), not at its retransmission timeout
    or a tail probe."""
    cfg = dataclasses.replace(rs.RADIO_CFG, linger_ms=0, ack_delay_ms=0)
    a, b = core("gw1", "gw4", cfg), core("gw4", "gw1", cfg)
    a.submit("gw4", b"w" * 50, 0)  # a round trip measured first: 400 ms
    for bd in a.poll(0):
        b.on_bundle(bd.payload, 200)
    for bd in b.poll(200):
        a.on_bundle(bd.payload, 400)
    first = a.submit("gw4", random.randbytes(1000), 1000)  # incompressible: one per bundle
    a.submit("gw4", random.randbytes(1000), 1000)
    lost, kept = a.poll(1000)
    assert lost.seqs == [first]
    b.on_bundle(kept.payload, 1200)
    for bd in b.poll(1200):
        a.on_bundle(bd.payload, 1400)
    assert not [s for bd in a.poll(1750) for s in bd.seqs]  # within the reordering window
    assert [s for bd in a.poll(1800) for s in bd.seqs] == [first]  # 1,400 + 400
    assert a.store.counters().get("tail_probes", 0) == 0


@pytest.mark.parametrize("rtt", [2, 400])
def test_an_envelope_lost_beside_one_handed_over_with_it_goes_again_on_a_lan_too(rtt):
    """The same two bundles on a path of a 2 ms round trip, where a quarter of it rounds to
    0 ms: what went in the same millisecond as the envelope acked still gets RACK's timer (a
    minimum round trip), not its retransmission timeout of seconds (decision 0038's review)."""
    cfg = dataclasses.replace(rs.RADIO_CFG, linger_ms=0, ack_delay_ms=0)
    a, b = core("gw1", "gw4", cfg), core("gw4", "gw1", cfg)
    a.submit("gw4", b"w" * 50, 0)
    for bd in a.poll(0):
        b.on_bundle(bd.payload, rtt // 2)
    for bd in b.poll(rtt // 2):
        a.on_bundle(bd.payload, rtt)
    t0 = 1000
    first = a.submit("gw4", random.randbytes(1000), t0)
    a.submit("gw4", random.randbytes(1000), t0)
    lost, kept = a.poll(t0)
    assert lost.seqs == [first]
    b.on_bundle(kept.payload, t0 + rtt // 2)
    for bd in b.poll(t0 + rtt // 2):
        a.on_bundle(bd.payload, t0 + rtt)
    again = [t for t in range(t0 + rtt, t0 + rtt + 5 * rtt) if first in {s for bd in a.poll(t) for s in bd.seqs}]
    assert again and again[0] - (t0 + rtt) <= rtt, again


# -- the radio kept busy, orders first ----------------------------------------------------


def test_bulk_goodput_stays_near_what_the_frames_leave_room_for_on_every_loss_pattern():
    """`perf overlay`'s radio run (60 x 1000 B over 9.8 kbit/s, 10 % loss both ways) on 8 loss
    patterns.  What a frame leaves for data (payload over frame bytes) is the ceiling: lost
    frames take no link time here, as in netem.  The queue cut this model replaced kept the
    radio idle a third of the time (0.57 of the link where the ceiling is 0.82); a tail loss
    still costs a probe's wait (a few seconds) in some runs."""
    runs = [rs.bulk(s) for s in SEEDS]
    shares = [r["fraction"] / rs.ceiling() for r in runs]
    assert statistics.median(shares) >= 0.95, shares
    assert min(shares) >= 0.75, shares
    assert all(r["delivered"] == 60 for r in runs)


def test_a_lost_ack_does_not_idle_the_radio_under_a_transfer_on_most_loss_patterns():
    """`perf overlay`'s radio run on 40 loss patterns: with two bundles of room more than the
    window while a transfer is queued, lost acks and frames are made up by the next ack before
    the radio runs dry, and few runs fall below the issue's 0.85 of the link (18 of 40 did
    with no room, 3 with one bundle: decisions 0037, 0039)."""
    fractions = [rs.bulk(s)["fraction"] for s in range(1, 41)]
    assert sum(f < 0.85 for f in fractions) <= 2, sorted(fractions)[:10]
    assert statistics.median(fractions) >= 0.88, statistics.median(fractions)


def test_reports_waiting_get_no_room_past_the_window_and_a_transfer_does():
    """Positions (24 units, each superseding its last, PRIORITY, at three times the link, as
    `perf overload` sends them), then a bulk transfer on a fresh radio: once the path model
    has filled, the positions' path never gets the room past the window (a newer
    report replaces one that waits, and a deeper queue would hold orders behind reports);
    the transfer's does."""
    rooms: dict[str, list[tuple[bool, float]]] = {"reports": [], "bulk": []}
    for kind, seen in rooms.items():
        r = rs.Radio(rs.profile(), 3)
        rng = random.Random(3)
        gw1 = r.cores["gw1"]
        every_ms = rs.REPORT_BYTES * 8 / (3 * (r.link.rate_bps or 0)) * 1000  # all units together
        if kind == "bulk":
            for _ in range(60):
                gw1.submit("gw4", rng.randbytes(1000), 0)
        t = 0.0
        while t < 90_000:
            if kind == "reports":
                unit = rng.randrange(24)
                body = rng.randbytes(rs.REPORT_BYTES)
                gw1.submit("gw4", body, int(t), 600_000, Priority.PRIORITY, supersede=f"unit{unit}")
            t += every_ms
            r.step(int(t))
            p = gw1.sched.paths.get("gw4")
            if p is not None:
                seen.append((p.filled, p.extra_room))
    assert any(filled for filled, _ in rooms["reports"])  # the model filled: the room was not off for that
    assert max(room for filled, room in rooms["reports"] if filled) == 0
    assert max(room for _, room in rooms["bulk"]) > 1500  # about two bundles (1,200 B of radio frame each), plain


def test_after_a_transfer_orders_alone_are_called_lost_a_quarter_round_trip_late_not_two_bundles():
    """A bulk transfer, then an order every 5 s: once the transfer has arrived, nothing more
    than the window is on its way, and an order lost beside a later one is resent a quarter
    round trip after that one's ack, as before the room (decision 0037), not two bundles'
    time later."""
    r = rs.Radio(rs.profile(), 7)
    rng = random.Random(7)
    gw1 = r.cores["gw1"]
    for _ in range(60):
        gw1.submit("gw4", rng.randbytes(1000), 0)
    had = 0.0
    while len(r.delivered["gw4"]) < 60 and r.now_ms < 600_000:
        r.step(r.now_ms + 1000)
        had = max(had, gw1.sched.paths["gw4"].extra_room)
    assert had > 0  # the transfer had the room, and the wider window
    p = gw1.sched.paths["gw4"]
    reos = []
    for k in range(12):
        gw1.submit("gw4", b"order %d " % k + rng.randbytes(190), r.now_ms, 86400_000, Priority.IMMEDIATE)
        r.step(r.now_ms + 5000)
        reos.append((p.extra_room, gw1.sched._reo_near_ms(p)))
    assert reos[-1] == (0.0, int(p.reo_steps * p.min_rtt_ms / 4)), reos


def test_a_bundle_the_agent_puts_on_the_air_after_the_next_one_handed_with_it_is_not_resent():
    """A bulk transfer on a lossless virtual radio whose agent, of two data bundles handed to it
    in the same millisecond, puts the later one on the air first, as dtn7-rs does (decision
    0038's captures): the first arrives a frame after the second.  While the window has its
    room, RACK gives what went with the newest envelope acked at least two bundles' time
    more, so the later bundle's ack does not call the earlier one lost (a quarter of the
    minimum round trip did: decision 0037)."""
    link = dataclasses.replace(rs.profile(), loss=0.0)
    r = rs.Radio(link, 5)
    to_gw4 = r.dirs["gw4"].offer
    held: list[tuple[bytes, float]] = []  # the last data frame handed over, not yet on the air
    swapped = 0

    def offer(frame: bytes, now: float) -> None:
        nonlocal swapped
        if len(frame) < 500:  # an ack
            to_gw4(frame, now)
            return
        if held and held[0][1] == now:  # handed over with the one held: it goes first
            to_gw4(frame, now)
            to_gw4(*held.pop())
            swapped += 1
            return
        flush()
        held.append((frame, now))

    def flush() -> None:
        if held:
            to_gw4(held.pop()[0], r.now_ms / 1000)

    r.dirs["gw4"].offer = offer
    rng = random.Random(5)
    for _ in range(60):
        r.cores["gw1"].submit("gw4", rng.randbytes(1000), 0)
    while len(r.delivered["gw4"]) < 60 and r.now_ms < 600_000:
        r.step(r.now_ms + 10)
        flush()
    assert len(r.delivered["gw4"]) == 60
    assert swapped >= 3, swapped  # slow start hands bundles over together
    assert r.cores["gw4"].store.counters().get("duplicates", 0) == 0
    assert r.cores["gw1"].store.counters()["sent"] == 60  # none sent twice


def _lossy_transfer(
    drop: set[tuple[int, int]], seed: int = 5, acks_lost: set[int] = frozenset()
) -> tuple[rs.Radio, list[tuple[int, tuple]]]:
    """60 x 1000 B submitted over a lossless virtual radio but for the data bundles in `drop`,
    (seq, nth time it went): lost on the way, as the radio loses a frame it is offered; and for
    each seq in acks_lost, the first of gw4's bundles that acks it.
    Returns the radio and what gw1 hands over (ms, seqs), lost ones included, as it goes."""
    r = rs.Radio(dataclasses.replace(rs.profile(), loss=0.0), seed)
    gw1, gw4 = r.cores["gw1"], r.cores["gw4"]
    poll, sent, went = gw1.poll, [], {}

    def lossy_poll(now_ms: int, *a, **k):
        out = []
        for b in poll(now_ms, *a, **k):
            sent.append((now_ms, tuple(b.seqs)))
            n = went[tuple(b.seqs)] = went.get(tuple(b.seqs), 0) + 1
            if not any((q, n) in drop for q in b.seqs):
                out.append(b)
        return out

    ack_poll, acks_to_lose = gw4.poll, set(acks_lost)

    def ack_losing_poll(now_ms: int, *a, **k):
        out = []
        for b in ack_poll(now_ms, *a, **k):
            done, got = next(iter(b.acks.values()), ([], [])) if isinstance(b.acks, dict) else b.acks
            named = acks_to_lose & {*done, *got}
            acks_to_lose.difference_update(named)
            if not named:
                out.append(b)
        return out

    gw1.poll, gw4.poll = lossy_poll, ack_losing_poll
    rng = random.Random(seed)
    for _ in range(60):
        gw1.submit("gw4", rng.randbytes(1000), 0)
    return r, sent


def _transfer_losing(
    drop: set[tuple[int, int]], seed: int = 5, acks_lost: set[int] = frozenset()
) -> tuple[rs.Radio, list[tuple[int, tuple]]]:
    """_lossy_transfer, delivered."""
    r, sent = _lossy_transfer(drop, seed, acks_lost)
    while len(r.delivered["gw4"]) < 60 and r.now_ms < 600_000:
        r.step(r.now_ms + 1000)
    assert len(r.delivered["gw4"]) == 60
    return r, sent


def test_a_transfer_whose_last_frame_is_lost_ends_a_frame_later_not_a_probe_later():
    """A frame lost at a burst's end has no later one whose ack shows it lost.  On a path that
    lost a frame lately (the tenth here), the burst's last envelope goes twice, the copy when
    the ack before it leaves it alone in flight: the transfer whose last frame is lost ends
    about a frame after the one whose last frame arrived, where a tail probe's round trip
    and more went first (the testbed's runs below 0.85 of the link: decision 0038)."""
    frame_ms = 1123 * 8 / rs.profile().rate_bps * 1000
    kept, kept_sent = _transfer_losing({(10, 1)})
    lost, lost_sent = _transfer_losing({(10, 1), (60, 1)})
    ends = [max(t for t, _ in r.delivered["gw4"]) for r in (kept, lost)]
    assert ends[1] - ends[0] <= 1.5 * frame_ms, (ends, frame_ms)
    for r, sent in ((kept, kept_sent), (lost, lost_sent)):
        assert [seqs for _, seqs in sent].count((60,)) == 2  # the copy, and no third
        assert r.cores["gw1"].store.counters()["tail_copies"] == 1
    assert len(lost_sent) == len(kept_sent) == 62  # what the copy costs: a frame a burst


def test_the_last_frame_lost_behind_a_lost_ack_goes_again_at_the_probes_ack_not_a_probe_later():
    """The last frame lost, and the ack of the one before it: a tail probe resends that one
    (the oldest lacking), and its ack leaves the last alone in flight.  With the first ack lost
    too, the minimum round trip holds a standing queue, so the probe's ack comes too soon to
    show the last one lost; the copy goes at that ack, as the envelope went queued behind
    another, though the probe went after it.  It waited for a second probe before
    (decision 0039)."""
    frame_ms = 1123 * 8 / rs.profile().rate_bps * 1000
    r, sent = _lossy_transfer({(10, 1), (60, 1)}, acks_lost={1, 59})
    acks_at: list[int] = []
    on_bundle = r.cores["gw1"].on_bundle

    def noting(payload: bytes, now_ms: int, *a, **k):
        acks_at.append(now_ms)
        return on_bundle(payload, now_ms, *a, **k)

    r.cores["gw1"].on_bundle = noting
    while len(r.delivered["gw4"]) < 60 and r.now_ms < 600_000:
        r.step(r.now_ms + 1000)
    probe = [t for t, seqs in sent if seqs == (59,)][1]
    probes_ack = min(t for t in acks_at if t > probe)
    assert [t for t, seqs in sent if seqs == (60,)][1] == probes_ack
    assert max(t for t, _ in r.delivered["gw4"]) <= probes_ack + 1.5 * frame_ms
    assert r.cores["gw1"].store.counters()["tail_copies"] == 1


def test_three_frames_lost_in_a_row_mid_transfer_cost_the_radio_no_idle_time():
    """While a transfer is queued the window has two bundles of room: three frames lost in a
    row (their acks never come) leave the radio's queue something to send until the next ack
    shows them lost, and the transfer ends when a lossless one does, the three resends in
    the time the lost frames did not take.  With one bundle of room the radio ran dry for
    most of a frame (decision 0039)."""
    lossless, _ = _transfer_losing(set())
    lossy, sent = _transfer_losing({(30, 1), (31, 1), (32, 1)})
    ends = [max(t for t, _ in r.delivered["gw4"]) for r in (lossless, lossy)]
    assert ends[1] - ends[0] <= 50, ends
    assert len(sent) == 60 + 3 + 1  # the resends, and a tail copy (the path lost lately)


def _orders_after_a_transfer(
    seed: int, then=lambda: None, every_ms: int = 200, count: int = 100
) -> tuple[list[float], int]:
    """A bulk transfer on the lossy virtual radio, `then()`, then `count` orders of 200 B
    (immediate) one every `every_ms`, more than the radio carries: their latencies (s,
    sorted) and the frames they took."""
    r = rs.Radio(rs.profile(), seed)
    gw1 = r.cores["gw1"]
    rng = random.Random(seed)
    for _ in range(60):
        gw1.submit("gw4", rng.randbytes(1000), 0)
    while len(r.delivered["gw4"]) < 60:
        r.step(r.now_ms + 1000)
    r.step(r.now_ms + 20_000)
    then()
    frames, sent = r.frames["gw4"], {}
    for k in range(count):
        r.step(r.now_ms + every_ms)
        body = b"order %06d " % k + rng.randbytes(187)
        sent[body[:12]] = r.now_ms
        gw1.submit("gw4", body, r.now_ms, 86400_000, Priority.IMMEDIATE)
    r.step(r.now_ms + 120_000)
    got = {d.body[:12]: t for t, d in r.delivered["gw4"] if d.body.startswith(b"order")}
    assert len(got) == count
    return sorted((got[k] - t) / 1000 for k, t in sent.items()), r.frames["gw4"] - frames


def test_orders_that_fill_the_radio_get_one_bundle_of_room_not_a_transfers_two(monkeypatch):
    """Orders are not paced: the room past the window is what lets each go at once in a frame
    of its own.  A stream of them faster than the radio carries gets 0037's one bundle of room,
    not a transfer's two: with two, more of them went alone, their frames filled the radio's
    queue, and their p95 went from 7.8 to 14.4 s (decision 0039's review)."""
    lat, frames = _orders_after_a_transfer(1)
    lat_one, frames_one = _orders_after_a_transfer(1, then=lambda: monkeypatch.setattr(scheduler, "ROOM_BUNDLES", 1))
    assert (lat, frames) == (lat_one, frames_one)


def test_racks_wider_window_is_two_bundles_time_not_twice_the_rooms():
    """While a transfer has its two bundles of room, what went with the newest envelope acked
    gets RACK's wider window of two bundles' time (the agent may swap two bundles handed over
    together), or the minimum round trip where that is longer; not twice the whole room, which
    would hold a lost envelope's resend two bundles longer (decision 0039)."""
    r = rs.Radio(rs.profile(), 5)
    gw1 = r.cores["gw1"]
    rng = random.Random(5)
    for _ in range(60):
        gw1.submit("gw4", rng.randbytes(1000), 0)
    seen = []
    while len(r.delivered["gw4"]) < 60:
        r.step(r.now_ms + 500)
        p = gw1.sched.paths["gw4"]
        if p.extra_room and p.rate():
            bundle = gw1.sched._room_bundle(p)
            seen.append((p.extra_room / bundle, gw1.sched._reo_ms(p), max(p.min_rtt_ms or 0, 2 * bundle / p.rate())))
    assert seen and all(abs(n - 2) < 1e-9 for n, _, _ in seen)
    assert all(reo <= want + 1 for _, reo, want in seen), seen[:5]


def test_a_lost_tail_probe_is_followed_by_the_next_at_its_time_not_the_retransmission_timeout():
    """The last frame lost, and the tail probe that resent it lost too: the next probe goes a
    probe's interval later, as a deadline of the core says, and the transfer ends about 9 s
    after its last frame first went, not when the retransmission timer (20 s at least,
    doubled) next woke the core: about 97 s.  The node's shell plans every second anyway; the
    virtual radio wakes the core only at its deadlines."""
    r, sent = _lossy_transfer({(60, 1), (60, 2)})
    r.step(120_000)  # in one go: the core is woken at its own deadlines only
    assert len(r.delivered["gw4"]) == 60
    first = min(t for t, seqs in sent if seqs == (60,))
    assert max(t for t, _ in r.delivered["gw4"]) <= first + 15_000, (first, sent[-3:])


def test_a_path_that_lost_nothing_lately_pays_no_copies_nor_do_reports():
    """The copies are for lossy paths and for what cannot be superseded: a transfer on a clean
    radio sends each envelope once, and reports, each burst of them alone in flight at its
    end, never go twice after a transfer on the same path lost a frame (decision 0038)."""
    r, sent = _transfer_losing(set())
    assert len(sent) == 60 and "tail_copies" not in r.cores["gw1"].store.counters()
    r, sent = _transfer_losing({(10, 1)})
    gw1 = r.cores["gw1"]
    copies = gw1.store.counters()["tail_copies"]
    rng = random.Random(5)
    for _ in range(6):  # 24 units, a report each every 10 s: the queue empties between
        r.step(r.now_ms + 10_000)
        for u in range(24):
            body = b"pos %03d %09d " % (u, r.now_ms) + rng.randbytes(rs.REPORT_BYTES - 18)
            gw1.submit("gw4", body, r.now_ms, 600_000, Priority.PRIORITY, supersede=f"unit{u}")
    r.step(r.now_ms + 30_000)
    assert len(r.delivered["gw4"]) == 60 + 6 * 24
    assert gw1.sched.paths["gw4"].lost_at_sends is not None  # the path lost a frame lately
    assert gw1.store.counters()["tail_copies"] == copies


def test_a_frame_lost_mid_transfer_goes_again_a_quarter_round_trip_after_the_next_ones_ack():
    """Envelope 30 of a transfer is lost on the way; 31 went a paced bundle after it.  Paced
    bundles were never seen to swap on the air (decision 0038's captures): 30 goes again a
    quarter of the minimum round trip after the ack that shows 31 arrived, not the two
    bundles' time a bundle handed over with 31 is given (about 1.8 s on this radio), while the
    radio's queue runs dry."""
    r, sent = _lossy_transfer({(30, 1)})
    sched = r.cores["gw1"].sched
    acks: list[tuple[int, list[int]]] = []
    on_ack = sched.on_ack

    def recording_on_ack(sender, done, got, now_ms, hold_ms=0):
        acks.append((now_ms, [*done, *got]))
        return on_ack(sender, done, got, now_ms, hold_ms)

    sched.on_ack = recording_on_ack
    while len(r.delivered["gw4"]) < 60 and r.now_ms < 600_000:
        r.step(r.now_ms + 1000)
    p = sched.paths["gw4"]
    went = [t for t, seqs in sent if seqs == (30,)]
    showed = min(t for t, seqs in acks if 31 in seqs)
    assert len(went) == 2
    assert went[1] - showed <= p.min_rtt_ms / 4 + 10, (went, showed, p.min_rtt_ms)


def test_a_stream_of_orders_each_alone_on_the_radio_is_not_copied():
    """After a transfer that lost a frame (copies on), 100 orders of 200 B every half second:
    each is alone on the radio, its frame gone before the next is sent, so none is the tail
    of a burst and each goes once (copied, each would go twice: decision 0038)."""
    r, sent = _transfer_losing({(10, 1)})
    gw1 = r.cores["gw1"]
    copies, frames = gw1.store.counters()["tail_copies"], len(sent)
    rng = random.Random(5)
    for k in range(100):
        r.step(r.now_ms + 500)
        gw1.submit("gw4", b"order %06d " % k + rng.randbytes(187), r.now_ms, 86400_000, Priority.IMMEDIATE)
    r.step(r.now_ms + 30_000)
    assert len(r.delivered["gw4"]) == 160
    assert gw1.sched.paths["gw4"].lost_at_sends is not None  # the path lost a frame lately
    assert (len(sent) - frames, gw1.store.counters()["tail_copies"] - copies) == (100, 0)


def test_orders_sent_behind_a_tail_copy_are_not_probed_nor_resent():
    """A transfer's last envelope went twice; three orders of 1000 B follow half a second later,
    behind the copy on the radio, on a radio that loses nothing more.  The copy's ack restarts
    the tail-probe timer, and a probe acked sooner than a round trip after it went says nothing
    of what went before it (the ack is its first copy's): no order goes twice but the last,
    whose copy is the burst's (decision 0038)."""
    r, sent = _lossy_transfer({(10, 1)})
    gw1 = r.cores["gw1"]
    while [seqs for _, seqs in sent].count((60,)) < 2 and r.now_ms < 600_000:
        r.step(r.now_ms + 10)
    r.step(sent[-1][0] + 580)
    rng = random.Random(7)
    orders = [gw1.submit("gw4", rng.randbytes(1000), r.now_ms, 86400_000, Priority.IMMEDIATE) for _ in range(3)]
    r.step(r.now_ms + 20_000)
    assert len(r.delivered["gw4"]) == 63
    went = [seqs for _, seqs in sent if set(seqs) & set(orders)]
    assert sorted(went) == sorted([(orders[0],), (orders[1],), (orders[2],), (orders[2],)]), went
    causes = {
        ev for (ev, _, prio), n in gw1.store.tally.items() if ev.startswith("resent_") and prio == Priority.IMMEDIATE
    }
    assert causes == {"resent_copy"}, causes


def test_under_three_times_the_link_orders_overtake_and_the_link_stays_busy():
    """`perf overload`'s traffic for 4 minutes (24 units' positions, superseded per unit, at 3x
    the link; an immediate order every 10 s) on 3 loss patterns: every order arrives, their
    p95 stays within a few frames' time, and the link carries data most of the time."""
    runs = [rs.overload(s, minutes=4, drain_s=60) for s in SEEDS[:3]]
    for r in runs:
        assert r["orders_lost"] == 0, r
        assert r["order_p95_s"] <= 12, r
        assert r["link_share"] >= 0.8, r
    assert statistics.median(r["order_p95_s"] for r in runs) <= 10


def test_bundles_are_paced_at_the_measured_rate_once_it_is_known():
    """After slow start the routine bundles leave no faster than PACING_GAIN times the
    delivery rate the acks showed: the radio's queue holds a bundle or two, not the window."""
    r = rs.Radio(rs.profile(), 5)
    for _ in range(120):
        r.cores["gw1"].submit("gw4", random.randbytes(1000), 0)
    sent: list[int] = []
    queue: list[tuple[int, int]] = []  # (ms, frames in the radio's transmit queue after a send)
    send = r._send

    def spy(node):
        n = r.frames["gw4"]
        send(node)
        if r.frames["gw4"] > n:
            sent.extend([r.now_ms] * (r.frames["gw4"] - n))
            queue.append((r.now_ms, r.dirs["gw4"].queued(r.now_ms / 1000)[0]))

    r._send = spy  # type: ignore[method-assign]
    r.step(120_000)
    p = r.cores["gw1"].sched.paths["gw4"]
    assert p.filled and p.rate() > 0
    late = [t for t in sent if t > 40_000]
    gaps = [b - a for a, b in zip(late, late[1:], strict=False)]
    # one envelope of ~1,070 B per bundle: ~850 ms apart at 1.25 x ~1,000 B/s (two at once only
    # when a retransmission or an ack's window opened beside it)
    assert statistics.median(gaps) >= 600, gaps
    assert max(q for t, q in queue if t > 40_000) <= 5, queue


def test_perf_radio_sim_reports_both_schedulers_on_the_same_loss_patterns_and_a_seed_repeats_them(
    tmp_path, monkeypatch
):
    import json

    monkeypatch.chdir(tmp_path)
    out = rs.main(runs=1, seed=3, minutes=0.5, bulk_runs=3)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [3] and set(summary["configs"]) == set(rs.CONFIGS)
    assert summary["bulk_seeds"] == [3, 1003, 2003]
    report = (out / "report.md").read_text()
    assert all(f"| {name} |" in report for name in rs.CONFIGS)
    # the bulk transfer alone on 3 patterns: the first is the table's, and its figure is that run's
    many = summary["configs"]["model"]["bulk_many"]
    assert len(many) == 3 and many[0] == summary["configs"]["model"]["bulk"][0]["fraction"]
    assert many[2] == rs.bulk(2003)["fraction"]
    assert f"| model | 3 | {sorted(many)[1]:.3f} |" in report
    assert "demo: link bytes per report" in report and "every 10 s: delay p95" in report
    assert summary["configs"]["model"]["reports_10s"][0]["delivered"] > 0
    assert summary["configs"]["model"]["reports"][0]["delivered"] > 0
    assert "fmn: AoI p95" in report
    fmn = summary["configs"]["model"]["fmn"][0]
    assert fmn["delivered"] > 0.9 * 3 * fmn["sent"]  # three members, a few reports superseded
    assert (out / "plot.png").stat().st_size > 0 and (out / "plot.json").exists()
    again = rs.bulk(3)
    first = summary["configs"]["model"]["bulk"][0]
    assert (again["seconds"], again["frames"]) == (first["seconds"], first["frames"])  # same seed, same run


def test_the_demo_on_the_virtual_radio_delivers_each_units_newest_report_across_its_cut(monkeypatch):
    """make demo's traffic with its 60 s cut: every unit's last report arrives, nothing crosses
    while the radio is down, and the bytes are those of the frames that arrived, both ways."""
    from c2dtn.topologies import channel

    arrived: list[int] = []
    due = channel.Direction.due
    monkeypatch.setattr(channel.Direction, "due", lambda self, now: arrived.extend(map(len, f := due(self, now))) or f)
    d = rs.demo(11)
    assert d["sent"] == 400 and 100 < d["delivered"] < 400  # most reports of the cut superseded
    assert d["newest_delivered"] == 8 and d["arrived_in_cut"] == 0
    assert d["link_bytes"] == sum(arrived) == d["data_bytes"] + d["ack_bytes"] and d["ack_bytes"] > 0
    assert d["bytes_per_report"] == d["link_bytes"] / d["delivered"]
    quiet = rs.demo(11, cut_s=None)
    assert quiet["delivered"] > d["delivered"] + 100  # the cut's 60 s of reports, most superseded
    # a cut that lasts into the drain ends there: what waited goes then.  (At 1500/250 on this
    # seed the one probe after the cut is lost and the next comes 18 s later, past the drain:
    # decision 0035 records it; the mechanism is checked at the settings it was written for.)
    before = dataclasses.replace(rs.RADIO_CFG, linger_ms=500, ack_delay_ms=1000)
    late = rs.demo(11, cut_s=(20, 120), cfg=before)
    assert late["newest_delivered"] == 8 and late["arrived_in_cut"] == 0


def test_perf_radio_sim_frontier_trades_a_reports_bytes_for_its_age_and_says_where_the_goals_meet(
    tmp_path, monkeypatch
):
    import json

    monkeypatch.chdir(tmp_path)
    # goals a long linger meets and no linger does not: the table must tell them apart
    monkeypatch.setattr(rs, "FRONTIER_BYTES", 150)
    monkeypatch.setattr(rs, "FRONTIER_AGE_S", 60.0)
    out = rs.frontier(
        runs=1, seed=5, minutes=0.5, lingers=(0, 1500), ack_delays=(1000,), side_ack_delays=(1000,), workers=1
    )
    points = json.loads((out / "summary.json").read_text())["points"]
    # each linger at 10 % loss, on a radio losing nothing, and without UDP/IP/Ethernet headers
    assert len(points) == 6
    by = {(p["linger_ms"], p["loss"], p["frame_overhead"]): p for p in points}
    lossy = rs.profile().loss
    short, long_ = by[(0, lossy, rs.FRAME_OVERHEAD)], by[(1500, lossy, rs.FRAME_OVERHEAD)]
    # lingering packs reports into fewer bundles: fewer bytes a report, and older reports
    assert long_["demo_bytes_median"] < 0.7 * short["demo_bytes_median"]
    assert long_["fmn_age_p95_median"] > short["fmn_age_p95_median"] + 0.3
    assert (short["both_goals"], long_["both_goals"]) == (False, True)
    for lg in (0, 1500):
        # a bundle's headers are bytes on every frame: without them every point costs less
        bare, plain = by[(lg, lossy, rs.NO_HEADERS)], by[(lg, lossy, rs.FRAME_OVERHEAD)]
        assert bare["demo_bytes_median"] < plain["demo_bytes_median"]
        assert bare["fmn"][0]["uplink_bytes_per_report"] < plain["fmn"][0]["uplink_bytes_per_report"]
        # a radio that loses nothing delivers every report to all three members, or a newer one
        clean = by[(lg, 0.0, rs.FRAME_OVERHEAD)]["fmn"][0]
        assert clean["delivered"] >= 0.97 * 3 * clean["sent"], clean
        assert clean["aoi_p95_s"] < plain["fmn"][0]["aoi_p95_s"]
    report = (out / "report.md").read_text()
    for p in points:
        row = f"| {p['loss']:.0%} | {p['frame_overhead']} B | {p['linger_ms']} ms | {p['ack_delay_ms']} ms | {p['demo_bytes_median']:.0f} B"
        assert row in report and (" yes |" if p["both_goals"] else " no |") in report.split(row)[1].split("\n")[0]
    assert (out / "plot.png").stat().st_size > 0 and (out / "plot.json").exists()


# -- what a review broke ------------------------------------------------------------------


@pytest.mark.parametrize("held_by", ["linger", "pacing"])
def test_an_envelope_that_expires_while_held_back_leaves_no_wake_up_behind(held_by):
    """An envelope held by the linger or the pace that expires meanwhile: its destination has
    nothing left, and no wake-up stays in the past (the node would plan in a loop)."""
    r = rs.Radio(rs.profile("cnr-tactical-1"), 7)
    g1 = r.cores["gw1"]
    if held_by == "pacing":  # the pace is known and ahead: a bulk transfer, then a routine one right after
        for _ in range(20):
            g1.submit("gw4", random.randbytes(1000), 0)
        r.step(10_000)
        assert g1.sched.paths["gw4"].filled
    g1.submit("gw4", b"short-lived", r.now_ms, lifetime_ms=300)
    r.step(r.now_ms + 5)
    r.step(r.now_ms + 120_000)
    plans = g1.store.counters().get("plans", 0)
    r.step(r.now_ms + 1000)
    assert g1.store.counters().get("plans", 0) - plans <= 3
    w = g1.next_wakeup_ms()
    assert w is None or w > r.now_ms


def test_a_path_with_nothing_in_flight_owes_no_pace():
    """A large envelope paced at a slow rate set the pace far ahead; once it is acked and
    nothing is in flight, the next routine envelope goes at once."""
    r = rs.Radio(rs.profile("cnr-tactical-1"), 7)
    g1 = r.cores["gw1"]
    for _ in range(20):
        g1.submit("gw4", random.randbytes(1000), 0)
    while len(r.delivered["gw4"]) < 20:
        r.step(r.now_ms + 1000)
    r.step(r.now_ms + 10_000)  # all acked
    p = g1.sched.paths["gw4"]
    p.pace_at = r.now_ms + 600_000.0  # as a huge envelope at the old rate would leave it
    g1.submit("gw4", b"next", r.now_ms)
    (b,) = g1.poll(r.now_ms + rs.RADIO_CFG.linger_ms)
    assert b.seqs


def test_a_hold_cannot_take_more_than_half_the_minimum_round_trip_in_one_ack():
    """An ack that says it was held an hour (a lie, or a step of the peer's wall clock) takes at
    most what the receiver may hold an ack, and at most half the minimum off in one sample."""
    cfg = dataclasses.replace(rs.RADIO_CFG, linger_ms=0, ack_delay_ms=1000)  # a cap of 2 s: half the minimum binds
    a = core("gw1", "gw4", cfg)
    p = a.sched.path("gw4")
    seq = a.submit("gw4", b"x" * 100, 0)
    a.poll(0)
    a.sched.on_ack("gw4", [], [seq], 3000, hold_ms=0)
    assert p.min_rtt_ms == 3000
    seq = a.submit("gw4", b"y" * 100, 4000)
    a.poll(4000)
    a.sched.on_ack("gw4", [], [seq], 7000, hold_ms=3600_000)
    assert p.min_rtt_ms == 1500


def test_a_group_counts_what_the_radio_carried_once_not_once_per_member():
    """A bundle to a group of three crosses one broadcast radio once; each member acks it.  The
    delivery rate is the radio's, not three times it (the window would hold three times the
    queue)."""
    import hashlib

    from c2dtn.topologies.channel import Direction

    nodes = ["deu", "m0", "m1", "m2"]

    def pk(x, y):
        return hashlib.sha256("-".join(sorted((x, y))).encode()).digest()

    def mk(name):
        groups = {"fmn": tuple(n for n in nodes if n != name)}
        codec = Codec(name, {n: pk(name, n) for n in nodes if n != name} | {"fmn": b"g" * 32}, groups)
        return OverlayCore(Custody(open_store("memory"), name, Quota(), groups=groups), codec, rs.RADIO_CFG)

    cores = {n: mk(n) for n in nodes}
    link = dataclasses.replace(rs.profile("cnr-tactical-1"), loss=0.0)
    bcast, back = Direction(link, 1), {m: Direction(link, 10 + i) for i, m in enumerate(nodes[1:])}
    for _ in range(40):
        cores["deu"].submit("fmn", random.randbytes(1000), 0)
    now = 0
    while now < 120_000:
        for f in bcast.due(now / 1000):
            for m in nodes[1:]:
                cores[m].on_bundle(f[: -rs.FRAME_OVERHEAD], now)
        for m, d in back.items():
            for f in d.due(now / 1000):
                cores["deu"].on_bundle(f[: -rs.FRAME_OVERHEAD], now)
            items = cores[m].take()
            if items:
                cores[m].consumed([i.id for i in items], now)
            for b in cores[m].poll(now):
                d.offer(b.payload + bytes(rs.FRAME_OVERHEAD), now / 1000)
        for b in cores["deu"].poll(now):
            bcast.offer(b.payload + bytes(rs.FRAME_OVERHEAD), now / 1000)
        now += 50
    carried = link.rate_bps / 8 / 1000 * 1000 / (1068 + rs.FRAME_OVERHEAD)  # body bytes per ms
    assert cores["deu"].sched.paths["fmn"].rate() < 1.3 * carried


def test_an_envelope_out_of_its_turn_is_acked_at_once_not_after_the_ack_delay():
    """A gap (the envelope before this one lost) is news the origin needs now: the ack goes at
    once, as TCP's and QUIC's do, and again when the gap is filled; in turn, it waits its
    ack delay for company."""
    b = core("gw4", "gw1")  # the radio's settings: acks wait 1 s for company
    a = core("gw1", "gw4", dataclasses.replace(rs.RADIO_CFG, linger_ms=0))
    first = a.submit("gw4", random.randbytes(1000), 0)
    a.submit("gw4", random.randbytes(1000), 0)
    lost, second = a.poll(0)
    assert lost.seqs == [first]
    b.on_bundle(second.payload, 100)  # out of its turn
    assert b.poll(100), "the ack waited for its delay"
    b.on_bundle(lost.payload, 200)  # the gap filled
    assert b.poll(200)
    third = a.submit("gw4", random.randbytes(1000), 300)
    (bd,) = a.poll(300)
    assert bd.seqs == [third]
    b.on_bundle(bd.payload, 400)  # in turn: waits for company
    assert not b.poll(400) and b.poll(1400)


def test_pacing_on_a_lan_still_lets_large_envelopes_share_a_bundle():
    """A bundle's worth at a time is the larger aggregate size: 100 kB envelopes that share
    bundles up to a megabyte on a LAN (decision 0006) still do once the rate is known (paced
    at 64 kB, each went alone: 0.94 of bare dtnd's throughput instead of 2.75)."""
    cfg = dataclasses.replace(
        rs.RADIO_CFG, linger_ms=0, aggregate_bytes=65536, aggregate_large_bytes=1 << 20, init_window=4 << 20
    )
    a = core("gw1", "gw4", cfg)
    p = a.sched.path("gw4")
    p.filled, p.bw, p.min_rtt_ms = True, [(1, 2_000.0)], 5.0  # 2 MB/s: 40 ms of pace per envelope
    seqs = [a.submit("gw4", random.randbytes(100_000), 0) for _ in range(3)]
    out = a.poll(0)
    assert [b.seqs for b in out] == [seqs]


def _paced_plan(wire_ratio: float, bodies: list[bytes], supersede: bool) -> list:
    """One plan of a path whose rate is known (1 kB/s, a radio's) and whose wire ratio is
    `wire_ratio`, with these "priority" envelopes queued and the window wide open."""
    a = core("gw1", "gw4", dataclasses.replace(rs.RADIO_CFG, linger_ms=0))
    p = a.sched.path("gw4")
    p.filled, p.bw, p.min_rtt_ms, p.wire_ratio, p.window = True, [(1, 1.0)], 500.0, wire_ratio, 1 << 20
    for i, b in enumerate(bodies):
        a.submit("gw4", b, 0, 600_000, Priority.PRIORITY, supersede=f"unit{i}" if supersede else None)
    return a.poll(0)


def test_a_paced_bundle_takes_as_many_reports_as_fit_it_sealed_not_by_their_plain_size():
    """Decision 0027: reports that go compressed (a wire ratio of about 0.13, what the demo's
    reports show) fill a paced bundle; counted by their plain size (230 to 315 bytes each
    against the bundle's 1,200) a paced bundle took 3 to 5 of them, and paid its blocks,
    headers, seal and ack for those."""
    from c2dtn.perf.train_dict import position_report

    reports = [position_report("NOR", u, u, 1, 1795833889591 + u, 59.9 + u / 1e4, 10.7) for u in range(1, 31)]
    by_plain = rs.RADIO_CFG.aggregate_bytes // min(map(len, reports)) + 1  # what plain sizes let a bundle take
    taken = sum(len(b.seqs) for b in _paced_plan(0.13, reports, supersede=True))
    assert taken >= 2 * by_plain, (taken, by_plain)
    assert (
        sum(len(b.seqs) for b in _paced_plan(1.0, reports, supersede=True)) <= by_plain
    )  # (incompressible: as before)


def test_a_stale_wire_ratio_lets_one_paced_plan_take_at_most_a_few_bundles_worth():
    """Found by review: after compressible traffic the path's wire ratio is small, and the
    incompressible envelopes that follow were counted at that ratio: one plan took the whole
    window (60 envelopes, 63 kB, at a ratio of 0.001). An envelope counts at least
    1/PACED_PLAIN_MAX of its size, so a plan takes at most that many bundles' worth."""
    from c2dtn.overlay.scheduler import PACED_PLAIN_MAX

    out = _paced_plan(0.001, [random.randbytes(400) for _ in range(60)], supersede=False)
    plain = 400 * sum(len(b.seqs) for b in out)
    assert plain <= PACED_PLAIN_MAX * rs.RADIO_CFG.aggregate_bytes + 400, plain
    assert sum(len(b.seqs) for b in out) < 60


def test_on_fmn_reports_lost_then_superseded_do_not_hold_the_groups_window():
    """fmn-4nations on the virtual radio (four nations reporting to the group of the others, on
    uplinks losing 10 %), on a loss pattern that loses a run of bundles: their superseded
    copies leave the group's window at the next member's ack (as for one peer), so the units'
    newer reports keep going.  Held until their timeout, they let one report through a round
    trip: the age p95 at the members was 3.8 s on this pattern, 5.7 % of the deliveries due
    superseded."""
    r = rs.fmn(17242, minutes=3)
    assert r["aoi_p95_s"] < 3.5, r
    assert r["delivered"] > 0.955 * 3 * r["sent"], r


def test_on_fmn_an_application_that_takes_reports_late_splits_its_acks():
    # on the testbed a gateway takes a report once its broker answered: an ack that goes at once
    # (on a gap) says "got", and the "done" follows in an ack of its own; fmn(consume_ms=...)
    # models it, and the uplinks carry what the testbed's did (decision 0033)
    cfg = dataclasses.replace(rs.RADIO_CFG, linger_ms=1500, ack_delay_ms=250)
    at_once = rs.fmn(9782806, minutes=1.0, cfg=cfg)
    late = rs.fmn(9782806, minutes=1.0, cfg=cfg, consume_ms=30)
    print(
        f"uplink bytes per report: taken at once {at_once['uplink_bytes_per_report']:.0f}, 30 ms later {late['uplink_bytes_per_report']:.0f}"
    )
    assert abs(late["delivered"] - at_once["delivered"]) <= at_once["delivered"] * 0.02
    assert late["uplink_bytes_per_report"] >= at_once["uplink_bytes_per_report"] * 1.05
