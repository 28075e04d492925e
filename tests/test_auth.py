"""Clients log in through the gateway with the broker's own files: the password file
`mosquitto_passwd` writes and Mosquitto's ACL format, read by ip-gateway/auth.py and applied by
the near side's core (virtual time, no sockets).  The live check with Mosquitto's own tool is
test_gateway_live.py's."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess

import pytest
from test_near_core import Net, policy

from c2dtn.errors import ConfigError
from c2dtn.ip_gateway import auth as A
from c2dtn.ip_gateway import mqtt as m
from c2dtn.ip_gateway import near_core as nc


def pbkdf2_line(user: str, password: str, iterations: int = 101) -> str:
    salt = os.urandom(12)
    h = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"{user}:$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(h).decode()}"


ACL = """# anonymous clients
topic read public/#

user alice
topic readwrite c2/#
topic deny c2/secret/#

user bob
topic write c2/reports/#

pattern readwrite units/%u/#
pattern read clients/%c
"""


def net(allow_anonymous: bool | None = None) -> Net:
    a = A.Auth(
        A.parse_password_file(pbkdf2_line("alice", "s3cret") + "\n" + pbkdf2_line("bob", "b0b") + "\n", "pw"),
        A.parse_acl_file(ACL, "acl"),
    )
    if allow_anonymous is not None:
        a.allow_anonymous = allow_anonymous
    else:
        a.allow_anonymous = False
    return Net(nc.NearCore(policy(), max_packet_size=4096, auth=a))


def connect(n: Net, client: str, user: str | None, password: bytes | None, version: int = 5):
    n._next += 1
    cid = n._next
    n.core.open(cid, "10.77.4.2:1883", n.now)
    n.readers[cid] = m.Parser(1 << 20, version=version)
    n.inbox[cid] = []
    n.send(cid, m.Connect(client, True, 0, user, password, version=version), version)
    return cid, n.take(cid)[0]


def test_mosquitto_passwd_lines_are_checked_as_mosquitto_checks_them():
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd is not installed (Debian: mosquitto)")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "pw")
        subprocess.run(["mosquitto_passwd", "-c", "-b", f, "alice", "s3cret"], check=True)
        users = A.parse_password_file(open(f).read(), f)
    assert users["alice"].matches(b"s3cret") and not users["alice"].matches(b"s3cre7")


@pytest.mark.parametrize("version, ok, bad_pw, no_user", [(5, 0, 0x86, 0x87), (4, 0, 4, 5)])
def test_a_login_is_refused_with_the_protocols_own_code(version, ok, bad_pw, no_user):
    n = net()
    assert connect(n, "c1", "alice", b"s3cret", version)[1].reason == ok
    assert connect(n, "c2", "alice", b"wrong", version)[1].reason == bad_pw
    assert connect(n, "c3", "mallory", b"s3cret", version)[1].reason == bad_pw
    assert connect(n, "c4", None, None, version)[1].reason == no_user  # anonymous: off with a password file
    assert n.core.counters["logins_refused"] == 3
    assert [b["op"] for _, b, *_ in n.committed] == ["conn"]  # only alice's session reaches the far side
    assert n.committed[0][1]["u"] == "alice" and n.committed[0][1]["pw"] == b"s3cret"  # the far side logs in as her


def test_an_anonymous_client_gets_the_anonymous_rules_where_anonymous_is_allowed():
    n = net(allow_anonymous=True)
    cid, ack = connect(n, "anon", None, None)
    assert ack.reason == 0
    n.send(cid, m.Subscribe(1, [m.SubOption("public/news", 1), m.SubOption("c2/#", 1)]))
    assert n.take(cid)[0].reasons == [1, 0x87]


@pytest.mark.parametrize("version", [5, 4])
def test_publishes_and_subscriptions_follow_the_acl(version):
    n = net()
    cid, _ = connect(n, "alice-1", "alice", b"s3cret", version)
    n.send(cid, m.Publish("c2/orders", b"go", 1, packet_id=1), version)
    n.send(cid, m.Publish("c2/secret/plan", b"no", 1, packet_id=2), version)
    n.send(cid, m.Publish("units/alice/pos", b"here", 1, packet_id=3), version)
    n.send(cid, m.Publish("units/bob/pos", b"lie", 1, packet_id=4), version)
    acks = {p.packet_id: p.reason for p in n.take(cid)}
    denied = 0x87 if version == 5 else 0  # 3.1.1: acknowledged and dropped, as Mosquitto does
    assert acks == {1: 0, 2: denied, 3: 0, 4: denied}
    carried = [b["t"] for _, b, *_ in n.committed if b["op"] == "pub"]
    assert carried == ["c2/orders"] and n.core.counters["publishes_denied"] == 2
    assert n.core.counters["held_local"] == 1  # units/alice/pos: allowed, but not on the topic allow-list
    n.send(
        cid,
        m.Subscribe(
            5,
            [
                m.SubOption("c2/#", 1),
                m.SubOption("c2/secret/x", 1),
                m.SubOption("#", 0),
                m.SubOption("clients/alice-1", 0),
            ],
        ),
        version,
    )
    no = 0x87 if version == 5 else 0x80
    assert n.take(cid)[0].reasons == [1, no, no, 0]
    subs = [b["s"] for _, b, *_ in n.committed if b["op"] == "sub"]
    assert [s[0] for s in subs[0]] == ["c2/#", "clients/alice-1"]


def test_what_the_acl_denies_a_reader_is_not_delivered_to_it():
    n = net()
    cid, _ = connect(n, "bob-1", "bob", b"b0b")
    n.send(cid, m.Subscribe(1, [m.SubOption("units/bob/#", 1)]))
    n.take(cid)
    evs = n.core.deliver(
        "bob-1",
        7,
        {"op": "msg", "c": "bob-1", "b": "10.77.4.2:1883", "t": "c2/reports/x", "p": b"r", "q": 1, "r": False, "x": {}},
        0,
        0,
    )
    assert evs == [nc.Done(7)] and n.core.counters["deliveries_denied"] == 1


@pytest.mark.parametrize(
    "text, says",
    [
        ("alice", "not `user:hash`"),
        ("alice:$5$abc$def", "a hash of kind"),
        ("alice:$7$x$AAAA$AAAA", "invalid literal"),
        ("alice:$7$101$!!$AAAA", "not a hash mosquitto_passwd writes"),
    ],
)
def test_a_bad_password_file_line_is_named(text, says):
    with pytest.raises(ConfigError, match=says):
        A.parse_password_file(text, "passwd")


def test_a_bad_acl_line_is_named_and_a_gateway_config_reads_both_files(tmp_path):
    with pytest.raises(ConfigError, match="acl:2.*a line is `user`, `topic` or `pattern`"):
        A.parse_acl_file("user alice\nallow c2/#\n", "acl")
    from c2dtn.ip_gateway.policy import parse_gateway

    (tmp_path / "pw").write_text(pbkdf2_line("alice", "s3cret") + "\n")
    (tmp_path / "acl").write_text(ACL)
    cfg = parse_gateway("gw.toml", {"password_file": str(tmp_path / "pw"), "acl_file": str(tmp_path / "acl")})
    assert cfg.auth.allow_anonymous is False and cfg.auth.login("alice", b"s3cret") == 0
    assert parse_gateway("gw.toml", {}).auth is None
    with pytest.raises(ConfigError, match="password_file' = .*nope.*cannot be read"):
        parse_gateway("gw.toml", {"password_file": str(tmp_path / "nope")})


# -- session limits, as Mosquitto names them -------------------------------------------------


def limited(**kw) -> Net:
    from c2dtn.ip_gateway.policy import SessionLimits

    return Net(nc.NearCore(policy(), max_packet_size=4096, limits=SessionLimits(**kw)))


def connect_from(n: Net, client: str, source: str, version: int = 4, clean: bool = False):
    n._next += 1
    cid = n._next
    n.core.open(cid, "10.77.4.2:1883", n.now, source)
    n.readers[cid] = m.Parser(1 << 20, version=version)
    n.inbox[cid] = []
    props = {"session_expiry_interval": nc.NEVER} if version == 5 and not clean else {}
    n.send(cid, m.Connect(client, clean, 0, version=version, properties=props), version)
    return cid, n.take(cid)[0]


@pytest.mark.parametrize("version, refused", [(4, 3), (5, 0x97)])
def test_junk_sessions_past_max_sessions_are_refused_at_connect_not_after_a_puback(version, refused):
    """Defect: 10,000 junk clients (clean session 0) filled the far side's sessions; a genuine
    client's publishes were then PUBACKed and waited in custody for room no one would free."""
    n = limited(max_sessions=50)
    for i in range(50):
        cid, ack = connect_from(n, f"junk{i}", f"10.80.1.{i % 200}", version)
        assert ack.reason == 0
        n.lose(cid)  # gone; its session (clean session 0) stays
    cid, ack = connect_from(n, "genuine", "10.80.1.250", version)
    assert ack.reason == refused and cid in n.closed  # the client sees it, nothing of it is taken
    n.send(cid, m.Publish("c2/orders", b"go", 1, packet_id=1), version)
    assert "genuine" not in [b["c"] for _, b, *_ in n.committed]
    assert n.core.counters["connects_over_limits"] == 1
    cid, ack = connect_from(n, "junk3", "10.80.1.3", version)  # a held session comes back: not a new one
    assert ack.reason == 0


