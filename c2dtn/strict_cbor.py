"""CBOR from a peer, decoded in time and memory linear in its size (RFC 8949).

`loads` walks the bytes once before cbor2 decodes them and refuses, with the offset:
tags of any kind (the value-sharing tags 28/29 let a few hundred bytes stand for a
structure of gigabytes, and nothing c2dtn reads from a peer uses a tag), indefinite
lengths, map keys that are not integers or text (an array key is hashed whole, and tuple
hashes can be made to collide), nesting deeper than `max_depth`, simple values other
than false/true/null, lengths past the end, and trailing bytes.  What passes decodes to
at most one Python object per input byte.

`short` names a peer's value in an error or a log line without building its whole repr.
"""

from __future__ import annotations

import cbor2

MAX_DEPTH = 8


class StrictCBORError(ValueError):
    """The bytes are not CBOR of the strict subset c2dtn reads from peers."""


_KEY_TYPES = (0, 1, 3)  # unsigned and negative integers, text strings
_LEN = {24: 1, 25: 2, 26: 4, 27: 8}


# cbor2 has no switch to refuse tags 28/29 or array map keys, nor an item bound: hence this walk
def check(
    data: bytes,
    max_depth: int = MAX_DEPTH,
    sequence: bool = False,
    max_items: int | None = None,
    ends: list[int] | None = None,
) -> None:
    """Raise StrictCBORError unless `data` is exactly one item of the strict subset, or with
    `sequence`, any number of them back to back (the inside of an indefinite-length array).
    max_items: refused past this many items (arrays, maps and their contents, all counted).
    ends: with `sequence`, gets the offset where each item starts, then the end of the last."""
    n = len(data)
    i = 0
    left = n if max_items is None else max_items
    todo = [n if sequence else 1]  # items still to read in each open array/map (a map counts keys and values)
    maps = [False]
    while True:
        while todo[-1] == 0:
            todo.pop()
            maps.pop()
            if not todo:
                if i != n:
                    raise StrictCBORError(f"{n - i} bytes after the item, at offset {i}")
                if ends is not None and sequence:  # (as many one-byte items as bytes: the count ran out)
                    ends.append(i)
                return
        if sequence and len(todo) == 1:
            if ends is not None:
                ends.append(i)
            if i == n:
                return
        todo[-1] -= 1
        left -= 1
        if left < 0:
            raise StrictCBORError(f"more than {max_items} items, at offset {i}")
        is_key = maps[-1] and todo[-1] % 2 == 1
        if i >= n:
            raise StrictCBORError(f"ends at offset {i} inside an item")
        ib = data[i]
        major, ai = ib >> 5, ib & 31
        at = i
        i += 1
        if ai < 24:
            val = ai
        elif ai in _LEN:
            w = _LEN[ai]
            if i + w > n:
                raise StrictCBORError(f"ends at offset {n} inside the head at {at}")
            val = int.from_bytes(data[i : i + w], "big")
            i += w
        elif ai == 31:
            raise StrictCBORError(f"indefinite length at offset {at}")
        else:
            raise StrictCBORError(f"reserved additional information {ai} at offset {at}")
        if is_key and major not in _KEY_TYPES:
            raise StrictCBORError(f"map key of major type {major} at offset {at}: only integers and text")
        if major in (2, 3):
            if val > n - i:
                raise StrictCBORError(f"string of {val} bytes at offset {at} runs past the end ({n} bytes)")
            i += val
        elif major in (4, 5):
            count = val * 2 if major == 5 else val
            if count > n - i:
                raise StrictCBORError(
                    f"{'map' if major == 5 else 'array'} of {val} at offset {at} cannot fit in the {n - i} bytes left"
                )
            if len(todo) > max_depth:
                raise StrictCBORError(f"nested deeper than {max_depth} at offset {at}")
            todo.append(count)
            maps.append(major == 5)
        elif major == 6:
            raise StrictCBORError(f"tag {val} at offset {at}: no tags are accepted")
        elif major == 7 and ai < 24 and ai not in (20, 21, 22):
            raise StrictCBORError(f"simple value {ai} at offset {at}")
        elif major == 7 and ai == 24:
            raise StrictCBORError(f"simple value {val} at offset {at}")


def loads(
    data: bytes | bytearray | memoryview,
    max_depth: int = MAX_DEPTH,
    indefinite_array: bool = False,
    max_items: int | None = None,
) -> object:
    """Decode one item of the strict subset (StrictCBORError names what is wrong).
    indefinite_array: the item may be one indefinite-length array whose items are in the
    subset (a BPv7 bundle, RFC 9171 §4.1)."""
    data = bytes(data)
    if indefinite_array and data[:1] == b"\x9f":
        if data[-1:] != b"\xff":
            raise StrictCBORError(f"indefinite-length array of {len(data)} bytes does not end with a break")
        check(data[1:-1], max_depth - 1, sequence=True, max_items=max_items)
    else:
        check(data, max_depth, max_items=max_items)
    try:
        return cbor2.loads(data)
    except Exception as e:  # cannot happen for what passed check(); named all the same
        raise StrictCBORError(f"cbor2 refused it: {type(e).__name__}") from None


def short(v: object, width: int = 40) -> str:
    """A peer's value for a message: its type and a prefix, never its whole repr."""
    if isinstance(v, (bytes, bytearray, str)):
        s = repr(v[:width])
        return s if len(v) <= width else f"{s}... ({len(v)} {'characters' if isinstance(v, str) else 'bytes'})"
    if isinstance(v, bool) or v is None or isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return repr(v) if v.bit_length() <= 64 else f"an integer of {v.bit_length()} bits"
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        return f"{type(v).__name__} of {len(v)}"
    return type(v).__name__
