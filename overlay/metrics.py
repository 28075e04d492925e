"""The Prometheus endpoint ([metrics] listen): GET /metrics answers the text format, built at
each scrape from what `c2dtn node status` shows (node_api.local_status), so that both say the
same.  `families` is I/O-free (status in, metric families out); `MetricsServer` is the aiohttp
shell.  The names and what each means: docs/operations.md."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE

log = logging.getLogger("c2dtn.metrics")

P = "c2dtn_"
NAME = re.compile(r"[a-z][a-z0-9_]*")  # a counter's name as part of a metric's
REASON = re.compile(r"[a-z][a-z0-9_-]*")  # a refusal's reason as a label value
# the custody store's own counters, kept on disk since the store was made
STORE_COUNTERS = {
    "accepted": "envelopes taken into custody from applications",
    "sent": "data envelopes handed to the agent (copies included)",
    "acked": "envelopes released by their destination's ack",
    "delivered": "envelopes received and put in the inbox",
    "expired": "envelopes whose lifetime ended before an ack",
    "superseded": "envelopes replaced by a newer one with their key",
    "duplicates": "envelopes received again and dropped",
    "received_expired": "envelopes that arrived past their lifetime",
    "received_stale": "envelopes that arrived after a newer one of their key",
    "gaps_skipped": "gaps in a class's order given up on",
    "repeats_skipped": "resent MQTT publishes recognised and not taken twice",
    "held_place_taken": "held places taken by a late envelope",
    "acks_not_theirs": "ack entries for envelopes the acking peer was not sent",
    "acks_from_a_group": "acks that named a group as their sender",
    "acks_other_incarnation": "acks for another incarnation of this store",
    "bundles_sent": "bundles the overlay planned for the agent",
    "bundles_received": "bundles the agent delivered to the overlay",
    "fast_retransmits": "envelopes an ack showed lost (sent again before their timer)",
    "tail_probes": "tail loss probes sent",
    "tail_copies": "last bundles of a burst sent twice (a frame lost there has no later one to show it)",
    "next_copies": "new envelopes sent again in the next bundle to their destination (a lossy radio, time to spare)",
    "heard_gaps": "answers to an announced send number that found envelopes lost (sent again at once)",
    "announcements_too_old": "announced send numbers refused as made over a minute before, by this clock",
    "pings_unanswered": "pings not answered",
}
ENVELOPE_EVENTS = {
    "submitted": "envelopes taken into custody for this peer",
    "acked": "envelopes this peer acked as taken by its application (custody released)",
    "expired": "envelopes for this peer whose lifetime ended before its ack",
    "superseded": "envelopes for this peer replaced by a newer one with their key",
    "received": "envelopes received from this peer into the inbox",
}
REFUSED = {"refused_quota": "quota", "refused_too_large": "too_large"}


def _histogram(name: str, doc: str, snap: dict) -> HistogramMetricFamily:
    h = HistogramMetricFamily(name, doc)
    h.add_metric([], [(str(le), n) for le, n in snap["buckets"]], snap["sum"])
    return h


def _counters(prefix: str, what: str, counters: dict) -> Iterator[Metric]:
    for k, v in sorted(counters.items()):
        if NAME.fullmatch(k) and isinstance(v, int):
            yield CounterMetricFamily(f"{prefix}{k}", f"{what}: {k.replace('_', ' ')}", value=v)


def families(st: dict) -> Iterator[Metric]:
    """The metric families of one status (node_api.local_status)."""
    info = GaugeMetricFamily(P + "node_info", "This node's id and agent", labels=["node", "agent"])
    info.add_metric([st["node"], st["agent"]], 1)
    yield info
    yield GaugeMetricFamily(P + "uptime_seconds", "Since the node process started", value=st["uptime_s"])
    if st.get("agent_up") is not None:
        yield GaugeMetricFamily(P + "agent_up", "1 while the agent's process runs", value=int(st["agent_up"]))
    yield CounterMetricFamily(P + "agent_restarts", "Restarts of the agent by the node", value=st["agent_restarts"])
    yield CounterMetricFamily(P + "agent_send_errors", "Bundles the agent refused", value=st["send_errors"])
    b = st.get("bundles") or {}
    for d, what in (("to", "handed to the agent"), ("from", "the agent delivered")) if b else ():
        yield CounterMetricFamily(f"{P}bundles_{d}_agent", f"Bundles {what}", value=b[f"{d}_agent"])
        yield CounterMetricFamily(
            f"{P}bundle_bytes_{d}_agent",
            f"Payload bytes of the bundles {what}",
            value=b[f"{d}_agent_bytes"],
        )
    if "udphc" in st:
        u = st["udphc"]
        sent = CounterMetricFamily(P + "udphc_frames_sent", "Datagrams the udphc link sent on the air", labels=["form"])
        sent.add_metric(["compressed"], u["sent_compressed"])
        sent.add_metric(["whole"], u["sent"] - u["sent_compressed"])
        yield sent
        yield CounterMetricFamily(
            P + "udphc_bytes_saved", "Bytes udphc's compression kept off the air", value=u["sent_bytes_saved"]
        )
        yield CounterMetricFamily(
            P + "udphc_frames_received", "Frames from the air handed to the agent", value=u["received"]
        )
        yield CounterMetricFamily(
            P + "udphc_frames_refused", "Frames from the air refused as damaged or malformed", value=u["refused"]
        )
        yield CounterMetricFamily(
            P + "udphc_datagrams_dropped", "Datagrams the kernel would not take at once, either way", value=u["dropped"]
        )
    if "fsync" in st:
        f = st["fsync"]
        yield CounterMetricFamily(P + "fsyncs", "Custody fsyncs", value=f["fsyncs"])
        yield CounterMetricFamily(P + "fsync_failures", "Custody fsyncs that failed", value=f["failures"])
        yield CounterMetricFamily(P + "custody_commits", "Custody store commits", value=f["commits"])
        yield GaugeMetricFamily(P + "fsync_max_seconds", "The longest custody fsync", value=f["max_ms"] / 1000)
    if "counters" in st:
        for k, doc in STORE_COUNTERS.items():
            v = st["counters"].get(k, 0)
            yield CounterMetricFamily(f"{P}store_{k}", f"Since the custody store was made: {doc}", value=v)
        rej = CounterMetricFamily(
            P + "store_rejected",
            "Since the custody store was made: bundle items refused, by reason",
            labels=["reason"],
        )
        for k, v in sorted(st["counters"].items()):
            reason = k.removeprefix("rejected:")
            if reason != k and REASON.fullmatch(reason):
                rej.add_metric([reason], v)
        yield rej
    if "custody" in st:
        c = st["custody"]
        yield GaugeMetricFamily(P + "custody_envelopes", "Envelopes held in custody", value=c["envelopes"])
        yield GaugeMetricFamily(P + "custody_bytes", "Bytes of messages held in custody", value=c["bytes"])
        yield GaugeMetricFamily(P + "custody_quota_envelopes", "The quota of envelopes", value=c["max_envelopes"])
        yield GaugeMetricFamily(P + "custody_quota_bytes", "The quota of bytes", value=c["max_bytes"])
    if "queues" in st:
        q = GaugeMetricFamily(
            P + "queue_envelopes", "Envelopes held per peer, class and state", labels=["peer", "class", "state"]
        )
        qb = GaugeMetricFamily(P + "queue_bytes", "Bytes held per peer and class", labels=["peer", "class"])
        for r in st["queues"]:
            q.add_metric([r["dst"], r["priority"], "queued"], r["queued"])
            q.add_metric([r["dst"], r["priority"], "in_flight"], r["in_flight"])
            qb.add_metric([r["dst"], r["priority"]], r["bytes"])
        yield q
        yield qb
    if "envelopes" in st:
        fams = {
            e: CounterMetricFamily(f"{P}envelopes_{e}", f"Since the process started: {doc}", labels=["peer", "class"])
            for e, doc in ENVELOPE_EVENTS.items()
        }
        refused = CounterMetricFamily(
            P + "envelopes_refused",
            "Since the process started: envelopes for this peer refused before custody took them",
            labels=["peer", "class", "reason"],
        )
        for r in st["envelopes"]:
            for e, fam in fams.items():
                if e in r:
                    fam.add_metric([r["peer"], r["priority"]], r[e])
            for e, reason in REFUSED.items():
                if e in r:
                    refused.add_metric([r["peer"], r["priority"], reason], r[e])
        yield from fams.values()
        yield refused
    if "received_delay_s" in st:
        yield _histogram(
            P + "received_delay_seconds",
            "From an envelope's creation at its origin (the origin's clock) to its arrival here",
            st["received_delay_s"],
        )
    if "resent" in st:
        rs = CounterMetricFamily(
            P + "resent_envelopes", "Envelopes sent again, per peer, class and cause", labels=["peer", "class", "cause"]
        )
        for r in st["resent"]:
            rs.add_metric([r["dst"], r["priority"], r["cause"]], r["envelopes"])
        yield rs
    if "windows" in st:
        paths = {
            "window_bytes": ("window", 1, "The sending window"),
            "ssthresh_bytes": ("ssthresh", 1, "The slow-start threshold"),
            "srtt_seconds": ("srtt_ms", 1000, "The smoothed round trip"),
            "min_rtt_seconds": ("min_rtt_ms", 1000, "The minimum round trip measured"),
            "rto_seconds": ("rto_ms", 1000, "The retransmission timeout"),
        }
        for name, (key, div, doc) in paths.items():
            g = GaugeMetricFamily(f"{P}path_{name}", f"{doc}, per peer", labels=["peer"])
            for peer, w in st["windows"].items():
                if w.get(key) is not None:
                    g.add_metric([peer], w[key] / div)
            yield g
    if "inbox" in st:
        yield GaugeMetricFamily(P + "inbox_envelopes", "Envelopes received, not yet taken", value=st["inbox"])
    if "mqtt" in st:
        mq = st["mqtt"]
        yield GaugeMetricFamily(P + "mqtt_clients", "MQTT clients connected", value=len(mq.get("clients", [])))
        yield GaugeMetricFamily(P + "mqtt_sessions_near", "MQTT sessions kept here", value=mq.get("sessions_near", 0))
        far = mq.get("sessions_far", {})
        yield GaugeMetricFamily(
            P + "mqtt_sessions_far", "Sessions held with the broker for far clients", value=len(far)
        )
        yield GaugeMetricFamily(
            P + "mqtt_sessions_far_connected",
            "Of them, connected to the broker",
            value=sum(1 for f in far.values() if f.get("connected")),
        )
        yield from _counters(P + "mqtt_", "MQTT gateway", mq.get("counters", {}))
        if "puback_s" in mq:
            yield _histogram(
                P + "mqtt_puback_latency_seconds",
                "From a PUBLISH read to its PUBACK or PUBREC written, for those taken into custody",
                mq["puback_s"],
            )
    if "relay" in st:
        r = st["relay"]
        held = GaugeMetricFamily(
            P + "relay_held_bundles", "Bundles the relay holds for an island's agent", labels=["island"]
        )
        for island, n in sorted(r["held"].items()):
            held.add_metric([island], n)
        yield held
        yield GaugeMetricFamily(P + "relay_held_bytes", "Bytes the relay holds", value=r["held_bytes"])
        yield GaugeMetricFamily(P + "relay_max_bytes", "What the relay holds at most", value=r["max_bytes"])
        up = GaugeMetricFamily(P + "relay_agent_up", "1 while an island's agent runs", labels=["island"])
        for island, ok in sorted(r["agents_up"].items()):
            up.add_metric([island], int(ok))
        yield up
        yield from _counters(P + "relay_", "Relay", r["counters"])
    if "coap" in st:
        co = st["coap"]
        for k in ("pending_responses", "replaying", "observing"):
            yield GaugeMetricFamily(f"{P}coap_{k}", f"CoAP gateway: {k.replace('_', ' ')}", value=co.get(k, 0))
        yield from _counters(P + "coap_", "CoAP gateway", co.get("counters", {}))


class _Collector:
    def __init__(self, status: Callable[[], dict]):
        self.status = status

    def collect(self) -> Iterator[Metric]:
        return families(self.status())


MAX_CONNECTIONS = 8  # scrapes at once; more are closed at once (a scraper needs one)
REQUEST_MAX_BYTES = 8192  # a request line and headers; a scrape has no body
REQUEST_TIMEOUT_S = 5.0  # to send them
CACHE_S = 1.0  # a scrape within this of the last is answered with its text


class MetricsServer:
    """GET /metrics on (host, port), the status read at most once a CACHE_S.  It answers the
    text format version 0.0.4, which every Prometheus 2 scrapes (Debian 12's is 2.42).

    A minimal HTTP/1.1 responder on asyncio streams rather than aiohttp's server, which bounds
    neither the connections it holds open nor how long a client may take to send its headers:
    whoever reaches the port could hold the node's file descriptors (custody's among them) or
    its memory.  Here a connection gets REQUEST_TIMEOUT_S and REQUEST_MAX_BYTES for its
    request, one answer, and is closed; at most MAX_CONNECTIONS are open."""

    def __init__(self, listen: tuple[str, int], status: Callable[[], dict]):
        self.listen = listen
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(status))
        self.server: asyncio.Server | None = None
        self.open = 0
        self.refused = 0  # connections closed unanswered, over MAX_CONNECTIONS
        self._text: bytes = b""
        self._at = -CACHE_S

    def scrape(self) -> bytes:
        now = time.monotonic()
        if now - self._at >= CACHE_S:
            self._text, self._at = generate_latest(self.registry), now
        return self._text

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            self.refused += 1
            writer.transport.abort()
            return
        self.open += 1
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].split(b" ")
            if len(line) != 3 or not line[2].startswith(b"HTTP/1."):
                status, body, ctype = "400 Bad Request", b"bad request\n", "text/plain"
            elif line[0] not in (b"GET", b"HEAD"):
                status, body, ctype = "405 Method Not Allowed", b"GET /metrics only\n", "text/plain"
            elif line[1].split(b"?", 1)[0] != b"/metrics":
                status, body, ctype = "404 Not Found", b"GET /metrics only\n", "text/plain"
            else:
                status, body, ctype = "200 OK", self.scrape(), CONTENT_TYPE
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + (body if line[0] != b"HEAD" else b"")
            )
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # too slow, too large or gone: closed unanswered
        finally:
            self.open -= 1
            writer.close()

    async def start(self) -> None:
        host, port = self.listen
        self.server = await asyncio.start_server(self._serve, host, port, limit=REQUEST_MAX_BYTES, backlog=16)
        log.info("metrics on http://%s:%d/metrics", host if ":" not in host else f"[{host}]", port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
