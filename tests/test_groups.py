"""Group destinations (one bundle reaches every member), driven with virtual time.

The simulated BPA fans a group bundle out to every member but its sender, as dtnd's
epidemic routing does through tacnet in fmn-4nations; per-member outages model one
nation's link being cut.
"""

import hashlib

import cbor2
import pytest
from test_custody import run

from c2dtn.errors import ConfigError
from c2dtn.overlay import scheduler
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import Custody, CustodyStore
from c2dtn.overlay.envelope import DELTA_OPEN_MAX, SEAL_AT, BadTag, Codec, Envelope, Kind, Priority, decode_ack_body
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store.memory import MemoryStore
from c2dtn.topologies import model, testbed
from c2dtn.topologies.node_configs import write_configs

NODES = ("deu", "nor", "prt")
GROUP_KEY = b"g" * 32


def pair_key(a: str, b: str) -> bytes:
    """A different key for every two nodes, as `c2dtn keys` makes them."""
    return hashlib.sha256("-".join(sorted((a, b))).encode()).digest()


def codec(name: str) -> Codec:
    return Codec(
        name,
        {n: pair_key(name, n) for n in NODES if n != name} | {"fmn": GROUP_KEY},
        {"fmn": tuple(n for n in NODES if n != name)},
    )


# each test on both stores: SQLite (a node's) and in-memory
STORE = {"kind": "sqlite"}


@pytest.fixture(autouse=True, params=["sqlite", "memory"])
def store_kind(request):
    STORE["kind"] = request.param
    yield request.param
    STORE["kind"] = "sqlite"


def make(tmp_path, name, cfg=SchedulerConfig(min_rto_ms=5_000, initial_rto_ms=10_000)):
    c = codec(name)
    store = (
        Custody(MemoryStore(), name, groups=c.groups)
        if STORE["kind"] == "memory"
        else CustodyStore(tmp_path / f"{name}.db", name, groups=c.groups)
    )
    return OverlayCore(store, c, cfg)


class FanOut:
    """A BPA path: a bundle for a group reaches every other member, one for a node that node;
    `down[node]` lists (start, end) ms during which that node's link loses everything."""

    def __init__(self, delay_ms=200):
        self.delay_ms = delay_ms
        self.down: dict[str, list[tuple[int, int]]] = {}
        self.flight = []
        self.sent = []  # (sender, dst) of every bundle handed over

    def is_down(self, node, t):
        return any(a <= t < b for a, b in self.down.get(node, []))

    def send_from(self, sender, out, now):
        for b in out:
            self.sent.append((sender, b.dst))
            if self.is_down(sender, now):
                continue
            for rx in (n for n in NODES if n != sender) if b.dst == "fmn" else [b.dst]:
                self.flight.append((now + self.delay_ms, rx, b.payload))

    def due(self, now):
        ready = [f for f in self.flight if f[0] <= now]
        self.flight = [f for f in self.flight if f[0] > now]
        return [(rx, p) for t, rx, p in ready if not self.is_down(rx, t)]


class LoseFirst(FanOut):
    """The first group bundle is lost on its sender's uplink, before the fan-out: no member gets it."""

    def send_from(self, sender, out, now):
        for b in out:
            if b.dst == "fmn" and not getattr(self, "lost", False):
                self.lost = True
                self.sent.append((sender, b.dst))
                continue
            super().send_from(sender, [b], now)


class _Bound:
    """run() calls net.send(out, t) node after node; the container names its sender."""

    def __init__(self, net):
        self.net = net

    def send(self, out, now):
        for b in out:
            self.net.send_from(cbor2.loads(b.payload)[1], [b], now)

    def due(self, now):
        return self.net.due(now)


def test_one_bundle_reaches_every_member_and_custody_waits_for_all(tmp_path):
    cores = {n: make(tmp_path, n) for n in NODES}
    net = FanOut()
    reports = [(0, lambda t, i=i: cores["deu"].submit("fmn", f"pos {i}".encode(), t)) for i in range(10)]
    got = run(cores, _Bound(net), 5_000, actions=reports)
    assert [d.body for d in got["nor"]] == [f"pos {i}".encode() for i in range(10)]
    assert [d.body for d in got["prt"]] == [f"pos {i}".encode() for i in range(10)]
    assert {d.origin for d in got["nor"] + got["prt"]} == {"deu"}
    data_from_deu = [d for s, d in net.sent if s == "deu"]
    assert data_from_deu == ["fmn"]  # ten reports, one bundle, one copy on deu's link
    # nor and prt each ack deu once, in one ack envelope for the whole group
    assert sorted(net.sent) == [("deu", "fmn"), ("nor", "fmn"), ("prt", "fmn")]
    assert cores["deu"].store.held_out()[0] == 0  # both members took them: custody released


def test_a_member_cut_off_gets_everything_later_and_nobody_gets_a_duplicate(tmp_path):
    cores = {n: make(tmp_path, n) for n in NODES}
    net = FanOut()
    net.down["prt"] = [(0, 30_000)]
    reports = [
        (i * 1000, lambda t, i=i: cores["deu"].submit("fmn", f"order {i}".encode(), t, priority=Priority.IMMEDIATE))
        for i in range(5)
    ]
    got = run(cores, _Bound(net), 20_000, actions=reports)
    assert len(got["nor"]) == 5 and got["prt"] == []
    assert cores["deu"].store.held_out()[0] == 5  # prt has not taken them: still in custody
    got2 = run(cores, _Bound(net), 120_000, t0=20_100)
    assert [d.body for d in got2["prt"]] == [f"order {i}".encode() for i in range(5)]  # in order
    assert got2["nor"] == []  # the group retransmission reached nor again: not delivered twice
    assert cores["nor"].store.count("duplicates") >= 1
    assert cores["deu"].store.held_out()[0] == 0


