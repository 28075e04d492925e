"""Topology files: the shipped ones, routing, --profile, schedules, and errors naming file, field and value."""

import ipaddress
import subprocess
import sys

import pytest

from c2dtn.errors import ConfigError
from c2dtn.topologies.model import builtin_names, load


def test_every_shipped_topology_loads():
    assert set(builtin_names()) == {
        "nps-chain",
        "fmn-2nations",
        "fmn-4nations",
        "fmn-4nations-mixed",
        "platoons",
        "two-box",
    }
    for name in builtin_names():
        t = load(name)
        assert t.nodes and t.links
        for n in t.nodes.values():
            assert n.netns.startswith("c2-")
            assert all(i.name.startswith("c2") and len(i.name) <= 15 for i in n.ifaces)
            assert all(ipaddress.ip_address(i.address).is_private for i in n.ifaces)


def _reaches(t, src, dst_addr):
    """Follow the computed routes hop by hop."""
    target = ipaddress.ip_address(dst_addr)
    cur = src
    for _ in range(32):
        node = t.nodes[cur]
        if any(ipaddress.ip_address(i.address) == target for i in node.ifaces):
            return True
        nets = [(ipaddress.ip_network(f"{i.address}/{i.prefixlen}", strict=False), None) for i in node.ifaces]
        nets += [(ipaddress.ip_network(d), g) for d, g in node.routes]
        match = [(n, g) for n, g in nets if target in n]
        if not match:
            return False
        net, gw = max(match, key=lambda x: x[0].prefixlen)
        hop = dst_addr if gw is None else gw
        cur = next(n.name for n in t.nodes.values() if any(i.address == hop for i in n.ifaces))
    return False


def test_fmn_4nations_structure_and_routes():
    t = load("fmn-4nations")
    units = [n for n in t.nodes if "-u" in n]
    brokers = [n for n in t.nodes if n.endswith("-broker")]
    assert len(units) == 32 and len(brokers) == 4 and len(t.nodes) == 41
    assert all(l.dil for l in t.links.values()) and len(t.links) == 4
    # one emulated data link per nation, shaped on the nation's egress
    for l in t.links.values():
        assert l.profile_ab.name == "cnr-tactical-1" and l.profile_ba.name == "lan"
    for u in units:
        for b in brokers:
            assert _reaches(t, u, t.nodes[b].address), (u, b)
            assert _reaches(t, b, t.nodes[u].address), (b, u)


def test_profile_override_touches_only_dil_links():
    t = load("nps-chain", profile_override="hf-1200")
    assert t.links["r2-r3"].profile_ab.name == "hf-1200" == t.links["r2-r3"].profile_ba.name
    assert t.links["gw1-r2"].profile_ab.name == "lan"
    f = load("fmn-2nations", profile_override="cnr-tactical-2")
    assert {l.profile_ab.name for l in f.links.values()} == {"cnr-tactical-2"}
    assert {l.profile_ba.name for l in f.links.values()} == {"lan"}  # the file gave the reverse its own


