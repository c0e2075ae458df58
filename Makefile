# gpuoperator developer entry points. Everything runs from a virtual environment this
# Makefile creates (.venv); the control plane's binaries are built once into a cache
# outside the repository (hack/build-binaries.sh).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help venv binaries up down status lint test unit e2e chaos clean

help:
	@echo "make up      start a local control plane with simulated GPU nodes, the CRDs and samples"
	@echo "make down    stop it"
	@echo "make test    lint (ruff, mypy, import-linter) and run every test (unit, e2e, bounded chaos)"
	@echo "make chaos   the full chaos suite (issue 9): 2,000 orders, 50 VMs, leader kills, faults"

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

# The full chaos suite on a control plane of its own; the bounded form runs in `make test`.
# It prints its figures (orders, kills, handover, over-allocations, stuck claims) at the end.
chaos: venv binaries
	CHAOS_SIZE=full $(BIN)/pytest test/chaos --timeout=3600 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
