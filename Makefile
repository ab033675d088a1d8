# istio-agent: one entry point for setup, checks, tests, the local mesh and benchmarks.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
DEB_PACKAGES := iproute2 iptables nftables containernetworking-plugins dnsutils dnsperf dnsmasq prometheus procps util-linux curl tmux \
	wabt docker-registry skopeo apache2-utils
PYTEST_ARGS ?=

.PHONY: setup debs oras upstream-template test lint typecheck pytest run bench soak protos docs clean vm-package

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

# oras, the OCI client the Wasm tests push the Wasm OCI artifact with (Go module proxy, pinned; skipped without go).
ORAS_VERSION := v1.3.6
ORAS := .upstream/bin/oras
oras:
	@if [ ! -x $(ORAS) ] && command -v go >/dev/null; then echo "installing: oras $(ORAS_VERSION)"; \
	  GOBIN=$(CURDIR)/.upstream/bin go install oras.land/oras/cmd/oras@$(ORAS_VERSION); fi


# Upstream's Envoy bootstrap template, which its Go pilot-agent reads from its image
# (./var/lib/istio/envoy/envoy_bootstrap_tmpl.json): copied from the Go module cache of the pinned version
# into .upstream/share/ (ignored; upstream's source, never committed), where the local node takes it for a
# pod on upstream's agent (docs/MESH.md, "Upstream's agent and CNI"). Nothing to do without `go`.
UPSTREAM_PIN ?= $(shell cat upstream.version 2>/dev/null || echo v0.0.0-20260827124520-eed52ebb66ad)
UPSTREAM_TEMPLATE := $(CURDIR)/.upstream/share/envoy_bootstrap_tmpl.json
GO_CMD ?= $(shell command -v go 2>/dev/null || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; })

upstream-template:
	@stamp="$(dir $(UPSTREAM_TEMPLATE)).version"; \
	if [ -z "$(GO_CMD)" ] || { [ -f "$(UPSTREAM_TEMPLATE)" ] && [ "$$(cat "$$stamp" 2>/dev/null)" = "$(UPSTREAM_PIN)" ]; }; \
	then exit 0; fi; \
	src="$$("$(GO_CMD)" mod download -json istio.io/istio@$(UPSTREAM_PIN) 2>/dev/null | \
	  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$$/\1/p')/tools/packaging/common/envoy_bootstrap.json"; \
	if [ -f "$$src" ]; then mkdir -p "$(dir $(UPSTREAM_TEMPLATE))" && install -m 0644 "$$src" "$(UPSTREAM_TEMPLATE)" && \
	  echo "$(UPSTREAM_PIN)" > "$$stamp" && echo "upstream-template: $(UPSTREAM_TEMPLATE) ($(UPSTREAM_PIN))"; \
	else echo "upstream-template: istio.io/istio@$(UPSTREAM_PIN) not in the Go module proxy: upstream's agent unavailable"; fi

setup: $(STAMP) debs oras upstream-template

# ruff, then the import rules between and inside the two packages ([tool.importlinter] in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check src istiod-local/src tests benchmarks
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test: lint typecheck pytest

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
.PHONY: image image-check
image: setup
	packaging/images/build.sh

# The images run as Kubernetes runs injected pods (podman kube play) against istiod-local; cleans up after itself.
image-check: setup
	packaging/images/image-check.sh