def test_connections_per_address_and_sessions_for_ever_end_as_configured():
    n = limited(max_connections_per_address=2, persistent_client_expiration=3600)
    held = [connect_from(n, f"u{i}", "10.80.1.7")[1].reason for i in range(3)]
    assert held == [0, 0, 3]
    assert connect_from(n, "other", "10.80.1.8")[1].reason == 0
    cid = n.core.active["u0"]
    n.lose(cid)
    assert "u0" in n.core.sessions
    n.advance(3601)
    assert "u0" not in n.core.sessions and "u0" in n.ended  # the session "for ever" ended after an hour


def test_session_limits_are_read_in_mosquittos_words():
    from c2dtn.ip_gateway.policy import parse_gateway

    cfg = parse_gateway(
        "gw.toml", {"max_sessions": 200, "max_connections_per_address": 8, "persistent_client_expiration": "2w"}
    )
    assert (
        cfg.limits.max_sessions,
        cfg.limits.max_connections_per_address,
        cfg.limits.persistent_client_expiration,
    ) == (200, 8, 14 * 86400)
    with pytest.raises(ConfigError, match="persistent_client_expiration' = '2 weeks'"):
        parse_gateway("gw.toml", {"persistent_client_expiration": "2 weeks"})
    assert parse_gateway("gw.toml", {}).limits.max_sessions == 1000


