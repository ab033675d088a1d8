"""SPIFFE ids as Istio writes them: `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`."""

from __future__ import annotations

from dataclasses import dataclass

SCHEME = "spiffe://"


@dataclass(frozen=True)
class SpiffeId:
    trust_domain: str
    namespace: str
    service_account: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @classmethod
    def parse(cls, uri: str) -> SpiffeId:
        """Parse an Istio workload id; ValueError names the uri when it is not one."""
        if not uri.startswith(SCHEME):
            raise ValueError(f"not a SPIFFE id: {uri!r}")
        parts = uri[len(SCHEME):].split("/")
        if len(parts) != 5 or parts[1] != "ns" or parts[3] != "sa" or not all(parts):
            raise ValueError(f"not an Istio workload SPIFFE id (spiffe://<td>/ns/<ns>/sa/<sa>): {uri!r}")
        return cls(parts[0], parts[2], parts[4])
