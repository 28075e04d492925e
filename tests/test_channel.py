"""The I/O-free channel core, driven with virtual time."""

import statistics

import pytest

from c2dtn.topologies.channel import Direction
from c2dtn.topologies.profiles import GilbertElliott, Profile, load_builtin_profiles

FRAME = bytes(242)  # 200-byte UDP payload + 42 bytes of headers


def exact(d: Direction, offers):
    """Event-driven: deliveries at exactly their deadlines."""
    out = []
    for t, f in offers:
        while (nd := d.next_deadline()) is not None and nd <= t:
            out += [(nd, x) for x in d.due(nd)]
        d.offer(f, t)
    while (nd := d.next_deadline()) is not None:
        out += [(nd, x) for x in d.due(nd)]
    return out


def test_rate_paces_frames_back_to_back_counting_the_whole_frame():
    p = Profile(rate_bps=9800, delay_s=0.1)
    d = Direction(p, seed=1)
    out = exact(d, [(0.0, FRAME)] * 50)
    times = [t for t, _ in out]
    ser = len(FRAME) * 8 / 9800
    assert times[0] == pytest.approx(ser + 0.1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(g == pytest.approx(ser) for g in gaps)
    # goodput over the burst = the link rate
    assert len(FRAME) * 8 * 49 / (times[-1] - times[0]) == pytest.approx(9800)


def test_delay_alone_and_transparent_lan():
    d = Direction(Profile(delay_s=0.05))
    out = exact(d, [(1.0, b"x" * 100)])
    assert out[0][0] == pytest.approx(1.05)
    lan = Direction(load_builtin_profiles().profiles["lan"])
    lan.offer(b"y" * 60, 3.0)
    assert lan.next_deadline() == 0.0 and lan.due(3.0) == [b"y" * 60]


def test_random_loss_rate_and_that_lost_frames_use_no_link_time():
    d = Direction(Profile(rate_bps=1e6, loss=0.10), seed=7)
    out = exact(d, [(i * 0.01, FRAME) for i in range(20000)])
    loss = 1 - len(out) / 20000
    assert loss == pytest.approx(0.10, abs=0.01)
    assert d.stats.lost_random == 20000 - len(out)


def test_gilbert_elliott_mean_burst_length():
    ge = GilbertElliott(p=0.02, r=0.25)  # mean burst 1/r = 4 packets, mean loss 0.02/0.27
    d = Direction(Profile(gilbert_elliott=ge), seed=3)
    delivered = []
    for i in range(200000):
        d.offer(i.to_bytes(4, "big"), 0.0)
        got = d.due(0.0)
        delivered.append(bool(got))
    bursts = []
    run_len = 0
    for ok in delivered:
        if not ok:
            run_len += 1
        elif run_len:
            bursts.append(run_len)
            run_len = 0
    assert statistics.mean(bursts) == pytest.approx(4.0, rel=0.30)
    assert 1 - sum(delivered) / len(delivered) == pytest.approx(ge.mean_loss(), rel=0.15)


def test_queue_limit_tail_drops_and_reports():
    d = Direction(Profile(rate_bps=9800, queue_packets=10), seed=1)
    for _ in range(25):
        d.offer(FRAME, 0.0)
    assert d.stats.dropped_queue == 15
    assert d.queued(0.0) == (10, 10 * len(FRAME))
    ser = len(FRAME) * 8 / 9800
    assert d.queued(3.5 * ser)[0] == 7  # three fully serialized by then
    bq = Direction(Profile(rate_bps=9800, queue_bytes=1000), seed=1)
    for _ in range(10):
        bq.offer(FRAME, 0.0)
    assert bq.stats.dropped_queue == 10 - 1000 // len(FRAME)


def test_outage_passes_nothing_and_loses_what_was_on_the_air():
    d = Direction(Profile(rate_bps=9800, delay_s=0.1), seed=1)
    for _ in range(5):
        d.offer(FRAME, 0.0)  # due at ~0.3, 0.5, ... 1.09 s
    d.set_up(False, 0.35)
    d.offer(FRAME, 0.5)  # offered during the outage: dropped
    assert d.due(0.6) == []
    d.set_up(True, 0.8)
    rest = []
    while (nd := d.next_deadline()) is not None:
        rest += d.due(nd)
    # the first frame was due at ~0.30 s but nobody polled before the fade began at
    # 0.35 s, so it, and every frame due inside the fade, is lost; the ones due
    # after the link came back at 0.8 s come through
    assert len(rest) == sum(1 for k in range(1, 6) if k * len(FRAME) * 8 / 9800 + 0.1 > 0.8)
    assert d.stats.dropped_outage == 5 + 1 - len(rest)


def test_duplicate_corrupt_reorder_and_mtu():
    d = Direction(Profile(duplicate=1.0, delay_s=0.01), seed=1)
    d.offer(b"a" * 60, 0.0)
    assert d.due(0.02) == [b"a" * 60, b"a" * 60]

    c = Direction(Profile(corrupt=1.0, delay_s=0.01), seed=2)
    frame = bytes(100)
    c.offer(frame, 0.0)
    (got,) = c.due(0.02)
    diff = [i for i in range(100) if got[i] != frame[i]]
    assert len(diff) == 1 and diff[0] >= 14 and bin(got[diff[0]]).count("1") == 1

    r = Direction(Profile(reorder=0.5, delay_s=0.1), seed=5)
    for i in range(200):
        r.offer(i.to_bytes(2, "big") + bytes(58), i * 0.001)
    order = [int.from_bytes(f[:2], "big") for f in r.due(0.5)]
    assert sorted(order) == list(range(200)) and order != list(range(200))
    assert r.stats.reordered == pytest.approx(100, abs=30)

    m = Direction(Profile(mtu=500))
    m.offer(bytes(14 + 501), 0.0)
    m.offer(bytes(14 + 500), 0.0)
    assert len(m.due(0.0)) == 1 and m.stats.dropped_mtu == 1


def test_jitter_never_reorders():
    d = Direction(Profile(delay_s=0.1, jitter_s=0.05), seed=9)
    out = exact(d, [(i * 0.001, i.to_bytes(4, "big")) for i in range(500)])
    seqs = [int.from_bytes(f, "big") for _, f in out]
    assert seqs == list(range(500))
    ds = [t - s * 0.001 for (t, _), s in zip(out, seqs)]
    assert min(ds) >= 0.05 - 1e-9 and max(ds) <= 0.15 + 0.002


def test_profile_change_applies_to_new_frames():
    d = Direction(Profile(delay_s=0.1))
    d.offer(b"old" * 20, 0.0)
    d.set_profile(Profile(delay_s=0.5))
    d.offer(b"new" * 20, 0.0)
    out = exact(d, [])
    assert [round(t, 3) for t, _ in out] == [0.1, 0.5]


def _ping_pong(ab: Direction, ba: Direction, now: float) -> float:
    """A 100-byte frame each way, the answer sent as the question arrives: the round trip."""
    t0 = now
    for d in (ab, ba):
        d.offer(bytes(100), now)
        now = d.next_deadline()
        assert len(d.due(now)) == 1
    return now - t0


def test_hf_soft_link_is_set_up_after_idle_and_either_way_keeps_it_up():
    """hf-1200 (seed 003): the first round trip pays the link set-up, the next ones do not
    (the answer kept the link up), and after more than link_idle_s of silence it is paid again."""
    from c2dtn.topologies.channel import LinkActivity

    p = load_builtin_profiles().get("hf-1200", "test", "profile")
    shared = LinkActivity()
    ab, ba = Direction(p, 1, activity=shared), Direction(p, 2, activity=shared)
    first = _ping_pong(ab, ba, 0.0)
    now = first
    then = []
    for _ in range(5):
        then.append(_ping_pong(ab, ba, now))
        now += then[-1]
    again = _ping_pong(ab, ba, now + p.link_idle_s + 1)
    print(f"hf-1200 round trips: first {first:.1f} s, then {statistics.median(then):.1f} s, after idle {again:.1f} s")
    assert 17.0 <= first <= 19.5  # seed 003: 18.0 s
    assert 10.7 <= statistics.median(then) <= 12.7  # seed 003: 11.7 s on average
    assert again - statistics.median(then) > p.link_setup_s - 1.0
    # two directions that do not share the link each drop it between their own frames
    lone_ab, lone_ba = Direction(p, 1), Direction(p, 2)
    lone = _ping_pong(lone_ab, lone_ba, 0.0)
    assert lone > first + p.link_setup_s - 1.0  # set up each way
    assert _ping_pong(lone_ab, lone_ba, lone) > first - 1.0  # and again on the next round trip


def test_link_setup_is_not_transparent_and_netem_refuses_it():
    from c2dtn.topologies.netem import netem_args

    p = Profile(link_setup_s=1.0, link_idle_s=5.0)
    assert not p.is_transparent()
    with pytest.raises(ValueError, match="link set-up"):
        netem_args(p)
