"""`istio.v1.auth.IstioCertificateService` on grpc.aio: a thin adapter around `WorkloadSigner`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from istio_agent.protos import istioca_pb2, istioca_pb2_grpc
from istiod_local.controlplane.signing import CaRefusal, Refusal, WorkloadSigner

log = logging.getLogger("istiod_local.controlplane.ca")

_STATUS = {
    Refusal.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
}


def _header(metadata: tuple[tuple[str, str | bytes], ...] | None, name: str) -> str | None:
    """One request header by (lower-case) name; gRPC hands keys over lower-cased."""
    for key, value in metadata or ():
        if key == name:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


class IstioCertificateServicer(istioca_pb2_grpc.IstioCertificateServiceServicer):
    """Answers CreateCertificate; refusals become UNAUTHENTICATED / PERMISSION_DENIED / INVALID_ARGUMENT.

    Signing runs on the event loop: it costs a fraction of a millisecond, less
    than handing the work to a thread and back.
    """

    def __init__(self, signer: WorkloadSigner, clock: Callable[[], float] = time.time) -> None:
        self._signer = signer
        self._clock = clock

    async def CreateCertificate(
        self, request: istioca_pb2.IstioCertificateRequest, context: grpc.aio.ServicerContext
    ) -> istioca_pb2.IstioCertificateResponse:
        metadata = context.invocation_metadata()
        cluster = _header(metadata, "clusterid") or ""
        try:
            issued = self._signer.create_certificate(
                _header(metadata, "authorization"), request.csr, request.validity_duration, self._clock()
            )
        except CaRefusal as refusal:
            log.warning(
                "refused CSR from %s (cluster %r, caller %s): %s: %s",
                context.peer(), cluster, refusal.caller or "unknown", refusal.kind.value, refusal.reason,
            )
            await context.abort(_STATUS[refusal.kind], refusal.reason)
            raise AssertionError("unreachable: abort raises") from None
        if log.isEnabledFor(logging.INFO):
            log.info(
                "issued %s (serial %x, ttl %ds, cluster %r, pod %r)",
                issued.identity, issued.serial, int(issued.ttl_seconds), cluster, issued.claims.identity.pod_name,
            )
        return istioca_pb2.IstioCertificateResponse(cert_chain=issued.chain)


def register_ca_service(servicer: IstioCertificateServicer) -> Callable[[grpc.aio.Server], None]:
    """A registrar for `ControlPlane`: adds the CA service to a server."""

    def register(server: grpc.aio.Server) -> None:
        istioca_pb2_grpc.add_IstioCertificateServiceServicer_to_server(servicer, server)

    return register
