"""TCPCLv4 (RFC 9174), the active (connecting) side of one session, without TLS: an I/O-free
core, fed bytes and the time, giving back bytes to write, events and its next deadline.

Written here because no maintained Python TCPCLv4 implementation is on PyPI; it is what the
HDTN driver speaks to HDTN's tcpcl_v4 induct, where HDTN also hands back, over the same
session, the bundles for this node (an "opportunistic link", RFC 9174 §4.1 allows transfers
both ways).  Session and transfer extension items are read past and never sent.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"dtn!"
VERSION = 4
# message types (RFC 9174 §9.5)
XFER_SEGMENT, XFER_ACK, XFER_REFUSE, KEEPALIVE, SESS_TERM, MSG_REJECT, SESS_INIT = 1, 2, 3, 4, 5, 6, 7
END, START = 0x01, 0x02  # XFER_SEGMENT flags
REPLY = 0x01  # SESS_TERM flag
TERM_UNKNOWN, TERM_IDLE, TERM_VERSION, TERM_BUSY, TERM_CONTACT, TERM_RESOURCES = 0, 1, 2, 3, 4, 5


class ProtocolError(Exception):
    """The peer broke RFC 9174: the session must end (the message says how it broke it)."""


@dataclass(frozen=True)
class Established:
    peer_node: str
    keepalive_s: int
    segment_mru: int  # the largest segment the peer takes
    transfer_mru: int  # the largest bundle the peer takes


@dataclass(frozen=True)
class Received:
    bundle: bytes


@dataclass(frozen=True)
class Acked:
    transfer_id: int  # every byte of it arrived


@dataclass(frozen=True)
class Refused:
    transfer_id: int
    reason: int


@dataclass(frozen=True)
class Ended:
    reason: str


class Session:
    """One TCPCLv4 session as its active entity.  `start()` gives the contact header; `feed()`
    takes what arrived; `send()` cuts a bundle into segments; `tick(now)` gives a keepalive when
    one is due and says whether the peer has been silent too long."""

    def __init__(
        self, node_id: str, now: float, keepalive_s: int = 15, segment_mru: int = 1 << 20, transfer_mru: int = 64 << 20
    ):
        self.node_id = node_id
        self.keepalive_s = keepalive_s
        self.segment_mru = segment_mru
        self.transfer_mru = transfer_mru
        self._buf = bytearray()
        self._state = "contact"  # contact -> init -> open -> ended
        self._peer: Established | None = None
        self._next_id = 0
        self._rx: bytearray | None = None  # the incoming transfer being put together
        self._rx_id = -1
        self._last_rx = self._last_tx = now

    @property
    def established(self) -> bool:
        return self._state == "open"

    def start(self) -> bytes:
        return MAGIC + bytes([VERSION, 0])  # no TLS

    def _sess_init(self) -> bytes:
        node = self.node_id.encode()
        return (
            struct.pack(">BHQQH", SESS_INIT, self.keepalive_s, self.segment_mru, self.transfer_mru, len(node))
            + node
            + struct.pack(">I", 0)
        )

    def send(self, bundle: bytes, now: float) -> tuple[int, bytes]:
        """(transfer id, the segments to write) for one bundle."""
        if self._peer is None:
            raise ProtocolError("no session yet")
        if len(bundle) > self._peer.transfer_mru:
            raise ProtocolError(
                f"a bundle of {len(bundle)} bytes is over the peer's transfer MRU {self._peer.transfer_mru}"
            )
        tid = self._next_id
        self._next_id += 1
        out = bytearray()
        step = max(1, self._peer.segment_mru)
        for off in range(0, max(1, len(bundle)), step):
            chunk = bundle[off : off + step]
            flags = (START if off == 0 else 0) | (END if off + step >= len(bundle) else 0)
            out += struct.pack(">BBQ", XFER_SEGMENT, flags, tid)
            if flags & START:
                out += struct.pack(">I", 0)  # no transfer extension items
            out += struct.pack(">Q", len(chunk)) + chunk
        self._last_tx = now
        return tid, bytes(out)

    def terminate(self, reason: int = TERM_UNKNOWN) -> bytes:
        self._state = "ended"
        return struct.pack(">BBB", SESS_TERM, 0, reason)

    def tick(self, now: float) -> bytes:
        """A KEEPALIVE if one is due; ProtocolError if the peer said nothing for two intervals."""
        ka = self._peer.keepalive_s if self._peer else 0
        if not ka or self._state != "open":
            return b""
        if now - self._last_rx > 2 * ka:
            raise ProtocolError(f"no message from the peer for {now - self._last_rx:.0f} s (keepalive {ka} s)")
        if now - self._last_tx >= ka:
            self._last_tx = now
            return bytes([KEEPALIVE])
        return b""

    def deadline(self) -> float | None:
        """When `tick` next has something to do (None: never)."""
        ka = self._peer.keepalive_s if self._peer else 0
        if not ka or self._state != "open":
            return None
        return min(self._last_tx + ka, self._last_rx + 2 * ka)

    def feed(self, data: bytes, now: float) -> tuple[bytes, list]:
        """Bytes that arrived -> (bytes to write back, events).  ProtocolError ends the session."""
        self._buf += data
        if data:
            self._last_rx = now
        out = bytearray()
        events: list = []
        while self._state != "ended":
            n = self._step(out, events)
            if n == 0:
                break
            del self._buf[:n]
        return bytes(out), events

    def _need(self, n: int) -> bool:
        return len(self._buf) >= n

    def _step(self, out: bytearray, events: list) -> int:
        """Consume one unit from the buffer; return its length (0: more bytes are needed)."""
        b = self._buf
        if self._state == "contact":
            if not self._need(6):
                return 0
            if bytes(b[:4]) != MAGIC:
                raise ProtocolError(f"contact header starts {bytes(b[:4])!r}, not {MAGIC!r}")
            if b[4] != VERSION:
                raise ProtocolError(f"the peer speaks TCPCL version {b[4]}, not 4")
            self._state = "init"
            out += self._sess_init()
            return 6
        if not self._need(1):
            return 0
        kind = b[0]
        if self._state == "init" and kind not in (SESS_INIT, SESS_TERM, MSG_REJECT):
            raise ProtocolError(f"message type {kind} before SESS_INIT")
        if kind == SESS_INIT:
            if not self._need(21):
                return 0
            ka, seg, xfer, nlen = struct.unpack_from(">HQQH", b, 1)
            if not self._need(21 + nlen + 4):
                return 0
            elen = struct.unpack_from(">I", b, 21 + nlen)[0]
            total = 21 + nlen + 4 + elen
            if not self._need(total):
                return 0
            peer = bytes(b[21 : 21 + nlen]).decode(errors="replace")
            self._peer = Established(peer, min(ka, self.keepalive_s), seg, xfer)
            self._state = "open"
            events.append(self._peer)
            return total
        if kind == XFER_SEGMENT:
            if not self._need(10):
                return 0
            flags, tid = struct.unpack_from(">BQ", b, 1)
            at = 10
            if flags & START:
                if not self._need(at + 4):
                    return 0
                at += 4 + struct.unpack_from(">I", b, at)[0]
            if not self._need(at + 8):
                return 0
            dlen = struct.unpack_from(">Q", b, at)[0]
            at += 8
            if dlen > self.segment_mru:
                raise ProtocolError(f"a segment of {dlen} bytes is over our segment MRU {self.segment_mru}")
            if not self._need(at + dlen):
                return 0
            if flags & START:
                self._rx, self._rx_id = bytearray(), tid
            elif self._rx is None or tid != self._rx_id:
                raise ProtocolError(f"segment of transfer {tid} without its start")
            self._rx += b[at : at + dlen]
            if len(self._rx) > self.transfer_mru:
                raise ProtocolError(f"transfer {tid} is over our transfer MRU {self.transfer_mru}")
            out += struct.pack(">BBQQ", XFER_ACK, flags, tid, len(self._rx))
            if flags & END:
                events.append(Received(bytes(self._rx)))
                self._rx, self._rx_id = None, -1
            return at + dlen
        if kind == XFER_ACK:
            if not self._need(18):
                return 0
            flags, tid, _ = struct.unpack_from(">BQQ", b, 1)
            if flags & END:
                events.append(Acked(tid))
            return 18
        if kind == XFER_REFUSE:
            if not self._need(10):
                return 0
            reason, tid = struct.unpack_from(">BQ", b, 1)
            events.append(Refused(tid, reason))
            return 10
        if kind == KEEPALIVE:
            return 1
        if kind == SESS_TERM:
            if not self._need(3):
                return 0
            flags, reason = b[1], b[2]
            if not flags & REPLY:
                out += struct.pack(">BBB", SESS_TERM, REPLY, reason)
            self._state = "ended"
            events.append(Ended(f"the peer ended the session (reason {reason})"))
            return 3
        if kind == MSG_REJECT:
            if not self._need(3):
                return 0
            raise ProtocolError(f"the peer rejected our message type {b[2]} (reason {b[1]})")
        raise ProtocolError(f"unknown message type {kind}")
