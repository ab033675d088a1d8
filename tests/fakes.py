"""Stand-ins the unit tests share where the real peer is a network service, and a recording component.

`FakeSigner` plays istiod's CA for the secret cache: it signs with a real root
(the same `pki` code istiod-local uses), so every certificate is genuine and
verifies; it only skips gRPC. It reads time from a clock (a `VirtualClock` in
virtual-time tests), can be taken down and brought back, and records when each
call happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CaError

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


class FakeSigner:
    """A CA with a real root; `down = True` makes every call fail as an unreachable CA (UNAVAILABLE)."""

    def __init__(self, now: Callable[[], float] = time.time, spiffe_id: str = SPIFFE, root_ttl: float = 10 * 86400):
        self.now = now
        self.spiffe_id = spiffe_id
        self.root_ttl = root_ttl
        self.ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", now(), int(root_ttl))
        self.down = False
        self.calls: list[float] = []  # when each sign() was called
        self.failures: list[float] = []  # when each failed one was

    def new_root(self) -> None:
        """Start signing with a new root (a CA root rotation)."""
        self.ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", self.now(), int(self.root_ttl))

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        self.calls.append(self.now())
        if self.down:
            self.failures.append(self.now())
            raise CaError("CA is down", grpc.StatusCode.UNAVAILABLE)
        csr = certs.load_csr(csr_pem)
        assert certs.csr_sans(csr) == [self.spiffe_id]
        leaf = certs.sign_workload_csr(self.ca, csr, self.spiffe_id, self.now(), ttl_seconds)
        return [certs.cert_to_pem(leaf), self.ca.cert_pem.decode()]

    async def close(self) -> None:
        return None


class RecordingPart:
    """A stand-in component for the lifecycle's tests (the agent's, install-cni's, istiod-local serve's): it
    appends `start <name>` and `stop <name>` to a shared log, and raises `fail_start` / `fail_stop` when given."""

    def __init__(self, name: str, log: list[str], fail_start: Exception | None = None,
                 fail_stop: Exception | None = None) -> None:
        self.name, self.log, self.fail_start, self.fail_stop = name, log, fail_start, fail_stop

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self.fail_start is not None:
            raise self.fail_start

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail_stop is not None:
            raise self.fail_stop
