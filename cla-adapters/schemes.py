"""Each agent's names for the convergence layers of a CLA spec (cla-adapters/spec.py).

A driver declares its table (scheme -> the agent's own name) and asks `cla_name` for a spec's;
a scheme the agent lacks is refused by this one message, naming the agent, the spec and the
schemes it has.
"""

from __future__ import annotations

from collections.abc import Mapping

from c2dtn.cla_adapters.spec import ClaSpec
from c2dtn.errors import C2Error


def cla_name(agent: str, table: Mapping[str, str], spec: ClaSpec, note: str = "") -> str:
    """The agent's name for spec's convergence layer; C2Error when it has none.  note: what to
    say after a scheme's name in the list (ION's and IBR-DTN's tcpcl is TCPCLv3)."""
    try:
        return table[spec.scheme]
    except KeyError:
        have = [s + (f" ({note})" if note and s == "tcpcl" else "") for s in table]
        listed = ", ".join(have[:-1]) + f" or {have[-1]}" if len(have) > 1 else have[0]
        raise C2Error(f"{agent} has no {spec.scheme} convergence layer ({spec}): use {listed}") from None
