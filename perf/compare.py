"""`c2dtn perf report DIR...`: runs of perf bft and perf bundles side by side (a table,
and for BFT runs a plot of loss and age of information per run and mode)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from c2dtn.errors import C2Error
from c2dtn.perf.plots import pyplot, save_figure

console = Console(width=None if sys.stdout.isatty() else 170)


def _load(d: Path) -> tuple[str, object]:
    f = d / "summary.json"
    try:
        data = json.loads(f.read_text())
    except FileNotFoundError:
        raise C2Error(f"{d} is not a results folder: it has no summary.json") from None
    except ValueError as e:
        raise C2Error(f"{f} is not JSON: {e}") from None
    if isinstance(data, dict) and "plan" in data and "modes" in data:
        return "bft", data
    if isinstance(data, list) and data and "cla" in data[0]:
        return "bundles", data
    raise C2Error(f"{f}: not a perf bft or perf bundles summary (other benchmarks print their own tables)")


def main(dirs: list[str], out: str | None = None) -> None:
    runs = [(Path(d), *_load(Path(d))) for d in dirs]
    bft = [(d, x) for d, k, x in runs if k == "bft"]
    bundles = [(d, x) for d, k, x in runs if k == "bundles"]
    if bft:
        t = Table(title="perf bft runs side by side")
        for c in (
            "run",
            "engine",
            "topology",
            "links",
            "period",
            "QoS",
            "mode",
            "due",
            "delivered",
            "superseded",
            "lost %",
            "delay median",
            "p95",
            "AoI mean",
            "AoI p95",
            "bytes/delivery",
        ):
            t.add_column(c, justify="right")
        for d, x in bft:
            p = x["plan"]
            for r in x["modes"]:
                f = lambda v, u="s": "-" if v is None else f"{v:.1f} {u}"  # noqa: E731
                t.add_row(
                    d.name,
                    p.get("engine", "namespaces"),
                    p.get("topology", "nps-chain"),
                    p["profile"],
                    f"{p['period']:g} s",
                    str(p["qos"]),
                    r["mode"],
                    str(r.get("expected", r["sent"])),
                    str(r["delivered"]),
                    "-" if r["superseded"] is None else str(r["superseded"]),
                    f"{r['lost_pct']:.1f}",
                    f(r["delay_median_s"]),
                    f(r["delay_p95_s"]),
                    f(r.get("aoi_mean_s")),
                    f(r.get("aoi_p95_s")),
                    f(r.get("link_bytes_per_delivery"), "B"),
                )
        console.print(t)
        if out:
            _plot_bft(bft, Path(out))
    if bundles:
        t = Table(title="perf bundles runs side by side (medians)")
        for c in ("run", "agent", "CLA", "profile", "payload", "throughput", "round trip", "note"):
            t.add_column(c, justify="right")
        for d, x in bundles:
            for s in x:
                if "skipped" in s:
                    t.add_row(d.name, s["agent"], s["cla"], s["profile"], s["size"], "-", "-", s["skipped"])
                else:
                    t.add_row(
                        d.name,
                        s["agent"],
                        s["cla"],
                        s["profile"],
                        s["size"],
                        f"{s['throughput_bps'] / 1e3:.1f} kbit/s",
                        "-" if s["rtt_s"] is None else f"{s['rtt_s'] * 1000:.0f} ms",
                        "",
                    )
        console.print(t)


def _plot_bft(bft, path: Path) -> None:
    plt = pyplot()

    labels, lost, aoi = [], [], []
    for d, x in bft:
        for r in x["modes"]:
            labels.append(f"{d.name[-20:]}\n{x['plan'].get('engine', 'namespaces')} {r['mode']}")
            lost.append(r["lost_pct"])
            aoi.append(r.get("aoi_p95_s") or 0)
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 4.5))
    a1.bar(range(len(labels)), lost, label="lost (%)")
    a1.set_xticks(range(len(labels)), labels, fontsize=7)
    a1.set_ylabel("lost (%)")
    a1.set_title("Reports lost, per run and mode")
    a2.bar(range(len(labels)), aoi, color="tab:orange", label="AoI p95 (s)")
    a2.set_xticks(range(len(labels)), labels, fontsize=7)
    a2.set_ylabel("age of information p95 (s)")
    a2.set_title("Age of information (p95), per run and mode")
    # each run's mean age of information over time (its aoi.json): where the cut is, and after
    for d, x in bft:
        try:
            series = json.loads((d / "aoi.json").read_text())[0]["series"]
        except (OSError, ValueError, LookupError):
            continue
        for sr in series:
            if sr["label"].endswith(": mean"):
                mode = sr["label"].removesuffix(": mean")
                a3.plot(sr["x"], sr["y"], label=f"{d.name[-20:]} {x['plan'].get('engine', 'namespaces')} {mode}")
    a3.set_xlabel("time into the run (s)")
    a3.set_ylabel("mean age of newest position held (s)")
    a3.set_title("Age of information over time")
    if a3.get_lines():
        a3.legend(fontsize=7)
    save_figure(fig, path)
    console.print(f"plot in {path}")


def spans(dirs: list[Path], spans: list[tuple[float, float]]) -> None:
    """A table per perf bft run: where in it the bytes per delivered report come from
    (capture.spans)."""
    from c2dtn.perf import capture

    for d in dirs:
        t = Table(title=f"{d.name}: link bytes and deliveries per span (seconds from the first report sent)")
        for c in ("span", "link bytes", "delivered", "bytes per delivered report"):
            t.add_column(c, justify="left" if c == "span" else "right")
        *rows, whole = capture.spans(d, spans)
        for r in [*rows, whole]:
            per = "-" if r["per_report"] is None else f"{r['per_report']:.0f}"
            span = "the whole run" if r is whole else f"{r['from_s']:g}-{r['to_s']:g} s"
            t.add_row(span, f"{r['link_bytes']:,}", str(r["delivered"]), per)
        console.print(t)
        # a capture cut short (or a run whose summary was made otherwise) shows here
        kind, data = _load(d)
        mode = next((m for m in data["modes"] if m["mode"] == "overlay"), None) if kind == "bft" else None  # type: ignore[index]
        if mode is not None and (mode.get("link_bytes"), mode.get("delivered")) != (
            whole["link_bytes"],
            whole["delivered"],
        ):
            console.print(
                f"[yellow]{d.name}: its summary says {mode.get('link_bytes')} link bytes and {mode.get('delivered')} "
                f"delivered; the captures and events here give {whole['link_bytes']} and {whole['delivered']}[/yellow]"
            )
