"""The cloud platform through the options resolver: PLATFORM_METADATA in node metadata, and the node's locality
for both bootstraps (Envoy's and gRPC's) from the platform when the pod has no locality label."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import AgentFlags, AgentOptions, HostFacts, resolve_agent_options
from istio_agent.config import env
from istio_agent.config.node import MetadataOptions, node_metadata
from istio_agent.envoy.bootstrap.render import render_bootstrap
from istio_agent.grpcxds.bootstrap import build_bootstrap
from istio_agent.grpcxds.bootstrap import render_bootstrap as render_grpc

POD = {"POD_NAME": "app-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "app", "INSTANCE_IP": "10.1.1.5",
       "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
GKE = {"GCP_METADATA": "my-proj|1234|my-cluster|us-central1", "GCP_QUOTA_PROJECT": "quota-proj"}
RESOLV = ("search default.svc.cluster.local svc.cluster.local cluster.local us-central1-f.c.my-proj.internal "
          "c.my-proj.internal google.internal\nnameserver 10.96.0.10\n")
PLATFORM_LOCALITY = {"region": "us-central1", "zone": "us-central1-f"}


def resolve(tmp_path: Path, resolv_conf: str | None = RESOLV, labels: str = "", **environ: str) -> AgentOptions:
    if labels:
        (tmp_path / "etc/istio/pod").mkdir(parents=True, exist_ok=True)
        (tmp_path / "etc/istio/pod/labels").write_text(labels)
    config = load_agent_config(env.Environment({**POD, **environ}), tmp_path)
    return resolve_agent_options(config, AgentFlags(), HostFacts(resolv_conf=resolv_conf))


def test_gcp_metadata_reaches_node_metadata_and_both_bootstraps(tmp_path: Path) -> None:
    options = resolve(tmp_path, **GKE)
    assert options.metadata["PLATFORM_METADATA"] == {
        "gcp_project": "my-proj", "gcp_project_number": "1234", "gcp_gke_cluster_name": "my-cluster",
        "gcp_location": "us-central1", "gcp_quota_project": "quota-proj",
        "gcp_gke_cluster_url": "https://container.googleapis.com/v1/projects/my-proj/locations/us-central1/"
                               "clusters/my-cluster"}
    assert options.envoy is not None and options.grpc_bootstrap is not None
    envoy = render_bootstrap(options.envoy.bootstrap)
    assert envoy["node"]["locality"] == PLATFORM_LOCALITY
    assert envoy["node"]["metadata"]["PLATFORM_METADATA"]["gcp_project"] == "my-proj"
    grpc = json.loads(render_grpc(build_bootstrap(options.grpc_bootstrap.content)))
    assert grpc["node"]["locality"] == PLATFORM_LOCALITY
    assert grpc["node"]["metadata"]["PLATFORM_METADATA"]["gcp_project_number"] == "1234"


def test_gcp_zone_gives_the_locality_before_resolv_conf(tmp_path: Path) -> None:
    options = resolve(tmp_path, resolv_conf=None, GCP_ZONE="europe-west4-b", **GKE)
    assert options.envoy is not None
    assert render_bootstrap(options.envoy.bootstrap)["node"]["locality"] == {
        "region": "europe-west4", "zone": "europe-west4-b"}
    assert options.metadata["PLATFORM_METADATA"]["gcp_zone"] == "europe-west4-b"


def test_a_locality_label_wins_and_the_platform_is_not_asked(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    options = resolve(tmp_path, resolv_conf=None, labels='app="a"\ntopology.istio.io/locality="r1.z1"\n', **GKE)
    assert options.envoy is not None and options.grpc_bootstrap is not None
    assert options.envoy.bootstrap.platform_locality == {}
    assert render_bootstrap(options.envoy.bootstrap)["node"]["locality"] == {"region": "r1", "zone": "z1"}
    assert options.grpc_bootstrap.content.locality == {"region": "r1", "zone": "z1"}
    assert not [r for r in caplog.records if "zone" in r.getMessage()], "no zone looked for: no warning about one"


def test_no_platform_no_platform_metadata_and_no_locality(tmp_path: Path) -> None:
    options = resolve(tmp_path)
    assert "PLATFORM_METADATA" not in options.metadata
    assert options.envoy is not None and render_bootstrap(options.envoy.bootstrap)["node"]["locality"] == {}
    assert options.grpc_bootstrap is not None and options.grpc_bootstrap.content.locality == {}


def test_stackdriver_takes_its_project_from_gcp_metadata(tmp_path: Path) -> None:
    tracing = json.dumps({"tracing": {"stackdriver": {}}})
    options = resolve(tmp_path, PROXY_CONFIG=tracing, **GKE)
    assert options.envoy is not None
    assert "tracing" not in render_bootstrap(options.envoy.bootstrap)


def test_platform_metadata_replaces_a_raw_one_only_when_there_is_some() -> None:
    """As upstream: ISTIO_METAJSON_* may carry PLATFORM_METADATA; the platform's, when non-empty, replaces it."""
    environment = env.Environment({"ISTIO_METAJSON_X": '{"PLATFORM_METADATA": {"gcp_project": "raw"}}'})
    raw = node_metadata(MetadataOptions(environment, {}))
    assert raw["PLATFORM_METADATA"] == {"gcp_project": "raw"}
    ours = node_metadata(MetadataOptions(environment, {}, platform_metadata={"gcp_project": "env"}))
    assert ours["PLATFORM_METADATA"] == {"gcp_project": "env"}
