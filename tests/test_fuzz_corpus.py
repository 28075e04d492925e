"""The fuzzing campaign's corpus (tests/fuzz_corpus/<target>/, kept by `c2dtn perf fuzz
--save`) replayed through every target: each input is taken or refused with the target's
typed error, nothing else.  And the crashes the campaign found, each as a test of its own."""

from __future__ import annotations

import struct

import cbor2
import pytest

from c2dtn.errors import ConfigError
from c2dtn.perf.fuzz import CORPUS
from c2dtn.perf.fuzz_targets import KEY, MEMORY_LIMIT, PEER, TARGETS, _codec

try:
    import mqtt5  # the mqtt_diff target's oracle, from the [test] extra
except ImportError:
    mqtt5 = None


# mqtt5 (pyo3) leaves an exception unraised after some of its own refusals: its defect, not ours
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_fuzz_corpus_replays_with_typed_refusals_only(name, tmp_path, monkeypatch):
    if name == "mqtt_diff" and mqtt5 is None:
        pytest.skip("mqtt_diff compares with the mqtt5 codec, not installed (pip install 'c2dtn[test]')")
    monkeypatch.setenv("C2DTN_FUZZ_DIR", str(tmp_path))
    t = TARGETS[name]
    files = sorted((CORPUS / name).iterdir()) if (CORPUS / name).is_dir() else []
    assert len(files) >= 3, f"no corpus kept for {name}: run c2dtn perf fuzz --save"
    t.counts.update(accepted=0, refused=0)
    inputs = t.seeds() + [f.read_bytes() for f in files]
    for data in inputs:
        # anything but the typed refusal, or OverLimit (10 ms, 8 µs a byte past that), propagates
        t(data)
    assert t.counts["accepted"] + t.counts["refused"] == len(files) + len(t.seeds())
    assert t.counts["accepted"] >= 1  # the seeds at least are taken
    peaks = sorted((t.traced_peak(d), len(d)) for d in inputs)
    assert peaks[-1][0] <= MEMORY_LIMIT, f"an input of {peaks[-1][1]} bytes took {peaks[-1][0]} bytes of memory"


@pytest.mark.parametrize(
    "name, finding",
    [
        ("container", "sharing-bomb"),
        ("container", "wrapped-splice"),
        ("envelope", "sharing-bomb-in-map"),
        ("ack", "trillion-ids"),
        ("ack", "sharing-bomb"),
        ("ack", "run-of-strings"),
        ("ack", "trillion-ids-array"),
        ("ack", "sharing-bomb-array"),
        ("ack", "run-of-strings-array"),
        ("ack", "duplicate-source"),
        ("envelope", "compressed-ack-bomb"),
        ("container", "sender-is-group"),
        ("container", "million-items"),
        ("mqtt", "disconnects-8k"),
        ("mqtt", "auths-8k"),
        ("mqtt", "pingreqs-8k"),
        ("config", "deep-array"),
        ("bodies", "user-property-string"),
    ],
)
def test_the_review_findings_are_in_the_corpus_and_within_the_limits(name, finding, tmp_path, monkeypatch):
    """Each finding of the attacker's review is an entry of the corpus that `make test` replays
    and `perf fuzz` starts from; a target over its time limit or 32 MB on it fails (OverLimit)."""
    monkeypatch.setenv("C2DTN_FUZZ_DIR", str(tmp_path))
    data = (CORPUS / name / f"review-{finding}").read_bytes()
    t = TARGETS[name]
    t(data)
    assert t.traced_peak(data) < 1 << 20


def test_an_input_over_the_time_limit_is_a_crash():
    import time

    from c2dtn.perf.fuzz_targets import OverLimit, Target

    t = Target(lambda d: time.sleep(0.02), (ValueError,), list, "slow")
    with pytest.raises(OverLimit, match="ms for an input of 3 bytes"):
        t(b"abc")
    t(bytes(8192))  # 20 ms is within what 8 kB may take (8 µs a byte)
    slower = Target(lambda d: time.sleep(0.07), (ValueError,), list, "slower")
    with pytest.raises(OverLimit, match=r"ms for an input of 8192 bytes \(limit 65.5 ms\)"):
        slower(bytes(8192))
    big = Target(lambda d: bytearray(64 << 20)[0], (ValueError,), list, "greedy")
    assert big.traced_peak(b"") > MEMORY_LIMIT


def test_found_a_zstd_body_declaring_a_terabyte_is_refused_not_allocated():

    from c2dtn.overlay import envelope as E

    frame = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 1 << 40) + b"\x01\x00\x00"
    mb = cbor2.dumps({3: 1, 4: 1, 5: 1, 9: int(E.Compression.ZSTD), 8: frame})
    with pytest.raises(E.Oversize, match="declares 1099511627776 bytes"):
        _codec().open_bundle(E.Codec(PEER, {"gw4": KEY}).container([mb], "gw4"))


def test_found_a_config_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    from c2dtn.overlay.config import load_node_config

    f = tmp_path / "n.toml"
    f.write_bytes(b'[node]\nid = "gw\xbb"\n')
    with pytest.raises(ConfigError, match="not UTF-8 text: byte 0xbb at offset 15"):
        load_node_config(f)


def test_found_a_cla_spec_with_a_lone_bracket_is_refused():
    from c2dtn.cla_adapters import parse_cla

    with pytest.raises(ConfigError, match="not a CLA spec: Invalid IPv6 URL"):
        parse_cla("tcpcl://[10.0.0.1:4556", "n.toml", "agent.listen[0]")


def test_found_a_coap_datagram_whose_options_cannot_be_sent_on_is_refused():
    from c2dtn.ip_gateway.coap_core import CoapError, decode

    with pytest.raises(CoapError, match="cannot be sent on"):
        decode(bytes.fromhex("67fbfbffffe0569cc2064b08c7324dab4ebb78abe0ffff"))


@pytest.mark.skipif(mqtt5 is None, reason="the mqtt5 codec is not installed (pip install 'c2dtn[test]')")
def test_the_differential_target_fails_on_a_disagreement_it_cannot_explain(monkeypatch):
    from c2dtn.ip_gateway import mqtt
    from c2dtn.perf import mqtt_diff as D

    pub = mqtt.encode(mqtt.Publish("c2/pos", b"x", 1, packet_id=3), 5)
    assert D.compare(pub) == "agree"
    # the CONNECT the reader took with bytes left over before 2026-11-24: the oracle refuses it
    junk = bytes([0x10, 0x11]) + mqtt.encode(mqtt.Connect("c1", version=5), 5)[2:] + b"junk"
    real = D.ours
    monkeypatch.setattr(D, "ours", lambda data: ("ok", (mqtt.Connect("c1", version=5), len(data))))
    with pytest.raises(D.Disagreement, match="the oracle refuses it"):
        D.compare(junk)
    # both take it, but read a field differently
    monkeypatch.setattr(D, "ours", lambda data: ("ok", (mqtt.Publish("c2/pot", b"x", 1, packet_id=3), len(data))))
    with pytest.raises(D.Disagreement, match="read it differently"):
        D.compare(pub)
    monkeypatch.setattr(D, "ours", real)
    # an explained one: the reader refuses a wildcard in a topic name, the oracle takes it
    wild = mqtt.encode(mqtt.Publish("c2/+", b"x"), 5)
    assert "MQTT-3.3.2-2" in D.compare(wild)
