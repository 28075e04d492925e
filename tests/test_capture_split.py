"""perf/capture.py: a link capture split by layer, as the demo's report shows it."""

import json
from pathlib import Path

import pytest

from c2dtn.cla_adapters import bpv7
from c2dtn.errors import C2Error
from c2dtn.overlay.envelope import Codec, Envelope, Kind, Priority, encode_ack_body
from c2dtn.perf import capture

scapy_l2 = pytest.importorskip("scapy.layers.l2", reason="scapy is a perf extra (requirements/dev.lock)")
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import ARP, Ether  # noqa: E402
from scapy.utils import PcapWriter  # noqa: E402

KEY = b"k" * 32


def _env(seq: int, body: bytes, kind: Kind = Kind.DATA) -> Envelope:
    return Envelope(kind, "gw1", seq, "gw4", 1_800_000_000_000 + seq, 60_000, Priority.ROUTINE, None, body, inc=7)


def _frame(payload: bytes) -> bytes:
    bundle = bpv7.encode((1, 1), (4, 1), payload, 60_000, 0, 0)
    return bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=4556, dport=4556) / bundle)


def test_split_counts_each_layer_once_and_adds_up(tmp_path: Path):
    gw1, gw4 = Codec("gw1", {"gw4": KEY}), Codec("gw4", {"gw1": KEY})
    report = b'{"unit":"DEU-UNIT001","lat":52.5,"lon":13.4}' * 3
    first = gw1.bundle([_env(1, report), _env(2, report)], "gw4")
    again = gw1.bundle([_env(2, report)], "gw4")  # a retransmission of 2
    ack = gw4.bundle(
        [Envelope(Kind.ACK, "gw4", 1, "gw1", 0, 60_000, body=encode_ack_body({"gw1/7": ([1, 2], [])}))], "gw1"
    )
    frames = [_frame(first), _frame(again), _frame(ack), bytes(Ether() / ARP())]
    pcap = tmp_path / "l.pcap"
    w = PcapWriter(str(pcap), linktype=1)
    for f in frames:
        w.write(f)
    w.close()

    sp = capture.split_run([pcap], {"gw1": gw1, "gw4": gw4})
    assert sp.total() == sum(map(len, frames))  # every byte of every frame is in one layer
    assert (sp.frames, sp.bundles, sp.ack_only_bundles) == (4, 3, 1)
    assert (sp.data_envelopes, sp.retransmitted, sp.unopened) == (2, 1, 0)
    assert sp.bytes["headers"] == 3 * (14 + 20 + 8)
    assert sp.bytes["other"] == len(frames[3])
    # the bodies as sent are compressed (a repeated report shrinks), and a bundle's seal is its tag
    # and framing, once a bundle: the array head inside, the byte string's head outside (2 bytes:
    # every seal here is 24 to 255 bytes)
    assert 0 < sp.bytes["body"] < 2 * len(report)
    assert sp.bytes["seal"] == 3 * (16 + 1 + 2)
    assert sp.bytes["retransmit"] > sp.bytes["seal"] // 2
    assert sp.bytes["acks"] > 16


def test_mqtt_sn_datagrams_count_as_mqtt_sn(tmp_path: Path):
    from c2dtn.perf import mqtt_sn

    publish = mqtt_sn.packet(mqtt_sn.PUBLISH, b"\x20\x00\x01\x00\x02" + b"r" * 230)
    puback = mqtt_sn.packet(mqtt_sn.PUBACK, b"\x00\x01\x00\x02\x00")
    frames = [
        bytes(Ether() / IP() / UDP(sport=40000, dport=mqtt_sn.GATEWAY_PORT) / publish),
        bytes(Ether() / IP() / UDP(sport=mqtt_sn.GATEWAY_PORT, dport=40000) / puback),
    ]
    pcap = tmp_path / "sn.pcap"
    w = PcapWriter(str(pcap), linktype=1)
    for f in frames:
        w.write(f)
    w.close()
    sp = capture.split_run([pcap], {})
    assert sp.bytes["mqttsn"] == len(publish) + len(puback) and sp.bytes["other"] == 0
    assert sp.bytes["headers"] == 2 * (14 + 20 + 8) and sp.bundles == 0
    assert capture.MQTTSN_PORT == mqtt_sn.GATEWAY_PORT


