"""What c2dtn takes from peers and operators, as fuzz targets.

Each target takes bytes and either accepts them or refuses them with its own typed error
(the `refuses` classes); any other exception is a crash.  perf/fuzz.py runs them under
atheris (coverage-guided); tests/test_fuzz_corpus.py replays the corpus kept under
tests/fuzz_corpus/<target>/ in `make test`.  Importing this module needs no atheris.
"""

from __future__ import annotations

import gc
import hashlib
import os
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

from c2dtn.cla_adapters import bpv7, tcpcl4
from c2dtn.errors import C2Error
from c2dtn.ip_gateway import bodies, coap_core, mqtt
from c2dtn.overlay import api
from c2dtn.overlay import envelope as E
from c2dtn.overlay.agents import DEFAULT
from c2dtn.overlay.config import load_node_config  # imported here, so atheris instruments it
from c2dtn.perf import mqtt_diff

KEY = b"k" * 32
PEER, ME = "gw1", "gw4"


# What one input may cost, whatever it holds: decoding is linear in its size, and fuzz inputs are
# at most 8 kB (perf/fuzz.py), so a slower or larger one is a finding (a crash), not noise.  The
# time allowed grows with the input past 10 ms: a stream of thousands of two-byte packets is
# linear, and its per-packet cost alone passes a flat 10 ms; a quadratic cost still passes
# 8 µs a byte well before 8 kB (docs/perf/fuzz.md).
TIME_LIMIT_S = 0.010
TIME_PER_BYTE_S = 8e-6


def time_limit_s(size: int) -> float:
    """The time an input of `size` bytes may take."""
    return max(TIME_LIMIT_S, size * TIME_PER_BYTE_S)


MEMORY_LIMIT = 32 << 20  # bytes: the rise of the process's peak, or of Python's traced peak


class OverLimit(Exception):
    """An input took more time or memory than the limits allow."""


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Target:
    run: Callable[[bytes], object]
    refuses: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    what: str
    counts: dict = field(default_factory=lambda: {"accepted": 0, "refused": 0})
    rss_limit: bool = True  # False where another program's memory is in the process (an oracle)
    timed: bool = True  # False under atheris: instrumented code is several times slower (perf/fuzz.py times it after)

    def __call__(self, data: bytes) -> None:
        """Run one input: taken or refused, within time_limit_s and MEMORY_LIMIT (OverLimit)."""
        peak = _maxrss()
        t0 = time.perf_counter()
        self._once(data, count=True)
        took = time.perf_counter() - t0
        limit = time_limit_s(len(data))
        if took > limit and self.timed:  # the machine may have paused: slow thrice is slow
            for _ in range(2):
                gc.collect()  # a collection the host's heap owes is not this input's (a test process's is large)
                t0 = time.perf_counter()
                self._once(data, count=False)
                took = min(took, time.perf_counter() - t0)
            if took > limit:
                raise OverLimit(f"{took * 1000:.1f} ms for an input of {len(data)} bytes (limit {limit * 1000:.1f} ms)")
        grew = _maxrss() - peak
        if grew > MEMORY_LIMIT and self.rss_limit:
            raise OverLimit(
                f"the process's peak memory rose {grew >> 20} MB for an input of {len(data)} bytes "
                f"(limit {MEMORY_LIMIT >> 20} MB)"
            )

    def _once(self, data: bytes, count: bool) -> None:
        try:
            self.run(data)
        except self.refuses:
            if count:
                self.counts["refused"] += 1
        else:
            if count:
                self.counts["accepted"] += 1

    def traced_peak(self, data: bytes) -> int:
        """Python's peak allocation while running one input (tracemalloc: exact, and slow)."""
        tracemalloc.start()
        try:
            self._once(data, count=False)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def _codec() -> E.Codec:
    return E.Codec(ME, {PEER: KEY, "fmn": KEY[::-1]}, {"fmn": (PEER, "gw9")})


_CODEC = _codec()


def _env(**kw) -> E.Envelope:
    base = dict(
        kind=E.Kind.DATA,
        origin=PEER,
        seq=7,
        dst=ME,
        created_ms=1_700_000_000_000,
        lifetime_ms=60_000,
        priority=E.Priority.FLASH,
        supersede="pos",
        body=b"report " * 20,
        app="mqtt",
        cseq=3,
        floor=2,
        inc=0x1F2E3D4C,
    )
    base.update(kw)
    return E.Envelope(**base)


