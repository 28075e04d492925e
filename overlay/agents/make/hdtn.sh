# HDTN, run by scripts/build-bpa.sh in the unpacked source with $prefix and $jobs.
# only the one-process daemon the driver runs (its HDTN libraries link statically):
# its tools and tests are not built; no web interface
mkdir -p build && cd build
cmake .. -DCMAKE_BUILD_TYPE=Release -DUSE_WEB_INTERFACE=OFF -DCMAKE_INSTALL_PREFIX="$prefix"
make -j"$jobs" hdtn-one-process
mkdir -p "$prefix/bin"
cp module/hdtn_one_process/hdtn-one-process "$prefix/bin/"
