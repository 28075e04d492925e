"""The configuration reference (docs/configuration.md, `c2dtn node config-reference`) covers
every field the loaders accept, each field's example is one they accept, and an unknown
field is refused by name."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from c2dtn.confref import TABLES, load_all, markdown
from c2dtn.errors import ConfigError
from c2dtn.ip_gateway.policy import parse_gateway
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.relay import load_relay_config
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store import Quota

load_all()
KEY = "ab" * 32
PEER = '[[agent.peers]]\nnode = "r2"\ncla = "tcpcl://10.77.1.2:4556"\n'
# examples that name things outside the file: what the test puts in their place, or beside them
NEEDS = {
    ("node", "keys_file"): "",  # the file is written by the test
    ("gateway", "listen"): 'broker = "10.77.9.2:1883"\n',
    ("agent.routes", ""): PEER,
}


def _toml_table(t, field, value: str) -> str:
    """A node config with `field = value` in table t (and what t and its parents require)."""
    head = f"[[{t.path}]]" if t.array else f"[{t.path}]"
    lines = [f"{f.name} = {f.example}" for f in t.fields if f.default is None and f.name != field]
    if field:
        lines.append(f"{field} = {value}")
    kind = (
        t.path.split(".")[1] if t.path.startswith("agent.") and t.path not in ("agent.peers", "agent.routes") else None
    )
    pre = f'[agent]\nkind = "{kind}"\n' if kind else ""
    pre += NEEDS.get((t.path, ""), "")
    return pre + head + "\n" + "\n".join(lines) + "\n" + NEEDS.get((t.path, field), "")


def _node_file(tmp: Path, body: str, node: dict[str, str] | None = None) -> Path:
    """A node config: [node] (id and storage, and `node`'s fields) and then `body`."""
    fields = {"id": '"gw1"', "storage": f'"{tmp / "state"}"', **(node or {})}
    p = tmp / "n.toml"
    p.write_text("[node]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items()) + body)
    return p


def _load(path: Path):
    cfg = load_node_config(path)
    if cfg.gateway is not None:
        parse_gateway(str(path), cfg.gateway)
    return cfg


NODE_FIELDS = [(t, f) for t in TABLES.values() if t.doc == "node" and t.path != "(top level)" for f in t.fields]


def test_every_table_and_field_says_what_it_is_and_what_it_does():
    assert len(TABLES) >= 20
    for t in TABLES.values():
        assert t.text.strip(), t.path
        for f in t.fields + ([t.free] if t.free else []):
            assert f.text.strip() and f.type.strip() and f.example.strip(), (t.path, f.name)
    # every table a top level names is itself described, and every described table is named by its parent
    for doc in ("node", "keys", "relay"):
        paths = {t.path for t in TABLES.values() if t.doc == doc}
        for p in paths - {"(top level)"}:
            parent = p.rsplit(".", 1)
            host = TABLES[f"{doc}:{parent[0]}"] if len(parent) == 2 else TABLES[f"{doc}:(top level)"]
            assert parent[-1] in host.keys or (
                parent[0] == "agent" and parent[-1] in ("dtn7", "ion", "ibrdtn", "hdtn")
            ), p
    assert {f.name for f in dataclasses.fields(SchedulerConfig)} == TABLES["node:scheduler"].keys
    assert {f.name for f in dataclasses.fields(Quota)} == TABLES["node:quota"].keys


def test_the_rendered_reference_has_a_row_for_every_field():
    md = markdown()
    for t in TABLES.values():
        for f in t.fields:
            assert f"| `{f.name}` |" in md, (t.path, f.name)
    assert "**required**" in md and "| `linger_ms` | integer | `0` | ms |" in md


@pytest.mark.parametrize("t,f", NODE_FIELDS, ids=[f"{t.path}.{f.name}" for t, f in NODE_FIELDS])
def test_each_fields_example_is_accepted_and_an_unknown_field_beside_it_is_refused_by_name(tmp_path, t, f):
    value = f.example
    if (t.path, f.name) == ("node", "keys_file"):
        kf = tmp_path / "gw1.keys.toml"
        kf.write_text(f'[keys]\ngw4 = "{KEY}"\n')
        os.chmod(kf, 0o600)
    if f.name in ("password_file", "acl_file"):
        pf = tmp_path / f.name
        pf.write_text("")
        value = f'"{pf}"'
    if f.name == "storage":
        value = f'"{tmp_path / "state"}"'
    if t.path == "node":
        _load(_node_file(tmp_path, "", {f.name: value}))
        bad = _node_file(tmp_path, "", {"no_such_field": "1"})
    else:
        _load(_node_file(tmp_path, _toml_table(t, f.name, value)))
        bad = _node_file(tmp_path, _toml_table(t, "no_such_field", "1"))
    with pytest.raises(ConfigError) as e:
        _load(bad)
    assert "no_such_field" in str(e.value) and "unknown field" in str(e.value)


def test_free_tables_take_their_examples(tmp_path):
    p = _node_file(
        tmp_path,
        f'[keys]\ngw4 = "{KEY}"\nfmn = "{KEY}"\ndeu-gw = "{KEY}"\nnor-gw = "{KEY}"\n'
        '[groups]\nfmn = ["gw1", "deu-gw", "nor-gw"]\n[relays]\nprt-gw = "tacnet"\n'
        '[agent]\nrouting = "epidemic"\n',
    )
    os.chmod(p, 0o600)
    cfg = _load(p)
    assert cfg.keys["gw4"] == bytes.fromhex(KEY) and cfg.groups == {"fmn": ("deu-gw", "nor-gw")}
    assert cfg.relays == {"prt-gw": "tacnet"}


def test_the_relay_tables_examples_are_accepted(tmp_path):
    for bp, kind in (("bpv7", "dtn7"), ("bpv6", "ibrdtn")):  # the example's two islands
        (tmp_path / f"tacnet.{bp}.toml").write_text(
            f'[node]\nid = "tacnet"\nstorage = "{tmp_path / kind}"\n[agent]\nkind = "{kind}"\n'
        )
    ex = {f.name: f.example for f in TABLES["relay:relay"].fields}
    ex["storage"] = f'"{tmp_path / "relay"}"'
    p = tmp_path / "relay.toml"
    p.write_text("[relay]\n" + "".join(f"{k} = {v}\n" for k, v in ex.items()))
    assert load_relay_config(p).id == "tacnet"
    p.write_text(p.read_text() + "bogus = 1\n")
    with pytest.raises(ConfigError, match="relay.bogus"):
        load_relay_config(p)
