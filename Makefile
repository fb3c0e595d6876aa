# make demo  - train the digits CNN on a spot TPU VM of the local Cloud TPU emulator, end to end
# make demo-gcs - the same with a gs:// store, through TensorFlow's own Cloud Storage filesystem (needs root)
# make test  - install everything the tests need, lint, and run every test
# make unit  - the unit lane only (pytest -m "unit and not slow"): no server, no TensorFlow, needs only .venv
# make fuzz  - the bad-input fuzzer's long profile (the unit lane runs its quick, fixed-seed one) and its runtime arm
# make swarm - the fault swarm: 2,000 seeds (SEEDS=, FIRST=) of faults through the real controller, checked
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

VENV := .venv
TFVENV := .venv-tf29
PY := $(VENV)/bin/python
TFPY := $(TFVENV)/bin/python
PIN_FILE := templates/requirements-tf29.txt

# The control plane's unit lane also runs on the oldest and newest supported Python.
COMPAT_PYTHONS := 3.10 3.13

.PHONY: setup demo demo-gcs test unit fuzz compat lint tools clean swarm

setup: $(VENV)/.stamp $(TFVENV)/.stamp $(TFVENV)/.pytest-stamp

# The first interpreter >= 3.10 on PATH. Silent about the others: a pyenv shim of a version not installed
# answers `command -v` and then complains on stderr when run.
FIND_PYTHON := for c in python3.12 python3.11 python3.10 python3; do \
	  if command -v $$c >/dev/null && $$c -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then \
	    command -v $$c; break; fi; \
	done

$(VENV)/.stamp: pyproject.toml
	@py=$$($(FIND_PYTHON)); \
	  if [ -z "$$py" ]; then echo "tpuops needs Python >= 3.10 for the control plane; none found on PATH" >&2; exit 1; fi; \
	  $$py -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# The data plane's runtime, built by the same code as 'tpuops runtime install' (Python 3.8, else 3.9/3.10).
$(TFVENV)/.stamp: $(PIN_FILE) | $(VENV)/.stamp
	$(VENV)/bin/tpuops runtime install --force --path $(TFVENV)
	touch $@

# The agent lane's test runner in the runtime (a stamp of its own, so that a runtime built before it gets it too).
$(TFVENV)/.pytest-stamp: $(TFVENV)/.stamp
	$(TFPY) -m pip install --quiet pytest pytest-xdist
	touch $@

# Debian packages the tests use: shellcheck, curl (required); PostgreSQL 15 (sweep study database),
# chromium (the sweep report opened headless), cron (tpuops schedule) - their tests skip visibly without them.
tools:
	@command -v shellcheck >/dev/null && command -v curl >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq shellcheck curl >/dev/null; \
	  else echo "shellcheck or curl is missing: sudo apt-get install shellcheck curl" >&2; exit 1; fi; }
	@missing=""; ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	  command -v crontab >/dev/null || missing="$$missing cron"; \
	  if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  elif [ -n "$$missing" ]; then echo "missing:$$missing (sudo apt-get install$$missing); their tests skip" >&2; fi

lint: setup
	$(VENV)/bin/ruff check .

# The unit lane is CPU-bound and its tests share nothing: it runs on every core (pytest-xdist, -n auto).
unit: $(VENV)/.stamp
	$(VENV)/bin/pytest -q -n auto -m "unit and not slow" tests

# The fault swarm (docs/testing.md): SEEDS seeds from FIRST on every core, with a progress bar and a summary table;
# JSON=1 prints the summary as JSON. Exit 1 when an invariant broke (each failing seed prints its replay command).
SEEDS ?= 2000
FIRST ?= 0
swarm: $(VENV)/.stamp
	$(VENV)/bin/python -m tpuops.sim.swarm --seeds $(SEEDS) --first $(FIRST) $(if $(JSON),--json)

# 2,000 random cases per property (not derandomized: each run explores new ground).
fuzz: $(VENV)/.stamp
	TPUOPS_FUZZ_PROFILE=long $(VENV)/bin/pytest -q tests/cli/test_fuzz_cli.py tests/cli/test_fuzz_parsers.py tests/cli/test_fuzz_runtime.py

# .venv-py310, .venv-py313: editable installs on those interpreters (PATH, pyenv or uv); a missing one is skipped, loudly.
compat: $(VENV)/.stamp
	@for v in $(COMPAT_PYTHONS); do \
	  venv=.venv-py$${v/./}; \
	  if [ ! -f $$venv/.stamp ] || [ pyproject.toml -nt $$venv/.stamp ]; then \
	    py=$$($(PY) -c "from tpuops.tfenv.pythons import find_python; print(find_python(['$$v']))" 2>/dev/null) \
	      || { echo "SKIPPED: the unit lane on Python $$v: no python$$v on PATH, under pyenv or through uv"; continue; }; \
	    rm -rf $$venv && $$py -m venv $$venv && $$venv/bin/pip install --quiet -e '.[dev]' && touch $$venv/.stamp; \
	  fi; \
	  echo "unit lane on Python $$v ($$venv)"; \
	  $$venv/bin/pytest -q -n auto -p no:cacheprovider -m "unit and not slow" tests; \
	done

