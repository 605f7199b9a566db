# Cortex — the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo build bench debug-build clean dist dist-smoke

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

# The one-file executable dist/cortex (PyInstaller, packaging/cortex.spec): Cortex, its Cython
# units and native dependencies in one file to copy to a host (packaging/cortex.service runs it).
DIST_STAMP := $(VENV)/.dist-installed
$(DIST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q --no-build-isolation -e '.[test,dist]'
	touch $(DIST_STAMP)

dist: build $(DIST_STAMP)
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN --distpath dist \
		--workpath build/pyinstaller packaging/cortex.spec

# Build it, then smoke-test the binary: --version, check-config, cortex sim + cortex serve.
dist-smoke: dist
	CORTEX_DIST_REQUIRED=1 $(BIN)/python -m pytest -q tests/integration/test_dist_binary.py

# CI (CI=true) builds the binary before the suite, whose smoke test then runs it (a missing or
# stale binary fails instead of skipping): ~1 min of CPU for the build, see perf/RESULTS.md.
ifeq ($(CI),true)
test: dist
export CORTEX_DIST_REQUIRED := 1
endif

clean:
	rm -rf $(VENV) build cortex/_fast/*.c cortex/_fast/*.so cortex/_fast/*.html