def test_group_and_direct_streams_keep_their_own_order(tmp_path):
    cores = {n: make(tmp_path, n) for n in NODES}
    deu, nor = cores["deu"], cores["nor"]
    for i in range(3):
        deu.submit("nor", f"direct {i}".encode(), 0, priority=Priority.PRIORITY)
        deu.submit("fmn", f"group {i}".encode(), 0, priority=Priority.PRIORITY)
    out = deu.poll(0)
    assert sorted(b.dst for b in out) == ["fmn", "nor"]
    group = next(b for b in out if b.dst == "fmn")
    direct = next(b for b in out if b.dst == "nor")
    # both streams number their envelopes 1, 2, 3: the receiver must not mix them up
    assert nor.on_bundle(group.payload, 10).data == 3
    assert nor.on_bundle(direct.payload, 20).data == 3
    assert [d.body for d in nor.take()] == [b"group 0", b"group 1", b"group 2", b"direct 0", b"direct 1", b"direct 2"]


def test_acks_release_a_group_envelope_only_from_its_members_and_only_when_all_took_it(tmp_path):
    deu = make(tmp_path, "deu")
    seq = deu.submit("fmn", b"pos", 0)
    deu.poll(0)
    store = deu.store
    assert store.ack_from("usa", [seq], []) == ([], [])  # not a member: ignored
    assert store.count("acks_not_theirs") == 1
    released, arrived = store.ack_from("nor", [], [seq])
    assert released == [] and [i.seq for i in arrived] == [seq]
    released, arrived = store.ack_from("nor", [seq], [])
    assert released == [] and arrived == []  # nor took it; prt has not
    released, _ = store.ack_from("prt", [seq], [])
    assert [i.seq for i in released] == [seq]
    assert store.held_out()[0] == 0


def test_group_envelopes_are_sealed_with_the_group_key_and_checked_against_it():
    deu, nor = codec("deu"), codec("nor")
    env = Envelope(Kind.DATA, "deu", 1, "fmn", 0, 60_000, body=b"pos")
    assert nor.open_bundle(deu.bundle([env], "fmn"))[0].body == b"pos"
    # a member cannot pass an envelope addressed to one node off under the group key (deu's own
    # origin tags around a seal made with the pair key of deu and nor)
    genuine = cbor2.loads(deu.bundle([env], "fmn"))
    forged = cbor2.loads(Codec("deu", {"nor": GROUP_KEY}).bundle([Envelope(Kind.DATA, "deu", 2, "nor", 0, 60_000)]))
    c = nor.open_container(cbor2.dumps(genuine[:SEAL_AT] + [forged[SEAL_AT]] + genuine[SEAL_AT + 1 :]))
    with pytest.raises(BadTag, match="origin tag"):
        nor.open_items(c)
    # ... nor a seal with the group key alone, whatever the origin tags
    c.origin_tags = None
    with pytest.raises(BadTag, match="without origin tags"):
        nor.open_items(c)
    # ... nor one for the group under a pair key
    pair_only = Codec(
        "deu", {"fmn": pair_key("deu", "nor"), "nor": pair_key("deu", "nor"), "prt": bytes(32)}, {"fmn": ("nor", "prt")}
    )
    with pytest.raises(BadTag, match="does not match the key of 'fmn' \\(the group's\\)"):
        nor.open_bundle(pair_only.bundle([Envelope(Kind.DATA, "deu", 3, "fmn", 0, 60_000, body=b"x")], "fmn"))
    outsider = Codec("nor", {"deu": pair_key("deu", "nor")})  # no group key: cannot read the group's envelopes
    with pytest.raises(Exception, match="fmn"):
        outsider.open_bundle(deu.bundle([env], "fmn"))


def test_a_member_cannot_pass_group_envelopes_off_as_another_members(tmp_path):
    """Every member holds the group key; what nor knows must not let it speak for deu."""
    deu, prt = codec("deu"), make(tmp_path, "prt")
    as_deu = Codec(
        "deu", {"nor": pair_key("deu", "nor"), "prt": pair_key("nor", "prt"), "fmn": GROUP_KEY}, {"fmn": ("nor", "prt")}
    )  # deu's name, the keys nor has
    lie = Envelope(Kind.DATA, "deu", 1, "fmn", 0, 60_000, body=b"deu: fall back to phase line red")
    genuine = deu.bundle([Envelope(Kind.DATA, "deu", 1, "fmn", 0, 60_000, body=b"deu: hold")], "fmn")
    spliced = cbor2.loads(genuine)
    spliced[SEAL_AT] = cbor2.loads(as_deu.bundle([lie], "fmn"))[SEAL_AT]  # deu's origin tags around nor's seal
    untagged = cbor2.dumps(cbor2.loads(as_deu.bundle([lie], "fmn"))[: SEAL_AT + 1])
    forgeries = {
        "without origin tags": untagged,
        "origin tag for 'prt' does not match": as_deu.bundle([lie], "fmn"),
        "did not seal": cbor2.dumps(spliced),
    }
    for why, payload in forgeries.items():
        res = prt.on_bundle(payload, 10)
        assert res.data == 0 and len(res.rejected) == 1 and why in res.rejected[0], (why, res.rejected)
    assert prt.take() == []
    assert prt.on_bundle(genuine, 20).data == 1 and [d.body for d in prt.take()] == [b"deu: hold"]


