"""The agent boundary: drivers chosen by `[agent] kind`, and nothing outside a driver that
knows a particular agent (its daemon, ports or EIDs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from c2dtn.cla_adapters import parse_cla
from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agent import BundleAgent
from c2dtn.overlay.agents import agent_class, kinds, make_agent
from c2dtn.overlay.config import load_node_config

ROOT = Path(__file__).resolve().parent.parent


def _code_words(path: Path) -> set[str]:
    """Identifiers, string and number constants of a module's code (docstrings and comments left out)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
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


@pytest.mark.parametrize(
    "module", ["overlay/supervisor.py", "overlay/node.py", "overlay/core.py", "ip-gateway/gateway.py"]
)
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
    f.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[agent]\nkind = "dtn7"\n'
        '[agent.dtn7]\nweb_port = 3999\nstore = "mem"\n[groups]\nfmn = ["gw1", "gw4"]\n'
        '[keys]\ngw4 = "' + "ab" * 32 + '"\nfmn = "' + "cd" * 32 + '"\n'
    )
    f.write_text(f.read_text().replace('[agent]\nkind = "dtn7"\n', '[agent]\nkind = "dtn7"\nrouting = "epidemic"\n'))
    f.chmod(0o600)  # it holds keys
    cfg = load_node_config(f)
    agent = make_agent(cfg)
    assert agent.base == "http://127.0.0.1:3999" and cfg.agent_options["store"] == "mem"
    launch = agent.prepare()  # the driver writes its files and names the daemon's command line
    assert launch.argv[launch.argv.index("-w") + 1] == "3999" and (cfg.agent_dir / "routes").exists()
    assert agent.endpoints(["fmn"]) == ["c2dtn", "dtn://fmn/~c2dtn"]
    assert agent.destination("fmn", True) == ("fmn", "~c2dtn") and agent.destination("gw4", False) == ("gw4", "c2dtn")
    assert agent.owns(b"/x/dtnd\0-W\0" + str(cfg.agent_dir).encode()) and not agent.owns(b"/x/dtnd\0-W\0/elsewhere")


def _node(tmp_path, kind: str, extra: str = "") -> object:
    f = tmp_path / f"{kind}.toml"
    f.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[agent]\nkind = "{kind}"\n'
        'listen = ["tcpcl://0.0.0.0:4556", "udp://0.0.0.0:4556"]\n'
        '[[agent.peers]]\nnode = "r2"\ncla = "tcpcl://10.77.1.2:4556"\n'
        '[[agent.peers]]\nnode = "r5"\ncla = "udp://10.77.5.2:4600"\n'
        '[[agent.routes]]\nto = "r2"\nvia = "r2"\n[[agent.routes]]\nto = "gw4"\nvia = "r2"\n'
        '[keys]\ngw4 = "' + "ab" * 32 + '"\n' + extra
    )
    f.chmod(0o600)  # it holds keys
    return load_node_config(f)


def test_ion_node_files_follow_the_node_config(tmp_path):
    from c2dtn.overlay.agents.ion import derived_number, ion_files

    cfg = _node(tmp_path, "ion", "[agent.ion]\nnumbers = { gw4 = 4 }\n")
    files = ion_files(cfg, tmp_path / "bin")
    me, r2, r5 = derived_number("gw1"), derived_number("r2"), derived_number("r5")
    assert f"1 {me} " in files["node.ionrc"]
    assert "configFlags 14" in files["node.ionconfig"]  # the SDR in a file: it outlives a SIGKILL
    bp = files["node.bprc"].splitlines()
    assert f"a endpoint ipn:{me}.1 q" in bp
    assert "a induct tcp 0.0.0.0:4556 tcpcli" in bp and "a induct udp 0.0.0.0:4556 udpcli" in bp
    assert "a outduct tcp 10.77.1.2:4556 tcpclo" in bp and "a outduct udp 10.77.5.2:4600 udpclo" in bp
    ipn = files["node.ipnrc"].splitlines()
    assert f"a plan {r2} tcp/10.77.1.2:4556 12500000" in ipn and f"a plan {r5} udp/10.77.5.2:4600 12500000" in ipn
    assert f"a exit 4 4 ipn:{r2}.0" in ipn  # gw4 by the number the table gives, through r2
    assert not [line for line in ipn if line.startswith(f"a exit {r2}")]  # a neighbour needs no exit
    assert make_agent(cfg).eid == f"ipn:{me}.1"


