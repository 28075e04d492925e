"""Node configurations: parsing, errors naming file/field/value, CLA translation, and
configs written for a topology (peers, routes, keys, per-link CLA)."""

import pytest

from c2dtn.cla_adapters import parse_cla
from c2dtn.errors import ConfigError
from c2dtn.overlay.agents.dtn7 import dtnd_argv, dtnd_routes, listen_arg, peer_arg
from c2dtn.overlay.config import load_node_config
from c2dtn.perf import radio_sim
from c2dtn.topologies import model, testbed
from c2dtn.topologies.node_configs import write_configs


def test_cla_specs_and_dtn7_translation():
    s = parse_cla("tcpcl://10.77.1.2")
    assert (s.scheme, s.host, s.port) == ("tcpcl", "10.77.1.2", 4556)
    assert peer_arg(s, "r2") == "tcp://10.77.1.2:4556/r2"
    assert listen_arg(parse_cla("udp://0.0.0.0:5000")) == "udp:port=5000:bind=0.0.0.0"
    assert parse_cla("mtcp://10.0.0.1").port == 16162
    for bad, why in [
        ("bundle://10.0.0.1", "unknown convergence layer"),
        ("tcpcl://", "no address"),
        ("tcpcl://radio-1:4556", "not an IP address"),
        ("tcpcl://10.0.0.1:99999", "bad port"),
        (42, "a CLA spec is a string"),
    ]:
        with pytest.raises(ConfigError, match=why):
            parse_cla(bad, "n.toml", "agent.listen[0]")


def _write(tmp_path, text):
    f = tmp_path / "node.toml"
    f.write_text(text)
    f.chmod(0o600)  # some hold keys
    return f


GOOD = """
[node]
id = "gw1"
storage = "/tmp/c2-test-gw1"
[agent]
listen = ["tcpcl://0.0.0.0:4556", "udp://0.0.0.0:4556"]
[[agent.peers]]
node = "r2"
cla = "tcpcl://10.77.1.2:4556"
[[agent.routes]]
to = "*"
via = "r2"
[keys]
gw4 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
[scheduler]
aggregate_bytes = 1200
"""


def test_node_config_to_dtnd_command_line(tmp_path):
    cfg = load_node_config(_write(tmp_path, GOOD))
    assert cfg.keys["gw4"] == bytes.fromhex("00112233445566778899aabbccddeeff" * 2)
    assert cfg.scheduler.aggregate_bytes == 1200
    argv = dtnd_argv(cfg, "/x/dtnd")
    assert argv[:3] == ["/x/dtnd", "-n", "gw1"]
    assert ["-D", "sled"] == argv[argv.index("-D") : argv.index("-D") + 2]
    assert "tcp:port=4556:bind=0.0.0.0" in argv and "udp:port=4556:bind=0.0.0.0" in argv
    assert "tcp://10.77.1.2:4556/r2" in argv
    assert dtnd_routes(cfg).splitlines()[1] == "1 ** ** dtn://r2/"


def test_scheduler_settings_whose_zero_means_none_take_zero(tmp_path):
    """README: linger_ms 0 is no linger, ack_delay_ms 0 acks at once, queue_target_ms 0 no rate
    model (the window grows as TCP Reno's)."""
    f = _write(tmp_path, GOOD.replace("aggregate_bytes = 1200", "linger_ms = 0\nack_delay_ms = 0\nqueue_target_ms = 0"))
    sch = load_node_config(f).scheduler
    assert (sch.linger_ms, sch.ack_delay_ms, sch.queue_target_ms) == (0, 0, 0)


def test_the_retired_queue_keep_setting_is_refused_by_name(tmp_path):
    """queue_keep_ms went with the queue cut it tuned (decision 0011): a file that still sets it
    is refused with the field named, not read as something else."""
    f = _write(tmp_path, GOOD.replace("aggregate_bytes = 1200", "queue_keep_ms = 500"))
    with pytest.raises(ConfigError, match=r"scheduler\.queue_keep_ms' = 500: no longer used.*remove it"):
        load_node_config(f)


