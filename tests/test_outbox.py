"""The outbox index (overlay/outbox.py) against the plainest reading of each question: a
walk over every record, as the SQLite store's queries read before the index answered them.
Random changes (add, send, retry, ack, supersede, delete, transactions undone) over several
seeds; after each, every question must get the walk's answer."""

import random
from dataclasses import replace

import pytest

from c2dtn.overlay.outbox import Outbox
from c2dtn.overlay.store import OutItem

DSTS = ["gw2", "gw3", "gw4"]


def _order(it):
    return it.priority, it.seq


def walk(items: dict[int, OutItem], members: dict[int, dict[str, bool]], now: int, places=None) -> dict:
    """Every question, answered by a walk over all records (`places`: seq -> the place in
    the unsent order it took from one it superseded)."""
    places = places or {}
    v = sorted(items.values(), key=_order)
    wire = [it for it in v if it.inflight and not it.received]
    out = {
        "totals": (len(v), sum(it.size for it in v)),
        "destinations": sorted({it.dst for it in v}),
        "due": [it.seq for it in wire if it.retry_ms is not None and it.retry_ms <= now],
        "expired": sorted((it.expires_ms, it.seq) for it in v if it.expires_ms <= now),
        "next_retry": min((it.retry_ms for it in wire if it.retry_ms is not None), default=None),
        "next_expiry": min((it.expires_ms for it in v), default=None),
        "inflight_bytes": {d: sum(it.size for it in wire if it.dst == d) for d in {it.dst for it in wire}},
        "summary": sorted(
            (
                d,
                p,
                sum(1 for it in v if (it.dst, it.priority) == (d, p) and not it.inflight),
                sum(1 for it in v if (it.dst, it.priority) == (d, p) and it.inflight),
                sum(it.size for it in v if (it.dst, it.priority) == (d, p)),
            )
            for d, p in {(it.dst, it.priority) for it in v}
        ),
        "between": sorted(s for s in items if 20 <= s <= 60),
    }
    for d in DSTS:
        mine = [it for it in v if it.dst == d]
        open_ = [it for it in wire if it.dst == d and not it.superseded]
        out[d] = {
            "queued": [
                it.seq
                for it in sorted(
                    (it for it in mine if not it.inflight), key=lambda it: (it.priority, places.get(it.seq, it.seq))
                )
            ][:7],
            "inflight": [it.seq for it in open_],
            "lacking m1": [it.seq for it in open_ if "m1" not in members.get(it.seq, {})],
            "sent before": [it.seq for it in open_ if it.sent_ms is not None and it.sent_ms < now - 50][:3],
            "retry after": [it.seq for it in open_ if it.retry_ms is not None and it.retry_ms > now],
            "last sent": max((it.sent_ms or 0 for it in mine if it.inflight), default=0),
            "stale": sorted(it.seq for it in wire if it.dst == d and it.superseded and it.sent_ms < now - 20),
            "floor": [
                min((it.cseq for it in mine if it.priority == p and not it.superseded and it.cseq > 0), default=0)
                for p in range(4)
            ],
            "pending": any(not it.inflight for it in mine) or bool(open_),
            "key k1": sorted(it.seq for it in mine if it.supersede == "k1"),
        }
    return out


def ask(ob: Outbox, now: int) -> dict:
    out = {
        "totals": ob.totals(),
        "destinations": ob.destinations(),
        "due": [it.seq for it in ob.due(now)],
        "expired": [(it.expires_ms, it.seq) for it in ob.expired(now)],
        "next_retry": ob.next_retry_ms(),
        "next_expiry": ob.next_expiry_ms(),
        "inflight_bytes": ob.inflight_bytes(),
        "summary": ob.summary(),
        "between": ob.seqs_between(20, 60),
    }
    for d in DSTS:
        out[d] = {
            "queued": [it.seq for it in ob.queued(d, 7)],
            "inflight": [it.seq for it in ob.inflight(d)],
            "lacking m1": [it.seq for it in ob.inflight(d, lacking="m1")],
            "sent before": [it.seq for it in ob.inflight(d, sent_before_ms=now - 50, limit=3)],
            "retry after": [it.seq for it in ob.inflight(d, retry_after_ms=now)],
            "last sent": ob.last_sent_ms(d),
            "stale": ob.superseded_inflight(d, now - 20),
            "floor": [ob.min_cseq(d, p) for p in range(4)],
            "pending": ob.pending(d),
            "key k1": [it.seq for it in ob.by_key(d, "k1")],
        }
    return out