# -- found by the attacker review of the login, ACL and session limits ------------------------
def test_a_will_on_a_topic_the_user_may_not_write_is_refused_at_connect():
    """Before: alice, denied c2/secret/fire as a PUBLISH (0x87), set it as her will and cut
    the connection; the broker published it."""
    for version, code in ((5, 0x87), (4, 5)):
        n = net()
        n._next += 1
        cid = n._next
        n.core.open(cid, "10.77.4.2:1883", n.now)
        n.readers[cid] = m.Parser(1 << 20, version=version)
        n.inbox[cid] = []
        n.send(
            cid,
            m.Connect("alice-1", True, 0, "alice", b"s3cret", m.Will("c2/secret/fire", b"launch", 1), version),
            version,
        )
        assert n.take(cid)[0].reason == code and cid in n.closed
        assert n.committed == [] and n.core.counters["wills_denied"] == 1
        cid, ack = connect(n, "alice-2", "alice", b"s3cret", version)  # a will she may write is taken
        assert ack.reason == 0


def test_wildcards_or_levels_in_a_client_id_or_user_name_do_not_widen_a_pattern():
    """Mosquitto's CVE-2017-7650: bob with client id `#` turned `pattern read clients/%c`
    into clients/# and read alice's."""
    n = net()
    cid, ack = connect(n, "#", "bob", b"b0b")
    assert ack.reason == 0
    n.send(cid, m.Subscribe(1, [m.SubOption("clients/alice-1", 0), m.SubOption("clients/#", 0)]))
    assert n.take(cid)[0].reasons == [0x87, 0x87]
    evs = n.core.deliver(
        "#",
        9,
        {
            "op": "msg",
            "c": "#",
            "b": "10.77.4.2:1883",
            "t": "clients/alice-1",
            "p": b"alice's",
            "q": 0,
            "r": False,
            "x": {},
        },
        0,
        0,
    )
    assert evs == [nc.Done(9)] and n.take(cid) == []  # dropped for bob, never written
    acl = A.parse_acl_file("pattern readwrite units/%u/#\npattern read clients/%c\n", "acl")
    for user in ("+", "#", "bob/x"):
        assert not acl.allows(user, "c", "units/bob/x/orders", A.WRITE), user
    assert not acl.allows("bob", "alice/+", "clients/alice/x", A.READ)
    assert acl.allows("bob", "c", "units/bob/orders", A.WRITE) and acl.allows(None, "c1", "clients/c1", A.READ)


