"""The `grpc` generator: upstream grpcgen's names and shapes, mTLS by PeerAuthentication, EDS weights."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from istio_agent.netaddr import split_host_optional_port
from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators import ProxyContext, default_generators
from istiod_local.controlplane.xds.generators.grpc_generator import GrpcGenerator
from istiod_local.controlplane.xds.generators.grpc_names import (
    expand_short_name,
    listener_requests,
    parse_cluster_key,
    parse_server_listener,
)
from istiod_local.controlplane.xds.mesh import build_snapshot
from istiod_local.controlplane.xds.proxy import parse_node_id
from istiod_local.controlplane.xds.registry import parse_registry

REGISTRY = """
services:
- name: greeter
  selector: {app: greeter}
  ports: [{name: grpc, port: 50051, targetPort: 8080}, {name: grpc-admin, port: 9000}]
  clusterIP: 10.96.0.40
- name: db
  namespace: data
  selector: {app: db}
  ports: [{name: grpc, port: 7070}]
  clusterIP: 10.96.0.50
- name: legacy
  namespace: plain
  selector: {app: legacy}
  ports: [{name: grpc, port: 6060}]
- name: optout
  selector: {app: optout}
  ports: [{name: grpc, port: 5050}]
workloads:
- {name: greeter-1, serviceAccount: greeter, ip: 10.244.0.5,
   labels: {app: greeter, topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: z1}}
- {name: greeter-2, serviceAccount: greeter-canary, ip: 10.244.0.6, labels: {app: greeter}}
- {name: db-1, namespace: data, serviceAccount: db, ip: 10.244.0.7, labels: {app: db}}
- {name: legacy-1, namespace: plain, ip: 10.244.0.8, labels: {app: legacy}}
- {name: optout-1, ip: 10.244.0.9, labels: {app: optout, security.istio.io/tlsMode: disabled}}
- {name: client-1, serviceAccount: client, ip: 10.244.0.10, labels: {app: client}}
peerAuthentication: {data: STRICT, plain: DISABLE}
serviceEntries:
- hosts: [api.example.com]
  ports: [{number: 443, name: grpc}]
  resolution: STATIC
  endpoints: [{address: 192.0.2.11}]
