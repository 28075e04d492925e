"""Bare BPA workloads (no overlay), run inside a node's namespace next to its agent:

  echo    answer every bundle on endpoint `bench` with the same payload to dtn://<src>/benchreply
  rtt     send `count` bundles of `size` bytes to <dst>'s echo and time each round trip (bping style);
          --stepped: one round trip per line on stdin, each time printed as it is taken
  sink    receive `count` bundles on `bench`, print the time of the last one
  source  send `count` bundles of `size` bytes to <dst>/bench as fast as the agent takes them;
          --interval S: one every S seconds instead, each stamped with its number and send time
          (a sink run with --stamps then gives each one's latency)
  data    dtnperf-style data mode: `count` bundles of `size` bytes to <dst>/bench with at most
          `window` unacknowledged; the sink (run with --ack) answers each with a small
          bundle to dtn://<src>/benchack; unacked after --ack-timeout counts as lost

Each prints one JSON line with its figures.  Times are CLOCK_MONOTONIC, shared by
every namespace, so a source and a sink in two namespaces can be compared.

Without --config the client speaks to the daemon of --agent (the default agent) on --port, on the endpoints
above (so that it can run beside an overlay node on the same daemon: BundleAgent.beside); with
--beside NODE.toml, to that node's daemon, named as its config names it (dtn7's ipn naming).  With
--config NODE.toml it uses that node's agent through its driver (any agent), and every workload
uses the agent's own endpoint: an agent that serves one endpoint per node must then run no overlay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from c2dtn.overlay.agent import AgentError, BundleAgent
from c2dtn.overlay.agents import DEFAULT, agent_class

ENDPOINTS = {"request": "bench", "reply": "benchreply", "ack": "benchack"}


def spawn(node: str, *args: str, stdin: bool = False):
    """Run this module with `args` inside testbed node `node`'s namespace (for benchmarks);
    stdin: a pipe to feed a --stepped client (its stderr then goes to a file, so that
    reading its answers line by line cannot block on a full stderr pipe)."""
    import subprocess
    import tempfile

    err = tempfile.TemporaryFile("w+") if stdin else subprocess.PIPE
    p = subprocess.Popen(
        ["ip", "netns", "exec", f"c2-{node}", sys.executable, "-m", "c2dtn.perf.bare_client", *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    p.errfile = err if stdin else None
    return p


def client_gap(agent: str) -> float:
    """Seconds to wait after a client of `agent` ended before the next one of the same node
    starts: the driver's session gap (HDTN: hdtn.SESSION_GAP_S, whose comment says why), which a new
    process cannot wait out by itself, and half a second for the ended one to be gone."""
    from c2dtn.overlay.agents import agent_class

    gap = agent_class(agent).session_gap_s
    return gap + 0.5 if gap else 0.0


def end(p, gap: float = 0.0) -> None:
    """End a client that serves until its timeout (echo, sink) before the next one opens the
    same endpoint: SIGTERM first, so that ION's helper it runs detaches from the node and
    HDTN's session ends; then wait `gap` seconds (client_gap)."""
    p.terminate()
    try:
        p.wait(5)
    except Exception:
        p.kill()
        p.wait()
    time.sleep(gap)


def answer(p) -> dict:
    """The next JSON line of a --stepped client."""
    while True:
        line = p.stdout.readline()
        if not line:
            p.wait()
            p.errfile.seek(0)
            raise RuntimeError(f"bare client ended (exit {p.returncode}): {p.errfile.read()[-1000:]}")
        if line.startswith("{"):
            return json.loads(line)


def result(p, timeout: float) -> dict:
    """The JSON line a spawned client ends with."""
    out, err = p.communicate(timeout=timeout)
    if getattr(p, "errfile", None) is not None:
        p.errfile.seek(0)
        err = p.errfile.read()
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if not lines:
        raise RuntimeError(f"bare client failed: {err[-1000:]}")
    return json.loads(lines[-1])


async def echo(agent: BundleAgent, seconds: float) -> dict:
    await agent.register(ENDPOINTS["request"])
    n = 0

    async def loop():
        nonlocal n
        async for d in agent.deliveries(ENDPOINTS["request"]):
            await agent.send(d.src_node, ENDPOINTS["reply"], d.payload, 600)
            n += 1

    try:
        await asyncio.wait_for(loop(), seconds)
    except asyncio.TimeoutError:
        pass
    return {"echoed": n}


GIVE_UP_AFTER = 3  # unanswered pings in a row after which `rtt` stops