@pytest.mark.parametrize(
    "change, field, value",
    [
        (('id = "gw1"', 'id = "gw 1"'), "node.id", "gw 1"),
        (('id = "gw1"', 'id = "gw1\\n"'), "node.id", "gw1\n"),  # a name that the container would refuse
        (("[agent]", '[agent]\nstore = "tape"'), "agent.store", "tape"),
        (("[keys]", "[agent.dtn7]\nweb_port = 70000\n[keys]"), "agent.dtn7.web_port", 70000),
        (("[keys]", '[agent.dtn7]\ncolour = "red"\n[keys]'), "agent.dtn7.colour", "red"),
        (("[agent]", '[agent]\nkind = "spindle"'), "agent.kind", "spindle"),
        (('via = "r2"', 'via = "r9"'), "agent.routes[0].via", "r9"),
        (('cla = "tcpcl://10.77.1.2:4556"', 'cla = "tcp://10.77.1.2"'), "agent.peers[0].cla", "tcp://10.77.1.2"),
        (("aggregate_bytes = 1200", "aggregate_bytes = -5"), "scheduler.aggregate_bytes", -5),
        (("aggregate_bytes = 1200", "agregate_bytes = 5"), "scheduler.agregate_bytes", 5),
        (("aggregate_bytes = 1200", "aggregate_bytes = 0"), "scheduler.aggregate_bytes", 0),
        # a bundle that big would be refused by its receiver (MAX_CONTAINER_BYTES)
        (("aggregate_bytes = 1200", "aggregate_large_bytes = 16777216"), "scheduler.aggregate_large_bytes", 16777216),
        (('gw4 = "0011', 'gw4 = "zz11'), "keys.gw4", "<hidden>"),
    ],
)
def test_bad_node_config_names_file_field_and_value(tmp_path, change, field, value):
    f = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(ConfigError) as e:
        load_node_config(f)
    assert (e.value.source, e.value.field, e.value.value) == (str(f), field, value)


def test_configs_for_nps_chain_with_a_udphc_radio_link(tmp_path):
    st = testbed.state_of(model.load("nps-chain"), "userspace")  # the shipped r2=r3 link is cla = "udphc"
    paths = write_configs(st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "nodes")
    gw1, r2, gw4 = (load_node_config(paths[n]) for n in ("gw1", "r2", "gw4"))
    assert [(p.node, str(p.cla)) for p in gw1.peers] == [("r2", "tcpcl://10.77.1.2:4556")]
    assert [(p.node, str(p.cla)) for p in r2.peers] == [
        ("gw1", "tcpcl://10.77.1.1:4556"),
        ("r3", "udphc://10.77.2.2:4560"),
    ]
    assert sorted(c.scheme for c in r2.listen) == ["tcpcl", "udphc"]
    assert [(r.to, r.via) for r in gw1.routes] == [("r2", "r2"), ("r3", "r2"), ("gw4", "r2")]
    assert gw1.keys["gw4"] == gw4.keys["gw1"] and len(gw1.keys["gw4"]) == 32
    assert gw1.overlay and not r2.overlay and r2.keys == {}
    assert gw1.scheduler.aggregate_bytes == 1200  # bundles must fit one datagram on the udp hop
    # ... and on the radio, the settings perf radio-sim runs with (decision 0013)
    s, r = gw1.scheduler, radio_sim.RADIO_CFG
    assert (s.aggregate_bytes, s.linger_ms, s.ack_delay_ms) == (r.aggregate_bytes, r.linger_ms, r.ack_delay_ms)
    assert gw1.netns == "c2-gw1"
    tcp_only = write_configs(st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "tcp", cla="tcpcl")
    assert load_node_config(tcp_only["gw1"]).scheduler.aggregate_bytes == 1200  # the radio link stays udphc
    lan = testbed.state_of(model.load("nps-chain"), "userspace")
    for ls in lan["links"].values():
        ls["cla"], ls["profile_ab"], ls["profile_ba"] = None, {"rate_bps": None}, {"rate_bps": None}
    on_lan = write_configs(lan, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "lan")
    sch = load_node_config(on_lan["gw1"]).scheduler  # no radio anywhere: big bundles, and big envelopes share them
    assert (sch.aggregate_bytes, sch.aggregate_large_bytes) == (65536, 1 << 20)
    rated_tcp = write_configs(
        st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "rtcp", cla="tcpcl", per_link_cla=False
    )  # tcpcl everywhere, but a 9.8 kbit/s hop on the way
    sch = load_node_config(rated_tcp["gw1"]).scheduler
    assert (sch.aggregate_bytes, sch.aggregate_large_bytes) == (16 * 1024, 0)  # the defaults: one big envelope a bundle
    tuned = write_configs(
        st,
        ["gw1", "r2", "r3", "gw4"],
        ["gw1", "gw4"],
        tmp_path / "tuned",
        scheduler={"aggregate_bytes": 60000, "init_window": 65536},
    )
    sch = load_node_config(tuned["gw1"]).scheduler  # given settings win, the radio defaults stay for the rest
    assert (sch.aggregate_bytes, sch.init_window, sch.linger_ms) == (60000, 65536, radio_sim.RADIO_CFG.linger_ms)


