"""A custody store whose disk fills (issue 17, "Disk full and quota"): the store is on a
16 MB tmpfs that a ballast file fills during traffic.  What was accepted before stays and
is delivered; what comes while the disk is full is refused as a quota is (StoreFull, a
QuotaExceeded: MQTT 5 clients get 0x97, 3.1.1 clients a disconnect, the HTTP API 507);
once space frees, traffic resumes and everything accepted arrives exactly once.
"""

import errno
import subprocess

import pytest
from test_custody import KEY, Net, run

from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import CustodyStore, QuotaExceeded
from c2dtn.overlay.envelope import Codec
from c2dtn.overlay.scheduler import SchedulerConfig
from c2dtn.overlay.store import StoreFull


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "c2-small-disk"
    d.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "c2-small-disk", str(d)], capture_output=True, text=True
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): the test needs root, as make test runs")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(d) -> int:
    """Write a ballast file until the disk refuses; returns its size."""
    n = 0
    with open(d / "ballast", "wb", buffering=0) as fh:
        while True:
            try:
                n += fh.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                return n


def core(path, name, peer):
    return OverlayCore(
        CustodyStore(path, name), Codec(name, {peer: KEY}), SchedulerConfig(min_rto_ms=5_000, initial_rto_ms=10_000)
    )


def test_a_full_disk_refuses_like_a_quota_keeps_what_was_held_and_traffic_resumes(tmp_path, small_disk):
    gw1 = core(small_disk / "gw1.db", "gw1", "gw4")
    gw4 = core(tmp_path / "gw4.db", "gw4", "gw1")
    net = Net(delay_ms=200)
    net.down = [(0, 60_000)]  # the link is cut: gw1 holds what it takes
    accepted = [gw1.submit("gw4", b"order %03d " % i + b"x" * 200, 0) for i in range(100)]
    got = run({"gw1": gw1, "gw4": gw4}, net, 5_000)
    assert fill(small_disk) > 0

    refused = 0
    for i in range(20):
        with pytest.raises(StoreFull, match="the disk is full") as e:
            gw1.submit("gw4", b"late %03d" % i, 6_000)
        assert isinstance(e.value, QuotaExceeded) and str(small_disk / "gw1.db") in str(e.value)
        refused += 1
    assert gw1.store.held_out()[0] == 100  # nothing held was lost; nothing refused was half kept

    (small_disk / "ballast").unlink()  # space frees; the link comes back at 60 s
    accepted += [gw1.submit("gw4", b"after %03d" % i, 61_000) for i in range(10)]
    got2 = run({"gw1": gw1, "gw4": gw4}, net, 120_000, t0=61_000)
    bodies = [d.body for d in got["gw4"] + got2["gw4"]]
    assert len(bodies) == len(set(bodies)) == 110 and refused == 20
    assert gw1.store.held_out()[0] == 0 and len(accepted) == 110


def test_bundles_arriving_while_the_disk_is_full_are_refused_then_resent(tmp_path, small_disk):
    gw4 = core(small_disk / "gw4.db", "gw4", "gw1")
    gw1 = core(tmp_path / "gw1.db", "gw1", "gw4")
    net = Net(delay_ms=200)
    for i in range(30):
        gw1.submit("gw4", b"report %02d" % i + b"y" * 300, 0)
    fill(small_disk)
    with pytest.raises(StoreFull):
        for b in gw1.poll(0):  # what the node's receive loop does on StoreFull: log, take nothing
            gw4.on_bundle(b.payload, 200)
    assert gw4.take() == [] and gw1.store.held_out()[0] == 30  # not acked: gw1 still holds all 30
    (small_disk / "ballast").unlink()
    got = run({"gw1": gw1, "gw4": gw4}, net, 60_000, t0=1_000)
    assert sorted(d.body[:9] for d in got["gw4"]) == [b"report %02d" % i for i in range(30)]
    assert gw1.store.held_out()[0] == 0
