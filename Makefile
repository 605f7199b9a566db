# Cortex — the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo build bench debug-build clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=70" wheel "Cython>=3.0.10"
	$(BIN)/pip install -q --no-build-isolation -e '.[test]'
	touch $(STAMP)

# Compile the Cython units in place (cheap when nothing changed).
build: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace

# The whole suite, from a clean checkout.
test: build
	$(BIN)/python -m pytest

# Debug build: bounds checks, line tracing, -O0 -g; then the suite again.
debug-build: $(STAMP)
	CORTEX_CYTHON_DEBUG=1 $(BIN)/python setup.py -q build_ext --inplace --force

# A slice of the Mooncake conversation trace through Cortex and through round robin on
# simulated engines (real HTTP, real ZeroMQ events): a table and a chart; then the ledger
# against the engines' caches under injected faults. Under 3 minutes; exit 0 when all held.
demo: build
	$(BIN)/python -m cortex demo

# Benchmarks (figures go to perf/RESULTS.md by hand, with the command and machine).
bench: build
	$(BIN)/python perf/bench_ledger.py
	$(BIN)/python perf/bench_ingest.py

clean:
	rm -rf $(VENV) build cortex/_fast/*.c cortex/_fast/*.so cortex/_fast/*.html
