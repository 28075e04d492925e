"""A "done" that follows its "got" (decision 0033), in virtual time.

An ack that cannot wait for the application (one on a gap goes at once) says "got"; the
application's "done" comes a moment later.  That "done" only releases custody at the origin,
which resends nothing meanwhile, so it rides with the next bundle to the origin or goes alone
after FOLLOWUP_ACK_FACTOR ack delays, not as a second ack bundle one ack delay later.
"""

from c2dtn.overlay.core import FOLLOWUP_ACK_FACTOR, GOT_SENT_MAX, OverlayCore
from c2dtn.overlay.custody import Custody, Quota
from c2dtn.overlay.envelope import Codec, Priority
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store.memory import MemoryStore

KEY = b"f" * 32
DELAY = 1_000
CFG = SchedulerConfig(ack_delay_ms=DELAY, min_rto_ms=60_000, initial_rto_ms=120_000)


def pair():
    a = OverlayCore(Custody(MemoryStore(), "gw1", Quota()), Codec("gw1", {"gw4": KEY}), CFG)
    b = OverlayCore(Custody(MemoryStore(), "gw4", Quota()), Codec("gw4", {"gw1": KEY}), CFG)
    return a, b


def reports(a, n, t0=0):
    """n reports from a, each in its own bundle: their payloads."""
    out = []
    for i in range(n):
        a.submit("gw4", b"pos %d" % i, t0 + i, priority=Priority.PRIORITY, supersede=f"u{i}")
        (bundle,) = a.poll(t0 + i)
        out.append(bundle.payload)
    return out


def gap_acked(a, b):
    """b gets the first and third of three reports (the second lost): it acks "got" at once, and
    its application takes both at 150.  Returns the acks of that first bundle (done, got)."""
    sent = reports(a, 3)
    b.on_bundle(sent[0], 100)
    b.on_bundle(sent[2], 101)
    (first,) = b.poll(101)
    b.consumed([d.id for d in b.take()], 150)
    return first.acks[a.store.source]


def test_a_done_after_its_got_goes_alone_only_after_the_longer_delay():
    a, b = pair()
    done, got = gap_acked(a, b)
    assert (done, got) == ([], [1, 3])  # at once, before the application took them
    assert b.next_wakeup_ms() == 150 + FOLLOWUP_ACK_FACTOR * DELAY
    for t in (1_150, 2_000, 150 + FOLLOWUP_ACK_FACTOR * DELAY - 1):
        assert b.poll(t) == []  # not one ack delay after it was taken, as before
    (later,) = b.poll(150 + FOLLOWUP_ACK_FACTOR * DELAY)
    assert later.seqs == [] and later.acks[a.store.source][0] == [1, 3]
    a.on_bundle(later.payload, 5_000)
    assert a.store.held_out()[0] == 1  # the origin let go of both; the lost second is still its own


def test_a_done_after_its_got_rides_with_the_next_bundle_to_its_origin():
    a, b = pair()
    gap_acked(a, b)
    assert b.poll(1_150) == []
    b.submit("gw1", b"order", 1_500, priority=Priority.FLASH)
    (bundle,) = b.poll(1_500)
    assert bundle.seqs and bundle.acks[a.store.source][0] == [1, 3]
    assert b.poll(150 + FOLLOWUP_ACK_FACTOR * DELAY) == []  # nothing left to say


def test_a_done_whose_got_never_went_keeps_the_ack_delay():
    a, b = pair()
    sent = reports(a, 2)
    for i, p in enumerate(sent):  # in turn: nothing calls for an ack at once
        b.on_bundle(p, 100 + i)
    b.consumed([d.id for d in b.take()], 150)
    assert b.poll(100 + DELAY - 1) == []
    (ack,) = b.poll(100 + DELAY)
    assert ack.acks[a.store.source] == ([1, 2], [])


def test_new_data_from_the_origin_brings_the_follow_up_back_to_the_ack_delay():
    a, b = pair()
    gap_acked(a, b)
    a.submit("gw4", b"pos 9", 500, priority=Priority.PRIORITY, supersede="u9")
    (bundle,) = [x for x in a.poll(500) if 4 in x.seqs]  # (with the lost second, resent: the ack showed it)
    b.on_bundle(bundle.payload, 600)
    b.consumed([d.id for d in b.take()], 620)
    assert b.poll(600 + DELAY - 1) == []
    (ack,) = b.poll(600 + DELAY)  # one ack delay after the new one came: the follow-up rides along
    assert set(ack.acks[a.store.source][0]) >= {1, 3, 4}


def test_what_a_peer_can_make_a_node_remember_is_bounded():
    # a peer's bundles out of turn make "got" acks go at once, each remembered until its "done":
    # past GOT_SENT_MAX seqs of one source the oldest are forgotten (their "done" waits as any ack)
    a, b = pair()
    n = GOT_SENT_MAX + 50
    for i in range(n):
        a.submit("gw4", b"p%d" % i, i, priority=Priority.PRIORITY, supersede=f"u{i}")
    payloads = [x.payload for x in a.poll(n)]
    for t, p in enumerate(reversed(payloads)):  # every one out of turn
        b.on_bundle(p, 1_000 + t)
        b.poll(1_000 + t)
    assert sum(len(s) for s in b._got_sent.values()) <= GOT_SENT_MAX
