# IBR-DTN, run by scripts/build-bpa.sh in the unpacked source with $prefix and $jobs.
# gcc 12's default C++17 rejects its dynamic exception specifications
export CXXFLAGS="-std=gnu++98 -O2"
for sub in ibrcommon ibrdtn/ibrdtn ibrdtn/daemon ibrdtn/tools; do
  [ -d "$sub" ] || continue
  (cd "$sub" && ./autogen.sh && \
    PKG_CONFIG_PATH="$prefix/lib/pkgconfig" ./configure --prefix="$prefix" \
      --disable-netlink --disable-dtndht --without-vmime --disable-libdaemon --with-sqlite --with-openssl && \
    make -j"$jobs" && make install)
done
