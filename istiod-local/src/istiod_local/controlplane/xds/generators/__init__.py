"""xDS resource generators: pure functions of a mesh snapshot and a proxy.

`default_generators()` holds the `sidecar` generator (the default), the
proxyless `grpc` one (for proxies whose node metadata says `GENERATOR: grpc`)
and the `waypoint` one (for `waypoint~...` node ids).
"""

from __future__ import annotations

from istiod_local.controlplane.xds.generators.base import (
    DEFAULT_GENERATOR,
    Generator,
    GeneratorSet,
    ProxyContext,
    Resources,
)
from istiod_local.controlplane.xds.generators.grpc_generator import GrpcGenerator
from istiod_local.controlplane.xds.generators.sidecar import SidecarGenerator
from istiod_local.controlplane.xds.generators.waypoint import WaypointGenerator


def default_generators() -> GeneratorSet:
    return GeneratorSet({generator.name: generator
                         for generator in (SidecarGenerator(), GrpcGenerator(), WaypointGenerator())})


__all__ = ["DEFAULT_GENERATOR", "Generator", "GeneratorSet", "ProxyContext", "Resources", "SidecarGenerator",
           "default_generators"]
