"""Envelope codec: the versioned CBOR unit c2dtn carries end to end (I/O-free).

Wire form, chosen to be small on kbit/s links (docs/security.md; decision records
docs/decisions/0001-envelope-aead.md, 0023-one-seal-a-bundle.md):

  bundle payload  = CBOR [CONTAINER_VERSION, sender node id, destination, base second,
                    incarnation, seal]
                    (+ [origin tag, ...] as a 7th item when the destination is a group)
  stamp           = (base second, incarnation): the sealing time in whole seconds since 1970,
                    and the sender's store incarnation (0: none).  Every envelope's creation
                    time is sealed as milliseconds from the base second, and its incarnation is
                    the container's unless its map says otherwise (decision 0020).
  seal            = byte string ciphertext | 16-byte tag: AES-GCM-SIV (RFC 8452) of the
                    envelopes' maps, as one CBOR array, under the key of the destination (the
                    pair key of sender and receiver, or the group's key); associated data
                    ENVELOPE_CONTEXT and the stamp, so the envelopes open only with the stamp
                    they were sealed with.  One tag a bundle, not one an envelope (decision 0023)
  map             = CBOR map with small integer keys (see K_* below); neither the destination
                    nor the origin is in it (the container names them once, and the nonce
                    binds them), nor what is the default (decision 0012), nor a data envelope's
                    seq and send number where they are one on from the data envelope's before it
                    in the bundle (decision 0026): maps are opened in their bundle's order
  nonce           = SHA-256(NONCE_CONTEXT | sender | 0 | destination)[:12]

A relay, a radio eavesdropper or a BPA sees who sent a bundle to whom and how large its
envelopes are, the stamp (when it was sealed, the sender's store incarnation, and so which
bundles hold acks alone) and the size of the seal, nothing of what the envelopes say, nor
how many a bundle holds.  AES-GCM-SIV is nonce-misuse resistant: the nonce is the same for
every bundle of one direction, and a sealing repeated costs nothing but showing that two
seals are of the same maps.  The tag costs 16 bytes a bundle: a bundle opens whole or not
at all, and what it holds is refused whole if its maps are not one strict CBOR array.  The AEAD key is derived
from the configured secret (`_subkey`), so the same secret also keys origin tags apart.

The receiver decrypts before it parses the maps, so nothing unauthenticated is
interpreted beyond the outer array.

Group traffic: an envelope for a group is sealed with the group's key, which every
member holds, so that seal alone cannot tell one member from another (any member could
seal an envelope naming another as its origin).  A group bundle therefore also carries
one origin tag per other member, in member-name order:
  origin tag = HMAC-SHA256(pair key of sender and that member,
                           ORIGIN_CONTEXT | sender | 0 | group | 0 | stamp | the seal's digest)[:8]
  seal digest = SHA-256(the seal's bytes)[:16]
It covers the envelopes through a digest of what is sent (an AEAD tag would not do: a
member knows the group key, and a polynomial MAC's collisions are easy with the key).
A member opens an envelope sealed with a group key only if its own origin tag in that
bundle checks out under the pair key it shares with the sender.  8 bytes, as OSCORE's
default AEAD tag (RFC 8613): a forger must get each guess onto a kbit/s link and past
the receiver, one in 2**64; it costs 9 bytes per other member and bundle, not per
envelope.

A long supersession key travels as a short digest (wire_key): receivers see that
digest (received_key), which compares the same way.  Every failure raises a subclass of EnvelopeError
naming what was wrong.
"""

from __future__ import annotations

import base64
import bisect
import functools
import hashlib
import hmac
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from importlib import resources
from typing import Any

import cbor2
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV
from rapidfuzz.distance import Levenshtein

from c2dtn.strict_cbor import StrictCBORError, short
from c2dtn.strict_cbor import check as strict_check
from c2dtn.strict_cbor import loads as strict_loads
from c2dtn.tomlfile import NAME

try:
    import zstandard
except ImportError:  # pragma: no cover - zstandard is a declared dependency
    zstandard = None  # type: ignore[assignment]

# 2: envelopes encrypted (AES-GCM-SIV), the destination in the container; 3: the envelope map
# without what the container says (version, origin) or what is the default (data, routine), and
# short forms of lifetime, supersession key, app and floor (decision 0012)
# 4: the creation time relative to a base second and the incarnation once per bundle, both in
# the container and bound to each envelope as the AEAD's associated data (decision 0020)
# 5: one seal a bundle, over the array of its envelopes' maps (decision 0023)
# 6: a delta body may be the edits of its reference (Compression.EDITS, decision 0025)
CONTAINER_VERSION = 6
TAG_BYTES = 16
ORIGIN_TAG_BYTES = 8
# The one size limit (docs/security.md): a message body as submitted.  Every entry point refuses
# a larger one with its protocol's answer before acknowledging anything, and a receiver takes
# every body up to it, so nothing is accepted that its destination would refuse.
MAX_MESSAGE_BYTES = 1 << 20
MAX_ENVELOPE_BYTES = MAX_MESSAGE_BYTES + (64 << 10)  # the sealed map: a body travels plain if compression does not pay
MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # a body after decompression (guards against zip bombs)
MAX_CONTAINER_BYTES = 8 << 20
# what a bundle's bodies may add up to once decompressed: senders close a bundle before it (the
# scheduler), so a receiver holds at most this much of one bundle whatever the bodies compress to
MAX_BUNDLE_PLAIN_BYTES = 8 << 20
MAX_ENVELOPES_PER_BUNDLE = 4096
# a map's entries at most (the K_* keys are 18; keys a receiver does not know it ignores): what
# one envelope decodes to is bounded by its size and this
MAP_ENTRIES_MAX = 32
APP_MAX_BYTES = 64  # an app name sent as text (an unknown one, APP_CODES)
MAX_GROUP_MEMBERS = 256
# CBOR items a container may hold: [version, sender, dst, base, inc, seal, [tag x members]]
CONTAINER_ITEMS_MAX = 1 + 6 + (1 + MAX_GROUP_MEMBERS)


class Kind(IntEnum):
    DATA = 0
    ACK = 1


class Priority(IntEnum):
    """NATO precedence levels: lower value goes first."""

    FLASH = 0
    IMMEDIATE = 1
    PRIORITY = 2
    ROUTINE = 3

    @classmethod
    def parse(cls, v: str | int) -> "Priority":
        if isinstance(v, int):
            return cls(v)
        try:
            return cls[v.upper()]
        except KeyError:
            raise ValueError(f"unknown priority {v!r}: flash, immediate, priority or routine") from None


class Compression(IntEnum):
    NONE = 0
    ZLIB = 1
    ZSTD = 2  # plain zstd
    ZSTD_DICT = 3  # zstd with the shared position-report dictionary (v1: bare reports; read, no longer sent)
    ZSTD_DICT2 = 4  # ... v2: reports and the MQTT gateway's bodies carrying them
    DELTA = 5  # zstd with an earlier body of the same key, which the receiver acked, as the dictionary (K_REF)
    DELTA2 = 6  # ... in a frame without zstd's magic number and content size (read DELTA, no longer sent)
    EDITS = 7  # the edits that turn that earlier body into this one, and a checksum (_edits)


DELTAS = (Compression.DELTA, Compression.DELTA2, Compression.EDITS)
DELTA_WINDOW_LOG = 14  # a delta's frame looks back at most this far: DELTA_MAX_BODY of reference and of body


# map keys (0, the envelope version, and 2, the origin, were in the map until container version 3:
# the container's version and sender say them; 10 was the destination, until version 2)
K_KIND, K_SEQ, K_CREATED, K_LIFETIME, K_PRIORITY = 1, 3, 4, 5, 6
K_SUPERSEDE, K_BODY, K_COMPRESSION, K_APP, K_CSEQ, K_FLOOR, K_INC = 7, 8, 9, 11, 12, 13, 14
K_LIFETIME_S = 15  # the lifetime in whole seconds, when it is whole (instead of K_LIFETIME)
K_FLOOR_BACK = 16  # cseq - floor (instead of K_FLOOR, when the floor is at or below cseq)
# a delta (DELTAS): how many seqs back the body it was made against is (seq - its seq); a map with
# it and without K_COMPRESSION is Compression.EDITS
K_REF = 17
# the send number: each data envelope sealed for a destination (a first sending or a copy) takes
# the next, modulo SN_MOD (one CBOR byte), so a receiver sees a missing one from the next that
# arrives and acks at once (decision 0016); a receiver that does not know the key ignores it
K_SN = 18
SN_MOD = 24
# an answer to an announced send number (decision 0041) names the announcement: its number plus
# SN_MOD times its creation time in ms modulo this, so a replayed answer names an old one
HEARD_ECHO_MS = 1 << 16
RETIRED_KEYS = (0, 2, 10)  # a map with any of them is of an older version: refused
# apps with a one-byte code on the wire; any other name travels as text
APP_CODES = {"raw": 1, "mqtt": 2, "coap": 3, "ping": 4, "pong": 5}
APP_NAMES = {v: k for k, v in APP_CODES.items()}
KEY_DIGEST_BYTES = 9  # a supersession key longer than this travels as a digest of this size
ORIGIN_CONTEXT = b"c2dtn origin v3\0"
ENVELOPE_CONTEXT = b"c2dtn envelope v5\0"  # the AEAD's associated data, the stamp after it (_aad)
NONCE_CONTEXT = b"c2dtn nonce v2\0"
AEAD_KEY_LABEL = b"c2dtn aead key v2"
MAX_LIFETIME_S = 1 << 40  # far beyond any lifetime (an int the store keeps in ms without overflow)
MAX_TIME_MS = 1 << 61  # a creation time (ms since 1970): with a lifetime added it stays a 64-bit int
INC_BITS = 32  # an incarnation is 1 .. 2**32 - 1 (0: none, what a store before incarnations sent)
MAX_BASE_S = MAX_TIME_MS // 1000
SEAL_AT = 5  # where a container's seal is (what precedes it: version to incarnation)
Stamp = tuple[int, int]  # (base second, incarnation) of a container (module doc)
Chain = tuple[int, int | None]  # (seq, send number) of the data envelope before one in its bundle
BROKEN = object()  # a chain after a map refused before its seq was read: nothing may follow it
NO_STAMP: Stamp = (0, 0)  # an envelope outside a container: its creation time absolute, its incarnation in its map