# The unit lane ran in `compat`, on the oldest and the newest supported Python; the other lanes run here, on .venv's
# Python, so that no test runs twice. Where compat skipped an interpreter, the unit lane runs here too.
# Every lane runs on every core (pytest-xdist): about half of an end-to-end file's time is spent waiting on nodes,
# boots and passes, which another file's computing fills. A file stays on one worker (--dist loadfile), so its
# module fixtures (one emulator, one reference run) are built once; tests own their ports, addresses and homes.
test: setup tools lint compat
	@if command -v terraform >/dev/null; then TF_CLI_CONFIG_FILE=/dev/null terraform fmt -check -recursive infra; else echo "terraform not installed: skipping terraform fmt -check of infra/"; fi
	@lanes="not (unit and not slow)"; \
	  for v in $(COMPAT_PYTHONS); do [ -f .venv-py$${v/./}/.stamp ] || lanes="unit or not unit"; done; \
	  echo "$(VENV)/bin/pytest -q -n auto --dist loadfile -m \"$$lanes\" tests"; \
	  $(VENV)/bin/pytest -q -n auto --dist loadfile -m "$$lanes" tests
	$(TFVENV)/bin/pytest -q -n auto -p no:cacheprovider --confcutdir=tests/agent tests/agent

DEMO_HOME := $(CURDIR)/.tpuops-demo
TPUOPS := $(CURDIR)/$(VENV)/bin/tpuops
# Every step of a demo runs under `set -e` (SHELLFLAGS): the first step that fails fails the target, and the
# trap still stops the emulator. Steps are `;`-separated, never `a && b`, whose `a` set -e would let fail.
demo: setup
	rm -rf $(DEMO_HOME)
	mkdir -p $(DEMO_HOME)
	set -e; export TPUOPS_HOME=$(DEMO_HOME) TPUOPS_CONFIG=$(DEMO_HOME)/tpuops.toml; \
	trap '$(TPUOPS) emulator stop' EXIT; \
	$(TPUOPS) init --provider local --zone us-central1-a --zone us-central1-b --path $$TPUOPS_CONFIG; \
	$(TPUOPS) emulator start --boot-delay 2; \
	$(TPUOPS) data sample digits $(DEMO_HOME)/data/digits; \
	cd $(DEMO_HOME); \
	$(TPUOPS) train $(CURDIR)/experiments/digits_cnn.yaml --name digits-demo --follow; \
	$(TPUOPS) runs; \
	$(TPUOPS) cost; \
	$(TPUOPS) status

# make demo-gcs - the same on a gs:// store: the emulator serves the bucket through fake-gcs-server, and the
# node's TensorFlow reads the shards and writes checkpoints, events, the SavedModel through its own Cloud
# Storage filesystem (https://storage.googleapis.com, the node's metadata token), as on a TPU VM. Needs root.
DEMO_GCS_HOME := $(CURDIR)/.tpuops-demo-gcs
# Where nodes cannot get private mount namespaces it stops with the reason, rather than quietly demoing the
# local store.
demo-gcs: setup
	set -e; reason=$$($(PY) -c 'from tpuops.emulator import unavailable_reason as r; print(r() or "")'); \
	if [ -n "$$reason" ]; then echo "make demo-gcs: $$reason" >&2; exit 1; fi
	rm -rf $(DEMO_GCS_HOME)
	mkdir -p $(DEMO_GCS_HOME)
	set -e; export TPUOPS_HOME=$(DEMO_GCS_HOME) TPUOPS_CONFIG=$(DEMO_GCS_HOME)/tpuops.toml; \
	trap '$(TPUOPS) emulator stop' EXIT; \
	$(TPUOPS) init --provider local --zone us-central1-a --zone us-central1-b --store gs://tpuops-demo/tpuops \
	  --path $$TPUOPS_CONFIG; \
	$(TPUOPS) emulator start --boot-delay 2; \
	$(TPUOPS) doctor; \
	$(TPUOPS) data sample digits $(DEMO_GCS_HOME)/data/digits; \
	cd $(DEMO_GCS_HOME); \
	$(TPUOPS) train $(CURDIR)/experiments/digits_cnn.yaml --name digits-demo --follow; \
	$(TPUOPS) runs; \
	$(TPUOPS) cost

clean:
	rm -rf $(VENV) $(TFVENV) .venv-py310 .venv-py313 .tpuops-demo .tpuops-demo-gcs .pytest_cache
