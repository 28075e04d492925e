"""Cost as units grow: fmn-4nations with 8, 32, 100 and 200 units per nation, each reporting
every 10 s, through c2dtn gateways and through Mosquitto bridges on the same links.

Per size and mode, one `perf bft` run (perf/bft.py's run_mode: the same set-up, clients and
figures) with two differences that keep 800 units within a 2-core machine: only the first
`observers` units of each nation subscribe (every unit publishes; the reports cross each
nation's uplink once whoever subscribes on the far LANs, so the link figures do not change),
and no capture is taken.

Figures per size and mode: age of information p95 (at the observers) against the
round-robin floor (units x bytes per report / the uplink's rate, plus the period: the age a
unit's newest position has when every unit's report goes out in turn at `floor_bytes` a
report), uplink bytes per report sent, link bytes per unit per minute, reports not
delivered, and the nation's gateway box's CPU (share of one core) and resident memory,
each also per unit. The box is what a nation runs besides its units: the broker, and for
the overlay the node and its BPA.

Writes results/<time>-scale/: summary.json, summary.csv, report.md, scale.png (AoI p95 and
the floor against units) and cost.png (link bytes, CPU and memory per unit), each with the
data it draws beside it.
"""

from __future__ import annotations

import csv
import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from c2dtn.perf import bft
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir

SIZES = (8, 32, 100, 200)
NATIONS = 4  # fmn-4nations
RATIO_GOAL = 1.5  # the overlay's AoI p95 within this many floors


@dataclass
class ScalePlan:
    sizes: tuple[int, ...] = SIZES
    period: float = 10.0
    duration: float = 120.0
    drain: float = 30.0
    profile: str = "cnr-tactical-2"
    seed: int = 7
    observers: int = 2
    floor_bytes: int = 100  # a report's share of the uplink in the floor (the issue's goal per report)
    modes: tuple[str, ...] = bft.MODES
    agents: dict[str, str] = field(default_factory=dict)


def floor_s(units: int, report_bytes: float, rate_bps: float, period: float) -> float:
    """The age of a unit's newest position when the uplink sends every unit's report in turn:
    one turn of the queue plus the period."""
    return units * report_bytes * 8 / rate_bps + period


def row_of(plan: ScalePlan, units: int, mode: str, s: dict, info: dict) -> dict:
    rate = info["link_bps"] / NATIONS  # each nation's uplink
    run_s = info["run_s"]
    total = units * NATIONS
    fl = floor_s(units, plan.floor_bytes, rate, plan.period)
    box = info.get("box") or {}
    cpu_share = box.get("cpu_s", 0.0) / run_s / NATIONS if run_s else None
    rss = box.get("rss_bytes", 0) / NATIONS
    return {
        "units": units,
        "mode": mode,
        "sent": s["sent"],
        "expected": s["expected"],
        "delivered": s["delivered"],
        "superseded": s["superseded"],
        "lost": s["lost"],
        "lost_pct": s["lost_pct"],
        "aoi_p95_s": s["aoi_p95_s"],
        "aoi_mean_s": s["aoi_mean_s"],
        "floor_s": fl,
        "aoi_over_floor": s["aoi_p95_s"] / fl if s["aoi_p95_s"] is not None else None,
        "uplink_bytes_per_report": s["uplink_bytes_per_report"],
        "link_bytes_per_unit_min": info["link_bytes"] / total / (run_s / 60) if run_s else None,
        "box_cpu_share": cpu_share,
        "box_cpu_ms_per_unit_s": cpu_share * 1000 / units if cpu_share is not None else None,
        "box_rss_mb": rss / 1e6,
        "box_rss_kb_per_unit": None,  # per unit added: against the smallest size (marginal)
        "run_s": run_s,
    }


def marginal_memory(rows: list[dict]) -> None:
    """Each row's box memory per unit added since the smallest size of its mode (the fixed
    cost of a box, tens of MB, would swamp a per-unit figure at small sizes)."""
    for r in rows:
        base = min((x for x in rows if x["mode"] == r["mode"]), key=lambda x: x["units"])
        if r["units"] > base["units"]:
            r["box_rss_kb_per_unit"] = (r["box_rss_mb"] - base["box_rss_mb"]) * 1e3 / (r["units"] - base["units"])


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


FIGURES = [
    ("reports sent", lambda r: f"{r['sent']:,}"),
    ("deliveries due (observers in other nations x reports)", lambda r: f"{r['expected']:,}"),
    ("delivered", lambda r: f"{r['delivered']:,}"),
    ("superseded (a newer report of the unit delivered instead)", lambda r: _f(r["superseded"], ",")),
    ("not delivered by the end of the drain (of deliveries due)", lambda r: f"{r['lost']:,} ({r['lost_pct']:.1f} %)"),
    ("AoI p95", lambda r: _f(r["aoi_p95_s"], ".1f") + " s"),
    ("round-robin floor", lambda r: f"{r['floor_s']:.1f} s"),
    ("AoI p95 / floor", lambda r: _f(r["aoi_over_floor"], ".2f")),
    ("uplink bytes per report sent", lambda r: _f(r["uplink_bytes_per_report"], ".0f")),
    ("link bytes per unit per minute", lambda r: _f(r["link_bytes_per_unit_min"], ",.0f")),
    ("box CPU, share of a core", lambda r: _f(r["box_cpu_share"], ".3f")),
    ("  per unit, ms each second", lambda r: _f(r["box_cpu_ms_per_unit_s"], ".2f")),
    ("box memory (RSS) at the end, MB", lambda r: f"{r['box_rss_mb']:.1f}"),
    ("  per unit added since the smallest size, kB", lambda r: _f(r["box_rss_kb_per_unit"], ".0f")),
]


