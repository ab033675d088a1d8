"""xDS resource generators: pure functions of a mesh snapshot and a proxy.

`default_generators()` holds the `sidecar` generator; a proxyless `grpc`
generator is registered the same way (`GeneratorSet.register`) and chosen for
proxies whose node metadata says `GENERATOR: grpc`.
"""

from __future__ import annotations

from istio_agent.controlplane.xds.generators.base import (
    DEFAULT_GENERATOR,
    Generator,
    GeneratorSet,
    ProxyContext,
    Resources,
)
from istio_agent.controlplane.xds.generators.grpc_generator import GrpcGenerator
from istio_agent.controlplane.xds.generators.sidecar import SidecarGenerator


def default_generators() -> GeneratorSet:
    return GeneratorSet({SidecarGenerator.name: SidecarGenerator(), GrpcGenerator.name: GrpcGenerator()})


__all__ = ["DEFAULT_GENERATOR", "Generator", "GeneratorSet", "ProxyContext", "Resources", "SidecarGenerator",
           "default_generators"]
