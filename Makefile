# c2dtn: `make demo` runs the main job, `make test` runs the tests.
# Both install what they need on a fresh Debian 12 machine (apt packages,
# the project's own virtual environment) and reuse what is already there.

SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages, as "command:package"; only missing commands are installed.
APT_NEEDS := ip:iproute2 tc:iproute2 ethtool:ethtool ping:iputils-ping curl:curl nft:nftables \
  mosquitto:mosquitto mosquitto_pub:mosquitto-clients coap-client-notls:libcoap3-bin cc:gcc tcpdump:tcpdump

# dtn7-rs is built once per version into a cache outside the clone (about 4
# minutes on a fresh machine, docs/install.md) and linked into .tools/; a fresh clone on the same machine reuses it.
DTN7_VERSION := 0.21.0
C2DTN_CACHE ?= $(HOME)/.cache/c2dtn
DTN7_ROOT := $(C2DTN_CACHE)/dtn7-$(DTN7_VERSION)

# ION-DTN, IBR-DTN and HDTN come from their public source archives (no registry carries
# them): ../shared/bpa-src/ unless ION_SRC / IBRDTN_SRC / HDTN_SRC name others. Each is
# built once per machine into the cache beside dtn7-rs (ION about 6 minutes, IBR-DTN about
# 8, HDTN about 17: only its hdtn-one-process); a build that fails is recorded (<cache>/<bpa>-<version>.failed, its own error line)
# and not retried until BPA_RETRY=1, and the tests that need that agent skip with the line.
BPA_SRC ?= $(abspath ../shared/bpa-src)
ION_VERSION := 4.1.3
ION_SRC ?= $(BPA_SRC)/ion-open-source-$(ION_VERSION).tar.xz
IBRDTN_VERSION := 103bab3d
IBRDTN_SRC ?= $(BPA_SRC)/ibrdtn-$(IBRDTN_VERSION).tar.xz
HDTN_VERSION := 1.3.1
HDTN_SRC ?= $(BPA_SRC)/HDTN-$(HDTN_VERSION).tar.xz
# Debian packages the BPA builds need (checked with dpkg; only missing ones are installed)
APT_BPAS := autoconf automake libtool pkg-config make g++ libsqlite3-dev libssl-dev zlib1g-dev \
	cmake libzmq3-dev libboost-system-dev libboost-date-time-dev libboost-filesystem-dev libboost-timer-dev \
	libboost-thread-dev libboost-regex-dev libboost-program-options-dev libboost-test-dev \
	libboost-iostreams-dev libboost-random-dev libboost-log-dev

.PHONY: demo test test-fast check docs deps apt venv tools bpas apt-bpas clean down lock

# the demo runs on dtn7-rs alone: it builds no other agent
demo: apt venv tools
	$(BIN)/c2dtn perf bft

# -v: each test's name as it starts (the live tests take minutes each), and the suite's progress
test: deps
	$(BIN)/pytest -ra -v --durations=30

deps: apt venv tools bpas

# the edit-test loop: every test that needs no namespace and no built agent (about 3 minutes)
test-fast: venv
	$(BIN)/pytest -q -m "not netns and not bpa"

# lint, format and types; CI runs it before the tests (ruff --fix and ruff format mend most)
check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	scripts/mypy.sh

# the documentation site (MkDocs, Material theme) at http://127.0.0.1:8000; CI builds it with --strict
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

tools: $(DTN7_ROOT)/bin/dtnd
	@mkdir -p .tools && ln -sfn $(DTN7_ROOT) .tools/dtn7

