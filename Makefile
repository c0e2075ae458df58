# gpuoperator developer entry points. Everything runs from a virtual environment this
# Makefile creates (.venv); the control plane's binaries are built once into a cache
# outside the repository (hack/build-binaries.sh).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

# Tool versions (plain KEY=VALUE files, shared with the hack/ scripts).
include hack/versions.env
include hack/tools.env
GPUOP_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpuoperator
KUBECTL     ?= $(GPUOP_CACHE)/bin/kubectl-$(KUBE_VERSION)

# The image of `make image` (tagged with the package version, as config/manager names it)
# and the kind cluster of `make e2e-kind` (config/overlays/kind runs the tag e2e).
VERSION      := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE        ?= gpuoperator:$(VERSION)
KIND_IMAGE   ?= gpuoperator:e2e
KIND         ?= kind
KIND_CLUSTER ?= gpuoperator-e2e
KIND_KUBECONFIG ?= $(GPUOP_CACHE)/kind/$(KIND_CLUSTER).kubeconfig

.PHONY: help venv binaries tools up down status lint test unit e2e chaos fuzz bench image image-test e2e-image e2e-kind clean

# `make help` prints every target that has a `## text` on its rule line, grouped under the
# `##@ Section` lines above them (kubebuilder's convention). A new target gets its line there.
##@ General

help: ## this list of targets
	@awk 'BEGIN {FS = ":.*##"; print "Usage: make <target>"} \
		/^[a-zA-Z0-9_-]+:.*##/ {printf "  %-10s %s\n", $$1, $$2} \
		/^##@/ {printf "\n%s\n", substr($$0, 5)}' $(firstword $(MAKEFILE_LIST))

##@ Setting up

venv: $(VENV)/.installed ## create .venv and install gpuoperator with its development tools

# setuptools announces every editable install of a flat layout with a warning that says
# nothing about this project ("Editable installation."): silenced for that one command.
$(VENV)/.installed: pyproject.toml
	@echo "==> creating $(VENV) and installing gpuoperator with its development tools"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

binaries: ## build the control plane (etcd, kube-*, kubectl, kwok) once into the cache
	@hack/build-binaries.sh >/dev/null

# promtool (the alerts' unit tests) and actionlint (the workflows), built once from the Go
# module proxy into the same cache; a cold build prints its progress.
tools: ## build the static-check tools (promtool, actionlint) once into the cache
	@hack/build-tools.sh promtool >/dev/null
	@hack/build-tools.sh actionlint >/dev/null

##@ The local cluster

# OPERATOR=process (default) runs the operator from this checkout; OPERATOR=image runs two
# replicas of the built image (make image) under podman with the Deployment's settings, as
# make e2e-image does; make down stops them too. CLUSTER names the cluster (default dev).
OPERATOR ?= process
CLUSTER  ?= dev

up: venv ## start a local control plane with simulated GPU nodes and the product deployed on it
	@if [ "$(OPERATOR)" = image ]; then \
		log=$(GPUOP_CACHE)/image-build.log; mkdir -p $(GPUOP_CACHE); \
		hack/image/build.sh $(IMAGE) >$$log 2>&1 || { tail -n 40 $$log >&2; exit 1; }; \
		echo "image $(IMAGE): $$(tail -n 1 $$log | sed 's/^make image: //') (log $$log)"; \
	fi
	@PYTHONPATH=hack $(BIN)/python -m localcluster --name $(CLUSTER) up --operator=$(OPERATOR)

down: venv ## stop the processes `make up` started, and only those
	@PYTHONPATH=hack $(BIN)/python -m localcluster --name $(CLUSTER) down

status: venv ## which components of the local cluster run
	@PYTHONPATH=hack $(BIN)/python -m localcluster --name $(CLUSTER) status

##@ Checks and tests

