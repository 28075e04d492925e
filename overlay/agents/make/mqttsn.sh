# The Paho MQTT-SN gateway (UDP), run by scripts/build-bpa.sh in the unpacked source with $prefix and $jobs.
mkdir -p build
cd build
cmake .. -DSENSORNET=udp
make -j"$jobs" MQTT-SNGateway
bin=$(find . -type f -name MQTT-SNGateway -perm -u+x | head -1)
[ -n "$bin" ] || { echo "error: MQTT-SNGateway not found after the build"; exit 1; }
mkdir -p "$prefix/bin"
cp "$bin" "$prefix/bin/MQTT-SNGateway"
