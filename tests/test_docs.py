"""The README and the docs site, as a newcomer meets them: the README is a short product
page, the site builds with no broken link, every config in the docs loads, and every
`c2dtn` command the docs show exists with the options they give it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from c2dtn.cli import cli
from c2dtn.ip_gateway.policy import parse_gateway
from c2dtn.overlay.config import load_node_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# the pages a reader is pointed at (docs/results/ holds the campaigns' raw reports)
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if "results" not in p.relative_to(DOCS).parts)
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def blocks(lang: str) -> list[tuple[Path, str]]:
    return [(p, m.group(2)) for p in PAGES for m in BLOCK.finditer(p.read_text()) if m.group(1) == lang]


def test_the_readme_is_a_product_page_not_a_log():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, f"commit hashes in README.md: {hashes}"
    assert not re.search(r"\bissues? \d+|#\d+\b", text, re.I), "issue numbers in README.md"
    for head in ("## Two commands", "## A tour of the CLI", "## Headline figures", "## Documentation"):
        assert head in text
    # each headline figure says when it was measured and links to its campaign page
    table = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith(("| what", "|---"))]
    assert len(rows) >= 5
    for r in rows:
        assert re.search(r"\| 20\d\d-\d\d-\d\d \|", r) and "](docs/perf/" in r, r


def test_every_page_has_no_commit_hash_in_its_headings():
    for p in PAGES:
        for line in p.read_text().splitlines():
            if line.startswith("#") and not line.startswith("#!"):
                assert not re.search(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", line), (p, line)


@pytest.mark.skipif(
    shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
    reason="mkdocs is not installed in this environment (make venv installs it)",
)
def test_the_site_builds_with_no_broken_link(tmp_path):
    r = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    page = (tmp_path / "configuration" / "index.html").read_text()
    assert "persistent_client_expiration" in page and "aggregate_bytes" in page  # the generated reference


def _node_config(tmp: Path, text: str) -> Path:
    """A docs config made loadable here: its storage under tmp, its keys_file written by `c2dtn keys`."""
    m = re.search(r'^id = "([^"]+)"', text, re.M)
    node = m.group(1) if m else "gw1"
    text = re.sub(r'^storage = "[^"]*"', f'storage = "{tmp / node}"', text, flags=re.M)
    if "[node]" not in text:
        text = f'[node]\nid = "gw1"\nstorage = "{tmp / "gw1"}"\n' + text
    kf = re.search(r'^keys_file = "([^"]+)"', text, re.M)
    if kf and not (tmp / kf.group(1)).exists():
        r = CliRunner().invoke(cli, ["keys", str(tmp), "gw1", "gw4", "--force"])
        assert r.exit_code == 0, r.output
    p = tmp / f"{node}.toml"
    p.write_text(text)
    p.chmod(0o600)
    return p


SERVERS = [(p, t) for p, t in blocks("toml") if t.startswith("# servers.toml")]  # CORE servers files
TOML = [(p, t) for p, t in blocks("toml") if not t.startswith("# servers.toml")]  # node configs


@pytest.mark.parametrize("page,text", SERVERS, ids=[f"{p.relative_to(ROOT)}:{i}" for i, (p, _) in enumerate(SERVERS)])
def test_every_servers_file_in_the_docs_places_its_topology(tmp_path, page, text):
    from c2dtn.topologies import core_plan
    from c2dtn.topologies.model import load

    f = tmp_path / "servers.toml"
    f.write_text(text)
    plan = core_plan.session_plan(load("fmn-4nations"), "userspace", core_plan.load_servers(f))
    assert set(core_plan.per_server(plan)) == {"", "core-deu", "core-nor", "core-prt", "core-usa"}


@pytest.mark.parametrize("page,text", TOML, ids=[f"{p.relative_to(ROOT)}:{i}" for i, (p, _) in enumerate(TOML)])
def test_every_config_in_the_docs_loads(tmp_path, page, text):
    p = _node_config(tmp_path, text)
    cfg = load_node_config(p)
    if cfg.gateway is not None:
        parse_gateway(str(p), cfg.gateway)
    r = CliRunner().invoke(cli, ["node", "check", str(p)])
    # (3: the config is right and this machine lacks its agent)
    assert r.exit_code in (0, 3) and ": ok: node " in r.output, r.output


def test_each_agent_page_has_a_two_box_config_for_its_agent(tmp_path):
    from c2dtn.overlay.agents import kinds

    for kind in kinds():
        page = DOCS / "agents" / f"{kind}.md"
        configs = [m.group(2) for m in BLOCK.finditer(page.read_text()) if m.group(1) == "toml"]
        ids = set()
        (tmp_path / kind).mkdir()
        for text in configs:
            cfg = load_node_config(_node_config(tmp_path / kind, text))
            assert cfg.agent == kind and cfg.gateway is not None, page
            ids.add(cfg.id)
            assert {p.node for p in cfg.peers} == {"gw1", "gw4"} - {cfg.id}
        assert ids == {"gw1", "gw4"}, page


def _commands() -> list[tuple[Path, str]]:
    out = []
    for page, text in blocks("sh"):
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():  # continuation lines joined
            line = line.split(" #", 1)[0].strip().rstrip("&").strip()
            if line.startswith("c2dtn "):
                out.append((page, line))
    return out


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("page,line", COMMANDS, ids=[c for _, c in COMMANDS])
def test_every_command_in_the_docs_exists_with_the_options_it_is_given(page, line):
    words = shlex.split(line)[1:]
    cmd: click.Command = cli
    path = []
    while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
        path.append(words[0])
        cmd = cmd.commands[words.pop(0)]
    assert path, f"{page.name}: `{line}` names no c2dtn command"
    known = {o for p in cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
    used = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    assert used <= known | {"--help"}, (
        f"{page.name}: `{line}`: {sorted(used - known)} not options of c2dtn {' '.join(path)}"
    )
    r = CliRunner().invoke(cli, path + ["--help"])
    assert r.exit_code == 0 and "Usage:" in r.output, r.output


SEEDS = ROOT.parent / "shared" / "seeds"
# (campaign page, seed, a headline figure as the seed prints it)
SEED_QUOTES = [
    (
        "perf/bft.md",
        "000",
        "both Mosquitto and VerneMQ did not perform well with loss rates of 60-85 % with the "
        "2 seconds sending period and about 27-36 % with the 10 seconds period",
    ),
    ("perf/bft.md", "000", "If the sending rate was lower (10 seconds) Mosquitto and VerneMQ performed reliably."),
    ("perf/bft.md", "001", "The message size of a WS-N message was 1863."),
    ("perf/bft.md", "001", "The size (content) of each message was 880 Bytes"),
    ("perf/bft.md", "001", "The size (content) of each message was 894 bytes"),
    ("perf/bundles.md", "002", "rtt range between 70 and 99 milliseconds."),
    ("perf/bundles.md", "002", "For 100Kbyte tests, IBRDTN performed significantly better than SPINDLE and ION."),
    ("perf/bundles.md", "002", "it was able to achieve a data rate over 100Mbits per second."),
    ("perf/orders.md", "004", "loss rate between 35.29 % and 58.82 %"),
    ("perf/orders.md", "004", "REST HTTP/JSON 418 Bytes"),
]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"^> ?", "", text, flags=re.M))


@pytest.mark.parametrize("page,seed,quote", SEED_QUOTES, ids=[f"{p}:{s}:{q[:30]}" for p, s, q in SEED_QUOTES])
def test_each_seeds_headline_figures_are_quoted_exactly_on_the_page_that_reproduces_it(page, seed, quote):
    assert quote in _flat((DOCS / page).read_text()), f"{page} does not quote seed {seed}: {quote!r}"
    papers = list(SEEDS.glob(f"{seed}_*.txt"))
    if not papers:
        pytest.skip(f"seed {seed}'s text is not at {SEEDS} (the docs' quote is checked, not its source)")
    assert quote in _flat(papers[0].read_text(errors="replace")), f"seed {seed} does not say {quote!r}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_on_a_machine_with_no_agent_built_builds_dtn7_rs_and_no_other(tmp_path):
    r = subprocess.run(["make", "-n", "demo", f"C2DTN_CACHE={tmp_path}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "cargo install dtn7" in r.stdout and "perf bft" in r.stdout
    assert "build-bpa.sh" not in r.stdout and "c2dtn-ionbp" not in r.stdout
    # on CORE: CORE is built too, and the job runs on it
    r = subprocess.run(
        ["make", "-n", "demo", "ENGINE=core", f"C2DTN_CACHE={tmp_path}"], cwd=ROOT, capture_output=True, text=True
    )
    assert "build-bpa.sh core" in r.stdout and "perf --engine core bft" in r.stdout, r.stdout
    r = subprocess.run(["make", "-n", "test", f"C2DTN_CACHE={tmp_path}"], cwd=ROOT, capture_output=True, text=True)
    from_source = [p.stem for p in (ROOT / "overlay" / "agents" / "make").glob("*.sh")]
    assert len(from_source) >= 3 and "scripts/build-bpa.sh" in r.stdout, r.stdout
    assert all(f"'{b}|" in r.stdout for b in from_source), r.stdout  # every agent with a recipe
