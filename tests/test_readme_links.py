"""Every local link and image in README.md and the docs' pages points at a file that is in
the repository (tracked by git, not ignored), so a reader of a fresh clone finds the evidence."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the pages a reader is pointed at (docs/results/ holds the campaigns' raw reports)
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _tracked() -> set[str] | None:
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    return set(r.stdout.decode().split("\0")) if r.returncode == 0 else None


def local_links(text: str) -> list[str]:
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the page
        out.append(target.split("#", 1)[0])
    return out


def test_link_pattern_finds_links_and_images():
    text = "see [the report](docs/r/report.md#top) and ![plot](docs/r/plot.png) or [x](https://a.b/c), [y](#s)"
    assert local_links(text) == ["docs/r/report.md", "docs/r/plot.png"]


def test_every_local_link_and_image_in_the_readme_and_the_docs_is_a_tracked_file():
    tracked = _tracked()
    if tracked is None:
        pytest.skip("not a git checkout: cannot tell tracked files")
    links = [(page, t) for page in PAGES for t in local_links(page.read_text())]
    assert len(links) > 100, "the pages have few local links (the pattern is broken?)"
    bad = []
    for page, target in links:
        p = (page.parent / target).resolve()
        rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else target
        if p.is_dir():
            if not any(t.startswith(rel + "/") for t in tracked):
                bad.append(f"{page.name}: {target}: a folder with no tracked file")
        elif rel not in tracked:
            bad.append(
                f"{page.name}: {target}: " + ("exists but is not tracked (ignored?)" if p.exists() else "missing")
            )
    assert not bad, "\n".join(bad)


def test_every_run_the_readme_cites_says_its_command_and_commit():
    """A figure quoted from docs/results/<run>/ can be re-run: the run's own run.json names
    the command and the commit, or (runs older than run.json) the evidence index does."""
    runs = sorted(
        {m for page in PAGES for t in local_links(page.read_text()) for m in re.findall(r"results/([^/]+)/", t)}
    )
    assert runs, "the pages cite no run"
    index = (ROOT / "docs/results/README.md").read_text()
    bad = []
    for run in runs:
        meta = ROOT / "docs/results" / run / "run.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            if not (
                m.get("command", "").startswith(("c2dtn ", "make "))
                and re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", m.get("commit") or "")
            ):
                bad.append(f"{run}: run.json lacks the command or the commit: {m}")
            elif m["commit"].endswith("+dirty"):
                bad.append(f"{run}: measured on uncommitted changes ({m['commit']})")
            continue
        row = next((line for line in index.splitlines() if line.startswith(f"| {run} |")), None)
        if row is None or not re.search(r"\| `[^`]+`[^|]* \| [0-9a-f]{7,40} \|", row):
            bad.append(f"{run}: no run.json and no row with command and commit in docs/results/README.md")
    assert not bad, "\n".join(bad)
