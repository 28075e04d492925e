"""HDTN 1.3.1 driver: one hdtn-one-process per overlay node, spoken to as a BP node over TCPCLv4.

How it works, its quirks and the workarounds here: docs/agents/hdtn.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import zlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from c2dtn.cla_adapters import bpv7, tcpcl4
from c2dtn.cla_adapters.numbering import node_numbers
from c2dtn.cla_adapters.schemes import cla_name
from c2dtn.confref import Field as F
from c2dtn.confref import table
from c2dtn.errors import ConfigError
from c2dtn.overlay.agent import (
    AgentDelivery,
    AgentError,
    BundleAgent,
    Capabilities,
    Launch,
    PeerInfo,
    queued_deliveries,
    static_peers,
)
from c2dtn.overlay.agents import register
from c2dtn.overlay.agents.builds import built, not_built

if TYPE_CHECKING:
    from c2dtn.overlay.config import NodeConfig

log = logging.getLogger("c2dtn.hdtn")

SERVICE = 1  # the overlay's endpoint: ipn:<application node>.1
CLA_NAMES = {"tcpcl": "tcpcl_v4", "udp": "udp", "ltp": "ltp_over_udp"}
LTP_MAX_OUTDUCTS = 7  # LtpUdpEngineManager::AddLtpUdpEngine: "a max of 7 engines ... with the same udp port"
# LTP timing: a checkpoint or report is resent after 2 x (one-way light time + margin) = 2 s
# without an answer (RFC 5326 §6.7).  On a 9.8 kbit/s radio a checkpoint's answer takes about
# 1.1 s (1 kB on the air, 100 ms each way), so a shorter timer would resend checkpoints that are
# not lost; on lan a lost checkpoint (the tail of a burst) costs those 2 s.
LTP_OWLT_MS, LTP_MARGIN_MS, LTP_MTU, LTP_RETRIES = 500, 500, 1024, 20
MAX_BUNDLE = 10_000_000  # HDTN's maxBundleSizeBytes here (its examples' value)
FOREVER_S = 2_000_000_000  # a contact's end, in seconds from HDTN's start (read as a C int)
# HDTN 1.3.1 keeps an ended session's socket open for a second; a new session from the same node
# opened meanwhile has its opportunistic link removed when the old one goes (HDTN's log: "Ignoring
# Duplicate Message for adding Opportunistic link"), and HDTN then holds every bundle for it in
# its store.  So a new session waits until this long after the last one ended.
SESSION_GAP_S = 1.5
APP_KEEPALIVE_S = 15  # the overlay's session to its own HDTN, on 127.0.0.1
PEER_KEEPALIVE_S = 600  # between HDTN nodes: longer than a silent cut (module docstring, Keepalive)


def derived_number(node: str) -> int:
    return 2 + 2 * (zlib.crc32(node.encode()) % (1 << 29))


def app_number(hdtn_number: int) -> int:
    return hdtn_number + 1


def _cl(spec) -> str:
    return cla_name("HDTN", CLA_NAMES, spec, "TCPCLv4")


def _ltp_ducts(cfg: NodeConfig, nums: dict[str, int]) -> tuple[list[dict], dict[str, dict]]:
    """The LTP inducts (one per LTP neighbour, all on the node's ltp:// listen port) and, by
    neighbour, the LTP fields of its outduct (sending from that same port)."""
    me = nums[cfg.id]
    peers = [p for p in cfg.peers if p.cla.scheme == "ltp"]
    if not peers:
        return [], {}
    port = next((s.port for s in cfg.listen if s.scheme == "ltp"), None)
    if port is None:
        raise ConfigError(
            cfg.source,
            "agent.listen",
            [str(s) for s in cfg.listen],
            f"HDTN sends LTP to {peers[0].node} from its own LTP port: listen on one",
            'add "ltp://0.0.0.0:1113"',
        )
    if len(peers) > LTP_MAX_OUTDUCTS:
        raise ConfigError(
            cfg.source,
            "agent.peers",
            ", ".join(p.node for p in peers),
            f"HDTN sends LTP to at most {LTP_MAX_OUTDUCTS} neighbours from one port",
        )
    common = {
        "oneWayLightTimeMs": LTP_OWLT_MS,
        "oneWayMarginTimeMs": LTP_MARGIN_MS,
        "clientServiceId": 1,
        "ltpMaxRetriesPerSerialNumber": LTP_RETRIES,
        "ltpRandomNumberSizeBits": 64,
        "ltpMaxUdpPacketsToSendPerSystemCall": 1,
        "keepActiveSessionDataOnDisk": False,
        "activeSessionDataOnDiskNewFileDurationMs": 2000,
        "activeSessionDataOnDiskDirectory": str(cfg.agent_dir),
    }
    inducts = [
        {
            "name": f"ltp_from_{p.node}",
            "convergenceLayer": "ltp_over_udp",
            "boundPort": port,
            "numRxCircularBufferElements": 1000,
            "thisLtpEngineId": me,
            "remoteLtpEngineId": nums[p.node],
            "ltpReportSegmentMtu": LTP_MTU,
            "preallocatedRedDataBytes": 200000,
            "ltpRemoteUdpHostname": p.cla.host,
            "ltpRemoteUdpPort": p.cla.port,
            "ltpRxDataSegmentSessionNumberRecreationPreventerHistorySize": 1000,
            "ltpMaxExpectedSimultaneousSessions": 500,
            "delaySendingOfReportSegmentsTimeMsOrZeroToDisable": 20,
            **common,
        }
        for p in peers
    ]
    outducts = {
        p.node: {
            "thisLtpEngineId": me,
            "remoteLtpEngineId": nums[p.node],
            "ltpDataSegmentMtu": LTP_MTU,
            "numRxCircularBufferElements": 1000,
            "ltpCheckpointEveryNthDataSegment": 0,
            "ltpSenderBoundPort": port,
            "ltpSenderPingSecondsOrZeroToDisable": 15,
            "delaySendingOfDataSegmentsTimeMsOrZeroToDisable": 20,
            **common,
        }
        for p in peers
    }
    return inducts, outducts


def hdtn_files(cfg: NodeConfig) -> dict[str, str]:
    """The files of one HDTN node: name -> text (in the agent folder)."""
    o = cfg.agent_options
    nums = node_numbers(cfg, derived_number)
    me = nums[cfg.id]
    d = cfg.agent_dir
    inducts = [
        {
            "name": "c2dtn_app",
            "convergenceLayer": "tcpcl_v4",
            "boundPort": o["app_port"],
            "numRxCircularBufferElements": 200,
            "numRxCircularBufferBytesPerElement": 20000,
            "keepAliveIntervalSeconds": APP_KEEPALIVE_S,
            "tcpclV4MyMaxRxSegmentSizeBytes": 200000,
            "tlsIsRequired": False,
            "certificatePemFile": "",
            "privateKeyPemFile": "",
            "diffieHellmanParametersPemFile": "",
        }
    ]
    ltp_inducts, ltp_outducts = _ltp_ducts(cfg, nums)
    inducts += ltp_inducts
    for i, s in enumerate(cfg.listen):
        if _cl(s) == "ltp_over_udp":
            continue  # one induct per LTP neighbour (above)
        if _cl(s) == "udp":
            inducts.append(
                {
                    "name": f"udp{i}",
                    "convergenceLayer": "udp",
                    "boundPort": s.port,
                    "numRxCircularBufferElements": 2000,
                    "numRxCircularBufferBytesPerElement": 65535,
                }
            )
        else:
            inducts.append(
                {**inducts[0], "name": f"tcpcl{i}", "boundPort": s.port, "keepAliveIntervalSeconds": o["keepalive_s"]}
            )
    outducts = []
    for p in cfg.peers:
        base = {
            "name": f"to_{p.node}",
            "convergenceLayer": _cl(p.cla),
            "nextHopNodeId": nums[p.node],
            "remoteHostname": p.cla.host,
            "remotePort": p.cla.port,
            "maxNumberOfBundlesInPipeline": 50,
            "maxSumOfBundleBytesInPipeline": 50_000_000,
        }
        if _cl(p.cla) == "tcpcl_v4":
            base.update(
                {
                    "keepAliveIntervalSeconds": o["keepalive_s"],
                    "tcpclAllowOpportunisticReceiveBundles": True,
                    "tcpclV4MyMaxRxSegmentSizeBytes": 200000,
                    "tryUseTls": False,
                    "tlsIsRequired": False,
                    "useTlsVersion1_3": False,
                    "doX509CertificateVerification": False,
                    "verifySubjectAltNameInX509Certificate": False,
                    "certificationAuthorityPemFileForVerification": "",
                }
            )
        base.update(ltp_outducts.get(p.node, {}))
        outducts.append(base)
    config = {
        "hdtnConfigName": f"c2dtn {cfg.id} (written from {cfg.source})",
        "userInterfaceOn": False,
        "mySchemeName": "unused_scheme_name",
        "myNodeId": me,
        "myBpEchoServiceId": 2047,
        "myCustodialSsp": "unused_custodial_ssp",
        "myCustodialServiceId": 0,
        "myRouterServiceId": 100,
        "isAcsAware": True,
        "acsMaxFillsPerAcsPacket": 100,
        "acsSendPeriodMilliseconds": 1000,
        "retransmitBundleAfterNoCustodySignalMilliseconds": 10000,
        "maxBundleSizeBytes": MAX_BUNDLE,
        "maxIngressBundleWaitOnEgressMilliseconds": 2000,
        "bufferRxToStorageOnLinkUpSaturation": False,
        "maxLtpReceiveUdpPacketSizeBytes": 65536,
        "neighborDepletedStorageDelaySeconds": 0,
        "fragmentBundlesLargerThanBytes": 0,
        "enforceBundlePriority": False,
        "zmqBoundRouterPubSubPortPath": 10200,
        "zmqBoundTelemApiPortPath": 10305,
        "inductsConfig": {"inductConfigName": "c2dtn", "inductVector": inducts},
        "outductsConfig": {"outductConfigName": "c2dtn", "outductVector": outducts},
        "storageConfig": {
            # restored from its files at start: what HDTN held when it was killed
            "storageImplementation": "asio_single_threaded",
            "tryToRestoreFromDisk": True,
            "autoDeleteFilesOnExit": False,
            "totalStorageCapacityBytes": o["store_mb"] << 20,
            "storageDeletionPolicy": "never",
            "storageDiskConfigVector": [{"name": "d1", "storeFilePath": str(d / "store1.bin")}],
        },
    }
    links: list[tuple[int, int]] = []
    rate = {(me, nums[p.node]): o["rates_bits"][p.node] for p in cfg.peers if p.node in o["rates_bits"]}
    for p in cfg.peers:
        links += [(me, nums[p.node]), (nums[p.node], app_number(nums[p.node]))]
    neighbours = {p.node for p in cfg.peers}
    routed = set(neighbours) | {cfg.id}
    for r in cfg.routes:
        if r.to != "*" and r.to not in neighbours and r.to != r.via and r.via in nums:
            links.append((nums[r.via], app_number(nums[r.to])))
            routed.add(r.to)
    for r in cfg.routes:
        if r.to == "*" and r.via in nums:
            links += [(nums[r.via], app_number(nums[n])) for n in sorted(nums) if n not in routed]
    contacts = [
        {
            "contact": i,
            "source": a,
            "dest": b,
            "startTime": 0,
            "endTime": FOREVER_S,
            "rateBitsPerSec": rate.get((a, b), o["rate_bits"]),
            "owlt": 1,
        }
        for i, (a, b) in enumerate(dict.fromkeys(links))
    ]
    return {
        "hdtn.json": json.dumps(config, indent=1) + "\n",
        "contacts.json": json.dumps({"contacts": contacts}, indent=1) + "\n",
    }


OPTIONS = table(
    "agent.hdtn",
    "HDTN's own settings ([its page](agents/hdtn.md)).",
    [
        F(
            "number",
            "integer",
            "0",
            "This node's HDTN node number, even (0: derived from the node id); the overlay's "
            "endpoint is ipn:<number+1>.1.",
            "0",
        ),
        F(
            "numbers",
            "table",
            "{}",
            "Other nodes' HDTN numbers by node id (even), where they are not derived.",
            "{ gw4 = 40 }",
        ),
        F("app_port", "integer", "4560", "The TCPCLv4 induct the overlay connects to.", "4560"),
        F("store_mb", "integer", "256", "HDTN's disk store (totalStorageCapacityBytes).", "256", "MiB"),
        F(
            "rate_bits",
            "integer",
            "0",
            "Every contact's rate (0: unlimited); HDTN paces UDP and LTP to it.",
            "9800",
            "bit/s",
        ),
        F(
            "rates_bits",
            "table",
            "{}",
            "A neighbour's own rate by node id (the contact to it).",
            "{ r2 = 9800 }",
            "bit/s",
        ),
        F(
            "keepalive_s",
            "integer",
            str(PEER_KEEPALIVE_S),
            "TCPCLv4 keepalive between HDTN nodes (1 to 65535); longer "
            "than the longest cut, as HDTN 1.3.1 does not recover from a session the keepalive ends.",
            "600",
            "s",
        ),
    ],
)


@register("hdtn")
class HdtnAgent(BundleAgent):
    # BPv7; bundles up to HDTN's maxBundleSizeBytes here; no group endpoints; its disk store is restored
    # at start (tryToRestoreFromDisk); its UDP CL sends a bundle as one datagram
    @classmethod
    def testbed_options(
        cls, ltp_rates_bps: dict[str, int], store: str, numbers: dict[str, int] | None = None
    ) -> dict[str, Any]:
        # its LTP paces itself by the radio's rate, in bits a second
        return {"rates_bits": dict(ltp_rates_bps)} if ltp_rates_bps else {}

    @classmethod
    def numbered(cls, numbers: dict[str, int]) -> dict[str, Any]:
        return {"numbers": dict(numbers)}

    cla_names = CLA_NAMES
    capabilities = Capabilities(
        bp_version=7,
        max_bundle_bytes=MAX_BUNDLE - 4096,
        groups=False,
        own_custody=True,
        clas=("tcpcl", "udp", "ltp"),
        udp_bundle_max=65_000,
    )
    endpoint = str(SERVICE)
    session_gap_s = SESSION_GAP_S

    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.nums = node_numbers(cfg, derived_number)
        self.me = app_number(self.nums[cfg.id])
        self.names = {app_number(v): k for k, v in self.nums.items()}
        self.port = cfg.agent_options["app_port"]
        self._session: tcpcl4.Session | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task] = []
        self._ended = float("-inf")  # time.monotonic() when the last session ended (SESSION_GAP_S)
        self._acks: dict[int, asyncio.Future] = {}
        self._deliveries: asyncio.Queue = asyncio.Queue(maxsize=256)
        self._lock = asyncio.Lock()
        self._seq = 0
        self._last_ms = 0

    # -- configuration ---------------------------------------------------------------------
    @classmethod
    def options(cls, source: str, table: dict[str, Any]) -> dict[str, Any]:
        OPTIONS.check(source, "agent.hdtn", table)
        o = {
            "number": table.get("number", 0),
            "numbers": table.get("numbers", {}),
            "app_port": table.get("app_port", 4560),
            "store_mb": table.get("store_mb", 256),
            "rate_bits": table.get("rate_bits", 0),
            "keepalive_s": table.get("keepalive_s", PEER_KEEPALIVE_S),
            "rates_bits": table.get("rates_bits", {}),
        }
        for key, low, high in (
            ("number", 0, (1 << 31) - 2),
            ("app_port", 1, 65535),
            ("store_mb", 1, 1 << 20),
            ("rate_bits", 0, 1 << 40),
            ("keepalive_s", 1, 65535),
        ):
            v = o[key]
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                raise ConfigError(source, f"agent.hdtn.{key}", v, f"must be a whole number from {low} to {high}")
        if not isinstance(o["rates_bits"], dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 40 for v in o["rates_bits"].values()
        ):
            raise ConfigError(
                source, "agent.hdtn.rates_bits", o["rates_bits"], "must map neighbour node ids to bits per second"
            )
        nums = o["numbers"]
        if (
            not isinstance(nums, dict)
            or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 < v < (1 << 31) - 1 and v % 2 == 0
                for v in nums.values()
            )
            or o["number"] % 2
        ):
            raise ConfigError(
                source,
                "agent.hdtn.numbers",
                nums if o["number"] % 2 == 0 else o["number"],
                "HDTN node numbers must be even and below 2^31 - 1 (the odd one above each is "
                "its overlay endpoint's node)",
            )
        return o

    @classmethod
    def missing(cls) -> str | None:
        return not_built("hdtn")

    # -- the daemon ----------------------------------------------------------------------------
    def prepare(self) -> Launch:
        home = built("hdtn")
        d = self.cfg.agent_dir
        d.mkdir(parents=True, exist_ok=True)
        for name, text in hdtn_files(self.cfg).items():
            (d / name).write_text(text)
        return Launch(
            [
                str(home / "bin" / "hdtn-one-process"),
                f"--hdtn-config-file={d / 'hdtn.json'}",
                f"--contact-plan-file={d / 'contacts.json'}",
            ],
            env={"HDTN_SOURCE_ROOT": str(home)},
            cwd=d,
        )

    def owns(self, cmdline: bytes) -> bool:
        return b"hdtn-one-process" in cmdline and str(self.cfg.agent_dir / "hdtn.json").encode() in cmdline

    async def ready(self) -> None:
        if self.cfg.overlay:
            await self.start()
            return
        # a node without the overlay leaves ipn:A.0 to other clients (benchmarks): only see that
        # the induct answers.  A session opened and closed here races the client's: HDTN 1.3.1
        # deleted the opportunistic link of the closed one after adding the new one's (same node
        # id), and then held every bundle for the client in its store
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 5)
        except (OSError, asyncio.TimeoutError) as e:
            raise AgentError(
                f"HDTN's induct at 127.0.0.1:{self.port} does not answer: {e or type(e).__name__}"
            ) from None
        writer.close()

    # -- the session ---------------------------------------------------------------------------
    def _connected(self) -> bool:
        # HDTN killed sends no SESS_TERM: the session still says established while the reader
        # has closed the writer, so both are looked at
        return (
            self._session is not None
            and self._session.established
            and self._writer is not None
            and not self._writer.is_closing()
        )

    async def start(self) -> None:
        async with self._lock:
            if self._connected():
                return
            await self._close()
            gap = self._ended + self.session_gap_s - time.monotonic()
            if gap > 0:
                await asyncio.sleep(gap)
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 5)
            except (OSError, asyncio.TimeoutError) as e:
                raise AgentError(
                    f"HDTN's induct at 127.0.0.1:{self.port} does not answer: {e or type(e).__name__}"
                ) from None
            session = tcpcl4.Session(f"ipn:{self.me}.0", time.monotonic(), transfer_mru=MAX_BUNDLE)
            self._session, self._writer = session, writer
            up = asyncio.get_running_loop().create_future()
            writer.write(session.start())
            self._tasks = [
                asyncio.create_task(self._read(reader, writer, session, up)),
                asyncio.create_task(self._keepalive(writer, session)),
            ]
            try:
                await asyncio.wait_for(asyncio.shield(up), 10)
            except (asyncio.TimeoutError, AgentError) as e:
                await self._close()
                raise AgentError(
                    f"HDTN at 127.0.0.1:{self.port} did not open a TCPCLv4 session: {e or 'no SESS_INIT in 10 s'}"
                ) from None

    async def _read(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: tcpcl4.Session, up: asyncio.Future
    ) -> None:
        why = "HDTN closed the session"
        # HDTN sets no TCP_NODELAY: a small bundle it writes in pieces waits by Nagle's algorithm
        # for our delayed ACK of the piece before; we ack at once (decision 0006)
        sock = writer.get_extra_info("socket")
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                if sock is not None:  # re-armed after every read: Linux drops quick-ack mode on its own
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                out, events = session.feed(data, time.monotonic())
                if out:
                    writer.write(out)
                for ev in events:
                    if isinstance(ev, tcpcl4.Established):
                        if not up.done():
                            up.set_result(ev)
                    elif isinstance(ev, tcpcl4.Received):
                        await self._deliver(ev.bundle)
                    elif isinstance(ev, (tcpcl4.Acked, tcpcl4.Refused)):
                        fut = self._acks.pop(ev.transfer_id, None)
                        if fut is not None and not fut.done():
                            fut.set_result(ev)
                    elif isinstance(ev, tcpcl4.Ended):
                        why = ev.reason
                if not session.established and up.done():
                    break
                await writer.drain()
        except (OSError, tcpcl4.ProtocolError) as e:
            why = f"TCPCLv4 session with HDTN: {e}"
            log.warning("%s", why)
        finally:
            if not up.done():
                up.set_exception(AgentError(why))
            for fut in self._acks.values():
                if not fut.done():
                    fut.set_exception(AgentError(why))
            self._acks.clear()
            writer.close()
            self._ended = time.monotonic()

    async def _deliver(self, raw: bytes) -> None:
        try:
            b = bpv7.decode(raw)
        except bpv7.BundleError as e:
            log.warning("HDTN handed over a bundle this driver cannot read (%s): dropped", e)
            return
        node = self.names.get(b.src[0], f"ipn:{b.src[0]}.{b.src[1]}")
        await self._deliveries.put(AgentDelivery(node, self.endpoint, b.payload, f"{b.src[0]}.{b.created_ms}.{b.seq}"))

    async def _keepalive(self, writer: asyncio.StreamWriter, session: tcpcl4.Session) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while not writer.is_closing():
                due = session.deadline()
                await asyncio.sleep(1.0 if due is None else max(0.05, due - time.monotonic()))
                try:
                    out = session.tick(time.monotonic())
                except tcpcl4.ProtocolError as e:
                    log.warning("TCPCLv4 session with HDTN: %s", e)
                    writer.close()
                    return
                if out:
                    writer.write(out)

    async def _close(self) -> None:
        writer, self._writer, self._session = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._ended = time.monotonic()
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def stop(self) -> None:
        async with self._lock:
            if self._session is not None and self._writer is not None and not self._writer.is_closing():
                with contextlib.suppress(Exception):
                    self._writer.write(self._session.terminate())
            await self._close()

    async def register(self, endpoint: str) -> None:
        if endpoint != self.endpoint:
            raise AgentError(f"the hdtn agent serves only its own endpoint ipn:{self.me}.{SERVICE}, not {endpoint!r}")
        await self.start()

    def _dst(self, node: str) -> int:
        return app_number(self.nums.get(node) or derived_number(node))

    def _stamp(self) -> tuple[int, int]:
        now = int(time.time() * 1000) - bpv7.DTN_EPOCH_MS
        if now == self._last_ms:
            self._seq += 1
        else:
            self._last_ms, self._seq = now, 0
        return now, self._seq

    async def send(self, dst_node: str, endpoint: str, payload: bytes, lifetime_s: float, priority: int = 3) -> None:
        await self.start()
        session, writer = self._session, self._writer
        if session is None or writer is None:
            raise AgentError(f"no TCPCLv4 session with HDTN for {self.cfg.id}")
        created, seq = self._stamp()
        raw = bpv7.encode(
            (self.me, SERVICE),
            (self._dst(dst_node), int(endpoint)),
            payload,
            max(1000, int(lifetime_s * 1000)),
            created,
            seq,
        )
        try:
            tid, data = session.send(raw, time.monotonic())
        except tcpcl4.ProtocolError as e:
            raise AgentError(f"HDTN cannot take a bundle for {dst_node}: {e}") from None
        fut = asyncio.get_running_loop().create_future()
        self._acks[tid] = fut
        try:
            writer.write(data)
            await writer.drain()
            ev = await asyncio.wait_for(fut, 30)
        except (OSError, ConnectionError, asyncio.TimeoutError) as e:
            self._acks.pop(tid, None)
            raise AgentError(f"HDTN did not take a bundle for {dst_node}: {e or type(e).__name__}") from None
        if isinstance(ev, tcpcl4.Refused):
            raise AgentError(f"HDTN refused a bundle for {dst_node} (XFER_REFUSE reason {ev.reason})")

    def deliveries(self, endpoint: str) -> AsyncIterator[AgentDelivery]:
        return queued_deliveries(self, self._deliveries, self._connected, f"HDTN for {self.cfg.id}")

    async def peers(self) -> list[PeerInfo]:
        return static_peers(self.cfg, _cl)

    async def stored(self) -> int:
        raise AgentError("the hdtn driver does not count HDTN's bundles (its telemetry API would)")
