"""Link profiles: the one description of a link's behaviour that both emulation
backends (kernel netem, userspace channel emulator) implement.

Values are written the way tc-netem users write them: rates as "9.8kbit",
"1mbit", "1200bit"; times as "100ms", "2s"; probabilities as "10%".  A profile
describes ONE direction of a link; links may give each direction its own.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from typing import Any

from c2dtn.errors import ConfigError

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_SIZE_UNITS = {"b": 1, "kb": 1024, "k": 1024, "mb": 1024 * 1024, "m": 1024 * 1024}


@dataclass(frozen=True)
class GilbertElliott:
    """Two-state burst-loss model with netem's `loss gemodel p r 1-h 1-k` meaning.

    p: probability of moving good -> bad per packet; r: bad -> good;
    loss_bad: loss probability in the bad state (1-h); loss_good: in the good state (1-k).
    With loss_bad=1 and loss_good=0 the mean burst of consecutive losses is 1/r packets.
    """

    p: float
    r: float
    loss_bad: float = 1.0
    loss_good: float = 0.0

    def mean_loss(self) -> float:
        if self.p + self.r == 0:
            return self.loss_good
        pi_bad = self.p / (self.p + self.r)
        return pi_bad * self.loss_bad + (1 - pi_bad) * self.loss_good


@dataclass(frozen=True)
class Profile:
    """One direction of an emulated link.  None / 0 means "no such impairment"."""

    name: str = "custom"
    rate_bps: float | None = None  # link rate in bit/s, frames counted as netem does (L2 frame length)
    delay_s: float = 0.0
    jitter_s: float = 0.0  # uniform in [-jitter, +jitter]; never reorders (see reorder)
    loss: float = 0.0  # random loss probability, applied when a frame is offered
    gilbert_elliott: GilbertElliott | None = None  # burst loss; replaces `loss` when set
    duplicate: float = 0.0
    reorder: float = 0.0  # share of frames sent at once, skipping the delay (netem's reorder)
    corrupt: float = 0.0  # share of frames with one bit flipped past the Ethernet header
    queue_packets: int = 1000  # transmit queue limit (netem's default limit), tail drop
    queue_bytes: int | None = None
    mtu: int = 1500
    # an HF soft link: after link_idle_s with nothing on the link either way, the next frame waits
    # link_setup_s for the link to be set up again (seed 003: STANAG 5066 closes it after ~5 s)
    link_setup_s: float = 0.0
    link_idle_s: float = 0.0
    description: str = ""

    def is_transparent(self) -> bool:
        """True when the profile changes nothing (the emulator forwards at once)."""
        return (
            self.rate_bps is None
            and self.delay_s == 0
            and self.jitter_s == 0
            and self.loss == 0
            and self.gilbert_elliott is None
            and self.duplicate == 0
            and self.reorder == 0
            and self.corrupt == 0
            and self.link_setup_s == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profile":
        d = dict(d)
        ge = d.get("gilbert_elliott")
        if ge is not None:
            d["gilbert_elliott"] = GilbertElliott(**ge)
        return cls(**d)

    def summary(self) -> str:
        parts = []
        parts.append(format_rate(self.rate_bps) if self.rate_bps else "unlimited")
        parts.append(f"{self.delay_s * 1000:g} ms")
        if self.jitter_s:
            parts.append(f"±{self.jitter_s * 1000:g} ms")
        if self.gilbert_elliott:
            parts.append(f"GE loss ~{self.gilbert_elliott.mean_loss() * 100:.3g}%")
        else:
            parts.append(f"loss {self.loss * 100:g}%")
        return ", ".join(parts)


def format_rate(bps: float | None) -> str:
    if bps is None:
        return "unlimited"
    if bps >= 1e6:
        return f"{bps / 1e6:.3g} Mbit/s"
    if bps >= 1e3:
        return f"{bps / 1e3:.3g} kbit/s"
    return f"{bps:.3g} bit/s"


def parse_rate(value: Any, source: str, fld: str) -> float | None:
    if value in (None, "unlimited", "none"):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(source, fld, value, "a rate must be positive", 'write e.g. "9.8kbit" or "unlimited"')
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(value))
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ConfigError(source, fld, value, "not a rate", 'write e.g. "9.8kbit", "1mbit", "1200bit" or "unlimited"')
    bps = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if bps <= 0:
        raise ConfigError(source, fld, value, "a rate must be positive")
    return bps


def parse_time(value: Any, source: str, fld: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ConfigError(source, fld, value, "a time needs a unit", 'write e.g. "100ms" or "2s"')
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*", str(value))
    if not m:
        raise ConfigError(source, fld, value, "not a time", 'write e.g. "100ms", "2s" or "500us"')
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


def parse_probability(value: Any, source: str, fld: str) -> float:
    """ "10%" -> 0.10.  A bare number is read as a percentage too, as netem does."""
    if isinstance(value, bool):
        raise ConfigError(source, fld, value, "not a percentage", 'write e.g. "10%"')
    if isinstance(value, (int, float)):
        pct = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", str(value))
        if not m:
            raise ConfigError(source, fld, value, "not a percentage", 'write e.g. "10%"')
        pct = float(m.group(1))
    if not 0 <= pct <= 100:
        raise ConfigError(source, fld, value, "a percentage must lie between 0% and 100%")
    return pct / 100.0


def parse_size(value: Any, source: str, fld: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _SIZE_UNITS | {"": 1}:
            raise ConfigError(source, fld, value, "not a size", 'write e.g. 64000, "64kb" or "1mb"')
        n = int(m.group(1)) * ({"": 1} | _SIZE_UNITS)[m.group(2).lower()]
    if n <= 0:
        raise ConfigError(source, fld, value, "a size must be positive")
    return n


_FIELDS = {
    "description",
    "rate",
    "delay",
    "jitter",
    "loss",
    "gilbert_elliott",
    "duplicate",
    "reorder",
    "corrupt",
    "queue_packets",
    "queue_bytes",
    "mtu",
    "link_setup",
    "link_idle",
}
_GE_FIELDS = {"p", "r", "loss_bad", "loss_good"}


def profile_from_table(name: str, table: dict[str, Any], source: str, prefix: str = "") -> Profile:
    """Build a Profile from a TOML table, naming the file and field on any error."""
    if not isinstance(table, dict):
        raise ConfigError(source, prefix.rstrip(".") or name, table, "a profile must be a table")
    for key in table:
        if key not in _FIELDS:
            raise ConfigError(
                source, f"{prefix}{key}", table[key], "unknown profile field", "known: " + ", ".join(sorted(_FIELDS))
            )
    f = lambda k: f"{prefix}{k}"  # noqa: E731
    ge = None
    if "gilbert_elliott" in table:
        g = table["gilbert_elliott"]
        if not isinstance(g, dict):
            raise ConfigError(source, f("gilbert_elliott"), g, "must be a table with p and r")
        for key in g:
            if key not in _GE_FIELDS:
                raise ConfigError(
                    source, f(f"gilbert_elliott.{key}"), g[key], "unknown field", "known: p, r, loss_bad, loss_good"
                )
        for key in ("p", "r"):
            if key not in g:
                raise ConfigError(source, f(f"gilbert_elliott.{key}"), None, "missing")
        ge = GilbertElliott(
            p=parse_probability(g["p"], source, f("gilbert_elliott.p")),
            r=parse_probability(g["r"], source, f("gilbert_elliott.r")),
            loss_bad=parse_probability(g.get("loss_bad", "100%"), source, f("gilbert_elliott.loss_bad")),
            loss_good=parse_probability(g.get("loss_good", "0%"), source, f("gilbert_elliott.loss_good")),
        )
        if ge.r == 0:
            raise ConfigError(source, f("gilbert_elliott.r"), g["r"], "r = 0 never leaves the bad state")
    mtu = table.get("mtu", 1500)
    if not isinstance(mtu, int) or isinstance(mtu, bool) or not 68 <= mtu <= 65535:
        raise ConfigError(source, f("mtu"), mtu, "an MTU must be a whole number from 68 to 65535")
    qp = table.get("queue_packets", 1000)
    if not isinstance(qp, int) or isinstance(qp, bool) or qp < 1:
        raise ConfigError(source, f("queue_packets"), qp, "must be a whole number of packets, at least 1")
    prof = Profile(
        name=name,
        description=str(table.get("description", "")),
        rate_bps=parse_rate(table.get("rate"), source, f("rate")),
        delay_s=parse_time(table.get("delay", "0ms"), source, f("delay")),
        jitter_s=parse_time(table.get("jitter", "0ms"), source, f("jitter")),
        loss=parse_probability(table.get("loss", 0), source, f("loss")),
        gilbert_elliott=ge,
        duplicate=parse_probability(table.get("duplicate", 0), source, f("duplicate")),
        reorder=parse_probability(table.get("reorder", 0), source, f("reorder")),
        corrupt=parse_probability(table.get("corrupt", 0), source, f("corrupt")),
        queue_packets=qp,
        queue_bytes=parse_size(table["queue_bytes"], source, f("queue_bytes")) if "queue_bytes" in table else None,
        mtu=mtu,
        link_setup_s=parse_time(table.get("link_setup", "0ms"), source, f("link_setup")),
        link_idle_s=parse_time(table.get("link_idle", "0ms"), source, f("link_idle")),
    )
    if prof.link_setup_s and not prof.link_idle_s:
        raise ConfigError(
            source, f("link_idle"), table.get("link_idle"), "link_setup needs link_idle: how long idle drops the link"
        )
    if prof.jitter_s > prof.delay_s:
        raise ConfigError(
            source,
            f("jitter"),
            table.get("jitter"),
            "jitter larger than the delay",
            f"delay is {table.get('delay', '0ms')}",
        )
    if ge is not None and prof.loss:
        raise ConfigError(source, f("loss"), table.get("loss"), "give either loss or gilbert_elliott, not both")
    return prof


def with_name(p: Profile, name: str) -> Profile:
    return replace(p, name=name)


PROFILE_FIELDS = [f.name for f in fields(Profile)]


@dataclass
class ProfileLibrary:
    """Named profiles: the shipped ones plus any a topology file defines."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    source: str = "profiles.toml"

    def get(self, name: str, source: str, fld: str) -> Profile:
        if name not in self.profiles:
            raise ConfigError(source, fld, name, "no such profile", "known: " + ", ".join(sorted(self.profiles)))
        return self.profiles[name]

    def add_tables(self, tables: dict[str, Any], source: str, prefix: str = "profiles.") -> None:
        if not isinstance(tables, dict):
            raise ConfigError(source, prefix.rstrip("."), tables, "must be a table of profiles")
        for name, table in tables.items():
            self.profiles[name] = profile_from_table(name, table, source, f"{prefix}{name}.")


def load_builtin_profiles() -> ProfileLibrary:
    text = resources.files("c2dtn.topologies").joinpath("data/profiles.toml").read_text()
    lib = ProfileLibrary(source="topologies/data/profiles.toml")
    lib.add_tables(tomllib.loads(text).get("profiles", {}), lib.source)
    return lib


def load_profile_file(path: str) -> ProfileLibrary:
    from c2dtn.tomlfile import read_toml

    lib = load_builtin_profiles()
    data = read_toml(path)
    lib.add_tables(data.get("profiles", {}), path)
    return lib
