"""The XDS proxy's partial decoding and its own requests, checked against the real Envoy protos."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.protos import nds_pb2, typeurls
from istio_agent.xds.core import messages
from istio_agent.xds.core.messages import DecodeError, ErrorDetail

CDS = typeurls.CLUSTER


def _clusters_response(count: int) -> discovery_pb2.DiscoveryResponse:
    response = discovery_pb2.DiscoveryResponse(version_info="2024-01-01T00:00:00Z/7", type_url=CDS, nonce="abc")
    for i in range(count):
        response.resources.add().Pack(cluster_pb2.Cluster(name=f"outbound|80||svc-{i}.default.svc.cluster.local"))
    response.control_plane.identifier = "istiod-local"
    return response


def test_sotw_request_head_reads_only_routing_fields() -> None:
    request = discovery_pb2.DiscoveryRequest(
        version_info="v3", type_url=CDS, response_nonce="n-9", resource_names=["a", "b"]
    )
    request.node.id = "sidecar~10.0.0.1~a.default~default.svc.cluster.local"
    request.node.metadata.update({"CLUSTER_ID": "Kubernetes"})
    request.error_detail.code = 13
    request.error_detail.message = "bad cluster"
    head = messages.request_head(request.SerializeToString(), delta=False)
    assert (head.type_url, head.response_nonce, head.version_info) == (CDS, "n-9", "v3")
    assert head.error == ErrorDetail(13, "bad cluster")


def test_delta_request_head() -> None:
    request = discovery_pb2.DeltaDiscoveryRequest(
        type_url=typeurls.LISTENER, response_nonce="7", resource_names_subscribe=["x"]
    )
    request.node.id = "n"
    request.initial_resource_versions["x"] = "1"
    head = messages.request_head(request.SerializeToString(), delta=True)
    assert (head.type_url, head.response_nonce, head.version_info, head.error) == (typeurls.LISTENER, "7", "", None)


def test_sotw_response_head_keeps_resources_as_raw_bytes() -> None:
    response = _clusters_response(50)
    data = response.SerializeToString()
    head = messages.response_head(data, delta=False)
    assert (head.type_url, head.nonce, head.version_info) == (CDS, "abc", "2024-01-01T00:00:00Z/7")
    raw = messages.resources(data)
    assert len(raw) == 50
    assert raw[3] == response.resources[3].SerializeToString()
    any_type, value = messages.resource_value(raw[3], delta=False)
    assert any_type == CDS
    assert cluster_pb2.Cluster.FromString(value).name == "outbound|80||svc-3.default.svc.cluster.local"


def test_delta_response_head_unwraps_resource() -> None:
    table = nds_pb2.NameTable()
    table.table["echo.default.svc.cluster.local"].ips.append("10.96.0.20")
    response = discovery_pb2.DeltaDiscoveryResponse(
        system_version_info="sv", type_url=typeurls.NAME_TABLE, nonce="d1", removed_resources=["old"]
    )
    resource = response.resources.add(name="nds", version="1")
    resource.resource.Pack(table)
    data = response.SerializeToString()
    head = messages.response_head(data, delta=True)
    assert (head.type_url, head.nonce, head.version_info, head.delta) == (typeurls.NAME_TABLE, "d1", "sv", True)
    (raw,) = messages.resources(data)
    any_type, value = messages.resource_value(raw, delta=True)
    assert any_type == typeurls.NAME_TABLE
    assert nds_pb2.NameTable.FromString(value) == table


def test_large_response_head() -> None:
    data = _clusters_response(5000).SerializeToString()
    assert messages.response_head(data, delta=False).type_url == CDS
    assert len(messages.resources(data)) == 5000


def _proxy_config_bytes(roots: list[str]) -> bytes:
    """A ProxyConfig on the wire: configPath (1), a Duration (4), then ca_certificates_pem (34) entries."""
    path = b"./etc/istio/proxy"
    out = b"\x0a" + bytes([len(path)]) + path + b"\x22\x02\x08\x05"
    for pem in roots:
        data = pem.encode()
        out += b"\x92\x02" + bytes([len(data)]) + data
    return out


def test_trust_bundle_reads_field_34() -> None:
    roots = ["-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n", "second"]
    assert messages.trust_bundle(_proxy_config_bytes(roots)) == roots
    assert messages.trust_bundle(b"") == []


@pytest.mark.parametrize("delta", [False, True])
def test_malformed_bytes_raise_decode_error(delta: bool) -> None:
    with pytest.raises(DecodeError):
        messages.response_head(b"\x12\xff\xff\x01abc", delta=delta)
    with pytest.raises(DecodeError):
        messages.resources(b"\x12\x05ab")
    with pytest.raises(DecodeError):
        messages.request_head(b"\x22\x05ab", delta=delta)


def test_encode_sotw_ack_and_nack_parse_as_real_requests() -> None:
    ack = discovery_pb2.DiscoveryRequest.FromString(
        messages.encode_request(typeurls.NAME_TABLE, delta=False, response_nonce="n1", version_info="v1")
    )
    assert (ack.type_url, ack.response_nonce, ack.version_info) == (typeurls.NAME_TABLE, "n1", "v1")
    assert not ack.HasField("error_detail") and not ack.HasField("node")
    nack = discovery_pb2.DiscoveryRequest.FromString(
        messages.encode_request(typeurls.NAME_TABLE, delta=False, response_nonce="n2", error=ErrorDetail(13, "no"))
    )
    assert (nack.error_detail.code, nack.error_detail.message) == (13, "no")


def test_encode_delta_request_has_no_version() -> None:
    data = messages.encode_request(typeurls.PROXY_CONFIG, delta=True, response_nonce="x", version_info="ignored")
    request = discovery_pb2.DeltaDiscoveryRequest.FromString(data)
    assert (request.type_url, request.response_nonce) == (typeurls.PROXY_CONFIG, "x")
    assert not request.HasField("error_detail")


@given(
    version=st.text(max_size=40),
    type_url=st.text(min_size=1, max_size=80),
    nonce=st.text(max_size=40),
    names=st.lists(st.text(max_size=20), max_size=5),
    code=st.integers(min_value=0, max_value=16),
    node_id=st.text(max_size=60),
)
def test_request_head_agrees_with_full_parse(
    version: str, type_url: str, nonce: str, names: list[str], code: int, node_id: str
) -> None:
    request = discovery_pb2.DiscoveryRequest(
        version_info=version, type_url=type_url, response_nonce=nonce, resource_names=names
    )
    request.node.id = node_id
    if code:
        request.error_detail.code = code
    head = messages.request_head(request.SerializeToString(), delta=False)
    assert (head.version_info, head.type_url, head.response_nonce) == (version, type_url, nonce)
    assert (head.error.code if head.error else 0) == code


@given(
    type_url=st.text(max_size=80),
    nonce=st.text(max_size=40),
    values=st.lists(st.binary(max_size=64), max_size=8),
)
def test_response_head_agrees_with_full_parse(type_url: str, nonce: str, values: list[bytes]) -> None:
    response = discovery_pb2.DiscoveryResponse(type_url=type_url, nonce=nonce)
    for value in values:
        response.resources.append(any_pb2.Any(type_url=type_url, value=value))
    data = response.SerializeToString()
    head = messages.response_head(data, delta=False)
    assert (head.type_url, head.nonce) == (type_url, nonce)
    assert [messages.resource_value(raw, delta=False)[1] for raw in messages.resources(data)] == values


def test_first_resource_value_sotw_and_delta() -> None:
    table = nds_pb2.NameTable()
    table.table["echo.default.svc.cluster.local"].ips.append("10.96.0.20")
    sotw = discovery_pb2.DiscoveryResponse(type_url=typeurls.NAME_TABLE, nonce="s1")
    sotw.resources.add().Pack(table)
    sotw.resources.add().Pack(nds_pb2.NameTable())  # only the first counts
    any_type, value = messages.first_resource_value(sotw.SerializeToString(), delta=False) or ("", b"")
    assert any_type == typeurls.NAME_TABLE
    assert nds_pb2.NameTable.FromString(value) == table
    delta = discovery_pb2.DeltaDiscoveryResponse(type_url=typeurls.NAME_TABLE, nonce="d1")
    delta.resources.add(name="nds", version="1").resource.Pack(table)
    any_type, value = messages.first_resource_value(delta.SerializeToString(), delta=True) or ("", b"")
    assert any_type == typeurls.NAME_TABLE
    assert nds_pb2.NameTable.FromString(value) == table


@pytest.mark.parametrize("delta", [False, True])
def test_first_resource_value_of_an_empty_or_malformed_response(delta: bool) -> None:
    empty = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
    assert messages.first_resource_value(empty(type_url=typeurls.NAME_TABLE).SerializeToString(), delta) is None
    with pytest.raises(DecodeError):
        messages.first_resource_value(b"\x12\x05ab", delta)


@given(values=st.lists(st.binary(max_size=64), min_size=1, max_size=8))
def test_first_resource_value_agrees_with_resources(values: list[bytes]) -> None:
    response = discovery_pb2.DiscoveryResponse(type_url=CDS)
    for value in values:
        response.resources.append(any_pb2.Any(type_url=CDS, value=value))
    data = response.SerializeToString()
    assert messages.first_resource_value(data, delta=False) == messages.resource_value(messages.resources(data)[0],
                                                                                          delta=False)