def test_origin_tags_cost_9_bytes_per_other_member_and_bundle_not_per_envelope():
    deu = codec("deu")
    envs = [Envelope(Kind.DATA, "deu", i, "fmn", 0, 60_000, body=b"pos %d" % i) for i in range(5)]
    full = deu.bundle(envs, "fmn")
    assert len(full) - len(cbor2.dumps(cbor2.loads(full)[: SEAL_AT + 1])) == 1 + 2 * (1 + 8)
    prt = codec("prt")
    assert len(prt.open_container(full).origin_tags) == 2 and [e.seq for e in prt.open_bundle(full)] == list(range(5))


def _node_toml(tmp_path, groups, routing="epidemic", keys=None):
    keys = keys if keys is not None else {"nor": "ab" * 32, "prt": "cd" * 32, "fmn": "ef" * 32}
    p = tmp_path / "deu.toml"
    p.write_text(
        '[node]\nid = "deu"\nstorage = "/tmp/c2-x"\n\n[agent]\n'
        f'routing = "{routing}"\n\n[keys]\n'
        + "".join(f'{k} = "{v}"\n' for k, v in keys.items())
        + "\n[groups]\n"
        + "".join(f"{g} = {m!r}\n".replace("'", '"') for g, m in groups.items())
    )
    p.chmod(0o600)  # it holds keys
    return p


def test_group_config_errors_name_the_bad_value(tmp_path):
    ok = load_node_config(_node_toml(tmp_path, {"fmn": ["deu", "nor", "prt"]}))
    assert ok.groups == {"fmn": ("nor", "prt")} and ok.routing == "epidemic"
    with pytest.raises(ConfigError, match="routing.*static routing sends a bundle to one next hop"):
        load_node_config(_node_toml(tmp_path, {"fmn": ["deu", "nor", "prt"]}, routing="static"))
    with pytest.raises(ConfigError, match="this node \\(deu\\) is not a member"):
        load_node_config(_node_toml(tmp_path, {"fmn": ["nor", "prt"]}))
    with pytest.raises(ConfigError, match="keys.usa.*member usa of group fmn needs a pair key"):
        load_node_config(_node_toml(tmp_path, {"fmn": ["deu", "nor", "usa"]}))
    with pytest.raises(ConfigError, match="group fmn needs a key"):
        load_node_config(_node_toml(tmp_path, {"fmn": ["deu", "nor"]}, keys={"nor": "ab" * 32}))
    with pytest.raises(ConfigError, match="unknown routing"):
        load_node_config(_node_toml(tmp_path, {}, routing="flooding"))


def test_testbed_configs_for_a_group_route_by_epidemic_everywhere(tmp_path):
    st = testbed.state_of(model.load("fmn-4nations"), "userspace")
    gws = ["deu-gw", "nor-gw", "prt-gw", "usa-gw"]
    paths = write_configs(st, gws + ["tacnet"], gws, tmp_path / "n", groups={"fmn": gws})
    cfgs = {n: load_node_config(p) for n, p in paths.items()}
    assert {c.routing for c in cfgs.values()} == {"epidemic"}
    assert cfgs["deu-gw"].groups == {"fmn": ("nor-gw", "prt-gw", "usa-gw")}
    assert cfgs["deu-gw"].keys["fmn"] == cfgs["usa-gw"].keys["fmn"] != cfgs["deu-gw"].keys["nor-gw"]
    assert cfgs["tacnet"].groups == {} and "fmn" not in cfgs["tacnet"].keys


def test_a_group_bundle_lost_on_the_uplink_is_resent_when_a_later_one_arrives(tmp_path):
    slow_timer = SchedulerConfig(min_rto_ms=60_000, initial_rto_ms=120_000)
    cores = {n: make(tmp_path, n, slow_timer) for n in NODES}

    net = LoseFirst()
    got = run(
        cores,
        _Bound(net),
        5_000,
        actions=[
            (0, lambda t: cores["deu"].submit("fmn", b"one", t)),
            (1_000, lambda t: cores["deu"].submit("fmn", b"two", t)),
        ],
    )
    for rx in ("nor", "prt"):
        assert sorted(d.body for d in got[rx]) == [b"one", b"two"]  # seconds, not the 120 s timer
    assert cores["deu"].store.count("fast_retransmits") >= 1


def test_a_lost_ack_is_repeated_by_the_next_and_causes_no_resend(tmp_path):
    cores = {n: make(tmp_path, n) for n in NODES}

    class LoseFirstAck(_Bound):
        def send(self, out, now):
            for b in out:
                if not b.seqs and b.acks and not getattr(self, "lost", False):
                    self.lost = True  # nor's (or prt's) first ack to deu never arrives
                    continue
                super().send([b], now)

    reports = [(i * 1000, lambda t, i=i: cores["deu"].submit("fmn", f"pos {i}".encode(), t)) for i in range(4)]
    got = run(cores, LoseFirstAck(FanOut()), 8_000, actions=reports)
    assert len(got["nor"]) == len(got["prt"]) == 4
    assert cores["deu"].store.count("fast_retransmits") == 0  # the next ack carried the lost one's ids
    assert cores["nor"].store.count("duplicates") == cores["prt"].store.count("duplicates") == 0
    assert cores["deu"].store.held_out()[0] == 0


