"""The `waypoint` generator: what istiod-local gives a `pilot-agent proxy waypoint`.

Upstream's waypoints serve ambient traffic (HBONE on 15008, internal
listeners), which istiod-local's small registry does not model. It gives a
waypoint the mesh's outbound clusters and their endpoints, and no listeners:
enough for the waypoint's Envoy to hold real, verifiable config and to turn
ready, and nothing that would pretend to route ambient traffic.
"""

from __future__ import annotations

from collections.abc import Collection

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources, select
from istiod_local.controlplane.xds.generators.clusters import build_clusters
from istiod_local.controlplane.xds.generators.endpoints import build_endpoints


class WaypointGenerator:
    name = "waypoint"
    types = frozenset({typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER})

    def generate(self, type_url: str, ctx: ProxyContext, names: Collection[str] | None) -> Resources:
        if type_url == typeurls.CLUSTER:
            return select(build_clusters(ctx), names)
        if type_url == typeurls.ENDPOINT:
            return select(build_endpoints(ctx.snapshot), names)
        return {}  # LDS: none (an empty answer still counts as config received)