def test_configs_for_fmn_4nations_gateways_meet_at_tacnet(tmp_path):
    st = testbed.state_of(model.load("fmn-4nations"), "userspace")
    gws = ["deu-gw", "nor-gw", "prt-gw", "usa-gw"]
    paths = write_configs(st, gws + ["tacnet"], gws, tmp_path / "n")
    deu = load_node_config(paths["deu-gw"])
    assert [p.node for p in deu.peers] == ["tacnet"]
    assert {r.to: r.via for r in deu.routes} == {
        "nor-gw": "tacnet",
        "prt-gw": "tacnet",
        "usa-gw": "tacnet",
        "tacnet": "tacnet",
    }
    assert sorted(deu.keys) == ["nor-gw", "prt-gw", "usa-gw"]
    with pytest.raises(ConfigError, match="overlay nodes must also run a BPA"):
        write_configs(st, ["tacnet"], ["deu-gw"], tmp_path / "m")


def test_udp_on_a_lan_gets_one_datagram_bundles_but_no_radio_linger(tmp_path):
    lan = testbed.state_of(model.load("nps-chain"), "userspace")
    for ls in lan["links"].values():
        ls["profile_ab"], ls["profile_ba"] = {"rate_bps": None}, {"rate_bps": None}
    sch = load_node_config(
        write_configs(lan, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "l", cla="udp", per_link_cla=False)[
            "gw1"
        ]
    ).scheduler
    assert (sch.aggregate_bytes, sch.linger_ms, sch.ack_delay_ms) == (1200, 0, 100)


def test_node_configs_write_gateway_tables_that_the_gateway_reads(tmp_path):
    from c2dtn.ip_gateway.policy import parse_gateway
    from c2dtn.overlay.envelope import Priority
    from c2dtn.topologies.node_configs import TopicSpec, gateway_tables

    st = testbed.state_of(model.load("nps-chain"), "userspace")
    topics = [TopicSpec.parse("bft/+/+/+/location=priority,600,supersede"), TopicSpec.parse("c2/#=immediate")]
    tables = gateway_tables(
        st,
        ["gw1", "gw4"],
        ["gw1", "gw4"],
        tproxy=["gw1"],
        listen={"gw1": "127.0.0.1:1884>10.77.4.2:1883"},
        bridge={"gw4": "10.77.4.2:1883"},
        topics=topics,
    )
    paths = write_configs(st, ["gw1", "r2", "r3", "gw4"], ["gw1", "gw4"], tmp_path / "g", extra=tables)
    gw1 = parse_gateway(str(paths["gw1"]), load_node_config(paths["gw1"]).gateway)
    assert gw1.tproxy and gw1.listen == ("127.0.0.1", 1884) and gw1.broker == ("10.77.4.2", 1883)
    h4 = testbed.node_address(st, "h4")
    assert gw1.policy.gateway_for(h4) == "gw4"  # the host behind gw4 is served by gw4
    assert gw1.policy.gateway_for(testbed.node_address(st, "h1")) is None  # h1 is on gw1's own side
    rule = gw1.policy.rule_for("bft/NOR/u1/n1/location")
    assert (rule.priority, rule.lifetime_s, rule.key("t")) == (Priority.PRIORITY, 600, "mqtt:t")
    assert gw1.policy.rule_for("c2/orders").priority == Priority.IMMEDIATE
    gw4 = parse_gateway(str(paths["gw4"]), load_node_config(paths["gw4"]).gateway)
    assert not gw4.tproxy and gw4.bridge.broker == ("10.77.4.2", 1883) and gw4.bridge.peers == ["gw1"]
    assert gw4.bridge.out == ["bft/+/+/+/location", "c2/#"]
    for bad, why in [("c2/#=urgent", "urgent"), ("c2/#=routine,-5", "positive"), ("c2/#=routine,5,later", "FILTER")]:
        with pytest.raises(ConfigError, match=why):
            TopicSpec.parse(bad)
    with pytest.raises(ConfigError, match="at least one --topic"):
        gateway_tables(st, ["gw1", "gw4"], ["gw1"], tproxy=["gw1"])
    with pytest.raises(ConfigError, match="must be one of --gateway"):
        gateway_tables(st, ["gw1", "gw4"], ["gw4"], tproxy=["gw1"], topics=topics)


