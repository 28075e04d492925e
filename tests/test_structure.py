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
