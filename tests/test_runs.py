"""run.json: the command as typed and the code it ran on."""

import json
import subprocess

from c2dtn.perf import runs


def test_run_json_names_the_command_and_the_commit(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["/x/.venv/bin/c2dtn", "perf", "store", "--fills", "1e4,1e5"])
    out = runs.run_dir("store", root=tmp_path)
    meta = json.loads((out / "run.json").read_text())
    assert out.name.endswith("-store") and meta["command"] == "c2dtn perf store --fills 1e4,1e5"
    assert meta["commit"] == runs.commit() and meta["host"]["cpus"] >= 1


def test_the_commit_is_marked_dirty_when_tracked_files_differ(tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@c2", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert runs.commit(tmp_path) == head
    (tmp_path / "notes.md").write_text("n\n")
    subprocess.run([*git, "add", "notes.md"], check=True)
    subprocess.run([*git, "commit", "-qm", "n"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "notes.md").write_text("a note changed beside the code\n")
    assert runs.commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert runs.commit(tmp_path) == head + "+dirty"
    assert runs.commit(tmp_path / "nowhere") is None


def test_where_the_output_is_no_terminal_the_progress_bar_says_each_tenth_in_a_line():
    """A benchmark's output sent to a file or a CI log: rich draws its bar only at the end, so
    a line at every tenth done shows it is moving."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    with runs.progress(Console(file=buf, force_terminal=False, width=100), "runs") as bar:
        task = bar.add_task("virtual radio", total=40)
        for _ in range(40):
            bar.advance(task)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("virtual radio: ")]
    assert [ln.split()[2] for ln in lines] == [f"{4 * k}/40" for k in range(1, 11)]
    term = io.StringIO()
    with runs.progress(Console(file=term, force_terminal=True, width=100), "runs") as bar:
        task = bar.add_task("virtual radio", total=40)
        bar.advance(task, 40)
    assert "virtual radio: " not in term.getvalue()  # a terminal has the bar itself
