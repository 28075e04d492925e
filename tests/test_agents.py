"""The agent boundary: drivers chosen by `[agent] kind`, and nothing outside a driver that
knows a particular agent (its daemon, ports or EIDs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from c2dtn.errors import C2Error
from c2dtn.overlay.agent import BundleAgent
from c2dtn.overlay.agents import agent_class, kinds, make_agent
from c2dtn.overlay.config import load_node_config

ROOT = Path(__file__).resolve().parent.parent


def _code_words(path: Path) -> set[str]:
    """Identifiers, string and number constants of a module's code (docstrings and comments left out)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and id(n) not in docs and isinstance(n.value, (str, int)):
            out.add(str(n.value))
        elif isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, (ast.alias,)):
            out.add(n.name)
    return out


@pytest.mark.parametrize("module", ["overlay/supervisor.py", "overlay/node.py", "overlay/core.py",
                                    "ip-gateway/gateway.py"])
def test_only_a_driver_knows_its_agent(module):
    words = _code_words(ROOT / module)
    bad = sorted(w for w in words if any(x in w.lower() for x in ("dtnd", "dtn7", "dtn://")) or w == "3000")
    assert not bad, f"{module} names an agent's particulars: {bad}"


def test_cla_specs_are_translated_by_the_drivers_not_the_specs():
    from c2dtn.cla_adapters import ClaSpec

    assert not [a for a in dir(ClaSpec) if "dtn7" in a or "ion" in a.split("_")]


def test_drivers_are_chosen_by_kind_and_say_what_they_can_do(tmp_path):
    assert "dtn7" in kinds()
    cls = agent_class("dtn7")
    assert issubclass(cls, BundleAgent) and cls.name == "dtn7"
    assert cls.capabilities.bp_version == 7 and cls.capabilities.groups and cls.capabilities.own_custody
    with pytest.raises(C2Error, match="no driver for agent 'tape'.*dtn7"):
        agent_class("tape")
    f = tmp_path / "n.toml"
    f.write_text(f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[agent]\nkind = "dtn7"\n'
                 '[agent.dtn7]\nweb_port = 3999\nstore = "mem"\n[groups]\nfmn = ["gw1", "gw4"]\n'
                 '[keys]\ngw4 = "' + "ab" * 32 + '"\nfmn = "' + "cd" * 32 + '"\n')
    f.write_text(f.read_text().replace('[agent]\nkind = "dtn7"\n', '[agent]\nkind = "dtn7"\nrouting = "epidemic"\n'))
    cfg = load_node_config(f)
    agent = make_agent(cfg)
    assert agent.base == "http://127.0.0.1:3999" and cfg.agent_options["store"] == "mem"
    launch = agent.prepare()  # the driver writes its files and names the daemon's command line
    assert launch.argv[launch.argv.index("-w") + 1] == "3999" and (cfg.agent_dir / "routes").exists()
    assert agent.endpoints(["fmn"]) == ["c2dtn", "dtn://fmn/~c2dtn"]
    assert agent.destination("fmn", True) == ("fmn", "~c2dtn") and agent.destination("gw4", False) == ("gw4", "c2dtn")
    assert agent.owns(b"/x/dtnd\0-W\0" + str(cfg.agent_dir).encode()) and not agent.owns(b"/x/dtnd\0-W\0/elsewhere")