def test_a_malformed_group_ack_is_rejected_by_name_and_the_rest_of_the_bundle_taken(tmp_path):
    import cbor2

    cores = {n: make(tmp_path, n) for n in NODES}
    deu, nor = cores["deu"], cores["nor"]
    seq = deu.submit("fmn", b"pos", 0)
    deu.poll(0)
    bad = Envelope(
        Kind.ACK, "nor", 0, "fmn", 0, 60_000, Priority.FLASH, body=cbor2.dumps([["deu", deu.store.inc, "not runs", []]])
    )
    good = Envelope(Kind.DATA, "nor", 1, "fmn", 0, 60_000, body=b"pos nor")
    res = deu.on_bundle(nor.codec.bundle([bad, good], "fmn"), 10)
    assert res.data == 1 and len(res.rejected) == 1 and "ack entry is not [done runs, got runs]" in res.rejected[0]
    assert [d.body for d in deu.take()] == [b"pos nor"]
    assert deu.store.held_out()[0] == 1 and seq  # nothing released by the bad ack


def test_over_an_agent_without_group_endpoints_the_node_sends_a_copy_to_each_member(tmp_path):
    """ION, IBR-DTN and HDTN have no group endpoints here: deu's node (its asyncio shell, on
    an ion config) hands the agent one bundle per other member, to that member's own
    endpoint, and each member's core delivers the reports and acks them as the group's."""
    import asyncio

    from c2dtn.overlay.agents import agent_class
    from c2dtn.overlay.node import OverlayNode

    keys = {n: pair_key("deu", n).hex() for n in ("nor", "prt")} | {"fmn": GROUP_KEY.hex()}
    p = tmp_path / "deu.toml"
    p.write_text(
        f'[node]\nid = "deu"\nstorage = "{tmp_path / "deu"}"\nfsync = "loop"\n[agent]\nkind = "ion"\n'
        "[keys]\n" + "".join(f'{k} = "{v}"\n' for k, v in keys.items()) + '[groups]\nfmn = ["deu", "nor", "prt"]\n'
    )
    p.chmod(0o600)
    cfg = load_node_config(p)  # static routing is fine: each copy is an ordinary bundle
    assert cfg.routing == "static" and not agent_class("ion").capabilities.groups
    node = OverlayNode(cfg)
    sent = []

    async def send(dst_node, endpoint, payload, lifetime_s, priority=3):
        sent.append((dst_node, endpoint, payload))

    node.agent.send = send
    assert node.endpoints() == [node.agent.endpoint]  # nothing to register for the group
    for i in range(5):
        node.core.submit("fmn", f"pos {i}".encode(), 1_000)
    asyncio.run(node._hand_over(node.core.poll(1_000)))
    assert [(d, e) for d, e, _ in sent] == [("nor", node.agent.endpoint), ("prt", node.agent.endpoint)]
    assert sent[0][2] == sent[1][2]  # the same bundle to each
    for member in ("nor", "prt"):
        core = make(tmp_path, member)
        core.on_bundle(sent[0][2], 1_200)
        assert [(d.origin, d.body) for d in core.take()] == [("deu", f"pos {i}".encode()) for i in range(5)]
    node.core.store.close()
    # on dtn7 (group endpoints) a group takes epidemic routing, and one bundle to the group
    dtn7 = agent_class("dtn7")()
    assert dtn7.destinations("fmn", ("nor", "prt")) == [("fmn", "~c2dtn")]
    with pytest.raises(ConfigError, match="routing.*static routing sends a bundle to one next hop"):
        load_node_config(_node_toml(tmp_path, {"fmn": ["deu", "nor", "prt"]}, routing="static"))


class _Sized(_Bound):
    """_Bound, counting the payload bytes each node hands its BPA."""

    def __init__(self, net):
        super().__init__(net)
        self.bytes: dict[str, int] = {}

    def send(self, out, now):
        for b in out:
            sender = cbor2.loads(b.payload)[1]
            self.bytes[sender] = self.bytes.get(sender, 0) + len(b.payload)
        super().send(out, now)


def _reports(cores, seconds):
    """Two units of deu, a report each a second, to the group."""
    body = '{{"unit": "DEU-S00{u}", "msg_id": "DEU-S00{u}_{k}", "lat": 59.9{a:05d}, "lon": 10.7{b:05d}, "ts": {t}}}'
    return [
        (
            k * 1000,
            lambda t, k=k, u=u: cores["deu"].submit(
                "fmn",
                body.format(u=u, k=k, a=31 * k % 99991, b=17 * k % 99991, t=1795833889591 + 1000 * k).encode(),
                t,
                priority=Priority.PRIORITY,
                supersede=f"u{u}",
            ),
        )
        for k in range(1, seconds + 1)
        for u in (1, 2)
    ]


def test_group_reports_go_as_deltas_and_every_member_opens_them(tmp_path, monkeypatch):
    from c2dtn.overlay import envelope as E

    cost = {}
    for mode in ("delta", "whole"):
        if mode == "whole":
            monkeypatch.setattr(E, "DELTA_MAX_BODY", 0)  # no body kept as a reference: all go whole
        cores = {n: make(tmp_path / mode, n) for n in NODES}
        net = _Sized(FanOut())
        got = run(cores, net, 45_000, actions=_reports(cores, 40))
        for m in ("nor", "prt"):
            newest = {d.supersede: d.body for d in got[m]}
            assert {k: b.split(b'"msg_id": ')[1][:14] for k, b in newest.items()} == {
                "u1": b'"DEU-S001_40",',
                "u2": b'"DEU-S002_40",',
            }, m
        assert cores["deu"].store.held_out()[0] == 0  # every member took every report
        cost[mode] = net.bytes["deu"]
    print(f"deu's bytes to the group: {cost['delta']} with deltas, {cost['whole']} whole")
    assert cost["delta"] < 0.85 * cost["whole"]


