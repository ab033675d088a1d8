"""istiod-local's xDS as one component: the registry file, its watcher and the ADS server.

    xds = XdsService(XdsOptions("mesh.yaml", trust_domain="cluster.local"), verifier=plane.verifier)
    plane.add_service(xds.register)   # ADS on the CA's ports (15010 plaintext, 15012 TLS)
    await plane.start(); await xds.start()
    ...
    await xds.stop()

The registry is loaded in the constructor, so a broken file stops istiod-local
from starting (with the line and field named); later edits that fail to parse
are refused and the previous registry stays in service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from istiod_local.controlplane.tokens import TokenVerifier
from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.auth import TokenAuthenticator
from istiod_local.controlplane.xds.autoregistration import AutoRegistration, WorkloadEntryOptions
from istiod_local.controlplane.xds.generators import GeneratorSet
from istiod_local.controlplane.xds.registry import Registry
from istiod_local.controlplane.xds.watcher import RegistryWatcher
from istiod_local.controlplane.xds.yamlfields import RegistryError

log = logging.getLogger("istiod_local.controlplane.xds")


@dataclass(frozen=True)
class XdsOptions:
    registry_path: Path | str
    # The CA's trust domain; a registry naming another one is refused (SPIFFE ids would never match).
    trust_domain: str | None = None
    poll_interval: float = 0.5
    # Require a service-account token on plaintext streams too (TLS streams always need one when a verifier is set).
    auth_plaintext: bool = False
    # Auto-registration's grace period and switches (istiod's PILOT_WORKLOAD_ENTRY_* variables).
    workload_entries: WorkloadEntryOptions = field(default_factory=WorkloadEntryOptions)


class XdsService:
    def __init__(self, options: XdsOptions, verifier: TokenVerifier | None = None,
                 generators: GeneratorSet | None = None) -> None:
        self.options = options
        self.watcher = RegistryWatcher(options.registry_path, self._on_change, options.poll_interval)
        registry = self.watcher.load()
        self._check(registry)
        authenticator = TokenAuthenticator(verifier, options.auth_plaintext) if verifier is not None else None
        self.ads = AdsServer(registry, generators, authenticator,
                             workload_entries=AutoRegistration(options=options.workload_entries))
        self._listeners: list[Callable[[Registry], None]] = []

    def add_listener(self, listener: Callable[[Registry], None]) -> None:
        """Call `listener` with each registry ADS accepted after the first (the Kubernetes API follows them)."""
        self._listeners.append(listener)

    @property
    def registry(self) -> Registry:
        """The registry in service."""
        return self.ads.registry

    def _check(self, registry: Registry) -> None:
        wanted = self.options.trust_domain
        if wanted is not None and registry.trust_domain != wanted:
            raise RegistryError(str(self.options.registry_path), 0, "trustDomain",
                                f"{registry.trust_domain!r} differs from the CA's trust domain {wanted!r}")

    def _on_change(self, registry: Registry) -> None:
        try:
            self._check(registry)
        except RegistryError as exc:
            self.watcher.last_error = str(exc)
            log.error("registry refused, previous configuration stays in service: %s", exc)
            return
        try:
            version = self.ads.update_registry(registry)
        except Exception as exc:  # a generator failed on it: keep serving the previous registry
            self.watcher.last_error = f"registry refused, config generation failed: {exc}"
            log.exception("registry refused, previous configuration stays in service")
            return
        log.info("registry change pushed as mesh version %d", version)
        for listener in self._listeners:
            try:
                listener(registry)
            except Exception:
                log.exception("registry listener failed")

    def register(self, server: grpc.aio.Server) -> None:
        """A `ServiceRegistrar` for `ControlPlane.add_service`."""
        self.ads.register(server)

    async def start(self) -> None:
        await self.watcher.start()

    async def stop(self) -> None:
        await self.watcher.stop()
