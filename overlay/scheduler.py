"""Scheduler: decides what the BPA gets next (I/O-free; time comes in as now_ms).

The overlay, not the BPA, holds the queue.  Per destination node it hands the
BPA at most a window of bytes in flight (sent, not yet acked), so priority,
supersession, expiry and aggregation still act while the link is slow or down.

- Strict priority between classes (flash, immediate, priority, routine); oldest
  first within a class.  Retransmissions compete by the same order.
- Window per destination, adapted to the rate acks come back (ack clocking as
  in TCP): it grows by the bytes acked (slow start) up to ssthresh, then by
  about one envelope per window; a retransmission timeout halves it.
- A model of the path once slow start has filled it (after BBR, draft-ietf-ccwg-bbr): the
  delivery rate (bytes acked over the span they took, the largest of the last BW_ROUNDS
  round trips) and the minimum round trip, with the time the receiver held its acks taken
  out (they say how long, as QUIC's ACK Delay).  The window is then what the path carries
  in that round trip plus ack_delay_ms (acks may wait that long) plus queue_target_ms of
  queue below the overlay, and bundles are paced at PACING_GAIN times the rate: the radio
  always has the next bundle, and never holds minutes of envelopes, where an order can no
  longer overtake them and a newer position no longer replace them.  Radio loss changes
  neither (losses are resent, RACK); a rate that falls does.  (Before, a queue limit cut the
  window whenever the round trip rose: it read held acks as queueing and the radio idled,
  decision 0011.)  While what is queued first cannot be superseded, bundles more may go (two
  for a transfer, one for an order), so that lost acks or frames do not idle the radio until
  the next ack, and RACK's reordering window is then at least two bundles' time (decisions
  0037, 0039).
- Retransmission timeout from the smoothed round trip (RFC 6298 estimator,
  Karn's rule: no samples from retransmitted envelopes), doubled per attempt,
  between min_rto_ms and max_rto_ms.
- Aggregation: envelopes for one destination share a bundle up to
  aggregate_bytes (those larger than that, with each other, up to
  aggregate_large_bytes); pending acks for that node ride along.  On slow links
  linger_ms lets a few more gather first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from c2dtn.overlay.custody import Custody
from c2dtn.overlay.envelope import (
    MAX_BUNDLE_PLAIN_BYTES,
    MAX_ENVELOPES_PER_BUNDLE,
    SN_MOD,
    Codec,
    Envelope,
    Kind,
    Priority,
    encode_ack_body,
    heard_of,
)
from c2dtn.overlay.store import OutItem

ACK_LIFETIME_MS = 3600_000
# tail probes while no ack shows progress go at doubling intervals of at most this long
# (Scheduler._tail_probes)
PROBE_MAX_MS = 30_000
# a burst's last envelope goes twice while one went again within this many sends
# (Scheduler._tail_copy): a path that lost none lately (a wire, a clean radio) pays nothing
COPY_AFTER_LOSS_SENDS = 100
# a bundle's new envelopes go again in the next bundle to their destination that goes within
# this long, while the path lost one lately and nothing waits behind (Scheduler._copies): on a
# lossy radio a lost one arrives a frame later instead of a repair's two trips later (decision 0042)
COPY_NEXT_WITHIN_MS = 500
# bundles of room past the window while a transfer waits (Scheduler._room_for_lost_acks): two
# frames or acks lost in a row would otherwise run the radio's queue dry (decision 0039)
ROOM_BUNDLES = 2
# an envelope's sendings that may go as a delta against what its destination acked
# (Codec.map_bytes): its first, and its first resend where the destination acked a delta sent
# after the first (Codec.references_held); later ones go whole, for a receiver that lost its
# references (a restart) refuses a delta unacked and cannot say so (decision 0040)
DELTA_SENDINGS = 2
RTT_RECENT = 4  # the last samples kept: the minimum round trip falls back to their smallest
MIN_RTT_WINDOW_MS = 120_000  # the minimum round trip is the smallest of this long
BW_ROUNDS = 10  # the delivery rate is the largest sample of this many round trips (BBR's filter)
FULL_BW_GROWTH = 1.25  # slow start ends after FULL_BW_ROUNDS round trips without this much more rate
FULL_BW_ROUNDS = 3
PACING_GAIN = 1.25  # bundles go at this multiple of the delivery rate, so a rate that grew is found
HOLD_CAP_MIN_MS = 1000  # a hold an ack reports counts up to 2 x ack_delay_ms, or this
PACE_SLACK_MS = 10  # what the pace may run ahead of now in one plan (a fast link needs no plan per bundle)
# a paced bundle's worth is counted sealed, and is at most this many bundles' worth of plain
# bytes whatever the path's wire ratio says (it lags a change of traffic: decision 0027)
PACED_PLAIN_MAX = 16
# announcements of the next send number kept per destination (Scheduler.on_heard): their answers
# come a round trip later, and one goes per ack-only bundle
ANNOUNCED_KEPT = 48
SENT_STATES_MAX = 4096  # send records kept per destination for rate samples (oldest forgotten)


@dataclass(frozen=True)
class SchedulerConfig:
    init_window: int = 8 * 1024
    min_window: int = 1024
    max_window: int = 4 << 20
    aggregate_bytes: int = 16 * 1024
    # Envelopes over aggregate_bytes (each alone in a bundle otherwise) share one up to this
    # (0: as aggregate_bytes).  Where a BPA's cost is per bundle and the link is fast (a LAN:
    # dtnd took ~36 ms a bundle from 100 kB up to a megabyte), big envelopes then cost a
    # fraction of that each; a bundle stays no larger than one megabyte envelope's already is,
    # so nothing waits behind it longer than behind such an envelope.
    aggregate_large_bytes: int = 0
    # The BPAs hold bundles hop by hop through an outage, so end-to-end
    # retransmission is the safety net for a lost or crashed BPA, not the
    # first line: its timers are generous.
    initial_rto_ms: int = 60_000
    min_rto_ms: int = 20_000
    max_rto_ms: int = 600_000
    # On a kbit/s radio every bundle costs ~100 bytes of headers (BPv7 blocks, UDP/IP):
    # linger_ms holds priority and routine envelopes up to this long so that several
    # share one bundle (flash and immediate never wait; 0: no linger, as on a LAN);
    # ack_delay_ms is how long acks wait for data to ride on or for more acks.
    linger_ms: int = 0
    ack_delay_ms: int = 100
    # queueing below the overlay the window allows on top of what the path carries in its
    # round trip, at the path's delivery rate (0: no model, the window grows as in TCP Reno)
    queue_target_ms: int = 1000


@dataclass
class Path:
    window: float
    ssthresh: float
    srtt_ms: float | None = None
    rttvar_ms: float = 0.0
    rto_ms: float = 60_000
    last_timeout_ms: int = -1
    min_rtt_ms: float | None = None
    last_ack_ms: int = 0  # when an ack last showed progress
    probes: int = 0  # tail probes sent since an ack last showed progress
    # a group's tail probes go per member (Scheduler._tail_probes): member -> (when its ack
    # last showed progress, probes sent for it since)
    members: dict[str, tuple[int, int]] = field(default_factory=dict)
    reo_steps: int = 1  # reordering window in quarters of the minimum round trip (RFC 8985 6.2)
    # room past the window at the last plan (Scheduler._room_for_lost_acks)
    extra_room: float = 0.0
    last_sent_ms: int | None = None  # when envelopes last went (from the store once after a start)
    inherited: bool = False  # the store held envelopes in flight to it when this process started
    recent: list[float] = field(default_factory=list)  # the last RTT_RECENT samples
    min_rtt_at_ms: int = 0  # when a sample last came near the minimum
    # the delivery-rate model (Scheduler._rate_sample)
    delivered: float = 0.0  # bytes of envelopes that arrived (acked), in all
    delivered_ms: int = 0  # when that last grew
    first_sent_ms: int = 0  # when the newest envelope of the last rate sample was sent
    rounds: int = 0  # round trips counted (one ends when what was sent after it began is acked)
    round_end: float = 0.0  # `delivered` at which the current round trip ends
    bw: list[tuple[int, float]] = field(default_factory=list)  # (round, bytes per ms) samples
    full_bw: float = 0.0
    full_bw_rounds: int = 0
    filled: bool = False  # slow start found the path's rate: the model sets the window
    app_limited_until: float = 0.0  # samples before `delivered` passes this had too little to send
    pace_at: float = 0.0  # routine and priority envelopes go no sooner (pacing; Scheduler.plan)
    sends: int = 0  # envelopes handed over, in all (their order)
    copy_sent_ms: int | None = None  # when a tail copy last went, and its frame's time at the rate
    copy_frame_ms: float = 0.0
    lost_at_sends: int | None = None  # `sends` when an envelope last went again (a loss, or its ack's)
    wire_ratio: float = 1.0  # sealed bytes per plain body byte of the data envelopes sent lately
    holds: list[int] = field(default_factory=list)  # how long the receiver held its last RTT_RECENT acks

    def rate(self) -> float:
        """The path's delivery rate, bytes per ms (0: none measured)."""
        return max((b for _, b in self.bw), default=0.0)

    def sample(self, rtt_ms: float, cfg: SchedulerConfig, now_ms: int = 0) -> None:
        """A round-trip sample, the receiver's hold of its ack already taken out."""
        self.recent = (self.recent + [rtt_ms])[-RTT_RECENT:]
        if self.min_rtt_ms is None or rtt_ms <= self.min_rtt_ms * 1.1:
            self.min_rtt_ms = rtt_ms if self.min_rtt_ms is None else min(self.min_rtt_ms, rtt_ms)
            self.min_rtt_at_ms = now_ms
        elif now_ms - self.min_rtt_at_ms > MIN_RTT_WINDOW_MS:  # nothing near it for long: the path changed
            self.min_rtt_ms, self.min_rtt_at_ms = min(self.recent), now_ms
        if self.srtt_ms is None:
            self.srtt_ms, self.rttvar_ms = rtt_ms, rtt_ms / 2
        else:
            self.rttvar_ms = 0.75 * self.rttvar_ms + 0.25 * abs(self.srtt_ms - rtt_ms)
            self.srtt_ms = 0.875 * self.srtt_ms + 0.125 * rtt_ms
        self.rto_ms = min(cfg.max_rto_ms, max(cfg.min_rto_ms, self.srtt_ms + 4 * self.rttvar_ms))


