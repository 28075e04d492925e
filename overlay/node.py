"""The overlay node: the asyncio shell around overlay.core.

One process per box (`c2dtn node run CONFIG`): it supervises the BPA, feeds the
core with the BPA's deliveries and the clock, hands the BPA what the core
plans, and serves local applications on a Unix socket in the storage folder
(HTTP: POST /send, GET /recv, POST /consumed, GET /status), reachable from any
network namespace.  GET /recv answers JSON (bodies in base64), or CBOR (bodies as
byte strings) to a client that sends Accept: application/cbor.  The core answers
envelopes of app "ping" with "pong".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import time
from collections.abc import Callable

import cbor2
from aiohttp import web

from c2dtn.overlay import api
from c2dtn.overlay.agent import AgentError
from c2dtn.overlay.config import NodeConfig
from c2dtn.overlay.core import OverlayCore
from c2dtn.overlay.custody import CustodyStore, QuotaExceeded
from c2dtn.overlay.envelope import MAX_MESSAGE_BYTES, Codec, Priority
from c2dtn.overlay.port import Port, now_ms
from c2dtn.overlay.store import StoreFull, TooLarge
from c2dtn.overlay.supervisor import Supervisor
from c2dtn.overlay.syncer import Syncer
from c2dtn.private import private_dir
from c2dtn.spells import Spell

log = logging.getLogger("c2dtn.node")

# No deliberate linger: while one bundle is being handed to the agent, envelopes
# submitted meanwhile gather and go together in the next one (aggregation
# without adding delay to a lone message).


RECEIVE_BATCH = 64  # bundles taken in one commit at most
CHECKPOINT_EVERY_S = 0.5
# Priority and routine envelopes submitted within this long of each other are planned together
# (one bundle, one hand-over); flash and immediate ones are planned at once.  Decision 0006.
SUBMIT_GATHER_S = 0.002
# While such submits keep coming (a stream), they are planned at most this often (a lone one
# still goes after SUBMIT_GATHER_S).  Decision 0006.
STREAM_GATHER_S = 0.020
# The acks that came with what was answered (a ping), and the plan they may call for, are
# applied this long after the answer is with the agent: they are not urgent, and done at once
# they take the CPU the agents carry the answer with.  Decision 0006.
ANSWER_CLEAR_S = 0.005


# The exit status of a node that stopped because its custody store failed an fsync: a service
# manager restarts it (EX_TEMPFAIL), and it reopens the store from what is on disk.
EXIT_STORE_FAILED = 75


class OverlayNode:
    def __init__(self, cfg: NodeConfig):
        self.cfg = cfg
        self.failed = False  # an fsync failed (_store_failed)
        self.exit_code = 0
        self._stop: asyncio.Event | None = None
        private_dir(cfg.storage)  # custody, sessions and the agent's store: orders in every one
        self.sup = Supervisor(cfg, on_restart=self._agent_restarted)
        self.agent = self.sup.agent
        self.core: OverlayCore | None = None
        self.syncer: Syncer | None = None  # [node] fsync = "auto" or "thread": overlay/syncer.py
        if cfg.overlay:
            store = CustodyStore(
                cfg.custody_db, cfg.id, cfg.quota, cfg.groups, background_checkpoints=True, sync=cfg.fsync
            )
            self.core = OverlayCore(store, Codec(cfg.id, cfg.keys, cfg.groups), cfg.scheduler)
            if cfg.fsync != "loop":
                self.syncer = Syncer(store.records, inline=cfg.fsync == "auto")
                self.syncer.on_failure = self._store_failed
            # what the gateways may use of this node (overlay/port.py)
            self.port = Port(self.core, self.syncer, cfg.storage, self.submitted, self.consumed)
        self._signal = asyncio.Event()  # the pump: look again (plan now if _poll_now, else re-arm its timer)
        self._poll_now = False
        self._plan_full = Spell(log)  # planning failed on a full disk
        self._take_full = Spell(log)  # bundles not taken on a full disk
        self._handing = asyncio.Lock()  # held while bundles are planned and handed to the agent
        self._handovers: set[asyncio.Task] = set()
        self._soon: asyncio.TimerHandle | None = None
        self._gathered_at = -1e9  # when the last gathered submits were planned (the loop's clock)
        self._inbox_event = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        self.started_ms = now_ms()
        self.send_errors = 0
        self.extensions: list = []  # objects with async start() and stop(), run inside the node (gateways)

    @property
    def app_handlers(self) -> dict[str, Callable[[], None]]:
        """app -> callback run when envelopes of that app arrive (the gateways, Port.subscribe);
        their envelopes are not handed out by GET /recv."""
        return self.port.handlers if self.core is not None else {}

    # -- lifecycle ---------------------------------------------------------
    def _store_failed(self, err: OSError) -> None:
        """An fsync failed: nothing more is acknowledged or handed to the agent, and the node stops
        (exit status EXIT_STORE_FAILED), to be restarted on what its store holds on disk."""
        if self.failed:
            return
        self.failed = True
        self.exit_code = EXIT_STORE_FAILED
        log.critical(
            "custody fsync failed (%s): nothing more is acknowledged or sent; node %s stops so that its "
            "store is reopened from what is on disk (exit status %d: restart it)",
            err,
            self.cfg.id,
            EXIT_STORE_FAILED,
        )
        if self._stop is not None:
            self._stop.set()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        await self.sup.start()
        if self.syncer is not None:
            self.syncer.start()
        if self.core is not None:
            for ep in self._endpoints():
                await self.agent.register(ep)
            self._tasks = [asyncio.create_task(self._receive(ep)) for ep in self._endpoints()]
            self._tasks.append(asyncio.create_task(self._pump()))
            self._tasks.append(asyncio.create_task(self._checkpoints()))
        await self._serve_api()
        for ext in self.extensions:
            await ext.start()
        log.info(
            "node %s up (overlay %s, agent pid %s)",
            self.cfg.id,
            "on" if self.core else "off",
            self.sup.proc.pid if self.sup.proc else "-",
        )
        await stop.wait()
        await self.close()

    async def close(self) -> None:
        for ext in self.extensions:
            with contextlib.suppress(Exception):
                await ext.stop()
        if self._soon is not None:
            self._soon.cancel()
        tasks = [*self._tasks, *self._handovers]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._runner:
            await self._runner.cleanup()
        await self.sup.stop()
        if self.syncer is not None:
            self.syncer.stop()
        if self.core:
            self.core.store.close()

    async def _agent_restarted(self) -> None:
        if self.core is not None:
            for ep in self._endpoints():
                await self.agent.register(ep)
        self.wake()

    def _endpoints(self) -> list[str]:
        """Our own endpoint, and one group endpoint per group we are in (named by the agent's
        driver: every member registers it)."""
        return self.agent.endpoints(list(self.cfg.groups))

    def _destinations(self, dst: str) -> list[tuple[str, str]]:
        # a node of another agent's island: the bundle goes to the relay, which reads the
        # destination from the container and carries it across (overlay.relay)
        members = self.cfg.groups.get(dst)
        return self.agent.destinations(self.cfg.relays.get(dst, dst), members)

    # -- data path ---------------------------------------------------------
    async def _receive(self, endpoint: str) -> None:
        """Take what the agent delivers; what arrived while the last commit ran is taken in
        one commit (one fsync for a burst of bundles instead of one each)."""
        q: asyncio.Queue = asyncio.Queue(maxsize=RECEIVE_BATCH)
        ended = object()  # put by the reader when the stream ends (a queue get per bundle, not a task)

        async def read() -> None:
            try:
                async for d in self.agent.deliveries(endpoint):
                    await q.put(d)
            finally:
                with contextlib.suppress(asyncio.QueueFull):  # (full: seen below, once drained)
                    q.put_nowait(ended)

        reader = asyncio.create_task(read())
        try:
            while True:
                if q.empty() and reader.done():
                    await reader  # the stream ended: raise what ended it
                    return
                d = await q.get()
                if d is ended:
                    await reader  # the stream ended: raise what ended it
                    return
                batch = [d]
                while not q.empty() and len(batch) < RECEIVE_BATCH:
                    d = q.get_nowait()
                    if d is ended:
                        q.put_nowait(ended)
                        break
                    batch.append(d)
                self._take(batch)
        finally:
            reader.cancel()

    def _take(self, batch: list) -> None:
        t0 = time.monotonic()
        try:
            # answers (pongs) planned in the take's own commit, unless the pump is handing over
            results = self.core.on_bundles(
                [d.payload for d in batch], now_ms(), acks_later=True, answer_now=not self._handing.locked()
            )
            if log.isEnabledFor(logging.DEBUG):  # on the receive path: build the line only for -v
                log.debug(
                    "took %d bundles from %s in one commit, %.1f ms",
                    len(batch),
                    ",".join(sorted({d.src_node for d in batch})),
                    (time.monotonic() - t0) * 1000,
                )
        except StoreFull as e:  # not acked: their origins send them again once space frees
            self._take_full.hit("bundles not taken: %s", e)
            asyncio.get_running_loop().call_soon(self._after_take, [])  # (their acks free space)
            return
        except Exception:  # a bug must not take the node down, nor the rest of the batch with it
            log.exception("processing %d bundles together failed; taking them one by one", len(batch))
            results = []
            for d in batch:
                try:
                    results.append(self.core.on_bundle(d.payload, now_ms()))
                except Exception:
                    log.exception("processing a bundle from %s failed", d.src_node)
        self._take_full.over("custody takes bundles again")
        if any(res.data for res in results):  # the applications first (their GET /recv, handlers)
            self._inbox_event.set()
            for app, handler in self.app_handlers.items():
                try:
                    handler()
                except Exception:  # a bug in one application must not stop the node
                    log.exception("the %s handler failed", app)
        # the acks that came with data, and planning for what else arrived, after the turn of a
        # GET /recv woken above, and after the answers are with the agent (aiohttp writes a
        # request's body in a task of its own: what is ready before it runs first; decision 0006)
        answers = None
        if self.core.answered:  # answers go now, before the fsync of what they answer
            self.core.answered = False
            if self.core.answers is None:  # (the pump is handing over: it plans them next)
                self.wake()
            else:
                out, unsynced = self.core.answers
                self.core.answers = None
                answers = self._start_hand_over(out, unsynced)
        loop = asyncio.get_running_loop()
        if answers is None:
            loop.call_soon(self._after_take, results)
        else:
            answers.add_done_callback(lambda _t: loop.call_later(ANSWER_CLEAR_S, self._after_take, results))

    def _after_take(self, results: list) -> None:
        try:
            self.core.apply_acks(now_ms())
        except Exception:  # (StoreFull too: acks only release; the peer repeats them)
            log.exception("processing acks failed")
        if self.core.poll_due:  # acks came in, or acks are owed at once
            self.core.poll_due = False
            self._plan_at_once()
        elif any(res.data or res.acks for res in results):
            # acks owed after the ack delay, or acks came in with nothing queued to send (a fast
            # retransmission shows as a wake-up due now): the pump re-arms its timer
            self._signal.set()

    async def _checkpoints(self) -> None:
        """The custody store's WAL copied into its database in a thread, off the message path."""
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            await asyncio.sleep(CHECKPOINT_EVERY_S)
            try:
                await loop.run_in_executor(None, self.core.store.checkpoint)
                failing = False
            except Exception as e:  # retried; past the backstop the commits checkpoint themselves
                if not failing:  # one line per run of failures, not one every half second
                    log.warning("custody checkpoint failed (retrying): %s", e)
                failing = True

    def wake(self) -> None:
        """Something was submitted: plan again now."""
        self._poll_now = True
        self._signal.set()

    def consumed(self, ids: list[int]) -> None:
        """The application took these (API, gateways): their acks go after the ack delay, with
        whatever goes that way, or at once past ACK_BATCH; not a plan at once for each (decision
        0006)."""
        if self.core.consumed(ids, now_ms()):
            self.wake()
        else:
            self._signal.set()  # the pump's timer

    async def _pump(self) -> None:
        wake = self.core.next_wakeup_ms()
        while True:
            timeout = 1.0 if wake is None else max(0.0, min(1.0, (wake - now_ms()) / 1000))
            timed_out = False
            try:  # asyncio.timeout, not wait_for: no extra task, so a wake() runs the pump next
                async with asyncio.timeout(timeout):
                    await self._signal.wait()
            except TimeoutError:
                timed_out = True
            self._signal.clear()
            if not (self._poll_now or timed_out):
                # only the timer moved (data arrived, its ack is not due yet): no planning now,
                # which would hold up the application's GET /recv of that very data
                wake = self.core.next_wakeup_ms()
                if wake is None or wake > now_ms():
                    continue
            self._poll_now = False
            out = self._plan()
            if out is None:  # failed (a full disk, a bug): try again in a second, not in a hot loop
                await asyncio.sleep(1.0)
                self._poll_now = True
            else:
                async with self._handing:
                    await self._hand_over(out)
            wake = self.core.next_wakeup_ms()  # (once per turn: three queries, and turns are many)

    def _plan(self, unsynced: bool = False, only: set[str] | None = None) -> list | None:
        try:
            out = self.core.poll(now_ms(), unsynced, only)
        except StoreFull as e:
            self._plan_full.hit("planning stopped: %s; retrying every second", e)
            return None
        except Exception:
            log.exception("planning failed")
            return None
        self._plan_full.over("custody store writable again: planning resumed")
        return out

    async def synced(self) -> None:
        """Every custody commit made so far is on disk (at once with [node] fsync = "loop").
        Raises OSError when the fsync failed: what waited must not be acknowledged."""
        if self.core is not None:
            await self.port.synced()

    async def _hand_over(self, out: list, unsynced: bool = False) -> None:
        if self.failed:  # the store is not what is on disk any more: nothing of it goes out
            return
        if out and not unsynced:
            # the bundles carry envelopes (their seqs must never be reused, as a power cut before
            # the fsync would) and acks (a peer releases custody on them): on disk first, unless
            # planned to go before it (custody module doc: reserved seqs, no fresh acks or marks)
            try:
                await self.synced()
            except OSError:  # logged by the syncer; the envelopes go again at their retry time
                return
        for b in out:
            if self.failed:
                return
            log.debug(
                "bundle to %s: %d bytes, envelopes %s (%d resent), acks %s",
                b.dst,
                len(b.payload),
                b.seqs,
                b.retransmissions,
                b.acks,
            )
            for node, endpoint in self._destinations(b.dst):
                try:
                    await self.agent.send(node, endpoint, b.payload, lifetime_s=self.agent.bundle_lifetime_s)
                except AgentError as e:
                    # custody keeps the envelopes; they go again at their retransmission time
                    self.send_errors += 1
                    log.warning("%s", e)
        if out and unsynced:
            # what they came from goes to disk now: the acks held back for it then ride the next
            # bundle (an answer's acks, the next answer) instead of going alone after the ack delay
            with contextlib.suppress(OSError):  # (logged by the syncer)
                await self.synced()

    def _plan_at_once(self) -> None:
        """Plan in this turn of the loop (an urgent submit, acks that move a window) and hand
        the bundles over in a task, rather than wake the pump for the next turn: a round trip
        crosses two such steps.  While the pump is handing bundles over, it is woken instead,
        so what arrives meanwhile still goes together in its next plan."""
        if self._handing.locked():
            self.wake()
            return
        self._poll_now = False
        self._start_hand_over(self._plan(), False)

    def _start_hand_over(self, out: list | None, unsynced: bool) -> asyncio.Task | None:
        """Hand `out` to the agent in a task (returned).  unsynced: planned to go before the
        fsync (custody module doc: a flash submit, an answer), the fsync following (decision
        0006)."""
        if not out:
            return None
        task = asyncio.get_running_loop().create_task(self._hand_over_locked(out, unsynced))
        self._handovers.add(task)
        task.add_done_callback(self._handovers.discard)
        return task

    async def _hand_over_locked(self, out: list, unsynced: bool = False) -> None:
        async with self._handing:
            await self._hand_over(out, unsynced)

    def submit(
        self, dst: str, body: bytes, lifetime_ms: int, priority: Priority, supersede: str | None, app: str
    ) -> int:
        seq = self.core.submit(dst, body, now_ms(), lifetime_ms, priority, supersede, app)
        self.submitted(priority)
        return seq

    def submitted(self, priority: Priority) -> None:
        """Envelopes of this priority (the most urgent of a batch) were submitted: flash and
        immediate are planned at once; others a moment later, with whatever else is
        submitted meanwhile (one bundle, one plan, one ack for many)."""
        if priority <= Priority.IMMEDIATE:
            self._plan_at_once()
        elif self._soon is None:
            loop = asyncio.get_running_loop()
            # (the first gather after a quiet spell is short, later ones in a stream are spaced)
            delay = max(SUBMIT_GATHER_S, self._gathered_at + STREAM_GATHER_S - loop.time())
            self._soon = loop.call_later(delay, self._wake_soon)

    def _wake_soon(self) -> None:
        self._soon = None
        self._gathered_at = asyncio.get_running_loop().time()
        self.wake()

    # -- local API -----------------------------------------------------------
    async def _serve_api(self) -> None:
        app = web.Application(client_max_size=MAX_MESSAGE_BYTES)  # larger: 413 before anything is read
        app.add_routes(
            [
                web.post("/send", self._api_send),
                web.get("/recv", self._api_recv),
                web.post("/consumed", self._api_consumed),
                web.get("/status", self._api_status),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = self.cfg.api_socket
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        await web.UnixSite(self._runner, str(sock)).start()
        # owner and the api_group only (connecting needs write permission); created 0755 by
        # the umask, so nobody else could connect in the moment before this
        if self.cfg.api_gid is not None:
            os.chown(sock, -1, self.cfg.api_gid)
            # the group may pass through the storage folder to the socket, not list or read it
            os.chown(self.cfg.storage, -1, self.cfg.api_gid)
            os.chmod(self.cfg.storage, 0o710)
        os.chmod(sock, 0o660)

    async def _api_send(self, req: web.Request) -> web.Response:
        if self.core is None:
            return web.json_response({"error": f"node {self.cfg.id} runs no overlay (overlay = false)"}, status=400)
        try:
            a = api.parse_send(req.query)
        except api.ApiError as e:
            return web.json_response({"error": str(e)}, status=400)
        try:
            body = await req.read()
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(
                {
                    "error": f"a message of {req.content_length or 'more than ' + str(MAX_MESSAGE_BYTES)}"
                    f" bytes is over the overlay's limit of {MAX_MESSAGE_BYTES} bytes"
                },
                status=413,
            )
        try:
            # flash and immediate: planned (for this destination only) in the submit's own commit,
            # handed to the agent once it is made, before its fsync when custody allows (module doc)
            urgent = a.priority <= Priority.IMMEDIATE and not self._handing.locked()
            out, unsynced = None, False
            with self.core.store.transaction():
                seq = self.core.submit(a.dst, body, now_ms(), a.lifetime_ms, a.priority, a.supersede, a.app)
                if urgent:
                    unsynced = self.core.store.may_send_unsynced()
                    out = self._plan(unsynced, only={a.dst})
            handover = self._start_hand_over(out, unsynced)
            if not urgent:
                self.submitted(a.priority)
            if handover is not None:
                # planned at once (flash, immediate): the answer follows the bundle's hand-over to
                # the agent (and its fsync, before or after it), so that an fsync on the loop, or
                # the answer's writing, never comes between (decision 0006)
                await asyncio.shield(handover)
            await self.synced()
        except QuotaExceeded as e:
            return web.json_response({"error": str(e)}, status=507)
        except TooLarge as e:
            return web.json_response({"error": str(e)}, status=413)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        except OSError as e:
            return web.json_response({"error": f"custody fsync failed: {e}"}, status=500)
        return web.json_response({"seq": seq, "origin": self.cfg.id})

    async def _api_recv(self, req: web.Request) -> web.Response:
        if self.core is None:
            return web.json_response({"error": "no overlay"}, status=400)
        try:
            wait, app, limit = api.parse_recv(req.query)
        except api.ApiError as e:
            return web.json_response({"error": str(e)}, status=400)
        deadline = time.monotonic() + wait
        while True:
            items = self.core.take(limit, app, exclude=self.app_handlers if app is None else ())
            if items or time.monotonic() >= deadline:
                break
            self._inbox_event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                    await self._inbox_event.wait()
        out = [
            {
                "id": d.id,
                "origin": d.origin,
                "seq": d.seq,
                "priority": d.priority.name.lower(),
                "created_ms": d.created_ms,
                "received_ms": d.received_ms,
                "supersede": d.supersede,
                "app": d.app,
                "body": d.body,
            }
            for d in items
        ]
        if "application/cbor" in req.headers.get("Accept", ""):
            # the same list in CBOR, bodies as byte strings: for a megabyte body, base64 in JSON
            # cost ~8 ms here and as much again in the application
            return web.Response(body=cbor2.dumps(out), content_type="application/cbor")
        for d in out:
            d["body"] = base64.b64encode(d["body"]).decode()
        return web.json_response(out)

    async def _api_consumed(self, req: web.Request) -> web.Response:
        try:
            ids = api.parse_consumed(await req.read())
        except api.ApiError as e:
            return web.json_response({"error": str(e)}, status=400)
        self.consumed(ids)
        try:
            await self.synced()
        except OSError as e:
            return web.json_response({"error": f"custody fsync failed: {e}"}, status=500)
        return web.json_response({"ok": len(ids)})

    async def _api_status(self, req: web.Request) -> web.Response:
        return web.json_response(await self.status())

    async def status(self) -> dict:
        st: dict = {
            "node": self.cfg.id,
            "agent": self.cfg.agent,
            "agent_pid": self.sup.proc.pid if self.sup.proc else None,
            "agent_restarts": self.sup.restarts,
            "uptime_s": (now_ms() - self.started_ms) / 1000,
            "send_errors": self.send_errors,
        }
        if self.syncer is not None:
            st["fsync"] = {
                "fsyncs": self.syncer.fsyncs,
                "commits": self.syncer.store.commits,
                "failures": self.syncer.failures,
                "max_ms": round(self.syncer.fsync_ms_max, 1),
                "on_loop": self.syncer.inline_fsyncs,
                "on_loop_now": self.syncer.inline,
            }
        try:
            st["peers"] = [p.__dict__ for p in await self.agent.peers()]
            st["agent_stored"] = await self.agent.stored()
        except AgentError as e:
            st["agent_error"] = str(e)
        if self.core:
            store = self.core.store
            st["counters"] = store.counters()
            st["queues"] = [
                {"dst": d, "priority": Priority(p).name.lower(), "queued": q, "in_flight": f, "bytes": b}
                for d, p, q, f, b in store.queue_summary()
            ]
            st["windows"] = {
                d: {"window": int(p.window), "ssthresh": int(p.ssthresh), "srtt_ms": p.srtt_ms, "rto_ms": int(p.rto_ms)}
                for d, p in self.core.sched.paths.items()
            }
            st["inbox"] = store.inbox_count()  # (not len(inbox()): that read every body, files included)
        for ext in self.extensions:
            if hasattr(ext, "status"):
                st[getattr(ext, "name", "extension")] = ext.status()
        return st


# glibc's malloc serves blocks of 128 kB and up with mmap and trims freed heap past 128 kB, so
# every megabyte body the node copies came in fresh pages (decision 0006).  Blocks up to the
# largest container come from the heap, and up to TRIM_BYTES of freed heap stay with the
# process.  No library sets them: mallopt(3) via ctypes.
MMAP_THRESHOLD_BYTES = (8 << 20) + (64 << 10)
TRIM_BYTES = 32 << 20


def tune_malloc() -> bool:
    """Set glibc's thresholds (above); False where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES) and mallopt(m_trim_threshold, TRIM_BYTES))


def run_node(cfg: NodeConfig, extensions: list[Callable[[OverlayNode], object]] = ()) -> None:
    """Run a node until SIGTERM/SIGINT (inside cfg.netns when set), with extensions
    (made from the node, started after it: the MQTT gateway)."""
    import signal

    if cfg.netns:
        from pyroute2 import netns

        netns.setns(cfg.netns)  # the whole process, before any thread or socket exists
    try:
        import setproctitle

        setproctitle.setproctitle(f"c2node {cfg.id}")
    except ImportError:  # cosmetic only
        pass
    if not tune_malloc():
        log.info("not glibc: malloc's thresholds left as they are (large envelopes cost more page faults)")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        node = OverlayNode(cfg)
        node.extensions = [make(node) for make in extensions]
        await node.run(stop)
        return node.exit_code

    try:
        import uvloop  # a faster event loop: the node's per-envelope overhead is mostly loop and I/O

        code = uvloop.run(main())
    except ImportError:
        code = asyncio.run(main())
    if code:
        raise SystemExit(code)