# -- the envelope decoder, past a valid seal (the map is encrypted with the right key) -------
_SEALER = E.Codec(PEER, {ME: KEY})


def _envelope(data: bytes) -> None:
    (env,) = _CODEC.open_bundle(_SEALER.container([data], ME))
    if env.kind == E.Kind.ACK:  # as the node reads it, once opened
        E.decode_ack_body(env.body, "gw4/1f2e3d4c")


def _envelope_seeds() -> list[bytes]:
    seeds = [
        _SEALER.map_bytes(e, delta=True)
        for e in (
            _env(),
            _env(body=bytes(range(256)) * 8, supersede=None),
            _env(kind=E.Kind.ACK, body=E.encode_ack_body({"gw4": ([1], [2])})),
        )
    ]
    # a delta against the first (the receiver holds it once that seed is opened): the edits of it
    _SEALER.acked(ME, [7])
    return seeds + [_SEALER.map_bytes(_env(seq=8, body=b"report " * 19 + b"Report "), delta=True)]


# -- a delta body's edits, against a reference held (decision 0025) -------------------------
_EDITS_KEY = b"e" * 32
_EDITS_REF = b'\x04\x03\x02\x01{"coordinates": [59.930761, 10.739773, 0], "msg_id": "NOR-S003_199"}'


def _edits(data: bytes) -> None:
    E._apply_edits(data, _EDITS_REF, _EDITS_KEY)


def _edits_seeds() -> list[bytes]:
    near = _EDITS_REF.replace(b"930761", b"930812").replace(b"_199", b"_200")
    return [E._edits(b, _EDITS_REF, _EDITS_KEY) for b in (near, _EDITS_REF[:40], _EDITS_REF + b"!" * 30)]


# -- a whole bundle payload: the container, then every envelope in it ----------------------
def _container(data: bytes) -> None:
    c = _CODEC.open_container(data)
    for m in _CODEC.open_items(c):
        _CODEC.open(c, m)


def _container_seeds() -> list[bytes]:
    sealer = E.Codec(PEER, {ME: KEY})
    member = E.Codec(PEER, {ME: KEY, "gw9": KEY, "fmn": KEY[::-1]}, {"fmn": (ME, "gw9")})  # a group bundle
    # stamped as a scheduler stamps it: a copy of an old envelope (a negative offset), and one of
    # another incarnation (its own in its map)
    st = (1_700_000_600, 9)
    return [
        sealer.bundle([_env(), _env(seq=8, cseq=4)]),
        member.bundle([_env(dst="fmn"), _env(dst="fmn", seq=8)], "fmn"),
        sealer.bundle([_env(inc=9), _env(seq=9, inc=4)], ME, st),
    ]


def _ack(data: bytes) -> None:
    E.decode_ack_body(data, "gw1/1f2e3d4c")


def _ack_seeds() -> list[bytes]:
    return [E.encode_ack_body({"gw1/1f2e3d4c": ([1, 2, 3, 9], [12]), "gw9": ([], [4, 5])})]


# -- BPv7 bundles (what the HDTN driver takes off TCPCLv4) -----------------------------------
def _bpv7(data: bytes) -> None:
    bpv7.decode(data)


def _bpv7_seeds() -> list[bytes]:
    return [bpv7.encode((42, 0), (43, 0), b"payload" * 10, 60_000, 1_000, 1)]


# -- a TCPCLv4 session: the peer's bytes from the contact header on --------------------------
def _tcpcl4(data: bytes) -> None:
    s = tcpcl4.Session("ipn:43.0", 0.0)
    s.start()
    s.feed(data, 1.0)


def _tcpcl4_seeds() -> list[bytes]:
    import struct

    node = b"ipn:42.0"
    init = struct.pack(">BHQQH", 7, 15, 100, 1 << 20, len(node)) + node + struct.pack(">I", 0)
    seg = struct.pack(">BBQ", 1, 0x03, 0) + struct.pack(">I", 0) + struct.pack(">Q", 5) + b"hello"
    return [b"dtn!\x04\x00" + init + seg]


# -- MQTT: a stream of packets, the protocol version chosen by the first byte ----------------
def _mqtt(data: bytes) -> None:
    if not data:
        return
    version = (None, 4, 5, 3)[data[0] % 4]
    p = mqtt.Parser(max_packet_size=1 << 16, version=version)
    for i in range(1, len(data), 97):  # in pieces, as a socket hands them over
        p.feed(data[i : i + 97])


