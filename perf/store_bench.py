"""What the custody store costs as its backlog grows (`c2dtn perf store`).

A gateway cut off for an hour holds every message of that hour; what each new
message then costs decides how many a second it can still take.  For each fill
(default 10^4, 10^5, 10^6 envelopes of 120 bytes queued for 4 destinations, 1 %
of them in flight) this fills a fresh store in batches, then measures, each on the
store as it is at that fill:

  submit          1,000 single durable submits (the path of one QoS 1 PUBACK): p50, p99
  plan queries    what the scheduler asks on every plan (next expiry, next retry, due
                  retries, bytes in flight, destinations, the queue of one destination,
                  its floor): median of 200 calls each, and their sum
  receive         1,000 envelopes taken by a receiver whose store holds the same number
                  of ids seen and envelopes not yet consumed (the origin told it has them):
                  p50, p99; and its per-plan question (acks owed)
  RSS             of this process after the fill (the store's page cache included)
  file size       database + WAL
  reopen          close and open again, until the first queue read answers

and lists the statements whose query plan scans a whole table (EXPLAIN QUERY PLAN).
Writes results/<time>-store/ with summary.json, report.md and plot.png (+ .json).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from c2dtn.overlay.custody import CustodyStore, Quota
from c2dtn.overlay.envelope import Envelope, Kind, Priority
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import progress, run_dir

DSTS = ["gw2", "gw3", "gw4", "gw5"]
BODY = 120
BATCH = 10_000
# (name, call) of what Scheduler.plan asks the store on every plan
PLAN_QUERIES = [
    ("next_expiry_ms", lambda st, now: st.next_expiry_ms()),
    ("next_retry_ms", lambda st, now: st.next_retry_ms()),
    ("due_retries", lambda st, now: st.due_retries(now)),
    ("inflight_bytes", lambda st, now: st.inflight_bytes()),
    ("destinations", lambda st, now: st.destinations()),
    ("queued(dst, 64)", lambda st, now: st.queued("gw4", 64)),
    ("floor(dst, class)", lambda st, now: st.floor("gw4", int(Priority.ROUTINE))),
]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fill(st: CustodyStore, n: int, now: int, progress) -> None:
    body = os.urandom(BODY)
    done = 0
    while done < n:
        k = min(BATCH, n - done)
        st.submit_many(
            [(DSTS[(done + i) % len(DSTS)], body, 7 * 86400_000, Priority.ROUTINE, None, "bench") for i in range(k)],
            now,
        )
        done += k
        progress(done)
    # 1 % in flight, due for a retry in an hour (what an outage leaves behind)
    for dst in DSTS:
        items = st.queued(dst, max(1, n // 100 // len(DSTS)))
        st.mark_sent([it.seq for it in items], now, {it.seq: now + 3600_000 for it in items})


def _receiver_fill(st: CustodyStore, n: int, now: int, progress) -> int:
    body = os.urandom(BODY)
    seq = 0
    while seq < n:
        first = seq + 1
        with st.transaction():  # one commit per batch
            for _ in range(min(BATCH, n - seq)):
                seq += 1
                st.receive(
                    Envelope(
                        Kind.DATA, "gw1", seq, "gw4", now, 7 * 86400_000, Priority.ROUTINE, None, body, "bench", 0, 0
                    ),
                    now,
                )
        st.acks_sent("gw1", [], range(first, seq + 1))  # told the origin, as each plan does
        progress(n + seq)
    return seq


def scans(st: CustodyStore, calls) -> list[str]:
    """Statements that the given calls run (the plan's questions, the receiver's), as SQLite
    saw them, whose query plan scans a whole table."""
    seen: dict[str, str] = {}  # statement -> the call that ran it
    for name, call in calls:
        st.db.set_trace_callback(lambda q, name=name: seen.setdefault(q, name))
        try:
            call()
        finally:
            st.db.set_trace_callback(None)
    out = []
    for q, name in seen.items():
        if not q.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE", "INSERT")):
            continue
        plan = " / ".join(r[-1] for r in st.db.execute("EXPLAIN QUERY PLAN " + q).fetchall())
        if "SCAN" in plan and "USING" not in plan.split("SCAN", 1)[1][:60]:
            out.append(f"{name}: {plan}")
    return out


def measure(n: int, workdir: Path, progress=lambda done: None) -> dict:
    now = 1_700_000_000_000
    path = workdir / f"send-{n}.db"
    st = CustodyStore(path, "gw1", Quota(max_envelopes=4 * n + 10_000, max_bytes=1 << 40))
    _fill(st, n, now, progress)
    body = os.urandom(BODY)
    sub = []
    for i in range(1000):
        t0 = time.perf_counter()
        st.submit(DSTS[i % 4], body, now + i, 7 * 86400_000, Priority.ROUTINE, None, "bench")
        sub.append((time.perf_counter() - t0) * 1000)
    plan = {}
    for name, call in PLAN_QUERIES:
        ts = []
        for _ in range(200):
            t0 = time.perf_counter()
            call(st, now + 2000)
            ts.append((time.perf_counter() - t0) * 1000)
        plan[name] = statistics.median(ts)
    scanning = scans(st, [(name, lambda call=call: call(st, now + 2000)) for name, call in PLAN_QUERIES])
    rss = _rss_mb()
    st.close()
    size = sum(p.stat().st_size for p in workdir.glob(f"send-{n}.db*"))
    t0 = time.perf_counter()
    st = CustodyStore(path, "gw1", Quota(max_envelopes=4 * n + 10_000, max_bytes=1 << 40))
    st.queued("gw4", 64)
    reopen = (time.perf_counter() - t0) * 1000
    st.close()

    rst = CustodyStore(workdir / f"recv-{n}.db", "gw4", Quota(max_envelopes=4 * n + 10_000, max_bytes=1 << 40))
    last = _receiver_fill(rst, n, now, progress)
    rcv = []
    for i in range(1000):
        env = Envelope(
            Kind.DATA, "gw1", last + 1 + i, "gw4", now, 7 * 86400_000, Priority.ROUTINE, None, body, "bench", 0, 0
        )
        t0 = time.perf_counter()
        rst.receive(env, now)
        rcv.append((time.perf_counter() - t0) * 1000)
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        rst.pending_acks()
        ts.append((time.perf_counter() - t0) * 1000)
    acks_owed = statistics.median(ts)
    scanning += scans(rst, [("acks owed", rst.pending_acks)])
    rst.close()
    for p in workdir.glob("*.db*"):
        p.unlink()
    return {
        "envelopes": n,
        "submit_p50_ms": statistics.median(sub),
        "submit_p99_ms": _pct(sub, 0.99),
        "plan_ms": plan,
        "plan_total_ms": sum(plan.values()),
        "receive_p50_ms": statistics.median(rcv),
        "receive_p99_ms": _pct(rcv, 0.99),
        "acks_owed_ms": acks_owed,
        "rss_mb": rss,
        "file_mb": size / 1e6,
        "reopen_ms": reopen,
        "full_scans": scanning,
    }


COLS = [
    "envelopes held",
    "submit p50",
    "submit p99",
    "plan queries",
    "receive p50",
    "receive p99",
    "acks owed",
    "RSS",
    "file",
    "reopen",
]


def cells(r: dict) -> list[str]:
    return [
        f"{r['envelopes']:,}",
        f"{r['submit_p50_ms']:.2f} ms",
        f"{r['submit_p99_ms']:.2f} ms",
        f"{r['plan_total_ms']:.2f} ms",
        f"{r['receive_p50_ms']:.2f} ms",
        f"{r['receive_p99_ms']:.2f} ms",
        f"{r['acks_owed_ms']:.2f} ms",
        f"{r['rss_mb']:.0f} MB",
        f"{r['file_mb']:.0f} MB",
        f"{r['reopen_ms']:.0f} ms",
    ]


def report(out: Path, rows: list[dict]) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    md = [
        "# Custody store cost against envelopes held (`c2dtn perf store`)",
        "",
        "| " + " | ".join(COLS) + " |",
        "|" + "---:|" * len(COLS),
    ]
    md += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    md += [
        "",
        "Plan queries, median of 200 calls each (ms):",
        "",
        "| envelopes held | " + " | ".join(n for n, _ in PLAN_QUERIES) + " |",
        "|" + "---:|" * (len(PLAN_QUERIES) + 1),
    ]
    md += [
        f"| {r['envelopes']:,} | " + " | ".join(f"{r['plan_ms'][n]:.3f}" for n, _ in PLAN_QUERIES) + " |" for r in rows
    ]
    md += ["", "Statements that scan a whole table (EXPLAIN QUERY PLAN, at the largest fill):", ""]
    md += [f"- {x}" for x in rows[-1]["full_scans"]] or ["- none"]
    md += ["", "![cost against envelopes held](plot.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [r["envelopes"] for r in rows]
    for key, label in (
        ("submit_p50_ms", "submit p50"),
        ("submit_p99_ms", "submit p99"),
        ("plan_total_ms", "plan queries (sum)"),
        ("receive_p50_ms", "receive p50"),
    ):
        ax.plot(xs, [r[key] for r in rows], "o-", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("envelopes held")
    ax.set_ylabel("ms")
    ax.set_title("Custody store: cost of one operation against envelopes held")
    ax.legend()
    save_figure(fig, out / "plot.png")
    return "\n".join(md[: len(rows) + 4])


def main(fills: list[int], out: Path | None = None, console=None) -> Path:
    out = out or run_dir("store")
    rows = []
    with tempfile.TemporaryDirectory(prefix="c2store-") as td, progress(console) as bar:
        for n in fills:
            task = bar.add_task(f"{n:,} envelopes: filling and measuring", total=2 * n)
            rows.append(measure(n, Path(td), lambda done, t=task: bar.update(t, completed=done)))
    text = report(out, rows)
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out
