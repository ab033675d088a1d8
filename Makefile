# istio-agent: one entry point for setup, checks, tests, the local mesh and benchmarks.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
DEB_PACKAGES := iproute2 iptables nftables containernetworking-plugins dnsutils dnsperf dnsmasq prometheus procps util-linux curl tmux \
	wabt docker-registry skopeo apache2-utils
PYTEST_ARGS ?=

.PHONY: setup debs upstream oras upstream-template diff-long test lint typecheck pytest run bench soak protos docs clean vm-package

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The two packages, editable: the product (this directory) and the local environment (istiod-local/), which
# depends on the product. istio-iptables is installed as the lean launcher (python -IS, no site;
# cli/iptables_launcher.py) in place of pip's console script: istio-init runs it for every pod.
$(STAMP): pyproject.toml istiod-local/pyproject.toml | $(PY)
	$(PIP) install -q -e '.[test]' -e ./istiod-local
	$(PY) -m istio_agent.cli.iptables_launcher $(VENV)/bin/istio-iptables
	touch $(STAMP)

# Debian packages the tests and the local node use; installed only as root and only when missing.
debs:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	  if ! command -v kubectl >/dev/null; then echo "installing: kubernetes-client (kubectl)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null; fi; \
	fi

# Upstream Istio's own commands, the oracle of tests/upstream (differential tests) and an interop peer, built
# from the Go module proxy at the one version pinned in `upstream.version` (why that version:
# docs/UPSTREAM.md) into .upstream/bin (ignored). A stamp holding the version skips the build when it is already there;
# Go's module and build caches (under $$HOME) make a rebuild after a version change fast. Without `go` the
# upstream tier skips (REQUIRE_ALL=1 turns that into a failure).
UPSTREAM_VERSION := $(shell cat upstream.version)
UPSTREAM_COMMANDS := pilot/cmd/pilot-agent pilot/cmd/pilot-discovery cni/cmd/istio-cni cni/cmd/install-cni
UPSTREAM_BIN := $(CURDIR)/.upstream/bin
GO ?= $(shell command -v go 2>/dev/null || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; })

upstream:
	@if [ -z "$(GO)" ]; then \
	  echo "upstream: no 'go' toolchain on PATH: upstream's commands not installed, tests/upstream will skip"; exit 0; fi; \
	stamp="$(UPSTREAM_BIN)/.version"; \
	if [ "$$(cat "$$stamp" 2>/dev/null)" = "$(UPSTREAM_VERSION)" ] && \
	   for c in $(notdir $(UPSTREAM_COMMANDS)); do [ -x "$(UPSTREAM_BIN)/$$c" ] || exit 1; done; then exit 0; fi; \
	echo "upstream: installing istio.io/istio@$(UPSTREAM_VERSION) ($(notdir $(UPSTREAM_COMMANDS))) into $(UPSTREAM_BIN)"; \
	rm -f "$$stamp"; mkdir -p "$(UPSTREAM_BIN)"; \
	GOBIN="$(UPSTREAM_BIN)" GOFLAGS=-buildvcs=false "$(GO)" install \
	  $(foreach c,$(UPSTREAM_COMMANDS),istio.io/istio/$(c)@$(UPSTREAM_VERSION)) && \
	echo "$(UPSTREAM_VERSION)" > "$$stamp"

# oras, the OCI client the Wasm tests push the Wasm OCI artifact with (Go module proxy, pinned; skipped without go).
ORAS_VERSION := v1.3.6
ORAS := .upstream/bin/oras
oras:
	@if [ ! -x $(ORAS) ] && [ -n "$(GO)" ]; then echo "installing: oras $(ORAS_VERSION)"; \
	  GOBIN=$(CURDIR)/.upstream/bin "$(GO)" install oras.land/oras/cmd/oras@$(ORAS_VERSION); fi

# Upstream's Envoy bootstrap template, which its Go pilot-agent reads from its image
# (./var/lib/istio/envoy/envoy_bootstrap_tmpl.json): copied from the Go module cache of the pinned version
# into .upstream/share/ (ignored; upstream's source, never committed), where the local node takes it for a
# pod on upstream's agent (docs/MESH.md, "Upstream's agent and CNI"). Nothing to do without `go`.
UPSTREAM_TEMPLATE := $(CURDIR)/.upstream/share/envoy_bootstrap_tmpl.json

