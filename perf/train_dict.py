"""Train the zstd dictionaries for position reports that ship in overlay/data/.

Position reports are short (about 255 bytes) and alike: alone they barely
compress (zlib: 226 -> 168 bytes), with a dictionary trained on their shape
zstd makes about 40 bytes of one.  Both ends must hold the same dictionary, so
it ships as data; this script is how it was made:

    python -m c2dtn.perf.train_dict overlay/data/position-reports.zdict          (v1: reports)
    python -m c2dtn.perf.train_dict --v2 overlay/data/position-reports-v2.zdict  (v2: + gateway bodies)

v1 knew only the bare report, so the MQTT gateway's bodies (the report inside a small
CBOR map: op, client, broker, topic, QoS) came out at about 134 bytes; v2 is trained on
both and makes about 50 bytes of a gateway body.  Nodes send with v2 and still read v1.
"""

from __future__ import annotations

import json
import random
import sys

import zstandard

DICT_BYTES = 2048


def position_report(country: str, unit: int, node: int, seq: int, timestamp_ms: int, lat: float, lon: float) -> bytes:
    """One GeoJSON BFT report in the seed 000 format (§4, about 255 characters)."""
    return json.dumps(
        {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [round(lat, 6), round(lon, 6), 0]},
            "properties": {
                "country": country,
                "unit": f"{country}-UNIT{unit:03d}",
                "node_id": f"{country}-S{node:03d}",
                "msg_id": f"{country}-S{node:03d}_{seq}",
                "timestamp": timestamp_ms,
            },
        }
    ).encode()


def report_topic(country: str, unit: int, node: int) -> str:
    """The seed 000 topic of a unit's location service: /PRT/PRT-UNIT001/PRT-S003/location."""
    return f"/{country}/{country}-UNIT{unit:03d}/{country}-S{node:03d}/location"


def report_times(rng: random.Random, units: int, period: float, duration: float) -> list[tuple[float, int]]:
    """(seconds from the start, unit 1..units) of every report, in time order: each unit at its
    own random phase in the first period, then every period (as a unit's position timer)."""
    phase = {u: rng.uniform(0, period) for u in range(1, units + 1)}
    return sorted((phase[u] + k * period, u) for u in phase for k in range(int(duration / period)))


def sample_reports(n: int = 4000, seed: int = 1) -> list[bytes]:
    """GeoJSON BFT reports in the seed 000 format (§4), for the nations of fmn-4nations."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        c = rnd.choice(["DEU", "NOR", "PRT", "USA"])
        u, node, i = rnd.randrange(1, 5), rnd.randrange(1, 9), rnd.randrange(1, 600)
        lat, lon = 38.7 + rnd.random() / 10, -9.15 - rnd.random() / 10
        out.append(position_report(c, u, node, i, 1588759108433 + i * 2000 + rnd.randrange(1000), lat, lon))
    return out


def gateway_bodies(reports: list[bytes], seed: int = 2) -> list[bytes]:
    """The MQTT gateway's bodies carrying these reports: bridge publications ("bpub"),
    client publications ("pub") and far-broker messages ("msg"), as ip_gateway.session packs them."""
    import cbor2

    rnd = random.Random(seed)
    out = []
    for i, r in enumerate(reports):
        p = json.loads(r)["properties"]
        c, unit, node = p["country"], int(p["unit"][-3:]), int(p["node_id"][-3:])
        op = ("bpub", "pub", "msg")[i % 3]
        client = f"c2bridge-{c.lower()}-gw" if op == "bpub" else f"c2bft-{c}"
        broker = f"10.{rnd.randrange(70, 90)}.{rnd.randrange(1, 9)}.{rnd.randrange(1, 20)}:1883"
        out.append(
            cbor2.dumps(
                {
                    "op": op,
                    "c": client,
                    "b": broker,
                    "t": report_topic(c, unit, node),
                    "p": r,
                    "q": 1,
                    "r": False,
                    "x": {},
                }
            )
        )
    return out


def main(argv: list[str]) -> None:
    v2 = "--v2" in argv
    args = [a for a in argv if a != "--v2"]
    path = args[0] if args else f"overlay/data/position-reports{'-v2' if v2 else ''}.zdict"
    samples = sample_reports()
    if v2:
        samples = samples[:2000] + gateway_bodies(samples[2000:])
    d = zstandard.train_dictionary(DICT_BYTES, samples)
    with open(path, "wb") as fh:
        fh.write(d.as_bytes())
    print(f"wrote {path}: {len(d.as_bytes())} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
