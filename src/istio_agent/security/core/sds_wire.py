"""The SDS messages on the wire, without Envoy's generated modules (sans-IO).

The SDS server reads a `DiscoveryRequest` (node id, resource names, nonce, error
detail) and writes a `DiscoveryResponse` of `Secret`s: a certificate chain and
key, or a trusted CA bundle, each inline. Those few fields are declared here
with upstream's numbers (`istio_agent.protos.heads`), so the agent never loads
Envoy's API modules (~3 MB, most of it anonymous memory in every pod) for them;
the bytes are the same (`tests/unit/test_security_sds_wire.py` checks them
against Envoy's own classes).
"""

from __future__ import annotations

from typing import Any

from istio_agent.protos.heads import BYTES, INT32, MESSAGE, REPEATED, STRING, Field, build
from istio_agent.security.core.secrets import SecretItem

_CLASSES = build("istio_agent.security.sds_heads", {
    # google.rpc.Status
    "Status": [Field("code", 1, INT32), Field("message", 2, STRING)],
    # envoy.config.core.v3.Node: the id only (the rest stays unknown bytes)
    "Node": [Field("id", 1, STRING)],
    # envoy.service.discovery.v3.DiscoveryRequest
    "DiscoveryRequest": [
        Field("version_info", 1, STRING),
        Field("node", 2, MESSAGE, message="Node"),
        Field("resource_names", 3, STRING, REPEATED),
        Field("type_url", 4, STRING),
        Field("response_nonce", 5, STRING),
        Field("error_detail", 6, MESSAGE, message="Status"),
    ],
    # google.protobuf.Any
    "Any": [Field("type_url", 1, STRING), Field("value", 2, BYTES)],
    # envoy.service.discovery.v3.DiscoveryResponse
    "DiscoveryResponse": [
        Field("version_info", 1, STRING),
        Field("resources", 2, MESSAGE, REPEATED, "Any"),
        Field("type_url", 4, STRING),
        Field("nonce", 5, STRING),
    ],
    # envoy.config.core.v3.DataSource: inline_bytes, a member of its `specifier` oneof upstream
    "DataSource": [Field("inline_bytes", 2, BYTES, oneof="specifier")],
    # envoy.extensions.transport_sockets.tls.v3.TlsCertificate
    "TlsCertificate": [
        Field("certificate_chain", 1, MESSAGE, message="DataSource"),
        Field("private_key", 2, MESSAGE, message="DataSource"),
    ],
    # envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext
    "CertificateValidationContext": [Field("trusted_ca", 1, MESSAGE, message="DataSource")],
    # envoy.extensions.transport_sockets.tls.v3.Secret (its `type` oneof: tls_certificate or validation_context)
    "Secret": [
        Field("name", 1, STRING),
        Field("tls_certificate", 2, MESSAGE, message="TlsCertificate", oneof="type"),
        Field("validation_context", 4, MESSAGE, message="CertificateValidationContext", oneof="type"),
    ],
})

# The request as grpc's deserializer gives it to the server (the fields read: resource_names, response_nonce,
# error_detail, node.id), and the response it writes: resources are Any(type_url=SECRET, value=secret_bytes(...)).
DiscoveryRequest: Any = _CLASSES["DiscoveryRequest"]
DiscoveryResponse: Any = _CLASSES["DiscoveryResponse"]


def secret_bytes(item: SecretItem) -> bytes:
    """`default`-like items become tls_certificate (chain + key); bundles become validation_context.trusted_ca."""
    secret = _CLASSES["Secret"](name=item.resource_name)
    if item.is_root:
        secret.validation_context.trusted_ca.inline_bytes = item.root_cert
    else:
        secret.tls_certificate.certificate_chain.inline_bytes = item.cert_chain
        secret.tls_certificate.private_key.inline_bytes = item.private_key
    return bytes(secret.SerializeToString())
