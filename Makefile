# gpuoperator developer entry points. Everything runs from a virtual environment this
# Makefile creates (.venv); the control plane's binaries are built once into a cache
# outside the repository (hack/build-binaries.sh).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help venv binaries up down status lint test unit e2e bench clean

help:
	@echo "make up      start a local control plane with simulated GPU nodes, the CRDs and samples"
	@echo "make down    stop it"
	@echo "make test    lint (ruff, mypy, import-linter) and run every test (unit and e2e)"
	@echo "make bench   the benchmark table P1-P6 (quick; BENCH_ARGS=--full for issue 13's sizes)"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "==> creating $(VENV) and installing gpuoperator with its development tools"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

binaries:
	@hack/build-binaries.sh >/dev/null

up: venv
	@PYTHONPATH=hack $(BIN)/python -m localcluster up

down: venv
	@PYTHONPATH=hack $(BIN)/python -m localcluster down

status: venv
	@PYTHONPATH=hack $(BIN)/python -m localcluster status

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# One pytest run over unit and e2e tests, so its closing line counts them all.
# pytest's exit 5 (no test collected) is a failure here, never a silent pass.
test: lint binaries
	@$(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

unit: venv
	$(BIN)/pytest test/unit $(PYTEST_ARGS)

e2e: venv binaries
	$(BIN)/pytest test/e2e $(PYTEST_ARGS)

# The benchmark suite (hack/bench/suite.py): its own clusters, one table on stdout.
BENCH_ARGS ?=
bench: venv binaries
	@PYTHONPATH=hack:test $(BIN)/python hack/bench/suite.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
