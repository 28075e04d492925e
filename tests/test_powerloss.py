"""`c2dtn perf powerloss` in short: a power cut under QoS 1 load loses nothing the gateway
PUBACKed, and the campaign can see a loss (its control, replies not waiting for the fsync,
loses some).  The default fsync mode ("auto") on a disk of 1 ms fsyncs: its fsyncs run on
the event loop, which is what the cuts land in."""

import json

from c2dtn.perf import powerloss_bench


def test_a_power_cut_loses_no_pubacked_message_and_the_control_shows_the_campaign_can_see_a_loss(tmp_path):
    out = powerloss_bench.main(cycles=2, clients=3, rate=25, disk_ms=1, modes=("auto", "unsynced"), out=tmp_path / "r")
    res = json.loads((out / "summary.json").read_text())
    thread, control = res["total"]["auto"], res["total"]["unsynced"]
    assert thread["cuts"] == 2 and thread["acked"] > 50 and control["acked"] > 50
    assert thread["lost"] == 0, [c["lost_examples"] for c in res["cuts"] if c["mode"] == "auto"]
    assert control["lost"] > 0  # the same cut without the fsync before the PUBACK loses what it acked
    assert all(c["integrity"] == "ok" for c in res["cuts"])
    md = (out / "report.md").read_text()
    assert f"| auto: loop while fast (default) | 2 | {thread['published']} | {thread['acked']} | **0** |" in md
    assert f"| **{control['lost']}** |" in md


def test_a_power_cut_loses_no_pubacked_message_whose_body_is_a_file_of_its_own(tmp_path):
    """Publishes of 300 kB: each body in a file beside the store (store/sqlite.py FILE_BODY_BYTES),
    put back as last fsynced after the cut, as the database is."""
    out = powerloss_bench.main(
        cycles=2, clients=2, rate=10, disk_ms=1, modes=("auto", "unsynced"), out=tmp_path / "r", payload_bytes=300_000
    )
    res = json.loads((out / "summary.json").read_text())
    auto, control = res["total"]["auto"], res["total"]["unsynced"]
    assert auto["acked"] > 10 and auto["lost"] == 0, [c["lost_examples"] for c in res["cuts"] if c["mode"] == "auto"]
    assert all(c["integrity"] == "ok" for c in res["cuts"])
    files = [s for c in res["cuts"] for s in c["restore"] if s.startswith("custody.db.bodies:")]
    assert len(files) == 4 and all(" files as last fsynced" in s for s in files)  # every cut had body files
    assert control["lost"] > 0
