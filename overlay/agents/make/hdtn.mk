# HDTN from its public source archive (overlay/agents/make/hdtn.sh; about 17 minutes once).
HDTN_VERSION := 1.3.1
HDTN_SRC ?= $(BPA_SRC)/HDTN-$(HDTN_VERSION).tar.xz
BPA_BUILDS += hdtn|$(HDTN_VERSION)|$(HDTN_SRC)
APT_BPAS += cmake g++ make libzmq3-dev libssl-dev libboost-system-dev libboost-date-time-dev \
	libboost-filesystem-dev libboost-timer-dev libboost-thread-dev libboost-regex-dev \
	libboost-program-options-dev libboost-test-dev libboost-iostreams-dev libboost-random-dev libboost-log-dev