class EnvelopeError(ValueError):
    """Anything wrong with an envelope or a bundle payload from a peer."""

    reason = "malformed"


class Malformed(EnvelopeError):
    reason = "malformed"


class Oversize(EnvelopeError):
    reason = "oversize"


class BadTag(EnvelopeError):
    reason = "bad-tag"


class UnknownPeer(EnvelopeError):
    reason = "unknown-peer"


class BadVersion(EnvelopeError):
    reason = "version"


class Misrouted(EnvelopeError):
    reason = "misrouted"


class NoReference(EnvelopeError):
    """A body compressed against an earlier one this node no longer holds (it restarted, or
    let it go): the envelope is not acked, and the sender's retransmission goes whole (only
    where this node took a delta sent after it may the first go as a delta: decision 0040)."""

    reason = "no-reference"


# Delta bodies (Compression.DELTA, decision 0013): a small body with a supersession key goes
# compressed against the newest body of that key its destination acked, when that is smaller.
DELTA_MAX_BODY = 4096  # bodies up to this size are kept as references, at both ends
# what a sender keeps of them for all its destinations, and a receiver for each peer (one peer's
# flood cannot push out another's), all keys together (the least recently used key goes first)
DELTA_BYTES_MAX = 1 << 20
# charged per key, stream and body kept, beside their sizes: about what the dicts holding them cost (_Refs)
DELTA_ENTRY_BYTES = 256
DELTA_KEEP_PER_KEY = 8  # a receiver keeps this many of each key's newest bodies (acks may be lost or late)
DELTA_OPEN_MAX = 3  # deltas of one key sent and not acked, at most: the next goes whole
# a lost envelope's resend to a group goes as a delta once a member took a delta first sealed after
# it, if each other member took one first sealed at most this many sealings (of keyed bodies, for
# the group) before it: a loss on the sender's own link is every member's, and their acks of the
# later one come one by one; one that restarted takes none (Codec.references_held, decision 0040)
DELTA_GROUP_LAG = 16
DELTA_PENDING_MAX = 2048  # bodies a sender keeps of what it sealed, until acked (the oldest go first)
# what a delta leaves out when its reference has the same (decision 0022): lifetime in ms,
# priority, app; its supersession key is always its reference's
Meta = tuple[int, int, str]
# what a map that is not a delta leaves out: no lifetime (it must say it), routine, no app
NOT_A_DELTA = (None, int(Priority.ROUTINE), "")
REF_ID_BYTES = 4  # a delta's content starts with its reference's id (_ref_id): both ends must hold the same one
REF_ID_CONTEXT = b"c2dtn reference v1\0"


def _ref_id(key: str, meta: Meta) -> bytes:
    """What a delta's reference is to its sender (key, lifetime, priority, app), 4 bytes put before
    both the reference and the body: a receiver holding another envelope at that seq (a store put
    back from a copy reuses seqs) decodes another content, which the frame's checksum refuses."""
    ident = cbor2.dumps([key, *meta])  # (each field framed: no two identities encode alike)
    return hashlib.sha256(REF_ID_CONTEXT + ident).digest()[:REF_ID_BYTES]


