"""The `grpc` generator: xDS for proxyless gRPC (node metadata `GENERATOR: grpc`).

gRPC's own xDS client reads a much smaller subset of the API than Envoy and
rejects what it does not know, so it gets its own shapes (upstream's
`grpcgen`): API listeners instead of captured ports, one route configuration
and one EDS cluster per service port, certificate-provider TLS instead of
SDS, and server listeners for `grpc.server(..., xds=True)`. Endpoints are the
sidecar's ClusterLoadAssignments, which already carry the locality and
`load_balancing_weight` gRPC insists on.
"""

from __future__ import annotations

from collections.abc import Collection

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources, select
from istiod_local.controlplane.xds.generators.endpoints import build_endpoints
from istiod_local.controlplane.xds.generators.grpc_clusters import build_clusters, build_routes
from istiod_local.controlplane.xds.generators.grpc_listeners import build_listeners


class GrpcGenerator:
    name = "grpc"
    types = frozenset({typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE})

    def generate(self, type_url: str, ctx: ProxyContext, names: Collection[str] | None) -> Resources:
        if type_url == typeurls.LISTENER:
            return build_listeners(ctx, names)
        if type_url == typeurls.ROUTE:
            return build_routes(ctx, names)
        if type_url == typeurls.CLUSTER:
            return build_clusters(ctx, names)
        if type_url == typeurls.ENDPOINT:
            return select(build_endpoints(ctx.snapshot), names)
        return {}
