"""cla_adapters: convergence-layer specs (`tcpcl://host:port`, `udp://…`, `mtcp://…`)
and their translation to each BPA's own configuration."""

from c2dtn.cla_adapters.spec import ClaSpec, parse_cla

__all__ = ["ClaSpec", "parse_cla"]