@pytest.mark.parametrize("seed", range(6))
def test_every_question_gets_the_answer_a_walk_over_all_records_gives(seed):
    rng = random.Random(seed)
    ob = Outbox()
    items: dict[int, OutItem] = {}  # the model: what a store holds
    members: dict[int, dict[str, bool]] = {}
    places: dict[int, int] = {}
    nxt, now, cseq = 0, 1_000, dict.fromkeys([(d, p) for d in DSTS for p in range(4)], 0)
    for step in range(600):
        now += rng.randrange(0, 40)
        op = rng.random()
        undo = rng.random() < 0.1
        before = (
            {s: replace(it) for s, it in items.items()},
            {s: dict(m) for s, m in members.items()},
            dict(places),
        )
        ob.begin()
        if op < 0.35:  # submit a few; a keyed one may supersede an unsent one and take its place
            adds, took = [], {}
            for _ in range(rng.randrange(1, 4)):
                nxt += 1
                d, p = rng.choice(DSTS), rng.randrange(4)
                key = rng.choice([None, None, "k1", "k2"])
                c = 0 if key else cseq[(d, p)] + 1
                if not key:
                    cseq[(d, p)] = c
                size = rng.randrange(0, 300)
                life = rng.randrange(100, 5_000)
                adds.append(
                    OutItem(nxt, d, p, c, now, life, now + life, key, "", b"x" * size, size, False, 0, None, None)
                )
                old = [
                    it
                    for it in items.values()
                    if (it.dst, it.supersede, it.priority, it.inflight) == (d, key, p, False)
                ]
                if key and old and rng.random() < 0.7:
                    took[nxt] = min(places.get(it.seq, it.seq) for it in old)
                    assert took[nxt] == min(ob.place(it.seq) for it in old)
                    assert ob.place_of(old[0].seq)[0] == ob.place(old[0].seq)
                    ob.delete([it.seq for it in old])
                    for it in old:
                        del items[it.seq]
                        members.pop(it.seq, None)
            ob.add(adds, {q: (p, 100) for q, p in took.items()})
            places.update(took)
            for it in adds:
                items[it.seq] = replace(it, body=b"")
        elif op < 0.55 and items:  # send some queued (retransmissions too)
            seqs = rng.sample(sorted(items), min(len(items), rng.randrange(1, 6)))
            retry = {s: now + rng.randrange(0, 300) for s in seqs}
            ob.sent(seqs, now, retry)
            for s in seqs:
                it = items[s]
                it.inflight, it.attempts, it.sent_ms, it.retry_ms = True, it.attempts + 1, now, retry[s]
        elif op < 0.65 and items:  # new retry times
            seqs = rng.sample(sorted(items), min(len(items), 3))
            t = {s: now + rng.randrange(-50, 300) for s in seqs}
            ob.set_retry(t)
            for s in seqs:
                items[s].retry_ms = t[s]
        elif op < 0.75 and items:  # received, superseded
            seqs = rng.sample(sorted(items), min(len(items), 2))
            field = rng.choice(["received", "superseded"])
            ob.update(seqs, **{field: True})
            for s in seqs:
                setattr(items[s], field, True)
        elif op < 0.82 and items:  # a member's ack
            s = rng.choice(sorted(items))
            m, done = rng.choice(["m1", "m2"]), rng.random() < 0.5
            ob.member_ack(s, m, done)
            members.setdefault(s, {})[m] = done
        elif items:  # released or expired
            seqs = rng.sample(sorted(items), min(len(items), rng.randrange(1, 4))) + [10**9]
            gone = ob.delete(seqs)
            assert sorted(it.seq for it in gone) == sorted(s for s in seqs if s in items)
            for s in seqs:
                items.pop(s, None)
                members.pop(s, None)
        if undo:
            ob.rollback()
            items, members, places = before
        else:
            ob.commit()
        assert ask(ob, now) == walk(items, members, now, places), f"seed {seed}, step {step}"
        assert {s: m for s, m in ob.members.items()} == {s: m for s, m in members.items() if s in items}
    # and built again from the records (a store opened), it answers the same, but for the
    # places taken (kept in memory only: reopened, the queue goes in seq order)
    assert places, "no supersession took a place: the walk did not try the case"
    again = Outbox(list(items.values()), members)
    assert ask(again, now) == walk(items, members, now)


def test_answers_are_copies_and_bodies_stay_in_the_store():
    ob = Outbox()
    ob.add([OutItem(1, "gw4", 3, 1, 0, 100, 100, None, "", b"secret", 6, False, 0, None, None)])
    got = ob.get([1, 2])
    assert list(got) == [1] and got[1].body == b"" and got[1].size == 6
    got[1].received = True  # a caller's change to its copy changes nothing held
    assert not ob.get([1])[1].received and ob.queued("gw4", 5)[0].seq == 1


def test_a_seq_added_twice_is_refused():
    ob = Outbox([OutItem(1, "gw4", 3, 1, 0, 100, 100, None, "", b"", 0, False, 0, None, None)])
    with pytest.raises(ValueError, match="outbox already holds seq 1"):
        ob.add([OutItem(1, "gw4", 3, 2, 0, 100, 100, None, "", b"", 0, False, 0, None, None)])


def test_transactions_undone_again_and_again_leave_the_heaps_bounded():
    """A full disk undoes every plan for as long as it lasts: each undo puts the touched records
    back, and their times must not pile up in the heaps."""
    ob = Outbox()
    ob.add(
        [
            OutItem(s, "gw4", 3, s, 0, 3_600_000, 3_600_000, None, "", b"", 1, False, 0, None, None)
            for s in range(1, 101)
        ]
    )
    ob.sent(range(1, 101), 0, dict.fromkeys(range(1, 101), 1_000))
    for i in range(2_000):
        ob.begin()
        now = 2_000 + i
        ob.sent([it.seq for it in ob.due(now)], now, {s: now + 5_000 for s in range(1, 101)})
        ob.rollback()
    assert len(ob._expiry) <= 2 * ob.n + 64 and len(ob._retry) <= 2 * ob.n + 64
    assert [it.seq for it in ob.due(10_000)] == list(range(1, 101)) and ob.next_expiry_ms() == 3_600_000
