"""The real Envoy takes istiod-local's generated sidecar config (SotW and Delta ADS).

Envoy runs in its own network namespace and reaches the ADS and test SDS
servers over unix sockets (see `cp_envoy_harness`). The proof is Envoy's `/config_dump` and
`/stats`: listeners and clusters active (not warming), nothing rejected, and
a registry change shows up in Envoy.
"""

from __future__ import annotations

import pytest
from cp_envoy_harness import envoy_with_istiod, nothing_rejected
from support import HTTP_NOT_YET, eventually

from istiod_local.controlplane.xds.registry import parse_registry

REGISTRY = """
services:
- name: echo
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}, {name: grpc, port: 9090, protocol: GRPC}]
  clusterIP: 10.96.0.20
- name: db
  namespace: data
  selector: {app: db}
  ports: [{name: tcp, port: 5432}]
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo}, ip: 10.244.0.5}
- {name: db-1, namespace: data, serviceAccount: db, labels: {app: db}, ip: 10.244.0.6}
peerAuthentication: {default: %s}
serviceEntries:
- hosts: [api.example.com]
  ports: [{number: 443, name: tls}]
  resolution: DNS
"""


EXPECTED_LISTENERS = {"virtualOutbound", "virtualInbound", "0.0.0.0_80", "0.0.0.0_9090"}
EXPECTED_CLUSTERS = {
    "outbound|80||echo.default.svc.cluster.local", "outbound|9090||echo.default.svc.cluster.local",
    "outbound|5432||db.data.svc.cluster.local", "outbound|443||api.example.com",
    "inbound|8080||", "inbound|9090||", "BlackHoleCluster", "PassthroughCluster", "InboundPassthroughCluster",
}


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_envoy_accepts_sidecar_config(delta: bool) -> None:
    registry = parse_registry(REGISTRY % "PERMISSIVE")
    async with envoy_with_istiod(registry, delta) as envoy:
        listeners = await eventually(lambda: set(envoy.active_listeners()) >= EXPECTED_LISTENERS
                                      and envoy.active_listeners(), "listeners to become active",
                                      retry_on=HTTP_NOT_YET)
        db_vip = next(s.cluster_ip for s in registry.services if s.name == "db")
        assert f"{db_vip}_5432" in listeners
        await eventually(lambda: envoy.active_clusters() >= EXPECTED_CLUSTERS, "clusters to become active",
                         retry_on=HTTP_NOT_YET)
        assert not envoy.warming_clusters()
        nothing_rejected(envoy)
        inbound = listeners["virtualInbound"]["active_state"]["listener"]
        ports = {c.get("filter_chain_match", {}).get("destination_port") for c in inbound["filter_chains"]}
        assert {8080, 9090, 15006} <= ports
        routes = await eventually(lambda: envoy.dump_section("RoutesConfigDump").get("dynamic_route_configs"),
                                   "routes", retry_on=HTTP_NOT_YET)
        names = {r["route_config"]["name"] for r in routes}
        assert {"80", "9090"} <= names


async def test_strict_registry_change_reaches_envoy() -> None:
    registry = parse_registry(REGISTRY % "STRICT")
    async with envoy_with_istiod(registry, delta=True) as envoy:
        await eventually(lambda: envoy.active_clusters() >= EXPECTED_CLUSTERS, "clusters to become active",
                         retry_on=HTTP_NOT_YET)
        await eventually(lambda: "virtualInbound" in envoy.active_listeners(), "virtualInbound", retry_on=HTTP_NOT_YET)
        inbound = envoy.active_listeners()["virtualInbound"]["active_state"]["listener"]
        port_chains = [c for c in inbound["filter_chains"]
                       if c.get("filter_chain_match", {}).get("destination_port") == 8080]
        assert [c["filter_chain_match"]["transport_protocol"] for c in port_chains] == ["tls"]

        changed = parse_registry((REGISTRY % "STRICT").replace("name: db\n", "name: pg\n"))
        envoy.ads.update_registry(changed)
        await eventually(lambda: "outbound|5432||pg.data.svc.cluster.local" in envoy.active_clusters()
                          and "outbound|5432||db.data.svc.cluster.local" not in envoy.active_clusters(),
                          "the renamed service to replace the old one in Envoy", retry_on=HTTP_NOT_YET)
        nothing_rejected(envoy)
