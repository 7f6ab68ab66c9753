# The newcomer's commands. `make up` brings Vigil up on a local cluster and runs the examples; `make test` runs every test
# (it builds the control plane on first use and starts the cluster the tests need).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up down status test unit lint testbed image venv clean dist

venv: $(STAMP)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Builds the control plane (etcd, Kubernetes, kwok) and the tests' tools (helm, helm-docs, promtool,
# kstatus, the prometheus-operator CRDs) from the Go module proxy into ~/.cache/vigil (once).
testbed:
	testbed/build.sh all

# Vigil's image from the Dockerfile, with podman (installed with apt-get when missing), on a base
# from Debian's packages when no registry answers: localhost/vigil:<version>, the chart's default
# image, and localhost/vigil:src-<hash>. Nothing is rebuilt while its sources are unchanged.
image:
	testbed/image.sh

# The release's artifacts in dist/, versioned by vigil.__version__: the chart packaged, install.yaml,
# a kustomize base, the image as an OCI archive and its tags, kubectl-vigil as one file with its krew
# manifest, and SHA256SUMS (release/dist.sh says what each is). It builds the image and the tools it needs.
dist: venv
	release/dist.sh

# The cluster, Vigil's CRDs and operator, and the example jobs run until each has finished. It
# builds only what the demo needs (etcd, Kubernetes, kwok). VIGIL_CLUSTER and VIGIL_PORT_BASE
# (read by testbed.demo and testbed.cluster) run it as another cluster; `make down` stops that one.
# REAL_NODE=1 (root) adds the bed's real node (the kubelet and containerd too, and Vigil's image)
# and runs examples/any-image/ on it: the heartbeat, Uncertain, Lost, NoOverlap, a checkpoint.
REAL_NODE ?=
up: venv
	testbed/build.sh $(if $(filter-out 0,$(REAL_NODE)),real-node,demo)
	VIGIL_REAL_NODE=$(REAL_NODE) $(BIN)/python -m testbed.demo

down:
	$(PYTHON) -m testbed.cluster down

status:
	$(PYTHON) -m testbed.cluster status

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -m unit

# Every test. The lint and the pure tests (-m unit: no cluster, about 2 minutes of one core) run
# beside the cluster's at the lowest CPU priority, so they take what the test bed leaves idle
# rather than adding their time to the suite's; their report follows the cluster tests' report.
# The cluster tests run as E2E_WORKERS pytest-xdist workers, a file at a time each, every worker on a
# cluster of its own (tests/support/cluster.py); on a cluster of $KUBECONFIG's (kind) they run as one.
# Three on 2 cores: most of a cluster test's time is waiting for what it watches, and a third
# worker took the cluster tests from 18.5 to 14 minutes.
PURE_LOG := .pure-tests.log
E2E_WORKERS ?= $(if $(KUBECONFIG),0,3)
test: venv testbed image
	@(nice -n 19 $(BIN)/ruff check . && nice -n 19 $(BIN)/ruff format --check . && nice -n 19 $(BIN)/mypy && \
	  nice -n 19 $(BIN)/pytest -m unit -p no:cacheprovider) > $(PURE_LOG) 2>&1 & pure=$$!; \
	$(BIN)/pytest -m 'not unit' -n $(E2E_WORKERS) --dist loadfile; cluster=$$?; \
	wait $$pure; pure=$$?; \
	echo "::: the lint and the pure tests (ruff check, ruff format --check, mypy, pytest -m unit), run beside the cluster's: exit $$pure"; \
	cat $(PURE_LOG); \
	[ $$cluster -eq 0 ] && [ $$pure -eq 0 ]

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis $(PURE_LOG)