lint: venv ## ruff, ruff format, mypy --strict and import-linter
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# One pytest run over unit and e2e tests, so its closing line counts them all.
# pytest's exit 5 (no test collected) is a failure here, never a silent pass.
# The image's tests are `make image-test`'s (they need the image built).
test: lint binaries tools ## lint, then every test: unit, e2e and the bounded chaos suite
	@$(BIN)/pytest -m "not image" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The unit tests that need no Go-built binary: those that do (rendering config/ with the pinned
# kubectl's kustomize, promtool, actionlint) carry the needs_tools marker and run in `make test`.
unit: venv ## the unit tests that need no Go-built binary (fast, nothing to build)
	$(BIN)/pytest test/unit -m "not needs_tools" $(PYTEST_ARGS)

e2e: venv binaries ## the e2e suite against a control plane it starts (or E2E_KUBECONFIG)
	$(BIN)/pytest test/e2e $(PYTEST_ARGS)

# The full chaos suite on a control plane of its own; the bounded form runs in `make test`.
# It prints its figures (orders, kills, handover, over-allocations, stuck claims) at the end.
chaos: venv binaries ## the full chaos suite: 2,000 orders, 50 VMs, leader kills, faults
	CHAOS_SIZE=full $(BIN)/pytest test/chaos --timeout=3600 $(PYTEST_ARGS)

##@ Deploying

# Docker where its daemon answers, else podman (buildah) with hack/image/containers.conf and,
# unless BASE names one, a base made from Debian packages (hack/image/base.sh, cached under
# $(GPUOP_CACHE)/image-base). Dependencies come from requirements/runtime.txt, hash-checked.
image: ## build the operator's image (Docker, else podman with a base from Debian packages)
	@hack/image/build.sh $(IMAGE)

# The built image run as the Deployment runs it (test/image), one replica and then two under a
# stream of orders (a kill, a rolling update): its securityContext, /tmp,
# in-cluster configuration from a mounted ServiceAccount token, readiness, webhooks, against
# a local control plane of its own (E2E_CLUSTER_NAME, default image). Needs podman.
image-test: venv binaries image ## run the built image as config/manager deploys it (podman)
	IMAGE=$(IMAGE) $(BIN)/pytest test/image -p no:cacheprovider $(PYTEST_ARGS)

# The e2e suite against E2E_REPLICAS (default 2) replicas of the built image under podman,
# each run with the Deployment's settings (harness.containers) on the local control plane,
# the webhooks pointed at a ready one (harness.replicas): every test but those that control
# the operator's process (E2E_OPERATOR=podman; E2E_CLUSTER_NAME names the cluster).
e2e-image: venv binaries image ## the e2e suite against two replicas of the image (podman)
	IMAGE=$(IMAGE) E2E_OPERATOR=podman $(BIN)/pytest test/e2e -m "not operator_process" $(PYTEST_ARGS)

# Users' CI on kind (.github/workflows/e2e-kind.yaml runs exactly this): build the image,
# create the kind cluster (kept for the next run; KIND_CLUSTER names it), load the image,
# deploy config/overlays/kind, wait for both replicas, then run the e2e suite against the
# deployed operator (E2E_OPERATOR=deployed) instead of processes it starts itself; tests that
# must control the operator's process are deselected by their marker. The session scales the
# Deployment to 0 (webhooks removed) and back only around the modules that ask for the
# operator (test/harness/scaled.py), and leaves it with its replicas at the end.
e2e-kind: venv binaries ## image, kind cluster, config/overlays/kind, e2e against the deployment
	$(MAKE) image IMAGE=$(KIND_IMAGE)
	@command -v $(KIND) >/dev/null || { echo "make e2e-kind: $(KIND) is not installed (https://kind.sigs.k8s.io)" >&2; exit 1; }
	@mkdir -p $(dir $(KIND_KUBECONFIG))
	@$(KIND) get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)' \
		|| $(KIND) create cluster --name $(KIND_CLUSTER) --kubeconfig $(KIND_KUBECONFIG) --wait 180s
	$(KIND) export kubeconfig --name $(KIND_CLUSTER) --kubeconfig $(KIND_KUBECONFIG)
	$(KIND) load docker-image $(KIND_IMAGE) --name $(KIND_CLUSTER)
	$(KUBECTL) kustomize config/overlays/kind \
		| $(KUBECTL) --kubeconfig $(KIND_KUBECONFIG) apply --server-side --force-conflicts -f -
	$(KUBECTL) --kubeconfig $(KIND_KUBECONFIG) -n gpu-operator-system \
		rollout restart deployment/gpu-operator
	$(KUBECTL) --kubeconfig $(KIND_KUBECONFIG) -n gpu-operator-system \
		rollout status deployment/gpu-operator --timeout=300s
	E2E_KUBECONFIG=$(KIND_KUBECONFIG) E2E_OPERATOR=deployed \
		$(BIN)/pytest test/e2e -m "not operator_process" $(PYTEST_ARGS)

##@ Measuring

# The webhooks' bad-input sweep at scale (>= 10,000 requests) and the slow-client load,
# against the server as its own process; prints outcomes per category, latency and RSS.
FUZZ_ARGS ?=
fuzz: venv ## the webhooks' bad-input sweep (>= 10,000 requests), slow clients, RSS
	PYTHONPATH=.:hack:test $(BIN)/python test/fuzz/fuzz_admission.py $(FUZZ_ARGS)

# The benchmark suite (hack/bench/suite.py): its own clusters, one table on stdout.
BENCH_ARGS ?=
bench: venv binaries ## the benchmark table P1-P6 (quick; BENCH_ARGS=--full for full size)
	@PYTHONPATH=hack:test $(BIN)/python hack/bench/suite.py $(BENCH_ARGS)

##@ Housekeeping

clean: ## remove .venv and the linters' caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
