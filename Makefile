# doq developer entry points. `make serve` and `make test` set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Budget for the slow suites (long simulations) in CI.
SLOW_SEEDS ?= 300
# `make chaos`: kill -9s of a real cluster under load, checked (python -m doq.chaos --help).
CHAOS_NODES ?= 3
CHAOS_KILLS ?= 50
CHAOS_DURATION ?= 400

.PHONY: setup serve test test-fast lint check-proto sim chaos

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all]'
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/doq serve

check-proto: $(STAMP)
	$(PY) proto/generate.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy doq

test-fast: $(STAMP)
	$(PY) -m pytest -q

test: check-proto lint test-fast
	DOQ_SIM_SEEDS=$(SLOW_SEEDS) $(PY) -m pytest -q -m slow -x

sim: $(STAMP)
	$(PY) -m doq.sim --seeds 0:5000 --nodes 5

chaos: $(STAMP)
	$(PY) -m doq.chaos --nodes $(CHAOS_NODES) --kills $(CHAOS_KILLS) --duration $(CHAOS_DURATION)
