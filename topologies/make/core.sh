# CORE (the Common Open Research Emulator), run by scripts/build-bpa.sh in the unpacked
# source with $prefix and $jobs: vnoded, vcmd and netns (C, autotools) into $prefix/bin, its
# daemon (Python, gRPC) into a venv of its own at $prefix/venv, PyPI's wheels at the versions
# the daemon pins; configure runs ./venv/bin/python -m grpc_tools, hence the link
python3 -m venv "$prefix/venv"
"$prefix/venv/bin/pip" install -q --disable-pip-version-check grpcio==1.69.0 grpcio-tools==1.69.0
ln -sfn "$prefix/venv" venv
./bootstrap.sh
./configure --prefix="$prefix"
make -j"$jobs"
make install
"$prefix/venv/bin/pip" install -q --disable-pip-version-check ./daemon
mkdir -p "$prefix/etc"
cp package/etc/core.conf package/etc/logging.conf "$prefix/etc/"
