"""BPv7 bundles (RFC 9171 §4) for an agent the driver must speak to as a BP node (HDTN), or
hand whole bundles to (dtn7-rs: fewer bytes than the bundle its /send builds, decision 0022).

Only what a driver needs: a bundle of one payload block from an endpoint to another, and
the source, destination and payload of one received (whatever other blocks it carries).  No
I/O.  Written here because no maintained Python BPv7 codec is on PyPI (the CBOR is cbor2's,
the CRC-32C the crc32c package's).
"""

from __future__ import annotations

import binascii
import re
import struct
from dataclasses import dataclass

import cbor2
import crc32c

from c2dtn.strict_cbor import StrictCBORError, short
from c2dtn.strict_cbor import loads as strict_loads

DTN_EPOCH_MS = 946_684_800_000  # the DTN epoch in Unix milliseconds (RFC 9171 §4.2.6)
MUST_NOT_FRAGMENT = 0x04  # bundle processing control flag: the overlay takes an envelope whole
CRC16, CRC32C = 1, 2
DTN_NONE = [1, 0]  # the null endpoint: the report-to of a bundle that asks for no status reports
_BITS_REVERSED = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))
PAYLOAD = 1  # block type code of the payload block


class BundleError(ValueError):
    """Bytes that are not a BPv7 bundle this driver can take; the message names what is wrong."""


@dataclass(frozen=True)
class Bundle:
    src: tuple[int, int]  # ipn (node, service)
    dst: tuple[int, int]
    created_ms: int  # DTN time (ms since 2000) of its creation, 0 where the source has no clock
    seq: int
    lifetime_ms: int
    payload: bytes


def _ipn(node: int, service: int) -> list:
    return [2, [node, service]]


def encode(
    src: tuple[int, int], dst: tuple[int, int], payload: bytes, lifetime_ms: int, created_ms: int, seq: int
) -> bytes:
    """One bundle: a primary block with a CRC-32C (RFC 9171 §4.3.1 wants a CRC on it) and one
    payload block; the report-to endpoint is the source."""
    primary = [
        7,
        MUST_NOT_FRAGMENT,
        CRC32C,
        _ipn(*dst),
        _ipn(*src),
        _ipn(*src),
        [created_ms, seq],
        lifetime_ms,
        b"\0\0\0\0",
    ]
    blank = cbor2.dumps(primary)
    # the CRC is over the block's encoding with the CRC field zeroed; it is the last 4 bytes
    crc = struct.pack(">I", crc32c.crc32c(blank))
    body = cbor2.dumps([PAYLOAD, 1, 0, 0, payload])
    return b"\x9f" + blank[:-4] + crc + body + b"\xff"


def crc16_x25(data: bytes) -> int:
    """CRC-16/X-25 (RFC 9171 §4.2.1): the standard library's CRC-CCITT is the same polynomial
    unreflected, so it runs over the bytes bit-reversed and its result is reversed back."""
    c = binascii.crc_hqx(data.translate(_BITS_REVERSED), 0xFFFF)
    return int(f"{c:016b}"[::-1], 2) ^ 0xFFFF


def eid_value(text: str) -> list:
    """The CBOR form of an EID written as text: ipn:N.S, dtn://node/service or dtn:none."""
    if text == "dtn:none":
        return list(DTN_NONE)
    if text.startswith("ipn:"):
        node, dot, svc = text[4:].partition(".")
        if dot and all(x.isascii() and x.isdigit() and len(x) <= 19 for x in (node, svc)):
            return _ipn(int(node), int(svc))
    elif re.fullmatch(r"dtn://[!-~]+", text):  # printable ASCII, no space
        return [1, text[4:]]
    raise BundleError(f"{text!r} is not an ipn:N.S or dtn://node/service endpoint")


def encode_sent(src: str, dst: str, payload: bytes, lifetime_ms: int, created_ms: int, seq: int) -> bytes:
    """The least a BP agent forwards (what dtnd's /insert takes): a primary block with a
    CRC-16, the report-to dtn:none (no status reports asked for), and one payload block; no hop
    count block."""
    primary = [7, MUST_NOT_FRAGMENT, CRC16, eid_value(dst), eid_value(src), DTN_NONE, [created_ms, seq], lifetime_ms]
    blank = cbor2.dumps(primary + [b"\0\0"])
    crc = struct.pack(">H", crc16_x25(blank))
    return b"\x9f" + blank[:-2] + crc + cbor2.dumps([PAYLOAD, 1, 0, 0, payload]) + b"\xff"


def ipn_of(v: object) -> tuple[int, int] | None:
    """(node, service) of an endpoint's CBOR form if it is an ipn one ([2, [node, service]],
    each an unsigned 64-bit integer), else None."""
    if (
        isinstance(v, list)
        and len(v) == 2
        and v[0] == 2
        and isinstance(v[1], list)
        and len(v[1]) == 2
        and all(type(x) is int and 0 <= x < 1 << 64 for x in v[1])
    ):
        return v[1][0], v[1][1]
    return None


def _eid(v, what: str) -> tuple[int, int]:
    got = ipn_of(v)
    if got is None:
        raise BundleError(f"{what} is not an ipn endpoint: {short(v)}")
    return got


def decode(raw: bytes) -> Bundle:
    """The bundle in `raw`.  The CRCs are not checked again: the bundle came over TCP from the
    agent, which checked them when it took the bundle from the network."""
    try:
        blocks = strict_loads(raw, max_depth=4, indefinite_array=True)
    except StrictCBORError as e:
        raise BundleError(f"not strict CBOR: {e}") from None
    if not isinstance(blocks, list) or len(blocks) < 2 or not isinstance(blocks[0], list):
        raise BundleError("not a BPv7 bundle (an array of blocks, the primary first)")
    p = blocks[0]
    if len(p) < 8 or p[0] != 7:
        raise BundleError(
            f"primary block of version {short(p[0]) if p else '?'} with {len(p)} fields (BPv7 has 7 and 8+)"
        )
    created = p[6]
    if not (isinstance(created, list) and len(created) == 2 and all(isinstance(x, int) for x in created)):
        raise BundleError(f"creation timestamp {short(created)}")
    if not isinstance(p[7], int):
        raise BundleError(f"lifetime {short(p[7])}")
    for b in blocks[1:]:
        if isinstance(b, list) and len(b) >= 5 and b[0] == PAYLOAD:
            if not isinstance(b[4], bytes):
                raise BundleError("payload block data is not a byte string")
            return Bundle(_eid(p[4], "source"), _eid(p[3], "destination"), created[0], created[1], p[7], b[4])
    raise BundleError("bundle has no payload block")
