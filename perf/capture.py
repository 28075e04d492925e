"""Where a radio link's bytes go: a capture of what an emulated link delivered (the emulator's
`capture` command, topologies.testbed.capture), split by layer.

Each frame is read down as far as it goes: Ethernet, IP and UDP or TCP headers; for a bundle
of the UDP convergence layer, its blocks (the primary block apart) around the payload, or, on
udphc, its compressed blocks (cla-adapters/udphc.py); for a
c2dtn container in the payload, its framing, its seal (the AEAD tag and the framing of the
sealed array, one a bundle) and, for each envelope in it, its fields and its body as sent.  Envelopes are opened
with the run's own keys (the node configs), so the split is of the bytes as they crossed the
link.  A data envelope already seen (same origin, incarnation and sequence number) is a
retransmission and counted as such whole (its map); an ack envelope is counted whole as acks.  TCP
payload (the Mosquitto bridge) stays one layer: MQTT.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import cbor2

from c2dtn.cla_adapters import udphc
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.envelope import Codec, EnvelopeError, Kind, split_container

MQTTSN_PORT = 10000  # the Paho MQTT-SN gateway's (perf/mqtt_sn.py GATEWAY_PORT)

# the layers in the order a report table lists them
LAYERS = (
    ("headers", "Ethernet, IP, UDP/TCP headers"),
    ("primary", "bundle primary block"),
    ("blocks", "other bundle blocks and the payload block's framing"),
    ("hc", "bundle blocks compressed on the air (udphc: all but the payload)"),
    ("container", "container framing (sender, destination, arrays, origin tags)"),
    ("seal", "seals (AEAD tag and its CBOR framing, one a bundle)"),
    ("fields", "fields of new data envelopes (ids, times, priority, order, key)"),
    ("body", "bodies of new data envelopes, as sent (compressed)"),
    ("retransmit", "retransmitted data envelopes (fields, body)"),
    ("acks", "ack envelopes (fields, ack body)"),
    ("mqtt", "TCP payload (MQTT)"),
    ("mqttsn", "UDP payload to or from an MQTT-SN gateway (MQTT-SN)"),
    ("other", "frames that are neither (ARP, ICMP, neighbour discovery, unreadable)"),
)


@dataclass
class Split:
    """Bytes per layer of one capture (LAYERS), and what was counted."""

    bytes: Counter = field(default_factory=Counter)
    frames: int = 0
    bundles: int = 0
    ack_only_bundles: int = 0
    data_envelopes: int = 0  # new ones
    retransmitted: int = 0
    unopened: int = 0  # bundles no key here opens (their seals counted as body)
    dropped: int = 0  # frames the emulator dropped (marked in the capture; not in the bytes)
    dropped_bytes: int = 0

    def total(self) -> int:
        return sum(self.bytes.values())

    def add(self, other: "Split") -> None:
        self.bytes.update(other.bytes)
        for k in (
            "frames",
            "bundles",
            "ack_only_bundles",
            "data_envelopes",
            "retransmitted",
            "unopened",
            "dropped",
            "dropped_bytes",
        ):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def codecs_of(configs: dict[str, Path]) -> dict[str, Codec]:
    """A codec per overlay node, from its config file (the relay's has no keys: skipped)."""
    out = {}
    for node, path in configs.items():
        try:
            cfg = load_node_config(path)
        except Exception:  # noqa: BLE001 - a relay's config, or one that is not a node's
            continue
        out[node] = Codec(cfg.id, cfg.keys, cfg.groups)
    return out


def _ip(frame: bytes) -> tuple[int, bytes, int] | None:
    """(IP protocol, transport segment, header bytes so far) of an Ethernet frame, or None."""
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    eth = Ether(frame)
    ip = eth.getlayer(IP) or eth.getlayer(IPv6)
    if ip is None:
        return None
    hdr = len(frame) - len(bytes(ip.payload)) if isinstance(ip, IP) else len(frame) - ip.plen
    if isinstance(ip, IP) and ip.frag:
        return None
    return (ip.proto if isinstance(ip, IP) else ip.nh), frame[hdr:], hdr


def split_capture(path: Path, codecs: dict[str, Codec], seen: set | None = None) -> Split:
    """The layers of every frame in the pcap at `path`.  seen: data envelope ids met so far on
    this link (a retransmission is one met before)."""
    from scapy.utils import RawPcapReader

    seen = set() if seen is None else seen
    sp = Split()
    for frame, meta in RawPcapReader(str(path)):
        if any(c.startswith(b"dropped") for c in getattr(meta, "comments", None) or ()):
            sp.dropped += 1  # the emulator's own view of a loss: it never reached the far end
            sp.dropped_bytes += len(frame)
            continue
        sp.frames += 1
        got = _ip(frame)
        if got is None:
            sp.bytes["other"] += len(frame)
            continue
        proto, seg, hdr = got
        if proto == 6 and len(seg) >= 20:  # TCP
            off = (seg[12] >> 4) * 4
            sp.bytes["headers"] += hdr + off
            sp.bytes["mqtt"] += len(seg) - off
            continue
        if proto != 17 or len(seg) < 8:
            sp.bytes["other"] += len(frame)
            continue
        sp.bytes["headers"] += hdr + 8
        if MQTTSN_PORT in struct.unpack(">HH", seg[:4]):
            sp.bytes["mqttsn"] += len(seg) - 8
            continue
        _bundle(seg[8:], codecs, seen, sp)
    return sp


def _bundle(data: bytes, codecs: dict[str, Codec], seen: set, sp: Split) -> None:
    """A UDP payload: a BPv7 bundle (an array of blocks) or a udphc frame, holding a container,
    as far as it reads."""
    try:
        if data[:1] == bytes([udphc.MARK]):
            head = udphc.header_bytes(data)
            payload, primary_bytes = data[head:], 0
        else:
            blocks = cbor2.loads(data)
            payload = next(b[4] for b in blocks[1:] if b[0] == 1)
            primary_bytes = len(cbor2.dumps(blocks[0]))
        sender, dst, seal, tags, _ = split_container(payload)
    except (cbor2.CBORDecodeError, EnvelopeError, IndexError, TypeError, KeyError, StopIteration, ValueError):
        sp.bytes["other"] += len(data)  # (udphc.HcError is a ValueError)
        return
    sp.bundles += 1
    if primary_bytes:
        sp.bytes["primary"] += primary_bytes
        sp.bytes["blocks"] += len(data) - len(payload) - primary_bytes
    else:
        sp.bytes["hc"] += len(data) - len(payload)
    codec = codecs.get(dst) or next(
        (c for n, c in codecs.items() if dst in c.groups and n != sender and sender in c.groups[dst]), None
    )
    sealed = len(cbor2.dumps(seal))  # the seal as sent
    sp.bytes["container"] += len(payload) - sealed
    maps = None
    if codec is not None:
        try:
            container = codec.open_container(payload)
            maps = codec.open_items(container)
        except EnvelopeError:
            maps = None
    if maps is None:
        sp.unopened += 1
        sp.bytes["body"] += sealed
        return
    inner = 0
    data_here = False
    for m in maps:
        raw = len(m)
        inner += raw
        try:
            env = codec.open(container, m)  # type: ignore[union-attr]
        except EnvelopeError:
            sp.bytes["other"] += raw
            continue
        if env.kind == Kind.ACK:
            sp.bytes["acks"] += raw
            continue
        data_here = True
        if env.msg_id in seen:
            sp.retransmitted += 1
            sp.bytes["retransmit"] += raw
            continue
        seen.add(env.msg_id)
        sp.data_envelopes += 1
        body = codec.last_wire_body  # type: ignore[union-attr]  (as it travelled: compressed)
        sp.bytes["body"] += body
        sp.bytes["fields"] += raw - body
    sp.bytes["seal"] += sealed - inner  # the tag, the seal's and the array's headers
    if not data_here:
        sp.ack_only_bundles += 1


def split_run(pcaps: list[Path], codecs: dict[str, Codec]) -> Split:
    """The layers of all of a run's captures together (one per link: an envelope crossing two
    links is counted on each, a retransmission when it crosses one link again)."""
    total = Split()
    for p in pcaps:
        total.add(split_capture(p, codecs))
    return total


def table(split: Split, per: int, what: str = "delivered report") -> tuple[list[str], list[list[str]]]:
    """Header and rows: bytes per layer, in all and per `what` (per: how many), and the share."""
    tot = split.total() or 1
    rows = []
    for key, name in LAYERS:
        b = split.bytes.get(key, 0)
        if b:
            rows.append([name, f"{b:,}", f"{b / per:.1f}" if per else "-", f"{100 * b / tot:.0f} %"])
    rows.append(["all", f"{split.total():,}", f"{split.total() / per:.1f}" if per else "-", "100 %"])
    return ["layer", "bytes", f"per {what}", "share"], rows


def spans(run: Path, spans: list[tuple[float, float]], mode: str = "overlay") -> list[dict]:
    """Where in a perf bft run its bytes per delivered report come from: for each span of seconds
    from the first report sent, the link bytes of the frames the run's captures show arriving
    (`<mode>-*.pcapng` beside the report, both ways; those the emulator dropped left out) and the
    reports delivered (a report's first receipt at a receiver across a link, as perf bft counts
    them).  A span counts what falls in [start, end); what came before the first report (the
    sessions opening) counts at 0.  Also returns, last, the whole run's figures, to check
    against its summary."""
    import bisect

    from c2dtn.errors import C2Error

    sent, recvs = _span_events(run, mode)
    t0 = min(sent.values())
    first: dict[tuple[str, str], float] = {}
    for rx, mid, t in recvs:
        if mid in sent and (rx, mid) not in first:
            first[(rx, mid)] = max(0.0, t - t0)
    pcaps = sorted(run.glob(f"{mode}-*.pcapng"))
    if not pcaps:
        raise C2Error(f"{run}: no {mode}-*.pcapng capture beside the report")
    frames: list[tuple[float, int]] = []
    for p in pcaps:
        frames += [(max(0.0, t - t0), n) for t, n in _arrived(p)]
    frames.sort()
    times = [t for t, _ in frames]
    sums = [0]
    for _, n in frames:
        sums.append(sums[-1] + n)
    got = sorted(first.values())
    out = []
    for a, b in [*spans, (0.0, float("inf"))]:
        lo, hi = bisect.bisect_left(times, a), bisect.bisect_left(times, b)
        link = sums[hi] - sums[lo]
        n = bisect.bisect_left(got, b) - bisect.bisect_left(got, a)
        out.append({"from_s": a, "to_s": b, "link_bytes": link, "delivered": n, "per_report": link / n if n else None})
    return out


def _span_events(run: Path, mode: str) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
    """From a run's events: when each report of `mode` was sent, and each receipt across a link
    (receiver, report, time).  A line that is not such an event is an error naming it."""
    import gzip
    import json

    from c2dtn.errors import C2Error

    path = run / "events.jsonl"
    if not path.exists() and (run / "events.jsonl.gz").exists():
        path = run / "events.jsonl.gz"
    sent: dict[str, float] = {}
    recvs: list[tuple[str, str, float]] = []
    n = 0
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
            for line in fh:
                n += 1  # (named in the error below)
                if not line.strip():
                    continue
                e = json.loads(line)
                if not isinstance(e, dict) or e.get("mode") != mode or e.get("ev") not in ("sent", "recv"):
                    continue
                t, mid = e.get("t"), e.get("id")
                if e["ev"] == "recv" and mid is None:
                    continue  # a message that was not a report (perf bft counts it as bad)
                if not (isinstance(t, (int, float)) and not isinstance(t, bool) and isinstance(mid, str)):
                    raise ValueError(f"a {e['ev']} event needs a number t and a text id: {line.strip()[:120]}")
                if e["ev"] == "sent":
                    sent[mid] = float(t)
                elif e.get("from") != e.get("rx_nation"):  # (the nation's own LAN is not across a link)
                    if not isinstance(e.get("rx"), str):
                        raise ValueError(f"a recv event needs a text rx: {line.strip()[:120]}")
                    recvs.append((e["rx"], mid, float(t)))
    except FileNotFoundError:
        raise C2Error(f"{run} is not a perf bft results folder: it has no events.jsonl") from None
    except (OSError, EOFError) as e:  # unreadable, or a gzip that is not one or is cut short
        raise C2Error(f"{path}: cannot be read: {e}") from None
    except ValueError as e:  # JSON or an event's fields
        raise C2Error(f"{path}, line {n}: {e}") from None
    if not sent:
        raise C2Error(f"{path}: no reports sent in mode {mode!r}")
    return sent, recvs


def _arrived(path: Path) -> list[tuple[float, int]]:
    """(time, bytes) of each frame of a capture that arrived (not marked dropped)."""
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapNgReader

    from c2dtn.errors import C2Error

    out = []
    try:
        for frame, meta in RawPcapNgReader(str(path)):
            if any(c.startswith(b"dropped") for c in getattr(meta, "comments", None) or ()):
                continue
            out.append(((meta.tshigh << 32 | meta.tslow) / meta.tsresol, len(frame)))
    except (Scapy_Exception, OSError, EOFError, struct.error) as e:
        raise C2Error(f"{path}: not a capture perf bft wrote: {e}") from None
    return out
