"""cla_adapters: the convergence-layer component.  CLA specs (`tcpcl://host:port`, `udp://…`,
`mtcp://…`, spec.py), each agent's names for them (schemes.py, the tables declared in the
drivers), ipn node numbering (numbering.py), and the CLA code of our own: a TCPCLv4 peer
(tcpcl4.py, RFC 9174) and a BPv7 bundle codec (bpv7.py, RFC 9171)."""

from c2dtn.cla_adapters.spec import ClaSpec, parse_cla

__all__ = ["ClaSpec", "parse_cla"]
