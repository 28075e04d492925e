"""Plain MQTT clients (paho-mqtt) for tests, the demo and the benchmarks, run inside a
node's namespace with `ip netns exec`:

  pub  publish --count messages ("<id> <time_ns>" + padding) to --topic{n}, every --interval s
  sub  subscribe to --topic, print one JSON line per message, stop after --count or --timeout

Both print JSON lines: pub ends with {"sent", "acked", "disconnects"}; sub prints
{"topic", "payload", "t"} per message and ends with {"received", "disconnects"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import paho.mqtt.client as paho


def _client(cid: str, version: int) -> paho.Client:
    return paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=cid,
                       protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
                       **({} if version == 5 else {"clean_session": False}))


def pub(a) -> None:
    c = _client(a.client_id, a.version)
    acked = set()
    disconnects = []
    connected = threading.Event()
    c.on_connect = lambda cl, u, f, rc, p=None: connected.set()
    closing = []  # our own disconnect at the end is not one the client suffered
    c.on_disconnect = lambda cl, u, f, rc, p=None: None if closing else disconnects.append(str(rc))
    c.on_publish = lambda cl, u, mid, rc=None, p=None: acked.add(mid)
    c.max_queued_messages_set(0)
    c.max_inflight_messages_set(a.inflight)
    c.connect(a.host, a.port, keepalive=a.keepalive)
    c.loop_start()
    if not connected.wait(30):
        print(json.dumps({"error": f"no CONNACK from {a.host}:{a.port}"}), flush=True)
        sys.exit(1)
    mids = []
    for i in range(a.count):
        body = f"{i} {time.time_ns()} ".encode().ljust(a.size, b".")
        mids.append(c.publish(a.topic.replace("{n}", str(i)), body, qos=a.qos, retain=a.retain).mid)
        if a.interval:
            time.sleep(a.interval)
    deadline = time.monotonic() + a.timeout
    while len(acked & set(mids)) < len(mids) and time.monotonic() < deadline and a.qos:
        time.sleep(0.1)
    closing.append(1)
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"sent": len(mids), "acked": len(acked & set(mids)), "disconnects": disconnects}), flush=True)


def sub(a) -> None:
    c = _client(a.client_id, a.version)
    n = 0
    disconnects = []
    done = threading.Event()

    def on_message(cl, u, msg):
        nonlocal n
        n += 1
        print(json.dumps({"topic": msg.topic, "payload": msg.payload.decode(errors="replace"), "t": time.time(),
                          "retain": bool(msg.retain)}), flush=True)
        if a.count and n >= a.count:
            done.set()

    c.on_message = on_message
    c.on_connect = lambda cl, u, f, rc, p=None: cl.subscribe(a.topic, qos=a.qos)
    closing = []
    c.on_disconnect = lambda cl, u, f, rc, p=None: None if closing else disconnects.append(str(rc))
    c.connect(a.host, a.port, keepalive=a.keepalive)
    c.loop_start()
    done.wait(a.timeout)
    closing.append(1)
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"received": n, "disconnects": disconnects}), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m perf.mqtt_clients")
    ap.add_argument("mode", choices=["pub", "sub"])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--qos", type=int, default=1, choices=[0, 1, 2])
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.0)
    ap.add_argument("--inflight", type=int, default=100)
    ap.add_argument("--retain", action="store_true")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--keepalive", type=int, default=60)
    ap.add_argument("--client-id", default="c2client")
    ap.add_argument("--version", type=int, default=4, choices=[4, 5])
    a = ap.parse_args(argv)
    pub(a) if a.mode == "pub" else sub(a)


if __name__ == "__main__":
    main()
