# CORE, the emulator `topo up --engine core` drives (topologies/make/core.sh; under a minute
# once): a testbed part, not a box's, built from its public source archive as the agents are,
# cached by version outside the clone, its failure recorded and its tests skipped naming it.
CORE_VERSION := 9.2.1
CORE_SRC ?= $(BPA_SRC)/core-$(CORE_VERSION)-a5cff7f9.tar.xz
CORE_ROOT := $(C2DTN_CACHE)/core-$(CORE_VERSION)
APT_CORE := autoconf automake libtool pkg-config make gcc libev-dev python3-venv

core:
	@missing=""; for pkg in $(APT_CORE); do \
	  dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "ok installed" || missing="$$missing $$pkg"; \
	done; \
	$(call apt_install,for the CORE build)
	@mkdir -p .tools && scripts/build-bpa.sh core "$(CORE_SRC)" "$(CORE_ROOT)"; \
	if [ -e "$(CORE_ROOT)/.built" ]; then ln -sfn "$(CORE_ROOT)" .tools/core; echo "core: CORE $(CORE_VERSION) is built in $(CORE_ROOT)"; fi
