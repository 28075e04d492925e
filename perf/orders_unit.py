"""One unit of `perf orders`' request/response runs, as seed 004's Military Messaging
service: a server on every unit that takes the orders POSTed to it, and a client that
POSTs this unit's own lines of the script to each recipient's server and waits for the
receipt (the response).  Run inside the unit's namespace:

    python -m c2dtn.perf.orders_unit coap|http --unit U --script S --start T --linger L
        --peers '{"a-v1": "10.80.0.2", ...}' [--proxy 127.0.0.1:5684 --proxied b-v1,b-v2]

CoAP: CON POSTs with CBOR bodies (content format 60) to coap://<peer>/orders/<unit>, one
exchange per order with aiocoap's own retransmission (RFC 7252: gives up when no ACK
comes within MAX_TRANSMIT_SPAN); to --proxied units through the forward proxy --proxy
(Proxy-Uri), as a leader reaches the other platoon through its own gateway.  HTTP: POSTs
with JSON bodies to http://<peer>:8080/orders/<unit> (aiohttp, kept-alive connections).
Each order is one request in its own task, waiting at most until --linger s after
--start; nothing is retried above the protocol.  Prints JSON lines:
{"ev": "recv", "id", "rx", "from", "ts", "t"} for every order the server takes (copies
too), {"ev": "sent", "id", "from", "to", "t"}, then {"ev": "answered", "id", "code", "t"}
or {"ev": "failed", "id", "error", "t"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import cbor2

HTTP_PORT = 8080


def emit(**kv) -> None:
    print(json.dumps(kv), flush=True)


def received(unit: str, order: dict) -> None:
    emit(ev="recv", id=order.get("id"), rx=unit, **{"from": order.get("from")}, ts=order.get("ts"), t=time.time())


async def coap_server(unit: str, host: str) -> object:
    import aiocoap
    import aiocoap.resource as resource

    class Orders(resource.Resource):
        async def render_post(self, request):
            try:
                order = cbor2.loads(request.payload)
                received(unit, order)
            except (ValueError, TypeError, AttributeError, cbor2.CBORDecodeError) as e:
                return aiocoap.Message(code=aiocoap.BAD_REQUEST, payload=f"not an order: {e}".encode())
            return aiocoap.Message(code=aiocoap.CHANGED)

    site = resource.Site()
    site.add_resource(["orders", unit], Orders())
    return await aiocoap.Context.create_server_context(site, bind=(host, 5683))


async def http_server(unit: str, host: str) -> object:
    from aiohttp import web

    async def post(request):
        try:
            received(unit, await request.json())
        except (ValueError, TypeError, AttributeError) as e:
            return web.Response(status=400, text=f"not an order: {e}")
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post(f"/orders/{unit}", post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, HTTP_PORT).start()
    return runner


async def run(a) -> None:
    peers = json.loads(a.peers)
    proxied = set(filter(None, a.proxied.split(",")))
    lines = [m for m in json.loads(Path(a.script).read_text()) if m["from"] == a.unit]
    end = a.start + a.linger
    if a.protocol == "coap":
        import aiocoap

        await coap_server(a.unit, peers[a.unit])
        ctx = await aiocoap.Context.create_client_context()
    else:
        import aiohttp

        await http_server(a.unit, peers[a.unit])
        session = aiohttp.ClientSession()

    async def send(m: dict) -> None:
        order = {"id": m["id"], "from": m["from"], "to": m["to"], "ts": time.time(), "text": m["text"]}
        emit(ev="sent", id=m["id"], **{"from": m["from"]}, to=m["to"], t=order["ts"])
        addr = peers[m["to"]]
        try:
            if a.protocol == "coap":
                msg = aiocoap.Message(code=aiocoap.POST, payload=cbor2.dumps(order), content_format=60)
                if m["to"] in proxied:
                    msg.opt.proxy_uri = f"coap://{addr}:5683/orders/{m['to']}"
                    msg.unresolved_remote = a.proxy
                else:
                    msg.set_request_uri(f"coap://{addr}:5683/orders/{m['to']}")
                r = await asyncio.wait_for(ctx.request(msg).response, max(0.1, end - time.time()))
                code = str(r.code)
            else:
                async with session.post(
                    f"http://{addr}:{HTTP_PORT}/orders/{m['to']}",
                    json=order,
                    timeout=aiohttp.ClientTimeout(total=max(0.1, end - time.time())),
                ) as r:
                    code = str(r.status)
        except Exception as e:  # what the application saw, as a line: the report counts it
            emit(ev="failed", id=m["id"], error=type(e).__name__, t=time.time())
            return
        emit(ev="answered", id=m["id"], code=code, t=time.time())

    tasks = []
    for m in lines:
        await asyncio.sleep(max(0.0, a.start + m["t"] - time.time()))
        tasks.append(asyncio.create_task(send(m)))
    await asyncio.sleep(max(0.0, end - time.time()))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if a.protocol == "http":
        await session.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m c2dtn.perf.orders_unit")
    ap.add_argument("protocol", choices=["coap", "http"])
    ap.add_argument("--unit", required=True)
    ap.add_argument("--script", required=True, help="the JSON message script")
    ap.add_argument("--start", type=float, required=True, help="epoch second the script's times count from")
    ap.add_argument("--linger", type=float, required=True, help="seconds after --start to keep serving")
    ap.add_argument("--peers", required=True, help='JSON: unit -> its address ({"a-v1": "10.80.0.2", ...})')
    ap.add_argument("--proxy", default="", help="coap: the forward proxy, address:port")
    ap.add_argument("--proxied", default="", help="coap: units reached through --proxy (comma-separated)")
    a = ap.parse_args(argv)
    asyncio.run(run(a))


if __name__ == "__main__":
    main()
