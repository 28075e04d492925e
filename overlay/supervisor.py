"""Node supervisor: writes the agent's configuration, starts the daemon, waits
until it answers, restarts it when it dies, stops it cleanly.

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
import shutil
import signal
from pathlib import Path

from c2dtn.errors import C2Error
from c2dtn.overlay.agents.dtn7 import Dtn7Agent
from c2dtn.overlay.config import NodeConfig

log = logging.getLogger("c2dtn.supervisor")

DTN7_VERSION = "0.21.0"
PR_SET_PDEATHSIG = 1


class SupervisorError(C2Error):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("C2DTN_CACHE", Path.home() / ".cache" / "c2dtn"))


def find_dtnd() -> str:
    """dtnd from $C2DTN_DTND, the project's .tools/, the version-keyed cache, or PATH."""
    cands = [os.environ.get("C2DTN_DTND", ""),
             str(Path(__file__).resolve().parent.parent / ".tools" / "dtn7" / "bin" / "dtnd"),
             str(cache_dir() / f"dtn7-{DTN7_VERSION}" / "bin" / "dtnd"),
             shutil.which("dtnd") or ""]
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    raise SupervisorError(f"dtnd (dtn7-rs {DTN7_VERSION}) is not installed: run `make tools` "
                          f"(cargo install dtn7 --version {DTN7_VERSION} --locked), or set C2DTN_DTND")


def dtn7_argv(cfg: NodeConfig, dtnd: str) -> list[str]:
    """dtnd's command line for this node (cla_adapters translates the CLA specs)."""
    routes = cfg.agent_dir / "routes"
    argv = [dtnd, "-n", cfg.id, "-W", str(cfg.agent_dir), "-w", str(cfg.web_port), "-D", cfg.store,
            "--disable_nd", "-j", cfg.janitor, "-e", "c2dtn"]
    # epidemic: every peer that has not seen a bundle gets it (group bundles fan out)
    argv += ["-r", "epidemic"] if cfg.routing == "epidemic" else ["-r", "static", "-R", f"static.routes={routes}"]
    for spec in cfg.listen:
        argv += ["-C", spec.dtn7_listen_arg()]
    for p in cfg.peers:
        argv += ["-s", p.cla.dtn7_peer_arg(p.node)]
    return argv


def dtn7_routes(cfg: NodeConfig) -> str:
    """dtnd static routes: `idx src-glob dst-glob via-eid`; glob `**` crosses '/'."""
    lines = ["# written by c2dtn from " + cfg.source]
    for i, r in enumerate(cfg.routes, 1):
        dst = "**" if r.to == "*" else f"dtn://{r.to}/**"
        lines.append(f"{i} ** {dst} dtn://{r.via}/")
    return "\n".join(lines) + "\n"


def _pdeathsig() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class Supervisor:
    def __init__(self, cfg: NodeConfig, on_restart=None):
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.stopping = False
        self.agent = Dtn7Agent(f"http://127.0.0.1:{cfg.web_port}")
        self._task: asyncio.Task | None = None
        self.on_restart = on_restart
        self.pidfile = cfg.storage / "agent.pid"

    def prepare(self) -> list[str]:
        self.cfg.agent_dir.mkdir(parents=True, exist_ok=True)
        (self.cfg.agent_dir / "routes").write_text(dtn7_routes(self.cfg))
        self._stop_stale()
        return dtn7_argv(self.cfg, find_dtnd())

    def _stop_stale(self) -> None:
        """An agent left running by an earlier node process: stop it (by its recorded PID)."""
        try:
            pid = int(self.pidfile.read_text())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if b"dtnd" in cmd and str(self.cfg.agent_dir).encode() in cmd:
            log.warning("stopping agent pid %d left by an earlier run", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def _spawn(self) -> None:
        argv = self.prepare()
        logf = open(self.cfg.storage / "agent.log", "ab")
        self.proc = await asyncio.create_subprocess_exec(*argv, stdout=logf, stderr=logf,
                                                         stdin=asyncio.subprocess.DEVNULL, preexec_fn=_pdeathsig)
        logf.close()
        self.pidfile.write_text(str(self.proc.pid))
        log.info("started dtnd pid %d for node %s", self.proc.pid, self.cfg.id)

    async def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        last = None
        while asyncio.get_running_loop().time() < deadline:
            if self.proc is not None and self.proc.returncode is not None:
                tail = (self.cfg.storage / "agent.log").read_bytes()[-1500:].decode(errors="replace")
                raise SupervisorError(f"dtnd exited with {self.proc.returncode} at start:\n{tail}")
            try:
                node = await self.agent.ready()
                if node.rstrip("/").endswith(self.cfg.id):
                    return
                last = f"answers as {node}"
            except Exception as e:  # not up yet
                last = e
            await asyncio.sleep(0.1)
        raise SupervisorError(f"dtnd for {self.cfg.id} did not answer within {timeout_s:.0f} s: {last}")

    async def start(self) -> None:
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
            log.warning("dtnd for %s exited with %s; restarting in %.1f s (restart %d)",
                        self.cfg.id, rc, backoff, self.restarts)
            await asyncio.sleep(backoff)
            backoff = min(30.0, backoff * 2)
            try:
                await self._spawn()
                await self.wait_ready()
                backoff = 0.5
                if self.on_restart:
                    await self.on_restart()
            except Exception as e:  # keep trying; the node stays up
                log.error("restarting dtnd failed: %s", e)

    async def stop(self) -> None:
        self.stopping = True
        if self._task:
            self._task.cancel()
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        await self.agent.stop()
