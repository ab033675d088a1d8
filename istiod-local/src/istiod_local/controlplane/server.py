"""The local control plane's gRPC serving: one server, a plaintext port and a TLS port.

`ControlPlane` owns the state directory and a `grpc.aio.Server` listening on
`grpc_addr` (plaintext, istiod's 15010) and `secure_grpc_addr` (TLS with the
serving certificate, istiod's 15012). Services are added as *registrars*
(callables that add a servicer to a server), so the CA registered here and
the ADS service added later share the same ports, as they do in istiod:

    plane = ControlPlane(ControlPlaneOptions(state_dir=d, grpc_addr="127.0.0.1:0",
                                             secure_grpc_addr="127.0.0.1:0"))
    plane.add_service(lambda server: add_FooServicer_to_server(foo, server))
    await plane.start()
    ...plane.secure_address, plane.mint_token("default", "sleep")...
    await plane.stop()

Port 0 picks a free port; the chosen addresses are reported by
`plain_address` / `secure_address` once started. istiod's monitoring port,
the Kubernetes API and the registry watcher are components of their own beside
it (`assembly.py` composes `istiod-local serve`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from istiod_local.controlplane.ca_service import IstioCertificateServicer, register_ca_service
from istiod_local.controlplane.signing import WorkloadSigner
from istiod_local.controlplane.state import ControlPlaneState, load_or_create_state
from istiod_local.controlplane.tokens import ISTIO_CA_AUDIENCE, TokenIdentity, TokenVerifier, issue_token

log = logging.getLogger("istiod_local.controlplane")

ServiceRegistrar = Callable[[grpc.aio.Server], None]

DEFAULT_GRPC_ADDR = "127.0.0.1:15010"
DEFAULT_SECURE_GRPC_ADDR = "127.0.0.1:15012"
DEFAULT_MAX_CERT_TTL = 24 * 3600.0
DEFAULT_TRUST_DOMAIN = "cluster.local"

# SO_REUSEPORT is on by default in gRPC: two istiod-locals would then silently share a port. Keepalive as
# istiod's gRPC server sets it (pilot/pkg/grpc ServerOptions with its 30 s / 10 s defaults): the server pings an
# idle client every 30 s, and accepts a client's pings as often as every 15 s (half its interval) even between
# streams' data. gRPC core's own default is 5 minutes, and upstream's Go agent, which pings every 30 s, was sent
# GOAWAY "too_many_pings".
KEEPALIVE_TIME_MS = 30_000
_SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.keepalive_permit_without_calls", 1),
]


@dataclass(frozen=True)
class ControlPlaneOptions:
    """How istiod-local serves. An empty address turns that port off."""

    state_dir: Path | str
    grpc_addr: str = DEFAULT_GRPC_ADDR
    secure_grpc_addr: str = DEFAULT_SECURE_GRPC_ADDR
    max_cert_ttl_seconds: float = DEFAULT_MAX_CERT_TTL
    trust_domain: str = DEFAULT_TRUST_DOMAIN


def _with_port(address: str, port: int) -> str:
    host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


def serving_ips(address: str) -> tuple[str, ...]:
    """The IP address a `host:port` listens on, for the serving certificate: none for a name or a wildcard."""
    host = address.rsplit(":", 1)[0].strip("[]") if address else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return ()
    return () if ip.is_unspecified else (str(ip),)


class ControlPlane:
    """istiod-local's gRPC servers and state; `async start()` / `async stop()`, or `async with`."""

    name = "CA and xDS gRPC"

    def __init__(self, options: ControlPlaneOptions, clock: Callable[[], float] = time.time) -> None:
        if not options.grpc_addr and not options.secure_grpc_addr:
            raise ValueError("at least one of grpc_addr and secure_grpc_addr must be set")
        if options.max_cert_ttl_seconds <= 0:
            raise ValueError(f"max certificate TTL must be positive, got {options.max_cert_ttl_seconds}s")
        self.options = options
        self._clock = clock
        self.state: ControlPlaneState = load_or_create_state(options.state_dir, options.trust_domain, clock(),
                                                             serving_ips(options.secure_grpc_addr))
        self.verifier = TokenVerifier(self.state.token_key.public_key())
        self.signer = WorkloadSigner(self.state.ca, self.verifier, options.trust_domain, options.max_cert_ttl_seconds)
        self._registrars: list[ServiceRegistrar] = [register_ca_service(IstioCertificateServicer(self.signer, clock))]
        self._server: grpc.aio.Server | None = None
        self.plain_address = ""
        self.secure_address = ""

    def add_service(self, registrar: ServiceRegistrar) -> None:
        """Serve another gRPC service on the same ports (call before `start`)."""
        if self._server is not None:
            raise RuntimeError("add services before the control plane starts")
        self._registrars.append(registrar)

    async def start(self) -> None:
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        for register in self._registrars:
            register(server)
        try:
            if self.options.grpc_addr:
                port = server.add_insecure_port(self.options.grpc_addr)
                self.plain_address = _with_port(self.options.grpc_addr, port)
            if self.options.secure_grpc_addr:
                creds = grpc.ssl_server_credentials([(self.state.serving_key_pem, self.state.serving_cert_pem)])
                port = server.add_secure_port(self.options.secure_grpc_addr, creds)
                self.secure_address = _with_port(self.options.secure_grpc_addr, port)
        except RuntimeError as exc:
            addrs = f"{self.options.grpc_addr or '-'} / {self.options.secure_grpc_addr or '-'}"
            raise OSError(f"cannot listen on {addrs}: {exc}") from exc
        await server.start()
        self._server = server
        log.info(
            "istiod-local serving: plaintext %s, TLS %s (trust domain %s, max cert TTL %ds, state %s)",
            self.plain_address or "off", self.secure_address or "off", self.options.trust_domain,
            int(self.options.max_cert_ttl_seconds), self.state.directory,
        )

    async def stop(self, grace: float | None = 1.0) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
            log.info("istiod-local stopped")

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def root_cert_pem(self) -> str:
        return self.state.root_cert_pem

    def mint_token(
        self, namespace: str, service_account: str, pod: str = "", ttl_seconds: float = 3600.0,
        audiences: tuple[str, ...] = (ISTIO_CA_AUDIENCE,), now: float | None = None,
    ) -> str:
        """A service-account token this control plane accepts (for `pod-files` and tests)."""
        when = self._clock() if now is None else now
        return issue_token(self.state.token_key, TokenIdentity(namespace, service_account, pod), when, ttl_seconds,
                           audiences)
