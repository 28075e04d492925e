# c2dtn: `make demo` runs the main job, `make test` runs the tests.
# Both install what they need on a fresh Debian 12 machine (apt packages,
# the project's own virtual environment) and reuse what is already there.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages, as "command:package"; only missing commands are installed.
APT_NEEDS := ip:iproute2 tc:iproute2 ethtool:ethtool ping:iputils-ping

.PHONY: demo test deps apt venv clean down

demo: deps
	$(BIN)/c2dtn topo demo

test: deps
	$(BIN)/pytest -ra

deps: apt venv

apt:
	@missing=""; for need in $(APT_NEEDS); do \
	  cmd=$${need%%:*}; pkg=$${need##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install$$missing" >&2; exit 1; fi; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "c2dtn needs Python 3.11 or newer, found " + sys.version' 
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

down: venv
	$(BIN)/c2dtn topo down

clean: down
	rm -rf $(VENV) *.egg-info