async def rtt(agent: BundleAgent, dst: str, size: int, count: int, timeout: float, stepped: bool = False) -> dict:
    """`count` round trips; stepped: one per line read from stdin, its time printed as a
    JSON line {"rtt": seconds or null} (so a benchmark can interleave them with others)."""
    await agent.register(ENDPOINTS["reply"])
    replies: asyncio.Queue = asyncio.Queue()

    async def feed():  # a timeout must not cancel the delivery stream itself
        async for d in agent.deliveries(ENDPOINTS["reply"]):
            await replies.put(d)

    run = os.urandom(4).hex()  # an answer to an earlier run's ping, arriving late, is not ours

    async def one(i: int) -> float | None:
        stamp = f"{run}:{i}:".encode()
        payload = stamp + os.urandom(max(0, size - len(stamp)))
        t0 = time.monotonic()
        await agent.send(dst, ENDPOINTS["request"], payload, 600)
        try:
            while True:
                d = await asyncio.wait_for(replies.get(), timeout)
                if d.payload.startswith(stamp):
                    return time.monotonic() - t0
        except asyncio.TimeoutError:
            return None

    feeder = asyncio.create_task(feed())
    rtts = []
    try:
        if stepped:
            loop = asyncio.get_running_loop()
            print(json.dumps({"ready": True}), flush=True)
            i = 0
            while await loop.run_in_executor(None, sys.stdin.readline):
                r = await one(i)
                i += 1
                print(json.dumps({"rtt": r}), flush=True)
                if r is not None:
                    rtts.append(r)
        else:
            missed = 0  # in a row: an agent that stopped answering is not waited on `count` times
            for i in range(count):
                r = await one(i)
                if r is not None:
                    rtts.append(r)
                missed = 0 if r is not None else missed + 1
                if missed >= GIVE_UP_AFTER:
                    return {
                        "rtts": rtts,
                        "gave_up": f"{missed} pings in a row unanswered within {timeout:g} s (ping {i + 1} of {count})",
                    }
    finally:
        feeder.cancel()
    return {"rtts": rtts}


def stamp(i: int, t: float) -> bytes:
    return f"{i}:{t:.6f}:".encode()


def unstamp(payload: bytes) -> tuple[int, float] | None:
    """(number, send time) of a paced source's bundle, None for any other payload."""
    try:
        i, t, _ = payload.split(b":", 2)
        return int(i), float(t)
    except ValueError:
        return None


async def sink(agent: BundleAgent, count: int, timeout: float, ack: bool = False, stamps: bool = False) -> dict:
    """stamps: also list [number, sent, received] of each stamped bundle (first arrival only)."""
    await agent.register(ENDPOINTS["request"])
    n, nbytes, first, last = 0, 0, None, None
    got: dict[int, list[float]] = {}

    async def loop():
        nonlocal n, nbytes, first, last
        async for d in agent.deliveries(ENDPOINTS["request"]):
            last = time.monotonic()
            first = first or last
            n += 1
            nbytes += len(d.payload)
            st = unstamp(d.payload) if stamps else None
            if st and st[0] not in got:
                got[st[0]] = [st[1], last]
            if ack:
                await agent.send(d.src_node, ENDPOINTS["ack"], d.payload[:16], 600)
            if n >= count:
                return

    try:
        await asyncio.wait_for(loop(), timeout)
    except asyncio.TimeoutError:
        pass
    out = {"received": n, "bytes": nbytes, "first": first, "last": last}
    if stamps:
        out["stamps"] = sorted([i, s, r] for i, (s, r) in got.items())
    return out


async def source(agent: BundleAgent, dst: str, size: int, count: int, interval: float = 0.0) -> dict:
    """`count` bundles as fast as the agent takes them, or (interval > 0) one every `interval` s,
    each stamped; a bundle the agent refuses (its link down, say) is counted, not fatal."""
    payload = os.urandom(size)
    t0 = time.monotonic()
    refused = 0
    for i in range(count):
        if interval:
            await asyncio.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            st = stamp(i, time.monotonic())
            payload = st + os.urandom(max(0, size - len(st)))
        try:
            await agent.send(dst, ENDPOINTS["request"], payload, 3600)
        except AgentError as e:
            if not interval:
                raise
            refused += 1
            print(f"bundle {i} refused: {e}", file=sys.stderr, flush=True)
    return {"start": t0, "sent": count - refused, "refused": refused, "end": time.monotonic()}


