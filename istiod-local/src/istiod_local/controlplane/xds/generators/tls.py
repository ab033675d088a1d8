"""Istio mutual TLS contexts: client side for outbound clusters, server side for inbound chains.

Both sides take their certificate (`default`) and trust anchor (`ROOTCA`)
from the agent over SDS. The client checks the server's SPIFFE id against
the service accounts behind the destination; the server accepts any peer the
mesh root signed (authorization is a separate concern).

ALPN carries Istio's in-mesh markers: the client offers `istio-peer-exchange`
and `istio` so the server's PERMISSIVE filter chains can tell mesh traffic
from plaintext or foreign TLS, while the server's own ALPN lists only real
protocols so that HTTP/2 still negotiates.
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from istiod_local.controlplane.xds.generators.envoy import (
    SDS_DEFAULT,
    SDS_ROOT,
    boolean,
    exact_matchers,
    pack,
    sds_secret_config,
)

TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
RAW_BUFFER_TRANSPORT_SOCKET = "envoy.transport_sockets.raw_buffer"

ALPN_IN_MESH = ("istio-peer-exchange", "istio")
ALPN_IN_MESH_H2 = ("istio-peer-exchange", "istio", "h2")
ALPN_HTTP = ("h2", "http/1.1")
ALPN_DOWNSTREAM_TCP = ("istio-peer-exchange", "h2", "http/1.1")
# Filter-chain ALPN matches on the server side.
MTLS_HTTP_ALPNS = ("istio-http/1.0", "istio-http/1.1", "istio-h2")
ALL_ISTIO_MTLS_ALPNS = ("istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2")
MTLS_TCP_ALPNS = ("istio-peer-exchange", "istio")
PLAINTEXT_HTTP_ALPNS = ("http/1.1", "h2c")

SUPPORTED_CIPHERS = (
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
)


def _common(alpn: Sequence[str], sans: Sequence[str]) -> tls_pb2.CommonTlsContext:
    return tls_pb2.CommonTlsContext(
        alpn_protocols=list(alpn),
        tls_certificate_sds_secret_configs=[sds_secret_config(SDS_DEFAULT)],
        combined_validation_context=tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=common_pb2.CertificateValidationContext(
                match_subject_alt_names=exact_matchers(sans)),
            validation_context_sds_secret_config=sds_secret_config(SDS_ROOT),
        ),
    )


def istio_mutual_upstream(sni: str, sans: Sequence[str], http2: bool) -> tls_pb2.UpstreamTlsContext:
    """ISTIO_MUTUAL towards a mesh destination whose pods run as `sans` (empty: any mesh identity)."""
    common = _common(ALPN_IN_MESH_H2 if http2 else ALPN_IN_MESH, sans)
    common.tls_params.CopyFrom(common_pb2.TlsParameters(
        tls_minimum_protocol_version=common_pb2.TlsParameters.TLSv1_2,
        tls_maximum_protocol_version=common_pb2.TlsParameters.TLSv1_3,
    ))
    return tls_pb2.UpstreamTlsContext(common_tls_context=common, sni=sni)


def istio_mutual_downstream(http: bool) -> tls_pb2.DownstreamTlsContext:
    """The inbound side of mesh mTLS: client certificate required, verified against ROOTCA."""
    common = _common(ALPN_HTTP if http else ALPN_DOWNSTREAM_TCP, ())
    common.tls_params.CopyFrom(common_pb2.TlsParameters(
        cipher_suites=list(SUPPORTED_CIPHERS),
        tls_minimum_protocol_version=common_pb2.TlsParameters.TLSv1_2,
        tls_maximum_protocol_version=common_pb2.TlsParameters.TLSv1_3,
    ))
    return tls_pb2.DownstreamTlsContext(common_tls_context=common, require_client_certificate=boolean(True))


def tls_transport_socket(
    context: tls_pb2.UpstreamTlsContext | tls_pb2.DownstreamTlsContext,
) -> base_pb2.TransportSocket:
    return base_pb2.TransportSocket(name=TLS_TRANSPORT_SOCKET, typed_config=pack(context))


def raw_buffer_transport_socket() -> base_pb2.TransportSocket:
    return base_pb2.TransportSocket(name=RAW_BUFFER_TRANSPORT_SOCKET, typed_config=pack(raw_buffer_pb2.RawBuffer()))