def test_ion_over_ltp_gets_a_span_seat_contacts_and_plan_per_ltp_neighbour(tmp_path):
    from c2dtn.overlay.agents.dtn7 import peer_arg
    from c2dtn.overlay.agents.ion import derived_number, ion_files

    cfg = _node(tmp_path, "ion", "[agent.ion]\nrate_bytes = 1225\nrates = { r2 = 99 }\n")
    cfg.listen.append(parse_cla("ltp://0.0.0.0", "t", "listen"))  # the default port: 1113
    cfg.peers[1].cla = parse_cla("ltp://10.77.5.2:1200", "t", "peer")
    files = ion_files(cfg, tmp_path / "bin")
    me, r5 = derived_number("gw1"), derived_number("r5")
    ltp = files["node.ltprc"].splitlines()
    assert f"a span {r5} 16 16 1024 1 1 'udplso 10.77.5.2:1200'" in ltp  # one bundle per block, at once
    assert "a seat 'udplsi 0.0.0.0:1113'" in ltp and "m screening n" in ltp and ltp[-1] == "s"
    # ION's LTP sends only inside a contact, paced at its rate: both ways, from the start on
    ion = files["node.ionrc"].splitlines()
    assert f"a contact +0 +300000000 {me} {r5} 1225" in ion and f"a contact +0 +300000000 {r5} {me} 1225" in ion
    assert f"a range +0 +300000000 {me} {r5} 0" in ion and ion[-1] == "s"
    bp = files["node.bprc"].splitlines()
    assert "a protocol ltp" in bp and f"a induct ltp {me} ltpcli" in bp and f"a outduct ltp {r5} ltpclo" in bp
    assert "a induct tcp 0.0.0.0:4556 tcpcli" in bp  # the other CLAs as before
    assert f"a plan {r5} ltp/{r5} 1225" in files["node.ipnrc"].splitlines()
    assert f"a plan {derived_number('r2')} tcp/10.77.1.2:4556 99" in files["node.ipnrc"].splitlines()  # its own rate
    with pytest.raises(ConfigError, match="agent.ion.rates.*bytes per second"):
        _node(tmp_path, "ion", '[agent.ion]\nrates = { r2 = "fast" }\n')
    run = files["ion-run.sh"]
    assert "ltpadmin node.ltprc" in run and "ltpadmin ." in run  # started before bpadmin, stopped too
    assert "ltpadmin" not in ion_files(_node(tmp_path, "ion"), tmp_path / "bin")["ion-run.sh"]  # no LTP, no ltpadmin
    with pytest.raises(C2Error, match="dtn7-rs has no ltp convergence layer.*ltp://10.77.5.2:1200"):
        peer_arg(cfg.peers[1].cla, "r5")


