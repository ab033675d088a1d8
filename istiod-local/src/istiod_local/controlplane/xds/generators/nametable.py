"""NDS: the NameTable the agent's DNS proxy answers from.

As upstream's `BuildNameTable`: every Kubernetes service host with its
clusterIP, registry `Kubernetes`, short name and namespace (the agent
expands `name`, `name.ns`, `name.ns.svc` itself); every service-entry host
with its addresses, registry `External`. A service-entry host without
addresses gets its auto-allocated VIP only when the proxy asked for
auto-allocation (`DNS_AUTO_ALLOCATE`); otherwise it is left to real DNS.
"""

from __future__ import annotations

from istio_agent.protos import nds_pb2
from istiod_local.controlplane.xds.generators.base import ProxyContext
from istiod_local.controlplane.xds.generators.routes import service_addresses
from istiod_local.controlplane.xds.mesh import KUBERNETES


def build_name_table(ctx: ProxyContext) -> nds_pb2.NameTable:
    table = nds_pb2.NameTable()
    for view in ctx.snapshot.services:
        if view.hostname.startswith("*"):
            continue
        ips = [ip for ip in service_addresses(view, ctx.proxy, ctx.snapshot) if ip and ip != "0.0.0.0"]
        if not ips:
            continue
        info = table.table[view.hostname]
        info.ips.extend(ips)
        info.registry = view.registry
        if view.registry == KUBERNETES:
            info.shortname = view.name
            info.namespace = view.namespace
    return table