class _Refs:
    """Bodies kept per key, the least recently used key dropped past DELTA_BYTES_MAX; each body
    is charged its size and DELTA_ENTRY_BYTES, each key its length and DELTA_ENTRY_BYTES (what
    the dicts holding them cost), so empty bodies under many keys fill it too.  A key is a tuple
    whose last part is the supersession key and the rest its stream (destination, or source and
    destination); each body comes with the fields a delta against it leaves out (Meta), and
    `key_at` finds the key of a stream's seq."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, ...], dict[int, tuple[bytes, Meta]]] = {}
        self.at: dict[tuple[str, ...], dict[int, tuple[str, ...]]] = {}  # stream -> seq -> key, for what is kept
        self.nbytes = 0

    @staticmethod
    def _cost(key: tuple[str, ...]) -> int:
        return sum(len(part) for part in key) + DELTA_ENTRY_BYTES

    @staticmethod
    def _size(v: tuple[bytes, Meta]) -> int:
        return len(v[0]) + len(v[1][2].encode()) + DELTA_ENTRY_BYTES

    def put(self, key: tuple[str, ...], seq: int, body: bytes, keep: int, meta: Meta = (0, 0, "")) -> None:
        seqs = self.by_key.pop(key, None)
        if seqs is None:
            seqs = {}
            self.nbytes += self._cost(key)
        elif seqs:  # the key's tuple and fields as held already: one copy a key, not one an envelope
            key = self.at[key[:-1]][next(iter(seqs))]
            newest = next(reversed(seqs.values()))[1]
            meta = newest if newest == meta else meta
        self.by_key[key] = seqs  # most recently used last
        v = (body, meta)
        if seq in seqs:
            if seqs[seq] != v:  # the same seq, another body: neither end can trust this key's
                self.forget(key)
            return
        other = self.at.get(key[:-1], {}).get(seq)
        if other is not None:  # the same seq under another key: neither is trusted
            self.forget(other)
            self.forget(key)
            return
        seqs[seq] = v
        at = self.at.get(key[:-1])
        if at is None:  # a stream (source and incarnation, destination) costs as a key does
            at = self.at[key[:-1]] = {}
            self.nbytes += self._cost(key[:-1])
        at[seq] = key
        self.nbytes += self._size(v)
        while len(seqs) > keep:
            self._pop(key, seqs, min(seqs))
        while self.nbytes > DELTA_BYTES_MAX and self.by_key:
            self.forget(next(iter(self.by_key)))

    def _pop(self, key: tuple[str, ...], seqs: dict, seq: int) -> None:
        self.nbytes -= self._size(seqs.pop(seq))
        at = self.at[key[:-1]]
        del at[seq]
        if not at:
            del self.at[key[:-1]]
            self.nbytes -= self._cost(key[:-1])

    def forget(self, key: tuple[str, ...]) -> None:
        seqs = self.by_key.pop(key, None)
        if seqs is not None:
            for seq in list(seqs):
                self._pop(key, seqs, seq)
            self.nbytes -= self._cost(key)

    def get(self, key: tuple[str, ...], seq: int) -> tuple[bytes, Meta] | None:
        return self.by_key.get(key, {}).get(seq)

    def key_at(self, stream: tuple[str, ...], seq: int) -> tuple[str, ...] | None:
        return self.at.get(stream, {}).get(seq)

    def newest(self, key: tuple[str, ...]) -> tuple[int, tuple[bytes, Meta]] | None:
        seqs = self.by_key.get(key)
        return max(seqs.items()) if seqs else None

    def drop_below(self, key: tuple[str, ...], seq: int) -> None:
        seqs = self.by_key.get(key, {})
        for q in [q for q in seqs if q < seq]:
            self._pop(key, seqs, q)


@dataclass(frozen=True)
class Envelope:
    kind: Kind
    origin: str  # node id of the gateway that created it
    seq: int  # per origin and incarnation, unique: (origin, inc, seq) is the message id
    dst: str  # destination node id
    created_ms: int
    lifetime_ms: int
    priority: Priority = Priority.ROUTINE
    supersede: str | None = None
    body: bytes = b""
    app: str = ""  # which application protocol the body is ("mqtt", "coap", "raw", ...)
    cseq: int = 0  # per (origin, dst, priority) order number
    floor: int = 0  # lowest cseq of that class the sender still holds: below it, nothing more will come
    compression: Compression = Compression.NONE  # how the body travels; `body` here is always plain
    # the origin's store's incarnation (random, chosen when the store was created): a node whose
    # store was lost starts its seqs again under a new one, and its envelopes are new, not duplicates
    inc: int = 0
    sn: int | None = None  # send number, 0 .. SN_MOD - 1 (K_SN); None: not numbered (acks)

    @property
    def msg_id(self) -> tuple[str, int, int]:
        return (self.origin, self.inc, self.seq)

    @property
    def source(self) -> str:
        return source_key(self.origin, self.inc)

    def expires_ms(self) -> int:
        return self.created_ms + self.lifetime_ms


def source_key(origin: str, inc: int) -> str:
    """What a receiver keys an origin's ids, order and acks by: the node and its store's
    incarnation ('gw1/1f2e3d4c'); node ids cannot hold '/' (tomlfile.NAME)."""
    return f"{origin}/{inc:x}" if inc else origin


def source_node(key: str) -> str:
    """The node of a source key."""
    return key.split("/", 1)[0]


SMALL_BODY = 4096  # up to this size, try hard (every byte counts on a 9.8 kbit/s link)
SAMPLE_OVER = 256 * 1024  # from this size, a sample first (_compress)...
SAMPLE_BYTES = 32 * 1024  # ... of this many bytes
_compressors: dict[tuple[int | str, int], Any] = {}  # (level or "d", id of the dictionary) -> (de)compressor


def _zstd(level: int, zdict) -> "zstandard.ZstdCompressor":
    key = (level, id(zdict))
    c = _compressors.get(key)
    if c is None:
        c = _compressors[key] = zstandard.ZstdCompressor(
            level=level, dict_data=zdict, write_checksum=False, write_content_size=True, write_dict_id=False
        )
    return c


def _compress(
    body: bytes, zdict: "zstandard.ZstdCompressionDict | None", dict_kind: Compression = Compression.ZSTD_DICT2
) -> tuple[Compression, bytes]:
    """Compress where it pays: the smallest of plain, zlib and zstd.  Small bodies
    get the position-report dictionary (at zstd level 3: on 255-byte reports it is
    smaller than level 19, 41 against 44 bytes, and 40 times faster, 1.4 against 53 us)
    and zlib only when the dictionary did not halve them; large ones a fast level, so a
    megabyte costs milliseconds, not seconds."""
    if len(body) < 48:
        return Compression.NONE, body
    if len(body) >= SAMPLE_OVER and zstandard is not None:
        # a large body that a slice from its middle shows to be incompressible (media, ciphertext,
        # an archive) is sent as it is, without compressing all of it for nothing
        mid = (len(body) - SAMPLE_BYTES) // 2
        if len(_zstd(3, None).compress(body[mid : mid + SAMPLE_BYTES])) * 100 > SAMPLE_BYTES * 97:
            return Compression.NONE, body
    best = (Compression.NONE, body)
    small = len(body) <= SMALL_BODY
    if zstandard is not None:
        if small and zdict is not None:
            kind, s = dict_kind, _zstd(3, zdict).compress(body)
        else:
            kind, s = Compression.ZSTD, _zstd(19 if small else 3, None).compress(body)
        if len(s) < len(best[1]):
            best = (kind, s)
    # zlib only where zstd left a small body more than half its size, but not where zstd found
    # nothing at all to take out (random or already compressed: zlib finds nothing either, and
    # its level 9 costs more than the rest of sealing a 1 kB envelope)
    if zstandard is None or (small and len(best[1]) * 2 > len(body) and len(best[1]) * 100 < len(body) * 97):
        z = zlib.compress(body, 9 if small else 1)
        if len(z) < len(best[1]):
            best = (Compression.ZLIB, z)
    return best


def _raw_dict(ref: bytes) -> "zstandard.ZstdCompressionDict":
    return zstandard.ZstdCompressionDict(ref, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def _delta(body: bytes, ref: bytes) -> bytes:
    """body compressed with ref as zstd's dictionary (what changed since ref, in effect), in a
    frame without the magic number and the content size the receiver does without (DELTA2)."""
    # with the frame's checksum: a body decoded against another reference than it was made
    # against (a seq reused with another body: a store put back from a copy) is refused, not
    # delivered wrong
    params = zstandard.ZstdCompressionParameters.from_level(
        19,
        source_size=len(body),
        dict_size=len(ref),
        format=zstandard.FORMAT_ZSTD1_MAGICLESS,
        window_log=DELTA_WINDOW_LOG,
        write_checksum=1,
        write_content_size=0,
        write_dict_id=0,
    )
    return zstandard.ZstdCompressor(compression_params=params, dict_data=_raw_dict(ref)).compress(body)


EDITS_CHECK_BYTES = 4
EDITS_MERGE_GAP = 2  # an unchanged run this short goes inside the edit around it (an edit's heads cost 2 bytes)
# bodies (and references) over this go as zstd frames only: the edit script costs the sender
# time quadratic in them (over 64), and a report, where edits pay, is a few hundred bytes
EDITS_MAX_BODY = 1024
EDITS_KEY_LABEL = b"c2dtn edits check v1"


def _edits_check(key: bytes, body: bytes) -> bytes:
    """What edits carry of the body they make: keyed (HMAC-SHA256 under the bundle's key), so that
    nobody choosing bodies without the key can make two references give one check."""
    return hmac.digest(key, body, "sha256")[:EDITS_CHECK_BYTES]


def _edits(body: bytes, ref: bytes, key: bytes) -> bytes:
    """body as the edits of ref (Compression.EDITS, decision 0025): a check of body (4 bytes,
    _edits_check), then one CBOR array of items read in turn with a cursor in ref: an unsigned
    integer k copies the next k bytes of ref; a byte string is written in place of as many
    bytes of ref, or of n bytes if a negative integer -1-n follows it; what is left of ref
    after the last item follows.  A report differs from the last one in a few digits, which
    zstd frames in 35 bytes and this in about 20; the edit script is rapidfuzz's (Levenshtein)."""
    runs: list[list[int]] = []  # [ref start, ref end, body start, body end] of each change
    for op in Levenshtein.opcodes(ref, body):
        if op.tag == "equal":
            continue
        if runs and op.src_start - runs[-1][1] <= EDITS_MERGE_GAP:
            runs[-1][1], runs[-1][3] = op.src_end, op.dest_end
        else:
            runs.append([op.src_start, op.src_end, op.dest_start, op.dest_end])
    items: list[object] = []
    cur = 0
    for i1, i2, j1, j2 in runs:
        items += [i1 - cur, body[j1:j2]]
        if i2 - i1 != j2 - j1:
            items.append(-1 - (i2 - i1))
        cur = i2
    return _edits_check(key, body) + cbor2.dumps(items)


def _apply_edits(data: bytes, ref: bytes, key: bytes, limit: int = EDITS_MAX_BODY + REF_ID_BYTES) -> bytes:
    """The body that _edits wrote as `data` against ref, refused (Malformed) if its items are not
    as _edits writes them, reach past ref, make more than `limit` bytes (what a sender makes
    edits of, at most) or fail the check: made against another reference.  Linear in data,
    ref and the output."""
    if len(data) < EDITS_CHECK_BYTES:
        raise Malformed(f"edits of {len(data)} bytes, without their {EDITS_CHECK_BYTES}-byte check")
    if len(data) > limit:  # a sender writes edits only where they are smaller than the body itself
        raise Oversize(f"edits of {len(data)} bytes for a body of at most {limit}")
    try:
        items = strict_loads(data[EDITS_CHECK_BYTES:], max_depth=1, max_items=len(data))
    except StrictCBORError as e:
        raise Malformed(f"edits are not strict CBOR: {e}") from None
    if not isinstance(items, list):
        raise Malformed(f"edits are not an array: {short(items)}")
    out = bytearray()
    cur = i = n = 0
    while i < len(items):
        keep = items[i]
        new = items[i + 1] if i + 1 < len(items) else None
        if type(keep) is not int or keep < 0 or not isinstance(new, bytes):
            raise Malformed(f"edit {n} is not a count to copy and the bytes that follow: {short(items[i : i + 2])}")
        skip, i, n = len(new), i + 2, n + 1
        if i < len(items) and type(items[i]) is int and items[i] < 0:
            skip, i = -1 - items[i], i + 1
        if cur + keep + skip > len(ref):
            raise Malformed(f"edit reaches byte {cur + keep + skip} of a reference of {len(ref)}")
        if len(out) + keep + len(new) > limit:
            raise Malformed(f"edits make over the {limit} bytes a body of edits has: another reference")
        out += ref[cur : cur + keep]
        out += new
        cur += keep + skip
    if len(out) + len(ref) - cur > limit:  # (a longer reference than the sender's)
        raise Malformed(f"edits make over the {limit} bytes a body of edits has: another reference")
    out += ref[cur:]
    if not hmac.compare_digest(_edits_check(key, bytes(out)), data[:EDITS_CHECK_BYTES]):
        raise Malformed("edits do not make the body they were made for: another reference")
    return bytes(out)


def _check_delta_frame(data: bytes) -> None:
    """Refuse (Malformed) a DELTA2 frame that is not as _delta writes it: no content size, no
    dictionary id, not single-segment, a checksum, a window of at most 1 << DELTA_WINDOW_LOG, and
    nothing after it.  Hand-written, linear in the frame: python-zstandard ignores
    max_output_size for a frame that declares its size, and takes bytes after a frame."""
    if len(data) < 2:
        raise Malformed(f"delta frame of {len(data)} bytes")
    fhd, wd = data[0], data[1]
    if fhd & 0xFB != 0 or not fhd & 0x04:  # only the checksum flag may be (and must be) set
        raise Malformed(
            f"delta frame header {fhd:#04x}: a content size, dictionary id or single segment, or no checksum"
        )
    exp = 10 + (wd >> 3)
    if (1 << exp) + ((1 << exp) >> 3) * (wd & 7) > 1 << DELTA_WINDOW_LOG:
        raise Malformed(f"delta frame window descriptor {wd:#04x}: over {1 << DELTA_WINDOW_LOG} bytes")
    i = 2
    while True:
        if i + 3 > len(data):
            raise Malformed(f"delta frame cut short at byte {i} of {len(data)}")
        h = int.from_bytes(data[i : i + 3], "little")
        if (h >> 1) & 3 == 3:
            raise Malformed(f"delta frame with a reserved block type at byte {i}")
        i += 3 + (1 if (h >> 1) & 3 == 1 else h >> 3)  # an RLE block is one byte, others their size
        if h & 1:  # the last block
            break
    if i + 4 != len(data):  # its checksum ends it
        raise Malformed(f"delta frame of {i + 4} bytes in a body of {len(data)}: cut short or bytes after it")


def _unzstd(zdict) -> "zstandard.ZstdDecompressor":
    """One decompressor per dictionary (loading a dictionary costs more than a small body)."""
    key = ("d", id(zdict))
    d = _compressors.get(key)
    if d is None:
        d = _compressors[key] = zstandard.ZstdDecompressor(dict_data=zdict)
    return d


def _decompress(
    comp: int,
    data: bytes,
    zdicts: dict,
    budget: int = MAX_BODY_BYTES,
    ref: bytes | None = None,
    edits_key: bytes | None = None,
) -> bytes:
    """The plain body, refused (Oversize) past `budget` bytes (at most MAX_BODY_BYTES).  ref: the
    reference body of a delta (DELTAS); edits_key: what checks edits (Codec._edits_key)."""
    budget = min(budget, MAX_BODY_BYTES)
    if comp == Compression.NONE:
        if len(data) > budget:
            raise Oversize(f"body of {len(data)} bytes, over the {budget} this bundle may still open to")
        return data
    if budget <= 0:  # (zstandard reads a max_output_size of 0 as no limit at all)
        raise Oversize(f"compressed body where this bundle may still open to {max(budget, 0)} bytes")
    try:
        if comp == Compression.ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(data, budget)
            if d.unconsumed_tail:
                raise Oversize(f"body inflates beyond the {budget} bytes this bundle may still open to")
            return out
        if comp == Compression.EDITS:
            if ref is None or edits_key is None:
                raise Malformed("delta body without its reference")
            out = _apply_edits(data, ref, edits_key)  # (what it makes is checked, then weighed)
            if len(out) > budget:
                raise Oversize(f"body of {len(out)} bytes, over the {budget} this bundle may still open to")
            return out
        if comp == Compression.DELTA2 and zstandard:
            if ref is None:
                raise Malformed("delta body without its reference")
            _check_delta_frame(data)
            # no content size in the frame: the output is bounded by max_output_size (a delta's
            # body is never over DELTA_MAX_BODY), the window by what a delta's frame may use
            zd = zstandard.ZstdDecompressor(
                dict_data=_raw_dict(ref),
                format=zstandard.FORMAT_ZSTD1_MAGICLESS,
                max_window_size=1 << DELTA_WINDOW_LOG,
            )
            limit = min(budget, DELTA_MAX_BODY + REF_ID_BYTES)  # (the reference's id before the body)
            try:
                out = zd.decompress(data, max_output_size=limit)
            except zstandard.ZstdError as e:
                raise Malformed(
                    f"delta body does not decode to at most {limit} bytes against its reference: {e}"
                ) from None
            if len(out) > limit:
                raise Oversize(f"delta body of {len(out)} bytes, over the {limit} it may have here")
            return out
        if comp in (Compression.ZSTD, Compression.ZSTD_DICT, Compression.ZSTD_DICT2, Compression.DELTA) and zstandard:
            zdict = None
            if comp == Compression.DELTA:
                if ref is None:
                    raise Malformed("delta body without its reference")
            elif comp != Compression.ZSTD:
                zdict = zdicts.get(comp)
                if zdict is None:
                    raise Malformed(f"body needs dictionary {Compression(comp).name.lower()}, which this node lacks")
            # a frame that declares its size is decompressed into a buffer of that size at once
            # (max_output_size only bounds frames that do not): a forged size is refused first
            # (found by perf fuzz: a 20-byte body asked for gigabytes, MemoryError)
            declared = zstandard.frame_content_size(data)
            if declared > budget:
                raise Oversize(
                    f"body declares {declared} bytes decompressed, over the {budget} this bundle may still open to"
                )
            zd = zstandard.ZstdDecompressor(dict_data=_raw_dict(ref)) if ref is not None else _unzstd(zdict)
            out = zd.decompress(data, max_output_size=budget)
            if len(out) > budget:
                raise Oversize(f"body inflates beyond the {budget} bytes this bundle may still open to")
            return out
    except (zlib.error, getattr(zstandard, "ZstdError", zlib.error)) as e:
        raise Malformed(f"body does not decompress ({Compression(comp).name.lower()}): {e}") from None
    raise Malformed(f"unknown compression {short(comp)}")


@dataclass
class Codec:
    """Seals and opens envelopes for one node.

    keys: peer node id -> shared secret (bytes).  An envelope is sealed with the
    key of its destination and opened with the key of the bundle's sender.
    groups: group name -> the other members.  A group has a key of its own in
    `keys`, shared by all members: an envelope for the group is sealed with it, and
    a member opens an envelope from another member with the pair key or, failing
    that, with the key of a group both are in (and then only if the envelope names
    that group as its destination).
    zdict: optional zstd dictionary (e.g. trained on position reports); both
    ends must use the same one.
    """

    node: str
    keys: dict[str, bytes]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    zdict_bytes: bytes | None = field(default_factory=lambda: _builtin_v2(), repr=False)
    _zdict: Any = field(default=None, repr=False)
    _zdicts: dict = field(default_factory=dict, repr=False)  # compression kind -> dictionary, for reading
    _aeads: dict = field(default_factory=dict, repr=False)  # key name -> its AEAD
    # delta bodies (DELTA_*): what was sealed, by (destination, seq) -> (key, body, went as a delta,
    # meta, the sealing it first went in, went as a delta every time), until acked or let go; the
    # newest body of each (destination, key) acked; what came, by (source key, key)
    _sealed: dict = field(default_factory=dict, repr=False)
    _sealings: dict = field(default_factory=dict, repr=False)  # destination -> keyed bodies sealed for it
    # (destination, member: a group's, or the destination itself) -> the first sealing of the newest
    # envelope it took that went as a delta every time (an ack does not say which copy it took)
    _delta_acked: dict = field(default_factory=dict, repr=False)
    _acked: _Refs = field(default_factory=_Refs, repr=False)
    _open: dict = field(default_factory=dict, repr=False)  # (destination, key) -> its deltas not acked yet
    # (destination, key) -> the seqs of its newest bodies sealed, at most DELTA_KEEP_PER_KEY: a
    # reference older than most of them may be gone at the receiver, whatever the acks said
    _recent: dict = field(default_factory=dict, repr=False)
    _came: dict = field(default_factory=dict, repr=False)  # sender node -> _Refs (each its own budget)
    last_wire_body: int = field(default=0, repr=False)  # the size of the last body opened, as it travelled

    def __post_init__(self) -> None:
        if self.zdict_bytes and zstandard is not None:
            self._zdict = _dictionary(self.zdict_bytes)
            self._zdicts = {
                Compression.ZSTD_DICT: _dictionary(builtin_dictionary(1)),
                Compression.ZSTD_DICT2: self._zdict,
            }

    def _key(self, peer: str) -> bytes:
        try:
            return self.keys[peer]
        except KeyError:
            raise UnknownPeer(f"no key shared with node {short(peer)}") from None

    def _edits_key(self, name: str) -> bytes:
        """What checks edits sealed with the key shared with `name` (a peer or a group)."""
        k = self._aeads.get(("edits", name))
        if k is None:
            k = self._aeads[("edits", name)] = _subkey(self._key(name), EDITS_KEY_LABEL)
        return k

    def _aead(self, name: str) -> AESGCMSIV:
        """The AEAD of the key shared with `name` (a peer or a group), made once."""
        a = self._aeads.get(name)
        if a is None:
            a = self._aeads[name] = AESGCMSIV(_subkey(self._key(name), AEAD_KEY_LABEL))
        return a

    # -- sealing --------------------------------------------------------
    def bundle(
        self, envs: list[Envelope], dst: str | None = None, stamp: Stamp = NO_STAMP, delta: bool = False
    ) -> bytes:
        """A bundle payload of these envelopes (map_bytes, then container()), for `dst` (default:
        the first envelope's destination); tests and tools."""
        if dst is None and envs:
            dst = envs[0].dst
        maps, after = [], None
        for e in envs:
            maps.append(self.map_bytes(e, delta, stamp, after))
            after = (e.seq, e.sn) if e.kind == Kind.DATA else after
        return self.container(maps, dst, stamp)

    @staticmethod
    def first_map(mb: bytes, env: Envelope) -> bytes:
        """A map written to follow another (map_bytes' `after`) made to stand first in a bundle:
        its seq and send number written out."""
        m = cbor2.loads(mb)
        m[K_SEQ] = env.seq
        if env.sn is not None:
            m[K_SN] = env.sn
        return cbor2.dumps(m)

    @staticmethod
    def restamp(mb: bytes, env: Envelope, stamp: Stamp) -> bytes:
        """A data envelope's map (map_bytes, in any bundle) made to stand first in a bundle with
        another stamp: its seq and send number written out, its creation time from the new base
        second, its incarnation said where the stamp's differs.  Its body is as it was sealed (a
        delta keeps its reference): the same envelope, sent again (Scheduler._copies)."""
        _check_stamp(stamp)
        m = cbor2.loads(mb)
        m[K_SEQ] = env.seq
        if env.sn is not None:
            m[K_SN] = env.sn
        m[K_CREATED] = env.created_ms - stamp[0] * 1000
        if env.inc != stamp[1]:
            m[K_INC] = env.inc
        else:
            m.pop(K_INC, None)
        return cbor2.dumps(m)

    def acked(self, dst: str, seqs: Iterable[int]) -> None:
        """`dst` holds these (a group: every member does): their bodies may be references for
        what follows."""
        for seq in seqs:
            got = self._sealed.pop((dst, seq), None)
            if got is not None:
                if got[5] and dst not in self.groups:  # (a group's members are counted as each acks: took)
                    self._delta_acked[(dst, dst)] = max(self._delta_acked.get((dst, dst), 0), got[4])
                waiting = self._open.get((dst, got[0]))
                if waiting:
                    waiting[:] = [q for q in waiting if q > seq]
                    if not waiting:
                        del self._open[(dst, got[0])]
                newest = self._acked.newest((dst, got[0]))
                if newest is None or newest[0] < seq:
                    self._acked.put((dst, got[0]), seq, got[1], keep=1, meta=got[3])

    def took(self, group: str, member: str, seqs: Iterable[int]) -> None:
        """`member` of `group` holds these (its first ack of each: "got" or "done")."""
        if member not in self._members(group):
            return
        for seq in seqs:
            got = self._sealed.get((group, seq))
            if got is not None and got[5]:
                self._delta_acked[(group, member)] = max(self._delta_acked.get((group, member), 0), got[4])

    def references_held(self, dst: str, seq: int) -> bool:
        """Did dst take a delta first sealed after this envelope first went (one that went as a
        delta every time: an ack does not say which copy it took)?  Then it held its references
        when that one arrived, and a resend of this one may go as a delta too; one that lost
        them (a restart: they live in memory) refuses deltas unacked and cannot say so, so until
        then resends go whole.  A group: a member took one, and each other member one first
        sealed no more than DELTA_GROUP_LAG before it.  The proof is per destination, not per
        key (decision 0040)."""
        got = self._sealed.get((dst, seq))
        if got is None:
            return False
        marks = [self._delta_acked.get((dst, m), 0) for m in self._members(dst)]
        if dst in self.groups:
            return max(marks) > got[4] and min(marks) > got[4] - DELTA_GROUP_LAG
        return marks[0] > got[4]

    def _members(self, dst: str) -> list[str]:
        """Who must hold a reference for dst: a group's members but this node, or dst itself."""
        return [m for m in self.groups[dst] if m != self.node] if dst in self.groups else [dst]

    def lost(self, dst: str, seqs: Iterable[int]) -> None:
        """These did not arrive (an ack showed it, or a timeout): no longer awaited as deltas
        (a copy goes whole unless references_held)."""
        for seq in seqs:
            got = self._sealed.get((dst, seq))
            if got is None or not got[2]:
                continue
            waiting = self._open.get((dst, got[0]))
            if waiting and seq in waiting:
                waiting.remove(seq)
                if not waiting:
                    del self._open[(dst, got[0])]

    def map_bytes(
        self, env: Envelope, delta: bool = False, stamp: Stamp = NO_STAMP, after: Chain | None = None
    ) -> bytes:
        """The envelope's map as it is sealed (module doc).  after: the (seq, send number) of the
        data envelope before it in the bundle, if any: a seq or send number one on from it is
        left out (decision 0026)."""
        _check_stamp(stamp)
        if after is not None and after[1] is not None and env.kind == Kind.DATA and env.sn is None:
            raise ValueError(f"envelope {env.seq} without a send number after one with: it would read as the next")
        if env.origin != self.node:
            raise ValueError(f"envelope of origin {env.origin!r} sealed by {self.node!r}: only its origin seals it")
        ref, key = None, None
        if (
            env.kind == Kind.DATA
            and env.supersede is not None
            and len(env.body) <= DELTA_MAX_BODY
            and zstandard is not None
        ):
            key = received_key(env.supersede)
            # a few deltas of a key at a time: while DELTA_OPEN_MAX are not acked, the next goes
            # whole (a receiver that lost its references refuses deltas and cannot say so; a
            # whole one it acks is the reference from then on)
            open_ = len(self._open.get((env.dst, key), ()))
            newest = self._acked.newest((env.dst, key)) if delta and open_ < DELTA_OPEN_MAX else None
            # ... and against a body the receivers still keep by their own rule (the newest
            # DELTA_KEEP_PER_KEY of a key): a group's last "done" can come after many newer
            # bodies, late or on purpose, and then no member holds the body any more
            recent = self._recent.get((env.dst, key), ())
            if (
                newest is not None
                and newest[0] < env.seq
                and sum(1 for q in recent if q > newest[0]) <= DELTA_KEEP_PER_KEY - DELTA_OPEN_MAX
            ):
                ref = newest
        # an ack's body travels plain: a receiver decodes it before anything else, so it must cost
        # what it weighs on the wire (a compressed ack could inflate to megabytes of CBOR)
        comp, wire_body = (Compression.NONE, env.body) if env.kind == Kind.ACK else _compress(env.body, self._zdict)
        meta: Meta = (env.lifetime_ms, int(env.priority), env.app)
        if ref is not None and key is not None and len(env.body) >= 48:
            rid = _ref_id(key, ref[1][1])
            d = _delta(rid + env.body, rid + ref[1][0])
            kind = Compression.DELTA2
            if max(len(env.body), len(ref[1][0])) <= EDITS_MAX_BODY:
                e = _edits(rid + env.body, rid + ref[1][0], self._edits_key(env.dst))
                if len(e) <= len(d):
                    kind, d = Compression.EDITS, e
            if len(d) + 4 < len(wire_body):  # (K_REF costs a few bytes)
                comp, wire_body = kind, d
        if key is not None:  # kept until acked (a reference then) or lost (acked, lost)
            if len(self._sealed) >= DELTA_PENDING_MAX:
                del self._sealed[next(iter(self._sealed))]
            if len(self._open) >= DELTA_PENDING_MAX:
                del self._open[next(iter(self._open))]
            mark = self._sealings[env.dst] = self._sealings.get(env.dst, 0) + 1
            first = self._sealed.get((env.dst, env.seq))
            every = comp in DELTAS and (first is None or first[5])
            self._sealed[(env.dst, env.seq)] = (key, env.body, comp in DELTAS, meta, first[4] if first else mark, every)
            recent = self._recent.pop((env.dst, key), [])  # (re-inserted: the oldest key goes first)
            if env.seq not in recent:
                recent = sorted(recent + [env.seq])[-DELTA_KEEP_PER_KEY:]
            self._recent[(env.dst, key)] = recent
            if len(self._recent) > DELTA_PENDING_MAX:
                del self._recent[next(iter(self._recent))]
            if comp in DELTAS:
                waiting = self._open.setdefault((env.dst, key), [])
                if env.seq not in waiting:
                    waiting.append(env.seq)
        # the origin is the container's sender; what is left out is the default (_from_map), or
        # in a delta its reference's (decision 0022)
        like = ref[1][1] if comp in DELTAS and ref is not None else NOT_A_DELTA
        chained = after is not None and env.kind == Kind.DATA
        m: dict[int, object] = {}
        if not chained or env.seq != after[0] + 1:  # type: ignore[index]
            m[K_SEQ] = env.seq
        m[K_CREATED] = env.created_ms - stamp[0] * 1000
        if env.kind != Kind.DATA:
            m[K_KIND] = int(env.kind)
        if env.lifetime_ms == like[0]:
            pass
        elif env.lifetime_ms % 1000:
            m[K_LIFETIME] = env.lifetime_ms
        else:
            m[K_LIFETIME_S] = env.lifetime_ms // 1000
        if env.priority != like[1]:
            m[K_PRIORITY] = int(env.priority)
        m[K_BODY] = wire_body
        if comp not in (Compression.NONE, Compression.EDITS):  # (a map with K_REF and none is EDITS)
            m[K_COMPRESSION] = int(comp)
        if comp in DELTAS and ref is not None:
            m[K_REF] = env.seq - ref[0]
        elif env.supersede is not None:
            m[K_SUPERSEDE] = wire_key(env.supersede)
        if env.app != like[2]:
            m[K_APP] = APP_CODES.get(env.app, env.app)
        if env.cseq:
            m[K_CSEQ] = env.cseq
        if env.floor and env.floor <= env.cseq:
            m[K_FLOOR_BACK] = env.cseq - env.floor
        elif env.floor:
            m[K_FLOOR] = env.floor
        if env.inc != stamp[1]:
            m[K_INC] = env.inc
        if env.sn is not None:
            if not 0 <= env.sn < SN_MOD:
                raise ValueError(f"send number {env.sn} is not 0 to {SN_MOD - 1}")
            if not (chained and after[1] is not None and env.sn == (after[1] + 1) % SN_MOD):  # type: ignore[index]
                m[K_SN] = env.sn
        return cbor2.dumps(m)

    def container(self, maps: list[bytes], dst: str | None = None, stamp: Stamp = NO_STAMP) -> bytes:
        """One bundle payload holding envelopes' maps (map_bytes), all for `dst` (default: the one
        peer this codec has a pair key for), under one seal with `stamp`; for a group, with an
        origin tag for each other member (module doc)."""
        if len(maps) > MAX_ENVELOPES_PER_BUNDLE:
            raise ValueError(f"{len(maps)} envelopes in one bundle: at most {MAX_ENVELOPES_PER_BUNDLE}")
        # the maps are embedded as they are: an array header followed by n encoded items is a
        # valid CBOR array, so nothing is encoded again
        return self.container_of(_array_header(len(maps)) + b"".join(maps), dst, stamp)

    def container_of(self, plain: bytes, dst: str | None = None, stamp: Stamp = NO_STAMP) -> bytes:
        """A bundle payload whose seal holds `plain` as it is (container(); tests and fuzzing seal
        what container() would never write)."""
        _check_stamp(stamp)
        if dst is None:
            peers = [n for n in self.keys if n not in self.groups]
            if len(peers) != 1:
                raise ValueError(f"a container needs its destination ({len(peers)} peers to choose from)")
            dst = peers[0]
        seal = self._aead(dst).encrypt(_nonce(self.node, dst), plain, _aad(stamp))
        body = (
            cbor2.dumps(CONTAINER_VERSION)
            + cbor2.dumps(self.node)
            + cbor2.dumps(dst)
            + cbor2.dumps(stamp[0])
            + cbor2.dumps(stamp[1])
            + cbor2.dumps(seal)
        )
        if dst not in self.groups:
            return _array_header(6) + body
        tags = [self._origin_tag(m, self.node, dst, _seal_digest(seal), stamp) for m in sorted(self.groups[dst])]
        return _array_header(7) + body + cbor2.dumps(tags)

    def _origin_tag(self, peer: str, sender: str, group: str, covered: bytes, stamp: Stamp) -> bytes:
        # the stamp too: the seal binds it already, this does not lean on how
        msg = ORIGIN_CONTEXT + sender.encode() + b"\0" + group.encode() + b"\0" + _stamp_bytes(stamp) + covered
        return hmac.digest(self._key(peer), msg, "sha256")[:ORIGIN_TAG_BYTES]

    # -- opening ---------------------------------------------------------
    def open_container(self, payload: bytes) -> "Container":
        """Split a bundle payload (split_container) and check it is for this node: sent by a node,
        not a group, to this node or a group it is in."""
        sender, dst, seal, tags, stamp = split_container(payload)
        if sender in self.groups:  # its key is every member's: a bundle "from" it proves nothing
            raise UnknownPeer(f"sender {sender!r} is a group, not a node")
        if dst != self.node and dst not in self.groups:
            raise Misrouted(f"bundle for {dst!r} reached {self.node!r}")
        return Container(sender, seal, tags, dst=dst, stamp=stamp)

    def check_origin(self, c: "Container", group: str) -> None:
        """Raise BadTag unless `c` holds an origin tag for this node that the pair key
        shared with its sender proves (the sender sealed the group's envelopes in it)."""
        if c.origin_tags is None:
            raise BadTag(f"bundle for group {group!r} from {short(c.sender)} without origin tags")
        members = sorted((set(self.groups[group]) | {self.node}) - {c.sender})
        if len(c.origin_tags) != len(members):
            raise BadTag(
                f"{len(c.origin_tags)} origin tags for group {group!r} from {short(c.sender)}, expected "
                f"{len(members)} (one per member but the sender): do the members' [groups] differ?"
            )
        want = self._origin_tag(c.sender, c.sender, group, _seal_digest(c.seal), c.stamp)
        if not hmac.compare_digest(want, c.origin_tags[members.index(self.node)]):
            raise BadTag(
                f"origin tag for {self.node!r} does not match the key shared with {short(c.sender)}: "
                f"envelopes for group {group!r} that {short(c.sender)} did not seal"
            )

    def open_items(self, c: "Container") -> list:
        """The maps of a bundle's envelopes: its seal opened with the key of its destination (this
        node, whose pair key with the sender it is, or a group of both, once the origin tag for
        this node proves the sender: check_origin), then decoded as one strict CBOR array.
        Anything wrong refuses the whole bundle (open() then takes each map)."""
        sender, dst = c.sender, c.dst
        if dst in self.groups:
            if sender not in self.groups[dst]:
                raise BadTag(f"{short(sender)} is not a member of group {dst!r}")
            self.check_origin(c, dst)
            keyname = dst
        elif dst == self.node:
            keyname = sender
        else:
            raise Misrouted(f"bundle for {dst!r} reached {self.node!r}")
        try:
            plain = self._aead(keyname).decrypt(_nonce(sender, dst), c.seal, _aad(c.stamp))
        except InvalidTag:
            raise BadTag(
                f"authentication tag does not match the key of {short(keyname)}"
                + (" (the group's)" if keyname != sender else "")
            ) from None
        n, at = _array_count(plain)
        if n > MAX_ENVELOPES_PER_BUNDLE:
            raise Oversize(f"{n} envelopes in one bundle exceeds {MAX_ENVELOPES_PER_BUNDLE}")
        if n == 0:
            raise Malformed("a seal of no envelopes")
        # one walk over the maps (flat, strict) for where each starts; each is decoded on its
        # own when it is opened, so a bundle never holds more than one map decoded at a time
        ends: list[int] = []
        try:
            strict_check(plain[at:], max_depth=1, sequence=True, max_items=n * (1 + 2 * MAP_ENTRIES_MAX), ends=ends)
        except StrictCBORError as e:
            raise Malformed(f"sealed envelopes are not a strict CBOR array of flat items: {e}") from None
        if len(ends) - 1 != n:
            raise Malformed(f"sealed envelopes: an array of {n} holding {len(ends) - 1} items")
        return [plain[at + a : at + b] for a, b in zip(ends, ends[1:])]

    def open(self, c: "Container", mb: bytes) -> Envelope:
        """One envelope of `c` from its map's bytes (open_items), in the bundle's order: decoded and
        checked, its body decompressed within what the bundle may still open to."""
        prev, c.after = c.after, BROKEN  # (what a map refused before its seq is known leaves)
        if len(mb) > MAX_ENVELOPE_BYTES:
            raise Oversize(f"envelope of {len(mb)} bytes exceeds {MAX_ENVELOPE_BYTES}")
        try:
            m = strict_loads(mb, max_depth=1, max_items=1 + 2 * MAP_ENTRIES_MAX)
        except StrictCBORError as e:
            raise Malformed(f"envelope map is not strict CBOR: {e}") from None
        env = self._from_map(m, c.sender, c.dst, c.plain_left, c.stamp, prev, c)
        c.plain_left -= len(env.body)
        return env

    def open_bundle(self, payload: bytes) -> list[Envelope]:
        """Every envelope of a bundle payload, or the first error (tests and tools; the node
        refuses envelopes one by one)."""
        c = self.open_container(payload)
        return [self.open(c, m) for m in self.open_items(c)]

    def _from_map(
        self,
        m: object,
        sender: str,
        dst: str,
        budget: int = MAX_BODY_BYTES,
        stamp: Stamp = NO_STAMP,
        after: "Chain | None | object" = None,
        c: "Container | None" = None,
    ) -> Envelope:
        if not isinstance(m, dict):
            raise Malformed(f"envelope is not a map: {short(m)}")
        old = [k for k in RETIRED_KEYS if k in m]
        if old:
            raise BadVersion(f"envelope map has key {old[0]}, retired in container version {CONTAINER_VERSION}")
        for a, b, what in ((K_LIFETIME, K_LIFETIME_S, "lifetime"), (K_FLOOR, K_FLOOR_BACK, "floor")):
            if a in m and b in m:
                raise Malformed(f"envelope has its {what} twice (keys {a} and {b})")

        def get(k: int, typ: type | tuple, name: str, default=...):
            if k not in m:
                if default is ...:
                    raise Malformed(f"envelope lacks {name}")
                return default
            v = m[k]
            if not isinstance(v, typ) or isinstance(v, bool):
                raise Malformed(f"envelope {name} has the wrong type: {short(v)}")
            return v

        kind = get(K_KIND, int, "kind", int(Kind.DATA))
        if kind not in (Kind.DATA, Kind.ACK):
            raise Malformed(f"unknown envelope kind {short(kind)}")

        def bounded(k: int, name: str, hi: int, default=...) -> int:
            v = get(k, int, name, default)
            if not 0 <= v <= hi:
                raise Malformed(f"envelope {name} {short(v)} (key {k}) is out of range (0 to {hi})")
            return v

        if kind == Kind.ACK and c is not None:
            c.after = after  # (an ack is outside the data envelopes' chain)
        # every integer within what a store keeps (64-bit) and a sum of two of them too; a data
        # envelope's seq and send number left out are one on from the one before it (decision 0026)
        chain = after if kind == Kind.DATA else None
        if K_SEQ in m or chain is None:
            seq = bounded(K_SEQ, "seq", MAX_SEQ)
        elif chain is BROKEN:
            raise Malformed("envelope without its seq after one that was refused")
        else:
            seq = chain[0] + 1  # type: ignore[index]
            if seq > MAX_SEQ:
                raise Malformed(f"envelope seq {seq}, one on from the one before it, is over {MAX_SEQ}")
        if K_SN in m:
            sn = bounded(K_SN, "send number", SN_MOD - 1, None)
        elif chain is BROKEN:
            raise Malformed("envelope without its send number after one that was refused")
        elif chain is not None and chain[1] is not None:  # type: ignore[index]
            sn = (chain[1] + 1) % SN_MOD  # type: ignore[index]
        else:
            sn = None
        if kind == Kind.DATA and c is not None:
            c.after = (seq, sn)
        # the creation time: milliseconds from the stamp's base second (before it, for a copy of an
        # old envelope), and within what a store keeps once added
        off = get(K_CREATED, int, "creation time")
        created = stamp[0] * 1000 + off
        if not -MAX_TIME_MS <= off <= MAX_TIME_MS or not 0 <= created <= MAX_TIME_MS:
            raise Malformed(
                f"envelope creation time {short(off)} ms from base second {stamp[0]} (key {K_CREATED}) "
                f"is out of range (0 to {MAX_TIME_MS} ms since 1970)"
            )
        inc = bounded(K_INC, "incarnation", (1 << INC_BITS) - 1, stamp[1])
        comp = get(K_COMPRESSION, int, "compression", Compression.EDITS if K_REF in m else Compression.NONE)
        if kind == Kind.ACK and comp != Compression.NONE:
            raise Malformed(f"ack body compressed ({short(comp)}): acks travel plain")
        key = m.get(K_SUPERSEDE)
        if isinstance(key, bytes) and len(key) == KEY_DIGEST_BYTES:
            key = "#" + base64.urlsafe_b64encode(key).decode()
        elif key is not None and not (isinstance(key, str) and len(key.encode()) <= KEY_DIGEST_BYTES):
            # (a longer key travels as its digest: wire_key; a long text key could pose as one)
            raise Malformed(
                f"supersession key is neither text of up to {KEY_DIGEST_BYTES} bytes nor a "
                f"{KEY_DIGEST_BYTES}-byte digest: {short(key)}"
            )
        # references per (source, destination, key): a group's stream of a key is not its pair's;
        # a delta's key, and what it leaves out, are its reference's (decision 0022)
        stream = (source_key(sender, inc), dst)
        ref, refs, like = None, self._came.get(sender), NOT_A_DELTA
        if comp in DELTAS:
            back = get(K_REF, int, "reference", None)
            if back is None:
                raise Malformed(f"delta body without its reference (key {K_REF})")
            if key is not None:
                raise Malformed("delta body with a supersession key: it is its reference's")
            if not 1 <= back <= seq:
                raise Malformed(f"delta reference {back} seqs back from seq {seq}: it must be 1 to {seq}")
            r = seq - back
            came = refs.key_at(stream, r) if refs is not None else None
            held = refs.get(came, r) if refs is not None and came is not None else None
            if came is None or held is None:
                raise NoReference(f"body compressed against envelope {r} of its key, which this node does not hold")
            key, like = came[-1], held[1]
            rid = _ref_id(key, like)
            ref = rid + held[0]
        elif K_REF in m:
            raise Malformed(f"reference {short(m[K_REF])} for a body that is not a delta")
        came = stream + (key,) if key is not None else None
        if K_LIFETIME_S in m:
            lifetime = bounded(K_LIFETIME_S, "lifetime in s", MAX_LIFETIME_S) * 1000
        elif K_LIFETIME in m or like[0] is None:
            lifetime = bounded(K_LIFETIME, "lifetime", MAX_LIFETIME_S * 1000)
        else:
            lifetime = like[0]
        prio = get(K_PRIORITY, int, "priority", like[1])
        if prio not in tuple(Priority):
            raise Malformed(f"envelope priority {short(prio)} is not 0 to 3")
        cseq = bounded(K_CSEQ, "cseq", MAX_SEQ, 0)
        if K_FLOOR_BACK in m:
            floor = cseq - bounded(K_FLOOR_BACK, "floor back from cseq", cseq)
        else:
            floor = bounded(K_FLOOR, "floor", MAX_SEQ, 0)
        app = m.get(K_APP, like[2])
        if isinstance(app, int) and not isinstance(app, bool):
            if app not in APP_NAMES:
                raise Malformed(f"unknown app code {short(app)}")
            app = APP_NAMES[app]
        elif not isinstance(app, str):
            raise Malformed(f"envelope app has the wrong type: {short(app)}")
        elif len(app.encode()) > APP_MAX_BYTES:
            raise Malformed(f"envelope app {short(app)} is over {APP_MAX_BYTES} bytes")
        wire = get(K_BODY, bytes, "body", b"")
        self.last_wire_body = len(wire)
        try:
            ek = self._edits_key(dst if dst in self.groups else sender) if comp == Compression.EDITS else None
            body = _decompress(comp, wire, self._zdicts, budget + (REF_ID_BYTES if ref is not None else 0), ref, ek)
        except Malformed as e:
            if ref is None:
                raise
            # the frame's checksum: made against another body or envelope than the one held as r
            raise NoReference(f"body does not decode against envelope {r} of its key as held here: {e}") from None
        if ref is not None:
            if body[:REF_ID_BYTES] != rid:
                raise NoReference(f"body made against another envelope {r} than the one held here")
            body = body[REF_ID_BYTES:]
        if kind == Kind.DATA and came is not None and len(body) <= DELTA_MAX_BODY:
            if refs is None:
                refs = self._came[sender] = _Refs()
            if ref is not None:
                refs.drop_below(came, r)  # the sender refers to nothing older of this key
            refs.put(came, seq, body, keep=DELTA_KEEP_PER_KEY, meta=(lifetime, prio, app))
        return Envelope(
            kind=Kind(kind),
            origin=sender,
            seq=seq,
            dst=dst,
            created_ms=created,
            lifetime_ms=lifetime,
            priority=Priority(prio),
            supersede=key,
            body=body,
            app=app,
            cseq=cseq,
            floor=floor,
            compression=Compression(comp),
            inc=inc,
            sn=sn,
        )


@dataclass
class Container:
    """A bundle payload split by Codec.open_container (shape checked, nothing opened)."""

    sender: str
    seal: bytes  # ciphertext | tag (Codec.open_items)
    origin_tags: list[bytes] | None = None  # group bundles: one per member but the sender
    dst: str = ""  # this node, or a group it is in
    plain_left: int = MAX_BUNDLE_PLAIN_BYTES  # plain body bytes its envelopes may still open to
    stamp: Stamp = NO_STAMP  # its base second and incarnation (every envelope's associated data)
    # (seq, send number) of the last data envelope opened, or BROKEN after a map refused before
    # its seq was known: what a map leaving them out follows (decision 0026)
    after: "Chain | None | object" = None


_dicts: dict[bytes, object] = {}


def _dictionary(raw: bytes):
    """One loaded dictionary per content (the compressor caches key on the object)."""
    d = _dicts.get(raw)
    if d is None:
        d = _dicts[raw] = zstandard.ZstdCompressionDict(raw)
    return d


@functools.cache
def builtin_dictionary(version: int = 2) -> bytes:
    """A zstd dictionary for position reports that ships with c2dtn (perf/train_dict.py)."""
    name = "position-reports.zdict" if version == 1 else f"position-reports-v{version}.zdict"
    return resources.files("c2dtn.overlay").joinpath("data", name).read_bytes()


def split_container(payload: bytes) -> tuple[str, str, bytes, list[bytes] | None, Stamp]:
    """(sender, destination, seal, origin tags or None, stamp) of a bundle payload, checked for
    shape alone, in the strict CBOR subset (what a relay reads too)."""
    if len(payload) > MAX_CONTAINER_BYTES:
        raise Oversize(f"bundle payload of {len(payload)} bytes exceeds {MAX_CONTAINER_BYTES}")
    if payload[:1] in (b"\x86", b"\x87") and len(payload) > 1 and payload[1] < 24 and payload[1] != CONTAINER_VERSION:
        # another version's container (its shape need not pass this one's checks): said as such
        raise BadVersion(f"container version {payload[1]}, this node speaks {CONTAINER_VERSION}")
    try:
        obj = strict_loads(payload, max_depth=2, max_items=CONTAINER_ITEMS_MAX)
    except StrictCBORError as e:
        raise Malformed(f"bundle payload is not strict CBOR: {e}") from None
    if not isinstance(obj, list) or not obj:
        raise Malformed(f"bundle payload is not an array: {short(obj)}")
    if type(obj[0]) is not int or obj[0] != CONTAINER_VERSION:  # (4.0 and True are not 4)
        raise BadVersion(f"container version {short(obj[0])}, this node speaks {CONTAINER_VERSION}")
    if len(obj) not in (6, 7):
        raise Malformed(f"bundle payload is not a 6- or 7-item array: {short(obj)}")
    _, sender, dst, base, inc, seal = obj[:6]
    for what, name in (("sender", sender), ("destination", dst)):
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise Malformed(f"{what} is not a node id: {short(name)}")
    for what, v, hi in (("base second", base, MAX_BASE_S), ("incarnation", inc, (1 << INC_BITS) - 1)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= hi:
            raise Malformed(f"container {what} {short(v)} is not an integer from 0 to {hi}")
    if not isinstance(seal, bytes) or len(seal) <= TAG_BYTES:
        raise Malformed(f"seal is not a byte string of ciphertext and a {TAG_BYTES}-byte tag: {short(seal)}")
    tags = obj[6] if len(obj) == 7 else None
    if tags is not None and (
        not isinstance(tags, list)
        or len(tags) > MAX_GROUP_MEMBERS
        or not all(isinstance(t, bytes) and len(t) == ORIGIN_TAG_BYTES for t in tags)
    ):
        raise Malformed(
            f"origin tags are not up to {MAX_GROUP_MEMBERS} byte strings of {ORIGIN_TAG_BYTES}: {short(tags)}"
        )
    return sender, dst, seal, tags, (base, inc)


def _check_stamp(stamp: Stamp) -> None:
    if not (0 <= stamp[0] <= MAX_BASE_S and 0 <= stamp[1] < 1 << INC_BITS):
        raise ValueError(f"stamp {stamp!r}: base second 0 to {MAX_BASE_S}, incarnation 0 to {(1 << INC_BITS) - 1}")


def _stamp_bytes(stamp: Stamp) -> bytes:
    return stamp[0].to_bytes(8, "big") + stamp[1].to_bytes(4, "big")


def _aad(stamp: Stamp) -> bytes:
    """The AEAD's associated data: the context and the container's stamp, fixed-width."""
    return ENVELOPE_CONTEXT + _stamp_bytes(stamp)


def _subkey(secret: bytes, label: bytes) -> bytes:
    """A 32-byte key for one use of a configured secret (HMAC as a KDF, as HKDF-Expand's one block)."""
    return hmac.digest(secret, label, "sha256")


@functools.lru_cache(maxsize=1024)
def _nonce(sender: str, dst: str) -> bytes:
    """The AEAD nonce of a direction (module doc: AES-GCM-SIV needs it unique for nothing)."""
    return hashlib.sha256(NONCE_CONTEXT + sender.encode() + b"\0" + dst.encode()).digest()[:12]


def _seal_digest(seal: bytes) -> bytes:
    """What an origin tag covers of a bundle's envelopes (its seal as sent)."""
    return hashlib.sha256(seal).digest()[:TAG_BYTES]


def _array_count(data: bytes) -> tuple[int, int]:
    """(items, head length) of the definite-length CBOR array `data` starts with (Malformed if
    it does not): read before anything is decoded, so a count over the bound costs nothing."""
    if not data or data[0] >> 5 != 4 or data[0] & 31 > 27:
        raise Malformed(f"sealed envelopes are not an array: {short(data)}")
    ai = data[0] & 31
    if ai < 24:
        return ai, 1
    w = 1 << (ai - 24)
    if len(data) < 1 + w:
        raise Malformed("sealed envelopes: the array's head is cut short")
    return int.from_bytes(data[1 : 1 + w], "big"), 1 + w


def _array_header(n: int) -> bytes:
    """CBOR major type 4 header for n items (RFC 8949 §3.1); cbor2 has no raw-item API."""
    if n < 24:
        return bytes([0x80 | n])
    if n < 1 << 8:
        return bytes([0x98, n])
    if n < 1 << 16:
        return bytes([0x99]) + n.to_bytes(2, "big")
    return bytes([0x9A]) + n.to_bytes(4, "big")


# -- acks ------------------------------------------------------------------
def _runs(seqs: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for s in sorted(set(seqs)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return runs


def wire_key(key: str) -> str | bytes:
    """A supersession key as it travels: the receiver only compares keys, so one longer than
    KEY_DIGEST_BYTES bytes goes as its 72-bit BLAKE2b digest (an MQTT topic key,
    'mqtt:/DEU/DEU-UNIT001/DEU-S001/location', costs 10 bytes instead of 41), which the
    receiver reads as '#' and 12 base64 characters (what received_key gives)."""
    if len(key.encode()) <= KEY_DIGEST_BYTES:
        return key
    return hashlib.blake2b(key.encode(), digest_size=KEY_DIGEST_BYTES).digest()


def received_key(key: str) -> str:
    """The supersession key a receiver sees for `key` as its sender submitted it."""
    w = wire_key(key)
    return w if isinstance(w, str) else "#" + base64.urlsafe_b64encode(w).decode()


def encode_ack_body(
    acks: dict[str, tuple[list[int], list[int]]],
    holds: dict[str, int] | None = None,
    heard: dict[str, int] | None = None,
) -> bytes:
    """An ack: [[node, incarnation, done runs, got runs(, hold(, heard))], ...], an entry per source, each
    run [first, last], so one ack covers many ids; each origin reads the entry of its own node
    and store's incarnation (source_key), so an ack for a lost store's ids never releases a new
    store's.  One ack envelope answers every origin of a group, in the group's bundle.  (Until
    decision 0017 a map keyed by the source key's text, the holds in a second map keyed the
    same way: about twice the bytes.)

    done: taken by the destination's application (the origin releases custody);
    got: held at the destination, not yet taken (the origin stops retransmitting).
    hold: how long (ms) the newest envelope the entry acks waited here before this ack went
    (QUIC's ACK Delay), so the origin's round-trip samples leave it out (null: not said).
    heard: an ack-only bundle of the origin announced a send number as its next, where one
    before it has not come here (lost on the way: the origin resends what it sent before that
    announcement and this destination lacks; decision 0041).  It names the announcement: the
    number plus SN_MOD times its creation time in ms modulo HEARD_ECHO_MS (`heard_of`)."""
    out = []
    for src, (d, g) in acks.items():
        node, _, inc = src.partition("/")
        entry: list = [node, int(inc, 16) if inc else 0, _runs(d), _runs(list(g))]
        hold = max(0, min(MAX_ACK_HOLD_MS, int(holds[src]))) if holds and src in holds else None
        if heard and src in heard:
            entry += [hold, heard[src] % (SN_MOD * HEARD_ECHO_MS)]
        elif hold is not None:
            entry.append(hold)
        out.append(entry)
    return cbor2.dumps(out)


Runs = list[tuple[int, int]]
MAX_SEQ = (1 << 63) - 1
MAX_ACK_HOLD_MS = 3600_000


@dataclass(frozen=True)
class AckBody:
    """A decoded ack, as one origin reads it: the sources it answers, and the runs of the one
    asked for (not expanded: a run of a billion ids is two integers here too)."""

    sources: frozenset[str]
    done: Runs
    got: Runs
    found: bool  # the body has an entry for the source asked for
    hold_ms: int | None = None  # how long the newest envelope acked waited before the ack went
    heard: int | None = None  # an announcement answered: its send number and time (encode_ack_body)


def decode_ack_body(body: bytes, source: str) -> AckBody:
    """Read an ack body for one origin (`source`, its source key).  The other origins' entries
    are checked only for their names' types: time and memory stay linear in the body's size."""
    try:
        obj = strict_loads(body, max_depth=4)
    except StrictCBORError as e:
        raise Malformed(f"ack body is not strict CBOR: {e}") from None
    if not isinstance(obj, list):
        raise Malformed(f"ack body is not an array of [node, incarnation, done runs, got runs]: {short(obj)}")
    sources: set[str] = set()
    mine = None
    for entry in obj:
        if not (
            isinstance(entry, list)
            and len(entry) in (4, 5, 6)
            and isinstance(entry[0], str)
            and NAME.fullmatch(entry[0])
            and isinstance(entry[1], int)
            and not isinstance(entry[1], bool)
            and 0 <= entry[1] < 1 << INC_BITS
        ):
            raise Malformed(
                f"ack entry is not [node, incarnation, done runs, got runs(, hold(, heard))]: {short(entry)}"
            )
        src = source_key(entry[0], entry[1])
        if src in sources:
            raise Malformed(f"ack names source {short(src)} twice")
        sources.add(src)
        if src == source:
            mine = entry
    if mine is None:
        return AckBody(frozenset(sources), [], [], False)
    done, got = _decode_runs(mine[2:4])
    hold = mine[4] if len(mine) >= 5 else None
    if (hold is not None or len(mine) == 5) and (
        not isinstance(hold, int) or isinstance(hold, bool) or not 0 <= hold <= MAX_ACK_HOLD_MS
    ):
        raise Malformed(f"ack hold for {source!r} is not 0 to {MAX_ACK_HOLD_MS} ms: {short(hold)}")
    heard = mine[5] if len(mine) == 6 else None
    top = SN_MOD * HEARD_ECHO_MS - 1
    if len(mine) == 6 and (not isinstance(heard, int) or isinstance(heard, bool) or not 0 <= heard <= top):
        raise Malformed(f"ack's send number heard for {source!r} is not 0 to {top}: {short(heard)}")
    return AckBody(frozenset(sources), done, got, True, hold, heard)


def _decode_runs(obj: object) -> tuple[Runs, Runs]:
    if not isinstance(obj, list) or len(obj) != 2 or not all(isinstance(x, list) for x in obj):
        raise Malformed(f"ack entry is not [done runs, got runs]: {short(obj)}")
    lists: list[Runs] = []
    for runs in obj:
        out: Runs = []
        for r in runs:
            if (
                not isinstance(r, list)
                or len(r) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                or not 0 <= r[0] <= r[1] <= MAX_SEQ
            ):
                raise Malformed(
                    f"bad ack run {short(r)}"
                    + (f": {short(r[0])}..{short(r[1])}" if isinstance(r, list) and len(r) == 2 else "")
                )
            out.append((r[0], r[1]))
        lists.append(out)
    return lists[0], lists[1]


def heard_of(sn: int, made_ms: int) -> int:
    """What an ack says it heard of an announcement of send number `sn` made at `made_ms`."""
    return sn % SN_MOD + SN_MOD * (made_ms % HEARD_ECHO_MS)


def runs_total(runs: Runs) -> int:
    """How many ids the runs name (overlaps counted twice)."""
    return sum(b - a + 1 for a, b in runs)


def in_runs(seqs: Iterable[int], runs: Runs) -> list[int]:
    """Those of `seqs` that some run covers, in order (bisect over the merged runs)."""
    merged: Runs = []
    for a, b in sorted(runs):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    starts = [a for a, _ in merged]
    out = []
    for s in sorted(set(seqs)):
        k = bisect.bisect_right(starts, s) - 1
        if k >= 0 and s <= merged[k][1]:
            out.append(s)
    return out


def with_seq(env: Envelope, seq: int) -> Envelope:
    return replace(env, seq=seq)


def _builtin_v2() -> bytes:  # (a Codec's default dictionary: builtin_dictionary is defined below it)
    return builtin_dictionary(2)
