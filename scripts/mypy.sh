#!/usr/bin/env bash
# mypy over the typed modules ([tool.mypy] modules in pyproject.toml), as they are installed:
# the folders are mapped under c2dtn.* (pyproject's package-dir), which mypy cannot follow
# through the editable install's import hook, so a tree of links lays them out for it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=.tools/mypy-src
rm -rf "$tree" && mkdir -p "$tree/c2dtn"
for f in c2dtn/*.py; do ln -s "$root/$f" "$tree/c2dtn/"; done
for pair in overlay:overlay ip-gateway:ip_gateway cla-adapters:cla_adapters topologies:topologies perf:perf; do
  ln -s "$root/${pair%%:*}" "$tree/c2dtn/${pair##*:}"
done
cd "$tree"
MYPYPATH=$PWD exec "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.tools/mypy-cache" "$@"
