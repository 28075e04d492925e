"""`c2dtn perf fuzz`: coverage-guided fuzzing of every input c2dtn takes from a peer or an
operator (perf/fuzz_targets.py), under atheris (libFuzzer over Python coverage).

Each target runs in a process of its own (`python -m c2dtn.perf.fuzz TARGET ...`, which
libFuzzer ends with exit()), starting from the target's seeds and the corpus kept under
tests/fuzz_corpus/<target>/.  A crash is any exception but the target's typed refusal;
libFuzzer stops at the first and leaves the input in the run folder.  The report is a table
per target (inputs, rate, coverage, corpus, accepted/refused, crashes) with a plot of
coverage against inputs; --save merges what each target's corpus grew into
tests/fuzz_corpus/<target>/ (the inputs that reached new coverage), which
tests/test_fuzz_corpus.py replays in `make test`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fuzz_corpus"
STATUS = re.compile(r"^#(\d+)\s+(?:\w+)\s+cov: (\d+) ft: (\d+) corp: (\d+)")
COLS = ["target", "what", "inputs", "seconds", "inputs/s", "coverage", "corpus", "accepted", "refused", "crashes"]


def child(name: str, runs: int, corpus: str, stats: str, artifacts: str, seeds_dir: str) -> None:
    """In the child process: instrument c2dtn, then fuzz one target until `runs` inputs."""
    import atheris

    with atheris.instrument_imports(include=["c2dtn"]):
        from c2dtn.perf import fuzz_targets
    t = fuzz_targets.TARGETS[name]
    t.timed = False
    sp = Path(stats)
    slow = Path(artifacts).parent / "slow"
    slow.mkdir(exist_ok=True)
    n = 0

    def one(data: bytes) -> None:
        nonlocal n
        t0 = time.perf_counter()
        t(data)
        # instrumented code runs several times slower than the daemons': an input over the limit
        # here is kept, and timed again uninstrumented by the parent (run_target)
        if time.perf_counter() - t0 > fuzz_targets.time_limit_s(len(data)):
            f = slow / fuzz_targets.digest(data)
            if not f.exists() and len(list(slow.iterdir())) < 200:
                f.write_bytes(data)
        n += 1
        if n % 4096 == 0:  # libFuzzer ends the process with exit(): counts are written as it goes
            sp.write_text(json.dumps(t.counts))

    atheris.Setup(
        [
            sys.argv[0],
            f"-runs={runs}",
            "-max_len=8192",
            "-print_final_stats=1",
            "-timeout=10",
            f"-artifact_prefix={artifacts}/",
            corpus,
            seeds_dir,
        ],
        one,
    )
    atheris.Fuzz()


def run_target(name: str, runs: int, work: Path, progress=None) -> dict:
    from c2dtn.perf import fuzz_targets

    t = fuzz_targets.TARGETS[name]
    corpus, seeds, art = work / name / "corpus", work / name / "seeds", work / name / "crashes"
    for d in (corpus, seeds, art):
        d.mkdir(parents=True, exist_ok=True)
    for s in t.seeds():
        (seeds / fuzz_targets.digest(s)).write_bytes(s)
    kept = CORPUS / name
    if kept.is_dir():
        for f in kept.iterdir():
            shutil.copy(f, seeds / f.name)
    stats = work / name / "counts.json"
    cmd = [sys.executable, "-m", "c2dtn.perf.fuzz", name, str(runs), str(corpus), str(stats), str(art), str(seeds)]
    t0 = time.monotonic()
    curve: list[tuple[int, int]] = []
    log = (work / name / "fuzz.log").open("w")
    env = {**os.environ, "C2DTN_FUZZ_DIR": str(work / name), "RUST_BACKTRACE": "0"}  # mqtt5 panics print less
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=log, text=True, errors="replace", env=env) as p:
        for line in p.stderr:
            log.write(line)
            m = STATUS.match(line)
            if m:
                curve.append((int(m.group(1)), int(m.group(2))))
                if progress:
                    progress(int(m.group(1)))
    secs = time.monotonic() - t0
    log.close()
    text = (work / name / "fuzz.log").read_text(errors="replace")
    done = re.search(r"Done (\d+) runs", text)
    inputs = int(done.group(1)) if done else (curve[-1][0] if curve else 0)
    # inputs the instrumented child found slow, timed here as the daemons run them: over the
    # limit (twice: the machine may pause) they are crashes of this target too
    for f in sorted((work / name / "slow").glob("*")) if (work / name / "slow").is_dir() else []:
        try:
            t(f.read_bytes())
        except fuzz_targets.OverLimit as e:
            (art / f"slow-{f.name}").write_bytes(f.read_bytes())
            (art / f"slow-{f.name}.why").write_text(str(e) + "\n")
        except Exception:  # a crash the child would have stopped at: not ours to judge here
            pass
    crashes = sorted(str(f) for f in art.iterdir() if not f.name.endswith(".why"))
    counts = json.loads(stats.read_text()) if stats.exists() else {"accepted": 0, "refused": 0}
    last = curve[-1] if curve else (0, 0)
    return {
        "target": name,
        "what": t.what,
        "inputs": inputs,
        "seconds": round(secs, 1),
        "rate": round(inputs / secs) if secs else 0,
        "coverage": last[1],
        "corpus": len(list(corpus.iterdir())),
        "accepted": counts["accepted"],
        "refused": counts["refused"],
        "explained": counts.get("explained", {}),
        "crashes": len(crashes) + (0 if p.returncode == 0 else int(not crashes)),
        "crash_files": crashes,
        "exit": p.returncode,
        "curve": curve,
    }


def save_corpus(name: str, work: Path) -> int:
    """Add what the run's corpus grew (libFuzzer keeps only inputs that reached new coverage,
    starting from the seeds and the corpus kept before) to tests/fuzz_corpus/<name>/, named
    by their SHA-1 as libFuzzer names them."""
    dst = CORPUS / name
    dst.mkdir(parents=True, exist_ok=True)
    for f in (work / name / "corpus").iterdir():
        shutil.copy(f, dst / f.name)
    return len(list(dst.iterdir()))


def report(out: Path, rows: list[dict], runs: int) -> str:
    from c2dtn.perf.plots import pyplot, save_figure

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    md = [
        f"# Fuzzing (`c2dtn perf fuzz`, {runs:,} inputs per target)",
        "",
        "A crash is any exception but the target's typed refusal. Coverage is libFuzzer's count "
        "of Python code edges atheris saw.",
        "",
        "| " + " | ".join(COLS) + " |",
        "|---|---|" + "---:|" * (len(COLS) - 2),
    ]
    md += [
        f"| {r['target']} | {r['what']} | {r['inputs']:,} | {r['seconds']} | {r['rate']:,} | {r['coverage']} | "
        f"{r['corpus']} | {r['accepted']:,} | {r['refused']:,} | {r['crashes']} |"
        for r in rows
    ]
    crashed = [r for r in rows if r["crashes"]]
    md += [
        "",
        "Crashes: "
        + (
            "none"
            if not crashed
            else "; ".join(f"{r['target']}: {', '.join(Path(f).name for f in r['crash_files'])}" for r in crashed)
        ),
        "",
    ]
    for r in rows:
        if r.get("explained"):
            md += [
                f"Explained disagreements of `{r['target']}` (inputs where one reader refused and the other "
                "took the packet, for the reason given; any other disagreement is a crash):",
                "",
                "| inputs | why |",
                "|---:|---|",
            ]
            md += [f"| {n:,} | {why} |" for why, n in sorted(r["explained"].items(), key=lambda kv: -kv[1])] + [""]
    md += [
        "![coverage against inputs](plot.png)",
        "",
        "Data of the plot: `summary.json` (each target's `curve`: [inputs, coverage]).",
    ]
    (out / "report.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        if r["curve"]:
            ax.plot([c[0] for c in r["curve"]], [c[1] for c in r["curve"]], label=r["target"])
    ax.set_xscale("symlog")
    ax.set_xlabel("inputs tried")
    ax.set_ylabel("coverage (edges)")
    ax.set_title("Fuzzing: coverage against inputs, per target")
    ax.legend(fontsize=8)
    save_figure(fig, out / "plot.png")
    return "\n".join(md[: len(rows) + 6])


def main(targets: list[str], runs: int, save: bool, out: Path | None = None, console=None) -> tuple[Path, list[dict]]:
    from c2dtn.perf.runs import progress, run_dir

    out = out or run_dir("fuzz")
    rows = []
    with tempfile.TemporaryDirectory(prefix="c2-fuzz-") as td, progress(console) as bar:
        for name in targets:
            task = bar.add_task(f"{name}: fuzzing", total=runs)
            r = run_target(name, runs, Path(td), lambda n, t=task: bar.update(t, completed=n))
            bar.update(task, completed=runs)
            for f in r["crash_files"]:
                shutil.copy(f, out / f"{name}-{Path(f).name}")
            if save and not r["crashes"]:
                r["corpus_saved"] = save_corpus(name, Path(td))
            rows.append(r)
    text = report(out, rows, runs)
    if console is not None:
        console.print(text)
        console.print(f"results in {out}")
    return out, rows


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]), *sys.argv[3:7])