def test_a_member_that_lost_its_references_refuses_deltas_then_takes_whole_ones(tmp_path):
    """prt restarts (references live in memory): it refuses deltas unacked; the group's copies
    go whole on retransmission, and deltas resume once every member took a whole one."""
    cores = {n: make(tmp_path, n) for n in NODES}
    net = _Sized(FanOut())
    run(cores, net, 20_500, actions=_reports(cores, 20))
    prt = cores["prt"]
    prt.codec = prt.sched.codec = codec("prt")
    acts = [(t + 20_000, f) for t, f in _reports(cores, 40)[40:]]  # reports 21 to 40
    got = run(cores, net, 120_000, t0=20_600, actions=acts)
    refused = prt.store.count("rejected:no-reference")
    print(f"prt refused {refused} deltas after its restart")
    assert 0 < refused <= 2 * DELTA_OPEN_MAX  # per unit: the deltas under way, then a whole one
    for m in ("nor", "prt"):
        assert {d.supersede for d in got[m] if b"_40" in d.body} == {"u1", "u2"}, m
    assert cores["deu"].store.held_out()[0] == 0


def test_a_late_done_cannot_make_the_other_members_refuse_the_groups_deltas(tmp_path):
    """Found by review: the group's reference is the newest body every member acked "done";
    a member that acks "got" at once but "done" only for reports ten behind made the sender
    refer to bodies the other members had let go (they keep a key's 8 newest), and they
    refused delta after delta.  nor is that member here (its acks fed to deu's scheduler, as an
    authentic ack bundle from nor would be); prt is honest."""
    import logging

    from c2dtn.overlay import envelope as E

    cores = {n: make(tmp_path, n) for n in ("deu", "prt")}
    deu, prt = cores["deu"], cores["prt"]
    flight: list = []
    sent: dict[str, list[int]] = {"u1": [], "u2": []}
    t = 0
    logging.disable(logging.WARNING)
    try:
        for k in range(1, 121):  # 60 s, each unit a report every 500 ms
            for u in ("u1", "u2"):
                body = b'{"unit": "%s", "lat": 59.9%05d, "lon": 10.7%05d, "k": %d}' % (u.encode(), 31 * k, 17 * k, k)
                sent[u].append(deu.submit("fmn", body, t, priority=Priority.PRIORITY, supersede=u))
            for _ in range(5):
                for b in deu.poll(t):
                    flight.append((t + 100, "prt", b.payload))
                for b in prt.poll(t):
                    flight.append((t + 100, "deu", b.payload))
                for due in [f for f in flight if f[0] <= t]:
                    flight.remove(due)
                    cores[due[1]].on_bundle(due[2], t)
                items = prt.take()
                prt.consumed([i.id for i in items], t)
                held = [it.seq for it in deu.store.inflight("fmn")]
                late = [s[-11] for s in sent.values() if len(s) > 10]
                deu.sched.on_ack("nor", late, held, t)
                t += 100
    finally:
        logging.disable(logging.NOTSET)
    refused = prt.store.count("rejected:no-reference")
    print(f"prt refused {refused} deltas and took {prt.store.count('delivered')} of 240 reports")
    assert refused <= 2 * E.DELTA_OPEN_MAX
    assert prt.store.count("delivered") >= 230


def test_a_forged_group_bundle_is_judged_once_however_many_envelopes_it_holds(monkeypatch):
    """Finding of an attacker's review (decision 0020): a wrong origin tag was checked again for
    every item, each time over every item, so a bundle of empty items with no key behind it cost
    time quadratic in its size. Since decision 0023 a bundle has one seal: its digest is taken
    once, before anything is decrypted."""
    from c2dtn.overlay import envelope as E

    # two origin tags, as many as prt expects from deu (nor's and prt's), both wrong
    payload = cbor2.dumps([E.CONTAINER_VERSION, "deu", "fmn", 0, 0, bytes(1 << 20), [bytes(8)] * 2])
    digests = []
    real = E._seal_digest
    monkeypatch.setattr(E, "_seal_digest", lambda b: digests.append(1) or real(b))
    prt = codec("prt")
    with pytest.raises(BadTag, match="origin tag"):
        prt.open_bundle(payload)
    assert len(digests) == 1


def test_while_one_member_is_cut_off_what_goes_to_the_group_stays_within_its_window(tmp_path):
    """A member cut off for 10 minutes while 300 envelopes are queued for the group: the other
    member's acks must not count as the group's progress for the tail probes. A probe of new
    data that one member acks would reset the backoff and go every few seconds, past the
    window, until the queue was drained into a member that cannot take it (decision 0024 keeps
    groups on copies)."""
    cfg = SchedulerConfig(min_rto_ms=5_000, initial_rto_ms=10_000, init_window=4096, aggregate_bytes=1)
    cores = {n: make(tmp_path, n, cfg) for n in NODES}
    net = FanOut()
    net.down["prt"] = [(5_000, 600_000)]
    acts = [(0, lambda t: cores["deu"].submit("fmn", b"first", t))]  # a round trip is measured first
    acts += [(6_000, lambda t, i=i: cores["deu"].submit("fmn", b"%04d" % i + bytes(996), t)) for i in range(300)]
    run(cores, _Bound(net), 590_000, step_ms=500, actions=acts)
    deu = cores["deu"]
    sent = sum(1 for s, d in net.sent if s == "deu" and d == "fmn")
    assert len(deu.store.queued("fmn", limit=1000)) > 200, "the queue went out to a member that was cut off"
    assert sent < 100, f"deu handed its agent {sent} bundles for the group while prt was cut off"