def test_another_user_cannot_take_over_a_connected_client_nor_lock_an_away_one_out():
    n = net()
    a, ack = connect(n, "alice-1", "alice", b"s3cret")
    assert ack.reason == 0
    b, ack = connect(n, "alice-1", "bob", b"b0b")
    assert ack.reason == 0x87 and b in n.closed and a not in n.closed  # alice stays connected
    assert n.core.active["alice-1"] == a and n.core.counters["takeovers_refused"] == 1
    a2, ack = connect(n, "alice-1", "alice", b"s3cret")  # her own takeover stands, as in MQTT
    assert ack.reason == 0 and a in n.closed
    # bob took "bob-1" first (a persistent session) and left: its owner is not locked out, and
    # gets a fresh session, never bob's (found by review: refused for as long as bob's lived)
    n._next += 1
    cid = n._next
    n.core.open(cid, "10.77.4.2:1883", n.now)
    n.readers[cid] = m.Parser(1 << 20, version=5)
    n.inbox[cid] = []
    n.send(
        cid, m.Connect("bob-1", False, 0, "bob", b"b0b", version=5, properties={"session_expiry_interval": nc.NEVER}), 5
    )
    n.send(cid, m.Subscribe(1, [m.SubOption("c2/reports/x", 0)]))
    n.lose(cid)
    assert "bob-1" in n.core.sessions
    n._next += 1
    cid = n._next
    n.core.open(cid, "10.77.4.2:1883", n.now)
    n.readers[cid] = m.Parser(1 << 20, version=5)
    n.inbox[cid] = []
    n.send(cid, m.Connect("bob-1", False, 0, "alice", b"s3cret", version=5), 5)
    ack = n.take(cid)[0]
    assert ack.reason == 0 and not ack.session_present and n.core.sessions["bob-1"].subs == {}
    assert "bob-1" in n.ended and n.core.counters["sessions_replaced"] == 1
    assert [b for _, b, *_ in n.committed if b["op"] == "conn" and b["c"] == "bob-1"][-1]["cs"] is True


