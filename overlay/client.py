"""The node's local API, from the application side: one client for the CLI
(`c2dtn send/recv/ping/node status`), the testbed harness, perf and the tests.

The API is HTTP on the node's Unix socket (see overlay/node.py).  This client is
synchronous on purpose: its callers (click commands, benchmark threads, pytest) are
synchronous, and a round-trip benchmark must not pay for an event loop per request.
It keeps one connection alive per thread.  The standard library's http.client has no
Unix-socket connection, so `_UnixHTTP` adds the two lines it lacks.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import cbor2

from c2dtn.errors import C2Error


class ApiError(C2Error):
    """The node did not answer, or answered with an error (its message included)."""


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class NodeClient:
    """HTTP over one node's API socket.  `name` is how errors name the node."""

    def __init__(self, socket_path: str | Path, name: str | None = None):
        self.path = str(socket_path)
        self.name = name or self.path
        self._local = threading.local()

    @classmethod
    def for_config(cls, config: str | Path) -> NodeClient:
        from c2dtn.overlay.config import load_node_config

        cfg = load_node_config(config)
        if not Path(cfg.api_socket).exists():
            raise ApiError(
                f"node {cfg.id} is not running (no API socket at {cfg.api_socket}): "
                f"start it with c2dtn node run {config}"
            )
        return cls(cfg.api_socket, cfg.id)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 30.0, cbor: bool = False):
        """One request on this thread's kept-alive connection (a new one if it broke);
        cbor: ask for CBOR (GET /recv: bodies as bytes, not base64).  Returns the decoded
        answer; raises ApiError naming the node for a refusal or no answer."""
        headers = {"Accept": "application/cbor"} if cbor else {}
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = _UnixHTTP(self.path, timeout)
            conn.timeout = timeout
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                raw = r.read()
                if r.getheader("Content-Type", "").startswith("application/cbor"):
                    data = cbor2.loads(raw)
                else:
                    data = json.loads(raw or b"null")
                break
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.close()
                if attempt:
                    raise ApiError(f"node {self.name} did not answer on {self.path}: {e}") from None
        if r.status != 200:
            msg = data.get("error") if isinstance(data, dict) else data
            raise ApiError(f"node {self.name}: {method} {path.split('?')[0]}: {msg}")
        return data

    # -- what applications do ------------------------------------------------------------

    def send(
        self,
        dst: str,
        body: bytes,
        priority: str = "routine",
        lifetime: float = 3600,
        supersede: str | None = None,
        app: str = "raw",
    ) -> dict:
        """Hand one message to the node for `dst`; returns {origin, seq, ...} once it is in custody."""
        qs = {"dst": dst, "priority": priority, "lifetime": lifetime, "app": app}
        if supersede:
            qs["supersede"] = supersede
        return self.request("POST", "/send?" + urlencode(qs), body)

    def recv(
        self,
        wait: float = 0.0,
        max_items: int = 1000,
        app: str | None = None,
        cbor: bool = True,
        timeout: float | None = None,
    ) -> list[dict]:
        """What the inbox holds (still there until consumed), bodies as bytes."""
        qs = {"wait": f"{wait:.1f}", "max": max(1, max_items)}
        if app:
            qs["app"] = app
        items = self.request("GET", "/recv?" + urlencode(qs), timeout=timeout or wait + 30, cbor=cbor)
        if not cbor:
            for d in items:
                d["body"] = base64.b64decode(d["body"])
        return items

    def consumed(self, items: list[dict]) -> None:
        """Tell the node these were taken: their origin hears it and releases custody."""
        if items:
            self.request("POST", "/consumed", json.dumps({"ids": [d["id"] for d in items]}).encode())

    def take(self, wait: float = 0.0, max_items: int = 1000, app: str | None = None) -> list[dict]:
        """recv, then consumed."""
        items = self.recv(wait, max_items, app)
        self.consumed(items)
        return items

    def status(self, timeout: float = 30.0) -> dict:
        return self.request("GET", "/status", timeout=timeout)

    def pings(
        self, dst: str, size: int, count: int, timeout: float = 60.0, interval: float = 0.0
    ) -> Iterator[float | None]:
        """Round trips through the overlay, like bping: `dst`'s node answers each ping
        (app "ping" -> "pong").  Yields each round trip in seconds (None: no answer within
        `timeout`), from handing the ping over to having the answer in hand; taking it off
        the inbox (POST /consumed, which a bare BPA's delivery has no counterpart of)
        follows, outside the time."""
        for i in range(count):
            stamp = f"{time.time_ns()}:{i}:".encode()
            body = stamp + os.urandom(max(0, size - len(stamp)))  # incompressible, as a bare pinger's
            t0 = time.monotonic()
            self.send(dst, body, priority="flash", lifetime=max(1.0, timeout), app="ping")
            deadline = t0 + timeout
            rtt = None
            while rtt is None and time.monotonic() < deadline:
                items = self.recv(wait=min(5.0, max(0.0, deadline - time.monotonic())), app="pong")
                if any(d["body"].startswith(stamp) for d in items):
                    rtt = time.monotonic() - t0
                self.consumed(items)
            yield rtt
            if interval and i + 1 < count:
                time.sleep(interval)
