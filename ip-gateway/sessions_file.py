"""The MQTT session file, <storage>/mqtt-sessions.cbor: near sessions (subscriptions,
subscription ids, expiry) and far sessions (params, subscriptions), so both survive
restarts.  CBOR, because wills and properties carry bytes.  Written whole to a
temporary file, fsynced and renamed: a power cut leaves the old file or the new one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import cbor2

from c2dtn.ip_gateway.near_core import NEVER, NearSession

log = logging.getLogger("c2dtn.gateway")
FAR_FIELDS = ("origin", "client", "broker", "params", "subs")


def load(path: Path, now: float, cap: float = 0.0) -> tuple[dict[str, NearSession], dict[str, dict]]:
    """(near sessions, far session states); empty, with one log line, for a missing,
    unreadable or damaged file.  A near session that had a connection when the file was
    written ends `expiry` seconds from `now` (its client is not connected any more), or
    `cap` seconds ([gateway] persistent_client_expiration) if that is sooner."""
    try:
        st = cbor2.loads(path.read_bytes())
    except FileNotFoundError:
        return {}, {}
    except (ValueError, OSError, cbor2.CBORDecodeError) as e:
        log.error("MQTT session file %s unreadable (%s): starting without sessions", path, e)
        return {}, {}
    try:
        near = {c: NearSession.from_dict(n) for c, n in st.get("near", {}).items()}
        far = {k: f for k, f in st.get("far", {}).items() if all(x in f for x in FAR_FIELDS)}
    except (AttributeError, KeyError, TypeError) as e:
        log.error("MQTT session file %s damaged (%s): starting without sessions", path, e)
        return {}, {}
    for sess in near.values():
        if sess.expires_at is None and cap and (sess.expiry_s == NEVER or sess.expiry_s > cap):
            sess.expires_at = now + cap
        elif sess.expires_at is None and sess.expiry_s != NEVER:
            sess.expires_at = now + sess.expiry_s
        elif sess.expires_at is not None and cap:  # the cap may have been lowered since
            sess.expires_at = min(sess.expires_at, now + cap)
    return near, far


def dump(near: dict[str, NearSession], far: dict[str, dict]) -> bytes:
    """The file's bytes, from the sessions as they are now (on the event loop: they change)."""
    return cbor2.dumps({"near": {c: n.to_dict() for c, n in near.items() if n.expiry_s}, "far": far})


def write(path: Path, data: bytes) -> None:
    """Put dump()'s bytes in place (any thread: the gateway writes from a worker)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # subscriptions and wills: the owner's alone
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def save(path: Path, near: dict[str, NearSession], far: dict[str, dict]) -> None:
    write(path, dump(near, far))
