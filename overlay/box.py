"""A gateway box's install (`c2dtn node init`, `c2dtn node check`): the node's config and keys
under a config folder, its state under a state folder, and one systemd unit template that
runs any node of the box by id (`c2dtn@<id>.service`).  What the unit asks of systemd, and
why: docs/operations.md, "Running it as a service"."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c2dtn.cla_adapters import ClaSpec
from c2dtn.errors import ConfigError
from c2dtn.overlay.agents import agent_class, kinds, make_agent
from c2dtn.overlay.agents.builds import cache_dir as agents_cache
from c2dtn.overlay.config import NodeConfig, load_node_config

UNIT_NAME = "c2dtn@.service"
# What the node may need of root's powers: TPROXY (nftables, policy routes, IP_TRANSPARENT),
# entering a namespace and ION's own namespaces, ports below 1024, the API socket's group.
CAPABILITIES = ("CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE", "CAP_SYS_ADMIN", "CAP_CHOWN")


DEFAULT_CONFIG_DIR = "/etc/c2dtn"
DEFAULT_STATE_DIR = "/var/lib/c2dtn"


def _unit_path(what: str, p: str) -> str:
    """An absolute path as a unit file takes it: '%' doubled (else a specifier), and none with
    whitespace or control characters (a unit would split or refuse it)."""
    if not p.startswith("/") or any(c.isspace() or ord(c) < 32 for c in p):
        raise ConfigError("c2dtn node init", what, p, "must be an absolute path without spaces or control characters")
    return p.replace("%", "%%")


def unit_text(
    c2dtn: str,
    config_dir: str = DEFAULT_CONFIG_DIR,
    state_dir: str = DEFAULT_STATE_DIR,
    agents_cache: str | None = None,
    python: str | None = None,
) -> str:
    """The systemd unit template; the instance is the node's id (config_dir/<id>.toml, its
    state in state_dir/<id>, which systemd makes and alone leaves writable).  agents_cache:
    where the agents' drivers find ION, IBR-DTN and HDTN (C2DTN_CACHE); python: the
    interpreter c2dtn runs on, resolved (it must stay readable)."""
    caps = " ".join(CAPABILITIES)
    paths = {"c2dtn": c2dtn, "--config-dir": config_dir, "--state-dir": state_dir}
    if agents_cache:
        paths["C2DTN_CACHE"] = agents_cache
    if python:
        paths["python"] = python
    esc = {k: _unit_path(k, v) for k, v in paths.items()}
    c2dtn, config_dir, state_dir = esc["c2dtn"], esc["--config-dir"], esc["--state-dir"]
    dirs = (
        "StateDirectory=c2dtn/%i\nStateDirectoryMode=0700"
        if state_dir == DEFAULT_STATE_DIR
        else f"ReadWritePaths={state_dir}"
    )
    if config_dir == DEFAULT_CONFIG_DIR:
        dirs += "\nConfigurationDirectory=c2dtn\nConfigurationDirectoryMode=0700"
    if agents_cache:
        dirs += f"\nEnvironment=C2DTN_CACHE={esc['C2DTN_CACHE']}"
    # what the node reads under a home folder must stay readable (ProtectHome=yes hides them all)
    home = "read-only" if any(v.startswith(("/root/", "/home/")) for v in paths.values()) else "yes"
    return f"""# c2dtn node %i: its bundle agent, custody and gateways, from {config_dir}/%i.toml
# (written by `c2dtn node init`; docs/operations.md). Enable one per node:
#   systemctl enable --now c2dtn@<id>
[Unit]
Description=c2dtn node %i (custody overlay, bundle agent, MQTT and CoAP gateways)
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart={c2dtn} node run --gateways {config_dir}/%i.toml
# exit status 75: custody's fsync failed; started again on what is on disk
Restart=on-failure
RestartSec=2s
TimeoutStartSec=120s
TimeoutStopSec=30s
WatchdogSec=60s
# SIGTERM to the node, which stops its agent; then whatever is left
KillMode=mixed
# clients, sessions, the agent and custody share the node's file table
LimitNOFILE=65536
{dirs}
UMask=0077
ProtectSystem=strict
ProtectHome={home}
PrivateTmp=yes
NoNewPrivileges=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
CapabilityBoundingSet={caps}
AmbientCapabilities={caps}

