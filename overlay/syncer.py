"""The custody store's writer thread: fsyncs off the event loop, one for many commits.

With `[node] fsync = "thread"` the store's durable commits return without an fsync
(store/sqlite.py, sync="thread"), so the event loop never waits on the disk.  Whatever
makes a commit's outcome seen outside the process -- an MQTT PUBACK, a CoAP ACK, an
API reply, a bundle handed to the agent (it carries envelopes and acks) -- first awaits
`synced()`: this thread fsyncs the WAL once for every commit made before it started
(group commit), and a slow disk delays only what waits on it, not the clients' reads,
the timers or the bundles arriving.

A thread rather than the loop's executor: one fsync at a time, in order, each covering
all commits counted before it; the executor would run several at once for nothing.

With `fsync = "auto"` (the default) the fsync runs on the event loop, in `synced()` itself,
while the disk's fsyncs are fast (the median of the last RECENT under INLINE_FSYNC_MS),
and in the thread while they are slow: a short fsync handed to the thread and back waits
for the GIL and the loop's callback (decision 0006).  A slow disk (`c2dtn perf fsync`)
holds the loop once: its first fsync sends the rest to the thread.  The median, not the
last one: a fast disk's rare slow fsync is waited out on the loop, not taken as a sign.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from collections import deque

log = logging.getLogger("c2dtn.node")

INLINE_FSYNC_MS = 2.0  # fsync = "auto": fsyncs faster than this (a median) run on the event loop
RECENT = 15  # fsyncs whose median decides


class Syncer:
    def __init__(self, store, inline: bool = False) -> None:
        """store: has `commits` (durable commits so far) and `sync_wal()` (fsync: every
        commit counted before the call is on disk after it).  inline: fsync on the event
        loop while fsyncs are fast (fsync = "auto")."""
        self.store = store
        self.may_inline = inline
        self.inline = inline  # now: fsyncs on the loop (while fast), else in the thread
        self.inline_fsyncs = 0
        self._recent: deque[float] = deque(maxlen=RECENT)  # the last fsyncs' milliseconds
        self.synced_upto = store.commits  # what the last fsync covered (read on the loop)
        self.fsyncs = 0
        self.failures = 0
        self.fsync_ms_max = 0.0
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()
        self._cv = threading.Condition()
        self._wanted = self.synced_upto  # highest commit count someone waits for (under _cv)
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # the first failed fsync: from then on nothing waits for one (synced() raises it), since a
        # later fsync that succeeds does not prove the pages of the failed one reached the disk
        self.failed: OSError | None = None
        self.on_failure = None  # called once with that error (the node stops, to reopen its store)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="c2-custody-fsync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread once its fsync in progress is done; waiters left get one last fsync
        here (a clean shutdown should not make clients resend what was committed), unless an
        fsync failed (then they hear that error)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._waiters and self.failed is not None:
            self._done(self.store.commits, self.failed)
        elif self._waiters:
            try:
                self.store.sync_wal()
                self._done(self.store.commits, None)
            except OSError as e:
                self._done(self.store.commits, e)

    def pending(self) -> bool:
        """Commits made that no fsync has covered yet?"""
        return self.store.commits > self.synced_upto

    async def synced(self) -> None:
        """Return once every durable commit made before this call is on disk; raises OSError
        if the fsync failed (what it covered may be lost: do not acknowledge it)."""
        if self.failed is not None:
            raise OSError(self.failed.errno, f"an earlier custody fsync failed ({self.failed})")
        gen = self.store.commits
        if gen <= self.synced_upto:
            return
        if self._thread is None:
            raise RuntimeError("the custody syncer is not running")
        if self.inline and not self._waiters:  # (with waiters the thread is at it: no lock wait here)
            self._fsync_here(gen)
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((gen, fut))
        with self._cv:
            if gen > self._wanted:
                self._wanted = gen
                self._cv.notify()
        await fut

    def _run(self) -> None:
        done = self.synced_upto
        while True:
            with self._cv:
                while self._wanted <= done and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
            gen = self.store.commits  # every commit counted here is in the WAL's page cache
            t0 = time.monotonic()
            err: OSError | None = None
            try:
                self.store.sync_wal()
            except OSError as e:
                err = e
            ms = (time.monotonic() - t0) * 1000
            done = gen
            try:
                self._loop.call_soon_threadsafe(self._done, gen, err, ms)
            except RuntimeError:  # the loop closed under us
                return

    def _fsync_here(self, gen: int) -> None:
        """fsync on the event loop (fsync = "auto", while the disk is fast); raises OSError."""
        t0 = time.monotonic()
        try:
            self.store.sync_wal()
        except OSError as e:
            self._done(gen, e)
            raise
        self.inline_fsyncs += 1
        self._done(gen, None, (time.monotonic() - t0) * 1000)

    def _done(self, gen: int, err: OSError | None, ms: float = 0.0) -> None:
        if err is None:
            self.fsyncs += 1
            self.fsync_ms_max = max(self.fsync_ms_max, ms)
            self.synced_upto = max(self.synced_upto, gen)
            if self.may_inline:
                self._recent.append(ms)
                inline = statistics.median(self._recent) < INLINE_FSYNC_MS
                if inline != self.inline:
                    self.inline = inline
                    log.info(
                        "custody fsyncs now %s (median of the last %d: %.1f ms)",
                        "on the event loop" if inline else "in the writer thread",
                        len(self._recent),
                        statistics.median(self._recent),
                    )
        else:
            self.failures += 1
            log.error(
                "custody fsync failed (%s): %d commits not known to be on disk are not acknowledged",
                err,
                gen - self.synced_upto,
            )
            if self.failed is None:
                self.failed = err
                if self.on_failure is not None:
                    self.on_failure(err)
        while self._waiters and self._waiters[0][0] <= gen:
            _, fut = self._waiters.popleft()
            if not fut.done():
                if err is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(err)