def _mqtt_seeds() -> list[bytes]:
    out = []
    for v, lead in ((4, b"\x01"), (5, b"\x02")):
        pkts = [
            mqtt.Connect(client_id="c2-unit", clean_start=True, keepalive=30, version=v),
            mqtt.Publish("c2/pos", b"x" * 40, qos=1, packet_id=3),
            mqtt.Subscribe(4, [mqtt.SubOption("c2/#", 1)]),
            mqtt.PingReq(),
            mqtt.Disconnect(),
        ]
        out.append(lead + b"".join(mqtt.encode(p, v) for p in pkts))
    return out


# -- MQTT 5, differential against the mqtt5 codec (perf/mqtt_diff.py) ------------------------
def _mqtt_diff(data: bytes) -> None:
    why = mqtt_diff.compare(data)  # Disagreement (a crash) unless they agree or it is explained
    if why != "agree":
        ex = TARGETS["mqtt_diff"].counts.setdefault("explained", {})
        ex[why] = ex.get(why, 0) + 1


def _mqtt_diff_seeds() -> list[bytes]:
    pkts = [
        mqtt.Connect(
            "c2-unit",
            True,
            30,
            "u",
            b"p",
            mqtt.Will("w/t", b"bye", 1, True, {"will_delay_interval": 3}),
            5,
            {"session_expiry_interval": 60, "receive_maximum": 10, "authentication_method": "m"},
        ),
        mqtt.Publish(
            "c2/pos",
            b"x" * 10,
            1,
            packet_id=3,
            properties={
                "message_expiry_interval": 5,
                "user_property": [("a", "b")],
                "correlation_data": b"c",
                "response_topic": "r",
                "content_type": "t",
            },
        ),
        mqtt.Publish(
            "c2/pos",
            b"y",
            0,
            properties={"topic_alias": 2, "subscription_identifier": [4], "payload_format_indicator": 1},
        ),
        mqtt.Subscribe(
            4, [mqtt.SubOption("c2/#", 1, True, False, 1), mqtt.SubOption("a/+/b", 2)], {"subscription_identifier": [3]}
        ),
        mqtt.Unsubscribe(5, ["c2/#"]),
        mqtt.PingReq(),
        mqtt.PingResp(),
        mqtt.Disconnect(4, {"reason_string": "x", "session_expiry_interval": 3}),
        mqtt.PubAck(7, 0x10),
        mqtt.PubRec(7),
        mqtt.PubRel(7),
        mqtt.PubComp(7, 0x92, {"reason_string": "r"}),
        mqtt.SubAck(4, [0, 1, 0x80]),
        mqtt.UnsubAck(5, [0]),
        mqtt.ConnAck(
            True,
            0,
            {
                "maximum_qos": 1,
                "assigned_client_identifier": "z",
                "server_keep_alive": 5,
                "retain_available": 0,
                "topic_alias_maximum": 8,
            },
        ),
        mqtt.Auth(0x18, {"authentication_method": "x", "authentication_data": b"d"}),
    ]
    return [mqtt.encode(p, 5) for p in pkts]


# -- the gateway's envelope bodies (MQTT and CoAP) ------------------------------------------
def _bodies(data: bytes) -> None:
    bodies.unpack(data)


def _bodies_seeds() -> list[bytes]:
    return [bodies.pack("bpub", "c2bridge-prt-gw", "10.79.3.5:1883", t="c2/pos", p=b"r" * 30, q=1, r=False, x={})]


# -- CoAP datagrams at the near gateway ------------------------------------------------------
_COAP = None


def _coap(data: bytes) -> None:
    global _COAP
    if _COAP is None or len(_COAP.exchanges) > 10_000:
        _COAP = coap_core.NearCoap(
            rules=[coap_core.ResourceRule("/orders/*", E.Priority.IMMEDIATE, 60, True)], gateway_for=lambda ip: "gw4"
        )
    _COAP.datagram(data, ("10.80.1.2", 40000), ("10.80.4.2", 5683), 1_000)


