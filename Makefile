# outbox: `make demo` runs the product, `make test` runs the tests. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.install-stamp
LINT_PATHS := outbox tests bench cmd docs/examples

.DEFAULT_GOAL := help
.PHONY: help install test test-unit test-faults test-citus lint schema demo examples bench soak clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "outbox needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv with the package, test and lint dependencies

test: $(STAMP) ## Run the tests (OUTBOX_TEST_DSN, or a throwaway local PostgreSQL)
	$(PY) -m pytest $(PYTEST_ARGS)

# No DSN and no PostgreSQL binaries on PATH: the unit tier needs neither.
test-unit: $(STAMP) ## Run the unit tier only: pure policy, no PostgreSQL at all (~30 s)
	env -u OUTBOX_TEST_DSN PATH="$(abspath $(VENV))/bin:/usr/bin:/bin" $(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-faults: $(STAMP) ## Run the fault tier: real faults against worker processes (~5 min)
	$(PY) -m pytest tests/faults -m faults $(PYTEST_ARGS)

# The Citus tier: the core behaviour tests against the coordinator of a throwaway three-node
# cluster, and tests/citus (router guard, kill soak, a node stopped mid-drain). Citus comes
# from the server's pkglibdir, or is built from the tarball CITUS_SRC names (root, apt).
CITUS_CORE := $(patsubst %,tests/integration/test_%.py,append append_keys worker batch_apply \
	lease dedup repair discard reconcile projectors heal known_projectors tracks failure_reports modes \
	pauses queries_prepare catch_up checkpoint_moves append_heads plans versions build \
	rebuild_engine sql_projectors definitions event_versions sparse_types)
test-citus: $(STAMP) ## Run the Citus tier (~17 min): Citus found, or built from CITUS_SRC
	@bindir="$$($(PY) -c 'from outbox.testing.localpg import find_bindir; print(find_bindir())')"; \
	rc=0; bash tests/citus/ensure-citus.sh "$$bindir" || rc=$$?; \
	if [ $$rc = 3 ] && [ -z "$(CITUS_SRC)" ]; then \
		echo "test-citus: NOT RUN: no Citus on this machine (set CITUS_SRC to build one)" >&2; exit 0; \
	elif [ $$rc != 0 ]; then echo "test-citus: FAILED: could not get a Citus" >&2; exit 1; fi
	$(PY) -m pytest --citus tests/citus $(CITUS_CORE) $(PYTEST_ARGS)

lint: $(STAMP) ## ruff check, ruff format --check, mypy --strict, the import contracts
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

schema: $(STAMP) ## Regenerate sql/schema.sql: a fresh install, dumped (a test fails when it is stale)
	$(PY) tests/schema_snapshot.py

demo: $(STAMP) ## Run the demo: local PostgreSQL (or OUTBOX_DSN), migrate, append, drain, report
	$(PY) cmd/demo.py

examples: $(STAMP) ## Run the idempotency examples (docs/idempotency.md; EXAMPLES_ARGS="upsert --copies 5")
	PYTHONPATH=docs/examples $(PY) -m idempotency_examples $(EXAMPLES_ARGS)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) ## Run the benchmarks (durable local PostgreSQL, and Citus where found; ~45 min) and print their figures
	$(PY) bench/run.py $(BENCH_ARGS)

SOAK_MINUTES ?= 10
soak: $(STAMP) ## A long run under load and faults: memory, bloat, throughput (SOAK_MINUTES=10)
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

clean: ## Stop the demo cluster, remove .venv, .outbox and caches
	@if [ -x $(PY) ] && [ -d .outbox ]; then $(PY) cmd/demo.py --remove || true; fi
	rm -rf $(VENV) .outbox soak.png .pytest_cache .mypy_cache .ruff_cache .hypothesis dist build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
