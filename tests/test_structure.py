"""The code's shape, as docs/layout.md describes it: what may import what, and what shipped
code may say.  A change that breaks one of these is a change to the architecture: make it
in docs/layout.md and a decision record first."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, those inside functions and
    `if TYPE_CHECKING:` included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def test_the_gateways_use_the_node_through_its_port_alone():
    wrong = []
    for f in sorted((ROOT / "ip-gateway").rglob("*.py")):
        for line, mod in _imports(f):
            if mod.startswith("c2dtn.overlay") and not mod.startswith("c2dtn.overlay.port"):
                wrong.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
    assert not wrong, "ip-gateway/ may import only c2dtn.overlay.port of the overlay:\n" + "\n".join(wrong)


def test_only_the_store_folder_touches_sqlite_and_custody_opens_its_store_by_name():
    wrong = []
    for f in _shipped_files():
        rel = f.relative_to(ROOT).as_posix()
        if f.suffix != ".py" or rel.startswith("overlay/store/"):
            continue
        for line, mod in _imports(f):
            if mod == "sqlite3" or mod.startswith(("c2dtn.overlay.store.sqlite", "c2dtn.overlay.store.memory")):
                wrong.append(f"{rel}:{line} imports {mod}")
    assert not wrong, "outside overlay/store/, stores are opened by name (open_store):\n" + "\n".join(wrong)


def test_the_import_check_sees_imports_inside_functions_and_type_checking_blocks(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from c2dtn.overlay.core import A\n"
        "def g():\n    import c2dtn.overlay.node\n"
    )
    assert {m for _, m in _imports(f)} >= {"c2dtn.overlay.core", "c2dtn.overlay.node"}


def test_the_gateways_reach_no_private_part_of_the_port():
    """The port's underscored attributes (its core, its syncer) are the node's, not the gateways'."""
    wrong = []
    for f in sorted((ROOT / "ip-gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "port"
            ):
                wrong.append(f"{f.relative_to(ROOT)}:{node.lineno} .port.{node.attr}")
    assert not wrong, "\n".join(wrong)


SHIPPED = ("overlay", "ip-gateway", "cla-adapters", "c2dtn", "topologies", "perf", "scripts")
HISTORY = [  # what belongs in a decision record or the changelog, not in code (docs/decisions/)
    (re.compile(r"\bissues? \d+\b", re.I), "an issue number"),
    (re.compile(r"\b20\d\d-[01]\d-[0-3]\d(?!T)"), "a date"),
    (re.compile(r"\b(?:commit|since|before|after) [0-9a-f]{7,40}\b"), "a commit hash"),
]


def _shipped_files() -> list[Path]:
    files = [ROOT / "Makefile"]
    for folder in SHIPPED:
        files += [
            f
            for f in (ROOT / folder).rglob("*")
            if f.suffix in (".py", ".c", ".sh", ".toml") and "__pycache__" not in f.parts
        ]
    return sorted(files)


def test_shipped_code_carries_no_dates_issue_numbers_or_commit_hashes():
    """A comment says what and why; the history that drove it is in docs/decisions/."""
    wrong = []
    for f in _shipped_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for pattern, what in HISTORY:
                if m := pattern.search(line):
                    wrong.append(f"{f.relative_to(ROOT)}:{n}: {what}: {m.group(0)!r}")
    assert not wrong, "\n".join(wrong)


def test_the_history_check_finds_each_kind(tmp_path):
    lines = [
        "# measured 2026-11-24 on lan",
        "x = 1  # see issue 14",
        "# fixed since 1b4869c",
        "EPOCH = 0  # 2000-01-01T00:00:00Z",
    ]
    found = [what for line in lines for pattern, what in HISTORY if pattern.search(line)]
    assert found == ["a date", "an issue number", "a commit hash"]


def test_every_decision_record_a_comment_names_exists():
    names = {int(p.name[:4]) for p in (ROOT / "docs" / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md")}
    wrong = []
    for f in _shipped_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in re.finditer(r"\bdecision (\d{4})\b", line):
                if int(m.group(1)) not in names:
                    wrong.append(f"{f.relative_to(ROOT)}:{n} names decision {m.group(1)}")
    assert not wrong, "\n".join(wrong)


def _agent_names() -> set[str]:
    from c2dtn.overlay.agents import agent_class, kinds

    return {k for k in kinds()} | {agent_class(k).label() for k in kinds()}


def _names_an_agent(text: str, names: set[str]) -> bool:
    """A word of `text` that is an agent's kind or daemon, also spelled with a hyphen or a
    suffix after one ("IBR-DTN", "dtn7-rs"); identifiers split at "_" and "."."""
    for word in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower().replace("_", " ").replace(".", " ")):
        if word in names or word.replace("-", "") in names or word.split("-")[0] in names:
            return True
    return False


def _agent_mentions(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    """Where a module's code names an agent: string constants (docstrings aside), names,
    attributes and imported modules.  Comments may give an agent as an example."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    out = []
    for n in ast.walk(tree):
        text = None
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            text = n.value
        elif isinstance(n, ast.Name):
            text = n.id
        elif isinstance(n, ast.Attribute):
            text = n.attr
        elif isinstance(n, ast.ImportFrom):
            text = " ".join([n.module or "", *(a.name for a in n.names)])
        elif isinstance(n, ast.Import):
            text = " ".join(a.name for a in n.names)
        if text is not None and _names_an_agent(text, names):
            out.append(f"{path.relative_to(root)}:{n.lineno}: {text[:80]!r}")
    return out


def test_no_module_outside_the_agents_and_cla_adapters_names_an_agent():
    """An agent is one driver in overlay/agents/ (and its scheme table in cla-adapters/): the
    rest of c2dtn reads what the drivers declare (docs/layout.md), so adding one edits nothing else."""
    names = _agent_names()
    wrong = []
    for f in _shipped_files():
        rel = f.relative_to(ROOT).as_posix()
        if rel.startswith(("overlay/agents/", "cla-adapters/")):
            continue
        if f.suffix == ".py":
            wrong += _agent_mentions(f, names)
        elif f.name == "Makefile" or f.suffix == ".sh":  # the builds are the agents' own (make/<kind>.mk)
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if not line.lstrip().startswith("#") and _names_an_agent(line, names):
                    wrong.append(f"{rel}:{n}: {line.strip()[:80]!r}")
    assert not wrong, "\n".join(wrong)


def test_the_agent_name_check_finds_each_way_of_naming_one(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        '"""Docstrings may name dtn7."""\n'
        "# comments may name ION\n"
        "from c2dtn.overlay.agents.dtn7 import find_dtnd\n"
        'KIND = "ion"\n'
        'HELP = "compare IBR-DTN with dtn7-rs"\n'
        "only_hdtn = False\n"
        "x = agents.ion\n"
        'FINE = "the motion and the dtnds"\n'
    )
    wrong = [w.split(": ", 1)[1] for w in _agent_mentions(f, _agent_names(), tmp_path)]
    assert wrong == [
        "'c2dtn.overlay.agents.dtn7 find_dtnd'",
        "'ion'",
        "'compare IBR-DTN with dtn7-rs'",
        "'only_hdtn'",
        "'ion'",
    ], wrong


def test_the_makefile_builds_each_recipe_at_the_version_its_driver_looks_for():
    import shutil
    import subprocess

    from c2dtn.overlay.agents import builds

    if shutil.which("make") is None:
        import pytest

        pytest.skip("make is not installed")
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval=c2-show: ; $(info $(BPA_BUILDS))", "c2-show"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    built = {b.split("|")[0]: b.split("|")[1] for b in out}
    recipes = {p.stem for p in (ROOT / "overlay" / "agents" / "make").glob("*.sh")}
    assert set(built) == recipes and recipes, (out, recipes)
    assert all(ver == builds.version(name) for name, ver in built.items()), built
