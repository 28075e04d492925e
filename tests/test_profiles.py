import pytest

from c2dtn.errors import ConfigError
from c2dtn.topologies.profiles import load_builtin_profiles, load_profile_file, profile_from_table


def test_named_profiles_match_the_architecture_table():
    p = load_builtin_profiles().profiles
    assert set(p) >= {"lan", "cnr-tactical-1", "cnr-tactical-2", "narrowband-15k", "wideband-1m", "hf-1200"}
    assert p["lan"].is_transparent()
    assert (p["cnr-tactical-1"].rate_bps, p["cnr-tactical-1"].delay_s, p["cnr-tactical-1"].loss) == (9800, 0.1, 0.01)
    assert (p["cnr-tactical-2"].rate_bps, p["cnr-tactical-2"].delay_s, p["cnr-tactical-2"].loss) == (9800, 0.1, 0.10)
    assert p["narrowband-15k"].rate_bps == 15000
    assert p["wideband-1m"].rate_bps == 1e6 and p["wideband-1m"].delay_s == pytest.approx(0.02)
    assert p["hf-1200"].rate_bps == 1200 and p["hf-1200"].delay_s >= 1.0


def test_units_are_parsed_like_netem():
    p = profile_from_table(
        "x",
        {
            "rate": "1.2mbit",
            "delay": "250us",
            "jitter": "100us",
            "loss": "0.5%",
            "duplicate": 1,
            "queue_bytes": "64kb",
            "mtu": 1400,
        },
        "f.toml",
    )
    assert p.rate_bps == 1.2e6
    assert p.delay_s == pytest.approx(250e-6) and p.jitter_s == pytest.approx(100e-6)
    assert p.loss == pytest.approx(0.005) and p.duplicate == pytest.approx(0.01)
    assert p.queue_bytes == 65536 and p.mtu == 1400


def test_gilbert_elliott_table():
    p = profile_from_table("ge", {"rate": "9.8kbit", "gilbert_elliott": {"p": "2%", "r": "25%"}}, "f.toml")
    assert p.gilbert_elliott.p == pytest.approx(0.02) and p.gilbert_elliott.r == pytest.approx(0.25)
    assert p.gilbert_elliott.loss_bad == 1.0 and p.gilbert_elliott.loss_good == 0.0
    assert p.gilbert_elliott.mean_loss() == pytest.approx(0.02 / 0.27)


@pytest.mark.parametrize(
    "table, field, value",
    [
        ({"rate": "fast"}, "rate", "fast"),
        ({"rate": "9.8 furlongs"}, "rate", "9.8 furlongs"),
        ({"delay": 100}, "delay", 100),
        ({"delay": "100 parsecs"}, "delay", "100 parsecs"),
        ({"loss": "150%"}, "loss", "150%"),
        ({"loss": "ten"}, "loss", "ten"),
        ({"mtu": 20}, "mtu", 20),
        ({"queue_packets": 0}, "queue_packets", 0),
        ({"lsos": "1%"}, "lsos", "1%"),
        ({"delay": "10ms", "jitter": "20ms"}, "jitter", "20ms"),
        ({"gilbert_elliott": {"p": "1%"}}, "gilbert_elliott.r", None),
        ({"loss": "1%", "gilbert_elliott": {"p": "1%", "r": "10%"}}, "loss", "1%"),
        ({"link_setup": "6s"}, "link_idle", None),
        ({"link_setup": "soon", "link_idle": "5s"}, "link_setup", "soon"),
    ],
)
def test_bad_profile_names_file_field_and_value(table, field, value):
    with pytest.raises(ConfigError) as e:
        profile_from_table("bad", table, "my-profiles.toml", "profiles.bad.")
    assert e.value.source == "my-profiles.toml"
    assert e.value.field == f"profiles.bad.{field}"
    assert e.value.value == value
    assert "my-profiles.toml" in str(e.value) and field in str(e.value)


def test_profile_file_errors(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("[profiles.x]\nrate = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profile_file(str(f))
    f.write_text('[profiles.x]\nrate = "9.8kbit"\ndelay = "1 fortnight"\n')
    with pytest.raises(ConfigError, match=r"profiles\.x\.delay.*1 fortnight"):
        load_profile_file(str(f))
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile_file(str(tmp_path / "missing.toml"))
