"""ION-DTN 4.1.3 driver: one ION node per overlay node, reached through c2dtn-ionbp.

How it works, its quirks and the workarounds here: docs/agents/ion.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from c2dtn.cla_adapters.numbering import derived_number, node_numbers
from c2dtn.cla_adapters.schemes import cla_name
from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import C2Error, ConfigError
from c2dtn.overlay.agent import (
    SEED_002,
    AgentDelivery,
    AgentError,
    BundleAgent,
    Capabilities,
    Launch,
    PeerInfo,
    Published,
    queued_deliveries,
    static_peers,
)
from c2dtn.overlay.agents import register
from c2dtn.overlay.agents.builds import built, not_built

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig

log = logging.getLogger("c2dtn.ion")

SERVICE = 1  # the overlay's endpoint on every ION node: ipn:N.1
CLA_NAMES = {"tcpcl": "tcp", "udp": "udp", "ltp": "ltp"}
FOREVER_S = 300_000_000  # contacts and ranges of LTP spans: from the node's start for 9.5 years
# (ION refuses an end past 19 January 2038; each start of the node writes them anew)
LTP_SESSIONS = 16  # export sessions per span (each carries one bundle: LTP's window), and import
LTP_SEGMENT = 1024  # bytes of block data per LTP segment (one UDP datagram, below any link's MTU)
HELPER = Path(__file__).resolve().parent.parent.parent / ".tools" / "c2dtn-ionbp"  # where `make bpas` builds it


def find_helper() -> Path | None:
    """c2dtn-ionbp from $C2DTN_IONBP, the clone's .tools/, or PATH (a box install)."""
    for c in (os.environ.get("C2DTN_IONBP", ""), str(HELPER), shutil.which("c2dtn-ionbp") or ""):
        if c and os.access(c, os.X_OK):
            return Path(c)
    return None


