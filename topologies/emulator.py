"""Userspace channel emulator: the thin I/O shell around topologies.channel.

One process per link, running inside the link's own namespace between the two
veth ports that face node A (`--a-if`) and node B (`--b-if`).  Frames are read
and written with AF_PACKET sockets; each direction goes through its own
channel.Direction.  A Unix socket takes JSON-line commands (status, set, down,
up) from `c2dtn topo link` and the schedule runner.

Run as:  python -m c2dtn.topologies.emulator --link NAME --a-if c2a --b-if c2b
             --control PATH --profile-ab JSON --profile-ba JSON
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import select
import signal
import socket
import sys
import time

from c2dtn.topologies.channel import Direction, LinkActivity
from c2dtn.topologies.profiles import Profile

ETH_P_ALL = 0x0003
SOL_PACKET = 263  # linux/socket.h; Python 3.11 exports neither constant
PACKET_IGNORE_OUTGOING = 23  # linux/if_packet.h
MAX_FRAME = 65536
READ_BATCH = 256

log = logging.getLogger("c2emu")


def packet_socket(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.bind((ifname, ETH_P_ALL))
    s.setblocking(False)
    return s


class _Frame(bytes):
    """A frame's bytes as they are (not parsed), with what scapy's pcapng writer reads beside them."""

    sniffed_on: str
    comments: list[bytes] | None


CAPTURE_QUEUE = 20_000  # frames waiting for the capture's disk at most; past it they are not captured


class CaptureWriter:
    """One link's pcapng (scapy's writer), written by a thread of its own behind a bounded
    queue: a slow, full or failing disk costs frames of the capture (counted in `lost`, the
    error kept), never frames of the link.  The file is opened without following a link
    planted at its name, refused unless it is a regular file (a FIFO would block), and made
    mode 0600 (it holds the traffic)."""

    def __init__(self, path: str, link: str):
        import queue
        import stat
        import threading

        from scapy.utils import RawPcapNgWriter  # only a capturing emulator pays for the import

        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            os.fchmod(fd, 0o600)
            os.set_blocking(fd, True)
        except OSError:
            os.close(fd)
            raise
        w = RawPcapNgWriter(os.devnull)  # (it opens its file by name: given ours instead)
        w.f.close()
        w.f = os.fdopen(fd, "wb", 1 << 16)
        first = f"{link} ab".encode()  # interface 0 named, not left blank by the writer's own header
        w.linktype, w.header_present, w.interfaces2id = 1, True, {first: 0}  # 1: Ethernet
        w._write_block_shb()
        w._write_block_idb(linktype=1, ifname=first)
        self.w = w
        self.path = path
        self.q: queue.Queue = queue.Queue(CAPTURE_QUEUE)
        self.lost = 0
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"c2emu-capture {link}", daemon=True)
        self.thread.start()

    def put(self, frame: bytes, sec: float, ifname: str, comments: list[bytes] | None) -> None:
        if self.error is not None:
            self.lost += 1
            return
        try:
            self.q.put_nowait((frame, sec, ifname, comments))
        except Exception:  # queue.Full: the disk is behind
            self.lost += 1

    def _run(self) -> None:
        import queue

        while True:
            try:
                item = self.q.get(timeout=1.0)
            except queue.Empty:
                item = ()  # idle a second: what is written reaches the file (tshark can read it)
            try:
                if item is None:
                    self.w.f.close()
                    return
                if not item:
                    self.w.f.flush()
                    continue
                if self.error is None:
                    pkt = _Frame(item[0])
                    pkt.sniffed_on, pkt.comments = item[2], item[3]
                    self.w.write_packet(pkt, sec=item[1])
            except OSError as e:
                if self.error is None:
                    self.error = str(e)
                    log.warning("capture to %s stopped: %s (the link carries on)", self.path, e)
                if item is None:
                    return

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop after what is queued (or after timeout_s, if the disk is stuck)."""
        try:
            self.q.put(None, timeout=timeout_s)
        except Exception:  # full and stuck: the thread is left to the process's end
            return
        self.thread.join(timeout_s)


