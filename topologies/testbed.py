"""Build, inspect, change and tear down a topology in network namespaces.

Names (all carry the `c2` prefix):
  c2-<node>      a node's namespace; its interface toward neighbour X is `c2-<X>`
  c2e-<link>     a link's emulator namespace, ports c2a (faces node a) and c2b
  c2l-<lan>      a LAN segment's namespace: bridge c2br, ports c2p<i>
  processes      `c2emu <link>` (one per emulated link), `c2sched <topology>`

One topology runs at a time.  Its state is kept in $C2DTN_RUN_DIR (default
/run/c2dtn, so a reboot forgets it as it forgets the namespaces).  Teardown does
not trust that state alone: it removes every namespace with a testbed prefix and
stops the processes inside them by PID, so a crashed run never poisons the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from c2dtn.errors import C2Error, ConfigError
from c2dtn.topologies import core_engine, core_plan, netem, netns
from c2dtn.topologies.model import Topology, load
from c2dtn.topologies.profiles import Profile

NS_PREFIXES = ("c2-", "c2e-", "c2l-")
BACKENDS = ("auto", "netem", "userspace")
ENGINES = ("namespaces", "core")  # who builds the namespaces: c2dtn itself, or CORE (core_engine.py)


def default_engine() -> str:
    """--engine's default: $C2DTN_ENGINE (how `perf --engine` reaches every campaign), else namespaces."""
    return os.environ.get("C2DTN_ENGINE") or "namespaces"


class TestbedError(C2Error):
    pass


