"""The agent's identity component: CA client + secret cache + SDS server, started and stopped as one.

Decisions made at start, as upstream's agent makes them:
- another SDS server answering on the workload socket (found by the options
  resolver, `serve_only_files`) → that server owns the workload certificate: no
  CA client, and ours serves only file certificates on the files socket;
- mounted workload certificates, or FILE_MOUNTED_CERTS=true → no CA client;
- `run_sds_server=False` (DISABLE_ENVOY) → no SDS server, but the cache still
  pre-warms and rotates so OUTPUT_CERTS stays fresh for proxyless clients.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from istio_agent.security.ca_client import CaClient, CertificateSigner
from istio_agent.security.cache import SecretCache
from istio_agent.security.core.secrets import WORKLOAD_RESOURCE, SecretItem
from istio_agent.security.key_ahead import KeyAhead
from istio_agent.security.options import SecurityOptions

if TYPE_CHECKING:
    from istio_agent.security.sds import SdsEventHook, SdsServer

log = logging.getLogger(__name__)


class WorkloadIdentity:
    """Component with `start()`/`stop()`; exposes `.cache` for the XDS proxy (trust bundles) and status server."""

    name = "identity"

    def __init__(self, options: SecurityOptions, *, signer: CertificateSigner | None = None,
                 first_key: KeyAhead | None = None, on_sds_event: SdsEventHook | None = None) -> None:
        self.options = options
        self._signer_override = signer
        self._on_sds_event = on_sds_event  # the metrics' hook, handed to the SDS server
        self.signer: CertificateSigner | None = None
        # Built now so other components can subscribe (`cache.on_update`) before `start()`.
        self.cache = SecretCache(options, None, first_key=first_key)
        self.sds: SdsServer | None = None
        self.external_sds = False
        self._started = False

    @property
    def sds_socket_path(self) -> str:
        return str(self.options.sds_socket_path)

    async def start(self) -> None:
        opts = self.options
        self.external_sds = opts.serve_only_files
        if self.external_sds:
            log.info("existing workload SDS socket found at %s: ours serves only files, on %s",
                     opts.sds_socket_path, opts.sds_listen_path)
        self.signer = None
        if not self.external_sds and not opts.file_mounted_certs:
            self.signer = self._signer_override or CaClient(opts)
        self.cache.set_signer(self.signer)
        if self.signer is not None and not self.cache.uses_ca:
            log.info("workload certificates are mounted: not contacting the CA")
        elif self.signer is not None:
            log.info("CA endpoint %s (%s) for %s", opts.ca_address, "plaintext" if opts.plaintext_ca else "TLS",
                     opts.spiffe_id)
        await self.cache.start()
        if opts.run_sds_server:
            # The SDS server (and Envoy's protos) load only when there is an Envoy to serve, and only once the
            # first CSR's job is on its thread (one turn of the loop): the import then runs beside the CSR.
            await asyncio.sleep(0)
            from istio_agent.security.sds import SdsServer

            self.sds = SdsServer(self.cache, opts.sds_listen_path, self._on_sds_event)
            await self.sds.start()
        self._started = True

    async def stop(self) -> None:
        if self.sds is not None:
            await self.sds.stop()
            self.sds = None
        await self.cache.stop()
        if self.signer is not None:
            await self.signer.close()
            self.signer = None
        self._started = False

    async def wait_for_certificate(self, timeout: float | None = None) -> SecretItem:
        """Wait until a valid workload certificate is available (for readiness and the proxyless path)."""
        if not self.cache.uses_ca:
            return await asyncio.wait_for(self.cache.get(WORKLOAD_RESOURCE), timeout)
        return await asyncio.wait_for(self.cache.wait_for_workload(), timeout)


class FirstCertificateWait:
    """A start-up step, not a service: give the first CSR a bounded head start before the rest loads.

    Envoy cannot serve before it has a certificate anyway, and loading the other
    components blocks the event loop for a moment; so the agent waits up to
    `timeout` for the first certificate, and a slow or absent CA delays start-up
    by no more than that.
    """

    name = "first-certificate"

    def __init__(self, identity: WorkloadIdentity, timeout: float) -> None:
        self.identity = identity
        self.timeout = timeout

    async def start(self) -> None:
        if not self.identity.cache.uses_ca:
            return
        try:
            await self.identity.wait_for_certificate(self.timeout)
        except (TimeoutError, Exception) as exc:
            log.info("first certificate not there yet (%s); starting the other components", type(exc).__name__)

    async def stop(self) -> None:
        return None
