"""Plain MQTT clients (paho-mqtt) for tests, the demo and the benchmarks, run inside a
node's namespace with `ip netns exec`:

  pub  publish --count messages ("<id> <time_ns>" + padding) to --topic{n}, every --interval s
  sub  subscribe to --topic, print one JSON line per message, stop after --count or --timeout
  units  --units GeoJSON position reporters of --nation (seed 000), one report each per --period

Both print JSON lines: pub ends with {"sent", "acked", "disconnects"}; sub prints
{"topic", "payload", "t", "qos", "retain", "props"} per message and ends with
{"received", "disconnects"}.  --props (JSON: user_property, content_type,
response_topic, message_expiry_interval) sets MQTT 5 publish properties; --will-topic
gives pub a will, and --die makes it end without DISCONNECT (so the will goes out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def _client(cid: str, version: int) -> paho.Client:
    return paho.Client(
        paho.CallbackAPIVersion.VERSION2,
        client_id=cid,
        protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
        **({} if version == 5 else {"clean_session": False}),
    )


def _publish_props(a) -> Properties | None:
    if a.version != 5 or not a.props:
        return None
    pr = Properties(PacketTypes.PUBLISH)
    for k, v in json.loads(a.props).items():
        setattr(pr, "".join(w.capitalize() for w in k.split("_")), [tuple(x) for x in v] if k == "user_property" else v)
    return pr


def _props_dict(pr) -> dict:
    if pr is None:
        return {}
    out = {}
    for k, name in (
        ("user_property", "UserProperty"),
        ("content_type", "ContentType"),
        ("response_topic", "ResponseTopic"),
        ("message_expiry_interval", "MessageExpiryInterval"),
        ("correlation_data", "CorrelationData"),
    ):
        if hasattr(pr, name):
            v = getattr(pr, name)
            out[k] = [list(x) for x in v] if k == "user_property" else (v.hex() if isinstance(v, bytes) else v)
    return out


def pub(a) -> None:
    c = _client(a.client_id, a.version)
    if a.will_topic:
        c.will_set(a.will_topic, a.will_payload, qos=1, retain=False)
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
        mids.append(
            c.publish(
                a.topic.replace("{n}", str(i)), body, qos=a.qos, retain=a.retain, properties=_publish_props(a)
            ).mid
        )
        if a.interval:
            time.sleep(a.interval)
    deadline = time.monotonic() + a.timeout
    while len(acked & set(mids)) < len(mids) and time.monotonic() < deadline and a.qos:
        time.sleep(0.1)
    result = {"sent": len(mids), "acked": len(acked & set(mids)), "disconnects": disconnects}
    if a.die:  # no DISCONNECT: the broker (through the gateways) publishes the will
        print(json.dumps(result), flush=True)
        os._exit(0)
    closing.append(1)
    c.disconnect()
    c.loop_stop()
    print(json.dumps(result), flush=True)


def sub(a) -> None:
    c = _client(a.client_id, a.version)
    n = 0
    disconnects = []
    done = threading.Event()

    def on_message(cl, u, msg):
        nonlocal n
        n += 1
        print(
            json.dumps(
                {
                    "topic": msg.topic,
                    "payload": msg.payload.decode(errors="replace"),
                    "t": time.time(),
                    "qos": msg.qos,
                    "retain": bool(msg.retain),
                    "props": _props_dict(getattr(msg, "properties", None)),
                }
            ),
            flush=True,
        )
        if a.count and n >= a.count:
            done.set()

    c.on_message = on_message
    subscribed = threading.Event()
    c.on_subscribe = lambda *args: subscribed.set() or print(json.dumps({"subscribed": a.topic}), flush=True)
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


def _print_recv(msg, rx: str, rx_nation: str, lock: threading.Lock) -> None:
    try:
        rep = json.loads(msg.payload)["properties"]
        ev = {
            "ev": "recv",
            "rx": rx,
            "rx_nation": rx_nation,
            "id": rep["msg_id"],
            "from": rep["country"],
            "ts": rep["timestamp"] / 1000,
            "t": time.time(),
        }
    except (ValueError, KeyError, TypeError):
        ev = {"ev": "recv", "rx": rx, "rx_nation": rx_nation, "bad": msg.topic, "t": time.time()}
    with lock:
        print(json.dumps(ev), flush=True)


def units(a) -> None:
    """--units position reporters of one nation, one MQTT client each, a GeoJSON report
    (seed 000 format) every --period s with a random phase, for --duration s.  One JSON
    line per report sent ({"ev": "sent", "id", "nation", "unit", "t"}), then {"ev": "done", ...}.
    With --subscribe FILTER every unit also subscribes (every unit sees every report) and
    prints {"ev": "recv", "rx", "rx_nation", "id", "from", "ts", "t"} per report it gets,
    until --linger s after its last report."""
    import random

    from c2dtn.perf.train_dict import position_report, report_times, report_topic

    rnd = random.Random(a.seed)
    lock = threading.Lock()
    acked: set[tuple[int, int]] = set()
    disconnects: list[str] = []
    clients, sent = [], []
    for u in range(1, a.units + 1):
        c = _client(f"{a.client_id}-{a.nation}-{u}", a.version)
        c.max_queued_messages_set(0)
        c.max_inflight_messages_set(a.inflight)
        c.on_publish = lambda cl, ud, mid, rc=None, p=None, u=u: acked.add((u, mid))
        c.on_disconnect = lambda cl, ud, f, rc, p=None: disconnects.append(str(rc))
        if a.subscribe and (not a.observers or u <= a.observers):
            rx = f"{a.nation}-S{u:03d}"
            c.on_connect = lambda cl, ud, f, rc, p=None: cl.subscribe(a.subscribe, qos=a.qos)
            c.on_message = lambda cl, ud, msg, rx=rx: _print_recv(msg, rx, a.nation, lock)
        c.connect(a.host, a.port, keepalive=a.keepalive)
        c.loop_start()
        clients.append(c)
    if a.subscribe:
        time.sleep(1.0)  # subscriptions in place before the first report
    t0 = time.time()
    plan = [(t0 + t, u) for t, u in report_times(rnd, a.units, a.period, a.duration)]
    pos = {u: (59.9 + rnd.random() / 10, 10.7 + rnd.random() / 10) for u in range(1, a.units + 1)}
    seq = dict.fromkeys(pos, 0)
    for when, u in plan:
        time.sleep(max(0.0, when - time.time()))
        seq[u] += 1
        lat, lon = pos[u]
        pos[u] = (lat + rnd.uniform(-1e-4, 1e-4), lon + rnd.uniform(-1e-4, 1e-4))
        now_ms = int(time.time() * 1000)
        topic = report_topic(a.nation, u, u)
        body = position_report(a.nation, u, u, seq[u], now_ms, lat, lon)
        info = clients[u - 1].publish(topic, body, qos=a.qos)
        with lock:
            sent.append((u, info.mid))
            print(
                json.dumps(
                    {
                        "ev": "sent",
                        "id": f"{a.nation}-S{u:03d}_{seq[u]}",
                        "nation": a.nation,
                        "unit": f"{a.nation}-S{u:03d}",
                        "topic": topic,
                        "t": now_ms / 1000,
                    }
                ),
                flush=True,
            )
    deadline = time.monotonic() + a.timeout
    while a.qos and len(acked & set(sent)) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.2)
    with lock:
        print(
            json.dumps({"ev": "done", "sent": len(sent), "acked": len(acked & set(sent)), "disconnects": disconnects}),
            flush=True,
        )
    if a.subscribe:
        time.sleep(max(0.0, a.linger - (time.monotonic() - (deadline - a.timeout))))
    os._exit(0)  # the clients' threads need not be waited for


def script(a) -> None:
    """One unit of a C2 message script (perf orders): subscribes to c2/orders/<unit> at QoS 1,
    then at each of its own lines' times (seconds after --start, an epoch shared by every
    unit) publishes the message to c2/orders/<to>.  Prints {"ev": "sent", "id", "from", "to",
    "t"} per message and {"ev": "recv", "id", "rx", "from", "ts", "t"} per message received,
    until --linger s after --start plus the script's end."""
    lines = [m for m in json.loads(Path(a.script).read_text()) if m["from"] == a.unit]
    lock = threading.Lock()

    def on_message(cl, ud, msg):
        try:
            m = json.loads(msg.payload)
            ev = {"ev": "recv", "id": m["id"], "rx": a.unit, "from": m["from"], "ts": m["ts"], "t": time.time()}
        except (ValueError, KeyError, TypeError):
            ev = {"ev": "recv", "rx": a.unit, "bad": msg.topic, "t": time.time()}
        with lock:
            print(json.dumps(ev), flush=True)

    c = _client(f"{a.client_id}-{a.unit}", a.version)
    c.max_queued_messages_set(0)
    c.on_connect = lambda cl, ud, f, rc, p=None: cl.subscribe(f"c2/orders/{a.unit}", qos=a.qos)
    c.on_message = on_message
    c.connect_async(a.host, a.port, keepalive=a.keepalive)
    c.loop_start()
    for m in lines:
        time.sleep(max(0.0, a.start + m["t"] - time.time()))
        now = time.time()
        body = json.dumps({"id": m["id"], "from": m["from"], "to": m["to"], "ts": now, "text": m["text"]})
        c.publish(f"c2/orders/{m['to']}", body, qos=a.qos)
        with lock:
            print(json.dumps({"ev": "sent", "id": m["id"], "from": m["from"], "to": m["to"], "t": now}), flush=True)
    time.sleep(max(0.0, a.start + a.linger - time.time()))
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m c2dtn.perf.mqtt_clients")
    ap.add_argument("mode", choices=["pub", "sub", "units", "script"])
    ap.add_argument("--unit", default="", help="script: this unit's name")
    ap.add_argument("--script", default="", help="script: the JSON message script")
    ap.add_argument("--start", type=float, default=0.0, help="script: epoch second the script's times count from")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--topic", default="#")
    ap.add_argument("--nation", default="NOR")
    ap.add_argument("--units", type=int, default=8)
    ap.add_argument("--period", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--subscribe", default="", help="units: every unit also subscribes to this filter")
    ap.add_argument("--observers", type=int, default=0, help="units: only the first N subscribe (0: all)")
    ap.add_argument("--linger", type=float, default=0.0, help="units: seconds to keep receiving after publishing")
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
    ap.add_argument("--props", default="", help="MQTT 5 publish properties as JSON")
    ap.add_argument("--will-topic", default="")
    ap.add_argument("--will-payload", default="gone")
    ap.add_argument("--die", action="store_true", help="end without DISCONNECT")
    a = ap.parse_args(argv)
    {"pub": pub, "sub": sub, "units": units, "script": script}[a.mode](a)


if __name__ == "__main__":
    main()