def run_dir() -> Path:
    d = Path(os.environ.get("C2DTN_RUN_DIR", "/run/c2dtn"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def state_path() -> Path:
    return run_dir() / "topology.json"


@contextlib.contextmanager
def locked_state() -> Iterator[dict[str, Any]]:
    """Read-modify-write the state file under an exclusive lock."""
    lock = open(run_dir() / "topology.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        st = read_state()
        if st is None:
            raise TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
        yield st
        _write_state(st)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def read_state() -> dict[str, Any] | None:
    try:
        return json.loads(state_path().read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # a half-written file from a crash: treat as nothing up


def _write_state(st: dict[str, Any]) -> None:
    tmp = state_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(st, indent=1))
    os.replace(tmp, state_path())


# --------------------------------------------------------------------- control
def emu_call(path: str, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One JSON-line request to a link's emulator."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except OSError as e:
        raise TestbedError(f"emulator at {path} does not answer: {e}") from None
    finally:
        s.close()
    resp = json.loads(buf)
    if not resp.get("ok"):
        raise TestbedError(f"emulator at {path}: {resp.get('error')}")
    return resp


# --------------------------------------------------------------------- teardown
def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def down(progress: Callable[[str], None] | None = None) -> list[str]:
    """Remove every testbed namespace and stop the processes in them.  Idempotent."""
    say = progress or (lambda m: None)
    removed = []
    st = read_state()
    if st and st.get("scheduler_pid"):
        pid = st["scheduler_pid"]
        if "c2dtn.topologies.scheduler" in _proc_cmdline(pid) or "c2sched" in _proc_cmdline(pid):
            netns.stop_pids([pid])
    if st and st.get("engine") == "core":
        _down_core(st, say)
    names = netns.list_ns(NS_PREFIXES)
    pids = netns.pids_in(names)
    all_pids = [p for ps in pids.values() for p in ps]
    if all_pids:
        say(f"stopping {len(all_pids)} processes")
        netns.stop_pids(all_pids)
    for n in names:
        netns.remove_ns(n)
        removed.append(n)
    if names:
        say(f"removed {len(names)} namespaces")
    core_engine.stop_daemon(run_dir())  # the testbed's own CORE daemon, even if the state is lost
    with contextlib.suppress(FileNotFoundError):
        state_path().unlink()
    for sock in run_dir().glob("emu-*.sock"):
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
    return removed


def _down_core(st: dict[str, Any], say: Callable[[str], None]) -> None:
    """What runs in a CORE session's nodes is stopped first (CORE's own node processes, whose
    PIDs the state holds, are left to CORE), then CORE removes the session it built; names of
    nodes on other servers are removed there."""
    core = st.get("core") or {}
    own = set(core.get("pids", {}).values())
    names = netns.list_ns(NS_PREFIXES)
    ours = [p for ps in netns.pids_in(names).values() for p in ps if p not in own]
    if ours:
        say(f"stopping {len(ours)} processes in CORE's nodes")
        netns.stop_pids(ours)
    if core.get("address") and core.get("session") is not None:
        try:
            core_engine.call(core["address"], "delete", {"session": core["session"]}, timeout=60)
            say(f"CORE session {core['session']} deleted")
        except core_engine.CoreError as e:
            say(f"CORE session {core['session']} not deleted: {e} (its namespaces are removed below)")
    for ns, host in core.get("hosts", {}).items():
        try:
            core_engine.remote(host, ["ip", "netns", "delete", ns])
        except (core_engine.CoreError, OSError, subprocess.SubprocessError) as e:
            say(f"{ns} on {host} not removed: {e}")


# --------------------------------------------------------------------- build
def choose_backend(requested: str) -> str:
    if requested not in BACKENDS:
        raise ConfigError(
            "--link-backend", "--link-backend", requested, "unknown backend", "choose auto, netem or userspace"
        )
    if requested == "auto":
        return "netem" if netem.netem_available() else "userspace"
    if requested == "netem" and not netem.netem_available():
        raise TestbedError(
            "--link-backend netem: this kernel has no sch_netem "
            "(tc says 'Specified qdisc kind is unknown'); use --link-backend userspace"
        )
    return requested


def up(
    topology: str,
    profile: str | None = None,
    backend: str = "auto",
    schedule: str | None = None,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
    engine: str | None = None,
    core_address: str | None = None,
    servers: str | None = None,
) -> dict[str, Any]:
    """Build `topology` (a name or a TOML file).  Cleans leftovers of any earlier run first.

    engine: "namespaces" (c2dtn's own) or "core" (a CORE session: a daemon the testbed starts
    on loopback, or the one at core_address; servers: a servers file placing nodes on CORE
    servers, distributed mode); default default_engine()."""
    say = progress or (lambda m: None)
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ConfigError("--engine", "--engine", engine, "unknown engine", "choose " + " or ".join(ENGINES))
    topo = load(topology, profile_override=profile, schedule_file=schedule)  # bad files fail before any change
    if backend not in BACKENDS:
        choose_backend(backend)  # raises the error naming the value
    if engine != "core" and (servers or core_address):
        raise ConfigError("--engine", "--engine", engine, "--servers and --core-address are for --engine core")
    netns.require_root()
    chosen = choose_backend(backend)
    placed = core_plan.load_servers(servers) if servers else None
    if engine == "core":
        plan = core_plan.session_plan(topo, chosen, placed)  # bad servers or profiles fail before any change
        if core_address is not None:
            core_engine.check_address(core_address)
        why = core_engine.missing()
        if why:
            raise TestbedError(f"--engine core: {why}")
        if placed is not None:
            core_engine.check_servers({s.name: s.host for s in placed.servers})
    if netns.list_ns(NS_PREFIXES) or state_path().exists() or (run_dir() / core_engine.DAEMON_PIDFILE).exists():
        say("cleaning up what an earlier run left")
        down()
    try:
        if engine == "core":
            st = _build_core(topo, chosen, seed, say, core_address, placed, plan)
        else:
            st = _build(topo, chosen, seed, say)
    except BaseException:
        down()
        raise
    return st


def _build(topo: Topology, backend: str, seed: int | None, say: Callable[[str], None]) -> dict[str, Any]:
    t0 = time.monotonic()
    node_ns = [n.netns for n in topo.nodes.values()]
    emu_links = [l for l in topo.links.values() if l.emulate]
    all_ns = node_ns + [l.netns for l in emu_links] + [s.netns for s in topo.lans.values()]
    say(f"creating {len(all_ns)} namespaces")
    for ns in all_ns:
        netns.create_ns(ns)
    for ns in all_ns:
        netns.sysctl(ns, core_plan.QUIET | (core_plan.FORWARD if ns in node_ns else {}))

    say(f"wiring {len(topo.links)} links and {len(topo.lans)} LANs")
    for link in topo.links.values():
        a_if, b_if = link.a_iface, link.b_iface
        mtu = max(link.profile_ab.mtu, link.profile_ba.mtu)
        mtu_a, mtu_b = link.profile_ab.mtu, link.profile_ba.mtu
        na, nb = topo.nodes[link.a].netns, topo.nodes[link.b].netns
        if not link.emulate:
            with netns.ipr(na) as ip:
                ip.link("add", ifname=a_if.name, kind="veth", peer={"ifname": b_if.name, "net_ns_fd": nb})
            _iface_up(na, a_if.name, mtu_a, a_if.address, a_if.prefixlen)
            _iface_up(nb, b_if.name, mtu_b, b_if.address, b_if.prefixlen)
            continue
        e = link.netns
        with netns.ipr(na) as ip:
            ip.link("add", ifname=a_if.name, kind="veth", peer={"ifname": "c2a", "net_ns_fd": e})
        with netns.ipr(nb) as ip:
            ip.link("add", ifname=b_if.name, kind="veth", peer={"ifname": "c2b", "net_ns_fd": e})
        _iface_up(na, a_if.name, mtu_a, a_if.address, a_if.prefixlen)
        _iface_up(nb, b_if.name, mtu_b, b_if.address, b_if.prefixlen)
        _iface_up(e, "c2a", mtu, promisc=True)
        _iface_up(e, "c2b", mtu, promisc=True)
        # both ends know each other's MAC: no ARP crosses an emulated radio (where its answer
        # can take longer than the kernel waits), as a radio's IP client is configured
        netns.static_neighbour(na, a_if.name, b_if.address, netns.mac_of(nb, b_if.name))
        netns.static_neighbour(nb, b_if.name, a_if.address, netns.mac_of(na, a_if.name))
        if backend == "userspace":
            netns.offloads_off(na, [a_if.name])
            netns.offloads_off(nb, [b_if.name])
            netns.offloads_off(e, ["c2a", "c2b"])
    for lan in topo.lans.values():
        e = lan.netns
        with netns.ipr(e) as ip:
            ip.link("add", ifname="c2br", kind="bridge", br_stp_state=0)
        for i, m in enumerate(lan.members):
            node = topo.nodes[m]
            iface = next(x for x in node.ifaces if x.attached == lan.name)
            with netns.ipr(node.netns) as ip:
                ip.link("add", ifname=iface.name, kind="veth", peer={"ifname": f"c2p{i}", "net_ns_fd": e})
            _iface_up(node.netns, iface.name, 1500, iface.address, iface.prefixlen)
            with netns.ipr(e) as ip:
                br = ip.link_lookup(ifname="c2br")[0]
                idx = ip.link_lookup(ifname=f"c2p{i}")[0]
                ip.link("set", index=idx, master=br, state="up")
        with netns.ipr(e) as ip:
            ip.link("set", index=ip.link_lookup(ifname="c2br")[0], state="up")

    say("installing routes")
    for node in topo.nodes.values():
        with netns.ipr(node.netns) as ip:
            lo = ip.link_lookup(ifname="lo")[0]
            ip.link("set", index=lo, state="up")
            for dst, gw in node.routes:
                ip.route("add", dst=dst, gateway=gw)

    st = state_of(topo, backend)
    _write_state(st)
    if backend == "netem":
        for link in emu_links:
            netem.run(netem.bridge_commands(link.netns, "c2a", "c2b"))
    _start_links(st, topo, seed, t0, say)
    return st


def _start_links(st: dict[str, Any], topo: Topology, seed: int | None, t0: float, say: Callable[[str], None]) -> None:
    """Put each emulated link's profile in place (netem) or start its userspace emulator,
    then the schedule runner; records all in the state file.  Either engine."""
    rd = run_dir()
    backend = st["backend"]
    emu_links = [l for l in topo.links.values() if l.emulate]
    links_state = st["links"]
    if emu_links:
        say(f"starting {len(emu_links)} link emulators ({backend})")
    for i, link in enumerate(emu_links):
        ls = links_state[link.name]
        if backend == "netem":
            _apply_profiles(st, ls)
        else:
            ctl = str(rd / f"emu-{link.name}.sock")
            log = open(rd / f"emu-{link.name}.log", "w")
            cmd = [
                "ip",
                "netns",
                "exec",
                link.netns,
                sys.executable,
                "-m",
                "c2dtn.topologies.emulator",
                "--link",
                link.name,
                "--a-if",
                "c2a",
                "--b-if",
                "c2b",
                "--control",
                ctl,
                "--profile-ab",
                json.dumps(link.profile_ab.to_dict()),
                "--profile-ba",
                json.dumps(link.profile_ba.to_dict()),
            ]
            if seed is not None:
                cmd += ["--seed", str(seed + 2 * i)]
            proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            ls["pid"] = proc.pid
            ls["control"] = ctl
    for link in emu_links:
        ls = links_state[link.name]
        if backend == "userspace":
            _wait_emulator(ls)
    st["started_monotonic"] = time.monotonic()
    st["started_wall"] = time.time()
    st["build_s"] = st["started_monotonic"] - t0
    if topo.schedule:
        log = open(rd / "scheduler.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "c2dtn.topologies.scheduler"],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        st["scheduler_pid"] = proc.pid
    _write_state(st)
    say(f"{topo.name} is up in {st['build_s']:.1f} s")


def _build_core(
    topo: Topology,
    backend: str,
    seed: int | None,
    say: Callable[[str], None],
    address: str | None,
    servers: core_plan.Servers | None,
    plan: dict[str, Any],
) -> dict[str, Any]:
    """The topology as a CORE session (core_plan), its namespaces named as the namespaces
    engine names its own, then configured and its links started as there."""
    t0 = time.monotonic()
    st = state_of(topo, backend)
    hosts = {s.name: s.host for s in servers.servers} if servers else {}
    st["engine"] = "core"
    st["core"] = {"address": address, "daemon_pid": None, "session": None, "pids": {}, "hosts": {}}
    for ls in st["links"].values():
        if ls["name"] in plan["emulators"] or not ls["emulate"]:
            continue
        ls["netns"] = None  # CORE's link options carry it: no emulator node
        link = next(l for l in plan["links"] if l.get("link") == ls["name"])
        ls["core"] = {
            "node1": plan["ids"][link["node1"]],
            "node2": plan["ids"][link["node2"]],
            "iface1": link["iface1"]["id"],
            "iface2": link["iface2"]["id"],
        }
    for lan in st["lans"].values():
        lan["netns"] = None  # a CORE switch (a bridge on the host), not a namespace
    _write_state(st)
    if address is None:
        address, pid = core_engine.start_daemon(run_dir(), say, servers.controller if servers else None)
        st["core"].update(address=address, daemon_pid=pid)
        _write_state(st)
    st["core"]["session"] = core_engine.call(address, "create")["session"]  # recorded: `down` deletes it
    _write_state(st)
    say(f"asking CORE for a session of {len(plan['nodes'])} nodes and {len(plan['links'])} links ({backend} links)")
    ans = core_engine.call(address, "build", plan | {"session": st["core"]["session"]})
    tmp = (core_engine.daemon_dir(run_dir()) / "tmpdir").read_text() if st["core"]["daemon_pid"] else ""
    if tmp and not ans["dir"].startswith(tmp + "/"):
        raise TestbedError(f"CORE put session {ans['session']} in {ans['dir']}, not in its own folder")
    st["core"]["dir"] = ans["dir"]
    _write_state(st)
    netns_of = {n.name: n.netns for n in topo.nodes.values()} | {e: e for e in plan["emulators"].values()}
    for n in plan["nodes"]:
        if n["type"] != "DEFAULT":
            continue
        host = hosts.get(n["server"]) if n["server"] else None
        pid = core_engine.node_pid(ans["dir"], n["name"], host)
        core_engine.attach(netns_of[n["name"]], pid, host)
        st["core"]["pids"][n["name"]] = pid
        if host:
            st["core"]["hosts"][netns_of[n["name"]]] = host
    _write_state(st)
    core_engine.quiet_host_side([ns for ns in netns_of.values() if ns not in st["core"]["hosts"]])
    say(f"configuring {len(netns_of)} CORE nodes")
    for ns, cmds in core_plan.node_commands(topo, plan).items():
        script = " && ".join(" ".join(shlex.quote(a) for a in c) for c in cmds)
        argv = core_engine.exec_argv(st["core"]["hosts"].get(ns), ns, ["bash", "-c", script])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise TestbedError(f"configuring CORE node {ns}: {r.stderr.strip() or r.returncode}")
    _start_links(st, topo, seed, t0, say)
    return st


def state_of(topo: Topology, backend: str) -> dict[str, Any]:
    """The testbed state of a topology (what topo status shows), before anything runs."""
    links_state = {}
    for link in topo.links.values():
        ls = {
            "name": link.name,
            "a": link.a,
            "b": link.b,
            "dil": link.dil,
            "emulate": link.emulate,
            "cla": link.cla,
            "netns": link.netns if link.emulate else None,
            "subnet": link.subnet,
            "a_if": link.a_iface.name,
            "b_if": link.b_iface.name,
            "a_addr": link.a_iface.address,
            "b_addr": link.b_iface.address,
            "profile_ab": link.profile_ab.to_dict(),
            "profile_ba": link.profile_ba.to_dict(),
            "state": "up",
            "pid": None,
            "control": None,
        }
        links_state[link.name] = ls
    st: dict[str, Any] = {
        "topology": topo.name,
        "source": topo.source,
        "engine": "namespaces",
        "backend": backend,
        "nodes": {
            n.name: {
                "role": n.role,
                "netns": n.netns,
                "agent": n.agent,
                "ifaces": [
                    {"name": i.name, "address": i.address, "prefixlen": i.prefixlen, "attached": i.attached}
                    for i in n.ifaces
                ],
                "routes": n.routes,
            }
            for n in topo.nodes.values()
        },
        "lans": {s.name: {"members": s.members, "subnet": s.subnet, "netns": s.netns} for s in topo.lans.values()},
        "links": links_state,
        "schedule": [
            {
                "at_s": ev.at_s,
                "link": ev.link,
                "action": ev.action,
                "carrier": ev.carrier,
                "one_way": ev.one_way,
                "profile": ev.profile.to_dict() if ev.profile else None,
            }
            for ev in topo.schedule
        ],
        "events_applied": [],
        "scheduler_pid": None,
    }
    return st


def _iface_up(
    ns: str, ifname: str, mtu: int, address: str | None = None, prefixlen: int = 24, promisc: bool = False
) -> None:
    with netns.ipr(ns) as ip:
        idx = ip.link_lookup(ifname=ifname)[0]
        if address:
            ip.addr("add", index=idx, address=address, prefixlen=prefixlen)
        ip.link("set", index=idx, state="up", mtu=mtu)
        if promisc:
            ip.link("set", index=idx, flags=0x101, change=0x101)  # IFF_UP | IFF_PROMISC


def _wait_emulator(ls: dict[str, Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if ls["pid"] and not netns._alive(ls["pid"]):
            log = Path(ls["control"]).with_suffix(".log").read_text()[-2000:]
            raise TestbedError(f"emulator for link {ls['name']} exited at start:\n{log}")
        try:
            emu_call(ls["control"], {"cmd": "ping"}, timeout=1.0)
            return
        except (TestbedError, ValueError) as e:
            last = e
            time.sleep(0.05)
    raise TestbedError(f"emulator for link {ls['name']} did not answer within {timeout:.0f} s: {last}")


# --------------------------------------------------------------------- live changes
def _apply_profiles(st: dict[str, Any], ls: dict[str, Any], outage: bool = False) -> None:
    pab, pba = Profile.from_dict(ls["profile_ab"]), Profile.from_dict(ls["profile_ba"])
    if st["backend"] == "netem" and st.get("engine") == "core":
        # CORE's link options, each direction on its sending interface (core_plan.link_options)
        c = ls["core"]
        for p, n1, n2, i1, i2 in (
            (pab, "node1", "node2", "iface1", "iface2"),
            (pba, "node2", "node1", "iface2", "iface1"),
        ):
            opts = core_plan.link_options(p) | (core_plan.OUTAGE_OPTIONS if outage else {})
            req = {"session": st["core"]["session"], "node1": c[n1], "node2": c[n2], "iface1": c[i1], "iface2": c[i2]}
            core_engine.call(st["core"]["address"], "edit", req | {"options": opts})
    elif st["backend"] == "netem":
        if outage:
            pab, pba = netem.outage_profile(pab), netem.outage_profile(pba)
        # a->b leaves the emulator through the port facing b, and vice versa
        netem.run(netem.tc_commands(ls["netns"], "c2b", pab) + netem.tc_commands(ls["netns"], "c2a", pba))
    else:
        emu_call(ls["control"], {"cmd": "set", "profile_ab": pab.to_dict(), "profile_ba": pba.to_dict()})


def _carrier(ls: dict[str, Any], on: bool) -> None:
    if ls["netns"] is None:
        raise TestbedError(
            f"link {ls['name']} has no emulator node to cut its carrier in (run it with --link-backend userspace)"
        )
    with netns.ipr(ls["netns"]) as ip:
        for port in ("c2a", "c2b"):
            ip.link("set", index=ip.link_lookup(ifname=port)[0], state="up" if on else "down")


def find_link(st: dict[str, Any], a: str, b: str | None) -> dict[str, Any]:
    links = st["links"]
    if b is None:
        if a in links:
            return links[a]
        raise ConfigError("topo link", "LINK", a, "no such link", "links: " + ", ".join(links))
    for ls in links.values():
        if {ls["a"], ls["b"]} == {a, b}:
            return ls
    raise ConfigError(
        "topo link",
        "A B",
        f"{a} {b}",
        "no link between these nodes",
        "links: " + ", ".join(f"{l['a']} {l['b']}" for l in links.values()),
    )


def change_link(
    a: str, b: str | None, action: str, profile: Profile | None = None, carrier: bool = False, one_way: bool = False
) -> dict[str, Any]:
    """down / up / set PROFILE on a live link; returns the link's new state.

    `a b` are the link's two nodes (or `a` is the link's name and b is None).
    `set` changes both directions unless one_way, which changes only a -> b.
    """
    if action not in ("down", "up", "set"):
        raise ConfigError("topo link", "ACTION", action, "unknown action", "choose down, up or set")
    with locked_state() as st:
        ls = find_link(st, a, b)
        if not ls["emulate"]:
            raise TestbedError(f"link {ls['name']} is a plain veth pair (emulate = false): it cannot be changed live")
        if action == "set":
            if profile is None:
                raise ConfigError("topo link", "PROFILE", None, "set needs a profile")
            forward = "ab" if b is None or ls["a"] == a else "ba"
            ls[f"profile_{forward}"] = profile.to_dict()
            if not one_way:
                ls["profile_" + ("ba" if forward == "ab" else "ab")] = profile.to_dict()
            _apply_profiles(st, ls, outage=ls["state"] != "up")
        elif action == "down":
            if carrier:
                _carrier(ls, False)
            if st["backend"] == "netem":
                _apply_profiles(st, ls, outage=True)
            else:
                emu_call(ls["control"], {"cmd": "down"})
            ls["state"] = "down (carrier)" if carrier else "down"
        else:
            if ls["state"] == "down (carrier)":
                _carrier(ls, True)
            if st["backend"] == "netem":
                _apply_profiles(st, ls, outage=False)
            else:
                emu_call(ls["control"], {"cmd": "up"})
            ls["state"] = "up"
        st["events_applied"].append(
            {
                "at_monotonic": time.monotonic(),
                "link": ls["name"],
                "action": action,
                "profile": profile.name if profile else None,
                "carrier": carrier,
            }
        )
        return dict(ls)


def status() -> dict[str, Any]:
    st = read_state()
    if st is None:
        raise TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    for ls in st["links"].values():
        ls["live"] = None
        if st["backend"] == "userspace" and ls["control"]:
            try:
                ls["live"] = emu_call(ls["control"], {"cmd": "status"}, timeout=2.0)
            except (TestbedError, ValueError) as e:
                ls["live"] = {"error": str(e)}
    return st


def capture(links: list[str], out: Path | None) -> dict[str, str]:
    """Have the emulators of `links` write what they carry to out/<link>.pcapng (None: stop):
    both ways, and what they dropped marked as such (emulator.Emulator._capture).  The
    userspace emulator only: netem's links are captured with tcpdump, if at all."""
    st = read_state()
    if st is None:
        raise TestbedError("no topology is up (start one with: c2dtn topo up NAME)")
    if st["backend"] != "userspace":
        raise TestbedError(f"links of the {st['backend']} backend are not captured (the userspace emulator is)")
    if out is not None:
        # the emulators write as root: into a folder nobody else may put a link or a FIFO in
        d = Path(out).resolve()
        d.mkdir(parents=True, exist_ok=True)
        info = d.stat()
        if info.st_uid not in (0, os.getuid()) or info.st_mode & 0o022:
            raise TestbedError(
                f"capture folder {d}: owner uid {info.st_uid}, mode {info.st_mode & 0o777:04o}: others could "
                "plant a link or a FIFO where a capture goes; use a folder of your own that only you can write to"
            )
        out = d
    paths: dict[str, str] = {}
    for name in links:
        if name not in st["links"]:
            raise ConfigError("topology " + st["topology"], "LINK", name, "no such link", ", ".join(st["links"]))
        path = None if out is None else str(Path(out) / f"{name}.pcapng")
        r = emu_call(st["links"][name]["control"], {"cmd": "capture", "path": path})
        if not r.get("ok"):
            raise TestbedError(f"link {name}: {r.get('error')}")
        if path is not None:
            paths[name] = path
    return paths


def node_netns(st: dict[str, Any], node: str) -> str:
    if node not in st["nodes"]:
        raise ConfigError(
            "topology " + st["topology"], "NODE", node, "no such node", "nodes: " + ", ".join(st["nodes"])
        )
    return st["nodes"][node]["netns"]


def node_address(st: dict[str, Any], node: str) -> str:
    node_netns(st, node)
    return st["nodes"][node]["ifaces"][0]["address"]


def path_between(st: dict[str, Any], src: str, dst: str) -> list[tuple[dict[str, Any], str]]:
    """The emulated links (and direction 'ab' or 'ba') a packet from src to dst crosses,
    following the installed routes hop by hop."""
    dst_addr = node_address(st, dst)
    import ipaddress

    target = ipaddress.ip_address(dst_addr)
    hops: list[tuple[dict[str, Any], str]] = []
    cur = src
    for _ in range(64):
        node = st["nodes"][cur]
        if any(i["address"] == dst_addr for i in node["ifaces"]):
            return hops
        nxt_addr = None
        for i in node["ifaces"]:
            if target in ipaddress.ip_network(f"{i['address']}/{i['prefixlen']}", strict=False):
                nxt_addr = dst_addr
                attached = i["attached"]
                break
        else:
            for net, gw in node["routes"]:
                if target in ipaddress.ip_network(net):
                    nxt_addr = gw
                    attached = next(
                        i["attached"]
                        for i in node["ifaces"]
                        if ipaddress.ip_address(gw)
                        in ipaddress.ip_network(f"{i['address']}/{i['prefixlen']}", strict=False)
                    )
                    break
        if nxt_addr is None:
            raise TestbedError(f"no route from {src} to {dst} at {cur}")
        nxt = next(n for n, v in st["nodes"].items() if any(i["address"] == nxt_addr for i in v["ifaces"]))
        if attached in st["links"]:
            ls = st["links"][attached]
            hops.append((ls, "ab" if ls["a"] == cur else "ba"))
        cur = nxt
    raise TestbedError(f"routing loop from {src} to {dst}")


def path_profile(hops: list[tuple[dict[str, Any], str]]) -> Profile:
    """What a path of links amounts to: sum of delays, narrowest rate, combined loss."""
    rate = None
    delay = 0.0
    keep = 1.0
    jitter = 0.0
    names = []
    for ls, d in hops:
        p = Profile.from_dict(ls[f"profile_{d}"])
        names.append(p.name)
        if p.rate_bps:
            rate = p.rate_bps if rate is None else min(rate, p.rate_bps)
        delay += p.delay_s
        jitter += p.jitter_s
        loss = p.gilbert_elliott.mean_loss() if p.gilbert_elliott else p.loss
        keep *= 1 - loss
    return replace(
        Profile(), name="+".join(names) or "direct", rate_bps=rate, delay_s=delay, jitter_s=jitter, loss=1 - keep
    )


def serialization_s(hops: list[tuple[dict[str, Any], str]], frame_bytes: int) -> float:
    total = 0.0
    for ls, d in hops:
        p = Profile.from_dict(ls[f"profile_{d}"])
        if p.rate_bps:
            total += frame_bytes * 8 / p.rate_bps
    return total