# (done, got) seqs of one destination's envelopes, or source key -> (done, got) for a group
AckSeqs = tuple[list[int], list[int]] | dict[str, tuple[list[int], list[int]]]


def _has_acks(ack_seqs: AckSeqs | None) -> bool:
    """Do these acks (one peer's (done, got), or per source for a group) name anything?"""
    if not ack_seqs:
        return False
    if isinstance(ack_seqs, dict):
        return any(d or g for d, g in ack_seqs.values())
    return bool(ack_seqs[0] or ack_seqs[1])


@dataclass
class Outgoing:
    """One bundle to hand to the BPA."""

    dst: str
    payload: bytes
    seqs: list[int]  # data envelopes inside
    # (done, got) seqs of dst's envelopes acked inside (dst's store before incarnations); or
    # source key (origin and incarnation, envelope.source_key) -> (done, got)
    acks: AckSeqs = ([], [])
    retransmissions: int = 0


class Scheduler:
    def __init__(self, store: Custody, codec: Codec, cfg: SchedulerConfig = SchedulerConfig()):
        self.store = store
        self.codec = codec
        self.cfg = cfg
        self.paths: dict[str, Path] = {}
        self._linger_until: dict[str, int] = {}  # dst -> when its lingering envelopes go
        # dst -> since when its queue has lingered: a report that supersedes one waiting takes the
        # older's time, so reports more frequent than the linger still go (else the newest waits
        # on, and nothing goes)
        self._linger_since: dict[str, int] = {}
        # dst -> {seq: (size, due again at)} of retransmissions that were due when the window
        # had no room for them: lost as far as the window goes (as TCP counts what timed out),
        # waiting for an ack (on_ack makes them due at once) or one RTO
        self._deferred: dict[str, dict[int, tuple[int, int]]] = {}
        self._probe_at: dict[str, int] = {}  # dst -> when a tail probe is due
        # dst -> {seq: (delivered, delivered_ms, first_sent_ms, sent_ms, order, behind)} when each
        # went: the path's state a rate sample is taken against (as BBR's per-packet records),
        # the order it went in (RACK's ties: several go in the same millisecond), and whether it
        # was queued behind another frame on the radio (Scheduler._tail_copy)
        self._sent: dict[str, dict[int, tuple[float, int, int, int, int, bool]]] = {}
        # dst -> seqs last sent again because an ack showed them lost (RACK trusts their acks)
        self._found_resent: dict[str, set[int]] = {}
        # dst -> seqs found lost (RACK, a probe's ack): due again, but not a timeout
        self._lost: dict[str, set[int]] = {}
        # dst -> the envelope last sent again as a burst's tail copy (_tail_copy), and whether
        # that copy is still to go
        self._copied: dict[str, tuple[int, bool]] = {}
        self._counted: dict[str, set[int]] = {}  # group -> seqs its rate already counted (_rate_sample)
        self._pace_wait: dict[str, int] = {}  # dst -> when pacing lets its queued envelopes go
        self._sn: dict[str, int] = {}  # dst -> the send number of the next data envelope sealed for it
        # dst -> (when, [(envelope, its map)]) of the new envelopes of the last bundle to dst, to go
        # again in the next one (_copies): one bundle's at most, a destination
        self._next_copies: dict[str, tuple[int, list[tuple[Envelope, bytes]]]] = {}
        # dst -> {what an answer to an announcement names (envelope.heard_of): (when, the send order
        # then, who answered it)}, the newest ANNOUNCED_KEPT a destination: an answer counts only
        # for an announcement made, once per member (on_heard)
        self._announced: dict[str, dict[int, tuple[int, int, set[str | None]]]] = {}

    def path(self, dst: str) -> Path:
        p = self.paths.get(dst)
        if p is None:
            p = self.paths[dst] = Path(self.cfg.init_window, self.cfg.max_window, rto_ms=self.cfg.initial_rto_ms)
            p.inherited = bool(self.store.last_sent_ms(dst))  # once per destination per process
        return p

    # -- planning ----------------------------------------------------------
    def plan(
        self,
        now_ms: int,
        acks: dict[str, tuple[list[int], list[int]]] | None = None,
        acks_due: set[str] | None = None,
        only: set[str] | None = None,
        holds: dict[str, int] | None = None,
        heard: dict[str, int] | None = None,
    ) -> list[Outgoing]:
        """What to send now.  Marks what it returns as in flight in the store.

        Pending acks ride along with data for their node; those in acks_due (all,
        when None) go in a bundle of their own if no data is going that way.
        only: what is queued for these destinations (and the acks they are owed), nothing
        else: no expiry, no retransmissions, no tail probes (the next full plan does those, at
        their times); for what is planned at once (a flash submit, an answer).
        holds: per source key, how long its newest envelope has waited for its ack (the acks
        say so, encode_ack_body).
        heard: per source key, a send number it announced past one that has not come here
        (encode_ack_body); such an ack goes even when it names nothing."""
        st = self.store
        probes: set[int] = set()
        probe_new: set[str] = set()
        retries: dict[str, list[OutItem]] = {}
        if only is None:
            # maintenance only when something is due (cheap indexed look-ups first)
            next_expiry = st.next_expiry_ms()
            if next_expiry is not None and next_expiry <= now_ms:
                st.expire(now_ms)
            probes, probe_new = self._tail_probes(now_ms)
            next_retry = st.next_retry_ms()
            if next_retry is not None and next_retry <= now_ms:
                st.drop_superseded_inflight(now_ms)
                for it in st.due_retries(now_ms):
                    retries.setdefault(it.dst, []).append(it)
            for dst, items in retries.items():
                self.codec.lost(dst, [i.seq for i in items])
                # a probe is not a timeout, nor is a retry that was only waiting for room, nor
                # one found lost (an ack showed it)
                found = self._lost.get(dst, set())
                copy = self._copy_due(dst)
                if any(
                    i.seq not in probes
                    and i.seq not in self._deferred.get(dst, ())
                    and i.seq not in found
                    and i.seq != copy
                    for i in items
                ):
                    self._on_timeout(dst, now_ms)
        if only is None:  # recomputed below for every destination with something to send or owe
            self._linger_until.clear()
            self._pace_wait.clear()
        inflight = st.inflight_bytes()
        acks = dict(acks or {})
        out: list[Outgoing] = []
        visit = sorted(set(st.destinations()) | set(acks) if only is None else only)
        if only is None:  # a destination with nothing queued waits for nothing (expired, acked)
            for gone_dst in set(self._linger_since) - set(visit):
                del self._linger_since[gone_dst]
        for dst in visit:
            p = self.path(dst)
            retry = retries.get(dst, [])
            due = {i.seq for i in retry}
            deferred = self._deferred.get(dst, {})
            for seq in [q for q, (_, at) in deferred.items() if at <= now_ms and q not in due and only is None]:
                del deferred[seq]  # due again but not among the retries: acked, expired or superseded
            lost = {**{q: size for q, (size, _) in deferred.items()}, **{i.seq: i.size for i in retry}}
            extra = self._room_for_lost_acks(dst, p)
            if extra is None:  # nothing queued: kept while more than the window is on its way
                extra = p.extra_room if inflight.get(dst, 0) > p.window else 0.0
            p.extra_room = extra
            room = p.window + p.extra_room
            budget = room - (inflight.get(dst, 0) - sum(lost.values()))
            # a tail probe goes whatever the window (as TCP's): a full window is what it is for
            probe = [i for i in retry if i.seq in probes]
            copy = self._copy_due(dst)
            copy_size = sum(i.size for i in retry if i.seq == copy)
            if probe or dst in probe_new or copy_size:
                budget = max(budget, sum(i.size for i in probe) + copy_size or 1)
            chosen: list[OutItem] = []
            self._linger_until.pop(dst, None)
            self._pace_wait.pop(dst, None)
            # pacing, once the path's rate is known: each envelope moves the pace on by its size
            # at PACING_GAIN x the rate; routine and priority ones (new or resent) go a bundle's
            # worth (the larger aggregate size) at a time, each begun only while the pace is not
            # ahead of now; flash and immediate ones and probes whenever the window has room.  A
            # path with nothing in flight owes no pace.
            rate = p.rate() if p.filled and not probe and dst not in probe_new else 0.0
            pace = max(p.pace_at, now_ms) if inflight.get(dst) else float(now_ms)
            if budget > 0:
                limit = max(16, int(budget // 64) + 16)
                queued = st.queued(dst, limit=limit + 1)  # one more than is taken: is there more?
                more = len(queued) > limit
                queued = queued[:limit]
                # a probe with new data does not linger: it was counted as sent, and the next one
                # is backed off (held here, it went only when the linger ended, or later); nor
                # does what acks due now can ride with (else they go in a bundle of their own)
                acks_now = _has_acks(acks.get(dst)) and (acks_due is None or dst in acks_due)
                since = min((i.created_ms for i in queued), default=now_ms)
                since = min(since, self._linger_since.get(dst, since))
                if (
                    queued
                    and not retry
                    and dst not in probe_new
                    and not acks_now
                    and self._lingers(queued, now_ms, p.wire_ratio, since)
                ):
                    self._linger_since[dst] = since
                    self._linger_until[dst] = since + self.cfg.linger_ms
                    queued, more, lingered = [], True, True
                else:
                    lingered = False
                # probes first, then by class; in a class, resends (in seq order) before new
                # envelopes, and those in custody's order (a superseding report holds its
                # predecessor's place: decision 0014)
                rank = {it.seq: n for n, it in enumerate(queued)}
                cands = sorted(
                    retry + queued,
                    key=lambda i: (i.seq not in probes, i.priority, i.seq in rank, rank.get(i.seq, i.seq)),
                )
                quantum: float = 0  # what the paced bundle begun may still take (a bundle's worth, sealed)
                bundle_max = max(self.cfg.aggregate_bytes, self.cfg.aggregate_large_bytes)
                for it in cands:
                    if budget <= 0:
                        break
                    if rate and it.priority > Priority.IMMEDIATE and it.seq != copy:
                        # a bundle's worth as it goes, compressed (decision 0027); the path's ratio
                        # lags a change of traffic, so an envelope counts at least 1/PACED_PLAIN_MAX
                        sealed = it.size * max(p.wire_ratio, 1 / PACED_PLAIN_MAX)
                        if sealed > quantum and quantum < bundle_max:
                            quantum = 0  # it would not fit the bundle begun: the next one waits its turn
                        if quantum <= 0:
                            if pace > now_ms + PACE_SLACK_MS:
                                self._pace_wait[dst] = math.ceil(pace)
                                continue
                            quantum = bundle_max
                        quantum -= sealed
                    chosen.append(it)
                    budget -= it.size
                    if rate:
                        pace += it.size / (PACING_GAIN * rate)
                if rate:
                    p.pace_at = pace
                gone = {it.seq for it in chosen}
                if not lingered and not more and all(it.seq in gone for it in queued):
                    self._linger_since.pop(dst, None)  # what waited went (held by pacing or room, it waits on)
                if budget > 0 and dst not in self._pace_wait and not more:
                    # all there was went, with room left: the rate samples of these say less than
                    # the path carries (BBR's app-limited samples)
                    p.app_limited_until = p.delivered + room - budget
            if retry:  # counted by cause for status and metrics, with the plan's transaction
                found = self._lost.get(dst, set())
                for it in chosen:
                    if it.seq in due:
                        cause = (
                            "probe"
                            if it.seq in probes
                            else "copy"
                            if it.seq == copy
                            else "fast"
                            if it.seq in found
                            else "timeout"
                        )
                        self.store.tally_event(f"resent_{cause}", dst, it.priority)
                        if cause != "copy":  # (a copy is not a loss: the path may lose none)
                            p.lost_at_sends = p.sends
            ack = acks.pop(dst, ([], []))
            if not chosen and acks_due is not None and dst not in acks_due:
                ack = ([], [])  # not worth a bundle of its own yet
            out.extend(self._bundle(dst, chosen, ack, now_ms, holds, inflight.get(dst, 0), heard))
            if retry:
                going = {it.seq for it in chosen}
                if copy is not None:  # it goes now or waits as any retry does, once
                    self._copied[dst] = (copy, False)
                    if copy in going:
                        p.copy_sent_ms = now_ms
                        p.copy_frame_ms = self._frame_ms(p, copy_size)
                deferred = self._deferred.setdefault(dst, {})
                for seq in going:
                    deferred.pop(seq, None)
                waiting = [it for it in retry if it.seq not in going]
                if waiting:
                    # due, but the window has no room: left due, the wake-up would be "now" and
                    # the pump would plan again at once, and again, for as long as the path is
                    # down; they wait for an ack (on_ack brings them back at once) or one RTO
                    # (or, held by pacing with room in the window, until the pace lets them go)
                    at = self._pace_wait[dst] if dst in self._pace_wait else now_ms + int(p.rto_ms)
                    self.store.set_retry({it.seq: at for it in waiting})
                    deferred.update((it.seq, (it.size, at)) for it in waiting)
                if not deferred:
                    del self._deferred[dst]
        return out

    @staticmethod
    def _frame_ms(p: Path, size: int) -> float:
        """The radio's time for an envelope of `size` plain bytes, sealed, at the path's rate."""
        rate = p.rate()
        return size * max(p.wire_ratio, 1 / PACED_PLAIN_MAX) / rate if rate else 0.0

    def _copies(self, dst: str, now_ms: int, items: list[OutItem]) -> list[tuple[Envelope, bytes]]:
        """The new envelopes of the last bundle to dst, to go again in this one (once): a frame
        lost on a radio then costs its reports the time to the next frame, not a receiver's ack
        and a resend, each a trip over a loaded radio.  Only within COPY_NEXT_WITHIN_MS of their
        first sending (later, acks show the loss and RACK or an announcement repairs it), while
        the path lost an envelope lately (a wire or a clean radio pays nothing), and while
        nothing waits to go to dst behind this bundle nor, where the path is paced, does the
        pace run ahead of now: the radio has time to spare, and a copy never holds back what
        waits (a transfer, an overload).  Copies take the pace's time as data does.  They ride
        in a bundle that goes anyway, never in one of their own (_bundle), and are not sends: no
        timer, no RACK record, no window (decision 0042)."""
        got = self._next_copies.pop(dst, None)
        if got is None or now_ms - got[0] > COPY_NEXT_WITHIN_MS:
            return []
        p = self.path(dst)
        if p.lost_at_sends is None or p.sends - p.lost_at_sends > COPY_AFTER_LOSS_SENDS:
            return []
        if p.filled and p.pace_at > now_ms + PACE_SLACK_MS:
            return []  # paced, and the pace runs ahead of now with this bundle's data: no time to spare
        going = {it.seq for it in items}
        if any(it.seq not in going for it in self.store.outbox.queued(dst, len(items) + 1)):
            return []
        # still in flight, not there and not superseded: looked up one by one, not by reading
        # all that is in flight to dst
        held = self.store.outbox.get(env.seq for env, _ in got[1] if env.seq not in going)
        return [
            (env, s)
            for env, s in got[1]
            if (it := held.get(env.seq)) is not None and it.inflight and not it.received and not it.superseded
        ]

    def _copy_due(self, dst: str) -> int | None:
        """The envelope whose tail copy is still to go to dst (None: none)."""
        seq, due = self._copied.get(dst, (None, False))
        return seq if due else None

    def _tail_copy(self, dst: str, p: Path, now_ms: int) -> None:
        """An ack left one envelope in flight to dst, and nothing is queued behind it: it is the
        radio's last frame of a burst, and no later frame's ack can show it lost.  Lost, it
        waits for a tail probe, a round trip and more of idle radio; so it goes again now,
        once, a frame behind the first copy, while the path lost an envelope lately, and
        what it carries cannot be superseded and takes no more of the radio than
        queue_target_ms of the path's rate.  An ack that leaves one in flight comes a frame's
        time before that one's own, so RACK's resends of what went before have gone first
        (decision 0038).  Only where that envelope went within a frame and a half of the one
        before it: queued behind it, the tail of a transfer or of a burst of orders, not one
        of a stream of orders each alone on the radio (copied, each would go twice).  Called
        for the sender of an ack, so never a group (its members' acks and probes go per
        member)."""
        rate = p.rate()
        if (
            not rate
            or not p.filled
            or p.lost_at_sends is None
            or p.sends - p.lost_at_sends > COPY_AFTER_LOSS_SENDS
            or self.store.outbox.queued(dst, 1)
        ):
            return
        lacking = self.store.inflight(dst, limit=2)
        if len(lacking) != 1:
            return
        it = lacking[0]
        if (
            it.supersede
            or it.sent_ms is None
            or (it.retry_ms is not None and it.retry_ms <= now_ms)  # due anyway
            or self._copied.get(dst, (None, False))[0] == it.seq
            or self._frame_ms(p, it.size) > self.cfg.queue_target_ms
            or not self._sent.get(dst, {}).get(it.seq, (False,) * 6)[5]
        ):
            return
        self._copied[dst] = (it.seq, True)
        self.store.set_retry({it.seq: now_ms})
        self.store.count_event("tail_copies")

    def _tail_probes(self, now_ms: int) -> tuple[set[int], set[str]]:
        """Tail loss probe (after RFC 8985): when nothing was sent to a destination and no ack
        came from it for two minimum round trips plus the ack delay (one, once an ack came
        after the last send), while it still lacks
        something, send the first envelope queued for it past the window, or where none is
        queued (and to a group) resend the oldest thing it lacks.  A new-data probe waits for
        the hold its acks reported lately instead of the whole ack delay.  Once acks came but
        before a round trip is measured, the shortest retransmission timeout stands for the
        round trips.  New data first, as RFC 8985 7.3 prefers: on a lossy radio what lacks
        an ack has most often arrived and only its ack was lost, and the new envelope's ack
        (which repeats the acks before it) shows that as well as a copy's would (decision
        0024).  Fast retransmission needs a later envelope to arrive; at the end of a burst
        (or for a lost retransmission) there is none, and the timer, inflated by an outage's
        round trips and doubled per attempt, can run for minutes while the receiver holds the
        envelopes behind the gap.  While no ack shows
        progress (a link that is down), the probe goes again at doubling intervals up to
        PROBE_MAX_MS, like TCP's persist timer: one envelope per half minute at most, and the
        first probe after the link is back finds it within that long (the backed-off
        retransmission timers would wait minutes).

        When all that is in flight are superseded copies (never sent again, so nothing to
        resend), the probe is the first queued envelope too: its ack shows whether the copies
        arrived (RACK drops them when they did not).  Without it, one lost ack bundle left the
        window full of copies until their timeout: nothing went, so nothing was acked, and `c2dtn perf overload`'s
        immediate orders waited 10 to 40 s behind positions that had long arrived.
        Returns (envelopes resent as probes, destinations whose first queued envelope goes)."""
        probed: set[int] = set()
        probe_new: set[str] = set()
        self._probe_at = {}
        for dst, p in self.paths.items():
            lacking = self.store.inflight(dst, limit=1)  # the oldest thing it lacks, in sending order
            if not lacking and not (
                self.store.superseded_inflight(dst, now_ms + 1) and self.store.queued(dst, limit=1)
            ):
                continue
            first = lacking[0] if lacking else None
            if p.last_sent_ms is None:
                p.last_sent_ms = self.store.last_sent_ms(dst)
            # new data is the probe where some is queued, but not to a group: one member's ack
            # of it would count as the group's progress while another member is cut off, and
            # reset the backoff and feed the rate model with the probes' trickle
            new_data = dst not in self.codec.groups and bool(self.store.outbox.queued(dst, 1))
            if p.min_rtt_ms is not None:
                # the receiver's hold of the probe's ack: a new-data probe that goes early costs
                # nothing on the link, so it waits for the hold the last acks said (at most
                # ack_delay_ms); a copy waits the whole ack delay (a lone envelope's ack is held)
                hold = self.cfg.ack_delay_ms
                if new_data:
                    hold = min(hold, max(p.holds, default=hold))
                # one round trip where an ack came after the last send (the path was just seen
                # delivering: what still lacks has its own drain and round trip left), two where
                # none came since (a lone envelope after silence: link set-up, jitter, a larger
                # envelope or a longer hold stretch its round trip) and to a group (one member's
                # ack says nothing of another's path) (decision 0029)
                rtts = 1 if dst not in self.codec.groups and p.last_ack_ms > (p.last_sent_ms or 0) else 2
                base = rtts * p.min_rtt_ms + hold + 200
            elif p.last_ack_ms > 0 or p.inherited:
                # no round trip measured: a node that started into an outage, whose acks since
                # were all for resent envelopes (Karn's rule takes no sample from them), or a
                # restarted one (SIGKILL, power) that has heard nothing yet, whose store holds
                # envelopes already sent two or three times: their timers, the initial timeout
                # doubled per attempt, run for minutes.  The shortest retransmission timeout
                # stands in for the round trip; without it, what the outage lost waits out those
                # timers while the receiver holds everything behind it.
                base = self.cfg.min_rto_ms
            else:
                continue  # a fresh node that has heard nothing yet: its initial timeout decides
            if p.copy_sent_ms is not None and p.copy_sent_ms >= p.last_ack_ms:
                base += p.copy_frame_ms  # a tail copy, unacked, holds the radio a frame more
            members = self.codec.groups.get(dst)
            if members and first is not None:
                self._member_probes(dst, p, members, base, now_ms, probed)
                continue
            at = self._probe_time(p.last_sent_ms, p.last_ack_ms, p.probes, base)
            if at > now_ms:
                self._probe_at[dst] = at
                continue
            if first is None or new_data:
                probe_new.add(dst)
            elif first.retry_ms is not None and first.retry_ms > now_ms:
                self.store.set_retry({first.seq: now_ms})
                probed.add(first.seq)
            else:
                continue  # due anyway (a timeout, RACK): the plan resends it
            self.store.count_event("tail_probes")
            p.probes += 1
            # the next probe's time is a deadline too: a probe lost with nothing else going
            # would otherwise wait for the next plan (a retransmission timer, or the shell's
            # tick).  No later than that probe (the plan then works its time out again), and
            # never now, which would spin a shell
            self._probe_at[dst] = max(now_ms + 1, self._probe_time(now_ms, p.last_ack_ms, p.probes, base))
        return probed, probe_new

    @staticmethod
    def _probe_time(last_sent_ms: int | None, last_ack_ms: int, probes: int, base: float) -> int:
        """When the next tail probe is due.  The first probe's loss is likelier radio loss than
        an outage: backing off starts after the second."""
        return max(last_sent_ms or 0, last_ack_ms) + int(min(PROBE_MAX_MS, base * (2 ** max(0, probes - 1))))

    def _member_probes(
        self, dst: str, p: Path, members: tuple[str, ...], base: float, now_ms: int, probed: set[int]
    ) -> None:
        """A group's tail probes, one timer and backoff per member: each resends the oldest
        thing that member lacks.  With one timer for the group, a member cut off set the
        backoff (up to PROBE_MAX_MS) and the probe resent what it lacked, which the others
        had: another member's tail loss waited for its retransmission timeout (decision 0030).
        A member is looked up only when its timer is due (a scan of what is in flight)."""
        went = False
        for m in members:
            acked_ms, n = p.members.get(m, (0, 0))
            at = self._probe_time(p.last_sent_ms, acked_ms, n, base)
            if at > now_ms:
                self._probe_at[dst] = min(self._probe_at.get(dst, at), at)
                continue
            mine = self.store.inflight(dst, lacking=m, limit=1)
            if not mine:  # it has everything: its timer starts again from now
                p.members[m] = (now_ms, 0)
                continue
            it = mine[0]
            if it.seq not in probed:  # (else another member's probe resends it already)
                if it.retry_ms is None or it.retry_ms <= now_ms:
                    continue  # due anyway (a timeout, RACK): the plan resends it
                self.store.set_retry({it.seq: now_ms})
                probed.add(it.seq)
                went = True
            p.members[m] = (acked_ms, n + 1)
            nxt = max(now_ms + 1, self._probe_time(now_ms, acked_ms, n + 1, base))  # (as _tail_probes')
            self._probe_at[dst] = min(self._probe_at.get(dst, nxt), nxt)
        if went:
            self.store.count_event("tail_probes")

    def _lingers(self, queued: list[OutItem], now_ms: int, wire_ratio: float, since: int) -> bool:
        """Hold these back a little so more can join them in one bundle?  (While they would fill
        less than half of one, sealed: compressed, they weigh wire_ratio of their size; since:
        when their wait began.)"""
        return (
            self.cfg.linger_ms > 0
            and all(i.priority > Priority.IMMEDIATE for i in queued)
            and now_ms - since < self.cfg.linger_ms
            and sum(i.size for i in queued) * wire_ratio < self.cfg.aggregate_bytes // 2
        )

    def _bundle(
        self,
        dst: str,
        items: list[OutItem],
        ack_seqs: AckSeqs,
        now_ms: int,
        holds: dict[str, int] | None = None,
        inflight: int = 0,
        heard: dict[str, int] | None = None,
    ) -> list[Outgoing]:
        heard = {src: sn for src, sn in (heard or {}).items() if isinstance(ack_seqs, dict) and src in ack_seqs}
        has_acks = _has_acks(ack_seqs) or bool(heard)
        if not items and not has_acks:
            return []
        floors: dict[int, int] = {}
        for it in items:
            if it.priority not in floors:
                floors[it.priority] = self.store.floor(dst, it.priority)
        none: AckSeqs = {} if isinstance(ack_seqs, dict) else ([], [])  # the acks ride in the first bundle only
        bundles: list[Outgoing] = []
        maps: list[bytes] = []  # the envelopes' maps, sealed together (envelope.Codec.container)
        seqs: list[int] = []
        size = 0
        rtx = 0
        # every envelope's creation time goes as ms from this second, its incarnation once in
        # the container (an ack-only bundle names none: an ack's own incarnation means nothing)
        stamp = (max(0, now_ms) // 1000, self.store.inc if items else 0)
        copies = self._copies(dst, now_ms, items)
        announce = self._sn[dst] if not items and inflight and dst in self._sn else None
        if has_acks and announce is not None:
            made = self._announced.setdefault(dst, {})
            key = heard_of(announce, now_ms)
            made.pop(key, None)  # (re-inserted: the newest is evicted last)
            made[key] = (now_ms, self.path(dst).sends, set())
            if len(made) > ANNOUNCED_KEPT:
                del made[next(iter(made))]
        if has_acks:
            ack = Envelope(
                Kind.ACK,
                self.codec.node,
                0,
                dst,
                now_ms,
                ACK_LIFETIME_MS,
                Priority.FLASH,
                body=encode_ack_body(ack_seqs if isinstance(ack_seqs, dict) else {dst: ack_seqs}, holds, heard),
                inc=stamp[1],
                # an ack-only bundle, while data sent to dst is unacked, announces the next data
                # envelope's send number: a receiver that lacks one before it says so at once,
                # though no later data came (the tail of a burst, a lull; decision 0041)
                sn=announce,
            )
            maps.append(self.codec.map_bytes(ack, stamp=stamp))
            size = len(maps[0])
        small = self.cfg.aggregate_bytes
        large = max(small, self.cfg.aggregate_large_bytes)
        plain = sum(len(e) for e in maps)  # the acks' bodies are plain
        wire = body = 0  # map and plain bytes of the data envelopes (the path's wire_ratio)
        all_large = True  # every envelope in the bundle so far is over `small` (they share up to `large`)
        after = None  # (seq, send number) of the data envelope before in this bundle (Codec.map_bytes)
        firsts: list[tuple[Envelope, bytes]] = []  # new envelopes and their maps, for _copies
        for it in items:
            sn = self._sn.get(dst, 0)
            self._sn[dst] = (sn + 1) % SN_MOD
            env = replace(it.envelope(self.codec.node, floors[it.priority], self.store.inc), sn=sn)
            delta = it.attempts == 0 or (it.attempts < DELTA_SENDINGS and self.codec.references_held(dst, it.seq))
            s = self.codec.map_bytes(env, delta=delta, stamp=stamp, after=after)
            cap = large if len(s) > small and all_large else small
            # full: close the bundle -- unless it holds only the acks and this envelope alone is
            # over the aggregate size anyway (the acks ride along rather than go on their own);
            # and before its bodies, decompressed, pass what a receiver opens of one bundle
            if maps and (
                (size + len(s) > cap and (seqs or len(s) <= cap))
                or plain + len(env.body) > MAX_BUNDLE_PLAIN_BYTES
                or len(maps) >= MAX_ENVELOPES_PER_BUNDLE
            ):
                bundles.append(
                    Outgoing(dst, self.codec.container(maps, dst, stamp), seqs, ack_seqs if not bundles else none, rtx)
                )
                maps, seqs, size, rtx, all_large, plain = [], [], 0, 0, True, 0
                firsts = []  # the closed bundle's next is this plan's next: none to copy
                if after is not None:  # it opens the next bundle: its seq and send number said
                    s = self.codec.first_map(s, env)
            after = (env.seq, env.sn)
            all_large = all_large and len(s) > small
            wire += len(s)
            body += it.size
            maps.append(s)
            if it.attempts == 0:
                firsts.append((env, s))
            seqs.append(it.seq)
            size += len(s)
            plain += len(env.body)
            rtx += it.attempts > 0
        if copies and not bundles:
            # only where the bundle holds them without growing past the aggregate size: a copy
            # never makes a frame; first, for the first new one's map stands alone (seq and number said)
            fit: list[bytes] = []
            for env, s in copies:
                s = self.codec.restamp(s, env, stamp)
                if (
                    size + len(s) > small
                    or plain + len(env.body) > MAX_BUNDLE_PLAIN_BYTES
                    or len(maps) + len(fit) >= MAX_ENVELOPES_PER_BUNDLE
                ):
                    break
                fit.append(s)
                size += len(s)
                plain += len(env.body)
            maps[has_acks:has_acks] = fit
            if fit:
                self.store.count_event("next_copies", len(fit))
                p = self.path(dst)
                if p.filled and (rate := p.rate()):
                    # they take the radio's time as data does: the next paced data waits for them,
                    # and while it waits no copy goes (_copies), so copies fill only spare time
                    p.pace_at = max(p.pace_at, now_ms) + sum(len(c) for c in fit) / (PACING_GAIN * rate)
        if maps:
            bundles.append(
                Outgoing(dst, self.codec.container(maps, dst, stamp), seqs, ack_seqs if not bundles else none, rtx)
            )
        if items:
            p = self.path(dst)
            if body:
                p.wire_ratio += (wire / body - p.wire_ratio) / 4  # (a moving average)
            later = {q for b in bundles[1:] for q in b.seqs}  # queued behind the plan's first frame
            self._sent_states(dst, p, items, now_ms, inflight, later)
            p.last_sent_ms = now_ms
            if any(n for _, n in p.members.values()) and any(it.attempts == 0 for it in items):
                # new data to a group: each member's probes start again from the base interval,
                # as the group's one backoff did at the progress the new data drew (decision 0030)
                p.members = {m: (acked, 0) for m, (acked, _) in p.members.items()}
            if firsts:
                self._next_copies[dst] = (now_ms, firsts)
            retry_at = {it.seq: now_ms + int(min(self.cfg.max_rto_ms, p.rto_ms * (2**it.attempts))) for it in items}
            self.store.mark_sent([it.seq for it in items], now_ms, retry_at)
        return bundles

    def _sent_states(
        self, dst: str, p: Path, items: list[OutItem], now_ms: int, inflight: int, later: set[int]
    ) -> None:
        """Record what a rate sample of these will be taken against, and pace the next send.
        inflight: bytes in flight to dst before these (copies count); later: those of them in
        a bundle after the plan's first (queued behind it on the radio)."""
        if not inflight:  # nothing in flight: a new span begins
            p.first_sent_ms = p.delivered_ms = now_ms
        sent = self._sent.setdefault(dst, {})
        lost = self._lost.get(dst)
        found = self._found_resent.setdefault(dst, set())
        # (a frame and a half: sends clocked by acks come a frame apart, give or take)
        behind = p.last_sent_ms is not None and now_ms - p.last_sent_ms <= 1.5 * self._frame_ms(p, items[0].size)
        for it in items:
            sent.pop(it.seq, None)  # a resend is the newest record
            p.sends += 1
            sent[it.seq] = (p.delivered, p.delivered_ms, p.first_sent_ms, now_ms, p.sends, behind or it.seq in later)
            if lost and it.seq in lost:
                lost.discard(it.seq)
                found.add(it.seq)
            else:
                found.discard(it.seq)
        while len(sent) > SENT_STATES_MAX:  # superseded and expired envelopes are never acked
            del sent[next(iter(sent))]
        if len(found) > SENT_STATES_MAX:
            found &= set(sent)

    def _rate_sample(self, dst: str, p: Path, items: list[OutItem], now_ms: int, group: bool) -> None:
        """These arrived: a delivery-rate sample, bytes delivered since the newest of them was
        sent over the longer of the spans of sending and of acking them (BBR's rate sample,
        draft-cheng-iccrg-delivery-rate-estimation), and the end of slow start.  For a group,
        an envelope counts at the first member's ack (the radio carried it once); its record
        stays for the others' RACK until all have it (on_ack)."""
        sent = self._sent.get(dst, {})
        if group:
            counted = self._counted.setdefault(dst, set())
            items = [it for it in items if it.seq in sent and it.seq not in counted]
            counted.update(it.seq for it in items)
            if len(counted) > SENT_STATES_MAX:
                counted &= set(sent)
            states = [sent[it.seq] for it in items]
        else:
            states = [st for st in (sent.pop(it.seq, None) for it in items) if st is not None]
        for it in items:
            self._lost.get(dst, set()).discard(it.seq)
        p.delivered += sum(it.size for it in items)
        p.delivered_ms = now_ms
        if not states:
            return
        d0, t0, f0, s0, *_ = max(states, key=lambda st: st[4])
        p.first_sent_ms = s0
        interval = max(s0 - f0, now_ms - t0)
        if interval <= 0 or (p.min_rtt_ms is not None and interval < p.min_rtt_ms):
            return  # shorter than a round trip: acks that came together, not the path's rate
        rate = (p.delivered - d0) / interval
        new_round = d0 >= p.round_end
        if new_round:
            p.rounds += 1
            p.round_end = p.delivered
        if d0 < p.app_limited_until and rate <= p.rate():
            return  # too little was sent to show the rate: only a higher sample counts
        p.bw = [(r, b) for r, b in p.bw if r > p.rounds - BW_ROUNDS] + [(p.rounds, rate)]
        if new_round and not p.filled:
            if p.rate() >= p.full_bw * FULL_BW_GROWTH:
                p.full_bw, p.full_bw_rounds = p.rate(), 0
            else:
                p.full_bw_rounds += 1
                p.filled = p.full_bw_rounds >= FULL_BW_ROUNDS

    def _model_window(self, p: Path) -> float:
        """What the path carries in its round trip (acks held included), plus queue_target_ms."""
        rate = p.rate()
        if not rate or p.min_rtt_ms is None:
            return p.window
        span = p.min_rtt_ms + self.cfg.ack_delay_ms + self.cfg.queue_target_ms
        return min(self.cfg.max_window, max(self.cfg.min_window, rate * span))

    def _room_for_lost_acks(self, dst: str, p: Path) -> float | None:
        """Room past the window while what is queued first cannot be superseded: a frame or an
        ack lost is made up by the next ack, and meanwhile the radio has this to send
        (decision 0037).  For paced traffic (a transfer) ROOM_BUNDLES bundles, since two lost
        in a row ran the radio's queue dry with one; pacing, not the room, sets how fast it
        goes.  For an order (flash, immediate: not paced) one bundle: the room is what lets
        each go at once in a frame of its own, and more of it filled the radio's queue with
        orders' frames (decision 0039).  Each bundle is at most queue_target_ms of the rate,
        and the window and room together at most max_window.  A report waiting is not given
        any: a newer one replaces it, and a deeper queue would carry reports a newer one
        replaced and hold orders behind them.  None: nothing is queued."""
        head = self.store.outbox.queued(dst, 1)  # (first in sending order, no body read)
        if not head:
            return None
        rate = p.rate()
        if not p.filled or not rate or p.min_rtt_ms is None or head[0].supersede:
            return 0.0
        bundles = ROOM_BUNDLES if head[0].priority > Priority.IMMEDIATE else 1
        return max(0.0, min(bundles * self._room_bundle(p), self.cfg.max_window - p.window))

    def _room_bundle(self, p: Path) -> float:
        """One bundle of the room, in the window's plain bytes: the larger aggregate size as it
        goes sealed, at most queue_target_ms of the path's rate."""
        bundle = max(self.cfg.aggregate_bytes, self.cfg.aggregate_large_bytes) / max(p.wire_ratio, 1 / PACED_PLAIN_MAX)
        return min(bundle, p.rate() * self.cfg.queue_target_ms)

    @staticmethod
    def _reo_near_ms(p: Path) -> int:
        """RACK's reordering window for what went well before the newest envelope that arrived:
        reo_steps quarters of the minimum round trip."""
        return int(p.reo_steps * p.min_rtt_ms / 4) if p.min_rtt_ms else 0

    def _reo_ms(self, p: Path) -> int:
        """RACK's reordering window for what went with the newest envelope that arrived (within
        _reo_near_ms of it): at least the minimum round trip, and while the window has room
        more, at least two of its bundles' time at the path's rate (up to the smoothed round
        trip).  The agent may put the later of bundles handed over together on
        the air first: the earlier then arrives a frame after it (a minimum round trip holds
        at least a frame's time), which is not a loss (decision 0037).  What went a paced
        bundle or more before it was never seen to swap (dtn7-rs swaps what it is handed at
        once): the near window calls it lost (decision 0038)."""
        reo = float(max(self._reo_near_ms(p), p.min_rtt_ms or 0))
        rate = p.rate()
        if p.extra_room and rate and p.min_rtt_ms:
            # (a bundle of the room is at most queue_target_ms of the rate)
            reo = max(reo, min(2 * self._room_bundle(p) / rate, p.srtt_ms or p.min_rtt_ms))
        return int(reo)

    # -- feedback ------------------------------------------------------------
    def on_ack(self, sender: str, done: list[int], got: list[int], now_ms: int, hold_ms: int | None = 0) -> int:
        """An ack from `sender` arrived: release custody of what it took ("done"), stop
        retransmitting what it holds ("got"), sample RTT, open the window, and resend at
        once what was sent before something that arrived but did not arrive itself.
        Envelopes sent to a group count per destination (the group's path): they are
        released once every member took them (Custody.ack_from).  hold_ms: how long the
        sender held the newest of them before acking (left out of the round-trip sample)."""
        copied = self._copied.get(sender)
        if copied and sender in self.paths and (copied[0] in done or copied[0] in got):
            # a tail copy's ack, or its first copy's: the radio delivered a frame, so a tail
            # probe for what went after the copy waits from now (the copy held the radio a
            # frame longer than the probe's round trip allows)
            self.paths[sender].last_ack_ms = max(self.paths[sender].last_ack_ms, now_ms)
        released, arrived = self.store.ack_from(sender, done, got)
        if not arrived and not released:
            self._rack_of_let_go(sender, [*done, *got], now_ms)
            return 0
        self.codec.acked(sender, [it.seq for it in arrived + released if it.dst == sender])
        for group in {it.dst for it in arrived if it.dst != sender}:  # what this member of a group holds
            self.codec.took(group, sender, [it.seq for it in arrived if it.dst == group])
        for it in released:  # a group's records go once every member took the envelope
            if it.dst != sender:
                self.codec.acked(it.dst, [it.seq])  # every member holds it: a reference for the group
                self._sent.get(it.dst, {}).pop(it.seq, None)
                self._counted.get(it.dst, set()).discard(it.seq)
        probing = set()  # destinations whose tail probes were going (no progress since the first)
        for dst in {it.dst for it in arrived + released}:  # progress: a tail probe may go again
            p = self.path(dst)
            if p.probes or (dst != sender and p.members.get(sender, (0, 0))[1]):
                probing.add(dst)
            p.last_ack_ms, p.probes = now_ms, 0
            if dst != sender:
                p.members[sender] = (now_ms, 0)
            if hold_ms is not None:  # (an ack of "done" alone says no hold)
                p.holds = (p.holds + [hold_ms])[-RTT_RECENT:]
            waiting = self._deferred.get(dst)
            if waiting:  # the window moved: what waited for room is due again
                for it in released + arrived:
                    waiting.pop(it.seq, None)
                for seq, (size, _) in waiting.items():
                    waiting[seq] = (size, now_ms)
                self.store.set_retry({seq: now_ms for seq in waiting})
        by_dst: dict[str, list[OutItem]] = {}
        for it in arrived:
            by_dst.setdefault(it.dst, []).append(it)
        for dst, items in by_dst.items():
            p = self.path(dst)
            fresh = [it for it in items if it.attempts == 1 and it.sent_ms is not None]
            if fresh:
                # the hold comes out of the sample, but no more than the receiver may hold an ack,
                # and one sample takes no more than half off the minimum (RFC 9002 5.3 distrusts
                # ack delays likewise): a hold inflated by a step of the peer's clock, or a lie,
                # cannot make the path look short at once
                raw = now_ms - max(it.sent_ms or 0 for it in fresh)
                rtt: float = raw - min(hold_ms or 0, max(2 * self.cfg.ack_delay_ms, HOLD_CAP_MIN_MS))
                if p.min_rtt_ms is not None:
                    rtt = max(rtt, min(raw, p.min_rtt_ms / 2))
                p.sample(max(1.0, rtt), self.cfg, now_ms)
            sent = self._sent.get(dst, {})
            # the envelopes that say when what arrived was sent (RACK, below): those sent once,
            # and those resent because an ack showed them lost, acked at least a minimum round
            # trip after the resend (RFC 8985 6.2 step 2; sooner, the ack is for a first copy the
            # BPA reordered, as the reordering window below takes it): the first copy did not
            # arrive, so the ack is for the resend.  Not before a round trip is measured, and not
            # to a group: the member acking may have had the first copy and lost its ack.
            found = self._found_resent.get(dst, set()) if dst == sender else set()
            rack = fresh + [
                it
                for it in items
                if it.attempts > 1
                and it.sent_ms is not None
                and it.seq in found
                and p.min_rtt_ms
                and now_ms - it.sent_ms >= p.min_rtt_ms
            ]
            self._found_resent.get(dst, set()).difference_update(it.seq for it in items)
            order = max((sent[it.seq][4] for it in rack if it.seq in sent), default=None)
            if self.cfg.queue_target_ms:
                self._rate_sample(dst, p, items, now_ms, group=dst != sender)
            # an ack proves the path works: what timed out into an outage need not
            # wait out its backed-off timer any longer than one fresh timeout
            self._pull_in_retries(dst, now_ms + int(p.rto_ms))
            if dst in probing:
                # a probe got through after a silence (an outage): what was sent before it and
                # has not arrived was lost on the way, and goes again now, not a timer later
                # (RACK cannot tell: the probe was a resent envelope).  A resend acked sooner than
                # the minimum round trip after it went says nothing: the ack is its first copy's,
                # which may have gone before what still lacks (Karn's rule, as RACK's `rack` below;
                # with no round trip measured yet, as a restarted node has, the ack is taken as
                # the resend's)
                cutoff = max(
                    (
                        it.sent_ms
                        for it in items
                        if it.sent_ms is not None
                        and (it.attempts == 1 or not p.min_rtt_ms or now_ms - it.sent_ms >= p.min_rtt_ms)
                    ),
                    default=None,
                )
                if cutoff is not None:
                    member = None if dst == sender else sender  # what the member that acked lacks
                    lost = {
                        it.seq: now_ms
                        for it in self.store.inflight(dst, lacking=member, retry_after_ms=now_ms)
                        if it.sent_ms is not None and it.sent_ms < cutoff
                    }
                    if lost:
                        self.store.set_retry(lost)
                        self._mark_lost(dst, lost)
            # RACK's reordering window (RFC 8985 6.2): a quarter of the minimum round trip to
            # start with (a BPA that hands bundles over a little out of order is not losing
            # them), one quarter more each time a resent envelope proves to have arrived anyway
            # (acked sooner after the resend than any round trip), up to the smoothed round trip
            copy_seq = self._copied.get(dst, (None, False))[0]  # (its first copy's ack comes early)
            spurious = any(
                it.attempts > 1
                and it.sent_ms is not None
                and p.min_rtt_ms
                and now_ms - it.sent_ms < p.min_rtt_ms
                and it.seq != copy_seq
                for it in items
            )
            if spurious and p.srtt_ms and p.min_rtt_ms and p.reo_steps * p.min_rtt_ms / 4 < p.srtt_ms:
                p.reo_steps += 1
            # RACK: what was sent well before the newest envelope that arrived, and has not
            # arrived itself, is lost.  An envelope resent on a timeout or as a probe says
            # nothing of when "newest" was sent: the ack may be for its first copy (as Karn's
            # rule for RTT samples).  One resent because it was found lost does (`rack` above):
            # without it, the last envelope of a transfer lost behind such a resend waited for a
            # tail probe, though the resend had arrived.
            newest = max((it.sent_ms or 0 for it in rack), default=None)
            if newest is not None:
                near = self._reo_near_ms(p)
                member = None if dst == sender else sender
                self._fast_retransmit(dst, newest - near, now_ms, member)
                if order is not None:
                    self._rack_timer(dst, newest, order, near, self._reo_ms(p), now_ms, member)
            nbytes = sum(it.size for it in items)
            if self.cfg.queue_target_ms and not p.filled and p.min_rtt_ms is not None and len(p.recent) >= 2:
                # slow start also ends when the round trip shows a queue past the target (as
                # HyStart): a radio's rate is found in one round trip, its queue fills for many
                p.filled = min(p.recent[-2:]) - p.min_rtt_ms > self.cfg.queue_target_ms
            if p.filled:
                p.window = self._model_window(p)
                continue
            if p.window < p.ssthresh:
                p.window = min(self.cfg.max_window, p.window + nbytes)
            else:  # about one envelope (of the size acked, at least 1 kB) per window's worth acked
                seg = max(1024, nbytes / len(items))
                p.window = min(self.cfg.max_window, p.window + nbytes * seg / p.window)
        if any(it.dst == sender for it in arrived + released):
            self._tail_copy(sender, self.path(sender), now_ms)
        return len(released) + len(arrived)

    def on_heard(self, dst: str, member: str | None, heard: int, now_ms: int) -> None:
        """dst (for a group, its `member`) heard an announcement of this node's next send number
        (`heard` names it: envelope.heard_of), and lacks a data envelope sent before it: what
        went before that announcement and it still lacks was lost on the way, and goes again,
        as RACK resends what went before an envelope that arrived (decision 0041).  What went
        well before it is due now; what went within RACK's near window of it, at RACK's
        reordering timer (an agent may put the ack-only bundle on the air first; the receiver
        acks the data that then comes at once: OverlayCore._fills_answered).  Only an
        announcement this node made and still keeps (a replayed answer names an old one, and
        one whose number was sealed again since names its own), answered once per member, and
        not by an answer that came sooner than half a minimum round trip after it."""
        p = self.paths.get(dst)
        made = self._announced.get(dst, {}).get(heard)
        if p is None or made is None or not p.min_rtt_ms:
            return
        at, order, answered = made
        if member in answered or now_ms - at < p.min_rtt_ms / 2:
            return
        answered.add(member)
        near = self._reo_near_ms(p)
        if self._fast_retransmit(dst, at - near, now_ms, member):
            self.store.count_event("heard_gaps")
        self._rack_timer(dst, at, order + 1, near, self._reo_ms(p), now_ms, member)

    def _rack_of_let_go(self, sender: str, seqs: list[int], now_ms: int) -> None:
        """An ack that names nothing held here: a late one, or one for superseded copies let go
        when another member's ack showed them lost.  Their send records still say when they
        went, so RACK runs on them as on envelopes held: what went before them and has not
        reached `sender` is lost (else it waited for the sender's next ack or a probe)."""
        held = self.store.outbox.get(seqs)  # (named again: acks repeat their recent ids)
        for dst in [sender, *(g for g, ms in self.codec.groups.items() if sender in ms)]:
            sent = self._sent.get(dst)
            p = self.paths.get(dst)
            if not sent or p is None or not p.min_rtt_ms:
                continue
            newest = max((sent[q][3] for q in seqs if q in sent and q not in held), default=None)
            if newest is not None:
                near = self._reo_near_ms(p)
                self._fast_retransmit(dst, newest - near, now_ms, None if dst == sender else sender)

    def _fast_retransmit(self, dst: str, sent_before_ms: int, now_ms: int, member: str | None) -> int:
        """Envelopes sent before one the destination already has, and still not there:
        lost on the way, so due again now rather than at their timeout.  For a group,
        `member` is the one that acked: what it has not got is due again (for all)."""
        lost = {
            it.seq: now_ms
            for it in self.store.inflight(dst, lacking=member, sent_before_ms=sent_before_ms, retry_after_ms=now_ms)
        }
        if lost:
            self.store.set_retry(lost)
            self._mark_lost(dst, lost)
            self.store.count_event("fast_retransmits", len(lost))
        # superseded copies lost likewise: due now, so the next plan drops them (else, never
        # sent again, they fill the window until their timeout).  For a group, those the member
        # that acked lacks: lost on the shared radio, or on its own leg; either way off the radio
        gone = self.store.superseded_inflight(dst, sent_before_ms, member)
        if gone:
            self.store.set_retry(dict.fromkeys(gone, now_ms))
        return len(lost)

    def _rack_timer(
        self, dst: str, newest_ms: int, order: int, near: int, reo: int, now_ms: int, member: str | None
    ) -> None:
        """RACK's reordering timer (RFC 8985 6.3): what went before the newest envelope that
        arrived (in the order they went, so also in the same millisecond), but too shortly
        before it to be called lost yet (within `near`), is lost if it has not arrived a
        reordering window (`reo`) later than that one did."""
        sent = self._sent.get(dst, {})
        later = {}
        for it in self.store.inflight(dst, lacking=member, sent_before_ms=newest_ms + 1, retry_after_ms=now_ms):
            if it.sent_ms is None or it.sent_ms < newest_ms - near or it.seq not in sent or sent[it.seq][4] >= order:
                continue
            at = it.sent_ms + (now_ms - newest_ms) + reo
            if it.retry_ms is None or at < it.retry_ms:
                later[it.seq] = at
        if later:
            self.store.set_retry(later)
            self._mark_lost(dst, later)

    def _mark_lost(self, dst: str, seqs: Iterable[int]) -> None:
        """Due again because an ack showed them lost (not a timeout).  Those never sent again
        (expired, superseded) are forgotten with their send records."""
        seqs = list(seqs)
        self.codec.lost(dst, seqs)
        lost = self._lost.setdefault(dst, set())
        lost.update(seqs)
        if len(lost) > SENT_STATES_MAX:
            lost &= set(self._sent.get(dst, ()))

    def _pull_in_retries(self, dst: str, at_ms: int) -> None:
        """The path to dst works again: no in-flight envelope waits past at_ms for its retry."""
        late = {it.seq: at_ms for it in self.store.inflight(dst, retry_after_ms=at_ms)}
        if late:
            self.store.set_retry(late)

    def _on_timeout(self, dst: str, now_ms: int) -> None:
        p = self.path(dst)
        # one reduction per round trip, however many envelopes timed out together
        if p.last_timeout_ms >= 0 and now_ms - p.last_timeout_ms < p.rto_ms:
            return
        p.last_timeout_ms = now_ms
        p.ssthresh = max(self.cfg.min_window, p.window / 2)
        p.window = max(self.cfg.min_window, p.window / 2)

    def next_wakeup_ms(self) -> int | None:
        times = [
            t
            for t in (
                self.store.next_retry_ms(),
                self.store.next_expiry_ms(),
                *self._linger_until.values(),
                *self._probe_at.values(),
                *self._pace_wait.values(),
            )
            if t is not None
        ]
        return min(times) if times else None
