"""The generator interface: (mesh snapshot, proxy) -> xDS resources, for one type URL.

Generators are pure: they read a `MeshSnapshot` and a `Proxy` and return
packed `Any` messages keyed by resource name; the ADS server decides what to
send and when. istiod picks a generator per proxy from its metadata
(`GENERATOR`): Envoy sidecars get `sidecar`; proxyless gRPC clients
(`GENERATOR: grpc`) get a generator registered under `grpc`, which shares
this interface and the snapshot but builds API listeners and gRPC-shaped
clusters instead.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from google.protobuf import any_pb2

from istiod_local.controlplane.xds.mesh import InboundTarget, MeshSnapshot, MeshWorkload
from istiod_local.controlplane.xds.proxy import Proxy

Resources = dict[str, any_pb2.Any]

DEFAULT_GENERATOR = "sidecar"


@dataclass(frozen=True)
class ProxyContext:
    """A snapshot seen from one proxy: its own workload and the service ports it serves."""

    snapshot: MeshSnapshot
    proxy: Proxy
    workload: MeshWorkload | None
    inbound: tuple[InboundTarget, ...]

    @classmethod
    def build(cls, snapshot: MeshSnapshot, proxy: Proxy) -> ProxyContext:
        workload = snapshot.workload_for(proxy)
        return cls(snapshot, proxy, workload, tuple(snapshot.inbound_targets(workload)))

    @property
    def mtls_mode(self) -> str:
        return self.snapshot.registry.mtls_mode(self.proxy.namespace)


class Generator(Protocol):
    """Builds the resources of the types it serves; `names=None` means every resource (wildcard)."""

    name: str
    types: frozenset[str]

    def generate(self, type_url: str, ctx: ProxyContext, names: Collection[str] | None) -> Resources: ...


class GeneratorSet:
    """Generators by name; `for_proxy` chooses by the proxy's GENERATOR metadata."""

    def __init__(self, generators: Mapping[str, Generator], default: str = DEFAULT_GENERATOR) -> None:
        if default not in generators:
            raise ValueError(f"default generator {default!r} is not registered")
        self._generators = dict(generators)
        self._default = default

    def register(self, generator: Generator) -> None:
        self._generators[generator.name] = generator

    def get(self, name: str) -> Generator:
        return self._generators[name]

    def for_proxy(self, proxy: Proxy) -> Generator:
        """The GENERATOR metadata's generator; else one named after the proxy type (`waypoint`); else the default."""
        name = proxy.generator or (proxy.type if proxy.type in self._generators else self._default)
        return self._generators.get(name) or self._generators[self._default]

    def names(self) -> list[str]:
        return sorted(self._generators)


def select(resources: Resources, names: Collection[str] | None) -> Resources:
    """The subset a client asked for (all when `names` is None); unknown names are simply absent."""
    if names is None:
        return resources
    return {name: resources[name] for name in names if name in resources}
