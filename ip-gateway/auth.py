"""Who may connect, publish and subscribe through the gateway, read from the broker's own
files (I/O-free: text in, decisions out), so an operator reuses what Mosquitto already has.

password_file: lines `user:hash` as `mosquitto_passwd` writes them: `$7$iterations$salt$hash`
(PBKDF2-SHA512, Mosquitto 2.0) or `$6$salt$hash` (one salted SHA-512, Mosquitto 1.x).
acl_file: Mosquitto's format (mosquitto.conf(5), "acl_file"): `topic [read|write|readwrite|deny]
TOPIC` lines apply to the `user NAME` above them (before any `user` line: to anonymous
clients); `pattern [...] TOPIC` lines apply to every client, with %c the client id and %u the
user name.  A deny that matches wins; else a matching grant of the access asked; else no.
Mosquitto's matching is written out here (no library reads these files); a subscription is
allowed when a readable ACL topic covers the whole filter, and what reaches a subscriber is
checked again, topic by topic.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field

from c2dtn.errors import ConfigError

READ, WRITE = "read", "write"
_ACCESS = {"read": {READ}, "write": {WRITE}, "readwrite": {READ, WRITE}, "deny": set()}


@dataclass(frozen=True)
class _Hash:
    kind: str  # "7" or "6"
    iterations: int
    salt: bytes
    digest: bytes

    def matches(self, password: bytes) -> bool:
        if self.kind == "7":
            got = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations)
        else:
            got = hashlib.sha512(password + self.salt).digest()
        return hmac.compare_digest(got, self.digest)


def parse_password_file(text: str, source: str) -> dict[str, _Hash]:
    """user -> hash; ConfigError names the line and what is wrong with it."""
    users: dict[str, _Hash] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, h = line.partition(":")
        where = f"{source}:{n}"
        if not sep or not user:
            raise ConfigError(where, "password_file", line[:60], "not `user:hash` (write it with mosquitto_passwd)")
        parts = h.split("$")
        try:
            if len(parts) == 5 and parts[1] == "7":
                it = int(parts[2])
                if not 1 <= it <= 10_000_000:
                    raise ValueError(f"iterations {it}")
                users[user] = _Hash(
                    "7", it, base64.b64decode(parts[3], validate=True), base64.b64decode(parts[4], validate=True)
                )
            elif len(parts) == 4 and parts[1] == "6":
                users[user] = _Hash(
                    "6", 1, base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
                )
            else:
                raise ValueError("a hash of kind $7$ or $6$ was expected")
        except (ValueError, binascii.Error) as e:
            raise ConfigError(
                where, "password_file", f"{user}:{h[:12]}...", f"not a hash mosquitto_passwd writes ({e})"
            ) from None
    return users


@dataclass
class _Rule:
    access: set[str]  # empty: deny
    topic: str

    def grants(self, topic: str, access: str, filter_: bool) -> bool:
        return access in self.access and _covers(self.topic, topic, filter_)

    def denies(self, topic: str, filter_: bool) -> bool:
        return not self.access and _covers(self.topic, topic, filter_)


def _covers(acl: str, topic: str, filter_: bool) -> bool:
    """Does the ACL topic (may hold wildcards) take in `topic` (a name), or every topic of the
    subscription filter `topic` (filter_)?"""
    a, t = acl.split("/"), topic.split("/")
    for i, level in enumerate(a):
        if level == "#":
            return not (i == 0 and t and t[0].startswith("$") and not a[0].startswith("$"))
        if i >= len(t):
            return False
        if level == "+":
            if t[i] == "#" or (i == 0 and t[i].startswith("$")):
                return False
            continue
        if level != t[i] or (filter_ and t[i] in ("+", "#")):
            return False
    return len(a) == len(t)


_UNSAFE = set("+#/")


@dataclass
class Acl:
    anonymous: list[_Rule] = field(default_factory=list)
    users: dict[str, list[_Rule]] = field(default_factory=dict)
    patterns: list[_Rule] = field(default_factory=list)

    def allows(self, user: str | None, client: str, topic: str, access: str, filter_: bool = False) -> bool:
        rules = list(self.anonymous if user is None else self.users.get(user, []))
        for p in self.patterns:
            if "%u" in p.topic and user is None:
                continue
            # a client id or user name holding + # or / would widen the pattern past its own
            # level (Mosquitto's CVE-2017-7650): such a pattern does not apply to that client
            if ("%c" in p.topic and _UNSAFE & set(client)) or ("%u" in p.topic and _UNSAFE & set(user or "")):
                continue
            rules.append(_Rule(p.access, p.topic.replace("%c", client).replace("%u", user or "")))
        if any(r.denies(topic, filter_) for r in rules):
            return False
        return any(r.grants(topic, access, filter_) for r in rules)


def parse_acl_file(text: str, source: str) -> Acl:
    acl = Acl()
    current = acl.anonymous
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        where = f"{source}:{n}"
        if word == "user":
            if not rest:
                raise ConfigError(where, "acl_file", line, "`user` needs a name")
            current = acl.users.setdefault(rest, [])
        elif word in ("topic", "pattern"):
            access, _, topic = rest.partition(" ")
            if access in _ACCESS and topic.strip():
                rule = _Rule(set(_ACCESS[access]), topic.strip())
            elif access and not topic.strip():
                rule = _Rule({READ, WRITE}, access)  # `topic TOPIC`: readwrite
            else:
                raise ConfigError(where, "acl_file", line, "not `topic|pattern [read|write|readwrite|deny] TOPIC`")
            (acl.patterns if word == "pattern" else current).append(rule)
        else:
            raise ConfigError(
                where, "acl_file", line[:60], "a line is `user`, `topic` or `pattern` (Mosquitto's format)"
            )
    return acl


@dataclass
class Auth:
    """What [gateway] password_file, acl_file and allow_anonymous say, for NearCore."""

    passwords: dict[str, _Hash] | None = None  # None: no password file
    acl: Acl | None = None  # None: no acl file, every topic allowed
    allow_anonymous: bool = True

    def login(self, user: str | None, password: bytes | None) -> int:
        """0 if the client may connect; else the MQTT 5 reason (0x86 bad user name or password,
        0x87 not authorized)."""
        if user is None:
            return 0 if self.allow_anonymous else 0x87
        if self.passwords is None:
            return 0 if self.allow_anonymous else 0x87
        h = self.passwords.get(user)
        if h is None or password is None or not h.matches(password):
            return 0x86
        return 0

    def may(self, user: str | None, client: str, topic: str, access: str, filter_: bool = False) -> bool:
        return self.acl is None or self.acl.allows(user, client, topic, access, filter_)


def load_auth(
    password_file: str | None, acl_file: str | None, allow_anonymous: bool | None, source: str
) -> Auth | None:
    """The gateway's Auth from its config (None: nothing configured, everyone allowed, as before).
    allow_anonymous defaults to false when a password file is set, as Mosquitto 2.0's does."""
    if password_file is None and acl_file is None and allow_anonymous is None:
        return None

    def read(path: str, what: str) -> str:
        try:
            return open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(source, f"gateway.{what}", path, f"cannot be read ({e})") from None

    auth = Auth()
    if password_file is not None:
        auth.passwords = parse_password_file(read(password_file, "password_file"), password_file)
    if acl_file is not None:
        auth.acl = parse_acl_file(read(acl_file, "acl_file"), acl_file)
    auth.allow_anonymous = allow_anonymous if allow_anonymous is not None else password_file is None
    return auth