def test_configs_for_mixed_nations_meet_at_a_relay_with_one_agent_and_port_per_island(tmp_path):
    from c2dtn.overlay.relay import island_members, load_relay_config

    st = testbed.state_of(model.load("fmn-4nations"), "userspace")
    gws = ["deu-gw", "nor-gw", "prt-gw", "usa-gw"]
    kinds = {"deu-gw": "dtn7", "nor-gw": "ion", "prt-gw": "ibrdtn", "usa-gw": "dtn7"}
    paths = write_configs(st, gws + ["tacnet"], gws, tmp_path / "n", agent=kinds, relay="tacnet")
    relay = load_relay_config(paths["tacnet"])
    isl = {c.agent: c for c in relay.islands}
    assert {k: island_members(c) for k, c in isl.items()} == {
        "dtn7": {"deu-gw", "usa-gw"},
        "ibrdtn": {"prt-gw"},
        "ion": {"nor-gw"},
    }
    # one namespace, three agents: each island's agent on ports of its own (ION: UDP only)
    assert {k: [str(s) for s in c.listen] for k, c in isl.items()} == {
        "dtn7": ["tcpcl://0.0.0.0:4556", "udp://0.0.0.0:4556"],
        "ibrdtn": ["tcpcl://0.0.0.0:4557", "udp://0.0.0.0:4557"],
        "ion": ["udp://0.0.0.0:4558"],
    }
    assert len({c.storage for c in isl.values()} | {relay.storage}) == 4 and not any(c.overlay for c in isl.values())
    deu, nor, prt = (load_node_config(paths[n]) for n in ("deu-gw", "nor-gw", "prt-gw"))
    assert [(p.node, p.cla.port) for p in prt.peers] == [("tacnet", 4557)]
    assert [(p.node, p.cla.port) for p in nor.peers] == [("tacnet", 4558)]
    # deu reaches usa in its own island (through tacnet's dtn7 as a plain BPA hop), the others via the relay
    assert deu.relays == {"nor-gw": "tacnet", "prt-gw": "tacnet"} and "usa-gw" in {r.to for r in deu.routes}
    assert prt.relays == {"deu-gw": "tacnet", "nor-gw": "tacnet", "usa-gw": "tacnet"}
    assert deu.keys["prt-gw"] == prt.keys["deu-gw"]  # end to end: the relay holds no key
    with pytest.raises(ConfigError, match="cannot exchange bundles"):
        write_configs(st, gws + ["tacnet"], gws, tmp_path / "m", agent=kinds)
    with pytest.raises(ConfigError, match="relay must be a BPA node that runs no overlay"):
        write_configs(st, gws + ["tacnet"], gws, tmp_path / "m", agent=kinds, relay="deu-gw")


