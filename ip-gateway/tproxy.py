"""TPROXY interception crossing a gateway box, in the current namespace: MQTT (TCP 1883)
and CoAP (UDP 5683), one rule each in one table.

nftables when `nft` is there, iptables otherwise.  Packets to an intercepted port that
are routed through the box go to the gateway's transparent socket; an accepted TCP
socket's local address, or a UDP datagram's IP_ORIGDSTADDR, is the server the client
meant.  Policy routing (fwmark 1 -> table 100 -> local) delivers them to the box itself.
While the gateway is not listening (killed, restarting), intercepted packets are dropped,
never forwarded past it.  Everything is named c2dtn / table 100 and removed when the last
rule goes; each change rewrites the whole table, so installing twice replaces, never stacks.
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess

from c2dtn.errors import C2Error

TABLE = "c2dtn_tproxy"
MARK, RT_TABLE = "1", "100"
# not in Python 3.11's socket module (linux/in.h)
IP_TRANSPARENT, IP_RECVORIGDSTADDR = 19, 20
IP_ORIGDSTADDR = IP_RECVORIGDSTADDR

_rules: dict[tuple[str, int], tuple[int, tuple[str, ...]]] = {}  # (tcp|udp, port) -> (where it lands, to whom)
_nft: bool | None = None  # what the rules were installed with (None: nothing installed)


def _run(*cmd: str, check: bool = True) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise C2Error(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


def intercept(proto: str, dport: int, port: int, daddrs: list[str] | None = None) -> None:
    """Send `proto` traffic to `dport` crossing the box to local port `port` (with the
    other gateways' rules kept); only traffic to the prefixes `daddrs` when they are given
    (an empty list intercepts nothing)."""
    _rules[(proto, dport)] = (port, tuple(daddrs) if daddrs is not None else ("0.0.0.0/0",))
    _apply()


def release(proto: str, dport: int) -> None:
    """Idempotent: stop intercepting one port; the last one removes the table and routes."""
    _rules.pop((proto, dport), None)
    _apply()


def _apply() -> None:
    global _nft
    _remove(_nft if _nft is not None else bool(shutil.which("nft")))
    _nft = None
    if not _rules:
        return
    if shutil.which("nft"):
        lines = []
        for (proto, dport), (port, daddrs) in sorted(_rules.items()):
            lines += [f"  {proto} dport {dport} fib daddr type local accept"]
            if proto == "tcp":  # packets of a flow already accepted go to its socket
                lines += [f"  tcp dport {dport} socket transparent 1 meta mark set {MARK} accept"]
            to = "" if daddrs == ("0.0.0.0/0",) else f"ip daddr {{ {', '.join(daddrs)} }} "
            if daddrs:
                lines += [f"  {to}{proto} dport {dport} tproxy to :{port} meta mark set {MARK} accept"]
                # nft's tproxy passes a packet on when no transparent socket listens (iptables'
                # TPROXY drops it): with the gateway down, a client would reach the server past
                # custody, under the client id the far gateway uses there.  Drop it, as iptables
                # does; the client's next SYN (or CON retransmission) finds the gateway back.
                lines += [f"  {to}{proto} dport {dport} drop"]
        rules = (
            f"table ip {TABLE} {{\n chain prerouting {{\n  type filter hook prerouting priority mangle; "
            "policy accept;\n" + "\n".join(lines) + "\n }\n}\n"
        )
        r = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if r.returncode:
            raise C2Error(f"installing the TPROXY rules with nft failed: {r.stderr.strip()}")
        _nft = True
    elif shutil.which("iptables"):
        _run("iptables", "-t", "mangle", "-N", TABLE, check=False)
        for (proto, dport), (port, daddrs) in sorted(_rules.items()):
            _run(
                "iptables",
                "-t",
                "mangle",
                "-A",
                TABLE,
                "-p",
                proto,
                "--dport",
                str(dport),
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-j",
                "RETURN",
            )
            for net in daddrs:
                _run(
                    "iptables",
                    "-t",
                    "mangle",
                    "-A",
                    TABLE,
                    "-p",
                    proto,
                    "-d",
                    net,
                    "--dport",
                    str(dport),
                    "-j",
                    "TPROXY",
                    "--on-port",
                    str(port),
                    "--tproxy-mark",
                    MARK,
                )
        _run("iptables", "-t", "mangle", "-I", "PREROUTING", "-j", TABLE)
        _nft = False
    else:
        raise C2Error("TPROXY interception needs nft or iptables (Debian: apt-get install nftables)")
    _run("ip", "rule", "add", "fwmark", MARK, "lookup", RT_TABLE)
    _run("ip", "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", RT_TABLE)


def _remove(nft: bool) -> None:
    """Idempotent: removes what _apply() made, if it is there."""
    if nft:
        _run("nft", "delete", "table", "ip", TABLE, check=False)
    elif shutil.which("iptables"):
        _run("iptables", "-t", "mangle", "-D", "PREROUTING", "-j", TABLE, check=False)
        _run("iptables", "-t", "mangle", "-F", TABLE, check=False)
        _run("iptables", "-t", "mangle", "-X", TABLE, check=False)
    for _ in range(4):  # rules added twice by a crashed run
        _run("ip", "rule", "del", "fwmark", MARK, "lookup", RT_TABLE, check=False)
    _run("ip", "route", "flush", "table", RT_TABLE, check=False)


def transparent_socket(kind: int, addr: tuple[str, int], orig_dst: bool = False) -> socket.socket:
    """A non-blocking socket bound with IP_TRANSPARENT: to the TPROXY port (any address), or
    to a server's address that is not this box's (to answer as that server)."""
    sock = socket.socket(socket.AF_INET, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        if orig_dst:
            sock.setsockopt(socket.SOL_IP, IP_RECVORIGDSTADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def orig_dst(ancdata: list) -> tuple[str, int] | None:
    """The original destination of a datagram received with IP_RECVORIGDSTADDR (a struct
    sockaddr_in in the ancillary data), or None when it is not there."""
    for level, kind, data in ancdata:
        if level == socket.SOL_IP and kind == IP_ORIGDSTADDR and len(data) >= 8:
            (port,) = struct.unpack_from("!H", data, 2)
            return socket.inet_ntoa(data[4:8]), port
    return None