def test_schedule_and_inline_profiles(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("""
name = "pair"
[[nodes]]
name = "a"
[[nodes]]
name = "b"
[[links]]
a = "a"
b = "b"
profile = { rate = "64kbit", delay = "30ms" }
[[schedule]]
at = "20s"
link = "a-b"
action = "up"
[[schedule]]
at = "5s"
link = "a-b"
action = "down"
carrier = true
""")
    t = load(str(f))
    assert t.links["a-b"].profile_ab.rate_bps == 64000
    assert [(e.at_s, e.action, e.carrier) for e in t.schedule] == [(5.0, "down", True), (20.0, "up", False)]
    extra = tmp_path / "s.toml"
    extra.write_text('[[schedule]]\nat = "10s"\nlink = "a-b"\naction = "set"\nprofile = "hf-1200"\n')
    t2 = load(str(f), schedule_file=str(extra))
    assert [e.action for e in t2.schedule] == ["down", "set", "up"]


BASE = '[[nodes]]\nname = "a"\n[[nodes]]\nname = "b"\n'


@pytest.mark.parametrize(
    "body, field, value",
    [
        (BASE + '[[links]]\na = "a"\nb = "zz"\n', "links[0].b", "zz"),
        (BASE + '[[links]]\na = "a"\nb = "b"\nprofile = "cnr-tactical-9"\n', "links[0].profile", "cnr-tactical-9"),
        (
            BASE + '[[links]]\na = "a"\nb = "b"\nprofile = { rate = "9.8 kbits" }\n',
            "links[0].profile.rate",
            "9.8 kbits",
        ),
        (BASE + '[[links]]\na = "a"\nb = "b"\nsubnet = "8.8.8.0/24"\n', "links[0].subnet", "8.8.8.0/24"),
        (BASE + '[[links]]\na = "a"\nb = "b"\nsubnet = "10.1.0.0/33"\n', "links[0].subnet", "10.1.0.0/33"),
        (BASE + '[[links]]\na = "a"\nb = "b"\ncolour = "red"\n', "links[0].colour", "red"),
        ('[[nodes]]\nname = "a"\nrole = "tank"\n', "nodes[0].role", "tank"),
        ('[[nodes]]\nname = "a b"\n', "nodes[0].name", "a b"),
        (
            BASE + '[[links]]\na = "a"\nb = "b"\n[[schedule]]\nat = "5"\nlink = "a-b"\naction = "down"\n',
            "schedule[0].at",
            "5",
        ),
        (
            BASE + '[[links]]\na = "a"\nb = "b"\n[[schedule]]\nat = "5s"\nlink = "a-c"\naction = "down"\n',
            "schedule[0].link",
            "a-c",
        ),
        (
            BASE + '[[links]]\na = "a"\nb = "b"\n[[schedule]]\nat = "5s"\nlink = "a-b"\naction = "explode"\n',
            "schedule[0].action",
            "explode",
        ),
        (
            '[addressing]\npool = "10.0.0.0/28"\n' + BASE + '[[links]]\na = "a"\nb = "b"\n',
            "addressing.pool",
            "10.0.0.0/28",
        ),
    ],
)
def test_bad_topology_names_file_field_and_value(tmp_path, body, field, value):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ConfigError) as e:
        load(str(f))
    assert (e.value.source, e.value.field, e.value.value) == (str(f), field, value)
    assert str(f) in str(e.value)


def test_unknown_topology_and_profile_override():
    with pytest.raises(ConfigError, match="no such topology.*nps-chain"):
        load("nps-chian")
    with pytest.raises(ConfigError, match="no such profile"):
        load("nps-chain", profile_override="cnr-tactical-3")


