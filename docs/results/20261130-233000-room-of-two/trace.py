"""One bulk run on the virtual radio, every frame as it is offered: time (s), direction,
frame bytes, data envelopes inside, LOST where the radio drops it, and the radio's queue (frames)
after it.  PYTHONPATH as for bulk.py:  PYTHONPATH=/tmp/shim python trace.py SEED"""

import sys

from c2dtn.perf import radio_sim


def _send(self, node: str) -> None:  # radio_sim.Radio._send, printing each frame
    for b in self.cores[node].poll(self.now_ms):
        frame = b.payload + bytes(self.frame_overhead)
        self.frames[b.dst] += 1
        self.envelopes[b.dst] += len(b.seqs)
        self.seqs[b.dst].update(b.seqs)
        self.frame_bytes[b.dst] += len(frame)
        d = self.dirs[b.dst]
        lost_before = d.stats.lost_random
        d.offer(frame, self.now_ms / 1000)
        lost = "LOST" if d.stats.lost_random > lost_before else ""
        print(
            f"{self.now_ms / 1000:8.2f} {node}->{b.dst} {len(frame):5d}B seqs={list(b.seqs)} {lost} q={d.queued(self.now_ms / 1000)[0]}"
        )


radio_sim.Radio._send = _send
r = radio_sim.bulk(int(sys.argv[1]))
print(f"fraction {r['fraction']:.3f}, frames {r['frames']}, {r['seconds']:.1f} s")
