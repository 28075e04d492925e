"""`c2dtn perf diskfull` in short (issue 17's disk-full campaign): one cycle of link cut,
disk filled, disk freed, link back, under MQTT 5 and 3.1.1 QoS 1 traffic.  What a user
sees: MQTT 5 refusals are PUBACK 0x97, 3.1.1 clients are disconnected and finally get
every message PUBACKed, every PUBACKed message arrives once, none refused arrives, and
the report and plot are the run's own."""

import json
import subprocess

import pytest

from c2dtn.perf import diskfull_bench


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    probe = tmp_path_factory.mktemp("c2-probe")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "c2-probe", str(probe)], capture_output=True, text=True
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): the campaign needs root, as make test runs")
    subprocess.run(["umount", str(probe)], capture_output=True)
    out = tmp_path_factory.mktemp("diskfull")
    _, res = diskfull_bench.main(cycles=1, clients=2, rate=10, size=1024, disk_mb=8, full_s=2.0, drain_s=60, out=out)
    return out, res


def test_a_full_disk_refuses_mqtt5_with_0x97_and_disconnects_311(run):
    _, res = run
    v5, v3 = res["per_version"]["MQTT 5"], res["per_version"]["MQTT 3.1.1"]
    assert res["fills"] == 1 and res["ballast_mb"][0] > 1
    (cycle,) = res["cycles"]
    assert cycle["refused"] and cycle["refused_0x97"] > 0 and cycle["taken_while_full"] == 0
    assert v5["refused"] > 0 and v5["refusal_reasons"] == {"refused 0x97": v5["refused"]}
    assert v5["acked"] + v5["refused"] == v5["published"] and v5["no_answer"] == 0
    assert v3["disconnects"] > 0 and v3["refused"] == 0
    assert v3["acked"] == v3["published"] > 0  # after space freed, everything a 3.1.1 client sent was taken


def test_every_acked_message_arrives_once_and_none_refused_arrives(run):
    _, res = run
    for r in res["per_version"].values():
        assert r["acked_lost"] == 0 and r["lost_examples"] == []
        assert r["delivered_twice_or_more"] == 0 and r["refused_delivered"] == 0
    assert res["held_at_end"] == 0 and res["integrity"] == "ok"


def test_the_report_and_plot_are_the_runs_own(run):
    out, res = run
    md = (out / "report.md").read_text()
    v5 = res["per_version"]["MQTT 5"]
    assert f"| MQTT 5 | {v5['published']} | {v5['acked']} | {v5['refused']} (refused 0x97: {v5['refused']}) |" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_version"]["MQTT 3.1.1"]["disconnects"] == res["per_version"]["MQTT 3.1.1"]["disconnects"]
    plot = json.loads((out / "plot.json").read_text())
    acked = next(s for s in plot[0]["series"] if s["label"].startswith("PUBACK 0"))
    assert acked["y"][-1] == v5["acked"] + res["per_version"]["MQTT 3.1.1"]["acked"]
    assert (out / "plot.png").stat().st_size > 10_000 and (out / "timeline.csv").exists()