upstream-template:
	@stamp="$(dir $(UPSTREAM_TEMPLATE)).version"; \
	if [ -z "$(GO)" ] || { [ -f "$(UPSTREAM_TEMPLATE)" ] && [ "$$(cat "$$stamp" 2>/dev/null)" = "$(UPSTREAM_VERSION)" ]; }; \
	then exit 0; fi; \
	src="$$("$(GO)" mod download -json istio.io/istio@$(UPSTREAM_VERSION) 2>/dev/null | \
	  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$$/\1/p')/tools/packaging/common/envoy_bootstrap.json"; \
	if [ -f "$$src" ]; then mkdir -p "$(dir $(UPSTREAM_TEMPLATE))" && install -m 0644 "$$src" "$(UPSTREAM_TEMPLATE)" && \
	  echo "$(UPSTREAM_VERSION)" > "$$stamp" && echo "upstream-template: $(UPSTREAM_TEMPLATE) ($(UPSTREAM_VERSION))"; \
	else echo "upstream-template: istio.io/istio@$(UPSTREAM_VERSION) not in the Go module proxy: upstream's agent unavailable"; fi

setup: $(STAMP) debs upstream oras upstream-template

# ruff, then the import rules between and inside the two packages ([tool.importlinter] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check src istiod-local/src tests benchmarks
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test: lint typecheck pytest

# The differential tests against upstream's commands (tests/upstream) with many more generated cases than CI's
# fixed-seed run and a fresh seed, printed first so that a failure can be replayed (UPSTREAM_DIFF_SEED=N);
# DIFF_TESTS=tests/upstream/test_x.py for one area. Each area prints its tally (cases, outcomes, seconds).
DIFF_EXAMPLES ?= 5000
DIFF_TESTS ?= tests/upstream
diff-long: setup
	@seed=$${UPSTREAM_DIFF_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "diff-long: $(DIFF_EXAMPLES) cases per area, seed $$seed"; \
	UPSTREAM_DIFF_EXAMPLES=$(DIFF_EXAMPLES) UPSTREAM_DIFF_SEED=$$seed \
	  $(VENV)/bin/pytest -q -p no:cacheprovider -s $(DIFF_TESTS) -k differential --timeout 0 $(PYTEST_ARGS)

protos: setup
	$(PY) -m istio_agent.protos.generate

# Generated reference pages (a test checks they are in sync with the code): the agent's variables, and each
# program's flags and variables from its table.
docs: setup
	$(PY) -m istio_agent.config.envtable docs/ENVIRONMENT.md
	$(PY) -m istio_agent.cli.reference docs/reference
	$(PY) -m istiod_local.cli.reference docs/reference

# istiod-local up with the default mesh (MESH=... for another file, UP_ARGS=--check, --scale N, ...).
MESH ?= examples/mesh.yaml
UP_ARGS ?=
run: setup
	$(VENV)/bin/istiod-local up $(MESH) $(UP_ARGS)

bench: setup
	@set -e; for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b; done

# One hour of certificate rotations and pushes through our agent and upstream's Go agent side by side, RSS
# sampled each minute (benchmarks/soak.py; root; not part of `make test` or `make bench`).
soak: setup
	$(PY) benchmarks/soak.py

# The VM package (packaging/vm/): istio-start.sh, istio.service, sidecar.env and a wheel of this project.
VM_PACKAGE_DIR ?= build/vm
vm-package: setup
	packaging/vm/build-deb.sh $(PY) $(VM_PACKAGE_DIR)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info istiod-local/src/*.egg-info

# Container images (packaging/images/, as root; not part of `make test`): a Debian bookworm base from
# mmdebstrap, localhost/istio-agent/proxyv2 and localhost/istio-agent/install-cni, built from git HEAD.
.PHONY: image image-check image-deps
image: setup image-deps
	packaging/images/build.sh

# The images run as Kubernetes runs injected pods (podman kube play) against istiod-local; cleans up after itself.
image-check: setup image-deps
	packaging/images/image-check.sh

# What the image targets need beyond `make setup`, as `debs` does it: Debian's podman, buildah, runc and
# mmdebstrap, installed as root when missing. The containers.conf this kind of VM needs (runc rather than crun,
# the ulimits) is packaging/images/containers.conf, which the scripts point CONTAINERS_CONF at.
IMAGE_DEB_PACKAGES := podman buildah runc mmdebstrap
image-deps:
	@if [ "$$(id -u)" != "0" ]; then echo "make image and make image-check run as root (mmdebstrap, podman's rootful storage)" >&2; exit 1; fi; \
	if ! command -v apt-get >/dev/null; then echo "image-deps: no apt-get: install $(IMAGE_DEB_PACKAGES) yourself" >&2; exit 1; fi; \
	missing=""; for p in $(IMAGE_DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
