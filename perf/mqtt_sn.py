"""Seed 001's MQTT-SN baseline: position reporters speaking MQTT-SN 1.2 over UDP to the Eclipse
Paho MQTT-SN gateway (built from ../shared/bpa-src by `make bpas`), which publishes what they
send to an MQTT broker beside it.

    python -m c2dtn.perf.mqtt_sn units --host GATEWAY [--port 10000] --nation N --units 8 ...

prints the JSON lines `mqtt_clients units` prints (one {"ev": "sent", ...} per report, then
{"ev": "done", ...}), so `perf bft --modes mqtt-sn` reads it like the MQTT modes.

Each unit is a client of its own (its own UDP port): CONNECT, REGISTER of its topic, then each
report as a QoS 1 PUBLISH, one at a time (MQTT-SN 1.2 section 6.13: a client has one
transaction open), resent with the DUP flag after T_RETRY s up to N_RETRY times; reports
queue behind the one waiting for its PUBACK.

The packets are written by hand (SnClient): the five this client needs are a few bytes each,
and the PyPI clients block per message and never resend (mqtt-sn-12), so they could neither
run 8 units in one process nor cross a lossy link.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import socket
import struct
import subprocess
import time
from collections import deque
from pathlib import Path

CONNECT, CONNACK, REGISTER, REGACK, PUBLISH, PUBACK, PINGREQ, PINGRESP, DISCONNECT = (
    0x04,
    0x05,
    0x0A,
    0x0B,
    0x0C,
    0x0D,
    0x16,
    0x17,
    0x18,
)
FLAG_DUP, FLAG_QOS1, FLAG_CLEAN = 0x80, 0x20, 0x04
PROTOCOL_ID = 0x01
T_RETRY = 10.0  # MQTT-SN 1.2 section 6.13: "in the range of 10 to 15 seconds"
N_RETRY = 5  # ... "in the range of 3-5"
GATEWAY_PORT = 10000
MULTICAST_GROUP = "225.1.1.1"  # the gateway's ADVERTISE group (its default)


class SnError(ValueError):
    pass


def packet(kind: int, body: bytes) -> bytes:
    """One MQTT-SN message: its length (one octet, or 0x01 and two), type, then body."""
    n = 2 + len(body)
    if n <= 255:
        return bytes([n, kind]) + body
    if n + 2 > 0xFFFF:
        raise SnError(f"an MQTT-SN message of {n + 2} bytes is over 65,535")
    return b"\x01" + struct.pack(">H", n + 2) + bytes([kind]) + body


def parse(data: bytes) -> tuple[int, bytes]:
    """(type, body) of one datagram; SnError names what is wrong with it."""
    if len(data) < 2:
        raise SnError(f"a datagram of {len(data)} bytes is no MQTT-SN message")
    if data[0] == 1:
        if len(data) < 4:
            raise SnError("an MQTT-SN message with a 3-octet length is cut short")
        n, at = struct.unpack(">H", data[1:3])[0], 3
    else:
        n, at = data[0], 1
    if n != len(data):
        raise SnError(f"MQTT-SN length {n} for a datagram of {len(data)} bytes")
    return data[at], data[at + 1 :]


class SnUnit:
    """One MQTT-SN client, I/O-free: datagrams and `now` in; datagrams, events and a deadline out.

    Events: ("acked", report id) when the gateway took a report, ("gave_up", report id) after
    N_RETRY resends, ("refused", report id, return code)."""

    def __init__(self, client_id: str, topic: str, keepalive: int = 60, t_retry: float = T_RETRY) -> None:
        self.client_id, self.topic, self.keepalive, self.t_retry = (
            client_id.encode(),
            topic.encode(),
            keepalive,
            t_retry,
        )
        self.state = "new"  # new -> connecting -> registering -> ready
        self.topic_id = 0
        self.queue: deque[tuple[str, bytes]] = deque()
        self.open: tuple[int, str, bytes, int, float] | None = None  # (msg id, report id, payload, tries, resend at)
        self.handshake_at = 0.0
        self._mid = 0
        self.events: list[tuple] = []

    def _next_mid(self) -> int:
        self._mid = self._mid % 0xFFFF + 1
        return self._mid

    def _connect(self, now: float) -> list[bytes]:
        self.state, self.handshake_at = "connecting", now + self.t_retry
        return [packet(CONNECT, bytes([FLAG_CLEAN, PROTOCOL_ID]) + struct.pack(">H", self.keepalive) + self.client_id)]

    def _register(self, now: float) -> list[bytes]:
        self.state, self.handshake_at = "registering", now + self.t_retry
        return [packet(REGISTER, struct.pack(">HH", 0, self._next_mid()) + self.topic)]

    def _publish(self, mid: int, payload: bytes, dup: bool) -> bytes:
        flags = FLAG_QOS1 | (FLAG_DUP if dup else 0)  # topic id type 0: a registered (normal) id
        return packet(PUBLISH, bytes([flags]) + struct.pack(">HH", self.topic_id, mid) + payload)

    def _send_next(self, now: float) -> list[bytes]:
        if self.state != "ready" or self.open is not None or not self.queue:
            return []
        rid, payload = self.queue.popleft()
        mid = self._next_mid()
        self.open = (mid, rid, payload, 0, now + self.t_retry)
        return [self._publish(mid, payload, False)]

    def start(self, now: float) -> list[bytes]:
        return self._connect(now)

    def publish(self, rid: str, payload: bytes, now: float) -> list[bytes]:
        self.queue.append((rid, payload))
        return self._send_next(now)

    def on_datagram(self, data: bytes, now: float) -> list[bytes]:
        kind, body = parse(data)
        if kind == CONNACK and self.state == "connecting":
            if len(body) != 1:
                raise SnError(f"CONNACK of {len(body)} bytes")
            if body[0] != 0:
                self.events.append(("refused", "connect", body[0]))
                return []
            return self._register(now)
        if kind == REGACK and self.state == "registering":
            if len(body) != 5:
                raise SnError(f"REGACK of {len(body)} bytes")
            topic_id, _, rc = struct.unpack(">HHB", body)
            if rc != 0:
                self.events.append(("refused", "register", rc))
                return []
            self.topic_id, self.state = topic_id, "ready"
            return self._send_next(now)
        if kind == PUBACK:
            if len(body) != 5:
                raise SnError(f"PUBACK of {len(body)} bytes")
            _, mid, rc = struct.unpack(">HHB", body)
            if self.open is None or mid != self.open[0]:
                return []  # a late PUBACK of a resend already acked
            rid = self.open[1]
            self.open = None
            self.events.append(("acked", rid) if rc == 0 else ("refused", rid, rc))
            return self._send_next(now)
        if kind == DISCONNECT:  # the gateway forgot us (its keep-alive): connect again
            self.topic_id = 0
            if self.open is not None:
                self.queue.appendleft(self.open[1:3])
                self.open = None
            return self._connect(now)
        return []

    def due(self, now: float) -> list[bytes]:
        """Resends whose time has come."""
        if self.state in ("connecting", "registering") and now >= self.handshake_at:
            return self._connect(now) if self.state == "connecting" else self._register(now)
        if self.open is not None and now >= self.open[4]:
            mid, rid, payload, tries, _ = self.open
            if tries >= N_RETRY:
                self.events.append(("gave_up", rid))
                self.open = None
                return self._send_next(now)
            self.open = (mid, rid, payload, tries + 1, now + self.t_retry)
            return [self._publish(mid, payload, True)]
        return []

    def deadline(self) -> float | None:
        if self.state in ("connecting", "registering"):
            return self.handshake_at
        return self.open[4] if self.open is not None else None


# -- the shell: sockets, the report plan, JSON lines -------------------------------------------
def units(a: argparse.Namespace) -> None:
    from c2dtn.perf.train_dict import position_report, report_times, report_topic

    rnd = random.Random(a.seed)
    sel = selectors.DefaultSelector()
    clients: dict[int, tuple[SnUnit, socket.socket]] = {}
    now = time.monotonic()
    for u in range(1, a.units + 1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect((a.host, a.port))
        sock.setblocking(False)
        unit = SnUnit(f"{a.client_id}-{a.nation}-{u}", report_topic(a.nation, u, u))
        clients[u] = (unit, sock)
        sel.register(sock, selectors.EVENT_READ, u)
        for d in unit.start(now):
            sock.send(d)
    counts = {"acked": 0, "gave_up": 0, "refused": 0, "bad": 0}

    def emit(ev: dict) -> None:
        print(json.dumps(ev), flush=True)

    def pump(until: float) -> None:
        while True:
            now = time.monotonic()
            deadlines = [d for unit, _ in clients.values() if (d := unit.deadline()) is not None]
            wait = min([until] + deadlines) - now
            for key, _ in sel.select(max(0.0, wait)):
                unit, sock = clients[key.data]
                try:
                    data = sock.recv(65535)
                    out = unit.on_datagram(data, time.monotonic())
                except ConnectionRefusedError:
                    continue  # (ICMP: the gateway's port closed; its resends go on)
                except SnError:
                    counts["bad"] += 1
                    continue
                for d in out:
                    sock.send(d)
            now = time.monotonic()
            for unit, sock in clients.values():
                for d in unit.due(now):
                    sock.send(d)
                for ev in unit.events:
                    counts[ev[0]] += 1
                unit.events.clear()
            if now >= until:
                return

    t0 = time.time()
    pos = {u: (59.9 + rnd.random() / 10, 10.7 + rnd.random() / 10) for u in clients}
    seq = dict.fromkeys(clients, 0)
    for at, u in report_times(rnd, a.units, a.period, a.duration):
        pump(time.monotonic() + max(0.0, t0 + at - time.time()))
        seq[u] += 1
        lat, lon = pos[u]
        pos[u] = (lat + rnd.uniform(-1e-4, 1e-4), lon + rnd.uniform(-1e-4, 1e-4))
        now_ms = int(time.time() * 1000)
        rid = f"{a.nation}-S{u:03d}_{seq[u]}"
        unit, sock = clients[u]
        for d in unit.publish(rid, position_report(a.nation, u, u, seq[u], now_ms, lat, lon), time.monotonic()):
            sock.send(d)
        emit({"ev": "sent", "id": rid, "nation": a.nation, "unit": f"{a.nation}-S{u:03d}", "t": now_ms / 1000})
    end = time.monotonic() + a.timeout
    while time.monotonic() < end and any(u.open or u.queue for u, _ in clients.values()):
        pump(min(end, time.monotonic() + 0.5))
    sent = sum(seq.values())
    emit({"ev": "done", "sent": sent, **counts})
    os._exit(0)


# -- the gateway --------------------------------------------------------------------------------
def gateway_missing() -> str | None:
    from c2dtn.overlay.agents.builds import not_built

    return not_built("mqttsn")


def start_gateway(netns: str, workdir: Path, broker_port: int = 1883, port: int = GATEWAY_PORT) -> subprocess.Popen:
    """The Paho MQTT-SN gateway in `netns`, on UDP `port`, publishing to the broker on its
    loopback; returns once it listens."""
    from c2dtn.overlay.agents.builds import built
    from c2dtn.topologies import netns as nsmod

    binary = built("mqttsn") / "bin" / "MQTT-SNGateway"
    workdir.mkdir(parents=True, exist_ok=True)
    # the gateway joins its multicast group (ADVERTISE) at start, whatever its config, and aborts
    # where no route leads there ("No such device"): a route for the group on the node's first
    # interface (its advertisements stay on that link; nothing routes multicast on)
    links = nsmod.run_in(netns, ["ip", "-o", "link", "show"]).stdout.splitlines()
    ifname = next(line.split(": ")[1].split("@")[0] for line in links if ": lo:" not in line)
    nsmod.run_in(netns, ["ip", "route", "replace", f"{MULTICAST_GROUP}/32", "dev", ifname])
    conf = workdir / "gateway.conf"
    conf.write_text(
        "GatewayID=1\nGatewayName=c2mqttsn\nMaxNumberOfClients=500\nKeepAlive=60\n"
        f"BrokerName=127.0.0.1\nBrokerPortNo={broker_port}\nBrokerSecurePortNo=8883\n"
        "AggregatingGateway=NO\nQoS-1=NO\nForwarder=NO\nPredefinedTopic=NO\nClientAuthentication=NO\n"
        f"GatewayPortNo={port}\nMulticastPortNo={port + 1}\nMulticastIP={MULTICAST_GROUP}\nMulticastTTL=1\n"
        "ShearedMemory=NO\n"
    )

    def listens() -> bool:
        return f":{port}" in nsmod.run_in(netns, ["ss", "-Huln", f"sport = :{port}"], check=False).stdout

    return nsmod.start_ready(
        netns,
        f'cd "{workdir}" && exec -a c2mqttsn "{binary}" -f "{conf}"',
        workdir / "gateway.log",
        "the MQTT-SN gateway",
        listens,
        f"listen on UDP {port}",
        quiet=True,  # (its stdout is a hex dump of every packet; its errors go to stderr)
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m c2dtn.perf.mqtt_sn")
    ap.add_argument("mode", choices=["units"])
    ap.add_argument("--host", required=True, help="the MQTT-SN gateway's address")
    ap.add_argument("--port", type=int, default=GATEWAY_PORT)
    ap.add_argument("--nation", default="NOR")
    ap.add_argument("--units", type=int, default=8)
    ap.add_argument("--period", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="s to wait for the last PUBACKs")
    ap.add_argument("--client-id", default="c2sn")
    ap.add_argument("--qos", type=int, default=1, choices=[1], help="QoS 1 only (the baseline seed 001 compares)")
    units(ap.parse_args(argv))


if __name__ == "__main__":
    main()