def test_ion_bibe_custody_tunnels_routes_through_a_listed_neighbour_and_only_those(tmp_path):
    from c2dtn.overlay.agents.ion import derived_number, ion_files

    cfg = _node(tmp_path, "ion", '[agent.ion]\nbibe = ["r2"]\nbibe_latency_s = 7\n')
    files = ion_files(cfg, tmp_path / "bin")
    r2, r5, gw4 = derived_number("r2"), derived_number("r5"), derived_number("gw4")
    bp = files["node.bprc"].splitlines()
    assert "a protocol bibe" in bp and "a induct bibe * ''" in bp
    assert bp.index("r 'bibeadmin node.biberc'") < bp.index(f"a outduct bibe ipn:{r2}.0 bibeclo") < bp.index("s")
    # r2's plan: its own duct first (BPDUs and bundles for r2 itself), the bibe duct beside it
    plan = bp.index(f"a plan ipn:{r2}.0 12500000")
    assert bp[plan + 1 : plan + 3] == [
        f"a planduct ipn:{r2}.0 tcp 10.77.1.2:4556",
        f"a planduct ipn:{r2}.0 bibe ipn:{r2}.0",
    ]
    # custody requested (qosFlags 64); a BPDU not signalled within 7 + 7 + 2 s goes again
    assert files["node.biberc"].splitlines()[-1] == f"a bcla ipn:{r2}.0 7 7 '' 0 0 1 0 64 0"
    ipn = files["node.ipnrc"].splitlines()
    assert f"a rtovrd 0 {gw4} 0 {r2} bibe/ipn:{r2}.0" in ipn  # gw4 is reached through r2
    assert not [x for x in ipn if x.startswith(f"a plan {r2} ")]  # that plan is bpadmin's now
    assert f"a plan {r5} udp/10.77.5.2:4600 12500000" in ipn  # r5 is not listed: as without BIBE
    assert not [x for x in ipn if "rtovrd" in x and f" {r2} bibe" not in x]
    everyone = ion_files(_node(tmp_path, "ion", '[agent.ion]\nbibe = ["*"]\n'), tmp_path / "bin")
    assert f"a bcla ipn:{r5}.0 5 5 '' 0 0 1 0 64 0" in everyone["node.biberc"]  # "*": every neighbour, 5 s
    # the receiving end: a bcla and a bibeclo (which sends the custody signals), no plan or override
    taker = ion_files(_node(tmp_path, "ion", '[agent.ion]\nbibe_from = ["r5"]\n'), tmp_path / "bin")
    tb = taker["node.bprc"].splitlines()
    assert f"a outduct bibe ipn:{r5}.0 bibeclo" in tb and "a induct bibe * ''" in tb
    assert not [x for x in tb if "plan" in x] and "rtovrd" not in taker["node.ipnrc"]
    assert f"a plan {r5} udp/10.77.5.2:4600 12500000" in taker["node.ipnrc"].splitlines()
    assert f"a bcla ipn:{r5}.0 5 5 '' 0 0 1 0 64 0" in taker["node.biberc"]
    with pytest.raises(ConfigError, match="agent.ion.bibe_from.*'r2'.*also in agent.ion.bibe.*one way"):
        ion_files(_node(tmp_path, "ion", '[agent.ion]\nbibe = ["r2"]\nbibe_from = ["*"]\n'), tmp_path / "bin")
    plain = ion_files(_node(tmp_path, "ion"), tmp_path / "bin")
    assert "node.biberc" not in plain
    assert not [x for x in (plain["node.bprc"] + plain["node.ipnrc"]).splitlines() if "bibe" in x and x[0] != "#"]
    with pytest.raises(ConfigError, match="agent.ion.bibe.*'gw4'.*not a neighbour.*r2, r5"):
        ion_files(_node(tmp_path, "ion", '[agent.ion]\nbibe = ["gw4"]\n'), tmp_path / "bin")
    with pytest.raises(ConfigError, match="agent.ion.bibe.*must list neighbour node ids"):
        _node(tmp_path, "ion", '[agent.ion]\nbibe = "r2"\n')


def test_ion_refuses_what_it_cannot_do_naming_it(tmp_path):
    from c2dtn.errors import ConfigError
    from c2dtn.overlay.agents.ion import ion_files

    cfg = _node(tmp_path, "ion")
    cfg.peers[0].cla = type(cfg.peers[0].cla)("mtcp", "10.77.1.2", 16162)
    with pytest.raises(C2Error, match="ION has no mtcp convergence layer.*mtcp://10.77.1.2:16162"):
        ion_files(cfg, tmp_path)
    with pytest.raises(ConfigError, match="agent.ion.sdr_mb"):
        _node(tmp_path, "ion", "[agent.ion]\nsdr_mb = -3\n")
    with pytest.raises(ConfigError, match="same ipn number"):
        make_agent(_node(tmp_path, "ion", "[agent.ion]\nnumbers = { gw4 = 7, r2 = 7 }\n"))
    grouped = tmp_path / "grouped.toml"
    grouped.write_text(
        f'[node]\nid = "gw1"\nstorage = "{tmp_path / "g"}"\n[agent]\nkind = "ion"\nrouting = "epidemic"\n'
        '[keys]\ngw4 = "' + "ab" * 32 + '"\nfmn = "' + "cd" * 32 + '"\n[groups]\nfmn = ["gw1", "gw4"]\n'
    )
    grouped.chmod(0o600)
    ion = make_agent(load_node_config(grouped))  # no imc: the node sends to each member instead
    assert ion.endpoints(["fmn"]) == ["1"] and ion.destinations("fmn", ("gw4",)) == [("gw4", "1")]


