"""The `sidecar` generator: everything an Envoy sidecar asks istiod for (CDS, EDS, LDS, RDS, NDS, ECDS)."""

from __future__ import annotations

from collections.abc import Collection

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources, select
from istiod_local.controlplane.xds.generators.clusters import build_clusters
from istiod_local.controlplane.xds.generators.endpoints import build_endpoints
from istiod_local.controlplane.xds.generators.envoy import pack
from istiod_local.controlplane.xds.generators.extensions import (
    add_wasm_filters,
    build_extension_configs,
    plugins_for,
)
from istiod_local.controlplane.xds.generators.inbound import virtual_inbound
from istiod_local.controlplane.xds.generators.nametable import build_name_table
from istiod_local.controlplane.xds.generators.outbound import outbound_listeners
from istiod_local.controlplane.xds.generators.routes import build_routes

# The NameTable is one unnamed resource (upstream sends it so, unless the agent asks for per-host Delta NDS).
NAME_TABLE_RESOURCE = ""


class SidecarGenerator:
    name = "sidecar"
    types = frozenset({typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE, typeurls.NAME_TABLE,
                       typeurls.EXTENSION_CONFIG})

    def generate(self, type_url: str, ctx: ProxyContext, names: Collection[str] | None) -> Resources:
        if type_url == typeurls.CLUSTER:
            return select(build_clusters(ctx), names)
        if type_url == typeurls.ENDPOINT:
            return select(build_endpoints(ctx.snapshot), names)
        if type_url == typeurls.LISTENER:
            listeners = [*outbound_listeners(ctx), virtual_inbound(ctx)]
            plugins = plugins_for(ctx)
            if plugins:
                for listener in listeners:
                    add_wasm_filters(listener, plugins, "SERVER" if listener.name == "virtualInbound" else "CLIENT")
            return select({listener.name: pack(listener) for listener in listeners}, names)
        if type_url == typeurls.ROUTE:
            return build_routes(ctx, names)
        if type_url == typeurls.EXTENSION_CONFIG:
            return build_extension_configs(ctx, names)
        if type_url == typeurls.NAME_TABLE:
            return {NAME_TABLE_RESOURCE: pack(build_name_table(ctx))}
        return {}
