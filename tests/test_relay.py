"""The relay between agent islands (overlay.relay): routing by the envelope's destination
without keys, a durable queue, bad input dropped and counted, its configuration checked."""

from __future__ import annotations

import os

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c2dtn.errors import ConfigError
from c2dtn.overlay.envelope import Codec, Envelope, Kind
from c2dtn.overlay.relay import RelayCore, Unroutable, load_relay_config, payload_destination

KEY = bytes(range(32))
ISLANDS = {"dtn7": {"deu-gw", "usa-gw"}, "ibrdtn": {"prt-gw"}, "ion": {"nor-gw"}}


def bundle(src: str, dst: str, n: int = 1, body: bytes = b"x" * 100) -> bytes:
    c = Codec(src, {dst: KEY})
    return c.bundle([Envelope(Kind.DATA, src, i, dst, 1000, 60_000, body=body) for i in range(n)])


@pytest.fixture
def core(tmp_path):
    c = RelayCore.open(tmp_path / "relay.db", ISLANDS)
    yield c
    c.close()


def test_a_bundle_goes_to_the_island_of_its_destination_and_opens_there_unchanged(core):
    p = bundle("deu-gw", "prt-gw", 3)
    assert core.route("dtn7", p) == ("ibrdtn", "prt-gw")
    assert core.accept("dtn7", [p], 5) == ["ibrdtn"]
    [(rid, dst, payload, held)] = core.take("ibrdtn")
    assert (dst, payload, held) == ("prt-gw", p, 5)
    # the relay holds no key; the destination checks the sender's tag
    rx = Codec("prt-gw", {"deu-gw": KEY})
    assert rx.open_container(payload).sender == "deu-gw" and [e.seq for e in rx.open_bundle(payload)] == [0, 1, 2]
    core.done([(rid, dst, payload, held)])
    assert core.take("ibrdtn") == [] and core.held_bytes == 0 and core.counters["forwarded"] == 1


def test_acks_cross_back_the_same_way(core):
    c = Codec("prt-gw", {"deu-gw": KEY})
    ack = c.bundle([Envelope(Kind.ACK, "prt-gw", 0, "deu-gw", 1000, 60_000, body=b"\x80")])
    assert core.route("ibrdtn", ack) == ("dtn7", "deu-gw")


def test_a_destination_no_island_reaches_or_in_the_sending_island_is_refused_by_name(core):
    with pytest.raises(Unroutable, match="no island reaches node 'fra-gw'"):
        core.route("dtn7", bundle("deu-gw", "fra-gw"))
    with pytest.raises(Unroutable, match="'usa-gw' is in island dtn7, where the bundle came from"):
        core.route("dtn7", bundle("deu-gw", "usa-gw"))


def test_a_default_island_takes_what_no_island_names(tmp_path):
    c = RelayCore.open(tmp_path / "r.db", {"dtn7": {"deu-gw", "*"}, "ibrdtn": {"prt-gw"}})
    assert c.route("ibrdtn", bundle("prt-gw", "fra-gw")) == ("dtn7", "fra-gw")
    with pytest.raises(Unroutable, match="no island reaches"):  # not back into the island it came from
        c.route("dtn7", bundle("deu-gw", "fra-gw"))


def test_the_queue_survives_a_restart_in_order(tmp_path):
    c = RelayCore.open(tmp_path / "r.db", ISLANDS)
    ps = [bundle("deu-gw", "prt-gw", body=os.urandom(50 + i)) for i in range(5)]
    c.accept("dtn7", ps, 1)
    c.accept("ibrdtn", [bundle("prt-gw", "nor-gw")], 2)
    c.queue.close()  # a crash after the commit
    c = RelayCore.open(tmp_path / "r.db", ISLANDS)
    assert [r[2] for r in c.take("ibrdtn")] == ps
    assert c.held() == {"ibrdtn": 5, "ion": 1}
    assert c.held_bytes == sum(map(len, ps)) + len(bundle("prt-gw", "nor-gw"))
    c.close()


