#!/usr/bin/env bash
# build-bpa.sh NAME ARCHIVE PREFIX
#
# Build one Bundle Protocol Agent from its public source archive (../shared/bpa-src/ by
# default: no registry carries them) into PREFIX, a version-keyed folder of the cache
# outside the clone, once per machine.  The facts of each build (flags, files the
# archives leave out) are in ../shared/bpa-src/README.md.
#
# A build that fails does not fail `make`: PREFIX.failed then holds the build's own
# error line (the tests that need this agent skip with it) and PREFIX.log the whole log.
set -u
name=$1 archive=$2 prefix=$3
log=$prefix.log
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
if [ ! -f "$archive" ]; then  # not a failed build: nothing is recorded, the next make tries again
  echo "$name: not built: source archive $archive not found (name another with ${name^^}_SRC=...)" >&2
  exit 0
fi
rm -f "$prefix.failed"
work=$(mktemp -d /tmp/c2-bpa-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "building $name from $(basename "$archive") into $prefix (once per machine; log: $log)"
tar -xf "$archive" -C "$work" || fail "cannot unpack $archive"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
# installed straight into PREFIX (libtool writes the library path into the binaries, so
# they cannot be moved afterwards); PREFIX/.built marks a finished build, anything else is redone
rm -rf "$prefix"
jobs=$(nproc)
(
  set -e
  cd "$src"
  case $name in
    ion)
      # configure is not in the tree; the committed top-level Makefile is a stale one;
      # the `all` target lists a PDF the archive leaves out
      rm -f Makefile
      touch ION-LTP-configuration.pdf
      autoreconf -fi
      ./configure --prefix="$prefix"
      make -j"$jobs"
      make install
      ;;
    ibrdtn)
      # gcc 12's default C++17 rejects its dynamic exception specifications
      export CXXFLAGS="-std=gnu++98 -O2"
      for sub in ibrcommon ibrdtn/ibrdtn ibrdtn/daemon ibrdtn/tools; do
        [ -d "$sub" ] || continue
        (cd "$sub" && ./autogen.sh && \
          PKG_CONFIG_PATH="$prefix/lib/pkgconfig" ./configure --prefix="$prefix" \
            --disable-netlink --disable-dtndht --without-vmime --disable-libdaemon --with-sqlite --with-openssl && \
          make -j"$jobs" && make install)
      done
      ;;
    hdtn)
      # only the one-process daemon the driver runs (its HDTN libraries link statically):
      # its tools and tests are not built; no web interface
      mkdir -p build && cd build
      cmake .. -DCMAKE_BUILD_TYPE=Release -DUSE_WEB_INTERFACE=OFF -DCMAKE_INSTALL_PREFIX="$prefix"
      make -j"$jobs" hdtn-one-process
      mkdir -p "$prefix/bin"
      cp module/hdtn_one_process/hdtn-one-process "$prefix/bin/"
      ;;
    *) echo "error: no recipe for $name"; exit 1 ;;
  esac
) > "$log" 2>&1 || { rm -rf "$prefix"; fail "$(grep -E '[Ee]rror|not found|No such' "$log" | grep -v '^checking' | tail -1 | cut -c1-300)"; }
touch "$prefix/.built"
echo "$name built into $prefix"