def test_lost_superseded_copies_stop_filling_the_groups_window_once_a_member_acks_past_them(tmp_path):
    """A group bundle of position reports lost on the uplink, then superseded: never sent again,
    its copies must leave the window once a member's ack shows them lost (RACK), as they do for
    one peer.  Kept until their timeout, they held the window on fmn-4nations while the units'
    newer reports waited a round trip each behind them (a unit's age past 9 s)."""
    import random

    cfg = SchedulerConfig(
        min_rto_ms=60_000, initial_rto_ms=120_000, init_window=8000, max_window=8000, queue_target_ms=0
    )
    cores = {n: make(tmp_path, n, cfg) for n in NODES}
    rng = random.Random(5)

    def report(unit, n):
        return lambda t: cores["deu"].submit(
            "fmn", b"u%d r%d " % (unit, n) + rng.randbytes(990), t, priority=Priority.PRIORITY, supersede=f"u{unit}"
        )

    acts = [(0, report(u, 1)) for u in range(7)]  # a window's worth but one: all lost
    acts += [(1_000, report(u, 2)) for u in range(8)]  # each of the seven supersedes its lost copy
    net = _Bound(LoseFirst(delay_ms=200))
    got = run(cores, net, 2_000, actions=acts)
    for rx in ("nor", "prt"):
        newest = {d.body[:6] for d in got[rx]}
        # one went at 1 s (room for one beside the seven lost), acked at once for the gap; the
        # other seven at that ack, not one a round trip
        assert newest == {b"u%d r2 " % u for u in range(8)}, f"{rx} has only {sorted(newest)} at 2 s"
    run(cores, net, 3_000, t0=2_100)
    assert cores["deu"].store.inflight_bytes().get("fmn", 0) == 0  # all acked, nothing lost held


def test_a_members_late_ack_of_copies_let_go_still_shows_what_it_lacks(tmp_path):
    """nor's ack showed a superseded copy lost, so it was let go; prt's later ack names only
    that copy (prt had it) and shows that prt lacks u1's report, sent before it: that report is
    due again at once, as it would be had the copy still been held (not at prt's next ack or a
    probe)."""
    cfg = SchedulerConfig(min_rto_ms=60_000, initial_rto_ms=120_000, queue_target_ms=0)
    deu = make(tmp_path, "deu", cfg)
    u1 = deu.submit("fmn", b"u1 r0", 0, priority=Priority.PRIORITY, supersede="u1")
    deu.poll(0)
    u0r0 = deu.submit("fmn", b"u0 r0", 200, priority=Priority.PRIORITY, supersede="u0")
    deu.poll(200)
    u0r1 = deu.submit("fmn", b"u0 r1", 400, priority=Priority.PRIORITY, supersede="u0")
    deu.poll(400)
    deu.sched.on_ack("nor", [], [u1, u0r1], 700, 0)  # nor lost u0 r0 on its own leg
    deu.poll(700)  # the superseded copy is let go
    assert u0r0 not in {it.seq for it in deu.store.inflight("fmn")}
    deu.sched.on_ack("prt", [], [u0r0], 1500, 0)  # prt lost u1 on its leg, had u0 r0
    (b,) = deu.poll(1500)
    assert u1 in b.seqs, "prt's ack showed u1 lost, yet it waits for a timeout or a probe"
    deu.sched.on_ack("prt", [], [u0r0], 1600, 0)  # the same ids again, as acks repeat them
    assert not deu.poll(1600), "a repeated ack sent the copy again"


class LoseOnLeg(FanOut):
    """A group bundle handed over at or after `at_ms` is lost on `rx`'s own leg only (once)."""

    def __init__(self, rx, at_ms, delay_ms=200):
        super().__init__(delay_ms)
        self.rx, self.at_ms, self.lost = rx, at_ms, False

    def send_from(self, sender, out, now):
        for b in out:
            if b.dst == "fmn" and now >= self.at_ms and not self.lost and not self.is_down(sender, now):
                self.lost = True
                self.sent.append((sender, b.dst))
                for rx in NODES:
                    if rx not in (sender, self.rx):
                        self.flight.append((now + self.delay_ms, rx, b.payload))
                continue
            super().send_from(sender, [b], now)


