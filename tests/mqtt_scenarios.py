"""MQTT behaviours a client sees, run with paho-mqtt against one broker address:
`python tests/mqtt_scenarios.py HOST PORT PREFIX VERSION` prints one JSON line per scenario
with what the clients observed, normalised so that a broker and a gateway in front of a
broker of the same kind can be compared line by line (tests/test_conformance_mqtt.py).

The scenarios follow the Eclipse Paho interoperability client tests (paho.mqtt.testing,
`client_test5.py` and `client_test.py`: basic, retained messages, will, QoS downgrade,
offline messages, unsubscribe, subscribe options, user properties, payload format), which
are on no package registry these machines reach; each is written here against paho-mqtt's
client, one process per run, every wait bounded.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WAIT_S = 20.0


class Client:
    def __init__(self, host: str, port: int, cid: str, v5: bool, clean: bool = True, will=None, expiry: int = 0):
        self.v5 = v5
        self.got: list[dict] = []
        self.cond = threading.Condition()
        self.granted: list = []
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=cid,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            **({} if v5 else {"clean_session": clean}),
        )
        self.c.on_message = self._message
        self.c.on_subscribe = self._subscribed
        if will:
            self.c.will_set(*will)
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = expiry
        self.connected = threading.Event()
        self.present = None
        self.c.on_connect = self._connected
        kw = {"clean_start": clean, "properties": props} if v5 else {}
        self.c.connect(host, port, keepalive=30, **kw)
        self.c.loop_start()
        if not self.connected.wait(WAIT_S):
            raise RuntimeError(f"{cid}: no CONNACK")

    def _connected(self, _c, _u, flags, reason, _p):
        self.present = bool(flags.session_present)
        self.connected.set()

    def _subscribed(self, _c, _u, _mid, reasons, _p):
        with self.cond:
            self.granted.append([r.value if hasattr(r, "value") else int(r) for r in reasons])
            self.cond.notify_all()

    def _message(self, _c, _u, msg):
        row = {"t": msg.topic, "p": msg.payload.decode(errors="replace"), "q": msg.qos, "r": int(msg.retain)}
        if self.v5 and msg.properties is not None:
            pr = msg.properties
            for name in ("UserProperty", "PayloadFormatIndicator", "ContentType", "ResponseTopic"):
                if hasattr(pr, name):
                    row[name] = getattr(pr, name)
            if hasattr(pr, "CorrelationData"):
                row["CorrelationData"] = pr.CorrelationData.hex()
        with self.cond:
            self.got.append(row)
            self.cond.notify_all()

    def subscribe(self, topics, **kw) -> list:
        with self.cond:
            n = len(self.granted)
        self.c.subscribe(topics, **kw)
        with self.cond:
            self.cond.wait_for(lambda: len(self.granted) > n, WAIT_S)
            return self.granted[n] if len(self.granted) > n else ["no SUBACK"]

    def wait(self, n: int, quiet_s: float = 1.5) -> list[dict]:
        """Messages until `n` came (then `quiet_s` more for extras), or WAIT_S."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.got) >= n, WAIT_S)
        time.sleep(quiet_s)
        with self.cond:
            return list(self.got)

    def publish(self, topic, payload, qos=0, retain=False, props=None) -> None:
        info = self.c.publish(topic, payload, qos, retain, properties=props)
        if qos:
            info.wait_for_publish(WAIT_S)

    def close(self, clean: bool = True) -> None:
        if clean:
            self.c.disconnect()
        else:
            self.c._sock_close()  # no DISCONNECT: the will goes
        self.c.loop_stop()