class Emulator:
    def __init__(
        self,
        link: str,
        a_if: str,
        b_if: str,
        control: str,
        profile_ab: Profile,
        profile_ba: Profile,
        seed: int | None = None,
    ):
        self.link = link
        self.sa = packet_socket(a_if)
        self.sb = packet_socket(b_if)
        shared = LinkActivity()  # one link: either way keeps it up (Profile.link_idle_s)
        self.ab = Direction(profile_ab, seed=seed, activity=shared)
        self.ba = Direction(profile_ba, seed=None if seed is None else seed + 1, activity=shared)
        self.send_errors = 0
        self.capture: CaptureWriter | None = None  # while capturing (the capture command)
        self.started = time.monotonic()
        self.running = True
        try:
            os.unlink(control)
        except FileNotFoundError:
            pass
        self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ctl.bind(control)
        self.ctl.listen(16)
        self.ctl.setblocking(False)
        self.control_path = control

    # -- control -----------------------------------------------------------
    def handle(self, req: dict, now: float) -> dict:
        cmd = req.get("cmd")
        if cmd == "ping":
            return {"ok": True, "link": self.link}
        if cmd == "status":
            qa = self.ab.queued(now)
            qb = self.ba.queued(now)
            return {
                "ok": True,
                "link": self.link,
                "up": self.ab.up and self.ba.up,
                "uptime_s": now - self.started,
                "profile_ab": self.ab.profile.to_dict(),
                "profile_ba": self.ba.profile.to_dict(),
                "ab": self.ab.stats.as_dict() | {"queued": qa[0], "queued_bytes": qa[1]},
                "ba": self.ba.stats.as_dict() | {"queued": qb[0], "queued_bytes": qb[1]},
                "send_errors": self.send_errors,
                "cpu_s": sum(os.times()[:2]),
                "capture": None
                if self.capture is None
                else {"path": self.capture.path, "lost": self.capture.lost, "error": self.capture.error},
            }
        if cmd == "set":
            try:
                if "profile_ab" in req:
                    self.ab.set_profile(Profile.from_dict(req["profile_ab"]))
                if "profile_ba" in req:
                    self.ba.set_profile(Profile.from_dict(req["profile_ba"]))
            except (TypeError, ValueError) as e:
                return {"ok": False, "error": f"bad profile: {e}"}
            log.info("profiles now %s / %s", self.ab.profile.name, self.ba.profile.name)
            return {"ok": True}
        if cmd in ("down", "up"):
            self.ab.set_up(cmd == "up", now)
            self.ba.set_up(cmd == "up", now)
            log.info("link %s", cmd)
            return {"ok": True, "at": now}
        if cmd == "capture":
            return self._capture(req.get("path"))
        if cmd == "stop":
            self.running = False
            return {"ok": True}
        return {
            "ok": False,
            "error": f"unknown command {cmd!r}",
            "commands": ["ping", "status", "set", "down", "up", "capture", "stop"],
        }

    def _capture(self, path: object) -> dict:
        """Write every frame the link carries, both ways, to a pcapng file at `path` (None: stop):
        one interface per direction ("<link> ab", "<link> ba"), each frame when it is delivered,
        and each frame the emulator dropped when it dropped it, with a comment saying so and why
        ("dropped: lost", "dropped: link down", ...): the radio's own view.  A capture started
        again at the same path replaces the file."""
        if self.capture is not None:
            self.capture.close()
            self.capture = None
        self.ab.drops = self.ba.drops = None
        if path is None:
            return {"ok": True}
        if not isinstance(path, str) or not path.startswith("/"):
            return {"ok": False, "error": f"capture path is not an absolute file name: {path!r}"}
        try:
            self.capture = CaptureWriter(path, self.link)
        except OSError as e:
            return {"ok": False, "error": f"cannot write capture {path!r}: {e}"}
        self.ab.drops, self.ba.drops = [], []
        log.info("capturing %s to %s", self.link, path)
        return {"ok": True, "path": path}

    def _write(self, d: Direction, frames: list[bytes], why: str | None = None) -> None:
        now = time.time()
        name = f"{self.link} {'ab' if d is self.ab else 'ba'}"
        note = None if why is None else [f"dropped: {why}".encode()]
        for f in frames:
            self.capture.put(f, now, name, note)  # type: ignore[union-attr]

    def _drain_drops(self) -> None:
        for d in (self.ab, self.ba):
            if d.drops:
                for f, why in d.drops:
                    self._write(d, [f], why)
                d.drops.clear()

    def serve_control(self) -> None:
        try:
            conn, _ = self.ctl.accept()
        except BlockingIOError:
            return
        try:
            conn.settimeout(1.0)
            buf = b""
            while not buf.endswith(b"\n") and len(buf) < 1 << 20:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
            try:
                req = json.loads(buf)
                if not isinstance(req, dict):
                    raise ValueError("not a JSON object")
                resp = self.handle(req, time.monotonic())
            except ValueError as e:
                resp = {"ok": False, "error": f"malformed request {buf[:80]!r}: {e}"}
            except Exception as e:  # a bug in a command must not stop the link's frames
                log.exception("command %r failed", buf[:80])
                resp = {"ok": False, "error": f"command failed: {e!r}"}
            conn.sendall(json.dumps(resp).encode() + b"\n")
        except OSError as e:
            log.warning("control connection failed: %s", e)
        finally:
            conn.close()

    # -- data path -----------------------------------------------------------
    def _read(self, sock: socket.socket, d: Direction, now: float) -> None:
        recv = sock.recv
        offer = d.offer
        for _ in range(READ_BATCH):
            try:
                frame = recv(MAX_FRAME)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.ENETDOWN, errno.ENXIO):
                    return
                raise
            offer(frame, now)

    def _flush(self, sock: socket.socket, d: Direction, now: float) -> None:
        frames = d.due(now)
        if not frames:
            return
        if self.capture is not None:
            self._write(d, frames)  # stamped with the wall clock
        send = sock.send
        for f in frames:
            try:
                send(f)
            except OSError:
                # ENOBUFS/EAGAIN (peer backlog full) or the port is down (carrier outage): lost
                self.send_errors += 1

    def run(self) -> None:
        ep = select.epoll()
        fa, fb, fc = self.sa.fileno(), self.sb.fileno(), self.ctl.fileno()
        ep.register(fa, select.EPOLLIN)
        ep.register(fb, select.EPOLLIN)
        ep.register(fc, select.EPOLLIN)
        ab, ba = self.ab, self.ba
        monotonic = time.monotonic
        log.info("emulating %s: a->b %s, b->a %s", self.link, ab.profile.name, ba.profile.name)
        while self.running:
            now = monotonic()
            d1 = ab.next_deadline()
            d2 = ba.next_deadline()
            deadline = d1 if d2 is None else (d2 if d1 is None else min(d1, d2))
            timeout = 1.0 if deadline is None else max(0.0, deadline - now)
            events = ep.poll(timeout)
            now = monotonic()
            for fd, _ in events:
                if fd == fa:
                    self._read(self.sa, ab, now)
                elif fd == fb:
                    self._read(self.sb, ba, now)
                else:
                    self.serve_control()
            self._flush(self.sb, ab, now)
            self._flush(self.sa, ba, now)
            if self.capture is not None:
                self._drain_drops()
        if self.capture is not None:
            self.capture.close()
        try:
            os.unlink(self.control_path)
        except FileNotFoundError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m c2dtn.topologies.emulator")
    ap.add_argument("--link", required=True)
    ap.add_argument("--a-if", required=True)
    ap.add_argument("--b-if", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--profile-ab", required=True, help="profile as JSON")
    ap.add_argument("--profile-ba", required=True, help="profile as JSON")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s c2emu[%(process)d] %(message)s")
    try:
        import setproctitle

        setproctitle.setproctitle(f"c2emu {args.link}")
    except ImportError:  # cosmetic only
        pass
    try:
        emu = Emulator(
            args.link,
            args.a_if,
            args.b_if,
            args.control,
            Profile.from_dict(json.loads(args.profile_ab)),
            Profile.from_dict(json.loads(args.profile_ba)),
            args.seed,
        )
    except (OSError, ValueError, TypeError) as e:
        log.error("cannot start emulator for %s: %s", args.link, e)
        return 2

    def stop(signum, frame):
        emu.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    emu.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
