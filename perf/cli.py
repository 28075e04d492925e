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


@perf.command("overlay")
@click.option("--sizes", default="1k,10k,100k,1M", show_default=True, help="payload sizes on lan")
@click.option("--runs", default=3, show_default=True)
@click.option("--tactical-bytes", default=60_000, show_default=True, help="bulk transfer size on cnr-tactical-2")
@click.option("--skip-lan", is_flag=True)
@click.option("--skip-tactical", is_flag=True)
@click.option("--cla", type=click.Choice(["tcpcl", "mtcp", "udp"]), default="tcpcl", show_default=True,
              help="convergence layer between the BPAs for the cnr-tactical-2 transfer")
def overlay_cmd(sizes: str, runs: int, tactical_bytes: int, skip_lan: bool, skip_tactical: bool, cla: str) -> None:
    """The overlay next to bare dtnd: round trip and throughput on lan, goodput on cnr-tactical-2."""
    from perf import overlay_bench

    bad = [s for s in sizes.split(",") if s not in overlay_bench.SIZES]
    if bad:
        raise click.BadParameter(f"unknown size {bad[0]!r}; choose from {', '.join(overlay_bench.SIZES)}",
                                 param_hint="--sizes")
    overlay_bench.main(sizes.split(","), runs, tactical_bytes, skip_lan, skip_tactical, cla)
