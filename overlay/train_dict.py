"""Train the zstd dictionary for position reports that ships in overlay/data/.

Position reports are short (about 255 bytes) and alike: alone they barely
compress (zlib: 226 -> 168 bytes), with a dictionary trained on their shape
zstd makes about 40 bytes of one.  Both ends must hold the same dictionary, so
it ships as data; this script is how it was made:

    python -m overlay.train_dict overlay/data/position-reports.zdict
"""

from __future__ import annotations

import json
import random
import sys

import zstandard

DICT_BYTES = 2048


def sample_reports(n: int = 4000, seed: int = 1) -> list[bytes]:
    """GeoJSON BFT reports in the seed 000 format (§4), for the nations of fmn-4nations."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        c = rnd.choice(["DEU", "NOR", "PRT", "USA"])
        u, node, i = rnd.randrange(1, 5), rnd.randrange(1, 9), rnd.randrange(1, 600)
        out.append(json.dumps({
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [round(38.7 + rnd.random() / 10, 6),
                                                          round(-9.15 - rnd.random() / 10, 6), 0]},
            "properties": {"country": c, "unit": f"{c}-UNIT{u:03d}", "node_id": f"{c}-S{node:03d}",
                           "msg_id": f"{c}-S{node:03d}_{i}", "timestamp": 1588759108433 + i * 2000 + rnd.randrange(1000)},
        }).encode())
    return out


def main(path: str) -> None:
    d = zstandard.train_dictionary(DICT_BYTES, sample_reports())
    with open(path, "wb") as fh:
        fh.write(d.as_bytes())
    print(f"wrote {path}: {len(d.as_bytes())} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "overlay/data/position-reports.zdict")