def _coap_seeds() -> list[bytes]:
    from aiocoap import CON, GET, POST, Message

    out = []
    for code, path, payload in ((GET, "orders/1", b""), (POST, "orders/2", b'{"move": "grid 1234"}')):
        m = Message(code=code, payload=payload)
        m.mtype, m.mid, m.token = CON, 17, b"\x01\x02"
        m.opt.uri_path = tuple(path.split("/"))
        out.append(m.encode())
    return out


# -- the node config loader ------------------------------------------------------------------
def _cfg_dir() -> Path:
    """Where the config target writes its file: C2DTN_FUZZ_DIR (the runner's work folder, a
    test's tmp_path), else the system's temp folder, one file per process."""
    d = Path(os.environ.get("C2DTN_FUZZ_DIR") or tempfile.gettempdir()) / f"c2-fuzz-cfg-{os.getpid()}"
    d.mkdir(exist_ok=True)
    return d


def _config(data: bytes) -> None:
    f = _cfg_dir() / "node.toml"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    load_node_config(f)


def _config_seeds() -> list[bytes]:
    return [
        (
            f'[node]\nid = "gw1"\nstorage = "/var/lib/c2dtn/gw1"\n[agent]\nkind = "{DEFAULT}"\nrouting = "epidemic"\n'
            'listen = ["tcpcl://0.0.0.0:4556"]\n[[agent.peers]]\nnode = "r2"\ncla = "udp://10.77.1.2:4556"\n'
            '[[agent.routes]]\nto = "*"\nvia = "r2"\n[keys]\ngw4 = "'
            + "ab" * 32
            + '"\nfmn = "'
            + "cd" * 32
            + '"\n[groups]\nfmn = ["gw1", "gw4"]\n[scheduler]\ninit_window = 4096\n[quota]\nmax_envelopes = 10\n'
        ).encode()
    ]


# -- the node's local HTTP API: a query string, a newline, a body ---------------------------
def _api(data: bytes) -> None:
    query, _, body = data.partition(b"\n")
    q: dict[str, str] = {}
    for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        q.setdefault(k, v)  # aiohttp's req.query.get gives the first value of a name
    refused = 0
    for call in (lambda: api.parse_send(q), lambda: api.parse_recv(q), lambda: api.parse_consumed(body)):
        try:
            call()
        except api.ApiError:
            refused += 1
    if refused == 3:
        raise api.ApiError("all three requests refused")


def _api_seeds() -> list[bytes]:
    return [
        b'dst=gw4&priority=flash&lifetime=60&app=raw&supersede=pos&wait=1.5&max=10\n{"ids": [1, 2, 3]}',
        b'dst=gw4\n{"ids": []}',
        b"wait=nan&max=-1&lifetime=inf\n[1]",
    ]


TARGETS: dict[str, Target] = {
    "envelope": Target(_envelope, (E.EnvelopeError,), _envelope_seeds, "an envelope map past a valid tag"),
    "container": Target(_container, (E.EnvelopeError,), _container_seeds, "a bundle payload and its envelopes"),
    "edits": Target(_edits, (E.EnvelopeError,), _edits_seeds, "a delta body's edits against its reference"),
    "ack": Target(_ack, (E.EnvelopeError,), _ack_seeds, "an ack body"),
    "bpv7": Target(_bpv7, (bpv7.BundleError,), _bpv7_seeds, "a BPv7 bundle"),
    "tcpcl4": Target(_tcpcl4, (tcpcl4.ProtocolError,), _tcpcl4_seeds, "a TCPCLv4 peer's bytes"),
    "mqtt": Target(_mqtt, (mqtt.MqttError,), _mqtt_seeds, "an MQTT packet stream (3.1, 3.1.1, 5)"),
    "mqtt_diff": Target(
        _mqtt_diff,
        (mqtt.MqttError,),
        _mqtt_diff_seeds,
        "an MQTT 5 packet, read by ours and by the mqtt5 codec (differential)",
        # the oracle's first panic maps its debug info (~47 MB of Rust memory, not ours);
        # our reader's memory is checked by the mqtt target, and traced here by the replay
        rss_limit=False,
    ),
    "bodies": Target(_bodies, (bodies.BodyError,), _bodies_seeds, "an MQTT gateway envelope body"),
    "coap": Target(_coap, (coap_core.CoapError,), _coap_seeds, "a CoAP datagram at the near gateway"),
    "config": Target(_config, (C2Error,), _config_seeds, "a node config file"),
    "api": Target(_api, (api.ApiError,), _api_seeds, "a local API request's query and body"),
}


def digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()
