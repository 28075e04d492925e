"""Convergence-layer specs, one notation for every agent.

    tcpcl://10.77.1.2:4556   TCP convergence layer (TCPCLv4, RFC 9174, for dtn7-rs;
                             TCPCLv3, RFC 7242, for ION, µD3TN and IBR-DTN)
    mtcp://10.77.1.2:16162   minimal TCP CL (draft-ietf-dtn-mtcpcl), common ground
    udp://10.77.1.2:4556     UDP CL: one bundle per datagram, common ground
    udphc://10.77.1.2:4560   UDP CL with each bundle's blocks compressed on the air (udphc.py,
                             run by the node around an agent's UDP CL; both ends must use it;
                             a port of its own, so a node may listen on udp:// beside it)
    http://10.77.1.2:3000    dtn7-rs's HTTP push CL
    ltp://10.77.1.2:1113     LTP over UDP (RFC 5326; ION, HDTN): a listening spec is the LTP port

A listening spec names the local address (often 0.0.0.0); a peer spec names the
neighbour's.  The port may be left out: each scheme has its usual default.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from c2dtn.errors import ConfigError

DEFAULT_PORTS = {"tcpcl": 4556, "mtcp": 16162, "udp": 4556, "udphc": 4560, "http": 3000, "ltp": 1113}


@dataclass(frozen=True)
class ClaSpec:
    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    # each agent's driver translates specs into its own notation (overlay/agents/)


def parse_cla(value: object, source: str = "CLA", field: str = "cla") -> ClaSpec:
    if not isinstance(value, str):
        raise ConfigError(source, field, value, "a CLA spec is a string like 'tcpcl://10.77.1.2:4556'")
    try:
        u = urlsplit(value)
    except ValueError as e:  # "Invalid IPv6 URL" for a lone '[' (found by perf fuzz)
        raise ConfigError(source, field, value, f"not a CLA spec: {e}") from None
    if u.scheme not in DEFAULT_PORTS:
        raise ConfigError(
            source,
            field,
            value,
            f"unknown convergence layer {u.scheme!r}",
            "use " + ", ".join(f"{s}://" for s in DEFAULT_PORTS),
        )
    if not u.hostname:
        raise ConfigError(source, field, value, "no address", f"write e.g. '{u.scheme}://10.77.1.2'")
    try:
        ipaddress.ip_address(u.hostname)
    except ValueError:
        raise ConfigError(source, field, value, f"{u.hostname!r} is not an IP address") from None
    try:
        port = u.port or DEFAULT_PORTS[u.scheme]
    except ValueError:
        raise ConfigError(source, field, value, "bad port") from None
    if u.path not in ("", "/") or u.query:
        raise ConfigError(source, field, value, "a CLA spec has no path or query")
    return ClaSpec(u.scheme, u.hostname, port)
