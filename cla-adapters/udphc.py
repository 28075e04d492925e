"""udphc: the UDP convergence layer with each bundle's blocks compressed on the air
(decision 0034).  No I/O: the shell is overlay/hclink.py.

The two ends of a radio hop run it (`udphc://` in [agent] listen and peers); the node's agent
speaks plain UDP to its own end.  A BPv7 bundle of the shape agents send (ipn endpoints, a
primary block with a CRC and without fragment fields, at most a previous node block, the
payload block last, every item in CBOR's shortest form) goes as a short header and its
payload; any other datagram goes as it came.  Nothing is changed on the way: the sender keeps
the short form only where it decodes back to the very bytes it was given, and the receiver
checks the primary block's CRC on what it rebuilt.  Neither end needs the other's clock.

A compressed frame (every integer an unsigned LEB128, at most 10 bytes):

    0xC2, shape bits, processing flags, destination node and service (or, for a dtn-scheme
    destination, the length and bytes of its text after "dtn:"), source node and service,
    [report-to node and service], creation time (6 bytes, big-endian: DTN ms until the year
    10900; else 8), sequence number, lifetime (in seconds or in ms), the primary block's CRC (2 or 4 bytes),
    [previous node block: block number, node, service], then the payload to the frame's end.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from c2dtn.cla_adapters.bpv7 import CRC16, CRC32C, PAYLOAD, crc16_x25, ipn_of
from c2dtn.strict_cbor import StrictCBORError
from c2dtn.strict_cbor import loads as strict_loads

MARK = 0xC2  # a compressed frame's first byte: a BPv7 bundle starts 0x9f, a BPv6 one 0x06
# shape bits
REPORT_TO = 0x01  # a report-to endpoint follows (else dtn:none)
PREVIOUS = 0x02  # a previous node block (ipn, block flags 0, no CRC) before the payload block
CRC_32C = 0x04  # the primary block's CRC is a CRC-32C (else a CRC-16)
TIME_FULL = 0x08  # the creation time in 8 bytes (else in 6)
LIFE_S = 0x10  # the lifetime in whole seconds (else in ms)
DST_DTN = 0x20  # the destination is a dtn-scheme endpoint (a group's): its text follows, length first
_KNOWN = REPORT_TO | PREVIOUS | CRC_32C | TIME_FULL | LIFE_S | DST_DTN
PREVIOUS_NODE = 6  # block type code (RFC 9171 §4.4.1)
_TIME6 = 1 << 48
_U64 = (1 << 64) - 1


class HcError(ValueError):
    """A frame that is not one this codec makes; the message names what is wrong."""


class _Unfit(Exception):
    """A bundle of another shape: it goes uncompressed."""


# LEB128 by hand: a few lines each way, where a CBOR integer would cost a byte more from 24 up
def _uvar(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    out.append(n)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 2

    def uvar(self, what: str) -> int:
        n = shift = 0
        for i in range(10):
            if self.at >= len(self.data):
                raise HcError(f"frame ends inside the {what}")
            b = self.data[self.at]
            self.at += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if (b == 0 and i) or n > _U64:  # a padded or too long number: not what encode makes
                    raise HcError(f"{what} is not a shortest unsigned LEB128 of 64 bits at most")
                return n
        raise HcError(f"{what} runs past 10 bytes")

    def take(self, n: int, what: str) -> bytes:
        if self.at + n > len(self.data):
            raise HcError(f"frame ends inside the {what}")
        self.at += n
        return self.data[self.at - n : self.at]


def _ipn(v: object) -> tuple[int, int]:
    got = ipn_of(v)
    if got is None:
        raise _Unfit
    return got


def _uint(v: object) -> int:
    if type(v) is int and 0 <= v <= _U64:
        return v
    raise _Unfit


def _compress(bundle: bytes) -> bytes:
    if not bundle or bundle[0] != 0x9F:
        raise _Unfit
    try:
        blocks = strict_loads(bundle, max_depth=4, indefinite_array=True)
    except StrictCBORError:
        raise _Unfit from None
    if not isinstance(blocks, list) or len(blocks) not in (2, 3) or not isinstance(blocks[0], list):
        raise _Unfit
    p = blocks[0]
    if len(p) != 9 or p[0] != 7 or p[2] not in (CRC16, CRC32C) or not isinstance(p[6], list) or len(p[6]) != 2:
        raise _Unfit
    shape = 0
    head = bytearray(_uvar(_uint(p[1])))
    d = p[3]
    if isinstance(d, list) and len(d) == 2 and d[0] == 1 and isinstance(d[1], str) and d[1]:
        shape |= DST_DTN
        ssp = d[1].encode()
        head += _uvar(len(ssp)) + ssp
    else:
        head += b"".join(map(_uvar, _ipn(d)))
    head += b"".join(map(_uvar, _ipn(p[4])))
    if p[5] != [1, 0]:
        shape |= REPORT_TO
        head += b"".join(map(_uvar, _ipn(p[5])))
    created, seq = _uint(p[6][0]), _uint(p[6][1])
    if created < _TIME6:
        head += struct.pack(">Q", created)[2:]
    else:
        shape |= TIME_FULL
        head += struct.pack(">Q", created)
    life = _uint(p[7])
    if life % 1000 == 0:
        shape |= LIFE_S
        life //= 1000
    head += _uvar(seq) + _uvar(life)
    crc = p[8]
    if not isinstance(crc, bytes) or len(crc) != (2 if p[2] == CRC16 else 4):
        raise _Unfit
    shape |= CRC_32C if p[2] == CRC32C else 0
    head += crc
    if len(blocks) == 3:
        b = blocks[1]
        if not (isinstance(b, list) and len(b) == 5 and b[0] == PREVIOUS_NODE and b[2:4] == [0, 0]):
            raise _Unfit
        if not isinstance(b[4], bytes):
            raise _Unfit
        try:
            node = _ipn(strict_loads(b[4], max_depth=3))
        except StrictCBORError:
            raise _Unfit from None
        shape |= PREVIOUS
        head += _uvar(_uint(b[1])) + _uvar(node[0]) + _uvar(node[1])
    pay = blocks[-1]
    if not (isinstance(pay, list) and pay[:4] == [PAYLOAD, 1, 0, 0] and len(pay) == 5 and isinstance(pay[4], bytes)):
        raise _Unfit
    return bytes([MARK, shape]) + bytes(head) + pay[4]


def encode(bundle: bytes) -> bytes:
    """The frame that carries `bundle` (a UDP datagram from the agent): compressed where it has
    the common shape and decodes back to the same bytes, else `bundle` itself."""
    try:
        frame = _compress(bundle)
    except _Unfit:
        return bundle
    try:
        if decode(frame) == bundle:
            return frame
    except HcError:
        pass
    return bundle  # a form this codec would rebuild differently (e.g. a CBOR length not the shortest)


def _head(n: int, major: int) -> bytes:
    """A CBOR head: major type and argument, shortest form (what strict senders write)."""
    if n < 24:
        return bytes([major << 5 | n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | extra]) + struct.pack(fmt, n)
    raise HcError(f"integer {n} past 64 bits")


def _u(n: int) -> bytes:
    return _head(n, 0)


def _eid(node: int, service: int) -> bytes:
    return b"\x82\x02\x82" + _u(node) + _u(service)


@dataclass
class _Head:
    shape: int
    flags: int
    dst: tuple[int, int] | bytes  # ipn (node, service), or a dtn-scheme endpoint's text
    src: tuple[int, int]
    rpt: tuple[int, int] | None
    time: int
    seq: int
    life_ms: int
    crc: bytes
    prev: tuple[int, int, int] | None  # block number, node, service
    at: int  # where the payload starts


def _read(frame: bytes) -> _Head:
    if len(frame) < 2:
        raise HcError("frame ends before its shape")
    shape = frame[1]
    if shape & ~_KNOWN:
        raise HcError(f"shape {shape:#04x} has bits this codec does not know")
    r = _Reader(frame)
    flags = r.uvar("processing flags")
    dst: tuple[int, int] | bytes
    if shape & DST_DTN:
        dst = r.take(r.uvar("destination's length"), "destination")
        try:
            dst.decode()
        except UnicodeDecodeError:
            raise HcError("destination's text is not UTF-8") from None
    else:
        dst = (r.uvar("destination node"), r.uvar("destination service"))
    src = (r.uvar("source node"), r.uvar("source service"))
    rpt = (r.uvar("report-to node"), r.uvar("report-to service")) if shape & REPORT_TO else None
    if shape & TIME_FULL:
        t = struct.unpack(">Q", r.take(8, "creation time"))[0]
    else:
        t = int.from_bytes(r.take(6, "creation time"), "big")
    seq = r.uvar("sequence number")
    life = r.uvar("lifetime")
    if shape & LIFE_S:
        life *= 1000
        if life > _U64:
            raise HcError("lifetime past 64 bits of ms")
    crc = r.take(4 if shape & CRC_32C else 2, "primary block's CRC")
    prev = None
    if shape & PREVIOUS:
        prev = (r.uvar("previous node block's number"), r.uvar("previous node"), r.uvar("previous node's service"))
    return _Head(shape, flags, dst, src, rpt, t, seq, life, crc, prev, r.at)


def header_bytes(frame: bytes) -> int:
    """How many bytes of a frame go before the bundle's payload (all of them for a frame that is
    not compressed and not read here: 0).  HcError as decode."""
    return _read(frame).at if frame and frame[0] == MARK else 0


def decode(frame: bytes) -> bytes:
    """The bundle a frame carries: a compressed frame rebuilt, any other returned as it is.
    HcError for a compressed frame that is damaged or not one `encode` makes.  Time and memory
    linear in the frame; the bundle is at most 90 bytes longer than the frame."""
    if not frame or frame[0] != MARK:
        return frame
    h = _read(frame)
    crc_type = CRC32C if h.shape & CRC_32C else CRC16
    rpt = _eid(*h.rpt) if h.rpt is not None else b"\x82\x01\x00"
    prev = b""
    if h.prev is not None:
        node = _eid(h.prev[1], h.prev[2])
        prev = b"\x85\x06" + _u(h.prev[0]) + b"\x00\x00" + _head(len(node), 2) + node
    payload = frame[h.at :]
    dst = b"\x82\x01" + _head(len(h.dst), 3) + h.dst if isinstance(h.dst, bytes) else _eid(*h.dst)
    fixed = b"\x89\x07" + _u(h.flags) + _u(crc_type) + dst + _eid(*h.src) + rpt
    tail = _u(h.life_ms) + _head(len(h.crc), 2)
    primary = fixed + b"\x82" + _u(h.time) + _u(h.seq) + tail
    if _crc(primary, crc_type) != h.crc:
        raise HcError("the primary block's CRC does not match the block rebuilt (a damaged frame)")
    pay = b"\x85\x01\x01\x00\x00" + _head(len(payload), 2) + payload
    return b"\x9f" + primary + h.crc + prev + pay + b"\xff"


def _crc(block_without_crc: bytes, crc_type: int) -> bytes:
    """The block's CRC over its encoding with the CRC field zeroed (RFC 9171 §4.2.1)."""
    if crc_type == CRC16:
        return struct.pack(">H", crc16_x25(block_without_crc + b"\0\0"))
    import crc32c

    return struct.pack(">I", crc32c.crc32c(block_without_crc + b"\0\0\0\0"))