def sort(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def scenarios(host: str, port: int, pre: str, v5: bool) -> dict:
    out: dict = {}
    cid = f"c2conf-{pre.strip('/').replace('/', '-')}"

    # basic: QoS 0, 1, 2 to a QoS 2 subscription, each at its own QoS
    s = Client(host, port, cid + "-s", v5)
    out["basic granted"] = s.subscribe(f"{pre}basic/#", qos=2)
    p = Client(host, port, cid + "-p", v5)
    for q in (0, 1, 2):
        p.publish(f"{pre}basic/{q}", f"qos {q}", q)
    out["basic"] = sort(s.wait(3))
    # QoS downgrade: a QoS 1 subscription gets QoS 2 publications at 1, QoS 0 at 0
    s1 = Client(host, port, cid + "-s1", v5)
    out["downgrade granted"] = s1.subscribe(f"{pre}down/#", qos=1)
    for q in (0, 1, 2):
        p.publish(f"{pre}down/{q}", f"d{q}", q)
    out["downgrade"] = sort(s1.wait(3))
    s1.close()
    # retained: three retained messages reach a later subscriber flagged retained; cleared ones do not
    for q in (0, 1, 2):
        p.publish(f"{pre}ret/{q}", f"r{q}", q, retain=True)
    time.sleep(1.0)
    r = Client(host, port, cid + "-r", v5)
    r.subscribe(f"{pre}ret/#", qos=2)
    out["retained"] = sort(r.wait(3))
    r.close()
    for q in (0, 1, 2):
        p.publish(f"{pre}ret/{q}", b"", 1, retain=True)
    time.sleep(1.0)
    r = Client(host, port, cid + "-r2", v5)
    r.subscribe(f"{pre}ret/#", qos=2)
    out["retained cleared"] = sort(r.wait(0, quiet_s=3.0))
    r.close()
    # unsubscribe: nothing more arrives
    s.c.unsubscribe(f"{pre}basic/#")
    time.sleep(1.5)
    p.publish(f"{pre}basic/after", "after unsubscribe", 1)
    out["unsubscribed"] = [x for x in s.wait(4, quiet_s=2.0) if x["t"].endswith("after")]
    s.close()
    # will: a client gone without DISCONNECT has its will published
    w = Client(host, port, cid + "-ws", v5)
    w.subscribe(f"{pre}will", qos=1)
    gone = Client(host, port, cid + "-w", v5, will=(f"{pre}will", "client died", 1, False))
    gone.close(clean=False)
    out["will"] = sort(w.wait(1))
    w.close()
    # offline messages: a persistent session gets QoS 1/2 messages published while it was away
    o = Client(host, port, cid + "-o", v5, clean=False, expiry=300)
    o.subscribe(f"{pre}off/#", qos=2)
    o.close()
    time.sleep(1.0)
    for q in (0, 1, 2):
        p.publish(f"{pre}off/{q}", f"o{q}", q)
    time.sleep(2.0)
    o = Client(host, port, cid + "-o", v5, clean=False, expiry=300)
    out["offline session present"] = o.present
    out["offline"] = sort([x for x in o.wait(2) if x["q"]])  # QoS 0 may or may not be queued
    o.close()
    o = Client(host, port, cid + "-o", v5, clean=True)  # clean up the session
    o.close()
    if v5:
        # user properties, payload format, content type, response topic, correlation data pass as sent
        u = Client(host, port, cid + "-u", v5)
        u.subscribe(f"{pre}props", qos=1)
        pr = Properties(PacketTypes.PUBLISH)
        pr.UserProperty = [("a", "2"), ("c", "3"), ("a", "1")]
        pr.PayloadFormatIndicator = 1
        pr.ContentType = "text/plain"
        pr.ResponseTopic = f"{pre}reply"
        pr.CorrelationData = b"\x01\x02"
        p.publish(f"{pre}props", "with properties", 1, props=pr)
        out["properties"] = u.wait(1)
        u.close()
        # subscribe options: no local, retain as published
        from paho.mqtt.subscribeoptions import SubscribeOptions

        n = Client(host, port, cid + "-n", v5)
        n.subscribe(
            [
                (f"{pre}nl", SubscribeOptions(qos=1, noLocal=True)),
                (f"{pre}rap", SubscribeOptions(qos=1, retainAsPublished=True)),
            ]
        )
        n.publish(f"{pre}nl", "own", 1)
        p.publish(f"{pre}nl", "other", 1)
        p.publish(f"{pre}rap", "kept flag", 1, retain=True)
        out["subscribe options"] = sort(n.wait(2))
        n.close()
        p.publish(f"{pre}rap", b"", 1, retain=True)
    p.close()
    return out


def main() -> None:
    host, port, pre, version = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    print(json.dumps(scenarios(host, port, pre, version == 5), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