def test_ion_helper_frames_are_read_however_the_pipe_cuts_them():
    from c2dtn.overlay.agent import AgentError
    from c2dtn.overlay.agents.ion import FrameReader, parse_delivery, send_frame

    src = b"ipn:5.1"
    d = b"D" + len(src).to_bytes(2, "big") + src + (1234).to_bytes(8, "big") + b"pay\x00load"
    stream = (
        (len(b"Ripn:9.1")).to_bytes(4, "big")
        + b"Ripn:9.1"
        + len(d).to_bytes(4, "big")
        + d
        + (3).to_bytes(4, "big")
        + b"A\x00x"
    )
    r = FrameReader()
    frames = [f for i in range(len(stream)) for f in r.feed(stream[i : i + 1])]  # one byte at a time
    assert [k for k, _ in frames] == ["R", "D", "A"]
    assert parse_delivery(frames[1][1]) == ("ipn:5.1", 1234, b"pay\x00load")
    assert frames[2][1] == b"\x00x"
    s = send_frame("ipn:4.1", b"xyz", 60)
    assert s[4:5] == b"S" and int.from_bytes(s[:4], "big") == len(s) - 4 and s.endswith(b"ipn:4.1xyz")
    with pytest.raises(AgentError, match="out of step"):
        FrameReader().feed(b"\xff\xff\xff\xffS")
    with pytest.raises(AgentError, match="short delivery"):
        parse_delivery(b"\x00")


def test_ibrdtn_config_names_its_neighbours_routes_and_sqlite_store(tmp_path):
    from c2dtn.overlay.agents.ibrdtn import ibrdtn_conf

    conf = ibrdtn_conf(_node(tmp_path, "ibrdtn", "[agent.ibrdtn]\napi_port = 4999\n"), ["c2-r2", "c2-r5"]).splitlines()
    for line in (
        "local_uri = dtn://gw1",
        "api_port = 4999",
        "storage = sqlite",
        "net_interfaces = cl0 cl1u1 cl1u2",
        "net_cl0_type = tcp",
        "net_cl1u1_type = udp",
        "net_cl1u1_interface = c2-r2",
        "net_cl1u2_interface = c2-r5",
        "static1_uri = dtn://r2",
        "static1_proto = tcp",
        "static2_address = 10.77.5.2",
        "static2_port = 4600",
        "static2_proto = udp",
        "route1 = ^dtn://gw4/.* dtn://r2",
    ):
        assert line in conf, line
    assert len([line for line in conf if line.startswith("route")]) == 1  # r2 is a neighbour


def test_ibrdtn_api_replies_notifications_and_raw_payloads_are_told_apart():
    from c2dtn.overlay.agents.ibrdtn import ApiReader, plain_bundle

    payload = b"line\n602 NOTIFY BUNDLE fake\n\n\x00\xff"  # a payload that looks like API lines
    stream = (
        b"IBR-DTN 1.0.1 API 1.0\n200 SWITCHED TO EXTENDED\n100 PUT BUNDLE PLAIN\n"
        b"602 NOTIFY BUNDLE 123 4 dtn://r3/c2dtn\n200 BUNDLE IN REGISTER\n"
        b"200 PAYLOAD GET\nLength: "
        + str(len(payload)).encode()
        + b"\nEncoding: raw\n\n"
        + payload
        + b"\n\n404 BUNDLE NOT FOUND\n"
    )
    api = ApiReader()
    replies, notes = [], []
    for i in range(len(stream)):
        r, n = api.feed(stream[i : i + 1])
        replies += r
        notes += n
    assert api.greeting.startswith("IBR-DTN")
    assert [(r.code, r.text) for r in replies] == [
        (200, "SWITCHED TO EXTENDED"),
        (100, "PUT BUNDLE PLAIN"),
        (200, "BUNDLE IN REGISTER"),
        (200, "PAYLOAD GET"),
        (404, "BUNDLE NOT FOUND"),
    ]
    assert replies[3].data == payload and notes == ["123 4 dtn://r3/c2dtn"]
    b = plain_bundle("dtn://gw1/c2dtn", "dtn://gw4/c2dtn", b"ab\ncd", 60)
    assert b"Destination: dtn://gw4/c2dtn\n" in b and b"Length: 5\nEncoding: raw\n\nab\ncd\n\n" in b


