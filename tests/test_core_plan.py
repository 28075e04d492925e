"""The CORE session a topology becomes (topologies/core_plan.py), single-host and distributed:
what CORE's daemon is asked for and what each server would run, without a daemon."""

from __future__ import annotations

import fnmatch

import pytest

from c2dtn.errors import ConfigError
from c2dtn.topologies import core_plan
from c2dtn.topologies.model import load
from c2dtn.topologies.profiles import GilbertElliott, Profile


def test_each_emulated_link_gets_an_emulator_node_between_its_ends():
    topo = load("nps-chain", profile_override="cnr-tactical-2")
    plan = core_plan.session_plan(topo, "userspace")
    names = [n["name"] for n in plan["nodes"]]
    emulated = [l for l in topo.links.values() if l.emulate]
    assert names[: len(topo.nodes)] == list(topo.nodes)
    assert plan["emulators"] == {l.name: f"c2e-{l.name}" for l in emulated}
    for link in emulated:
        e = plan["emulators"][link.name]
        hops = [
            (l["node1"], l["node2"], l["iface1"]["name"], l["iface2"]["name"])
            for l in plan["links"]
            if e in (l["node1"], l["node2"])
        ]
        assert hops == [(link.a, e, link.a_iface.name, "c2a"), (e, link.b, "c2b", link.b_iface.name)]
    plain = [l for l in topo.links.values() if not l.emulate]
    for link in plain:  # a plain veth pair stays one CORE link, no emulator
        assert [(l["node1"], l["node2"]) for l in plan["links"] if l["link"] == link.name] == [(link.a, link.b)]
    # addresses are the topology's, MACs unique, ids 1..n
    by_name = {(l["node1"], l["iface1"]["name"]): l["iface1"] for l in plan["links"]}
    assert by_name[("r2", "c2-r3")]["ip4"] == topo.nodes["r2"].ifaces[1].address
    macs = [i["mac"] for l in plan["links"] for i in (l["iface1"], l["iface2"]) if "mac" in i]
    assert len(macs) == len(set(macs)) == 2 * len(plan["links"])
    assert [n["id"] for n in plan["nodes"]] == list(range(1, len(plan["nodes"]) + 1))
    assert plan["crossing"] == []


def test_node_commands_set_static_neighbours_to_the_peer_mac_and_routes():
    topo = load("nps-chain", profile_override="cnr-tactical-2")
    plan = core_plan.session_plan(topo, "userspace")
    cmds = core_plan.node_commands(topo, plan)
    r3_mac = next(l["iface2"]["mac"] for l in plan["links"] if l["node2"] == "r3" and l["link"] == "r2-r3")
    r2 = [" ".join(c) for c in cmds["c2-r2"]]
    r3_addr = topo.nodes["r3"].ifaces[0].address
    assert f"ip neigh replace {r3_addr} lladdr {r3_mac} dev c2-r3 nud permanent" in r2
    for dst, gw in topo.nodes["r2"].routes:
        assert f"ip route replace {dst} via {gw}" in r2
    emu = [" ".join(c) for c in cmds["c2e-r2-r3"]]
    assert any(c.startswith("ethtool -K c2a tx off") for c in emu)
    assert any("promisc on" in c for c in emu)
    assert "net.ipv4.ip_forward=1" in cmds["c2-r2"][0]


def test_netem_mode_puts_the_profile_in_core_link_options_each_way():
    topo = load("nps-chain", profile_override="cnr-tactical-2")
    plan = core_plan.session_plan(topo, "netem")
    assert plan["emulators"] == {}
    (radio,) = [l for l in plan["links"] if l["link"] == "r2-r3"]
    assert radio["options_ab"] == {
        "bandwidth": 9800,
        "delay": 100_000,
        "jitter": 0,
        "loss": 10.0,
        "dup": 0,
        "buffer": topo.links["r2-r3"].profile_ab.queue_packets,
        "unidirectional": True,
    }


def test_a_profile_core_options_cannot_express_is_refused_naming_what():
    burst = Profile(name="burst", rate_bps=9600, gilbert_elliott=GilbertElliott(p=0.01, r=0.3))
    with pytest.raises(ConfigError, match="gilbert_elliott"):
        core_plan.link_options(burst)
    with pytest.raises(ConfigError, match="link_setup"):
        core_plan.link_options(Profile(name="hf", link_setup_s=2.0, link_idle_s=5.0))


def _nation_servers(tmp_path):
    f = tmp_path / "servers.toml"
    f.write_text(
        'controller = "192.0.2.1"\n'
        + "".join(
            f'[[server]]\nname = "core-{n}"\nhost = "192.0.2.{i + 10}"\nnodes = ["{n}-*"]\n\n'
            for i, n in enumerate(("deu", "nor", "prt", "usa"))
        )
    )
    return core_plan.load_servers(f)