def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(BASE + '[[links]]\na = "a"\nb = "b"\nprofile = "nope"\n')
    r = subprocess.run([sys.executable, "-m", "c2dtn.cli", "topo", "up", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert str(f) in r.stderr and "links[0].profile" in r.stderr and "'nope'" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "c2dtn.cli", "topo", "up", "nps-chain", "--link-backend", "magic"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "magic" in r.stderr


def test_a_topology_names_each_nodes_agent_and_its_relay(tmp_path):
    from c2dtn.errors import ConfigError
    from c2dtn.topologies import testbed
    from c2dtn.topologies.node_configs import topology_agents

    mixed = load("fmn-4nations-mixed")
    assert {n: v.agent for n, v in mixed.nodes.items() if v.agent} == {
        "tacnet": "relay",
        "deu-gw": "dtn7",
        "nor-gw": "ion",
        "prt-gw": "ibrdtn",
        "usa-gw": "dtn7",
    }
    assert topology_agents(testbed.state_of(mixed, "userspace")) == (
        {"deu-gw": "dtn7", "nor-gw": "ion", "prt-gw": "ibrdtn", "usa-gw": "dtn7"},
        "tacnet",
    )
    assert topology_agents(testbed.state_of(load("fmn-4nations"), "userspace")) == ({}, None)
    bad = tmp_path / "t.toml"
    bad.write_text(
        'name = "t"\n[[nodes]]\nname = "a"\nagent = "spindle"\n[[nodes]]\nname = "b"\n[[links]]\na = "a"\nb = "b"\n'
    )
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.agent.*'spindle'.*unknown agent"):
        load(str(bad))


def test_a_nation_moved_to_another_agent_stays_on_the_relays_islands_and_bad_choices_are_named():
    from c2dtn.topologies import testbed
    from c2dtn.topologies.node_configs import override_agents, topology_agents

    st = testbed.state_of(load("fmn-4nations-mixed"), "userspace")
    override_agents(st, {"usa-gw": "hdtn"})  # perf bft --agent usa-gw=hdtn
    assert topology_agents(st) == ({"deu-gw": "dtn7", "nor-gw": "ion", "prt-gw": "ibrdtn", "usa-gw": "hdtn"}, "tacnet")
    with pytest.raises(ConfigError, match=r"'usa-u1': names no node on an island.*those are deu-gw, nor-gw"):
        override_agents(st, {"usa-u1": "hdtn"})
    with pytest.raises(ConfigError, match=r"'usa-gw' = 'spindle': unknown agent; one of dtn7, hdtn"):
        override_agents(st, {"usa-gw": "spindle"})
    with pytest.raises(ConfigError, match=r"fmn-4nations has no relay"):
        override_agents(testbed.state_of(load("fmn-4nations"), "userspace"), {"usa-gw": "hdtn"})


def test_every_node_on_one_agent_by_its_bare_kind_and_groups_over_it(tmp_path):
    """`perf bft --topology fmn-4nations --agent ion`: every node on ION, over UDP as ION's
    live tests run; the nations' group is kept (the nodes send it one bundle per member)."""
    from c2dtn.overlay.config import load_node_config
    from c2dtn.topologies import testbed
    from c2dtn.topologies.node_configs import override_agents
    from c2dtn.topologies.nodes import Nodes

    st = testbed.state_of(load("fmn-4nations"), "userspace")
    override_agents(st, {"*": "ion"})
    gws = ["deu-gw", "nor-gw", "prt-gw", "usa-gw"]
    nodes = Nodes(st, gws + ["tacnet"], gws, tmp_path, groups={"fmn": gws})
    cfgs = {n: load_node_config(p) for n, p in nodes.paths.items()}
    assert {c.agent for c in cfgs.values()} == {"ion"}
    assert {p.cla.scheme for c in cfgs.values() for p in c.peers} == {"udp"}
    assert cfgs["deu-gw"].groups == {"fmn": ("nor-gw", "prt-gw", "usa-gw")}
    with pytest.raises(ConfigError, match=r"'spindle': unknown agent"):
        override_agents(testbed.state_of(load("fmn-4nations"), "userspace"), {"*": "spindle"})
    with pytest.raises(ConfigError, match=r"fmn-4nations-mixed has islands of different agents"):
        override_agents(testbed.state_of(load("fmn-4nations-mixed"), "userspace"), {"*": "ion"})


def test_the_harness_runs_ion_over_udp_or_over_ltp_when_asked(tmp_path):
    from c2dtn.overlay.config import load_node_config
    from c2dtn.topologies import testbed
    from c2dtn.topologies.node_configs import write_configs

    st = testbed.state_of(load("nps-chain"), "userspace")
    for asked, runs in (("tcpcl", "udp"), ("udp", "udp"), ("ltp", "ltp")):
        paths = write_configs(st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / asked, cla=asked, agent="ion")
        cfg = load_node_config(paths["r2"])
        assert {p.cla.scheme for p in cfg.peers} | {s.scheme for s in cfg.listen} == {runs}, asked
        assert cfg.listen[0].port == (1113 if runs == "ltp" else 4556)
        # over LTP, r2 paces what it sends r3 at 90 % of the radio's rate (cnr-tactical-2: 9.8 kbit/s)
        assert cfg.agent_options["rates"] == ({"r3": 1102} if runs == "ltp" else {})


def test_hdtn_over_ltp_in_the_testbed_paces_the_radio_hop_at_90_percent_of_its_rate(tmp_path):
    from c2dtn.overlay.config import load_node_config
    from c2dtn.topologies import testbed
    from c2dtn.topologies.node_configs import write_configs

    st = testbed.state_of(load("nps-chain"), "userspace")
    paths = write_configs(
        st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path, cla="ltp", per_link_cla=False, agent="hdtn"
    )
    r2, gw1 = load_node_config(paths["r2"]), load_node_config(paths["gw1"])
    assert {p.cla.scheme for p in r2.peers} == {"ltp"} and r2.listen[0].port == 1113
    # in bits per second (HDTN's contact rate), the radio hop only (cnr-tactical-2: 9.8 kbit/s)
    assert r2.agent_options["rates_bits"] == {"r3": 8820} and gw1.agent_options["rates_bits"] == {}