[Install]
WantedBy=multi-user.target
"""


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a TOML basic string for what node ids and paths hold


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):  # an inline table of node ids (NAME: bare keys)
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)  # a string, an integer


def _check_numbers(src: str, numbers: dict[str, int], named: list[str]) -> None:
    """A table that numbers this node and every peer, and no id in another case than theirs: a
    node left out gets a derived number no other box knows, and nothing routes to it."""
    missing = [n for n in named if n not in numbers]
    if missing:
        raise ConfigError(
            src,
            "--number",
            ", ".join(f"{k}={v}" for k, v in numbers.items()),
            f"no number for {', '.join(missing)}",
            "number this node and every peer (the same table on every box)",
        )
    for n in numbers:
        twin = next((m for m in named if m != n and m.lower() == n.lower()), None)
        if twin is not None:
            raise ConfigError(
                src, "--number", n, f"not a node of this config; {twin} is", "node ids are case-sensitive"
            )


def config_text(
    node_id: str,
    agent: str,
    storage: Path,
    listen: list[str],
    peers: list[tuple[str, str]],
    keys_file: str,
    metrics: str | None,
    agent_table: dict[str, Any] | None = None,
) -> str:
    lines = [
        f"# c2dtn node {node_id} (written by `c2dtn node init`; docs/configuration.md lists every field)",
        "[node]",
        f"id = {_toml_str(node_id)}",
        f"storage = {_toml_str(str(storage))}",
        f"keys_file = {_toml_str(keys_file)}",
        "",
        "[agent]",
        f"kind = {_toml_str(agent)}",
        "listen = [" + ", ".join(_toml_str(x) for x in listen) + "]",
    ]
    for node, cla in peers:
        lines += ["", "[[agent.peers]]", f"node = {_toml_str(node)}", f"cla = {_toml_str(cla)}"]
    if agent_table:
        lines += ["", f"[agent.{agent}]"] + [f"{k} = {_toml_value(v)}" for k, v in agent_table.items()]
    if metrics:
        lines += ["", "[metrics]", f"listen = {_toml_str(metrics)}"]
    lines += [
        "",
        "# An MQTT and CoAP gateway: add a [gateway] table (docs/mqtt.md, docs/coap.md); the",
        "# unit runs it with the node.",
        "",
    ]
    return "\n".join(lines)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        fh.write(text)


@dataclass
class Written:
    config: Path
    keys: Path
    unit: Path | None
    fresh_keys: list[str] = field(default_factory=list)  # peers whose pair key was made here


def _private_folder(d: Path) -> None:
    """A folder keys go into: made 0700 when missing; one that is there must not let anyone but
    its owner (us or root) replace what is in it (as ssh's StrictModes asks of ~/.ssh)."""
    if not d.exists():
        d.mkdir(parents=True)
        d.chmod(0o700)
        return
    st = d.stat()
    if not d.is_dir() or st.st_uid not in (0, os.getuid()) or st.st_mode & 0o022:
        raise ConfigError(
            "c2dtn node init",
            "--config-dir",
            str(d),
            f"not a folder only its owner may write to (mode {st.st_mode & 0o777:04o}, owner uid {st.st_uid}): "
            "others could replace the keys",
            "use a folder of your own, mode 0700",
        )


def init(
    node_id: str,
    agent: str,
    config_dir: Path,
    state_dir: Path,
    unit_dir: Path | None,
    c2dtn: str,
    listen: list[ClaSpec],
    peers: list[tuple[str, ClaSpec]],
    keys_from: Path | None = None,
    metrics: str | None = None,
    force: bool = False,
    numbers: dict[str, int] | None = None,
) -> tuple[Written, NodeConfig]:
    """Write config_dir/<id>.toml and <id>.keys.toml (mode 0600, the folder 0700) and the unit
    template in unit_dir.  Everything is checked first (the config loaded in a private folder
    elsewhere, the unit's paths): a bad value leaves nothing behind."""
    src = "c2dtn node init"
    config_dir, state_dir = config_dir.resolve(), state_dir.resolve()  # a unit's paths are absolute
    config = config_dir / f"{node_id}.toml"
    keys = config_dir / f"{node_id}.keys.toml"
    there = [p for p in (config, keys) if p.exists() or p.is_symlink()]
    if there and not force:
        raise ConfigError(
            src, "ID", node_id, f"already set up here ({', '.join(map(str, there))})", "--force replaces them"
        )
    for p in there:
        if p.is_dir() and not p.is_symlink():
            raise ConfigError(src, "ID", node_id, f"{p} is a folder, not a file: not replaced")
    unit_body = None
    if unit_dir is not None:
        unit_body = unit_text(
            c2dtn, str(config_dir), str(state_dir), str(agents_cache()), str(Path(sys.executable).resolve())
        )
    fresh: list[str] = []
    if keys_from is not None:
        keys_text = keys_from.read_text()
    else:  # a pair key per peer, for the operator to give that peer (its keys file names this node)
        fresh = [n for n, _ in peers]
        keys_text = f"# c2dtn keys for {node_id} (written by c2dtn node init): keep it mode 0600\n[keys]\n" + "".join(
            f"{n} = {_toml_str(secrets.token_hex(32))}\n" for n in fresh
        )
    agent_table = None
    if numbers:
        _check_numbers(src, numbers, [node_id] + [n for n, _ in peers])
        agent_table = agent_class(agent).numbered(numbers)
        if agent_table is None:
            raise ConfigError(
                src,
                "--number",
                ", ".join(f"{k}={v}" for k, v in numbers.items()),
                f"agent {agent} does not name nodes by number",
                "leave --number out, or choose an agent that does: "
                + ", ".join(k for k in kinds() if agent_class(k).numbered({}) is not None),
            )
    text = config_text(
        node_id,
        agent,
        state_dir / node_id,
        [str(c) for c in listen],
        [(n, str(c)) for n, c in peers],
        keys.name,
        metrics,
        agent_table,
    )
    # loaded first in a private folder of its own (mkdtemp: 0700), named as the final file in
    # any error, before anything is made where the files go
    with tempfile.TemporaryDirectory(prefix="c2dtn-init-") as td:
        _write_private(Path(td) / keys.name, keys_text)
        _write_private(Path(td) / config.name, text)
        try:
            make_agent(load_node_config(Path(td) / config.name))  # (the driver checks its naming)
        except ConfigError as e:
            if numbers and e.field.startswith(f"agent.{agent}.number"):  # what --number gave
                raise ConfigError(src, "--number", e.value, e.problem, e.hint) from None
            where = str(keys) if e.source.endswith(keys.name) else str(config)
            raise ConfigError(where, e.field, e.value, e.problem, e.hint) from None
    _private_folder(config_dir)
    if not state_dir.exists():
        state_dir.mkdir(parents=True)
        state_dir.chmod(0o700)
    # written beside their place and moved in: nothing readable by others on the way, and a
    # link planted where a file goes is replaced, not followed
    work = Path(tempfile.mkdtemp(prefix=f".init-{node_id}-", dir=config_dir))
    try:
        _write_private(work / keys.name, keys_text)
        _write_private(work / config.name, text)
        (work / keys.name).replace(keys)
        (work / config.name).replace(config)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cfg = load_node_config(config)
    unit = None
    if unit_dir is not None and unit_body is not None:
        unit_dir.mkdir(parents=True, exist_ok=True)
        unit = unit_dir / UNIT_NAME
        tmp = unit_dir / f".{UNIT_NAME}.new"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(unit_body)
        tmp.replace(unit)
    return Written(config, keys, unit, fresh), cfg


def _mode(p: Path) -> str:
    st = p.stat()
    return f"mode {st.st_mode & 0o777:04o}, owner uid {st.st_uid}"


def describe(config: str, cfg: NodeConfig) -> tuple[list[tuple[str, str]], bool]:
    """What the node CONFIG describes would do on this machine, a row per part, and whether it
    can run here (its agent usable).  Raises ConfigError for a bad [gateway] table or keys file
    (load_node_config checked the rest)."""
    from c2dtn.overlay.agents import agent_class, make_agent
    from c2dtn.tomlfile import check_private, read_toml

    rows: list[tuple[str, str]] = []
    raw = read_toml(config).get("node", {})
    keys_src = Path(config)
    if "keys_file" in raw:
        kf = Path(raw["keys_file"])
        keys_src = kf if kf.is_absolute() else Path(config).parent / kf
    if cfg.keys:
        check_private(str(keys_src), "keys")  # (loading checked it too; a box install states it)
        rows.append(("keys", f"{len(cfg.keys)} from {keys_src} ({_mode(keys_src)})"))
    else:
        rows.append(("keys", "none: no envelope can be sealed or opened (add [keys] or keys_file)"))
    st = cfg.storage
    try:
        if st.exists():
            if not st.is_dir():
                raise ConfigError(config, "node.storage", str(st), "is a file, not a folder")
            mode = st.stat().st_mode & 0o777
            state = _mode(st) + (
                "" if mode & 0o077 == 0 or (cfg.api_gid is not None and mode == 0o710) else "; made 0700 at start"
            )
        else:
            up = st.parent
            while not up.exists() and up != up.parent:
                up = up.parent
            if not up.is_dir():
                raise ConfigError(config, "node.storage", str(st), f"is under {up}, a file, not a folder")
            state = "made at start, mode 0700"
    except OSError as e:  # (a folder on the way this user may not look into)
        state = f"cannot look: {e.strerror}"
    rows.append(("storage", f"{st} ({state})" + ("" if st.is_absolute() else ": relative to where the node starts")))
    why = agent_class(cfg.agent).missing()
    listen = ", ".join(str(c) for c in cfg.listen)
    rows.append(("agent", f"{cfg.agent}, listening on {listen}" + (f": NOT USABLE HERE: {why}" if why else "")))
    naming = make_agent(cfg).naming()  # (its driver checks how the config names nodes: ConfigError)
    if naming:
        rows.append(("naming", naming))
    for p in cfg.peers:
        rows.append(("peer", f"{p.node} at {p.cla}"))
    if cfg.overlay:
        rows.append(("local API", f"{cfg.api_socket} (mode 0660)"))
    else:
        rows.append(("overlay", "off: the agent alone (a relay)"))
    if cfg.metrics_listen is not None:
        host, port = cfg.metrics_listen
        rows.append(("metrics", f"http://{host if ':' not in host else f'[{host}]'}:{port}/metrics"))
    if cfg.gateway is not None:
        from c2dtn.ip_gateway.policy import parse_gateway

        gw = parse_gateway(config, cfg.gateway)
        where = []
        if gw.listen:
            where.append(f"clients at {gw.listen[0]}:{gw.listen[1]}")
        if gw.tproxy:
            where.append(f"intercepted flows (TPROXY) at port {gw.tproxy_port}")
        rows.append(
            (
                "MQTT gateway",
                ", ".join(where)
                + f"; {len(gw.policy.routes)} route(s), {len(gw.policy.topics)} topic rule(s)"
                + ("; bridge" if gw.bridge else ""),
            )
        )
        if gw.coap is not None:
            c = gw.coap
            rows.append(
                (
                    "CoAP gateway",
                    (f"at {c.listen[0]}:{c.listen[1]}" if c.listen else "")
                    + (f" intercepted (TPROXY) at port {c.tproxy_port}" if c.tproxy else ""),
                )
            )
    return rows, not why