async def data(
    agent: BundleAgent, dst: str, size: int, count: int, window: int, timeout: float, ack_timeout: float
) -> dict:
    """Throughput with at most `window` bundles unacknowledged.  A bundle whose ack has not come
    back after `ack_timeout` s counts as lost and frees its window slot (dtnperf would stall on it
    for good; an unreliable CLA loses bundles); an ack that still comes later counts it delivered
    ("late").  The run ends at the last ack, so waiting for the lost ones is not counted."""
    await agent.register(ENDPOINTS["ack"])
    acks: asyncio.Queue = asyncio.Queue()

    async def feed():
        async for d in agent.deliveries(ENDPOINTS["ack"]):
            await acks.put(d)

    feeder = asyncio.create_task(feed())
    t0 = time.monotonic()
    deadline = t0 + timeout
    outstanding: dict[int, float] = {}  # id -> send time, oldest first
    given_up: set[int] = set()
    sent = acked = late = 0
    last = t0
    try:
        while (sent < count or outstanding) and time.monotonic() < deadline:
            while sent < count and len(outstanding) < window:
                stamp = f"{sent}:".encode()
                await agent.send(dst, ENDPOINTS["request"], stamp + os.urandom(max(0, size - len(stamp))), 3600)
                outstanding[sent] = time.monotonic()
                sent += 1
            oldest = next(iter(outstanding.values()))
            wait = min(oldest + ack_timeout, deadline) - time.monotonic()
            try:
                d = await asyncio.wait_for(acks.get(), max(wait, 0.001))
            except asyncio.TimeoutError:
                for i, t in list(outstanding.items()):
                    if time.monotonic() - t >= ack_timeout:
                        del outstanding[i]
                        given_up.add(i)
                continue
            try:
                i = int(d.payload.split(b":", 1)[0])
            except ValueError:
                continue
            if outstanding.pop(i, None) is not None or i in given_up:
                late += i in given_up
                given_up.discard(i)
                acked += 1
                last = time.monotonic()
    finally:
        feeder.cancel()
    return {"start": t0, "sent": sent, "acked": acked, "late": late, "lost": sent - acked, "end": last}


def make_client(config: str | None, port: int, kind: str = DEFAULT, beside: str | None = None) -> BundleAgent:
    """The agent to run a workload on (see the module's docstring); with a node config, every
    workload goes to that agent's own endpoint; beside: the config of the overlay node this
    client runs beside (its agent's API and naming, the benchmark's own endpoints)."""
    from c2dtn.overlay.agents import make_agent
    from c2dtn.overlay.config import load_node_config

    if beside:
        return make_agent(load_node_config(beside))
    if not config:
        return agent_class(kind).beside(port)

    agent = make_agent(load_node_config(config))
    ENDPOINTS.update(dict.fromkeys(ENDPOINTS, agent.endpoint))
    return agent


async def main(args) -> dict:
    agent = make_client(args.config, args.port, args.agent, args.beside)
    await agent.start()
    try:
        if args.mode == "echo":
            return await echo(agent, args.timeout)
        if args.mode == "rtt":
            return await rtt(agent, args.dst, args.size, args.count, args.timeout, args.stepped)
        if args.mode == "sink":
            return await sink(agent, args.count, args.timeout, args.ack, args.stamps)
        if args.mode == "data":
            return await data(agent, args.dst, args.size, args.count, args.window, args.timeout, args.ack_timeout)
        return await source(agent, args.dst, args.size, args.count, args.interval)
    finally:
        await agent.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m c2dtn.perf.bare_client")
    ap.add_argument("mode", choices=["echo", "rtt", "sink", "source", "data"])
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--ack", action="store_true", help="sink: acknowledge each bundle (for data mode)")
    ap.add_argument("--stepped", action="store_true", help="rtt: one round trip per line on stdin")
    ap.add_argument("--stamps", action="store_true", help="sink: list each stamped bundle's send and arrival")
    ap.add_argument("--interval", type=float, default=0.0, help="source: seconds between bundles (stamped)")
    ap.add_argument("--dst", default="")
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--port", type=int, default=3000, help="the agent's API port (without --config)")
    ap.add_argument("--agent", default=DEFAULT, help="the agent beside the overlay node (without --config)")
    ap.add_argument("--config", default=None, help="the node's config: use its agent, whichever it is")
    ap.add_argument("--beside", default=None, help="the config of the overlay node to run beside (its agent's naming)")
    ap.add_argument("--ack-timeout", type=float, default=30.0, help="data: seconds before an unacked bundle is lost")
    out = asyncio.run(main(ap.parse_args()))
    print(json.dumps(out), flush=True)
    sys.exit(0)
