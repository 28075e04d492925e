"""The radio end of the `udphc` convergence layer (cla-adapters/udphc.py, decision 0034): UDP
sockets between the node's agent, which speaks plain UDP on loopback, and the radio hop, where
bundles go with their blocks compressed.

For each `udphc://` listen spec the link binds that address (the radio socket) and the agent
listens on a loopback port instead; for each `udphc://` peer the link binds a loopback port the
agent sends that peer's bundles to.  A datagram from the agent goes out compressed from the radio
socket; a frame from the radio goes to the agent rebuilt.  A frame that does not decode is
dropped, counted and logged once per spell: what a peer sends never stops the link.  A datagram
the kernel will not take at once (a full socket buffer) is dropped and counted: nothing queues in
the node behind a slow radio (dtnd itself waits for each send; the overlay resends what is lost).
A datagram the kernel took but the agent never read (it was restarting) is not seen here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import zlib
from collections.abc import Callable

from c2dtn.cla_adapters import udphc
from c2dtn.cla_adapters.spec import ClaSpec
from c2dtn.errors import C2Error
from c2dtn.overlay.config import NodeConfig, Peer, check_udphc
from c2dtn.spells import Spell

log = logging.getLogger("c2dtn.udphc")

SCHEME = "udphc"
LOOPBACK = "127.0.0.1"


def _ephemeral() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def agent_port(node_id: str, ephemeral: tuple[int, int] | None = None) -> int:
    """A free loopback UDP port for the agent, outside the kernel's ephemeral range, so that no
    socket bound to port 0 (ours included) is handed it while the agent is not bound to it
    (starting, restarting); tried from a point the node's id picks.  Where the ephemeral range
    leaves no port, any free one (that race accepted, and said)."""
    lo, hi = ephemeral or _ephemeral()
    ports = [p for p in (range(1024, lo), range(hi + 1, 65536)) for p in p]
    start = zlib.crc32(node_id.encode()) % len(ports) if ports else 0
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        return port
    log.warning(
        "udphc: no loopback UDP port outside the ephemeral range %d-%d is free: the agent's is any free one", lo, hi
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _bound(host: str, port: int, what: str) -> socket.socket:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise C2Error(f"udphc: cannot bind {what} {host}:{port}: {e.strerror or e}") from None
    s.setblocking(False)
    return s


class _Proto(asyncio.DatagramProtocol):
    def __init__(self, on: Callable[[bytes, tuple], None]):
        self.on = on

    def datagram_received(self, data: bytes, addr) -> None:
        self.on(data, addr)

    def error_received(self, exc: Exception) -> None:  # an ICMP error for a datagram sent: UDP carries on
        log.debug("udphc: %s", exc)


class HcLink:
    """Built before the agent's configuration is written (the sockets it names are bound here);
    start() and stop() around the node's run."""

    def __init__(self, cfg: NodeConfig):
        specs = [s for s in cfg.listen if s.scheme == SCHEME]
        peers = [p for p in cfg.peers if p.cla.scheme == SCHEME]
        self.used = bool(specs or peers)
        self.agent_cfg = cfg
        self.counts = {
            "sent": 0,
            "sent_compressed": 0,
            "sent_bytes_saved": 0,
            "received": 0,
            "refused": 0,
            "dropped": 0,  # datagrams the kernel would not take at once, either way (sendto failed)
        }
        self._socks: list[socket.socket] = []
        self._transports: list[asyncio.DatagramTransport] = []
        self._refused = Spell(log)
        self._dropped = {"out": Spell(log), "in": Spell(log)}  # a spell each way
        if not self.used:
            return
        check_udphc(cfg.source, cfg)  # as when the config was read: it may have been built in code
        try:
            self._radio = [_bound(s.host, s.port, "listen spec") for s in specs]
            self._socks += self._radio
            self.agent_port = agent_port(cfg.id)
            self._agent_side = _bound(LOOPBACK, 0, "a loopback port to the agent")
            self._socks.append(self._agent_side)
            # loopback port -> (peer spec, its socket, the radio socket of its address family)
            self._out: dict[int, tuple[ClaSpec, socket.socket, socket.socket]] = {}
            new_peers = []
            for p in cfg.peers:
                if p.cla.scheme != SCHEME:
                    new_peers.append(p)
                    continue
                fam = socket.AF_INET6 if ":" in p.cla.host else socket.AF_INET
                radio = next((i for i, r in enumerate(self._radio) if r.family == fam), None)
                if radio is None:
                    raise C2Error(
                        f"{cfg.source}: udphc peer {p.node} ({p.cla}) has no udphc:// listen spec of its "
                        "address family to send from"
                    )
                s = _bound(LOOPBACK, 0, f"a loopback port for peer {p.node}")
                self._socks.append(s)
                port = s.getsockname()[1]
                self._out[port] = (p.cla, s, self._radio[radio])
                new_peers.append(Peer(p.node, ClaSpec("udp", LOOPBACK, port)))
        except BaseException:
            self.close_sockets()
            raise
        listen = [s for s in cfg.listen if s.scheme != SCHEME] + [ClaSpec("udp", LOOPBACK, self.agent_port)]
        self.agent_cfg = dataclasses.replace(cfg, listen=listen, peers=new_peers)

    def close_sockets(self) -> None:
        for s in self._socks:
            s.close()
        self._socks = []

    async def start(self) -> None:
        if not self.used:
            return
        loop = asyncio.get_running_loop()
        self._to_agent = (LOOPBACK, self.agent_port)
        for s in self._radio:
            t, _ = await loop.create_datagram_endpoint(lambda: _Proto(self._from_radio), sock=s)
            self._transports.append(t)
        for spec, s, radio in self._out.values():
            t, _ = await loop.create_datagram_endpoint(
                lambda spec=spec, radio=radio: _Proto(lambda d, a: self._to_radio(d, spec, radio)), sock=s
            )
            self._transports.append(t)
        t, _ = await loop.create_datagram_endpoint(lambda: _Proto(lambda d, a: None), sock=self._agent_side)
        self._transports.append(t)
        log.info(
            "udphc: radio on %s, agent on %s:%d, %d peer(s)",
            ", ".join(f"{h}:{p}" for h, p, *_ in (x.getsockname() for x in self._radio)),
            LOOPBACK,
            self.agent_port,
            len(self._out),
        )

    def _send(self, sock: socket.socket, data: bytes, to: tuple[str, int], way: str) -> bool:
        """Straight to the kernel (an asyncio transport would queue without bound): a datagram
        it will not take now is dropped and counted."""
        try:
            sock.sendto(data, to)
        except OSError as e:  # BlockingIOError (a full buffer), EMSGSIZE, ENETUNREACH
            self.counts["dropped"] += 1
            self._dropped[way].hit("udphc: a datagram to %s:%d dropped: %s", to[0], to[1], e)
            return False
        self._dropped[way].over("udphc: datagrams to %s:%d go again", to[0], to[1])
        return True

    def _to_radio(self, data: bytes, spec: ClaSpec, radio: socket.socket) -> None:
        frame = udphc.encode(data)
        if not self._send(radio, frame, (spec.host, spec.port), "out"):
            return
        self.counts["sent"] += 1
        if frame is not data:
            self.counts["sent_compressed"] += 1
            self.counts["sent_bytes_saved"] += len(data) - len(frame)

    def _from_radio(self, frame: bytes, addr) -> None:
        try:
            bundle = udphc.decode(frame)
        except udphc.HcError as e:
            self.counts["refused"] += 1
            self._refused.hit("udphc: a frame from %s refused: %s", addr[0], e)
            return
        self._refused.over("udphc: frames decode again")
        if self._send(self._agent_side, bundle, self._to_agent, "in"):
            self.counts["received"] += 1

    async def stop(self) -> None:
        for t in self._transports:
            t.close()
        self._transports = []
        self.close_sockets()