def test_fmn_4nations_one_nation_per_server_what_each_server_runs(tmp_path):
    topo = load("fmn-4nations")
    servers = _nation_servers(tmp_path)
    plan = core_plan.session_plan(topo, "userspace", servers)
    per = core_plan.per_server(plan)
    assert set(per) == {"", "core-deu", "core-nor", "core-prt", "core-usa"}
    for s in servers.servers:
        nation = s.name.removeprefix("core-")
        mine = per[s.name]["nodes"]
        # every node of the nation, and its LAN's switch, on its server; nothing else
        assert {n for n in topo.nodes if fnmatch.fnmatchcase(n, f"{nation}-*")} <= set(mine)
        assert all(n.startswith((nation + "-", "c2l-")) for n in mine)
        # what crosses between hosts: the nation's end of its emulated radio link, nothing else
        assert len(per[s.name]["crossing"]) == 1 and "c2e-" in per[s.name]["crossing"][0]
    # the emulators (so each radio link is emulated on one server) and the shared tactical
    # router stay on the controlling host
    assert set(plan["emulators"].values()) <= set(per[""]["nodes"])
    assert "tacnet" in per[""]["nodes"]
    assert len(plan["crossing"]) == 4


def test_servers_file_errors_name_the_bad_value(tmp_path):
    topo = load("fmn-4nations")
    f = tmp_path / "s.toml"
    head = 'controller = "192.0.2.1"\n'

    def refused(text: str, match: str, placed: bool = False) -> None:
        f.write_text(text)
        with pytest.raises(ConfigError, match=match) as e:
            core_plan.place(topo, core_plan.load_servers(f)) if placed else core_plan.load_servers(f)
        assert str(f) in str(e.value)

    refused(head + '[[server]]\nname = "a"\nhost = "192.0.2.2"\nnodes = ["xyz-*"]\n', "xyz-\\*", placed=True)
    two = '[[server]]\nname = "a"\nhost = "192.0.2.2"\nnodes = ["deu-*"]\n[[server]]\nname = "b"\nhost = "192.0.2.3"\n'
    refused(head + two + 'nodes = ["deu-u1"]\n', "second server", placed=True)
    # a host is an address: no option, no shell, no name CORE cannot make a tunnel to
    for bad in ("-oProxyCommand=x", "10.0.0.1;touch${IFS}/x", "$(id)", "core-deu.lab"):
        refused(head + f'[[server]]\nname = "a"\nhost = "{bad}"\nnodes = ["deu-*"]\n', "host.*IP address")
    refused(head + '[[server]]\nname = "a"\nhost = "192.0.2.2"\nnodes = ["deu-*"]\nport = 1\n', "port")
    refused('[[server]]\nname = "a"\nhost = "192.0.2.2"\nnodes = ["deu-*"]\n', "controller")
    refused(head + '[[server]]\nname = "a"\nhost = "192.0.2.1"\nnodes = ["deu-*"]\n', "second server at this address")


def test_a_node_named_as_an_emulator_node_is_refused(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text(
        'name = "clash"\n[[nodes]]\nname = "a"\n[[nodes]]\nname = "b"\n[[nodes]]\nname = "c2e-a-b"\n'
        '[[links]]\na = "a"\nb = "b"\nprofile = "cnr-tactical-2"\n[[links]]\na = "b"\nb = "c2e-a-b"\n'
    )
    with pytest.raises(ConfigError, match="c2e-a-b"):
        core_plan.session_plan(load(str(f)), "userspace")


def test_asymmetric_profiles_each_direction_on_its_sending_interface():
    topo = load("fmn-4nations")  # the nation -> tacnet direction shaped, tacnet -> nation plain
    plan = core_plan.session_plan(topo, "netem")
    link = next(l for l in topo.links.values() if l.emulate and l.profile_ab != l.profile_ba)
    (entry,) = [l for l in plan["links"] if l["link"] == link.name]
    assert (entry["node1"], entry["node2"]) == (link.a, link.b)
    assert entry["options_ab"]["bandwidth"] == int(link.profile_ab.rate_bps or 0)
    assert entry["options_ba"]["bandwidth"] == int(link.profile_ba.rate_bps or 0)
    assert entry["options_ab"] != entry["options_ba"]


def test_duplication_core_cannot_take_is_refused():
    with pytest.raises(ConfigError, match="duplicate.*0.001"):
        core_plan.link_options(Profile(name="dup", duplicate=0.001))
    assert core_plan.link_options(Profile(name="dup", duplicate=0.02))["dup"] == 2
