"""CoAP test clients and server (aiocoap), run inside a node's namespace by the tests and
benchmarks: `python -m c2dtn.perf.coap_clients server|post ...`.  Each prints one JSON
line per event (flushed), so a test reads what a CoAP application saw.

    server --host H [--port 5683]        every request: {"path", "payload", "t"}; answers 2.04 "ack <payload>";
                                          GET /clock: the time its state was made (it changes every
                                          second, observable, Max-Age 2); GET /big: 20,000 bytes (block-wise)
    post --host H --count N [--path /orders/{n}] [--interval S] [--timeout S] [--non]
                                          every response: {"n", "code", "payload", "s"}; last: {"done", "answered"}
    observe --host H [--path /clock] --duration S
                                          every notification: {"code", "payload", "t"}; last: {"done", "notifications"}
    get --host H --path P [--timeout S]   the response: {"code", "size", "sha256", "s"}
    flood --host H --count N [--rate R] [--seed S]
                                          N malformed datagrams (MALFORMED's kinds, in turn): {"sent", "kinds"}
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time

BIG = bytes(range(256)) * 78 + b"twenty thousand bytes, the end.."  # 20,000 bytes, /big


# What RFC 7252 section 3 makes a message format error, one generator per kind; each datagram
# is otherwise a plausible request (random type, code, message id, token and options).
def _head(rng, ver: int = 1, tkl: int | None = None) -> bytes:
    tkl = rng.randrange(9) if tkl is None else tkl
    return bytes(
        [ver << 6 | rng.randrange(4) << 4 | tkl, rng.choice((1, 2, 3, 4)), rng.randrange(256), rng.randrange(256)]
    ) + rng.randbytes(min(tkl, 8))


def _path(rng) -> bytes:
    seg = b"orders"
    return bytes([0xB0 | len(seg)]) + seg  # Uri-Path (11), delta 11


MALFORMED = {
    "bad version": lambda rng: _head(rng, ver=rng.choice((0, 2, 3))) + _path(rng),
    "token length 9-15": lambda rng: _head(rng, tkl=rng.randrange(9, 16)) + rng.randbytes(rng.randrange(16)),
    # an option whose length runs past the end of the datagram
    "truncated option": lambda rng: (lambda n: _head(rng) + bytes([0xB0 | n]) + rng.randbytes(rng.randrange(n)))(
        rng.randrange(1, 13)
    ),
    # delta or length nibble 15 (reserved) in an option that is not the payload marker
    "option delta 15": lambda rng: (
        _head(rng)
        + _path(rng)
        + bytes([rng.choice((0xF0 | rng.randrange(15), rng.randrange(1, 15) << 4 | 0xF))])
        + rng.randbytes(rng.randrange(4))
    ),
    "payload marker, no payload": lambda rng: _head(rng) + _path(rng) + b"\xff",
}


def malformed(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """n malformed datagrams, the kinds in turn."""
    import random

    rng = random.Random(seed)
    kinds = list(MALFORMED)
    return [(kinds[i % len(kinds)], MALFORMED[kinds[i % len(kinds)]](rng)) for i in range(n)]


def flood(host: str, port: int, count: int, rate: float, seed: int) -> None:
    import socket

    kinds: dict[str, int] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        t0 = time.monotonic()
        for i, (kind, data) in enumerate(malformed(count, seed)):
            sock.sendto(data, (host, port))
            kinds[kind] = kinds.get(kind, 0) + 1
            time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
    emit(sent=count, kinds=kinds, s=round(time.monotonic() - t0, 3))


def emit(**kv) -> None:
    print(json.dumps(kv), flush=True)


async def serve(host: str, port: int) -> None:
    import aiocoap
    import aiocoap.resource as resource

    start = time.time()

    class Any(resource.ObservableResource):
        async def render(self, request):  # every method
            path = "/" + "/".join(request.opt.uri_path)
            if path == "/clock" and request.code == aiocoap.GET:  # (rendered again for every notification: no line)
                return aiocoap.Message(
                    code=aiocoap.CONTENT, payload=f"{start + int(time.time() - start):.3f}".encode(), max_age=2
                )
            emit(path=path, payload=request.payload.decode(errors="replace"), code=str(request.code), t=time.time())
            if path == "/big" and request.code == aiocoap.GET:
                return aiocoap.Message(code=aiocoap.CONTENT, payload=BIG)
            return aiocoap.Message(code=aiocoap.CHANGED, payload=b"ack " + request.payload)

    site = Any()
    # the resource as the whole site: every path is it (only GET /clock registrations observe)
    await aiocoap.Context.create_server_context(site, bind=(host, port))
    emit(listening=f"{host}:{port}")
    while True:
        await asyncio.sleep(1 - (time.time() - start) % 1)
        site.updated_state()


async def post(host: str, port: int, count: int, path: str, interval: float, timeout: float, non: bool) -> None:
    import aiocoap

    ctx = await aiocoap.Context.create_client_context()
    answered = 0

    async def one(n: int) -> None:
        nonlocal answered
        p = path.format(n=n)
        msg = aiocoap.Message(
            code=aiocoap.POST,
            payload=f"order {n}".encode(),
            uri=f"coap://{host}:{port}{p}",
            transport_tuning=aiocoap.Unreliable if non else aiocoap.Reliable,
        )
        t0 = time.monotonic()
        try:
            r = await asyncio.wait_for(ctx.request(msg).response, timeout - (time.monotonic() - start))
        except Exception as e:  # what the application saw, as a line: the test counts it
            emit(n=n, error=type(e).__name__, s=round(time.monotonic() - t0, 3))
            return
        answered += 1
        emit(n=n, code=str(r.code), payload=r.payload.decode(errors="replace"), s=round(time.monotonic() - t0, 3))

    start = time.monotonic()
    tasks = []
    for n in range(count):
        tasks.append(asyncio.create_task(one(n)))
        await asyncio.sleep(interval)
    await asyncio.gather(*tasks)
    emit(done=count, answered=answered, s=round(time.monotonic() - start, 3))
    await ctx.shutdown()


async def observe(host: str, port: int, path: str, duration: float) -> None:
    import aiocoap

    ctx = await aiocoap.Context.create_client_context()
    got = 0
    msg = aiocoap.Message(code=aiocoap.GET, observe=0, uri=f"coap://{host}:{port}{path}")
    req = ctx.request(msg)

    async def follow():
        nonlocal got
        r = await req.response
        got += 1
        emit(code=str(r.code), payload=r.payload.decode(errors="replace"), t=time.time(), observe=r.opt.observe)
        async for n in req.observation:
            got += 1
            emit(code=str(n.code), payload=n.payload.decode(errors="replace"), t=time.time(), observe=n.opt.observe)

    try:
        await asyncio.wait_for(follow(), duration)
    except asyncio.TimeoutError:
        pass
    except Exception as e:  # what the application saw, as a line
        emit(error=type(e).__name__, t=time.time())
    emit(done=True, notifications=got)
    if not req.observation.cancelled:
        req.observation.cancel()
    await ctx.shutdown()


async def get(host: str, port: int, path: str, timeout: float) -> None:
    import aiocoap

    ctx = await aiocoap.Context.create_client_context()
    t0 = time.monotonic()
    try:
        r = await asyncio.wait_for(
            ctx.request(aiocoap.Message(code=aiocoap.GET, uri=f"coap://{host}:{port}{path}")).response, timeout
        )
        emit(
            code=str(r.code),
            size=len(r.payload),
            sha256=hashlib.sha256(r.payload).hexdigest(),
            s=round(time.monotonic() - t0, 3),
        )
    except Exception as e:  # what the application saw, as a line
        emit(error=type(e).__name__, s=round(time.monotonic() - t0, 3))
    await ctx.shutdown()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="coap_clients")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, default=5683)
    p = sub.add_parser("post")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, default=5683)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--path", default="/orders/{n}")
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--non", action="store_true", help="NON requests (default CON)")
    o = sub.add_parser("observe")
    o.add_argument("--host", required=True)
    o.add_argument("--port", type=int, default=5683)
    o.add_argument("--path", default="/clock")
    o.add_argument("--duration", type=float, required=True)
    g = sub.add_parser("get")
    g.add_argument("--host", required=True)
    g.add_argument("--port", type=int, default=5683)
    g.add_argument("--path", required=True)
    g.add_argument("--timeout", type=float, default=60)
    f = sub.add_parser("flood")
    f.add_argument("--host", required=True)
    f.add_argument("--port", type=int, default=5683)
    f.add_argument("--count", type=int, default=3000)
    f.add_argument("--rate", type=float, default=1000.0, help="datagrams per second")
    f.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "server":
        asyncio.run(serve(a.host, a.port))
    elif a.cmd == "observe":
        asyncio.run(observe(a.host, a.port, a.path, a.duration))
    elif a.cmd == "get":
        asyncio.run(get(a.host, a.port, a.path, a.timeout))
    elif a.cmd == "flood":
        if a.count < 1 or a.rate <= 0:
            sys.exit(f"coap_clients: --count {a.count} / --rate {a.rate}: both must be positive")
        flood(a.host, a.port, a.count, a.rate, a.seed)
    else:
        if a.count < 1 or a.timeout <= 0:
            sys.exit(f"coap_clients: --count {a.count} / --timeout {a.timeout}: both must be positive")
        asyncio.run(post(a.host, a.port, a.count, a.path, a.interval, a.timeout, a.non))


if __name__ == "__main__":
    main()
