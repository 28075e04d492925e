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

C2DTN_CACHE ?= $(HOME)/.cache/c2dtn
.DEFAULT_GOAL := demo

# Each agent's build is beside its driver (overlay/agents/make/<kind>.mk, and <kind>.sh for
# one built from source): the default agent's into TOOLS (`make tools`), the others into
# BPA_BUILDS as kind|version|source archive, each with the Debian packages it needs
# (APT_BPAS). Those come from their public source archives (no registry carries them):
# ../shared/bpa-src/ unless <KIND>_SRC names another. Each is built once per machine into the
# cache beside the default agent, keyed by version; a build that fails is recorded
# (<cache>/<kind>-<version>.failed, its own error line) and not retried until BPA_RETRY=1,
# and the tests that need that agent skip with the line.
BPA_SRC ?= $(abspath ../shared/bpa-src)
TOOLS :=
TOOLS_LINKS :=
BPA_BUILDS :=
BPA_AFTER :=
APT_BPAS :=
include $(sort $(wildcard overlay/agents/make/*.mk))
# the testbed's own source-built parts (CORE), built the same way
include $(sort $(wildcard topologies/make/*.mk))

.PHONY: demo test test-fast check docs deps apt apt-test venv tools bpas apt-bpas core promtool box-root clean down lock

# the demo runs on the default agent alone: it builds no other; ENGINE=core runs it on CORE
demo: apt venv tools $(if $(filter core,$(ENGINE)),core)
	$(BIN)/c2dtn perf $(if $(ENGINE),--engine $(ENGINE) )bft

# -v: each test's name as it starts (the live tests take minutes each), and the suite's progress
test: deps
	$(BIN)/pytest -ra -v --durations=30

deps: apt apt-test venv tools bpas core promtool box-root

# Debian packages only the tests use: tshark reads the emulator's captures as a second opinion
# (tests/test_mqtt_sn_live.py); headless Chromium and its driver load the drill view
# (tests/test_view_live.py)
APT_TEST := tshark:tshark chromium:chromium chromedriver:chromium-driver
apt-test:
	@missing=""; for need in $(APT_TEST); do \
	  cmd=$${need%%:*}; pkg=$${need##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	$(call apt_install,for the tests)

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

tools: $(TOOLS)
	@mkdir -p .tools && for l in $(TOOLS_LINKS); do ln -sfn "$${l%%:*}" ".tools/$${l##*:}"; done

# promtool checks what a node's /metrics serves (tests/test_metrics_live.py): Debian's prometheus
# package unpacked into the cache, keyed by version, not installed (no Prometheus server starts)
promtool:
	@v=$$(apt-cache show --no-all-versions prometheus 2>/dev/null | sed -n 's/^Version: //p' | head -1); \
	if [ -z "$$v" ] && [ "$$(id -u)" = 0 ]; then apt-get update -q >/dev/null; \
	  v=$$(apt-cache show --no-all-versions prometheus 2>/dev/null | sed -n 's/^Version: //p' | head -1); fi; \
	if [ -z "$$v" ]; then echo "promtool: no prometheus package in apt's lists (its test skips)"; exit 0; fi; \
	d="$(C2DTN_CACHE)/prometheus-$$v"; \
	if [ ! -x "$$d/usr/bin/promtool" ]; then \
	  echo "promtool: unpacking Debian's prometheus $$v into $$d"; \
	  t=$$(mktemp -d) && chmod 755 "$$t" && (cd "$$t" && apt-get download -q "prometheus=$$v" >/dev/null 2>&1) && \
	  rm -rf "$$d.part" && dpkg -x "$$t"/prometheus_*.deb "$$d.part" && rm -rf "$$d" && mv "$$d.part" "$$d"; \
	  rm -rf "$$t"; \
	fi; \
	if [ -x "$$d/usr/bin/promtool" ]; then mkdir -p .tools && ln -sfn "$$d/usr/bin/promtool" .tools/promtool; \
	else echo "promtool: unpacking prometheus $$v failed (its test skips)"; fi

# A clean Debian 12 root (debootstrap minbase with python3-venv) that tests/test_box_debian.py
# installs a box into, on an overlay mount (the root itself stays clean); built once into the
# cache (about a minute), keyed by the version below (raise it when the package list changes);
# a failure is recorded as the agents' are and the test skips naming it
BOX_ROOT := $(C2DTN_CACHE)/debian12-root-1
box-root:
	@if [ -e "$(BOX_ROOT)/.built" ] || { [ -e "$(BOX_ROOT).failed" ] && [ "$(BPA_RETRY)" != 1 ]; }; then exit 0; fi; \
	missing=""; command -v debootstrap >/dev/null 2>&1 || missing=" debootstrap"; \
	$(call apt_install,for the box-install test); \
	mkdir -p "$(C2DTN_CACHE)" && rm -rf "$(BOX_ROOT)" "$(BOX_ROOT).failed"; \
	echo "box-root: debootstrap bookworm (minbase, python3-venv) into $(BOX_ROOT), about a minute"; \
	if debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
	    "$(BOX_ROOT)/rootfs" http://deb.debian.org/debian > "$(BOX_ROOT).log" 2>&1; then touch "$(BOX_ROOT)/.built"; \
	else echo "debootstrap failed ($(BOX_ROOT).log): $$(tail -1 "$(BOX_ROOT).log")" > "$(BOX_ROOT).failed"; \
	  cat "$(BOX_ROOT).failed"; fi

bpas: apt-bpas
	@mkdir -p .tools && for b in $(foreach b,$(BPA_BUILDS),'$(b)'); do \
	  IFS='|' read -r kind version src <<< "$$b"; \
	  scripts/build-bpa.sh "$$kind" "$$src" "$(C2DTN_CACHE)/$$kind-$$version"; \
	  if [ -e "$(C2DTN_CACHE)/$$kind-$$version/.built" ]; then ln -sfn "$(C2DTN_CACHE)/$$kind-$$version" ".tools/$$kind"; fi; \
	done
	@for t in $(BPA_AFTER); do $(MAKE) --no-print-directory "$$t"; done

# apt-get install what the recipe gathered in $$missing (root only); $(1) says what for
apt_install = if [ -n "$$missing" ]; then \
	  echo "installing Debian packages$(if $(1), $(1)):$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install$$missing" >&2; exit 1; fi; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

apt-bpas:
	@missing=""; for pkg in $(sort $(APT_BPAS)); do \
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
