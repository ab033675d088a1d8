"""The gRPC bootstrap document: structure, upstream's typed-metadata rules, derivation from the agent config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import AgentFlags, HostFacts, metadata_options, resolve_agent_options
from istio_agent.config import env
from istio_agent.config.node import node_metadata, pilot_sans
from istio_agent.grpcxds.bootstrap import (
    GrpcBootstrapOptions,
    build_bootstrap,
    certificate_files,
    render_bootstrap,
)
from istio_agent.grpcxds.metadata import typed_metadata


def _options(**overrides: Any) -> GrpcBootstrapOptions:
    values: dict[str, Any] = dict(node_id="sidecar~10.0.0.1~p.ns~ns.svc.cluster.local", metadata={},
                                  xds_uds_path="/pod/etc/istio/proxy/XDS")
    values.update(overrides)
    return GrpcBootstrapOptions(**values)


def test_top_level_order_and_server() -> None:
    doc = build_bootstrap(_options(cert_dir="/var/lib/istio/data"))
    assert list(doc) == ["xds_servers", "node", "certificate_providers", "server_listener_resource_name_template"]
    assert doc["xds_servers"] == [{"server_uri": "unix:////pod/etc/istio/proxy/XDS",
                                   "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}]
    assert doc["server_listener_resource_name_template"] == "xds.istio.io/grpc/lds/inbound/%s"


def test_without_a_socket_the_app_dials_istiod_directly() -> None:
    doc = build_bootstrap(_options(xds_uds_path="", discovery_address="istiod.istio-system.svc:15012"))
    assert doc["xds_servers"][0]["server_uri"] == "istiod.istio-system.svc:15012"
    doc = build_bootstrap(_options(xds_uds_path="", discovery_address=""))
    assert "server_uri" not in doc["xds_servers"][0], "Go's omitempty drops an empty URI"


def test_certificate_provider_only_with_output_certs() -> None:
    assert "certificate_providers" not in build_bootstrap(_options())
    doc = build_bootstrap(_options(cert_dir="./var/lib/istio/data/"))
    assert doc["certificate_providers"] == {"default": {"plugin_name": "file_watcher", "config": {
        "certificate_file": "var/lib/istio/data/cert-chain.pem",
        "private_key_file": "var/lib/istio/data/key.pem",
        "ca_certificate_file": "var/lib/istio/data/root-cert.pem",
        "refresh_interval": "900s",
    }}}
    assert certificate_files("/cert/path") == ["/cert/path/cert-chain.pem", "/cert/path/key.pem",
                                               "/cert/path/root-cert.pem"]


def test_node_shape_generator_forced_and_locality() -> None:
    doc = build_bootstrap(_options(metadata={"GENERATOR": "sidecar", "NAMESPACE": "ns"},
                                   locality={"region": "r", "sub_zone": "s"}))
    node = doc["node"]
    assert list(node) == ["id", "metadata", "locality", "UserAgentVersionType"]
    assert node["metadata"] == {"GENERATOR": "grpc", "NAMESPACE": "ns"}
    assert node["locality"] == {"region": "r", "sub_zone": "s"}
    assert node["UserAgentVersionType"] is None
    assert list(build_bootstrap(_options(node_id="", locality=None))["node"]) == ["metadata", "UserAgentVersionType"]


def test_typed_metadata_keeps_only_upstream_fields_with_go_types() -> None:
    raw = {
        "FOO": "custom keys reach Envoy's bootstrap, not gRPC's",
        "DNS_PROXY_ADDR": "localhost:15053",
        "CLUSTER_ID": "Kubernetes",
        "NAMESPACE": "",
        "DNS_CAPTURE": "false",
        "DNS_AUTO_ALLOCATE": "True",
        "METADATA_DISCOVERY": "false",
        "ENVOY_STATUS_PORT": 15021,
        "ENVOY_PROMETHEUS_PORT": 0,
        "LABELS": {"z": "1", "a": "2"},
        "ANNOTATIONS": {},
        "PILOT_SAN": [],
        "POD_PORTS": '[ {"protocol": "TCP", "containerPort": 8080, "name": "http"} ]',
        "PROXY_CONFIG": {"statusPort": 15020, "configPath": "./etc/istio/proxy"},
    }
    typed = typed_metadata(raw)
    assert typed == {
        "CLUSTER_ID": "Kubernetes",
        "DNS_AUTO_ALLOCATE": "true",
        "ENVOY_STATUS_PORT": 15021,
        "LABELS": {"a": "2", "z": "1"},
        "METADATA_DISCOVERY": "false",
        "POD_PORTS": '[{"name":"http","containerPort":8080,"protocol":"TCP"}]',
        "PROXY_CONFIG": {"configPath": "./etc/istio/proxy", "statusPort": 15020},
    }
    assert list(typed) == sorted(typed)
    assert list(typed["PROXY_CONFIG"]) == sorted(typed["PROXY_CONFIG"]), "nested maps sorted like a Struct"


def test_pilot_san() -> None:
    assert pilot_sans("localhost:15012", "MUTUAL_TLS") == ["istiod.istio-system.svc"]
    assert pilot_sans("istiod.istio-system.svc:15012", "MUTUAL_TLS") == ["istiod.istio-system.svc"]
    assert pilot_sans("istiod-canary.istio-system.svc", "MUTUAL_TLS") == ["istiod-canary.istio-system.svc"]
    assert pilot_sans("istiod.istio-system.svc:15010", "NONE") == []


def test_pilot_san_only_with_mutual_tls(tmp_path: Path) -> None:
    def metadata(proxy_config: str, tmp_path: Path) -> dict[str, Any]:
        config = load_agent_config(env.Environment({"PROXY_CONFIG": proxy_config}), tmp_path)
        return node_metadata(metadata_options(config, AgentFlags()))

    assert metadata('{"discoveryAddress": "localhost:15012"}', tmp_path)["PILOT_SAN"] == ["istiod.istio-system.svc"]
    plain = '{"discoveryAddress": "localhost:15010", "controlPlaneAuthPolicy": "NONE"}'
    assert "PILOT_SAN" not in metadata(plain, tmp_path)


def test_from_agent_config(tmp_path: Path) -> None:
    environment = env.Environment({
        "POD_NAME": "echo-1", "POD_NAMESPACE": "demo", "SERVICE_ACCOUNT": "echo", "INSTANCE_IP": "10.1.2.3",
        "OUTPUT_CERTS": "/var/lib/istio/data", "ISTIO_META_GENERATOR": "grpc", "ISTIO_META_CLUSTER_ID": "c1",
        "ISTIO_META_FOO": "bar", "PROXY_CONFIG": '{"discoveryAddress": "istiod.istio-system.svc:15012"}',
    })
    (tmp_path / "etc/istio/pod").mkdir(parents=True)
    (tmp_path / "etc/istio/pod/labels").write_text('app="echo"\nistio-locality="us.east.a"\n')
    config = load_agent_config(environment, tmp_path)
    resolved = resolve_agent_options(config, AgentFlags(), HostFacts())
    assert resolved.grpc_bootstrap is not None
    assert resolved.grpc_bootstrap.path == tmp_path / "etc/istio/proxy/grpc-bootstrap.json"
    options = resolved.grpc_bootstrap.content
    assert options.xds_uds_path == "etc/istio/proxy/XDS"  # upstream's filepath.Join of configPath and XDS
    assert options.cert_dir == "/var/lib/istio/data"
    assert options.locality == {"region": "us", "zone": "east", "sub_zone": "a"}
    doc = json.loads(render_bootstrap(build_bootstrap(options)))
    node = doc["node"]
    assert node["id"] == "sidecar~10.1.2.3~echo-1.demo~demo.svc.cluster.local"
    meta = node["metadata"]
    assert meta["GENERATOR"] == "grpc" and meta["CLUSTER_ID"] == "c1" and "FOO" not in meta
    assert meta["NAMESPACE"] == "demo" and meta["SERVICE_ACCOUNT"] == "echo" and meta["NAME"] == "echo-1"
    assert meta["PILOT_SAN"] == ["istiod.istio-system.svc"]
    assert meta["ENVOY_STATUS_PORT"] == 15021 and meta["ENVOY_PROMETHEUS_PORT"] == 15090
    assert meta["LABELS"]["istio-locality"] == "us/east/a"
    assert node["locality"] == {"region": "us", "zone": "east", "sub_zone": "a"}


@pytest.mark.parametrize("metadata", [{"LABELS": {"x": "<tag>"}}, {"NAME": "ü"}])
def test_rendered_bytes_are_utf8_without_html_characters(metadata: dict[str, Any]) -> None:
    data = render_bootstrap(build_bootstrap(_options(metadata=metadata)))
    text = data.decode("utf-8")
    assert "<" not in text and not text.endswith("\n")
    assert json.loads(text)["node"]["metadata"] | {"GENERATOR": "grpc"} == {**metadata, "GENERATOR": "grpc"}


@pytest.mark.parametrize(("config_path", "uri"), [
    ("./etc/istio/proxy", "unix:///etc/istio/proxy/XDS"),  # the default: where an app container sees the volume
    ("/etc/istio/proxy", "unix:////etc/istio/proxy/XDS"),
    ("/var/run/istio/", "unix:////var/run/istio/XDS"),
    ("etc/../proxy", "unix:///proxy/XDS"),
])
def test_server_uri_joins_the_config_path_as_upstream(config_path: str, uri: str, tmp_path: Path) -> None:
    environment = env.Environment({"PROXY_CONFIG": json.dumps({"configPath": config_path})})
    resolved = resolve_agent_options(load_agent_config(environment, tmp_path), AgentFlags(), HostFacts())
    assert resolved.grpc_bootstrap is not None
    assert build_bootstrap(resolved.grpc_bootstrap.content)["xds_servers"][0]["server_uri"] == uri