def test_with_one_member_cut_off_another_members_tail_loss_is_probed_not_left_to_its_timeout(tmp_path):
    """prt is cut off; the last order of a burst is lost on nor's own leg.  The group's tail
    probe must resend what nor lacks: the oldest thing the group lacks is prt's, which nor
    already has, so probing that alone left nor's order to its retransmission timeout."""
    cores = {n: make(tmp_path, n, SchedulerConfig(min_rto_ms=30_000, initial_rto_ms=60_000)) for n in NODES}
    net = LoseOnLeg("nor", 20_000)
    net.down["prt"] = [(2_500, 600_000)]  # prt lacks pos 3 and 4, older than the order
    acts = [(i * 1000, lambda t, i=i: cores["deu"].submit("fmn", b"pos %d" % i, t)) for i in range(5)]
    acts += [(20_000, lambda t: cores["deu"].submit("fmn", b"order", t, priority=Priority.IMMEDIATE))]
    got = run(cores, _Bound(net), 20_000 + 4_000, actions=acts)
    assert net.lost
    bodies = [d.body for d in got["nor"]]
    # a probe's interval is two round trips and the ack delay; prt's backoff had grown past 4 s
    assert b"order" in bodies, f"nor still lacks the order 4 s after it went (has {bodies})"
    assert cores["deu"].store.held_out()[0] > 0  # prt lacks them all: still in custody


def test_a_member_back_from_a_cut_catches_up_within_seconds_while_the_others_take_bursts(tmp_path):
    """prt cut off for two minutes while deu sends a burst every 30 s that nor takes: prt's
    probes back off, but each burst starts them again from the base interval (as the group's
    one backoff did), so prt has everything within a few seconds of its return, not at the
    end of a backoff grown to its 30 s cap."""
    cores = {n: make(tmp_path, n, SchedulerConfig()) for n in NODES}
    net = FanOut()
    net.down["prt"] = [(2_500, 125_000)]
    acts = [
        (k * 30_000, lambda t, k=k: [cores["deu"].submit("fmn", b"pos %d.%d" % (k, i), t) for i in range(5)])
        for k in range(5)
    ]
    # the backoff after the last burst (at 120 s) has reached about 4 s when prt returns
    got = run(cores, _Bound(net), 125_000 + 6_000, actions=acts)
    assert len(got["nor"]) == 25
    assert [d.body for d in got["prt"]] == [b"pos %d.%d" % (k, i) for k in range(5) for i in range(5)]


class LoseData(FanOut):
    """`sender`'s first group bundle with data handed over at or after `at_ms` is lost on its
    uplink, before the fan-out: no member gets it."""

    def __init__(self, sender, at_ms, delay_ms=200):
        super().__init__(delay_ms)
        self.sender, self.at_ms, self.lost_at = sender, at_ms, None

    def send_from(self, sender, out, now):
        for b in out:
            if sender == self.sender and b.dst == "fmn" and b.seqs and now >= self.at_ms and self.lost_at is None:
                self.lost_at = now
                self.sent.append((sender, b.dst))
                continue
            super().send_from(sender, [b], now)


def test_a_report_lost_with_no_later_data_is_resent_once_an_ack_only_bundle_shows_it(tmp_path):
    """deu's last report is lost on its uplink, and deu has no more data to send; it only acks
    nor's reports.  Its ack-only bundles say the next send number, so the members see the gap
    and say so at once: the report arrives about two round trips after the loss, where it
    waited for a tail probe (two round trips, the ack delay and a margin after it went) and a
    round trip more."""
    cfg = SchedulerConfig(min_rto_ms=30_000, initial_rto_ms=60_000, ack_delay_ms=400)
    cores = {n: make(tmp_path, n, cfg) for n in NODES}
    net = LoseData("deu", 3_000)
    acts = [(i * 1000, lambda t, i=i: cores["deu"].submit("fmn", b"deu %d" % i, t)) for i in range(4)]
    acts += [(i * 250, lambda t, i=i: cores["nor"].submit("fmn", b"nor %d" % i, t)) for i in range(40)]
    acts.sort(key=lambda a: a[0])
    bound = _Bound(net)
    came: dict[tuple[str, bytes], int] = {}
    for t in range(0, 10_000, 20):
        while acts and acts[0][0] <= t:
            acts.pop(0)[1](t)
        for core in cores.values():
            bound.send(core.poll(t), t)
        for rx, payload in bound.due(t):
            cores[rx].on_bundle(payload, t)
        for name, core in cores.items():
            items = core.take()
            core.consumed([i.id for i in items], t)
            for d in items:
                came.setdefault((name, d.body), t)
    assert net.lost_at is not None
    late = {rx: came.get((rx, b"deu 3"), 10_000) - net.lost_at for rx in ("nor", "prt")}
    # deu's next ack-only bundle: nor's next report (250 ms) and the ack delay (400 ms); then it,
    # the members' answer and the resend cross (3 x 200 ms).  A tail probe's resend came at 1.6 s
    assert max(late.values()) <= 1_300, f"deu's lost report came {late} ms after the loss"
    assert cores["deu"].store.count("heard_gaps") >= 1


class LoseEach(FanOut):
    """`sender`'s first group bundle with data handed over at or after each of `at_ms` is lost on
    its uplink, before the fan-out: no member gets it."""

    def __init__(self, sender, at_ms, delay_ms=200):
        super().__init__(delay_ms)
        self.sender, self.left, self.lost = sender, sorted(at_ms), []  # lost: (when, seqs)

    def send_from(self, sender, out, now):
        for b in out:
            if sender == self.sender and b.dst == "fmn" and b.seqs and self.left and now >= self.left[0]:
                self.left.pop(0)
                self.lost.append((now, list(b.seqs)))
                self.sent.append((sender, b.dst))
                continue
            super().send_from(sender, [b], now)


