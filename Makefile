# doq developer entry points. `make serve` and `make test` set up .venv on first use:
# `make serve` installs only what the server needs (the base package), `make test` adds the
# extras (dev tools, PySpark, Pulumi: `.[all]`). Each install has its own stamp, and the full
# one also satisfies the server's, so the two never undo or repeat each other. Every install
# takes the pinned versions of constraints.txt (reproducible: the same set everywhere).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SERVER_STAMP := $(VENV)/.installed-server
DEV_STAMP := $(VENV)/.installed-dev
# Budget for the slow suites (long simulations) in CI.
SLOW_SEEDS ?= 300
# Test processes side by side (pytest-xdist; one file stays on one worker, and each worker
# picks ports from its own slice: tests/conftest.py). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
# `make chaos`: kill -9s of a real cluster under load, checked (python -m tools.chaos --help).
CHAOS_NODES ?= 3
CHAOS_KILLS ?= 50
CHAOS_DURATION ?= 400

.PHONY: setup serve test test-fast lint check-proto sim chaos backup-zip mutation mutation-results mutation-sample mutation-sample-service

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(SERVER_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install -q -c constraints.txt -e .
	touch $(SERVER_STAMP)

$(DEV_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install -q -c constraints.txt -e '.[all]'
	touch $(SERVER_STAMP) $(DEV_STAMP)

setup: $(DEV_STAMP)

serve: $(SERVER_STAMP)
	$(VENV)/bin/doq serve

check-proto: $(DEV_STAMP)
	$(PY) proto/generate.py --check
	$(PY) clients/python/unasync.py --check

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy doq tools bench clients/python/doq_client
	PYTHONPATH=.:clients/python $(VENV)/bin/lint-imports

# The failed tests are printed again last, from the JUnit report: CI shows a log's tail.
test-fast: $(DEV_STAMP)
	@mkdir -p build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10 --junitxml=build/junit-default.xml || { $(PY) -m tools.failed_tests build/junit-default.xml; exit 1; }

test: check-proto lint test-fast
	DOQ_SIM_SEEDS=$(SLOW_SEEDS) $(PY) -m pytest -q -m slow -x -n $(TEST_WORKERS) --dist loadfile --junitxml=build/junit-slow.xml || { $(PY) -m tools.failed_tests build/junit-slow.xml; exit 1; }

sim: $(DEV_STAMP)
	$(PY) -m tools.sim --seeds 0:5000 --nodes 5

chaos: $(SERVER_STAMP)
	$(PY) -m tools.chaos --nodes $(CHAOS_NODES) --kills $(CHAOS_KILLS) --duration $(CHAOS_DURATION)

# Mutation testing of the pure cores (docs/testing.md): slow (hours on 2 CPUs), not in CI.
# Results stay in mutants/ (a rerun continues where a stopped one left off); MUTANTS picks a
# slice, e.g. `make mutation MUTANTS='doq.queues.fair*'`. `make mutation-results`: the score
# per module and each survivor (tools/mutation_report.py); `.venv/bin/mutmut show NAME` shows one.
MUTANTS ?=
MUTATION_CHILDREN ?= 1
mutation: $(DEV_STAMP)
	DOQ_MUTATION=1 nice $(VENV)/bin/mutmut run --max-children $(MUTATION_CHILDREN) $(MUTANTS)

mutation-results: $(DEV_STAMP)
	$(PY) -m tools.mutation_report --survivors

# A seeded uniform random sample of N mutants per package, run, then scored with a Wilson
# 95 % interval (docs/testing.md "A sample of the mutants").
SEED ?= 17
N ?= 400
PACKAGES ?= doq.raft doq.queues
mutation-sample: $(DEV_STAMP)
	nice $(PY) -m tools.mutation_sample run --seed $(SEED) --n $(N) --packages $(PACKAGES) --children $(MUTATION_CHILDREN)
	$(PY) -m tools.mutation_sample score --seed $(SEED) --n $(N) --packages $(PACKAGES)

# The same for the service layer, in its own mutmut directory with its own test selection
# (tools/mutmut-service.toml: in-process tests only). SERVICE_N: see docs/testing.md.
SERVICE_N ?= 200
SERVICE_DIR ?= build/mutation-service
mutation-sample-service: $(DEV_STAMP)
	nice $(PY) -m tools.mutation_sample run --seed $(SEED) --n $(SERVICE_N) --packages doq.service --workdir $(SERVICE_DIR) --config tools/mutmut-service.toml --children $(MUTATION_CHILDREN)
	$(PY) -m tools.mutation_sample score --seed $(SEED) --n $(SERVICE_N) --packages doq.service --workdir $(SERVICE_DIR)

# The doq package as a zip for `spark-submit --py-files` (backup/README.md).
backup-zip: $(SERVER_STAMP)
	$(PY) backup/make_zip.py build/doq-verify.zip
