"""The SDS server's own message heads against Envoy's generated classes: the same bytes both ways."""

from __future__ import annotations

import pytest
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.protos import typeurls
from istio_agent.security.core import sds_wire
from istio_agent.security.core.secrets import SecretItem


def envoy_secret(item: SecretItem) -> secret_pb2.Secret:
    """What the server sent before, with Envoy's classes."""
    secret = secret_pb2.Secret(name=item.resource_name)
    if item.is_root:
        secret.validation_context.trusted_ca.inline_bytes = item.root_cert
    else:
        secret.tls_certificate.certificate_chain.inline_bytes = item.cert_chain
        secret.tls_certificate.private_key.inline_bytes = item.private_key
    return secret


@pytest.mark.parametrize("item", [
    SecretItem("default", cert_chain=b"-----BEGIN CERTIFICATE-----\nA\n", private_key=b"-----BEGIN EC"),
    SecretItem("ROOTCA", root_cert=b"-----BEGIN CERTIFICATE-----\nR\n"),
    SecretItem("file-root:/etc/ssl/ca.pem", root_cert=b""),  # an empty bundle is still a validation context
], ids=["key-pair", "root", "empty-root"])
def test_secret_bytes_are_envoys(item: SecretItem) -> None:
    data = sds_wire.secret_bytes(item)
    assert data == envoy_secret(item).SerializeToString()
    parsed = secret_pb2.Secret.FromString(data)
    assert parsed.WhichOneof("type") == ("validation_context" if item.is_root else "tls_certificate")


@given(chain=st.binary(min_size=1, max_size=200), key=st.binary(max_size=200), root=st.binary(max_size=200),
       name=st.text(max_size=40), nonce=st.text(max_size=20))
def test_response_parses_as_envoys(chain: bytes, key: bytes, root: bytes, name: str, nonce: str) -> None:
    items = [SecretItem(name or "default", cert_chain=chain, private_key=key), SecretItem("ROOTCA", root_cert=root)]
    response = sds_wire.DiscoveryResponse(type_url=typeurls.SECRET, version_info="v/1", nonce=nonce)
    for item in items:
        response.resources.add(type_url=typeurls.SECRET, value=sds_wire.secret_bytes(item))
    expected = discovery_pb2.DiscoveryResponse(type_url=typeurls.SECRET, version_info="v/1", nonce=nonce)
    for item in items:
        expected.resources.add().Pack(envoy_secret(item))
    assert response.SerializeToString() == expected.SerializeToString()


def test_request_fields_read_from_envoys_bytes() -> None:
    request = discovery_pb2.DiscoveryRequest(type_url=typeurls.SECRET, resource_names=["default", "ROOTCA"],
                                             response_nonce="n-3", version_info="v/2")
    request.node.id = "sidecar~10.0.0.1~echo-1.default~default.svc.cluster.local"
    request.node.metadata.update({"CLUSTER_ID": "Kubernetes"})
    request.error_detail.code = 13
    request.error_detail.message = "bad secret"
    parsed = sds_wire.DiscoveryRequest.FromString(request.SerializeToString())
    assert list(parsed.resource_names) == ["default", "ROOTCA"]
    assert (parsed.response_nonce, parsed.node.id) == ("n-3", request.node.id)
    assert parsed.HasField("error_detail") and parsed.error_detail.message == "bad secret"
    bare = sds_wire.DiscoveryRequest.FromString(discovery_pb2.DiscoveryRequest(resource_names=["x"])
                                                .SerializeToString())
    assert not bare.HasField("error_detail") and not bare.HasField("node")


def test_the_nonce_is_a_random_version_4_uuid() -> None:
    import uuid

    from istio_agent.security.sds import random_nonce

    nonces = {random_nonce() for _ in range(200)}
    assert len(nonces) == 200
    for nonce in nonces:
        parsed = uuid.UUID(nonce)
        assert str(parsed) == nonce and parsed.version == 4 and parsed.variant == uuid.RFC_4122