"""
GREETER = "greeter.default.svc.cluster.local"
GREETER_CLUSTER = f"outbound|50051||{GREETER}"
CLIENT = "sidecar~10.244.0.10~client-1.default~default.svc.cluster.local"
SERVER = "sidecar~10.244.0.5~greeter-1.default~default.svc.cluster.local"
INBOUND = "xds.istio.io/grpc/lds/inbound/"
GEN = GrpcGenerator()


def _ctx(node_id: str = CLIENT, registry: str = REGISTRY, **meta: Any) -> ProxyContext:
    meta.setdefault("GENERATOR", "grpc")
    return ProxyContext.build(build_snapshot(1, parse_registry(registry)), parse_node_id(node_id, meta))


def _gen(type_url: str, message: Any, names: list[str] | None, ctx: ProxyContext | None = None) -> dict[str, Any]:
    out = {}
    for name, packed in GEN.generate(type_url, ctx or _ctx(), names).items():
        item = message()
        assert packed.Unpack(item), name
        out[name] = item
    return out


def _typed(any_config: Any, message: Any) -> Any:
    item = message()
    assert any_config.Unpack(item)
    return item


def _listeners(names: list[str] | None, ctx: ProxyContext | None = None) -> dict[str, listener_pb2.Listener]:
    return _gen(typeurls.LISTENER, listener_pb2.Listener, names, ctx)


def _clusters(names: list[str] | None, ctx: ProxyContext | None = None) -> dict[str, cluster_pb2.Cluster]:
    return _gen(typeurls.CLUSTER, cluster_pb2.Cluster, names, ctx)


# ---- names ----------------------------------------------------------------------------------------------------


def test_host_port_split_and_short_names() -> None:
    assert split_host_optional_port("greeter:50051") == ("greeter", 50051)
    assert split_host_optional_port("greeter") == ("greeter", None)
    assert split_host_optional_port("[::1]:80") == ("::1", 80)
    assert split_host_optional_port("greeter:http") == ("greeter:http", None)
    proxy = parse_node_id(CLIENT)
    assert expand_short_name("greeter", proxy) == GREETER
    assert expand_short_name("greeter.default", proxy) == GREETER
    assert expand_short_name("greeter.default.svc", proxy) == GREETER
    # Upstream expands only through the proxy's own namespace; the FQDN is no short form.
    assert expand_short_name("db.data", proxy) == ""
    assert expand_short_name(GREETER, proxy) == ""
    assert parse_cluster_key(GREETER_CLUSTER) is not None and str(parse_cluster_key(GREETER_CLUSTER)) == GREETER_CLUSTER
    assert parse_cluster_key("outbound|x||h") is None and parse_cluster_key("80") is None
    assert parse_server_listener(INBOUND + "[::]:8080") == ("::", 8080)
    assert parse_server_listener(INBOUND + "0.0.0.0") is None


def test_listener_requests_split_client_and_server_names() -> None:
    requests = listener_requests(["greeter:50051", f"{GREETER}:9000", INBOUND + "10.244.0.5:8080", "greeter.default"],
                                 parse_node_id(CLIENT))
    assert requests.inbound == (INBOUND + "10.244.0.5:8080",)
    assert requests.outbound[GREETER].spellings == {"greeter": {50051}, GREETER: {9000}, "greeter.default": None}


# ---- LDS ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialled", [GREETER, "greeter", "greeter.default", "greeter.default.svc"])
def test_api_listener_for_every_form_a_client_dials(dialled: str) -> None:
    name = f"{dialled}:50051"
    listeners = _listeners([name])
    assert list(listeners) == [name]
    listener = listeners[name]
    assert listener.name == name
    assert listener.address.socket_address.address == "10.96.0.40"
    assert listener.address.socket_address.port_value == 50051
    assert not listener.filter_chains and not listener.listener_filters
    hcm = _typed(listener.api_listener.api_listener, hcm_pb2.HttpConnectionManager)
    assert hcm.rds.route_config_name == GREETER_CLUSTER
    assert hcm.rds.config_source.HasField("ads")
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.fault", "envoy.filters.http.router"]


def test_listener_names_without_port_cover_every_port_and_unknown_names_are_absent() -> None:
    assert sorted(_listeners(["greeter"])) == ["greeter:50051", "greeter:9000"]
    # Another namespace's short form is not expanded (as upstream); unknown hosts and ports give nothing.
    assert _listeners(["db.data:7070", "nosuch:80", "greeter:1234"]) == {}
    assert list(_listeners(["db.data.svc.cluster.local:7070"])) == ["db.data.svc.cluster.local:7070"]


def test_wildcard_lds_lists_every_service_port_by_fqdn() -> None:
    assert sorted(_listeners(None)) == sorted([
        "api.example.com:443", "db.data.svc.cluster.local:7070", f"{GREETER}:50051", f"{GREETER}:9000",
        "legacy.plain.svc.cluster.local:6060", "optout.default.svc.cluster.local:5050"])


# ---- RDS ------------------------------------------------------------------------------------------------------


def test_route_configuration_is_named_by_cluster_and_matches_every_authority() -> None:
    routes = _gen(typeurls.ROUTE, route_pb2.RouteConfiguration, [GREETER_CLUSTER, "outbound|1||nosuch", "80"])
    assert list(routes) == [GREETER_CLUSTER]
    route = routes[GREETER_CLUSTER]
    assert route.name == GREETER_CLUSTER
    [vhost] = route.virtual_hosts
    assert vhost.name == f"{GREETER}:50051"
    # gRPC matches the dialled authority with its port: both spellings of every name.
    for name in (GREETER, "greeter", "greeter.default", "greeter.default.svc", "10.96.0.40"):
        assert name in vhost.domains and f"{name}:50051" in vhost.domains
    assert len(set(vhost.domains)) == len(vhost.domains)
    [default] = vhost.routes
    assert default.match.prefix == "/"
    assert default.route.cluster == GREETER_CLUSTER


def test_routes_for_another_namespace_use_that_namespace_short_forms() -> None:
    ctx = _ctx("sidecar~10.244.0.7~db-1.data~data.svc.cluster.local")
    route = _gen(typeurls.ROUTE, route_pb2.RouteConfiguration, [GREETER_CLUSTER], ctx)[GREETER_CLUSTER]
    domains = set(route.virtual_hosts[0].domains)
    assert "greeter.default:50051" in domains and "greeter:50051" not in domains


# ---- CDS ------------------------------------------------------------------------------------------------------


def _upstream_tls(cluster: cluster_pb2.Cluster) -> tls_pb2.UpstreamTlsContext:
    assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
    return _typed(cluster.transport_socket.typed_config, tls_pb2.UpstreamTlsContext)


def test_eds_cluster_with_mtls_to_mesh_pods() -> None:
    clusters = _clusters([GREETER_CLUSTER, "outbound|1||nosuch", "outbound|50051|v1|" + GREETER])
    assert list(clusters) == [GREETER_CLUSTER]
    cluster = clusters[GREETER_CLUSTER]
    assert cluster.type == cluster_pb2.Cluster.EDS
    assert cluster.eds_cluster_config.service_name == GREETER_CLUSTER
    assert cluster.eds_cluster_config.eds_config.HasField("ads")
    common = _upstream_tls(cluster).common_tls_context
    assert common.tls_certificate_provider_instance.instance_name == "default"
    assert common.tls_certificate_provider_instance.certificate_name == "default"
    validation = common.combined_validation_context.default_validation_context
    assert validation.ca_certificate_provider_instance.instance_name == "default"
    assert validation.ca_certificate_provider_instance.certificate_name == "ROOTCA"
    assert [m.exact for m in validation.match_subject_alt_names] == [
        "spiffe://cluster.local/ns/default/sa/greeter", "spiffe://cluster.local/ns/default/sa/greeter-canary"]
    # Nothing gRPC would refuse: no SDS, no ALPN override.
    assert not common.tls_certificate_sds_secret_configs and not common.alpn_protocols


def test_client_mtls_follows_what_the_destination_servers_demand() -> None:
    clusters = _clusters(None)
    strict = _upstream_tls(clusters["outbound|7070||db.data.svc.cluster.local"])
    sans = strict.common_tls_context.combined_validation_context.default_validation_context.match_subject_alt_names
    assert [m.exact for m in sans] == ["spiffe://cluster.local/ns/data/sa/db"]
    # DISABLE namespace, a pod that opted out of the mesh, and a service entry: plaintext.
    for name in ("outbound|6060||legacy.plain.svc.cluster.local", "outbound|5050||optout.default.svc.cluster.local",
                 "outbound|443||api.example.com"):
        assert not clusters[name].HasField("transport_socket"), name


def test_service_without_pods_follows_its_namespace() -> None:
    registry = REGISTRY.replace("{name: db-1, namespace: data,", "{name: db-1, namespace: other,")
    clusters = _clusters(["outbound|7070||db.data.svc.cluster.local"], _ctx(registry=registry))
    assert clusters["outbound|7070||db.data.svc.cluster.local"].HasField("transport_socket")
    registry = REGISTRY.replace("{name: legacy-1, namespace: plain,", "{name: legacy-1, namespace: other,")
    clusters = _clusters(["outbound|6060||legacy.plain.svc.cluster.local"], _ctx(registry=registry))
    assert not clusters["outbound|6060||legacy.plain.svc.cluster.local"].HasField("transport_socket")


# ---- EDS ------------------------------------------------------------------------------------------------------


def test_endpoints_carry_locality_and_weights() -> None:
    loads = _gen(typeurls.ENDPOINT, endpoint_pb2.ClusterLoadAssignment, [GREETER_CLUSTER])
    cla = loads[GREETER_CLUSTER]
    assert cla.cluster_name == GREETER_CLUSTER
    by_zone = {(g.locality.region, g.locality.zone): g for g in cla.endpoints}
    assert set(by_zone) == {("", ""), ("r1", "z1")}
    for group in cla.endpoints:
        assert group.HasField("locality") and group.load_balancing_weight.value == len(group.lb_endpoints)
        for endpoint in group.lb_endpoints:
            assert endpoint.load_balancing_weight.value >= 1
            assert endpoint.endpoint.address.socket_address.port_value == 8080
    assert by_zone["r1", "z1"].lb_endpoints[0].endpoint.address.socket_address.address == "10.244.0.5"
    assert _gen(typeurls.ENDPOINT, endpoint_pb2.ClusterLoadAssignment, []) == {}


# ---- server listeners -------------------------------------------------------------------------------------------


def _server_listener(node_id: str, address: str, registry: str = REGISTRY, **meta: Any) -> listener_pb2.Listener:
    name = INBOUND + address
    listeners = _listeners([name], _ctx(node_id, registry, **meta))
    assert list(listeners) == [name]
    return listeners[name]


def _check_server_hcm(chain: Any) -> None:
    [hcm_filter] = chain.filters
    hcm = _typed(hcm_filter.typed_config, hcm_pb2.HttpConnectionManager)
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]
    [vhost] = hcm.route_config.virtual_hosts
    assert list(vhost.domains) == ["*"]
    [route] = vhost.routes
    assert route.match.prefix == "/" and route.HasField("non_forwarding_action")


@pytest.mark.parametrize("registry", [REGISTRY, REGISTRY.replace("{data: STRICT,", "{default: STRICT, data: STRICT,")])
def test_server_listener_requires_mtls_for_strict_and_for_mesh_pods_in_permissive(registry: str) -> None:
    listener = _server_listener(SERVER, "10.244.0.5:8080", registry)
    assert listener.address.socket_address.address == "10.244.0.5"
    assert listener.address.socket_address.port_value == 8080
    assert not listener.listener_filters and not listener.HasField("use_original_dst")
    [chain] = listener.filter_chains
    assert chain.name == "inbound-mtls" and not chain.HasField("filter_chain_match")
    assert chain.transport_socket.name == "envoy.transport_sockets.tls"
    downstream = _typed(chain.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
    assert downstream.require_client_certificate.value
    common = downstream.common_tls_context
    assert common.tls_certificate_provider_instance.certificate_name == "default"
    validation = common.combined_validation_context.default_validation_context
    assert validation.ca_certificate_provider_instance.certificate_name == "ROOTCA"
    assert not validation.match_subject_alt_names
    _check_server_hcm(chain)


def test_server_listener_plaintext_for_disable_and_for_pods_outside_the_mesh() -> None:
    for node_id, address in (("sidecar~10.244.0.8~legacy-1.plain~plain.svc.cluster.local", "0.0.0.0:6060"),
                             ("sidecar~10.244.0.9~optout-1.default~default.svc.cluster.local", "[::]:5050")):
        listener = _server_listener(node_id, address)
        [chain] = listener.filter_chains
        assert chain.name == "inbound-plaintext" and not chain.HasField("transport_socket")
        _check_server_hcm(chain)
    # The proxy's own labels count too (upstream reads the node's labels).
    listener = _server_listener(SERVER, "10.244.0.5:8080", LABELS={"security.istio.io/tlsMode": "disabled"})
    assert listener.filter_chains[0].name == "inbound-plaintext"


def test_server_listener_only_for_ports_the_workload_serves() -> None:
    ctx = _ctx(SERVER)
    assert _listeners([INBOUND + "10.244.0.5:9999", INBOUND + "garbage"], ctx) == {}
    # The client pod serves nothing; the wildcard never includes server listeners.
    assert _listeners([INBOUND + "10.244.0.10:8080"]) == {}
    assert not any(name.startswith(INBOUND) for name in _listeners(None, ctx))


def test_server_and_client_listeners_in_one_request() -> None:
    names = [INBOUND + "10.244.0.5:9000", "greeter:50051"]
    assert sorted(_listeners(names, _ctx(SERVER))) == sorted(names)


# ---- selection --------------------------------------------------------------------------------------------------


def test_grpc_generator_is_chosen_by_metadata() -> None:
    generators = default_generators()
    assert "grpc" in generators.names()
    assert generators.for_proxy(parse_node_id(CLIENT, {"GENERATOR": "grpc"})).name == "grpc"
    assert generators.for_proxy(parse_node_id(CLIENT)).name == "sidecar"
    assert GEN.types == {typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE}


def test_shared_resources_are_built_once_per_snapshot() -> None:
    ctx = _ctx()
    first = GEN.generate(typeurls.CLUSTER, ctx, [GREETER_CLUSTER])[GREETER_CLUSTER]
    other = _ctx("sidecar~10.244.0.5~greeter-1.default~default.svc.cluster.local")
    other = ProxyContext.build(ctx.snapshot, other.proxy)
    assert GEN.generate(typeurls.CLUSTER, other, [GREETER_CLUSTER])[GREETER_CLUSTER] is first


def test_a_short_name_means_the_service_of_the_asking_proxys_namespace() -> None:
    other = "- {name: greeter, namespace: data, selector: {app: greeter}, ports: [{name: grpc, port: 50051}]}\n"
    snapshot = build_snapshot(1, parse_registry(REGISTRY.replace("services:\n", "services:\n" + other)))
    routes = {}
    for node_id in (CLIENT, "sidecar~10.244.0.7~db-1.data~data.svc.cluster.local"):
        ctx = ProxyContext.build(snapshot, parse_node_id(node_id, {"GENERATOR": "grpc"}))
        listener = _listeners(["greeter:50051"], ctx)["greeter:50051"]
        routes[ctx.proxy.namespace] = _typed(listener.api_listener.api_listener,
                                             hcm_pb2.HttpConnectionManager).rds.route_config_name
    assert routes == {"default": GREETER_CLUSTER, "data": "outbound|50051||greeter.data.svc.cluster.local"}
