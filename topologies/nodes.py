"""Real overlay nodes (dtnd under `c2dtn node run`) on a testbed topology: used by tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from c2dtn.overlay.agents import DEFAULT, agent_class, kinds
from c2dtn.overlay.client import ApiError, NodeClient
from c2dtn.overlay.config import load_node_config
from c2dtn.overlay.relay import load_relay_config
from c2dtn.topologies import netns, testbed
from c2dtn.topologies.node_configs import harness_cla, testbed_clas, topology_agents, write_configs


def agent_missing(kind: str = DEFAULT) -> str | None:
    """Why the testbed cannot run agent `kind` here (not built), else None."""
    return agent_class(kind).missing()


# the agents the live tests prove the overlay on (each skipped, with its build's error, where
# it was not built): every registered one, the default first
AGENTS = [DEFAULT] + [k for k in kinds() if k != DEFAULT]


class Nodes:
    def __init__(
        self,
        st: dict,
        bpa: list[str],
        overlay: list[str],
        workdir: Path,
        cla: str = "tcpcl",
        per_link_cla: bool = True,
        gateways: dict[str, str] | None = None,
        groups: dict[str, list[str]] | None = None,
        scheduler: dict[str, int] | None = None,
        agent: str | dict[str, str] | None = None,
        relay: str | None = None,
        options: dict[str, str] | None = None,
        configs: dict[str, Path] | None = None,
    ):
        """gateways: node -> its [gateway] TOML table; those run `c2dtn gateway run`.
        groups: group name -> member overlay nodes; scheduler: [scheduler] settings; agent, relay:
        one agent, or one per node with a relay between the islands (see write_configs); by default
        what the topology's nodes name (`agent = ...`, dtn7 where none), its relay if it runs a BPA.
        options: node -> TOML added to its config (an agent's own table, say).
        configs: node -> a config file written elsewhere (the docs' own, say), run as it is."""
        if agent is None:
            agent, named_relay = topology_agents(st)
            relay = relay or (named_relay if named_relay in bpa else None)
            one = {agent.get(n, DEFAULT) for n in bpa}
            if relay is None and len(one) == 1:  # one island: its agent's own CLAs (testbed_clas)
                agent = one.pop()
        self.st = st
        self.gateways = gateways or {}
        self.verbose = False  # debug logs (each bundle handed to the agent) in <node>.node.log
        if isinstance(agent, str) and agent != "relay" and testbed_clas(agent):
            cla, per_link_cla = harness_cla(agent, cla), False
        per_node = options or {}
        self.paths = configs or write_configs(
            st,
            bpa,
            overlay,
            workdir,
            cla=cla,
            per_link_cla=per_link_cla,
            extra={n: self.gateways.get(n, "") + per_node.get(n, "") for n in bpa},
            groups=groups,
            scheduler=scheduler,
            agent=agent,
            relay=relay,
        )
        self.relay = relay
        self.procs: dict[str, subprocess.Popen] = {}
        self._log_from: dict[str, int] = {}
        self.sock = {n: load_node_config(p).api_socket for n, p in self.paths.items() if n != relay}
        self._clients: dict[str, NodeClient] = {}

    def cfg(self, n: str):
        if n == self.relay:
            return load_relay_config(self.paths[n])
        return load_node_config(self.paths[n])

    def start(self, n: str, wait: bool = True) -> None:
        cfg = self.cfg(n)
        log = open(cfg.storage.parent / f"{n}.node.log", "ab")
        self._log_from[n] = log.tell()  # where this run's lines begin
        group = "gateway" if n in self.gateways else "relay" if n == self.relay else "node"
        self.procs[n] = subprocess.Popen(
            [sys.executable, "-m", "c2dtn.cli", group, "run", str(self.paths[n])] + (["-v"] if self.verbose else []),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        if wait:
            self.wait_ready(n)

    def wait_ready(self, n: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[n].poll() is not None:
                raise RuntimeError(f"node {n} exited: " + self.log(n)[-2000:])
            if n == self.relay:  # no API: its log says when every island's agent answers
                if f" relay {n} up:".encode() in self._log_path(n).read_bytes()[self._log_from.get(n, 0) :]:
                    return
                time.sleep(0.2)
                continue
            try:
                self.client(n).status(timeout=2)
                return
            except ApiError:
                time.sleep(0.1)
        raise RuntimeError(f"node {n} not ready in {timeout} s: " + self.log(n)[-2000:])

    def _log_path(self, n: str) -> Path:
        return self.cfg(n).storage.parent / f"{n}.node.log"

    def log(self, n: str) -> str:
        return self._log_path(n).read_text(errors="replace")

    def kill(self, n: str) -> None:
        """SIGKILL the node process and its agent (a relay's agents), as a power cut would."""
        cfg = self.cfg(n)
        stores = [c.storage for c in cfg.islands] if n == self.relay else [cfg.storage]
        agent_pids = [int((s / "agent.pid").read_text()) for s in stores]
        self.procs[n].kill()
        self.procs[n].wait()
        for pid in agent_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(netns._alive(p) for p in agent_pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def start_all(self, names: list[str]) -> None:
        """Start these nodes at once, then wait until each is ready; if one is not, stop them
        all and tear the testbed down (the caller has nothing to clean) before raising."""
        try:
            for n in names:
                self.start(n, wait=False)
            for n in names:
                self.wait_ready(n)
        except BaseException:
            self.stop_all()
            testbed.down()
            raise

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    def client(self, n: str) -> NodeClient:
        """Node n's API client (one kept-alive connection per thread)."""
        if n not in self._clients:
            self._clients[n] = NodeClient(self.sock[n], n)
        return self._clients[n]

    def send(
        self,
        n: str,
        dst: str,
        body: bytes,
        priority: str = "routine",
        lifetime: float = 3600,
        supersede: str | None = None,
    ) -> int:
        return self.client(n).send(dst, body, priority, lifetime, supersede, app="test")["seq"]

    def recv(self, n: str, wait: float = 1.0, cbor: bool = True) -> list[dict]:
        """What node n's inbox holds (taken off it), bodies as bytes; over the API's CBOR
        answer, or its JSON one (base64 bodies) with cbor=False."""
        c = self.client(n)
        items = c.recv(wait, 1000, cbor=cbor)
        c.consumed(items)
        return items

    def status(self, n: str) -> dict:
        return self.client(n).status()