def test_ibrdtn_bundles_live_a_minute_unless_configured_as_ibrdtn_relays_keep_forwarded_ones(tmp_path):
    """IBR-DTN keeps a forwarded bundle until it expires and sends its whole store again after a
    restart: the node gives its bundles 60 s (configurable), the other agents an hour."""
    import asyncio

    from c2dtn.errors import ConfigError

    assert make_agent(_node(tmp_path, "dtn7")).bundle_lifetime_s == 3600
    assert make_agent(_node(tmp_path, "ibrdtn")).bundle_lifetime_s == 60
    with pytest.raises(ConfigError, match="agent.ibrdtn.bundle_lifetime_s.*'an hour'"):
        _node(tmp_path, "ibrdtn", '[agent.ibrdtn]\nbundle_lifetime_s = "an hour"\n')
    with pytest.raises(ConfigError, match="agent.ibrdtn.bundle_lifetime_s.*3"):
        _node(tmp_path, "ibrdtn", "[agent.ibrdtn]\nbundle_lifetime_s = 3\n")

    async def run() -> list[bytes]:
        got: list[bytes] = []

        async def api(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # IBR-DTN's extended API, as much of it as a send needs
            writer.write(b"IBR-DTN 1.0.1 API 1.0\n")
            while line := await reader.readline():
                if line == b"bundle put plain\n":
                    writer.write(b"100 PUT BUNDLE PLAIN\n")
                    head = await reader.readuntil(b"Encoding: raw\n\n")
                    n = int(head.split(b"Length: ")[-1].split(b"\n")[0])
                    got.append(head + await reader.readexactly(n + 2))
                    writer.write(b"200 BUNDLE IN REGISTER\n")
                else:
                    writer.write(b"200 OK\n")
            writer.close()

        server = await asyncio.start_server(api, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for extra in ("", "bundle_lifetime_s = 300\n"):
            agent = make_agent(_node(tmp_path, "ibrdtn", f"[agent.ibrdtn]\napi_port = {port}\n{extra}"))
            await agent.send("gw4", "c2dtn", b"x", lifetime_s=agent.bundle_lifetime_s)
            await agent.stop()
        server.close()
        return got

    sent = asyncio.run(run())
    assert [b.split(b"Lifetime: ")[1].split(b"\n")[0] for b in sent] == [b"60", b"300"]


# -- dtn7-rs with ipn names (decision 0021) ----------------------------------------------------

IPN = '[agent.dtn7]\nnaming = "ipn"\nnumbers = { gw1 = 1, r2 = 2, r5 = 5, gw4 = 4 }\n'


def test_dtn7_with_ipn_names_numbers_its_node_peers_routes_and_endpoints(tmp_path):
    from c2dtn.overlay.agents import dtn7

    cfg = _node(tmp_path, "dtn7", IPN)
    argv = dtn7.dtnd_argv(cfg, "dtnd")
    assert argv[argv.index("-n") + 1] == "1" and argv[argv.index("-e") + 1] == "1"
    assert "tcp://10.77.1.2:4556/2" in argv and "udp://10.77.5.2:4600/5" in argv
    routes = dtn7.dtnd_routes(cfg).splitlines()[1:]
    assert [r.split(" ", 1)[1] for r in routes] == ["** ipn:2.* ipn:2.0", "** ipn:4.* ipn:2.0"]
    agent = make_agent(cfg)
    assert agent.endpoint == "1" and agent.eid("gw4", agent.endpoint) == "ipn:4.1"
    assert agent.destination("fmn", True) == ("fmn", "~c2dtn")
    assert agent.eid("fmn", "~c2dtn") == "dtn://fmn/~c2dtn"  # a group keeps its dtn endpoint
    # a bare client's named endpoint: an ipn service of the node, the same number at both ends
    bench = dtn7.service("bench")
    assert agent.eid("gw4", "bench") == f"ipn:4.{bench}" and agent._local("bench") == bench and int(bench) > 1
    assert agent.endpoints(["fmn"]) == ["1", "dtn://fmn/~c2dtn"]


def test_dtn7_with_ipn_names_tells_a_delivery_s_source_by_its_number(tmp_path):
    import cbor2

    from c2dtn.overlay.agents import dtn7

    agent = make_agent(_node(tmp_path, "dtn7", IPN))
    for eid, node in [
        ("ipn:4.0", "gw4"),
        ("ipn:04.1", "gw4"),
        ("ipn:77.0", "ipn:77"),  # a number no config names: never taken for a node
        ("ipn:٤.0", "ipn:٤.0"),  # (an Arabic-Indic four)
        ("ipn:" + "9" * 30 + ".0", "ipn:" + "9" * 30 + ".0"),
        ("dtn://gw4/x", "gw4"),
    ]:
        assert dtn7.eid_node(eid, agent.names) == node, eid
    primary = [7, 0, 0, [2, [1, 1]], [2, [4, 0]], [2, [4, 0]], [0, 0], 60_000]
    raw = cbor2.dumps([primary, [1, 1, 0, 0, b"payload"]])
    assert dtn7.bundle_payload(raw, agent.names) == ("gw4", b"payload")
    primary[4] = [2, [True, 0]]
    assert dtn7.bundle_payload(cbor2.dumps([primary, [1, 1, 0, 0, b"p"]]), agent.names)[0] == "?"


@pytest.mark.parametrize(
    "extra, field, value",
    [
        ('[agent.dtn7]\nnaming = "x500"\n', "agent.dtn7.naming", "x500"),
        ('[agent.dtn7]\nnaming = "ipn"\nnumber = true\n', "agent.dtn7.number", "True"),
        ('[agent.dtn7]\nnaming = "ipn"\nnumbers = { gw4 = 0 }\n', "agent.dtn7.numbers.gw4", "0"),
        ('[agent.dtn7]\nnaming = "ipn"\nnumbers = "gw4=4"\n', "agent.dtn7.numbers", "gw4=4"),
    ],
)
def test_dtn7_naming_settings_are_checked_naming_the_bad_value(tmp_path, extra, field, value):
    with pytest.raises(ConfigError) as e:
        _node(tmp_path, "dtn7", extra)
    assert field in str(e.value) and value in str(e.value)


@pytest.mark.parametrize(
    "extra, field",
    [
        ("[agent.dtn7]\nnumbers = { gw4 = 4 }\n", "agent.dtn7.numbers"),  # numbers with dtn names
        ('[agent.dtn7]\nnaming = "ipn"\nnumber = 3\nnumbers = { gw1 = 6 }\n', "agent.dtn7.number"),
        ('[agent.dtn7]\nnaming = "ipn"\nnumbers = { gw4 = 2 }\n', "agent.dtn7.numbers"),  # r2 has 2 too
        ('[agent.dtn7]\nnaming = "ipn"\nnumbers = { "r 2" = 9 }\n', "agent.dtn7.numbers"),
    ],
)
def test_dtn7_numbers_that_would_misroute_are_refused_when_the_agent_is_made(tmp_path, extra, field):
    cfg = _node(tmp_path, "dtn7", extra.replace("gw4 = 2", "gw4 = 2, r2 = 2"))
    with pytest.raises(ConfigError, match=field):
        make_agent(cfg)


def test_dtn7_numbers_every_node_its_config_names_but_not_its_groups(tmp_path):
    from types import SimpleNamespace

    from c2dtn.cla_adapters.numbering import node_numbers
    from c2dtn.overlay.agents import dtn7

    cfg = _node(tmp_path, "dtn7", IPN.replace("gw4 = 4 }", "gw4 = 4, tacnet = 3 }") + '[relays]\nprt-gw = "tacnet"\n')
    nums = dtn7.numbering(cfg)
    assert nums["tacnet"] == 3 and nums["prt-gw"] == dtn7.derived_number("prt-gw")  # a relay's target too
    grouped = SimpleNamespace(**{**vars(cfg), "keys": {**cfg.keys, "fmn": b"k" * 32}, "groups": {"fmn": ("gw4",)}})
    assert "fmn" not in node_numbers(grouped, dtn7.derived_number)  # a group has no node number


def test_the_testbed_names_dtn7_nodes_by_small_numbers():
    from c2dtn.overlay.agents import dtn7

    o = dtn7.Dtn7Agent.testbed_options({}, "sled", {"gw1": 1, "r2": 2})
    assert o["naming"] == "ipn" and o["numbers"] == {"gw1": 1, "r2": 2}
    assert "naming" not in dtn7.Dtn7Agent.testbed_options({}, "sled")


def test_dtn7_bundles_are_made_by_the_driver_with_no_block_dtnd_would_add_for_nothing(tmp_path):
    """Decision 0022: the driver hands dtnd whole bundles (/insert): a CRC-16 on the primary
    block, no status reports asked for (report-to dtn:none), no hop count block; the source
    the endpoint the client registered first; a creation timestamp that never repeats within
    the process, whatever the clock does, and that follows the clock."""
    import cbor2

    from c2dtn.cla_adapters import bpv7

    agent = make_agent(_node(tmp_path, "dtn7", IPN))
    t0 = bpv7.DTN_EPOCH_MS
    assert agent.bundle("gw4", agent.endpoint, b"x", 60, now_ms=t0 + 5_000) is None  # nothing registered: /send
    agent._source = agent.eid("gw1", agent.endpoint)  # (what register() sets for the node's own endpoint)
    raw = agent.bundle("gw4", agent.endpoint, b"order 7", 90.5, now_ms=t0 + 5_000)
    assert raw[:1] == b"\x9f" and raw[-1:] == b"\xff"  # an indefinite array, as RFC 9171 4.1 wants
    blocks = cbor2.loads(raw)
    primary = blocks[0]
    assert len(blocks) == 2 and blocks[1] == [bpv7.PAYLOAD, 1, 0, 0, b"order 7"]
    assert primary[:8] == [7, bpv7.MUST_NOT_FRAGMENT, bpv7.CRC16, [2, [4, 1]], [2, [1, 1]], [1, 0], [5_000, 0], 90_000]
    crc = primary[8]
    primary[8] = b"\0\0"
    assert crc == bpv7.crc16_x25(cbor2.dumps(primary)).to_bytes(2, "big")
    b = bpv7.decode(raw)
    assert (b.src, b.dst, b.payload, b.lifetime_ms) == ((1, 1), (4, 1), b"order 7", 90_000)
    # the same millisecond, then the clock set back and forward: the ids never repeat, the
    # times follow the clock (a lifetime counts from it)
    times = (5_000, 4_000, 4_000, 4_500, 5_000, 6_000)
    stamps = [cbor2.loads(agent.bundle("gw4", "1", b"", 60, now_ms=t0 + t))[0][6] for t in times]
    assert stamps == [[5_000, 1], [4_000, 2], [4_000, 3], [4_500, 4], [5_000, 5], [6_000, 0]]
    assert agent.bundle("gw4", "1", b"", 60, now_ms=t0 - 1) is None  # a clock before 2000: dtnd makes it
    # a client beside the node registers its own endpoint first: another source, other ids
    bench = make_agent(_node(tmp_path, "dtn7", IPN))
    bench._source = bench.eid("gw1", "bench")
    assert cbor2.loads(bench.bundle("gw4", "bench", b"", 60, now_ms=t0 + 5_000))[0][4] != primary[4]
    # dtn names and a group's endpoint
    named = make_agent(_node(tmp_path, "dtn7"))
    named._source = named.eid("gw1", named.endpoint)
    p = cbor2.loads(named.bundle("fmn", "~c2dtn", b"x", 60, now_ms=t0 + 1))[0]
    assert p[3:5] == [[1, "//fmn/~c2dtn"], [1, "//gw1/c2dtn"]]


@pytest.mark.parametrize(
    "text", ["ipn:4", "ipn:4.x", "ipn:-1.0", "ipn:99999999999999999999.1", "dtn://", "dtn://a b", "x:y"]
)
def test_an_endpoint_the_bundle_encoder_cannot_write_is_named(text):
    from c2dtn.cla_adapters import bpv7

    with pytest.raises(bpv7.BundleError, match="not an ipn:N.S"):
        bpv7.eid_value(text)


def test_the_crc16_is_x25():
    from c2dtn.cla_adapters import bpv7

    assert bpv7.crc16_x25(b"123456789") == 0x906E  # the catalogue's check value of CRC-16/X-25