def test_envelopes_no_key_opens_are_counted_unopened(tmp_path: Path):
    gw1 = Codec("gw1", {"gw4": KEY})
    payload = gw1.bundle([_env(1, b"x" * 100)], "gw4")
    pcap = tmp_path / "l.pcap"
    w = PcapWriter(str(pcap), linktype=1)
    w.write(_frame(payload))
    w.close()
    sp = capture.split_run([pcap], {})
    assert (sp.unopened, sp.data_envelopes) == (1, 0)
    assert sp.total() == len(_frame(payload))


RUN = Path(__file__).resolve().parent.parent / "docs" / "results" / "20261130-060615-bft"  # make demo's job, committed


def test_spans_say_where_in_a_run_its_bytes_per_report_come_from(tmp_path: Path):
    *parts, whole = capture.spans(RUN, [(0, 8), (8, 20), (20, 80), (80, 1e9)])
    summary = json.loads((RUN / "summary.json").read_text())["modes"][0]
    # the whole run: every delivery the run counted, and every byte of the frames that arrived
    # (the layer split, read another way, adds up to the same bytes)
    assert (whole["link_bytes"], whole["delivered"]) == (summary["link_bytes"], summary["delivered"])
    assert whole["link_bytes"] == capture.split_run(sorted(RUN.glob("overlay-*.pcapng")), {}).total()
    assert sum(p["delivered"] for p in parts) == whole["delivered"]
    assert sum(p["link_bytes"] for p in parts) == whole["link_bytes"]
    # the figures decision 0033 cites: the start costs more than the steady state; the radio is
    # cut from 20 to 80 s, and nothing arrives then
    assert [(p["link_bytes"], p["delivered"]) for p in parts[:3]] == [(4869, 24), (3380, 45), (0, 0)]
    assert parts[1]["per_report"] == 3380 / 45


def test_spans_name_a_bad_results_folder(tmp_path: Path):
    import gzip
    import shutil

    with pytest.raises(C2Error, match="no events.jsonl"):
        capture.spans(tmp_path, [(0, 10)])
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    events = gzip.decompress((run / "events.jsonl.gz").read_bytes()).decode().splitlines()
    (run / "events.jsonl.gz").unlink()
    for lines, says in (
        (events + ['["not", "an", "event"]'], None),  # not an event: passed over
        (
            events + ['{"ev": "sent", "mode": "overlay", "id": "NOR-S001_999"}'],
            f"line {len(events) + 1}: a sent event needs",
        ),
        (events + ['{"ev": "recv", "mode": "overlay", "id": "NOR-S001_1", "t": 1, "from": "NOR"}'], "needs a text rx"),
        (events[:3] + ["{"], "line 4"),
    ):
        (run / "events.jsonl").write_text("\n".join(lines) + "\n")
        if says is None:
            capture.spans(run, [(0, 10)])
        else:
            with pytest.raises(C2Error, match=says):
                capture.spans(run, [(0, 10)])
    (run / "events.jsonl").unlink()
    (run / "events.jsonl.gz").write_bytes(gzip.compress("\n".join(events).encode())[:300])  # cut short
    with pytest.raises(C2Error, match="cannot be read"):
        capture.spans(run, [(0, 10)])
    (run / "events.jsonl.gz").write_bytes(gzip.compress("\n".join(events).encode()))
    (run / "overlay-r2-r3.pcapng").write_bytes(b"\x0a\x0d\x0d\x0a" + b"junk" * 10)
    with pytest.raises(C2Error, match="overlay-r2-r3.pcapng: not a capture"):
        capture.spans(run, [(0, 10)])


def test_perf_report_spans_names_a_bad_span():
    from click.testing import CliRunner

    from c2dtn.cli import cli

    for bad, says in (("8-2", "'8-2'"), ("x-3", "'x-3'"), ("5", "'5'"), ("4-10", "'4-10' overlaps 0-8")):
        r = CliRunner().invoke(cli, ["perf", "report", str(RUN), "--spans", f"0-8,{bad}"])
        assert r.exit_code == 2 and says in r.output, r.output
    r = CliRunner().invoke(cli, ["perf", "report", str(RUN), "--spans", "0-8", "--plot", "x.png"])
    assert r.exit_code == 2 and "one at a time" in r.output
    r = CliRunner().invoke(cli, ["perf", "report", str(RUN), "--spans", "0-8,8-20"])
    assert r.exit_code == 0 and "the whole run" in r.output and "its summary says" not in r.output