# the newest rust-version among dtn7-rs's locked dependencies (clap 4.5); Debian 12's own rustc is older
DTN7_RUST := 1.74
$(DTN7_ROOT)/bin/dtnd:
	@have=$$(rustc --version 2>/dev/null | cut -d' ' -f2); \
	if [ -z "$$have" ] || ! command -v cargo >/dev/null || \
	   [ "$$(printf '%s\n' $(DTN7_RUST) "$$have" | sort -V | head -1)" != $(DTN7_RUST) ]; then \
	  echo "dtn7-rs $(DTN7_VERSION) is built with cargo and needs Rust $(DTN7_RUST) or newer; found: $${have:-no rustc}." >&2; \
	  echo "Debian 12's rustc is 1.63: install a current one with rustup (https://rustup.rs), then run make again." >&2; \
	  exit 1; fi
	@echo "building dtn7-rs $(DTN7_VERSION) into $(DTN7_ROOT) (once per machine, about 4 minutes)"
	rm -rf $(DTN7_ROOT).partial
	cargo install dtn7 --version $(DTN7_VERSION) --locked --root $(DTN7_ROOT).partial
	rm -rf $(DTN7_ROOT) && mv $(DTN7_ROOT).partial $(DTN7_ROOT)

bpas: apt-bpas
	@scripts/build-bpa.sh ion "$(ION_SRC)" "$(C2DTN_CACHE)/ion-$(ION_VERSION)"
	@scripts/build-bpa.sh ibrdtn "$(IBRDTN_SRC)" "$(C2DTN_CACHE)/ibrdtn-$(IBRDTN_VERSION)"
	@scripts/build-bpa.sh hdtn "$(HDTN_SRC)" "$(C2DTN_CACHE)/hdtn-$(HDTN_VERSION)"
	@mkdir -p .tools && for b in ion-$(ION_VERSION) ibrdtn-$(IBRDTN_VERSION) hdtn-$(HDTN_VERSION); do \
	  if [ -e "$(C2DTN_CACHE)/$$b/.built" ]; then ln -sfn "$(C2DTN_CACHE)/$$b" ".tools/$${b%%-*}"; fi; done
	@$(MAKE) --no-print-directory .tools/c2dtn-ionbp

# the ION driver's hand on libbp (overlay/agents/ion_bp.c), built against the ION above
ION_ROOT := $(C2DTN_CACHE)/ion-$(ION_VERSION)
.tools/c2dtn-ionbp: overlay/agents/ion_bp.c
	@if [ -e "$(ION_ROOT)/.built" ]; then \
	  mkdir -p .tools && gcc -O2 -Wall -Werror -o $@ $< -I"$(ION_ROOT)/include" -L"$(ION_ROOT)/lib" \
	    -Wl,-rpath,"$(ION_ROOT)/lib" -lbp -lici -lpthread && echo "built $@"; \
	else echo "c2dtn-ionbp: not built (ION $(ION_VERSION) is not)"; fi

# apt-get install what the recipe gathered in $$missing (root only); $(1) says what for
apt_install = if [ -n "$$missing" ]; then \
	  echo "installing Debian packages$(if $(1), $(1)):$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install$$missing" >&2; exit 1; fi; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

apt-bpas:
	@missing=""; for pkg in $(APT_BPAS); do \
	  dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "ok installed" || missing="$$missing $$pkg"; \
	done; \
	$(call apt_install,for the BPA builds)

apt:
	@missing=""; for need in $(APT_NEEDS); do \
	  cmd=$${need%%:*}; pkg=$${need##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	test -x $(BIN)/python || $(PYTHON) -c 'import ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	$(call apt_install,)

venv: $(VENV)/.installed

# The exact versions come from the lock file (requirements/dev.lock: the box's dependencies
# plus the [perf] and [test] extras), so the versions behind a published figure can be named.
$(VENV)/.installed: pyproject.toml requirements/dev.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "c2dtn needs Python 3.11 or newer, found " + sys.version' 
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/dev.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# Re-resolve the lock files after a change of pyproject.toml's dependencies (pip-tools).
LOCK_FLAGS := --strip-extras --no-emit-index-url --no-emit-find-links --unsafe-package c2dtn
lock: venv
	$(BIN)/pip install -q --disable-pip-version-check pip-tools
	$(BIN)/pip-compile -q $(LOCK_FLAGS) -o requirements/box.lock pyproject.toml
	$(BIN)/pip-compile -q $(LOCK_FLAGS) --extra perf --extra test -o requirements/dev.lock pyproject.toml

down: venv
	$(BIN)/c2dtn topo down

clean: down
	rm -rf $(VENV) *.egg-info
