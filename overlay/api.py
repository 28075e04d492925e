"""The node's local HTTP API (`POST /send`, `GET /recv`, `POST /consumed`): its requests'
parameters checked, I/O-free, so that anything an application sends gets a 400 naming the
bad value (never a 500, a hot loop or an integer SQLite cannot store).  perf/fuzz_targets.py
fuzzes these functions; the HTTP framing around them is aiohttp's."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from c2dtn.overlay.envelope import Priority

MAX_LIFETIME_S = 366 * 86400  # a year: longer is a mistake, not a C2 message
MAX_WAIT_S = 3600.0  # one long poll
MAX_TAKE = 100_000
MAX_IDS = 1_000_000
MAX_ID = (1 << 63) - 1  # SQLite's INTEGER


class ApiError(ValueError):
    """A request parameter that is missing or bad; the message names it and its value."""


@dataclass(frozen=True)
class SendArgs:
    dst: str
    priority: Priority
    lifetime_ms: int
    supersede: str | None
    app: str


def _number(q: Mapping[str, str], name: str, default: str, lo: float, hi: float) -> float:
    raw = q.get(name, default)
    try:
        v = float(raw)
    except ValueError:
        raise ApiError(f"{name} must be a number, got {raw!r:.60}") from None
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ApiError(f"{name} must be from {lo:g} to {hi:g}, got {raw!r:.60}")
    return v


def parse_send(q: Mapping[str, str]) -> SendArgs:
    if not q.get("dst"):
        raise ApiError("missing dst")
    try:
        prio = Priority.parse(q.get("priority", "routine"))
    except ValueError as e:
        raise ApiError(str(e)) from None
    lifetime_s = _number(q, "lifetime", "3600", 0.001, MAX_LIFETIME_S)
    return SendArgs(q["dst"], prio, int(lifetime_s * 1000), q.get("supersede"), q.get("app", "raw"))


def parse_recv(q: Mapping[str, str]) -> tuple[float, str | None, int]:
    """(seconds to wait for something, app or None for all, most to take)."""
    wait = _number(q, "wait", "0", 0, MAX_WAIT_S)
    limit = _number(q, "max", "1000", 1, MAX_TAKE)
    if limit != int(limit):
        raise ApiError(f"max must be a whole number, got {q.get('max')!r:.60}")
    return wait, q.get("app"), int(limit)


def parse_consumed(body: bytes) -> list[int]:
    """The inbox ids of `{"ids": [...]}`."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError(f'expected {{"ids": [...]}}, got no JSON ({e})') from None
    ids = doc.get("ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or len(ids) > MAX_IDS:
        raise ApiError(f'expected {{"ids": [...]}} with up to {MAX_IDS} ids, got {body[:60]!r}')
    bad = next((i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 < i <= MAX_ID), None)
    if bad is not None:
        raise ApiError(f"an inbox id is a whole number from 1 to {MAX_ID}, got {bad!r:.60}")
    return ids
