"""Node supervisor: has the node's agent driver write its configuration, starts the
daemon the driver names, waits until the driver says it answers, restarts it when it
dies, stops it the driver's way.  It knows no particular agent.

The daemon is a child of the node process and is told (PR_SET_PDEATHSIG) to
die with it, so a node killed with SIGKILL leaves no orphan agent holding its
ports; a pid file in the storage folder catches any that survived anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from pathlib import Path

from c2dtn.errors import C2Error
from c2dtn.overlay.agent import BundleAgent
from c2dtn.overlay.agents import make_agent
from c2dtn.overlay.config import NodeConfig

log = logging.getLogger("c2dtn.supervisor")

PR_SET_PDEATHSIG = 1


class SupervisorError(C2Error):
    pass


def _pdeathsig() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class Supervisor:
    def __init__(self, cfg: NodeConfig, on_restart=None, agent: BundleAgent | None = None):
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.stopping = False
        self.agent = agent or make_agent(cfg)
        self._task: asyncio.Task | None = None
        self.on_restart = on_restart
        self.pidfile = cfg.storage / "agent.pid"

    def _stop_stale(self) -> None:
        """An agent left running by an earlier node process: stop it (by its recorded PID)."""
        try:
            pid = int(self.pidfile.read_text())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if self.agent.owns(cmd):
            log.warning("stopping agent pid %d left by an earlier run", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def _spawn(self) -> None:
        try:
            launch = self.agent.prepare()
        except C2Error as e:
            raise SupervisorError(str(e)) from None
        self._stop_stale()
        logf = open(self.cfg.storage / "agent.log", "ab")
        self.proc = await asyncio.create_subprocess_exec(
            *launch.argv,
            stdout=logf,
            stderr=logf,
            stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=_pdeathsig,
            env={**os.environ, **launch.env} if launch.env else None,
            cwd=launch.cwd,
        )
        logf.close()
        self.pidfile.write_text(str(self.proc.pid))
        log.info(
            "started %s (%s) pid %d for node %s", self.agent.name, Path(launch.argv[0]).name, self.proc.pid, self.cfg.id
        )

    async def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        last = None
        while asyncio.get_running_loop().time() < deadline:
            if self.proc is not None and self.proc.returncode is not None:
                tail = (self.cfg.storage / "agent.log").read_bytes()[-1500:].decode(errors="replace")
                raise SupervisorError(
                    f"the {self.agent.name} daemon exited with {self.proc.returncode} at start:\n{tail}"
                )
            try:
                await self.agent.ready()
                return
            except Exception as e:  # not up yet
                last = e
            await asyncio.sleep(0.1)
        raise SupervisorError(
            f"the {self.agent.name} daemon for {self.cfg.id} did not answer within {timeout_s:.0f} s: {last}"
        )

    async def start(self) -> None:
        await self._spawn()
        try:
            await self.wait_ready()
        except SupervisorError as e:
            if self.proc is None or self.proc.returncode is None:
                raise
            # the daemon ended at its first start (an agent whose store a crash left unusable
            # clears it and ends, to start clean in a fresh process): once more, then give up
            log.warning("%s; starting it once more", str(e).splitlines()[0])
            await self._spawn()
            await self.wait_ready()
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        backoff = 0.5
        while not self.stopping:
            rc = await self.proc.wait()
            if self.stopping:
                return
            self.restarts += 1
            log.warning(
                "the %s daemon for %s exited with %s; restarting in %.1f s (restart %d)",
                self.agent.name,
                self.cfg.id,
                rc,
                backoff,
                self.restarts,
            )
            await asyncio.sleep(backoff)
            backoff = min(30.0, backoff * 2)
            try:
                await self._spawn()
                await self.wait_ready()
                backoff = 0.5
                if self.on_restart:
                    await self.on_restart()
            except Exception as e:  # keep trying; the node stays up
                log.error("restarting the %s daemon failed: %s", self.agent.name, e)

    async def stop(self) -> None:
        self.stopping = True
        if self._task:
            self._task.cancel()
        if self.proc:
            await self.agent.shutdown(self.proc)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        await self.agent.stop()
