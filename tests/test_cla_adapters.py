"""The convergence-layer component (cla-adapters/): each agent's names for a CLA spec, ipn node
numbering, and what each driver declares for the testbed (instead of the testbed naming agents)."""

from __future__ import annotations

import tomllib

import pytest

from c2dtn.cla_adapters import parse_cla
from c2dtn.cla_adapters.numbering import node_numbers
from c2dtn.cla_adapters.schemes import cla_name
from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agents import agent_class, kinds
from c2dtn.overlay.config import load_node_config
from c2dtn.topologies.node_configs import _toml_table, harness_cla


def test_an_agents_name_for_a_scheme_and_a_clear_refusal_of_one_it_lacks():
    table = {"tcpcl": "tcp", "udp": "udp"}
    assert cla_name("IBR-DTN", table, parse_cla("udp://10.77.1.2")) == "udp"
    with pytest.raises(C2Error) as e:
        cla_name("IBR-DTN", table, parse_cla("ltp://10.77.1.2:1113"), "TCPCLv3")
    assert str(e.value) == ("IBR-DTN has no ltp convergence layer (ltp://10.77.1.2:1113): use tcpcl (TCPCLv3) or udp")


@pytest.mark.parametrize("kind", kinds())
def test_every_driver_refuses_a_cla_it_does_not_speak_by_name(kind, tmp_path):
    cls = agent_class(kind)
    assert set(cls.capabilities.clas) <= set(cls.cla_names), "it speaks what it can name"
    lacking = next(s for s in ("mtcp", "http", "ltp", "tcpcl", "udp") if s not in cls.cla_names)
    p = tmp_path / "n.toml"
    p.write_text(
        f'[node]\nid = "n1"\nstorage = "{tmp_path / "n1"}"\n[agent]\nkind = "{kind}"\n'
        f'listen = ["{lacking}://0.0.0.0"]\n'
    )
    p.chmod(0o600)
    with pytest.raises((C2Error, ConfigError), match=lacking):
        cls.for_node(load_node_config(p)).prepare()


@pytest.mark.parametrize("kind", kinds())
def test_what_each_driver_declares_for_the_testbed_is_a_config_it_takes(kind):
    """testbed_clas are CLAs it speaks; testbed_options, written as the testbed writes them, is
    an [agent.<kind>] table its own options() accepts (with and without LTP rates)."""
    cls = agent_class(kind)
    assert set(cls.testbed_clas) <= set(cls.capabilities.clas), cls.testbed_clas
    for rates in ({}, {"r3": 8820}):
        lines = _toml_table(f"agent.{kind}", cls.testbed_options(rates, "sled"))
        table = tomllib.loads("\n".join(lines)).get("agent", {}).get(kind, {})
        cls.options("testbed", table)  # (raises ConfigError naming a field it refuses)


def test_the_testbed_runs_an_agent_on_the_clas_its_driver_declares():
    ion = agent_class("ion").testbed_clas
    assert ion and harness_cla("ion", "tcpcl") == ion[0] and harness_cla("ion", "ltp") == "ltp"
    assert harness_cla("dtn7", "tcpcl") == "tcpcl"  # one that declares none runs on what is asked


def test_two_nodes_with_one_ipn_number_are_refused_naming_both(tmp_path):
    p = tmp_path / "n.toml"
    p.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[agent]\nkind = "ion"\n'
        "[agent.ion]\nnumbers = { gw4 = 7 }\n"
        '[[agent.peers]]\nnode = "gw4"\ncla = "udp://10.77.1.2"\n'
        '[[agent.peers]]\nnode = "r2"\ncla = "udp://10.77.1.3"\n'
    )
    p.chmod(0o600)
    cfg = load_node_config(p)
    assert node_numbers(cfg, lambda n: {"gw1": 1, "r2": 2}.get(n, 3))["gw4"] == 7
    with pytest.raises(ConfigError, match="'gw4' and 'r2'|'r2' and 'gw4'"):
        node_numbers(cfg, lambda n: {"gw1": 1}.get(n, 7))  # r2 derives the number gw4 was given