ATTACH_S = 10  # the helper attaches in well under a second; longer than this: the node is locked (above)
SEND_S = 30  # bp_send answers within this (a 16 MB payload into the SDR file), or the helper is stuck
RESTART_S = 60  # ionunlock and the ionrestart it runs (its grace period, then stopping and starting daemons)
MAX_FRAME = (16 << 20) + 1024
# runs ion-run.sh as PID 1 of IPC, mount and PID namespaces of its own (docs/agents/ion.md)
NAMESPACES = ("unshare", "--ipc", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private")


def _duct(spec) -> str:
    return cla_name("ION", CLA_NAMES, spec, "TCPCLv3")


def _ltp_files(cfg: NodeConfig, nums: dict[str, int]) -> tuple[str, list[str]]:
    """The node's ltprc, and the ionrc lines its LTP spans need: a contact each way and a
    range with every LTP neighbour.  ION's LTP sends to a neighbour only while a contact
    says it may (ltpclock stops a span's transmission at a rate of 0) and paces udplso by
    the contact's rate, so the contacts last from the start on at the neighbour's rate
    (`rates`, else `rate_bytes`); the links are cut by the radio, not by the plan.  Each bundle is its own block (aggregation
    threshold 1 byte): the overlay has already put its envelopes together."""
    o = cfg.agent_options
    me = nums[cfg.id]
    peers = [p for p in cfg.peers if p.cla.scheme == "ltp"]
    seats = [s for s in cfg.listen if s.scheme == "ltp"]
    ltp = [
        f"# written by c2dtn from {cfg.source}",
        f"1 {LTP_SESSIONS * max(1, len(peers))}",
        "m screening n",
    ]  # take segments whatever the plan says of the time: the clocks of the
    # testbed's nodes are one, but a box's may not be
    for p in peers:
        ltp.append(
            f"a span {nums[p.node]} {LTP_SESSIONS} {LTP_SESSIONS} {LTP_SEGMENT} 1 1 'udplso {p.cla.host}:{p.cla.port}'"
        )
    for st in seats:
        ltp.append(f"a seat 'udplsi {st.host}:{st.port}'")
    ltp += ["s", ""]
    ion = []
    for p in peers:
        peer = nums[p.node]
        rate = o["rates"].get(p.node, o["rate_bytes"])
        ion += [
            f"a contact +0 +{FOREVER_S} {me} {peer} {rate}",
            f"a contact +0 +{FOREVER_S} {peer} {me} {rate}",
            f"a range +0 +{FOREVER_S} {me} {peer} 0",
        ]
    return "\n".join(ltp), ion


def _duct_name(peer, nums: dict[str, int]) -> str:
    """An outduct's name: host:port, or for LTP the neighbour's engine (its node number)."""
    return str(nums[peer.node]) if peer.cla.scheme == "ltp" else f"{peer.cla.host}:{peer.cla.port}"


def bibe_peers(cfg: NodeConfig, key: str = "bibe") -> list:
    """The neighbours (PeerInfo) named by `[agent.ion] bibe` (sent to with BIBE custody) or
    `bibe_from` (whose BIBE PDUs this node takes custody of)."""
    want = cfg.agent_options[key]
    if want == ["*"]:
        return list(cfg.peers)
    by_node = {p.node: p for p in cfg.peers}
    for n in want:
        if n not in by_node:
            raise ConfigError(
                cfg.source,
                f"agent.ion.{key}",
                n,
                "is not a neighbour of this node (BIBE is between neighbours)",
                f"its neighbours: {', '.join(sorted(by_node)) or 'none'}",
            )
    return [by_node[n] for n in want]


def _bibe_lines(cfg: NodeConfig, nums: dict[str, int], to: list, takes: list) -> tuple[list[str], list[str], str]:
    """bprc lines (after the outducts), ipnrc override lines, and the biberc, for BIBE custody to
    the neighbours `to` and from the neighbours `takes` (module docstring)."""
    lat = cfg.agent_options["bibe_latency_s"]
    bp, ipn = [], []
    bibe = [f"# written by c2dtn from {cfg.source}"]
    for p in to + [p for p in takes if p not in to]:
        v = nums[p.node]
        # bibeclo sends the BPDUs to V and, in a thread of its own, the custody signals for V's
        bp.append(f"a outduct bibe ipn:{v}.0 bibeclo")
        # peer, fwd and return latency, report-to, status report flags, lifespan (0: fwd + rtn),
        # priority (standard), ordinal, qosFlags (64: custody transfer requested), data label
        bibe.append(f"a bcla ipn:{v}.0 {lat} {lat} '' 0 0 1 0 64 0")
        if p not in to:
            continue
        rate = cfg.agent_options["rates"].get(p.node, cfg.agent_options["rate_bytes"])
        bp += [
            f"a plan ipn:{v}.0 {rate}",
            f"a planduct ipn:{v}.0 {_duct(p.cla)} {_duct_name(p, nums)}",  # the first: BPDUs and bundles for V
            f"a planduct ipn:{v}.0 bibe ipn:{v}.0",
        ]
        for r in cfg.routes:
            if r.via == p.node and r.to not in (p.node, "*"):
                ipn.append(f"a rtovrd 0 {nums[r.to]} 0 {v} bibe/ipn:{v}.0")
    return bp, ipn, "\n".join(bibe + [""])


def ion_files(cfg: NodeConfig, ion_bin: Path) -> dict[str, str]:
    """The files of one ION node: name -> text (in the agent folder)."""
    o = cfg.agent_options
    nums = node_numbers(cfg, derived_number)
    me = nums[cfg.id]
    d = cfg.agent_dir
    files = {}
    files["node.ionconfig"] = "\n".join(
        [
            f"# written by c2dtn from {cfg.source}",
            # sdrName and wmKey stay ION's defaults ("ion", 0xff01): ION refuses others without
            # ION_NODE_LIST_DIR, and in its own IPC namespace the node shares them with no one
            "configFlags 14",  # SDR in a file, reversible, bounded: what ION held survives a SIGKILL
            f"pathName {d}",
            f"heapWords {o['sdr_mb'] * (1 << 20) // 8}",
            "wmSize 20000000",
            # a node in its own IPC namespace sizes its SDR working memory itself: room for the log
            # of a transaction that writes a 16 MB payload (c2dtn-ionbp writes each in one)
            "sdrWmSize 40000000",
            "",
        ]
    )
    uses_ltp = any(s.scheme == "ltp" for s in cfg.listen) or any(p.cla.scheme == "ltp" for p in cfg.peers)
    ltprc, contacts = _ltp_files(cfg, nums) if uses_ltp else ("", [])
    files["node.ionrc"] = "\n".join(
        [f"# written by c2dtn from {cfg.source}", f"1 {me} {d / 'node.ionconfig'}", *contacts, "s", ""]
    )
    if uses_ltp:
        files["node.ltprc"] = ltprc
    bp = [
        f"# written by c2dtn from {cfg.source}",
        "1",
        "a scheme ipn 'ipnfw' 'ipnadminep'",
        f"a endpoint ipn:{me}.{SERVICE} q",
    ]
    bibe, bibe_from = bibe_peers(cfg), bibe_peers(cfg, "bibe_from")
    uses_bibe = bool(bibe or bibe_from)
    both = [p.node for p in bibe if p in bibe_from]
    if both:
        raise ConfigError(
            cfg.source,
            "agent.ion.bibe_from",
            both[0],
            "is also in agent.ion.bibe: BIBE custody both "
            "ways between two ION 4.1.3 nodes passed no bundle back in the live tests",
            "use BIBE one way on a link: the way the traffic that needs custody goes",
        )
    protocols = sorted(
        {_duct(s) for s in cfg.listen} | {_duct(p.cla) for p in cfg.peers} | ({"bibe"} if uses_bibe else set())
    )
    for proto in protocols:
        bp.append(f"a protocol {proto}")
    if uses_bibe:  # the bcla must be there before bibeclo starts
        bp += ["r 'bibeadmin node.biberc'", "a induct bibe * ''"]
    for s in cfg.listen:
        if _duct(s) != "ltp":  # LTP has one induct, the node's engine; its seats listen
            bp.append(f"a induct {_duct(s)} {s.host}:{s.port} {_duct(s)}cli")
    if uses_ltp:
        bp.append(f"a induct ltp {me} ltpcli")
    for p in cfg.peers:
        bp.append(f"a outduct {_duct(p.cla)} {_duct_name(p, nums)} {_duct(p.cla)}clo")
    bibe_bp, overrides, biberc = _bibe_lines(cfg, nums, bibe, bibe_from)
    if uses_bibe:
        files["node.biberc"] = biberc
    bp += bibe_bp + ["s", ""]
    files["node.bprc"] = "\n".join(bp)
    ipn = [f"# written by c2dtn from {cfg.source}"]
    for p in cfg.peers:
        if p in bibe:  # its plan is in the bprc, with the bibe duct
            continue
        ipn.append(
            f"a plan {nums[p.node]} {_duct(p.cla)}/{_duct_name(p, nums)} {o['rates'].get(p.node, o['rate_bytes'])}"
        )
    neighbours = {p.node for p in cfg.peers}
    for r in cfg.routes:
        if r.to in neighbours or r.to == r.via:
            continue
        first, last = (1, (1 << 63) - 1) if r.to == "*" else (nums[r.to], nums[r.to])
        ipn.append(f"a exit {first} {last} ipn:{nums[r.via]}.0")
    files["node.ipnrc"] = "\n".join(ipn + overrides + [""])
    # the keeper: runs as PID 1 of the node's PID namespace (nothing of ION outlives it)
    files["ion-run.sh"] = f"""#!/bin/sh
# written by c2dtn: one ION node in IPC, mount and PID namespaces of its own
mount -t tmpfs c2-ionshm /dev/shm || exit 2
mount -t proc c2-ionproc /proc || exit 2
cd {d}
export PATH={ion_bin}:$PATH
rm -f ready
wipe() {{ rm -f ion.sdr ion.sdrlog "$@"; }}  # this or the next start is with an empty SDR
if [ -e wipe-sdr ]; then  # the driver restarted the node after a lock (IonAgent._restart_node)
    echo "c2dtn: restarted after a lock; starting with an empty SDR" >>admin.log
    wipe wipe-sdr
fi
stop() {{ bpadmin . >>admin.log 2>&1;{" ltpadmin . >>admin.log 2>&1;" if uses_ltp else ""} ionadmin . >>admin.log 2>&1; touch clean; exit 0; }}
trap stop TERM INT
start() {{
    ionadmin node.ionrc >>admin.log 2>&1{" && ltpadmin node.ltprc >>admin.log 2>&1" if uses_ltp else ""} \
        && bpadmin node.bprc >>admin.log 2>&1 && ipnadmin node.ipnrc >>admin.log 2>&1 || return 1
    for i in 1 2 3 4 5 6 7 8 9 10; do  # the admin programs start the daemons in the background
        pidof rfxclock >/dev/null && pidof bpclock >/dev/null && return 0
        sleep 0.5
    done
    return 1
}}
if ! start; then
    # ION could not take up its SDR again: the next start (by the supervisor, in fresh
    # namespaces: this one's working memory still catalogues the SDR) is with an empty one;
    # the overlay holds every envelope in its own custody and sends again what was lost here
    echo "c2dtn: ION did not start on its SDR; the next start is with an empty one" >>admin.log
    wipe
    exit 3
fi
echo started >ready
# the daemons the node runs, one line per process (several bpclm, udpclo...: one per plan or
# duct): every ION daemon is a child of this script, PID 1 of the namespace, once the admin
# program that started it has ended; clients entered with nsenter are not.  Left out: this
# script's subshells, and ION's programs that end by themselves (the admin programs, ionwarn,
# cpsd with no multicast, ionrestart run by ionunlock)
daemons() {{
    for p in $(cat /proc/1/task/1/children 2>/dev/null); do
        {{ read -r c </proc/$p/comm; }} 2>/dev/null || continue
        case $c in
            ion-run.sh | sh | sleep | cat | sort | comm | *admin | ionwarn | cpsd | ionrestart | ionunlock | nsenter | c2dtn-ionbp) ;;
            *) echo "$c" ;;
        esac
    done | sort
}}
sleep 2 & wait $! || true  # the CL tasks start just after bpclock
daemons >watched.list
if ! grep -qx rfxclock watched.list || ! grep -qx bpclock watched.list; then
    echo "c2dtn: ION's rfxclock or bpclock ended as it started; the next start is with an empty SDR" >>admin.log
    wipe
    exit 3
fi
echo "c2dtn: started; watching" $(cat watched.list) >>admin.log
log_at=$(wc -c <ion.log 2>/dev/null || echo 0)
# A daemon that ends leaves the node taking bundles it never forwards (ipnfw, after ionunlock's
# in-place restart; a udpclo, on a send error): then end too, so that the supervisor starts
# the node again.  On an empty SDR if ION says its SDR is damaged, or an ionrestart ran (ION
# 4.1.3's in-place restart left daemons to end on it); otherwise on the same one.  While
# ionrestart runs they are meant to be gone: for a minute at most
down=0
restarted=""
while :; do
    daemons >now.list
    gone=$(comm -23 watched.list now.list | tr '\n' ' ')
    if pidof ionrestart >/dev/null; then
        restarted=yes
    fi
    if [ -z "$gone" ]; then
        down=0
    elif [ -n "$restarted" ] && pidof ionrestart >/dev/null && [ $down -lt 60 ]; then
        down=$((down + 1))
    else
        break
    fi
    sleep 1 & wait $! || true
done
if [ -n "$restarted" ] || tail -c +$((log_at + 1)) ion.log 2>/dev/null \
    | grep -qE "Assertion failed|Dataspace read failed|Transaction aborted|Unrecoverable SDR|restart loop"; then
    echo "c2dtn: ION's ${{gone% }} ended; stopping the node, the next start with an empty SDR" >>admin.log
    wipe
else
    echo "c2dtn: ION's ${{gone% }} ended; stopping the node, the next start on the same SDR" >>admin.log
fi
exit 4
"""
    return files


# -- the frames of c2dtn-ionbp (overlay/agents/ion_bp.c) ----------------------------------------------


def send_frame(eid: str, payload: bytes, lifetime_s: int, cos: int = 1) -> bytes:
    e = eid.encode()
    body = struct.pack(">IBH", lifetime_s, cos, len(e)) + e
    return struct.pack(">IB", 1 + len(body) + len(payload), ord("S")) + body + payload


class FrameReader:
    """Bytes from the helper in, (type, body) frames out: no I/O, fed as data arrives."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= 5:
            n = int.from_bytes(self._buf[:4], "big")
            if n < 1 or n > MAX_FRAME:
                raise AgentError(f"c2dtn-ionbp sent a frame of {n} bytes: the stream is out of step")
            if len(self._buf) < 4 + n:
                break
            out.append((chr(self._buf[4]), bytes(self._buf[5 : 4 + n])))
            del self._buf[: 4 + n]
        return out


def parse_delivery(body: bytes) -> tuple[str, int, bytes]:
    """'D' body -> (source EID, creation ms since 2000, payload)."""
    if len(body) < 10:
        raise AgentError(f"short delivery frame ({len(body)} bytes)")
    n = int.from_bytes(body[:2], "big")
    if 2 + n + 8 > len(body):
        raise AgentError("delivery frame: source EID runs past the frame")
    return body[2 : 2 + n].decode(errors="replace"), int.from_bytes(body[2 + n : 10 + n], "big"), body[10 + n :]


OPTIONS = table(
    "agent.ion",
    "ION-DTN's own settings ([its page](agents/ion.md)).",
    [
        F("number", "integer", "0", "This node's ipn node number (0: derived from the node id).", "0"),
        F("numbers", "table", "{}", "Other nodes' ipn numbers by node id, where they are not derived.", "{ gw4 = 40 }"),
        F("sdr_mb", "integer", "64", "Size of ION's SDR (the bundles it holds; created once).", "64", "MiB"),
        F(
            "rate_bytes",
            "integer",
            "12500000",
            "Nominal rate of every egress plan and LTP contact. On a radio "
            "link set it a little under the radio's rate (the testbed writes 90 % for LTP): ION then paces what it "
            "sends, where at the default it would hand the radio more than it carries and the radio's queue would "
            "hold it.",
            "1100",
            "bytes/s",
        ),
        F("rates", "table", "{}", "A neighbour's own rate by node id (its radio link's).", "{ r2 = 1225 }", "bytes/s"),
        F(
            "bibe",
            "array of names",
            "[]",
            'Neighbours sent to with ION\'s BIBE custody transfer ("*": every one); '
            "an option to measure, not the overlay's custody.",
            '["r2"]',
        ),
        F(
            "bibe_from",
            "array of names",
            "[]",
            'Neighbours whose BIBE PDUs this node takes custody of ("*": every one).',
            '["gw1"]',
        ),
        F(
            "bibe_latency_s",
            "integer",
            "5",
            "Expected one-way delivery time between BIBE neighbours, queueing "
            "included; an unsignalled PDU is sent again after twice this plus 2 s.",
            "5",
            "s",
        ),
    ],
)


@register("ion")
class IonAgent(BundleAgent):
    # BPv7; the helper takes payloads up to 16 MB; no group endpoints (imc: above); the SDR is a file
    # udpclo sends a bundle as one datagram of at most UDPCLA_BUFSZ (65,535) bytes
    # ION 4.1.3's TCPCLv3 (tcpcli) asserted in bpDequeue after a refused connection in the testbed
    # (a neighbour not yet listening, or restarting after a SIGKILL) and passed no bundle again
    testbed_clas = ("udp", "ltp")

    @classmethod
    def testbed_options(
        cls, ltp_rates_bps: dict[str, int], store: str, numbers: dict[str, int] | None = None
    ) -> dict[str, Any]:
        # its LTP paces itself by its contacts' rates (the radio's), in bytes a second
        return {"rates": {m: r // 8 for m, r in ltp_rates_bps.items()}} if ltp_rates_bps else {}

    @classmethod
    def numbered(cls, numbers: dict[str, int]) -> dict[str, Any]:
        return {"numbers": dict(numbers)}

    # udp+bibe: BIBE custody across the radio hop r2 -> r3 of nps-chain, where the link is lossy and
    # cut, the way the data goes (gw1 -> gw4; acks and echoes come back over plain UDP).  One way:
    # both ways passed no ack back.  Not on every hop: with BIBE both ways between every pair of
    # neighbours one run wrecked r2's SDR at the start ("Dataspace read failed", then bibeclo asking
    # for -6 bytes)
    testbed_variants = {
        "udp+bibe": ("udp", {"r2": '[agent.ion]\nbibe = ["r3"]\n', "r3": '[agent.ion]\nbibe_from = ["r2"]\n'})
    }
    published = (
        Published("seed 002", "round trip", "70-99 ms", 70, 99, SEED_002),
        Published("seed 002", "throughput at 1 MB", "over 100 Mbit/s", 100e6, 100e6, SEED_002),
    )
    cla_names = CLA_NAMES
    capabilities = Capabilities(
        bp_version=7,
        max_bundle_bytes=16 << 20,
        groups=False,
        own_custody=True,
        clas=("tcpcl", "udp", "ltp"),
        udp_bundle_max=65_000,
    )
    endpoint = str(SERVICE)

    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.nums = node_numbers(cfg, derived_number)
        self.names = {v: k for k, v in self.nums.items()}
        self.eid = f"ipn:{self.nums[cfg.id]}.{SERVICE}"
        self._helper: asyncio.subprocess.Process | None = None
        self._reader_task: asyncio.Task | None = None
        self._acks: list[asyncio.Future] = []  # one per 'S' frame, answered in order
        self._deliveries: asyncio.Queue = asyncio.Queue(maxsize=256)
        self._lock = asyncio.Lock()
        self._attached = asyncio.Event()
        self._fatal = ""  # the helper's last 'X' frame

    # -- configuration ---------------------------------------------------------------------
    @classmethod
    def options(cls, source: str, table: dict[str, Any]) -> dict[str, Any]:
        OPTIONS.check(source, "agent.ion", table)
        o = {
            "number": table.get("number", 0),
            "numbers": table.get("numbers", {}),
            "sdr_mb": table.get("sdr_mb", 64),
            "rate_bytes": table.get("rate_bytes", 12_500_000),
            "rates": table.get("rates", {}),
            "bibe": table.get("bibe", []),
            "bibe_from": table.get("bibe_from", []),
            "bibe_latency_s": table.get("bibe_latency_s", 5),
        }
        for key in ("bibe", "bibe_from"):
            v = o[key]
            if not isinstance(v, list) or not all(isinstance(n, str) and n for n in v) or ("*" in v and len(v) > 1):
                raise ConfigError(source, f"agent.ion.{key}", v, 'must list neighbour node ids, or be ["*"]')
        for key in ("number", "sdr_mb", "rate_bytes", "bibe_latency_s"):
            v = o[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "number" else 1):
                raise ConfigError(source, f"agent.ion.{key}", v, "must be a positive whole number")
        if not isinstance(o["numbers"], dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in o["numbers"].values()
        ):
            raise ConfigError(source, "agent.ion.numbers", o["numbers"], "must map node ids to positive ipn numbers")
        if not isinstance(o["rates"], dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in o["rates"].values()
        ):
            raise ConfigError(source, "agent.ion.rates", o["rates"], "must map neighbour node ids to bytes per second")
        return o

    @classmethod
    def missing(cls) -> str | None:
        why = not_built("ion")
        if why:
            return why
        if find_helper() is None:
            return (
                f"c2dtn-ionbp is not built ({HELPER}): run `make bpas`, or put it on PATH (or name it in C2DTN_IONBP)"
            )
        return None

    # -- the daemon ----------------------------------------------------------------------------
    def prepare(self) -> Launch:
        why = self.missing()
        if why:
            raise C2Error(why)
        home = built("ion")
        d = self.cfg.agent_dir
        d.mkdir(parents=True, exist_ok=True)
        for name, text in ion_files(self.cfg, home / "bin").items():
            (d / name).write_text(text)
        (d / "ion-run.sh").chmod(0o755)
        with contextlib.suppress(FileNotFoundError):
            (d / "ready").unlink()
        return Launch([*NAMESPACES, str(d / "ion-run.sh")], cwd=d)

    def owns(self, cmdline: bytes) -> bool:
        return b"unshare" in cmdline and str(self.cfg.agent_dir / "ion-run.sh").encode() in cmdline

    def _keeper(self) -> int:
        """PID (on the host) of ion-run.sh, PID 1 of the node's namespaces: the only child of unshare."""
        try:
            pid = int((self.cfg.storage / "agent.pid").read_text())
        except (OSError, ValueError) as e:
            raise AgentError(f"the ION node of {self.cfg.id} is not running: {e}") from None
        kids = _children(pid)
        if not kids:
            raise AgentError(f"the ION node of {self.cfg.id} is not running (unshare, PID {pid}, has no child)")
        return kids[0]

    async def ready(self) -> None:
        if not (self.cfg.agent_dir / "ready").exists():
            raise AgentError(f"ION node {self.eid} is still starting (see {self.cfg.agent_dir / 'admin.log'})")
        await self.start()
        if not self.cfg.overlay:  # a node without the overlay leaves ipn:N.1 to other clients (benchmarks)
            await self.stop()

    async def shutdown(self, proc: asyncio.subprocess.Process) -> None:
        """`bpadmin .` and `ionadmin .` in the node's namespaces (ion-run.sh does them on SIGTERM),
        then the namespaces go; never ionstop or killm, which end every ION node on the host."""
        await self.stop()
        with contextlib.suppress(AgentError, ProcessLookupError):
            os.kill(self._keeper(), signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except asyncio.TimeoutError:
            log.warning("ION node %s did not stop in 15 s: killing its namespace", self.eid)
            proc.kill()
            await proc.wait()

    # -- naming ----------------------------------------------------------------------------------
    def _dst_eid(self, node: str, endpoint: str) -> str:
        try:
            return f"ipn:{self.nums[node]}.{endpoint}"
        except KeyError:
            return f"ipn:{derived_number(node)}.{endpoint}"

    # -- the helper ------------------------------------------------------------------------------
    async def start(self) -> None:
        async with self._lock:
            if self._helper is not None and self._helper.returncode is None and self._attached.is_set():
                return
            await self._close_helper()
            if not await self._attach():
                log.warning(
                    "c2dtn-ionbp did not attach to ION node %s within %d s: the node is locked? running ionunlock",
                    self.eid,
                    ATTACH_S,
                )
                keeper = self._keeper()
                gone = await self._unlock(keeper)
                if gone:
                    self._restart_node(f"ionunlock did not bring back {' '.join(sorted(gone))}", keeper)
                if not await self._attach():
                    self._restart_node(f"c2dtn-ionbp did not attach within {ATTACH_S} s after ionunlock either", keeper)
            if self._helper is None:
                raise AgentError(f"c2dtn-ionbp could not attach to ION node {self.eid}: {self._fatal}")

    def _in_node(self, *argv: str, **kw):
        """`argv` run in the node's IPC, mount and PID namespaces, with ION's programs on PATH."""
        env = {**os.environ, "PATH": f"{built('ion') / 'bin'}:{os.environ.get('PATH', '')}"}
        return asyncio.create_subprocess_exec(
            "nsenter",
            "-t",
            str(self._keeper()),
            "--ipc",
            "--mount",
            "--pid",
            "--",
            *argv,
            cwd=self.cfg.agent_dir,
            env=env,
            **kw,
        )

    async def _attach(self) -> bool:
        """Start the helper; False if it did not attach (nor end) within ATTACH_S."""
        self._attached.clear()
        errlog = open(self.cfg.agent_dir / "helper.log", "ab")
        try:
            self._helper = await self._in_node(
                str(find_helper() or HELPER),
                self.eid,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errlog,
                limit=MAX_FRAME,
            )
        finally:
            errlog.close()
        self._reader_task = asyncio.create_task(self._read(self._helper))
        try:
            await asyncio.wait_for(self._attached.wait(), ATTACH_S)
            return True
        except asyncio.TimeoutError:
            await self._close_helper()
            return False

    def _restart_node(self, why: str, keeper: int) -> None:
        """End the node's namespaces, those of `keeper` (the supervisor starts it again, with an
        empty SDR) and raise AgentError."""
        log.warning("ION node %s was locked and %s: restarting the node with an empty SDR", self.eid, why)
        (self.cfg.agent_dir / "wipe-sdr").touch()
        if _comm(keeper) == "ion-run.sh":  # not a node the supervisor has started since
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper, signal.SIGKILL)  # PID 1 of the node's namespaces: every daemon ends with it
        raise AgentError(
            f"ION node {self.eid} was locked and {why}: the node restarts, its SDR empty (see "
            f"{self.cfg.agent_dir / 'ion.log'})"
        )

    async def _unlock(self, keeper: int) -> set[str]:
        """ionunlock in the node whose PID 1 is `keeper` (see the module's docstring), then wait
        for its ionrestart to end; the names of the node's daemons that did not come back."""
        daemons = _daemons(keeper)
        with open(self.cfg.agent_dir / "admin.log", "ab") as out:
            proc = await self._in_node("ionunlock", stdout=out, stderr=out)
        try:
            await asyncio.wait_for(proc.wait(), RESTART_S)
        except asyncio.TimeoutError:
            log.warning("ionunlock on ION node %s did not end in %d s", self.eid, RESTART_S)
            _kill_all([*_children(proc.pid), proc.pid])  # ionunlock itself, not only nsenter
            await proc.wait()
        loop = asyncio.get_running_loop()
        until = loop.time() + RESTART_S
        while loop.time() < until and any(_comm(k) == "ionrestart" for k in _children(keeper)):
            await asyncio.sleep(0.5)
        if _comm(keeper) != "ion-run.sh":  # the node's script ended it (a daemon did not come back)
            raise AgentError(f"ION node {self.eid} ended after ionunlock; its supervisor starts it again")
        return daemons - _daemons(keeper)

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        frames = FrameReader()
        try:
            while True:
                data = await proc.stdout.read(1 << 20)
                if not data:
                    break
                for kind, body in frames.feed(data):
                    if kind == "R":
                        self._attached.set()
                    elif kind == "A":
                        fut = self._acks.pop(0) if self._acks else None
                        if fut is not None and not fut.done():
                            fut.set_result((body[:1] == b"\x01", body[1:].decode(errors="replace")))
                    elif kind == "D":
                        try:
                            src, _, payload = parse_delivery(body)
                        except AgentError as e:
                            log.warning("%s", e)
                            continue
                        node = self.names.get(_eid_number(src), src)
                        await self._deliveries.put(AgentDelivery(node, self.endpoint, payload))
                    elif kind == "X":
                        self._fatal = body.decode(errors="replace")
                        log.warning("c2dtn-ionbp for %s: %s", self.eid, self._fatal)
                    else:
                        log.warning("c2dtn-ionbp sent an unknown frame %r", kind)
        except AgentError as e:
            log.warning("%s", e)
        finally:
            for fut in self._acks:
                if not fut.done():
                    fut.set_exception(AgentError(f"c2dtn-ionbp for {self.eid} ended: {self._fatal or 'no answer'}"))
            self._acks.clear()
            self._attached.set()  # wakes start(), which sees the helper gone
            if self._helper is proc:
                self._helper = None
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def _close_helper(self) -> None:
        proc, self._helper = self._helper, None
        if proc is not None and proc.returncode is None:
            helpers = _children(proc.pid)  # nsenter's child, in the node's PID namespace: the helper itself
            with contextlib.suppress(Exception):
                proc.stdin.write(struct.pack(">IB", 1, ord("Q")))
                await asyncio.wait_for(proc.wait(), 2)
            if proc.returncode is None:  # killing nsenter alone would leave the helper running
                _kill_all([*helpers, proc.pid])
                await proc.wait()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
            self._reader_task = None

    async def stop(self) -> None:
        async with self._lock:
            await self._close_helper()

    async def register(self, endpoint: str) -> None:
        if endpoint != self.endpoint:
            raise AgentError(f"the ion agent serves only its own endpoint {self.eid}, not {endpoint!r}")
        await self.start()

    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float, priority: int = 3) -> None:
        await self.start()
        proc = self._helper
        if proc is None:
            raise AgentError(f"ION node {self.eid} is not attached")
        fut = asyncio.get_running_loop().create_future()
        self._acks.append(fut)
        try:
            proc.stdin.write(send_frame(self._dst_eid(dst_node, endpoint), payload, max(1, int(lifetime_s))))
            await proc.stdin.drain()
            ok, why = await asyncio.wait_for(fut, SEND_S)
        except (OSError, ConnectionError, asyncio.TimeoutError) as e:
            if isinstance(e, asyncio.TimeoutError):  # a stuck helper (a locked node?): the next start() attaches anew
                async with self._lock:
                    if self._helper is proc:
                        await self._close_helper()
            raise AgentError(
                f"ION node {self.eid} did not take a bundle for {dst_node}: {e or type(e).__name__}"
            ) from None
        if not ok:
            raise AgentError(f"ION node {self.eid} refused a bundle for {dst_node}: {why}")

    def deliveries(self, endpoint: str) -> AsyncIterator[AgentDelivery]:
        return queued_deliveries(self, self._deliveries, lambda: self._helper is not None, f"ION node {self.eid}")

    async def peers(self) -> list[PeerInfo]:
        return static_peers(self.cfg, _duct)

    async def stored(self) -> int:
        raise AgentError("the ion driver does not count ION's bundles (bpstats would)")


def _children(pid: int) -> list[int]:
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _daemons(keeper: int) -> set[str]:
    """The names of the ION daemons running in the node whose PID 1 is `keeper`."""
    return {_comm(k) for k in _children(keeper)} - {
        "",
        "sleep",
        "c2dtn-ionbp",
        "nsenter",
        "ionunlock",
        "ionrestart",
        "bpadmin",
        "ionadmin",
        "ipnadmin",
        "ltpadmin",
        "bibeadmin",
    }


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _eid_number(eid: str) -> int:
    try:
        return int(eid.split(":", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return -1
