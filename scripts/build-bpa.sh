#!/usr/bin/env bash
# build-bpa.sh NAME ARCHIVE PREFIX
#
# Build one Bundle Protocol Agent (or a testbed part built the same way: CORE) from its public source archive (../shared/bpa-src/ by
# default: no registry carries them) into PREFIX, a version-keyed folder of the cache
# outside the clone, once per machine.  The facts of each build (flags, files the
# archives leave out) are in ../shared/bpa-src/README.md.
#
# A build that fails does not fail `make`: PREFIX.failed then holds the build's own
# error line (the tests that need this agent skip with it) and PREFIX.log the whole log.
set -u
name=$1 archive=$2 prefix=$3
log=$prefix.log
root=$(cd "$(dirname "$0")/.." && pwd)
recipe=$root/overlay/agents/make/$name.sh
[ -f "$recipe" ] || recipe=$root/topologies/make/$name.sh  # a testbed part (CORE), built the same way
[ -e "$prefix/.built" ] && exit 0
if [ -e "$prefix.failed" ] && [ -z "${BPA_RETRY:-}" ]; then
  echo "$name: not built (an earlier build failed: $(cat "$prefix.failed"); BPA_RETRY=1 to try again)" >&2
  exit 0
fi
mkdir -p "$(dirname "$prefix")"
fail() {
  echo "$1" > "$prefix.failed"
  echo "$name: NOT BUILT: $1 (log: $log)" >&2
  exit 0
}
if [ ! -f "$recipe" ]; then
  echo "$name: not built: no recipe $recipe" >&2
  exit 0
fi
if [ ! -f "$archive" ]; then  # not a failed build: nothing is recorded, the next make tries again
  echo "$name: not built: source archive $archive not found (name another with ${name^^}_SRC=...)" >&2
  exit 0
fi
rm -f "$prefix.failed"
work=$(mktemp -d /tmp/c2-bpa-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "building $name from $(basename "$archive") into $prefix (once per machine; log: $log)"
tar -xf "$archive" -C "$work" || fail "cannot unpack $archive"
# the source tree: the archive's one top folder, or the archive's top itself (Paho's has none)
if [ "$(find "$work" -mindepth 1 -maxdepth 1 | wc -l)" = 1 ]; then
  src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
else
  src=$work
fi
# installed straight into PREFIX (libtool writes the library path into the binaries, so
# they cannot be moved afterwards); PREFIX/.built marks a finished build, anything else is redone
rm -rf "$prefix"
jobs=$(nproc)
(
  set -e
  cd "$src"
  # shellcheck source=/dev/null
  . "$recipe"
) > "$log" 2>&1 || { rm -rf "$prefix"; fail "$(grep -E '[Ee]rror|not found|No such' "$log" | grep -v '^checking' | tail -1 | cut -c1-300)"; }
touch "$prefix/.built"
echo "$name built into $prefix"
