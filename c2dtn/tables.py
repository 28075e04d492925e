"""Plain-text tables for what a person reads on a gateway box (`node status`,
`gateway status`), where rich is not installed.  Written here because the standard
library has no table formatter and a box should not carry one for two commands."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def render(
    headers: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None, right: Iterable[int] = ()
) -> str:
    """Columns as wide as their widest cell, two spaces apart; `right`: indexes of
    right-aligned columns (numbers).  Nothing is cut: a long cell widens its column."""
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = set(right)

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]] or ["(none)"]
    return "\n".join(out)
