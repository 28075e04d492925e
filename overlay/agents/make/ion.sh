# ION-DTN, run by scripts/build-bpa.sh in the unpacked source with $prefix and $jobs.
# configure is not in the tree; the committed top-level Makefile is a stale one;
# the `all` target lists a PDF the archive leaves out
rm -f Makefile
touch ION-LTP-configuration.pdf
autoreconf -fi
./configure --prefix="$prefix"
make -j"$jobs"
make install
