"""Mesh mTLS for proxyless gRPC: certificate-provider TLS contexts, and who speaks mTLS to whom.

gRPC has no SDS: its xDS credentials take certificates from the bootstrap's
`certificate_providers`, which the agent fills with a `file_watcher` named
`default` over the `OUTPUT_CERTS` files. The contexts therefore name the
provider instance `default`, with certificate names `default` (identity)
and `ROOTCA` (trust anchor) as upstream's. We use the current fields
(`tls_certificate_provider_instance`, and `ca_certificate_provider_instance`
in the default validation context), which every gRPC language reads (A29);
upstream still sends their deprecated predecessors, which grpc-java rejects
for validation.

When is a connection mTLS? A gRPC server cannot tell TLS from plaintext on
one port (gRPC drops filter chains that match `transport_protocol: tls`,
A36), so unlike an Envoy sidecar it cannot accept both. Upstream therefore
makes PERMISSIVE mean "mTLS" for pods labelled
`security.istio.io/tlsMode: istio` (every injected pod; here every pod the
mesh knows unless its labels say otherwise, matching the sidecar generator's
auto-mTLS) and "plaintext" for the rest. A client uses mTLS towards a mesh
service exactly when its servers will demand it, so both ends agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from istiod_local.controlplane.xds.generators.envoy import boolean, exact_matchers
from istiod_local.controlplane.xds.mesh import TLS_MODE_ISTIO, TLS_MODE_LABEL, MeshSnapshot, ServiceView
from istiod_local.controlplane.xds.registry import Registry

CERT_PROVIDER_INSTANCE = "default"
IDENTITY_CERT_NAME = "default"
ROOT_CERT_NAME = "ROOTCA"
STRICT = "STRICT"
DISABLE = "DISABLE"


def _provider(certificate_name: str) -> common_pb2.CertificateProviderPluginInstance:
    return common_pb2.CertificateProviderPluginInstance(instance_name=CERT_PROVIDER_INSTANCE,
                                                        certificate_name=certificate_name)


def common_tls_context(sans: Sequence[str]) -> tls_pb2.CommonTlsContext:
    """Identity and roots from the `default` provider; the peer must present one of `sans` (if any)."""
    return tls_pb2.CommonTlsContext(
        tls_certificate_provider_instance=_provider(IDENTITY_CERT_NAME),
        combined_validation_context=tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=common_pb2.CertificateValidationContext(
                ca_certificate_provider_instance=_provider(ROOT_CERT_NAME),
                match_subject_alt_names=exact_matchers(sans),
            ),
        ),
    )


def upstream_mtls(sans: Sequence[str]) -> tls_pb2.UpstreamTlsContext:
    """The client side: present our identity, accept only the destination's SPIFFE ids."""
    return tls_pb2.UpstreamTlsContext(common_tls_context=common_tls_context(sans))


def downstream_mtls() -> tls_pb2.DownstreamTlsContext:
    """The server side: a client certificate signed by the mesh root is required (no SAN check on servers)."""
    return tls_pb2.DownstreamTlsContext(common_tls_context=common_tls_context(()),
                                        require_client_certificate=boolean(True))


def server_mode(registry: Registry, namespace: str, labels: Mapping[str, str]) -> str:
    """What a gRPC server of a pod with `labels` serves: STRICT (mTLS only) or DISABLE (plaintext only)."""
    mode = registry.mtls_mode(namespace)
    if mode == "PERMISSIVE":
        in_mesh = labels.get(TLS_MODE_LABEL, TLS_MODE_ISTIO) == TLS_MODE_ISTIO
        return STRICT if in_mesh else DISABLE
    return STRICT if mode == STRICT else DISABLE


def client_uses_mtls(snapshot: MeshSnapshot, view: ServiceView) -> bool:
    """mTLS towards a mesh service whose pods all serve STRICT (or, with no pods yet, its namespace does)."""
    if view.mesh_external or view.service is None:
        return False
    registry = snapshot.registry
    workloads = snapshot.selected_workloads(view.service)
    if not workloads:
        return server_mode(registry, view.namespace, {}) == STRICT
    return all(server_mode(registry, w.namespace, w.labels) == STRICT for w in workloads)
