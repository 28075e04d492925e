"""`c2dtn perf …`: benchmarks that print their figures and ratios side by side."""

from __future__ import annotations

import click


@click.group("perf")
def perf() -> None:
    """Benchmarks and measurement campaigns."""


@perf.command("emulator")
@click.option("--seconds", default=10.0, show_default=True, help="length of each TCP transfer")
@click.option("--runs", default=3, show_default=True, help="transfers; the median is reported")
@click.option("--delay", default="50ms", show_default=True, help="one-way delay of the emulated link")
def emulator_cmd(seconds: float, runs: int, delay: str) -> None:
    """TCP goodput through the userspace channel emulator and its CPU cost per frame."""
    from perf import emulator_bench

    emulator_bench.main(seconds=seconds, runs=runs, delay=delay)
