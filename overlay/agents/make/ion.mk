# ION-DTN from its public source archive (overlay/agents/make/ion.sh; about 6 minutes once).
ION_VERSION := 4.1.3
ION_SRC ?= $(BPA_SRC)/ion-open-source-$(ION_VERSION).tar.xz
BPA_BUILDS += ion|$(ION_VERSION)|$(ION_SRC)
APT_BPAS += autoconf automake libtool pkg-config make gcc
BPA_AFTER += .tools/c2dtn-ionbp

# the ION driver's hand on libbp (overlay/agents/ion_bp.c), built against the ION above
ION_ROOT := $(C2DTN_CACHE)/ion-$(ION_VERSION)
.tools/c2dtn-ionbp: overlay/agents/ion_bp.c
	@if [ -e "$(ION_ROOT)/.built" ]; then \
	  mkdir -p .tools && gcc -O2 -Wall -Werror -o $@ $< -I"$(ION_ROOT)/include" -L"$(ION_ROOT)/lib" \
	    -Wl,-rpath,"$(ION_ROOT)/lib" -lbp -lici -lpthread && echo "built $@"; \
	else echo "c2dtn-ionbp: not built (ION $(ION_VERSION) is not)"; fi
