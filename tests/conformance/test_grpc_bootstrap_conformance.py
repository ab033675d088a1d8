"""The kit's proxyless gRPC bootstrap golden (../shared/conformance/grpc-bootstrap).

Inputs come from the kit's manifest (node identity, version, IPs, discovery
address under MUTUAL_TLS, OUTPUT_CERTS, the XDS socket in a temp dir). The
file is written by the agent's writer, then normalised as the manifest says
(drop PROXY_CONFIG / PROV_CERT, replace the socket path by `etc/istio/XDS`)
and compared with the golden as parsed JSON. A second check re-serialises
the normalised file as upstream's test does (Go's indented encoder) and
compares the text, which pins the byte-level quirks too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from needs import need_conformance
from support import CONFORMANCE

from istio_agent import gojson
from istio_agent.config import env
from istio_agent.config.node import MetadataOptions, node_id, node_metadata, pilot_sans
from istio_agent.config.proxyconfig import ProxyConfig, build_proxy_config
from istio_agent.grpcxds.bootstrap import GrpcBootstrapOptions
from istio_agent.grpcxds.writer import write_bootstrap_file

KIT = CONFORMANCE / "grpc-bootstrap"


def _case() -> dict[str, Any]:
    kit = need_conformance("grpc-bootstrap")
    manifest = json.loads((kit / "manifest.json").read_text())
    (case,) = [c for c in manifest["cases"] if c["name"] == "grpc-xds-bootstrap"]
    return case


def _proxy_config(inputs: dict[str, Any]) -> ProxyConfig:
    # The upstream test dials istiod on an ephemeral localhost port; only the host feeds PILOT_SAN.
    address = inputs["proxy_config"]["discovery_address"].replace("<ephemeral port>", "41529")
    return build_proxy_config(None, json.dumps({
        "discoveryAddress": address,
        "controlPlaneAuthPolicy": inputs["proxy_config"]["control_plane_auth_policy"],
    }), {})


def _metadata(inputs: dict[str, Any], istio_version: str = "") -> dict[str, Any]:
    """Node metadata as the agent computes it, from the kit's inputs."""
    proxy_config = _proxy_config(inputs)
    return node_metadata(MetadataOptions(
        env.Environment({}),  # the kit: no ISTIO_META_* / ISTIO_METAJSON_* in the process environment
        proxy_config.to_json(),
        instance_ips=tuple(inputs["instance_ips"]),
        pilot_san=tuple(pilot_sans(proxy_config.discovery_address, str(proxy_config.get("controlPlaneAuthPolicy")))),
        # The upstream test leaves the Envoy status/prometheus ports unset (zero), so they are omitted.
        envoy_status_port=0, envoy_prometheus_port=0,
        istio_version=istio_version,
    ))


def _write(case: dict[str, Any], scratch: Path) -> tuple[Path, Path]:
    inputs = case["inputs"]
    proxy = inputs["proxy"]
    metadata = _metadata(inputs, istio_version=inputs["istio_version"])
    assert metadata["WORKLOAD_IDENTITY_SOCKET_FILE"] == inputs["workload_identity_socket_file"]
    pod_name, namespace = proxy["id"].split(".", 1)
    nid = node_id(proxy["type"], proxy["ip_addresses"][0], pod_name, namespace, proxy["dns_domain"])
    assert nid == inputs["node_id"]
    xds_socket = scratch / "XDS"
    options = GrpcBootstrapOptions(
        node_id=nid,
        metadata=metadata,
        xds_uds_path=str(xds_socket),
        locality={},  # platform unknown: empty locality
        cert_dir=inputs["output_certs_dir"],
    )
    target = scratch / "grpc-bootstrap.json"
    write_bootstrap_file(target, options)
    return target, xds_socket


def _normalised(case: dict[str, Any], written: Path, xds_socket: Path) -> tuple[dict[str, Any], str]:
    """The manifest's normalisation, giving the parsed document and upstream's re-serialised text."""
    steps = case["comparison"]["normalise_before_compare"]
    assert any("PROXY_CONFIG" in s for s in steps) and any("PROV_CERT" in s for s in steps)
    document = json.loads(written.read_text())
    metadata = document["node"]["metadata"]
    assert "PROXY_CONFIG" in metadata, "the agent writes its ProxyConfig; the comparison drops it"
    metadata.pop("PROXY_CONFIG")
    metadata.pop("PROV_CERT", None)
    text = gojson.dumps(document).replace(str(xds_socket), "etc/istio/XDS")
    return json.loads(text), text


@pytest.fixture
def case() -> dict[str, Any]:
    return _case()


def test_grpc_bootstrap_matches_golden(case: dict[str, Any], tmp_path: Path) -> None:
    written, xds_socket = _write(case, tmp_path)
    golden = json.loads((KIT / case["golden"]).read_text())
    document, _ = _normalised(case, written, xds_socket)
    assert document == golden


def test_grpc_bootstrap_text_matches_golden_byte_for_byte(case: dict[str, Any], tmp_path: Path) -> None:
    written, xds_socket = _write(case, tmp_path)
    _, text = _normalised(case, written, xds_socket)
    assert text.strip() == (KIT / case["golden"]).read_text().strip()


def test_derived_rules_of_the_manifest(case: dict[str, Any], tmp_path: Path) -> None:
    written, xds_socket = _write(case, tmp_path)
    raw = written.read_text()
    document = json.loads(raw)
    rules = case["derived_output_rules"]
    assert "four slashes" in rules["server_uri"]
    assert document["xds_servers"][0]["server_uri"] == f"unix:///{xds_socket}"
    assert document["xds_servers"][0]["server_uri"].startswith("unix:////")
    assert document["server_listener_resource_name_template"] == rules["server_listener_resource_name_template"]
    assert '"UserAgentVersionType": null' in raw
    assert not raw.endswith("\n"), "Go's MarshalIndent writes no trailing newline"
    assert document["node"]["metadata"]["PILOT_SAN"] == case["inputs"]["pilot_san"]


def test_no_certificate_provider_without_output_certs(case: dict[str, Any], tmp_path: Path) -> None:
    inputs = case["inputs"]
    options = GrpcBootstrapOptions(
        node_id=inputs["node_id"],
        metadata=_metadata(inputs),
        xds_uds_path=str(tmp_path / "XDS"),
    )
    target = tmp_path / "grpc-bootstrap.json"
    write_bootstrap_file(target, options)
    assert "certificate_providers" not in json.loads(target.read_text())