def test_no_session_outlives_persistent_client_expiration_and_its_disconnect_expiry_reaches_the_far_side():
    """Before: CONNECT with expiry 0xFFFFFFFE (not "never", so uncapped), DISCONNECT with 0: the
    near side freed its slot at once, the far side kept the broker session for 136 years."""
    from c2dtn.ip_gateway import bodies
    from c2dtn.ip_gateway.policy import SessionLimits

    n = Net(nc.NearCore(policy(), max_packet_size=4096, limits=SessionLimits(persistent_client_expiration=7 * 86400)))
    cid, _ = n.connect("junk", props={"session_expiry_interval": 0xFFFFFFFE})
    n.send(cid, m.Disconnect())
    assert n.core.sessions["junk"].expires_at - n.now == 7 * 86400
    cid, _ = n.connect("junk2", props={"session_expiry_interval": 0xFFFFFFFE})
    n.send(cid, m.Disconnect(0, {"session_expiry_interval": 0}))
    assert "junk2" not in n.core.sessions
    disc = [b for _, b, *_ in n.committed if b["op"] == "disc" and b["c"] == "junk2"][0]
    assert disc["sx"] == 0
    assert bodies.unpack(bodies.pack("disc", "junk2", "b:1", w=False, sx=0))["sx"] == 0


def test_connections_that_never_send_connect_are_bounded_and_closed():
    from c2dtn.ip_gateway.policy import SessionLimits

    core = nc.NearCore(policy(), max_packet_size=1 << 20, limits=SessionLimits(max_connections_per_address=2))
    shut = sum(bool(core.open(cid, "10.77.4.2:1883", 0.0, source="10.0.0.66")) for cid in range(1, 101))
    assert shut == 98 and len(core.conns) == 2 and core.counters["connects_over_limits"] == 98
    # a first packet announcing ~1 MiB: refused past CONNECT_MAX_BYTES, before it is buffered
    evs = core.data(1, bytes([0x10, 0xF0, 0xFF, 0x3F]) + b"\0" * 1000, 0.0)
    assert any(isinstance(e, nc.Close) for e in evs) and 1 not in core.conns
    # by default (no per-address limit) one host holds at most CONNECT_WAITING_PER_ADDRESS idle
    # connections, and past max_sessions waiting in all the oldest goes, not the newcomer
    # (found by review: 1,000 idle connections from one host shut every new client out)
    core = nc.NearCore(policy(), limits=SessionLimits(max_sessions=40))
    shut = sum(bool(core.open(cid, "b:1", 0.0, source="10.0.0.66")) for cid in range(1, 101))
    assert shut == 100 - nc.CONNECT_WAITING_PER_ADDRESS
    for i in range(40):
        core.open(1000 + i, "b:1", 1.0 + i, source=f"10.0.1.{i}")
    assert core.open(2000, "b:1", 50.0, source="10.0.2.1") != [] and 2000 in core.conns  # the oldest went
    assert 1 not in core.conns  # opened first, at 0.0
    quiet = nc.NearCore(policy(), limits=SessionLimits(max_connections_per_address=2))
    quiet.open(1, "10.77.4.2:1883", 0.0, source="10.0.0.67")
    quiet.data(1, bytes([0x10]), 0.0)  # a start, then silence
    assert quiet.next_deadline() == nc.CONNECT_TIMEOUT_S
    assert [type(e) for e in quiet.tick(nc.CONNECT_TIMEOUT_S)] == [nc.Close] and not quiet.conns
    assert quiet.counters["connect_timeouts"] == 1


def test_the_far_side_logs_in_to_the_broker_with_the_clients_user_name_and_password():
    """Before: the conn envelope carried u/pw but the far side dropped them and logged in
    anonymously, so the broker's own ACL never applied (and a broker without anonymous
    access refused every session whose messages were already PUBACKed)."""
    import types

    from c2dtn.ip_gateway import bodies
    from c2dtn.ip_gateway import far_core as fc

    msg = bodies.unpack(bodies.pack("conn", "alice-1", "10.77.4.2:1883", v=5, cs=True, ka=0, u="alice", pw=b"s3cret"))
    core = fc.FarCore("gw1", "alice-1", "10.77.4.2:1883", fc.FarLimits(), 0.0)
    assert fc.Open() in core.put((types.SimpleNamespace(id=1, created_ms=0), msg), 0.0)
    sent = b"".join(e.data for e in core.opened(0.1) if isinstance(e, fc.Write))
    conn = m.Parser(1 << 20).feed(sent)[0]
    assert (conn.username, conn.password) == ("alice", b"s3cret")
