"""Saving report figures: the PNG and, next to it, the data it shows.

save_figure(fig, path) writes path (PNG) and path with .json: for each panel its title, axis
labels and every labelled series (label, x, y) as drawn.  A reader can take the numbers
behind a picture without scraping it, and tests check that a plot shows what its title
says by comparing those series with the report's own figures.
"""

from __future__ import annotations

import json
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the file-only backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _val(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def panels(fig) -> list[dict]:
    """What each axes of `fig` shows: title, labels, labelled lines and scatters, tick labels."""
    out = []
    for ax in fig.axes:
        series = []
        for line in ax.get_lines():
            label = line.get_label()
            if label and not label.startswith("_"):
                series.append(
                    {"label": label, "x": [_val(v) for v in line.get_xdata()], "y": [_val(v) for v in line.get_ydata()]}
                )
        for c in ax.containers:  # errorbar and bar plots label their container, not its lines
            label = c.get_label()
            if not label or label.startswith("_"):
                continue
            data_line = getattr(c, "lines", None) and c.lines[0]
            if data_line is not None and hasattr(data_line, "get_xdata"):
                series.append(
                    {
                        "label": label,
                        "x": [_val(v) for v in data_line.get_xdata()],
                        "y": [_val(v) for v in data_line.get_ydata()],
                    }
                )
            elif hasattr(c, "patches"):
                series.append(
                    {
                        "label": label,
                        "x": [_val(p.get_x() + p.get_width() / 2) for p in c.patches],
                        "y": [_val(p.get_height()) for p in c.patches],
                    }
                )
        for col in ax.collections:
            label = col.get_label()
            offs = col.get_offsets() if hasattr(col, "get_offsets") else []
            if label and not label.startswith("_") and len(offs):
                series.append({"label": label, "x": [_val(p[0]) for p in offs], "y": [_val(p[1]) for p in offs]})
        out.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "xticks": [t.get_text() for t in ax.get_xticklabels() if t.get_text()],
                "series": series,
            }
        )
    return out


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Lay out, write the PNG and its .json, close the figure."""
    plt = pyplot()
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    path.with_suffix(".json").write_text(json.dumps(panels(fig), indent=1))
    plt.close(fig)