@pytest.mark.parametrize("copies", [True, False])
def test_a_report_lost_on_a_lossy_uplink_arrives_with_the_senders_next_bundle(tmp_path, monkeypatch, copies):
    """deu reports every 500 ms and acks nor's reports (every 250 ms).  Its uplink loses a
    bundle at 1 s, which the members' acks show and deu resends: the path has lost one.  When
    it loses another at 4 s, that bundle's report goes again in deu's next bundle (an ack or
    the next report, within 500 ms): every member has it a frame later, with no resend.
    Without the copies it waits for a member's answer and the resend, two trips more."""
    if not copies:
        monkeypatch.setattr(scheduler, "COPY_NEXT_WITHIN_MS", 0)
    cfg = SchedulerConfig(min_rto_ms=30_000, initial_rto_ms=60_000, ack_delay_ms=250)
    cores = {n: make(tmp_path, n, cfg) for n in NODES}
    net = LoseEach("deu", [1_000, 4_000])
    acts = [(i * 500, lambda t, i=i: cores["deu"].submit("fmn", b"deu %d" % i, t)) for i in range(16)]
    acts += [(i * 250, lambda t, i=i: cores["nor"].submit("fmn", b"nor %d" % i, t)) for i in range(32)]
    acts.sort(key=lambda a: a[0])
    bound = _Bound(net)
    came: dict[tuple[str, bytes], int] = {}
    copies_of: dict[bytes, int] = {}  # deu's bodies: how often each reached nor
    answers = 0  # after the second loss
    for t in range(0, 10_000, 10):
        while acts and acts[0][0] <= t:
            acts.pop(0)[1](t)
        for core in cores.values():
            bound.send(core.poll(t), t)
        for rx, payload in bound.due(t):
            for env in codec(rx).open_bundle(payload):
                if rx == "nor" and env.kind == Kind.DATA and env.origin == "deu":
                    copies_of[env.body] = copies_of.get(env.body, 0) + 1
                if rx == "deu" and env.kind == Kind.ACK and len(net.lost) == 2:
                    heard = decode_ack_body(env.body, cores["deu"].store.source).heard
                    answers += heard is not None  # a member said it lacks what deu announced
            cores[rx].on_bundle(payload, t)
        for name, core in cores.items():
            items = core.take()
            core.consumed([i.id for i in items], t)
            for d in items:
                came.setdefault((name, d.body), t)
    assert len(net.lost) == 2
    lost_at, _ = net.lost[1]
    (body,) = [b"deu %d" % (lost_at // 500)]
    late = {rx: came.get((rx, body), 10_000) - lost_at for rx in ("nor", "prt")}
    sent = cores["deu"].store.count("next_copies")
    if copies:
        # deu's next bundle goes within 500 ms of the lost one (the ack delay, or its next
        # report); it crosses in 200 ms
        assert max(late.values()) <= 700, f"deu's lost report came {late} ms after the loss"
        assert sent >= 1
        assert max(copies_of.values()) == 2  # each at most once again: the first and its copy
        # the copy rode in an ack-only bundle that announced deu's next number: read after the
        # copy, it finds nothing lacking, so no member answers it
        assert answers == 0
    else:
        assert max(late.values()) > 700 and sent == 0
    assert all(came.get((rx, b"deu %d" % i)) for rx in ("nor", "prt") for i in range(16))


def test_an_answer_is_read_against_the_group_it_came_in_whatever_order_the_configs_list_them(tmp_path):
    """S and R share two groups, g1 (with X) and g2 (with Y); S lists g1 first, R lists g2
    first.  R answers an announcement of S's g2 stream in g2's bundle: S must read it against
    g2 and resend g2's lost report to R, not look it up among g1's numbers and leave the
    report to a tail probe."""
    groups = {"g1": ("S", "R", "X"), "g2": ("S", "R", "Y")}
    order = {"S": ["g1", "g2"], "R": ["g2", "g1"], "X": ["g1"], "Y": ["g2"]}
    cores = {}
    for n in order:
        mine = {g: tuple(m for m in groups[g] if m != n) for g in order[n]}
        keys = {m: pair_key(n, m) for m in order if m != n} | {g: hashlib.sha256(g.encode()).digest() for g in mine}
        c = Codec(n, keys, mine)
        cores[n] = OverlayCore(
            Custody(MemoryStore(), n, groups=c.groups),
            c,
            SchedulerConfig(min_rto_ms=30_000, initial_rto_ms=60_000, ack_delay_ms=300),
        )
    flight, came, lost = [], {}, None
    for t in range(0, 8_000, 20):
        if t in (0, 3_000):
            cores["S"].submit("g2", b"g2 %d" % t, t, priority=Priority.PRIORITY)
        if t % 250 == 0:
            cores["Y"].submit("g2", b"y %d" % t, t)  # S acks Y in ack-only g2 bundles: they announce
        for n, c in cores.items():
            for o in c.poll(t):
                for rx in [m for m in groups[o.dst] if m != n] if o.dst in groups else [o.dst]:
                    if n == "S" and o.dst == "g2" and o.seqs and t >= 3_000 and rx == "R" and lost in (None, t):
                        lost = t  # lost on R's leg only
                        continue
                    flight.append((t + 200, rx, o.payload))
        for f in [f for f in flight if f[0] <= t]:
            flight.remove(f)
            cores[f[1]].on_bundle(f[2], t)
        for n, c in cores.items():
            for d in c.take():
                came.setdefault((n, d.body), t)
                c.consumed([d.id], t)
    assert lost is not None
    assert came.get(("R", b"g2 3000"), 8_000) - lost <= 1_300
    assert cores["S"].store.count("heard_gaps") == 1