def report(out: Path, plan: ScalePlan, rows: list[dict]) -> list[str]:
    marginal_memory(rows)
    cols = [(r["units"], r["mode"]) for r in rows]
    by = {(r["units"], r["mode"]): r for r in rows}
    md = [
        f"# Cost as units grow: fmn-4nations, a report every {plan.period:g} s, links {plan.profile}",
        "",
        f"{plan.duration:g} s of reports per run (drain {plan.drain:g} s); {plan.observers} observers per nation; "
        f"floor at {plan.floor_bytes} bytes a report. Box: what one nation runs besides its units (the broker; "
        "for the overlay also the node and its BPA), the mean over the nations. Seed "
        f"{plan.seed}.",
        "",
        "| figure | " + " | ".join(f"{u} units, {m}" for u, m in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for name, fn in FIGURES:
        label = name.replace("  ", "&nbsp;&nbsp;", 1) if name.startswith("  ") else name
        md.append(f"| {label} | " + " | ".join(fn(by[c]) for c in cols) + " |")
    over = [r for r in rows if r["mode"] == "overlay" and r["aoi_over_floor"] is not None]
    if over:
        worst = max(over, key=lambda r: r["aoi_over_floor"])
        verdict = "within" if worst["aoi_over_floor"] <= RATIO_GOAL else "not within"
        md += [
            "",
            f"The overlay is {verdict} {RATIO_GOAL:g}x the floor at every size "
            f"(worst: {worst['aoi_over_floor']:.2f} at {worst['units']} units).",
        ]
    md += ["", "![AoI p95 against the floor](scale.png)", "", "![cost per unit](cost.png)"]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "summary.json").write_text(json.dumps({"plan": asdict(plan), "rows": rows}, indent=1))
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plots(out, plan, rows)
    return md


def plots(out: Path, plan: ScalePlan, rows: list[dict]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sizes = sorted({r["units"] for r in rows})
    for mode, marker in zip(plan.modes, "os^"):
        rs = sorted((r for r in rows if r["mode"] == mode and r["aoi_p95_s"] is not None), key=lambda r: r["units"])
        ax.plot([r["units"] for r in rs], [r["aoi_p95_s"] for r in rs], marker=marker, label=f"{mode}: AoI p95")
    fl = [next(r["floor_s"] for r in rows if r["units"] == u) for u in sizes]
    ax.plot(sizes, fl, color="grey", ls="--", label="round-robin floor")
    ax.plot(sizes, [RATIO_GOAL * f for f in fl], color="grey", ls=":", label=f"{RATIO_GOAL:g} x floor")
    ax.set_xlabel("units per nation")
    ax.set_ylabel("age of information p95 (s)")
    ax.set_title("Age of information as units grow")
    ax.legend(loc="upper left")
    save_figure(fig, out / "scale.png")

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, label in zip(
        axes,
        ("link_bytes_per_unit_min", "box_cpu_ms_per_unit_s", "box_rss_kb_per_unit"),
        ("link bytes per unit per minute", "box CPU per unit (ms each second)", "box RSS per unit added (kB)"),
    ):
        for mode, marker in zip(plan.modes, "os^"):
            rs = sorted((r for r in rows if r["mode"] == mode and r[key] is not None), key=lambda r: r["units"])
            ax.plot([r["units"] for r in rs], [r[key] for r in rs], marker=marker, label=mode)
        ax.set_xlabel("units per nation")
        ax.set_title(label)
        ax.legend(loc="upper right")
    save_figure(fig, out / "cost.png")


def main(plan: ScalePlan, progress=print) -> Path:
    out = run_dir("scale")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for units in plan.sizes:
            for mode in plan.modes:
                progress(f"{units} units per nation, {mode}: starting")
                p = bft.Plan(
                    plan.profile,
                    units,
                    plan.period,
                    plan.duration,
                    None,
                    plan.drain,
                    1,
                    seed=plan.seed,
                    topology="fmn-4nations",
                    agents=plan.agents,
                    observers=plan.observers,
                    capture=False,
                )
                events: list[dict] = []
                info = bft.run_mode(mode, p, Path(td) / f"{units}", events)
                s = bft.summarize(events, mode, info, plan.period)
                rows.append(row_of(plan, units, mode, s, info))
                r = rows[-1]
                progress(
                    f"{units} units, {mode}: AoI p95 {_f(r['aoi_p95_s'], '.1f')} s (floor {r['floor_s']:.1f} s), "
                    f"{r['lost']} not delivered"
                )
                report(out, plan, rows)  # what is done so far, should a later size fail
    for line in report(out, plan, rows):
        progress(line)
    progress(f"results in {out}")
    return out
