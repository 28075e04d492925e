# The Eclipse Paho MQTT-SN gateway, from its public source archive (overlay/agents/make/mqttsn.sh;
# under a minute once). Not a BPA: the MQTT-SN baseline of seed 001 (`perf bft --modes mqtt-sn`),
# built by the same machinery and cached beside the agents.
MQTTSN_VERSION := 07a9512
MQTTSN_SRC ?= $(BPA_SRC)/paho-mqtt-sn-embedded-c-$(MQTTSN_VERSION).tar.xz
BPA_BUILDS += mqttsn|$(MQTTSN_VERSION)|$(MQTTSN_SRC)
APT_BPAS += cmake g++ make
