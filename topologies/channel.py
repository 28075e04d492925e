"""I/O-free channel core: one direction of an emulated link.

Takes frames and a `now` (seconds, any monotonic clock) and says which frames
come out when.  The userspace emulator (topologies.emulator) drives it with
real sockets and time.monotonic(); tests drive it with virtual time.

Semantics, chosen to match tc-netem where netem defines them:
- loss (random or Gilbert-Elliott), duplication and corruption are decided when
  a frame is offered, so a lost frame uses no link time (as in netem);
- rate: frames are serialized one after another at `rate_bps`, counting the
  whole L2 frame as netem does; a frame leaves the transmitter at
  max(now, previous finish) + len*8/rate;
- queue limit: frames not yet fully serialized are the transmit queue; an
  offered frame that would exceed queue_packets or queue_bytes is tail-dropped;
- delay and jitter are added after serialization.  Jitter is uniform in
  [-jitter, +jitter] and never reorders (a frame is held until the previous
  one has gone), so a jittery link stays FIFO; `reorder` sends that share of
  frames straight away, ahead of the delayed ones, as netem's reorder does;
- link set-up (an HF soft link, no netem equivalent): when nothing has been on the link
  either way for link_idle_s (the two directions share a LinkActivity), the next frame
  waits link_setup_s before it is serialized;
- outage (link down): nothing crosses the link while it is down.  Frames
  offered then are dropped, and frames whose delivery falls inside the outage
  are dropped too (they were on the air, or queued, when the radio faded).
  Both ends keep carrier; carrier loss is the shell's business (ip link).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from c2dtn.topologies.profiles import Profile

ETH_HEADER = 14
# Hard cap on frames held in the delay line, whatever the profile: with an
# unlimited rate only the senders' windows bound what is in flight, and a cap
# keeps a misbehaving sender from exhausting memory.  Large enough for
# 1 Gbit/s x 100 ms of full-size frames.
MAX_IN_FLIGHT = 20000


@dataclass
class DirectionStats:
    offered: int = 0
    offered_bytes: int = 0
    delivered: int = 0
    delivered_bytes: int = 0
    lost_random: int = 0
    lost_burst: int = 0
    dropped_queue: int = 0
    dropped_outage: int = 0
    dropped_mtu: int = 0
    duplicated: int = 0
    corrupted: int = 0
    reordered: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class LinkActivity:
    """What both directions of one link share: until when something was on it (a frame is on
    the link from when it is offered until it is due at the far end)."""

    busy_until: float | None = None


@dataclass
class Direction:
    """One direction of a link.  Not thread-safe; one owner drives it."""

    profile: Profile
    seed: int | None = None
    up: bool = True
    stats: DirectionStats = field(default_factory=DirectionStats)
    activity: LinkActivity = field(default_factory=LinkActivity)  # shared with the other direction
    # while a capture wants them: (frame, why) of each frame dropped, for the owner to take
    drops: list[tuple[bytes, str]] | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._ge_bad = False
        self._tx_free_at = 0.0  # when the transmitter finishes the last accepted frame
        self._txq: deque[tuple[float, int]] = deque()  # (finish time, size) of frames not yet serialized
        self._txq_bytes = 0
        self._line: deque[tuple[float, bytes]] = deque()  # (due, frame), due non-decreasing
        self._last_due = 0.0
        self._immediate: deque[bytes] = deque()  # reordered frames, out at once
        self._down_since: float | None = None
        self._transparent = self.profile.is_transparent()

    # -- control -------------------------------------------------------
    def set_profile(self, profile: Profile) -> None:
        """Change the profile; frames already accepted keep their times."""
        self.profile = profile
        self._transparent = profile.is_transparent()

    def set_up(self, up: bool, now: float) -> None:
        if up == self.up:
            return
        self.up = up
        if not up:
            self._down_since = now
        else:
            # Whatever was due during the outage is gone.
            self._drop_due(now)
            self._down_since = None

    def queued(self, now: float) -> tuple[int, int]:
        """Frames and bytes in the transmit queue at `now`."""
        self._trim_txq(now)
        return len(self._txq), self._txq_bytes

    def in_flight(self) -> int:
        return len(self._line) + len(self._immediate)

    # -- data path -----------------------------------------------------
    def offer(self, frame: bytes, now: float) -> None:
        p = self.profile
        st = self.stats
        n = len(frame)
        st.offered += 1
        st.offered_bytes += n
        if not self.up:
            st.dropped_outage += 1
            self._dropped(frame, "link down")
            return
        if n - ETH_HEADER > p.mtu:
            st.dropped_mtu += 1
            self._dropped(frame, "over the MTU")
            return
        rng = self._rng
        ge = p.gilbert_elliott
        if ge is not None:
            # Transition first, then decide loss in the new state (netem gemodel order).
            if self._ge_bad:
                if rng.random() < ge.r:
                    self._ge_bad = False
            elif rng.random() < ge.p:
                self._ge_bad = True
            if rng.random() < (ge.loss_bad if self._ge_bad else ge.loss_good):
                st.lost_burst += 1
                self._dropped(frame, "lost (burst)")
                return
        elif p.loss and rng.random() < p.loss:
            st.lost_random += 1
            self._dropped(frame, "lost")
            return
        copies = 1
        if p.duplicate and rng.random() < p.duplicate:
            copies = 2
            st.duplicated += 1
        if p.corrupt and n > ETH_HEADER and rng.random() < p.corrupt:
            buf = bytearray(frame)
            pos = rng.randrange(ETH_HEADER, n)
            buf[pos] ^= 1 << rng.randrange(8)
            frame = bytes(buf)
            st.corrupted += 1
        for _ in range(copies):
            self._accept(frame, n, now)

    def _accept(self, frame: bytes, n: int, now: float) -> None:
        p = self.profile
        if self._transparent:
            self._immediate.append(frame)
            return
        if len(self._line) >= MAX_IN_FLIGHT:
            self.stats.dropped_queue += 1
            self._dropped(frame, "queue full")
            return
        if p.reorder and self._rng.random() < p.reorder:
            self.stats.reordered += 1
            self._immediate.append(frame)
            return
        ready = now
        if p.link_setup_s:
            busy = self.activity.busy_until
            if busy is None or now - busy > p.link_idle_s:
                ready = now + p.link_setup_s  # the link dropped: set it up again first
        if p.rate_bps:
            self._trim_txq(now)
            if len(self._txq) >= p.queue_packets or (p.queue_bytes is not None and self._txq_bytes + n > p.queue_bytes):
                self.stats.dropped_queue += 1
                self._dropped(frame, "queue full")
                return
            start = max(self._tx_free_at, ready)
            finish = start + n * 8.0 / p.rate_bps
            self._tx_free_at = finish
            self._txq.append((finish, n))
            self._txq_bytes += n
        else:
            finish = ready
        due = finish + p.delay_s
        if p.jitter_s:
            due += self._rng.uniform(-p.jitter_s, p.jitter_s)
        if due < self._last_due:
            due = self._last_due  # keep FIFO: jitter never reorders
        self._last_due = due
        if self.activity.busy_until is None or due > self.activity.busy_until:
            self.activity.busy_until = due
        self._line.append((due, frame))

    def _trim_txq(self, now: float) -> None:
        q = self._txq
        while q and q[0][0] <= now:
            self._txq_bytes -= q.popleft()[1]

    def _dropped(self, frame: bytes, why: str) -> None:
        if self.drops is not None:
            self.drops.append((frame, why))

    def _drop_due(self, now: float) -> None:
        self.stats.dropped_outage += len(self._immediate)
        for f in self._immediate:
            self._dropped(f, "link down")
        self._immediate.clear()
        line = self._line
        while line and line[0][0] <= now:
            self._dropped(line.popleft()[1], "link down")
            self.stats.dropped_outage += 1

    def due(self, now: float) -> list[bytes]:
        """Frames to hand to the far end at `now`, in order."""
        if not self.up:
            self._drop_due(now)
            return []
        out: list[bytes] = []
        if self._immediate:
            out.extend(self._immediate)
            self._immediate.clear()
        line = self._line
        while line and line[0][0] <= now:
            out.append(line.popleft()[1])
        if out:
            self.stats.delivered += len(out)
            self.stats.delivered_bytes += sum(map(len, out))
        return out

    def next_deadline(self) -> float | None:
        """The earliest time at which due() may return something (or None)."""
        if self._immediate:
            return 0.0
        if self._line:
            return self._line[0][0]
        return None
