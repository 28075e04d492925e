# IBR-DTN from its public source archive (overlay/agents/make/ibrdtn.sh; about 8 minutes once).
IBRDTN_VERSION := 103bab3d
IBRDTN_SRC ?= $(BPA_SRC)/ibrdtn-$(IBRDTN_VERSION).tar.xz
BPA_BUILDS += ibrdtn|$(IBRDTN_VERSION)|$(IBRDTN_SRC)
APT_BPAS += autoconf automake libtool pkg-config make g++ libsqlite3-dev libssl-dev zlib1g-dev
