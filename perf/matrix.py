"""`c2dtn perf matrix`: the seed 000 matrix in one command, with a progress bar.

Full: fmn-2nations and fmn-4nations x cnr-tactical-1 and cnr-tactical-2 x a report every
2 s and every 10 s, overlay and mqtt-bridge in each run (8 runs of `perf bft`, each
with its own results folder).  --quick: fmn-4nations at a report every 2 s on both
profiles, 20 s of reports (about 3 minutes; part of `make test`).

Writes results/<time>-matrix/: matrix.json and matrix.csv (one row per run and mode,
pointing at the run's folder), report.md, delivery_vs_loss.png (delivery ratio
against the links' loss rate, a line per topology, period and mode) and aoi.png (age
of information p95 per run and mode).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from c2dtn.perf import bft
from c2dtn.perf.plots import pyplot, save_figure
from c2dtn.perf.runs import run_dir
from c2dtn.topologies.profiles import load_builtin_profiles


@dataclass(frozen=True)
class Cell:
    topology: str
    profile: str
    period: float


def cells(quick: bool) -> list[Cell]:
    if quick:
        return [Cell("fmn-4nations", p, 2.0) for p in ("cnr-tactical-1", "cnr-tactical-2")]
    return [
        Cell(t, p, per)
        for t in ("fmn-2nations", "fmn-4nations")
        for p in ("cnr-tactical-1", "cnr-tactical-2")
        for per in (2.0, 10.0)
    ]


def main(
    quick: bool = False,
    duration: float | None = None,
    drain: float | None = None,
    qos: int = 1,
    modes: tuple[str, ...] = bft.MODES,
) -> Path:
    duration = duration or (20.0 if quick else 60.0)
    drain = drain if drain is not None else (10.0 if quick else 30.0)
    out = run_dir("matrix-quick" if quick else "matrix")
    todo = cells(quick)
    rows: list[dict] = []
    with Progress(
        TextColumn("[bold]matrix[/bold] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} runs"),
        TimeElapsedColumn(),
        console=bft.console,
    ) as bar:
        task = bar.add_task("", total=len(todo))
        for c in todo:
            bar.update(task, description=f"{c.topology} {c.profile} every {c.period:g} s")
            plan = bft.Plan(c.profile, 8, c.period, duration, None, drain, qos, topology=c.topology)
            run = bft.main(plan, list(modes))
            for r in json.loads((run / "summary.json").read_text())["modes"]:
                rows.append(
                    {
                        "run": str(run),
                        "topology": c.topology,
                        "profile": c.profile,
                        "loss_pct": _loss_pct(c.profile),
                        "period_s": c.period,
                        "mode": r["mode"],
                        "expected": r["expected"],
                        "delivered": r["delivered"],
                        "superseded": r["superseded"],
                        "lost": r["lost"],
                        "lost_pct": r["lost_pct"],
                        "delivery_ratio": r["delivered"] / r["expected"] if r["expected"] else None,
                        "delay_median_s": r["delay_median_s"],
                        "delay_p95_s": r["delay_p95_s"],
                        "aoi_mean_s": r["aoi_mean_s"],
                        "aoi_p95_s": r["aoi_p95_s"],
                        "link_bytes_per_delivery": r["link_bytes_per_delivery"],
                    }
                )
            bar.advance(task)
    write(out, rows, quick, duration)
    return out


def _loss_pct(profile: str) -> float:
    p = load_builtin_profiles().get(profile, "--profile", "profile")
    return 100 * (p.loss or 0.0)


def write(out: Path, rows: list[dict], quick: bool, duration: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(rows, indent=1))
    with open(out / "matrix.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cols = [
        "topology",
        "links",
        "period",
        "mode",
        "due",
        "delivered",
        "superseded",
        "lost %",
        "delay median",
        "delay p95",
        "AoI mean",
        "AoI p95",
        "bytes/delivery",
        "run",
    ]
    f = lambda v, u=" s", d=1: "-" if v is None else f"{v:.{d}f}{u}"  # noqa: E731
    md = [
        f"# perf matrix{' --quick' if quick else ''}: {duration:g} s of reports per run, QoS 1",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        md.append(
            "| "
            + " | ".join(
                [
                    r["topology"],
                    r["profile"],
                    f"{r['period_s']:g} s",
                    r["mode"],
                    str(r["expected"]),
                    str(r["delivered"]),
                    "-" if r["superseded"] is None else str(r["superseded"]),
                    f"{r['lost_pct']:.1f}",
                    f(r["delay_median_s"]),
                    f(r["delay_p95_s"]),
                    f(r["aoi_mean_s"]),
                    f(r["aoi_p95_s"]),
                    f(r["link_bytes_per_delivery"], " B", 0),
                    Path(r["run"]).name,
                ]
            )
            + " |"
        )
    md += [
        "",
        "Each run's own folder has its events.jsonl, summary and plots.",
        "",
        "![delivery ratio against loss](delivery_vs_loss.png)",
        "",
        "![age of information](aoi.png)",
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plots(out, rows)
    bft.console.print("\n".join(md[: len(rows) + 4]))
    bft.console.print(f"matrix in {out}")


def plots(out: Path, rows: list[dict]) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    lines: dict[tuple, list[tuple[float, float]]] = {}
    for r in rows:
        if r["delivery_ratio"] is not None:
            lines.setdefault((r["topology"], r["period_s"], r["mode"]), []).append((r["loss_pct"], r["delivery_ratio"]))
    for (topo, period, mode), pts in sorted(lines.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o" if period == 2 else "s",
            ls="-" if topo == "fmn-4nations" else ":",
            color="tab:blue" if mode == "overlay" else "tab:orange",
            label=f"{mode}, {topo}, every {period:g} s",
        )
    ax.set_xlabel("packet loss on each radio link (%)")
    ax.set_ylabel("delivered / due (superseded count as not delivered)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Delivery ratio against link loss")
    ax.legend(fontsize=7)
    save_figure(fig, out / "delivery_vs_loss.png")

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"{r['topology']}\n{r['profile']}\n{r['period_s']:g} s {r['mode']}" for r in rows]
    ax.bar(
        range(len(rows)),
        [r["aoi_p95_s"] or 0 for r in rows],
        label="p95 age of information",
        color=["tab:blue" if r["mode"] == "overlay" else "tab:orange" for r in rows],
    )
    ax.set_xticks(range(len(rows)), labels, fontsize=6)
    ax.set_ylabel("age of information p95 (s)")
    ax.set_title("Age of information p95 per run and mode (blue: overlay, orange: mqtt-bridge)")
    save_figure(fig, out / "aoi.png")