def test_renew_incarnation_gives_a_stopped_nodes_store_a_new_one(tmp_path):
    from click.testing import CliRunner

    from c2dtn.cli import cli
    from c2dtn.overlay.custody import CustodyStore

    f = _write(tmp_path, f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[agent]\nkind = "dtn7"\n')
    cfg = load_node_config(f)
    r = CliRunner().invoke(cli, ["node", "renew-incarnation", str(f)])
    assert r.exit_code != 0 and f"no custody store at {cfg.custody_db}" in r.output
    cfg.custody_db.parent.mkdir(parents=True, exist_ok=True)
    st = CustodyStore(cfg.custody_db, "gw1")
    st.submit("gw4", b"held", 0, 60_000)
    old = st.inc
    st.close()
    r = CliRunner().invoke(cli, ["node", "renew-incarnation", str(f)])
    assert r.exit_code == 0, r.output
    st = CustodyStore(cfg.custody_db, "gw1")
    assert st.inc != old and f"incarnation {old:08x} -> {st.inc:08x}" in r.output
    assert [it.body for it in st.queued("gw4")] == [b"held"]  # what it held is kept


def test_a_config_holding_keys_that_others_can_read_is_refused_saying_how_to_fix_it(tmp_path):
    text = f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n[keys]\ngw4 = "' + "ab" * 32 + '"\n'
    f = _write(tmp_path, text)
    assert load_node_config(f).keys["gw4"] == bytes.fromhex("ab" * 32)
    for mode in (0o644, 0o640, 0o604, 0o620):
        f.chmod(mode)
        with pytest.raises(ConfigError, match=f"'keys' = 'file mode {mode:04o}'.*too open.*chmod 600 {f}"):
            load_node_config(f)
    no_keys = _write(tmp_path, f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\n')
    no_keys.chmod(0o644)  # nothing secret in it: readable by all is fine
    assert load_node_config(no_keys).id == "gw1"
    f = _write(tmp_path, f'[node]\nid = "gw1"\nstorage = "{tmp_path / "gw1"}"\napi_group = "c2-no-such-group"\n')
    with pytest.raises(ConfigError, match="node.api_group.*c2-no-such-group.*no such group"):
        load_node_config(f)


def test_c2dtn_keys_writes_each_boxs_share_and_a_config_takes_it_by_keys_file(tmp_path):
    from click.testing import CliRunner

    from c2dtn.cli import cli

    shares = tmp_path / "shares"
    r = CliRunner().invoke(cli, ["keys", str(shares), "deu", "nor", "prt", "--group", "fmn=deu,nor,prt"])
    assert r.exit_code == 0, r.output
    assert {p.name: p.stat().st_mode & 0o777 for p in shares.iterdir()} == {
        f"{n}.keys.toml": 0o600 for n in ("deu", "nor", "prt")
    }
    cfgs = {}
    for n in ("deu", "nor", "prt"):
        f = tmp_path / f"{n}.toml"
        f.write_text(
            f'[node]\nid = "{n}"\nstorage = "{tmp_path / n}"\nkeys_file = "shares/{n}.keys.toml"\n'
            '[agent]\nrouting = "epidemic"\n'
        )
        f.chmod(0o644)  # the config itself holds no secret
        cfgs[n] = load_node_config(f)
    deu, nor, prt = cfgs["deu"], cfgs["nor"], cfgs["prt"]
    assert deu.keys["nor"] == nor.keys["deu"] and deu.keys["prt"] == prt.keys["deu"] != deu.keys["nor"]
    assert deu.keys["fmn"] == nor.keys["fmn"] == prt.keys["fmn"] and len(deu.keys["fmn"]) == 32
    assert set(deu.groups["fmn"]) == {"nor", "prt"}
    # asked again, it keeps the shares the boxes hold unless told to replace them
    r = CliRunner().invoke(cli, ["keys", str(shares), "deu", "nor"])
    assert r.exit_code != 0 and "--force replaces them" in str(r.exception)
    assert load_node_config(tmp_path / "deu.toml").keys == deu.keys
    (shares / "deu.keys.toml").chmod(0o640)
    with pytest.raises(ConfigError, match="deu.keys.toml: field 'keys' = 'file mode 0640'.*chmod 600"):
        load_node_config(tmp_path / "deu.toml")
    f = tmp_path / "nor.toml"
    f.write_text(f.read_text() + '[keys]\nusa = "' + "ab" * 32 + '"\n')
    f.chmod(0o600)
    with pytest.raises(ConfigError, match="given here and in keys_file"):
        load_node_config(f)


def test_fsync_mode_defaults_to_auto_and_a_bad_one_is_named(tmp_path):
    assert load_node_config(_write(tmp_path, GOOD)).fsync == "auto"
    loop = GOOD.replace('storage = "/tmp/c2-test-gw1"', 'storage = "/tmp/c2-test-gw1"\nfsync = "loop"')
    assert load_node_config(_write(tmp_path, loop)).fsync == "loop"
    bad = GOOD.replace('storage = "/tmp/c2-test-gw1"', 'storage = "/tmp/c2-test-gw1"\nfsync = "never"')
    with pytest.raises(ConfigError, match=r"""node.fsync' = 'never': must be "auto" or "thread" or "loop\""""):
        load_node_config(_write(tmp_path, bad))


def test_the_version_names_the_wire_version_boxes_must_share():
    from click.testing import CliRunner

    from c2dtn.cli import cli
    from c2dtn.overlay.envelope import CONTAINER_VERSION

    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output.strip().endswith(f"container version {CONTAINER_VERSION}"), r.output
