# The Paho MQTT-SN gateway (UDP), run by scripts/build-bpa.sh in the unpacked source with $prefix and $jobs.
# The gateway links the packet library (shared): both go into $prefix, the binary finding it by rpath.
mkdir -p build
cd build
cmake .. -DSENSORNET=udp -DCMAKE_BUILD_RPATH="$prefix/lib"
make -j"$jobs" MQTTSNPacket MQTT-SNGateway
bin=$(find .. -type f -name MQTT-SNGateway -perm -u+x | head -1)
lib=$(find .. -name 'libMQTTSNPacket.so*' | head -1)
[ -n "$bin" ] && [ -n "$lib" ] || { echo "error: MQTT-SNGateway or libMQTTSNPacket.so not found after the build"; exit 1; }
mkdir -p "$prefix/bin" "$prefix/lib"
cp -P ../build/MQTTSNPacket/src/libMQTTSNPacket.so* "$prefix/lib/" 2>/dev/null || cp "$lib" "$prefix/lib/"
cp "$bin" "$prefix/bin/MQTT-SNGateway"
