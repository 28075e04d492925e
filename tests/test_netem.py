"""The kernel netem backend's generated tc commands (used live only where the kernel has netem)."""

from dataclasses import replace

from c2dtn.topologies.netem import netem_args, outage_profile, tbf_args, tc_commands
from c2dtn.topologies.profiles import GilbertElliott, Profile, load_builtin_profiles

P = load_builtin_profiles().profiles


def test_cnr_tactical_2_as_netem_over_tbf():
    cmds = tc_commands("c2e-r2-r3", "c2b", P["cnr-tactical-2"])
    assert cmds[0] == [
        "tc",
        "-n",
        "c2e-r2-r3",
        "qdisc",
        "replace",
        "dev",
        "c2b",
        "root",
        "handle",
        "1:",
        "netem",
        "limit",
        "1000",
        "delay",
        "100ms",
        "loss",
        "random",
        "10%",
    ]
    assert cmds[1] == [
        "tc",
        "-n",
        "c2e-r2-r3",
        "qdisc",
        "replace",
        "dev",
        "c2b",
        "parent",
        "1:1",
        "handle",
        "10:",
        "tbf",
        "rate",
        "9800bit",
        "burst",
        "1600",
        "limit",
        str(1000 * 1514),
    ]


def test_every_impairment_is_passed_on():
    p = Profile(
        delay_s=0.2,
        jitter_s=0.05,
        duplicate=0.01,
        reorder=0.25,
        corrupt=0.001,
        queue_packets=50,
        gilbert_elliott=GilbertElliott(p=0.02, r=0.25, loss_bad=0.9, loss_good=0.001),
    )
    assert netem_args(p) == [
        "netem",
        "limit",
        "50",
        "delay",
        "200ms",
        "50ms",
        "loss",
        "gemodel",
        "2%",
        "25%",
        "90%",
        "0.1%",
        "duplicate",
        "1%",
        "reorder",
        "25%",
        "corrupt",
        "0.1%",
    ]


def test_tbf_queue_in_bytes_and_no_rate_removes_tbf():
    assert tbf_args(replace(P["hf-1200"], queue_bytes=4000)) == [
        "tbf",
        "rate",
        "1200bit",
        "burst",
        "1600",
        "limit",
        "4000",
    ]
    cmds = tc_commands("ns", "c2a", P["lan"])
    assert cmds[0][-3:] == ["netem", "limit", "1000"]
    assert cmds[1][:5] == ["tc", "-n", "ns", "qdisc", "del"]


def test_outage_is_total_loss_with_carrier_kept():
    o = outage_profile(P["cnr-tactical-1"])
    assert netem_args(o)[-3:] == ["loss", "random", "100%"]
    assert o.rate_bps == 9800
