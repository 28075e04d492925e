"""Run folders: results/<time>-<kind>/ with run.json saying when, on what code and by what
command the figures in it were made, so that a figure quoted elsewhere can be re-run.

run.json: {"kind", "started" (local ISO time), "command" (as typed, with `c2dtn` for the
entry point), "commit" (git HEAD of the c2dtn source, "+dirty" when tracked files other than
docs/, tests/ and Markdown differ from it; null outside a git checkout), "python", "host": {"cpus", "kernel"}}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent  # the checkout c2dtn runs from (editable install)


def commit(src: Path = SOURCE) -> str | None:
    """git HEAD of the source, "+dirty" when tracked code was changed; None if not a checkout."""
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        # what a run measures is the code: notes, evidence and tests changing beside it do not count
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(src),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)docs",
                ":(exclude)tests",
                ":(exclude)*.md",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def command(argv: list[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    name = Path(argv[0]).name if argv else ""
    if name in ("c2dtn", "cli.py", "__main__.py") or name.endswith("-c"):
        argv = ["c2dtn", *argv[1:]]
    return shlex.join(argv)


def run_dir(kind: str, root: Path = Path("results")) -> Path:
    """A new results/<time>-<kind>/ with its run.json."""
    out = root / (time.strftime("%Y%m%d-%H%M%S") + f"-{kind}")
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "kind": kind,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command(),
        "commit": commit(),
        "python": platform.python_version(),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
    }
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def progress(console=None, unit: str = ""):
    """The progress bar every long benchmark shows: what it does, a bar, done/total, time.
    Where the output is no terminal (a log file, CI), rich draws the bar only when it ends:
    a line at every tenth done stands in for it there."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    class Lines(Progress):
        def __init__(self, *columns, **kw) -> None:
            super().__init__(*columns, **kw)
            self.said: dict = {}  # task -> the last tenth printed

        def advance(self, task_id, advance: float = 1) -> None:
            super().advance(task_id, advance)
            self._say(task_id)

        def update(self, task_id, **kw) -> None:
            super().update(task_id, **kw)
            self._say(task_id)

        def _say(self, task_id) -> None:
            t = self._tasks.get(task_id)
            if self.console.is_terminal or t is None or not t.total:
                return
            tenth = int(10 * min(t.completed, t.total) / t.total)
            if tenth > self.said.get(task_id, 0):
                self.said[task_id] = tenth
                done = f"{t.completed:,.0f}/{t.total:,.0f}" + (f" {unit}" if unit else "")
                self.console.print(f"{t.description}: {done} ({t.elapsed or 0:.0f} s)")

    bar = Lines(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,}" + (f" {unit}" if unit else "")),
        TimeElapsedColumn(),
        console=console,
    )
    return bar


class LogTally(logging.Handler):
    """Counts what c2dtn logs during the run, by message template, and keeps the first
    three lines of each (a full disk logs a line per refusal)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.counts: Counter = Counter()
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.levelname} {record.name}: {record.msg}"
        self.counts[key] += 1
        if self.counts[key] <= 3:
            self.first.append(f"{record.created:.3f} {record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def tally_logs():
    """While a campaign runs, what c2dtn logs is counted (LogTally), not printed: a campaign of
    hostile input or a full disk would otherwise print a line per refusal over its progress."""
    c2log, tally = logging.getLogger("c2dtn"), LogTally()
    level, propagate = c2log.level, c2log.propagate
    c2log.addHandler(tally)
    c2log.setLevel(logging.INFO)
    c2log.propagate = False
    try:
        yield tally
    finally:
        c2log.removeHandler(tally)
        c2log.setLevel(level)
        c2log.propagate = propagate