def test_a_full_relay_drops_the_newest_and_keeps_what_it_holds(tmp_path):
    p = bundle("deu-gw", "prt-gw", body=os.urandom(30_000))
    c = RelayCore.open(tmp_path / "r.db", ISLANDS, max_bytes=70_000)
    c.accept("dtn7", [p, p, p], 1)
    assert c.counters["accepted"] == 2 and c.counters["dropped_full"] == 1
    assert len(c.take("ibrdtn")) == 2
    c.close()


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"", "not an overlay container"),
        (b"\xff\x00garbage", "not an overlay container"),
        (cbor2.dumps([1, "deu-gw", "prt-gw", []]), "container version 1, this node speaks 6"),
        (cbor2.dumps([2, "deu-gw", "prt-gw", []]), "container version 2, this node speaks 6"),
        (cbor2.dumps([3, "deu-gw", "prt-gw", []]), "container version 3, this node speaks 6"),
        (cbor2.dumps([4, "deu-gw", "prt-gw", 0, 0, [[b"ct", bytes(16)]]]), "container version 4, this node speaks 6"),
        (cbor2.dumps([5, "deu-gw", "prt-gw", 0, 0, b"ct" + bytes(16)]), "container version 5, this node speaks 6"),
        (cbor2.dumps([6, "deu-gw", "prt-gw", 0, 0, bytes(17)]), "no envelopes"),
        (cbor2.dumps([6, "deu-gw", 5, 0, 0, b"ct" + bytes(16)]), "destination is not a node id: 5"),
        (cbor2.dumps([6, "deu-gw", "prt-gw", -5, 0, b"ct" + bytes(16)]), "base second -5"),
        (cbor2.dumps([6, "deu-gw", "prt-gw", 0, 0, bytes(16)]), "16-byte tag"),
        (cbor2.dumps([6, "deu-gw", "prt-gw", 0, 0, [b"ct", bytes(16)]]), "seal is not a byte string"),  # version 4 item
        (cbor2.dumps([6, "deu-gw", "x" * 10_000, 0, 0, b"ct" + bytes(16)]), r"'xxxx.*\(10000 characters\)$"),
    ],
)
def test_malformed_payloads_are_named(payload, why):
    with pytest.raises(Unroutable, match=why):
        payload_destination(payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_from_a_peer_is_dropped_and_counted_and_nothing_held_is_lost(tmp_path_factory, junk):
    c = RelayCore.open(tmp_path_factory.mktemp("r") / "r.db", ISLANDS)
    good = bundle("deu-gw", "prt-gw")
    c.accept("dtn7", [good], 1)
    c.accept("dtn7", [junk, good], 2)
    assert [r[2] for r in c.take("ibrdtn")] == [good, good]
    assert c.counters["unroutable"] == 1
    c.close()


def _island(tmp_path, name, kind, port, peers):
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'[node]\nid = "tacnet"\nstorage = "{tmp_path / name}"\noverlay = false\n\n'
        f'[agent]\nkind = "{kind}"\nlisten = ["udp://0.0.0.0:{port}"]\n\n'
        + "".join(f'[[agent.peers]]\nnode = "{n}"\ncla = "udp://10.0.0.{i + 1}:4556"\n\n' for i, n in enumerate(peers))
    )
    return p.name


def test_a_relay_config_names_its_islands_and_their_members(tmp_path):
    a = _island(tmp_path, "t-dtn7", "dtn7", 4556, ["deu-gw", "usa-gw"])
    b = _island(tmp_path, "t-ibr", "ibrdtn", 4557, ["prt-gw"])
    f = tmp_path / "relay.toml"
    f.write_text(f'[relay]\nid = "tacnet"\nstorage = "{tmp_path / "relay"}"\nislands = ["{a}", "{b}"]\n')
    cfg = load_relay_config(f)
    from c2dtn.overlay.relay import island_members

    assert {c.agent: island_members(c) for c in cfg.islands} == {"dtn7": {"deu-gw", "usa-gw"}, "ibrdtn": {"prt-gw"}}
    f.write_text(f'[relay]\nid = "tacnet"\nstorage = "{tmp_path / "relay"}"\nislands = ["{a}", "{a}"]\n')
    with pytest.raises(ConfigError, match="each island needs its own|two islands run dtn7"):
        load_relay_config(f)
    f.write_text(f'[relay]\nid = "tacnet"\nstorage = "{tmp_path / "relay"}"\nislands = ["{a}"]\n')
    with pytest.raises(ConfigError, match="relay.islands.*at least two"):
        load_relay_config(f)
    f.write_text(f'[relay]\nid = "tacnet"\nstorage = "x"\nislands = ["{a}", "{b}"]\nmax_bytes = -1\n')
    with pytest.raises(ConfigError, match="relay.max_bytes"):
        load_relay_config(f)


def test_a_node_config_sends_to_another_island_through_its_relay(tmp_path):
    from c2dtn.overlay.config import load_node_config

    f = tmp_path / "n.toml"
    f.write_text(f'[node]\nid = "deu-gw"\nstorage = "{tmp_path}"\n\n[relays]\nprt-gw = "tacnet"\n')
    assert load_node_config(f).relays == {"prt-gw": "tacnet"}
    f.write_text(f'[node]\nid = "deu-gw"\nstorage = "{tmp_path}"\n\n[relays]\nprt-gw = "deu-gw"\n')
    with pytest.raises(ConfigError, match="relays.prt-gw"):
        load_node_config(f)


def test_a_batch_the_disk_refused_is_not_counted_against_the_bound(tmp_path, monkeypatch):
    """Before, the bytes of a batch whose commit failed stayed counted as held: each refusal
    shrank the room for good, until the relay dropped everything as full."""
    from c2dtn.overlay.store.queue import QueueError

    p = bundle("deu-gw", "prt-gw", body=os.urandom(30_000))
    c = RelayCore.open(tmp_path / "r.db", ISLANDS, max_bytes=70_000)

    def full(rows):
        raise QueueError("database or disk is full")

    real = c.queue.add
    monkeypatch.setattr(c.queue, "add", full)
    for _ in range(3):
        with pytest.raises(QueueError):
            c.accept("dtn7", [p], 1)
    monkeypatch.setattr(c.queue, "add", real)
    c.accept("dtn7", [p, p], 2)
    assert c.held_bytes == 2 * len(p) and len(c.take("ibrdtn")) == 2 and c.counters["dropped_full"] == 0
    c.close()
