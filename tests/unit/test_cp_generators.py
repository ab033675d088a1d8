"""Sidecar resources from a registry: upstream's names and shapes, per proxy."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from istio_agent.protos import nds_pb2, typeurls
from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.generators import GeneratorSet, ProxyContext, SidecarGenerator, default_generators
from istiod_local.controlplane.xds.generators.waypoint import WaypointGenerator
from istiod_local.controlplane.xds.mesh import ConnectedPod, build_snapshot
from istiod_local.controlplane.xds.proxy import ProxyError, parse_node_id
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
  ports: [{name: tcp, port: 5432, targetPort: 5433}]
  clusterIP: 10.96.0.30
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo, topology.kubernetes.io/region: r1,
   topology.kubernetes.io/zone: z1}, ip: 10.244.0.5}
- {name: echo-2, serviceAccount: echo-canary, labels: {app: echo}, ip: 10.244.0.6}
- {name: db-1, namespace: data, serviceAccount: db, labels: {app: db}, ip: 10.244.0.7}
peerAuthentication: {data: STRICT}
serviceEntries:
- hosts: [api.example.com]
  ports: [{number: 443, name: tls}]
  resolution: DNS
- hosts: [static.example.com]
  addresses: [192.0.2.10]
  ports: [{number: 8443, name: tcp}]
  resolution: STATIC
  endpoints: [{address: 192.0.2.11}]
"""
ECHO_80 = "outbound|80||echo.default.svc.cluster.local"
ECHO_POD = "sidecar~10.244.0.5~echo-1.default~default.svc.cluster.local"
DB_POD = "sidecar~10.244.0.7~db-1.data~data.svc.cluster.local"


def _ctx(node_id: str = ECHO_POD, registry: str = REGISTRY, **meta: Any) -> ProxyContext:
    return ProxyContext.build(build_snapshot(1, parse_registry(registry)), parse_node_id(node_id, meta))


def _gen(type_url: str, ctx: ProxyContext, message: Any, names: list[str] | None = None) -> dict[str, Any]:
    out = {}
    for name, packed in SidecarGenerator().generate(type_url, ctx, names).items():
        item = message()
        assert packed.Unpack(item), name
        out[name] = item
    return out


def _listeners(ctx: ProxyContext) -> dict[str, listener_pb2.Listener]:
    return _gen(typeurls.LISTENER, ctx, listener_pb2.Listener)


def _typed(any_config: Any, message: Any) -> Any:
    item = message()
    assert any_config.Unpack(item)
    return item


def test_node_id_parsing() -> None:
    proxy = parse_node_id(ECHO_POD, {"LABELS": {"app": "echo"}, "DNS_AUTO_ALLOCATE": "true", "GENERATOR": "grpc"})
    assert (proxy.type, proxy.ip, proxy.pod_name, proxy.namespace, proxy.dns_domain) == (
        "sidecar", "10.244.0.5", "echo-1", "default", "default.svc.cluster.local")
    assert proxy.labels == {"app": "echo"} and proxy.dns_auto_allocate and proxy.generator == "grpc"
    assert parse_node_id("sidecar~10.0.0.1~web.v1.prod~prod.svc.cluster.local").key == ("prod", "web.v1")
    assert parse_node_id("sidecar~10.0.0.1~x.y~d", {"NAMESPACE": "meta", "NAME": "pod"}).key == ("meta", "pod")
    for bad in ("sidecar~10.0.0.1~x", "gateway~10.0.0.1~x.y~d", "sidecar~nope~x.y~d", "sidecar~10.0.0.1~x~d"):
        with pytest.raises(ProxyError):
            parse_node_id(bad)


def test_listener_names_and_virtual_outbound() -> None:
    listeners = _listeners(_ctx())
    assert set(listeners) == {"virtualOutbound", "virtualInbound", "0.0.0.0_80", "0.0.0.0_9090", "10.96.0.30_5432",
                              "192.0.2.10_8443"}
    vo = listeners["virtualOutbound"]
    assert vo.address.socket_address.port_value == 15001 and vo.use_original_dst.value
    assert [c.name for c in vo.filter_chains] == ["virtualOutbound-blackhole", "virtualOutbound-catchall-tcp"]
    assert vo.filter_chains[0].filter_chain_match.destination_port.value == 15001
    assert _typed(vo.filter_chains[1].filters[0].typed_config, tcp_proxy_pb2.TcpProxy).cluster == "PassthroughCluster"
    http = listeners["0.0.0.0_80"]
    assert not http.bind_to_port.value and http.address.socket_address.address == "0.0.0.0"
    hcm = _typed(http.filter_chains[0].filters[0].typed_config, hcm_pb2.HttpConnectionManager)
    assert hcm.rds.route_config_name == "80" and hcm.rds.config_source.HasField("ads")
    assert hcm.http_filters[-1].name == "envoy.filters.http.router"
    tcp = listeners["10.96.0.30_5432"]
    proxy = _typed(tcp.filter_chains[0].filters[0].typed_config, tcp_proxy_pb2.TcpProxy)
    assert proxy.cluster == "outbound|5432||db.data.svc.cluster.local"


def _inbound_chains(ctx: ProxyContext) -> list[listener_pb2.FilterChain]:
    return list(_listeners(ctx)["virtualInbound"].filter_chains)


def test_virtual_inbound_permissive_http_port() -> None:
    vi = _listeners(_ctx())["virtualInbound"]
    assert vi.address.socket_address.port_value == 15006
    assert [f.name for f in vi.listener_filters] == ["envoy.filters.listener.original_dst",
                                                     "envoy.filters.listener.tls_inspector",
                                                     "envoy.filters.listener.http_inspector"]
    # The HTTP inspector is switched off on the declared ports (it would stall server-first protocols).
    disabled = vi.listener_filters[2].filter_disabled.or_match.rules
    assert {(r.destination_port_range.start, r.destination_port_range.end) for r in disabled} == {
        (8080, 8081), (9090, 9091), (15006, 15007)}
    chains = [c for c in vi.filter_chains if c.filter_chain_match.destination_port.value == 8080]
    assert [c.name for c in chains] == ["0.0.0.0_8080", "0.0.0.0_8080"]
    mtls, plain = chains
    assert mtls.filter_chain_match.transport_protocol == "tls"
    assert "istio" in mtls.filter_chain_match.application_protocols
    assert plain.filter_chain_match.transport_protocol == "raw_buffer" and not plain.HasField("transport_socket")
    server = _typed(mtls.transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
    assert server.require_client_certificate.value
    common = server.common_tls_context
    assert [s.name for s in common.tls_certificate_sds_secret_configs] == ["default"]
    assert common.combined_validation_context.validation_context_sds_secret_config.name == "ROOTCA"
    sds = common.tls_certificate_sds_secret_configs[0].sds_config.api_config_source.grpc_services[0]
    assert sds.envoy_grpc.cluster_name == "sds-grpc"
    assert list(common.alpn_protocols) == ["h2", "http/1.1"]
    hcm = _typed(mtls.filters[0].typed_config, hcm_pb2.HttpConnectionManager)
    assert hcm.forward_client_cert_details == hcm_pb2.HttpConnectionManager.APPEND_FORWARD
    assert hcm.set_current_client_cert_details.uri
    route = hcm.route_config
    assert route.name == "inbound|8080||" and route.virtual_hosts[0].name == "inbound|http|80"
    assert route.virtual_hosts[0].routes[0].route.cluster == "inbound|8080||"
    grpc_chain = next(c for c in vi.filter_chains if c.filter_chain_match.destination_port.value == 9090)
    assert _typed(grpc_chain.filters[0].typed_config, hcm_pb2.HttpConnectionManager).HasField("http2_protocol_options")


def test_virtual_inbound_strict_tcp_port_and_passthrough() -> None:
    chains = _inbound_chains(_ctx(DB_POD))
    port = [c for c in chains if c.filter_chain_match.destination_port.value == 5433]
    assert len(port) == 1 and port[0].filter_chain_match.transport_protocol == "tls"
    assert _typed(port[0].filters[0].typed_config, tcp_proxy_pb2.TcpProxy).cluster == "inbound|5433||"
    server = _typed(port[0].transport_socket.typed_config, tls_pb2.DownstreamTlsContext)
    assert list(server.common_tls_context.alpn_protocols) == ["istio-peer-exchange", "h2", "http/1.1"]
    passthrough = [c for c in chains if not c.filter_chain_match.destination_port.value]
    assert {c.filter_chain_match.transport_protocol for c in passthrough} == {"tls"}  # STRICT: no plaintext
    assert {c.name for c in passthrough} == {"virtualInbound", "virtualInbound-catchall-http"}
    assert chains[0].name == "virtualInbound-blackhole"


def test_forward_client_cert_follows_proxy_config() -> None:
    ctx = _ctx(PROXY_CONFIG={"proxyHeaders": {"forwardedClientCert": "SANITIZE_SET"}})
    chain = next(c for c in _inbound_chains(ctx) if c.filter_chain_match.destination_port.value == 8080)
    hcm = _typed(chain.filters[0].typed_config, hcm_pb2.HttpConnectionManager)
    assert hcm.forward_client_cert_details == hcm_pb2.HttpConnectionManager.SANITIZE_SET


def test_clusters() -> None:
    clusters = _gen(typeurls.CLUSTER, _ctx(), cluster_pb2.Cluster)
    assert {ECHO_80, "outbound|9090||echo.default.svc.cluster.local", "outbound|5432||db.data.svc.cluster.local",
            "outbound|443||api.example.com", "outbound|8443||static.example.com", "inbound|8080||", "inbound|9090||",
            "BlackHoleCluster", "PassthroughCluster", "InboundPassthroughCluster"} == set(clusters)
    echo = clusters[ECHO_80]
    assert echo.type == cluster_pb2.Cluster.EDS and echo.eds_cluster_config.service_name == ECHO_80
    assert [m.name for m in echo.transport_socket_matches] == ["tlsMode-istio", "tlsMode-disabled"]
    assert dict(echo.transport_socket_matches[0].match) == {"tlsMode": "istio"}
    client = _typed(echo.transport_socket_matches[0].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
    assert client.sni == "outbound_.80_._.echo.default.svc.cluster.local"
    sans = client.common_tls_context.combined_validation_context.default_validation_context.match_subject_alt_names
    assert [m.exact for m in sans] == ["spiffe://cluster.local/ns/default/sa/echo",
                                       "spiffe://cluster.local/ns/default/sa/echo-canary"]
    assert list(client.common_tls_context.alpn_protocols) == ["istio-peer-exchange", "istio"]
    grpc_client = _typed(clusters["outbound|9090||echo.default.svc.cluster.local"]
                         .transport_socket_matches[0].transport_socket.typed_config, tls_pb2.UpstreamTlsContext)
    assert list(grpc_client.common_tls_context.alpn_protocols) == ["istio-peer-exchange", "istio", "h2"]
    inbound = clusters["inbound|8080||"]
    assert inbound.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert inbound.upstream_bind_config.source_address.address == "127.0.0.6"
    assert clusters["outbound|443||api.example.com"].type == cluster_pb2.Cluster.STRICT_DNS
    assert not clusters["outbound|443||api.example.com"].transport_socket_matches
    assert clusters["PassthroughCluster"].type == cluster_pb2.Cluster.ORIGINAL_DST


def test_localhost_inbound_policy_uses_static_127_0_0_1() -> None:
    clusters = _gen(typeurls.CLUSTER, _ctx(registry=REGISTRY + "inboundTrafficPolicy: LOCALHOST\n"),
                    cluster_pb2.Cluster)
    inbound = clusters["inbound|8080||"]
    assert inbound.type == cluster_pb2.Cluster.STATIC
    address = inbound.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("127.0.0.1", 8080)


def test_endpoints_by_locality_with_weights() -> None:
    assignments = _gen(typeurls.ENDPOINT, _ctx(), endpoint_pb2.ClusterLoadAssignment)
    assert set(assignments) == {ECHO_80, "outbound|9090||echo.default.svc.cluster.local",
                                "outbound|5432||db.data.svc.cluster.local", "outbound|8443||static.example.com"}
    echo = assignments[ECHO_80]
    localities = {(g.locality.region, g.locality.zone): g for g in echo.endpoints}
    assert set(localities) == {("", ""), ("r1", "z1")}
    for group in echo.endpoints:
        assert group.load_balancing_weight.value == len(group.lb_endpoints)
        for lb in group.lb_endpoints:
            assert lb.load_balancing_weight.value == 1
            assert lb.endpoint.address.socket_address.port_value == 8080
            assert lb.metadata.filter_metadata["envoy.transport_socket_match"]["tlsMode"] == "istio"
    static = assignments["outbound|8443||static.example.com"].endpoints[0].lb_endpoints[0]
    assert static.endpoint.address.socket_address.address == "192.0.2.11"
    assert not static.metadata.filter_metadata  # external: plaintext


TLS_MODE_REGISTRY = """
services:
- {name: web, namespace: plain, selector: {app: web}, ports: [{name: http, port: 80, protocol: HTTP}]}
- {name: web, namespace: open, selector: {app: web}, ports: [{name: http, port: 80, protocol: HTTP}]}
workloads:
- {name: injected, namespace: open, labels: {app: web}, ip: 10.244.0.11}
- {name: not-injected, namespace: open, labels: {app: web}, ip: 10.244.0.12, sidecar: none}
- {name: opted-out, namespace: open, labels: {app: web, security.istio.io/tlsMode: disabled}, ip: 10.244.0.13}
- {name: labelled, namespace: open, labels: {app: web, security.istio.io/tlsMode: istio}, ip: 10.244.0.14,
   sidecar: none}
- {name: in-disabled-ns, namespace: plain, labels: {app: web}, ip: 10.244.0.15}
workloadEntries:
- {name: vm-with-sa, namespace: open, address: 10.244.0.16, serviceAccount: vm, labels: {app: web}}
- {name: vm-without-sa, namespace: open, address: 10.244.0.17, labels: {app: web}}
peerAuthentication: {plain: DISABLE}
"""


def test_endpoint_mtls_follows_tls_mode_and_peer_authentication() -> None:
    """As upstream's endpoint builder: mTLS metadata only where the workload takes mTLS (its tlsMode label,
    implied by injection or, for a WorkloadEntry, a service account) and its namespace is not DISABLE."""
    assignments = _gen(typeurls.ENDPOINT, _ctx(registry=TLS_MODE_REGISTRY), endpoint_pb2.ClusterLoadAssignment)
    modes = {}
    for cla in assignments.values():
        for group in cla.endpoints:
            for lb in group.lb_endpoints:
                match = lb.metadata.filter_metadata.get("envoy.transport_socket_match")
                modes[lb.endpoint.address.socket_address.address] = match["tlsMode"] if match else None
    assert modes == {"10.244.0.11": "istio", "10.244.0.12": None, "10.244.0.13": None, "10.244.0.14": "istio",
                     "10.244.0.15": None, "10.244.0.16": "istio", "10.244.0.17": None}


def test_routes_domains_depend_on_proxy_namespace() -> None:
    same = _gen(typeurls.ROUTE, _ctx(), route_pb2.RouteConfiguration, ["80", "nope"])
    assert set(same) == {"80"}
    route = same["80"]
    assert route.ignore_port_in_host_matching and not route.validate_clusters.value
    vhost, allow_any = route.virtual_hosts
    assert vhost.name == "echo.default.svc.cluster.local:80"
    assert list(vhost.domains) == ["echo.default.svc.cluster.local", "echo", "echo.default.svc", "echo.default",
                                   "10.96.0.20"]
    assert vhost.routes[0].route.cluster == ECHO_80
    assert allow_any.name == "allow_any" and list(allow_any.domains) == ["*"]
    assert allow_any.routes[0].route.cluster == "PassthroughCluster"
    other = _gen(typeurls.ROUTE, _ctx(DB_POD), route_pb2.RouteConfiguration, ["80"])["80"]
    assert list(other.virtual_hosts[0].domains) == ["echo.default.svc.cluster.local", "echo.default",
                                                    "echo.default.svc", "10.96.0.20"]


def test_name_table_and_auto_allocation() -> None:
    table = _gen(typeurls.NAME_TABLE, _ctx(), nds_pb2.NameTable)[""].table
    echo = table["echo.default.svc.cluster.local"]
    assert (list(echo.ips), echo.registry, echo.shortname, echo.namespace) == (["10.96.0.20"], "Kubernetes", "echo",
                                                                               "default")
    assert table["static.example.com"].registry == "External" and list(table["static.example.com"].ips) == [
        "192.0.2.10"]
    assert "api.example.com" not in table  # no address, and the proxy did not ask for auto-allocation
    auto = _ctx(DNS_AUTO_ALLOCATE="true")
    table = _gen(typeurls.NAME_TABLE, auto, nds_pb2.NameTable)[""].table
    vip = auto.snapshot.registry.auto_vips["api.example.com"]
    assert list(table["api.example.com"].ips) == [vip] and vip.startswith("240.240.")
    assert f"{vip}_443" in _listeners(auto)  # the auto VIP also gets its TCP listener


def test_pod_address_learned_from_connected_proxy() -> None:
    registry = parse_registry(REGISTRY.replace(", ip: 10.244.0.7", ""))
    without = build_snapshot(1, registry)
    db = without.service("db.data.svc.cluster.local")
    assert db is not None and not without.endpoints(db, db.ports[0])
    pod = ConnectedPod("data", "db-1", "10.1.2.3", "db", {})
    stranger = ConnectedPod("data", "db-9", "10.1.2.4", "db", {"app": "db"})
    snapshot = build_snapshot(2, registry, {pod_key(pod): pod, pod_key(stranger): stranger})
    assert [e.address for e in snapshot.endpoints(db, db.ports[0])] == ["10.1.2.3", "10.1.2.4"]


def pod_key(pod: ConnectedPod) -> tuple[str, str]:
    return (pod.namespace, pod.name)


def test_proxy_outside_registry_gets_outbound_only() -> None:
    ctx = _ctx("sidecar~10.9.9.9~sleep-1.default~default.svc.cluster.local")
    assert ctx.workload is None and not ctx.inbound
    clusters = _gen(typeurls.CLUSTER, ctx, cluster_pb2.Cluster)
    assert ECHO_80 in clusters and not any(name.startswith("inbound|") for name in clusters)


def test_generator_selection_by_metadata_falls_back_to_sidecar() -> None:
    generators = default_generators()
    assert sorted(generators.names()) == ["grpc", "sidecar", "waypoint"]
    assert generators.for_proxy(parse_node_id(ECHO_POD, {"GENERATOR": "grpc"})).name == "grpc"
    assert generators.for_proxy(parse_node_id(ECHO_POD, {"GENERATOR": "no-such"})).name == "sidecar"
    assert generators.for_proxy(parse_node_id(ECHO_POD, {})).name == "sidecar"
    waypoint = parse_node_id(ECHO_POD.replace("sidecar~", "waypoint~"), {})
    assert generators.for_proxy(waypoint).name == "waypoint"


def test_a_waypoint_gets_clusters_and_endpoints_but_no_listeners() -> None:
    ctx = _ctx()
    waypoint = WaypointGenerator()
    assert waypoint.generate(typeurls.LISTENER, ctx, None) == {}
    assert set(waypoint.generate(typeurls.CLUSTER, ctx, None)) == set(SidecarGenerator().generate(
        typeurls.CLUSTER, ctx, None))
    assert waypoint.generate(typeurls.ENDPOINT, ctx, None)


def test_reserved_ports_get_no_outbound_listener() -> None:
    registry = REGISTRY.replace("{name: grpc, port: 9090, protocol: GRPC}", "{name: http-admin, port: 15000}")
    assert "0.0.0.0_15000" not in _listeners(_ctx(registry=registry))


class _Exploding:
    """A generator with a bug that only a particular registry triggers."""

    name = "sidecar"
    types = SidecarGenerator.types

    def generate(self, type_url: str, ctx: ProxyContext, names: Any) -> Any:
        if any(s.name == "boom" for s in ctx.snapshot.registry.services):
            raise RuntimeError("generator bug")
        return SidecarGenerator().generate(type_url, ctx, names)


def test_registry_that_breaks_generation_is_not_served() -> None:
    good = parse_registry(REGISTRY)
    ads = AdsServer(good, GeneratorSet({"sidecar": _Exploding()}))
    version = ads.snapshot.version
    with pytest.raises(RuntimeError):
        ads.update_registry(parse_registry(REGISTRY.replace("name: db\n", "name: boom\n")))
    assert ads.registry is good and ads.snapshot.version == version
    assert ads.update_registry(parse_registry(REGISTRY.replace("name: db\n", "name: pg\n"))) == version + 1
    assert "outbound|5432||pg.data.svc.cluster.local" in ads.snapshot.memo["cds"]  # warmed by the probe


@pytest.mark.parametrize("listed", ["evil", "300.1.1.1", "1.2.3.4 ; rm", "10.0.0.1/8", "fe80::1%eth0",
                                    "10.0.0.1,evil", "010.0.0.1"])
def test_instance_ips_that_are_not_ip_addresses_refuse_the_proxy_naming_them(listed: str) -> None:
    with pytest.raises(ProxyError, match=r"INSTANCE_IPS .* is not an IP address"):
        parse_node_id("sidecar~10.0.0.1~vm.default~default.svc.cluster.local", {"INSTANCE_IPS": listed})


def test_instance_ips_that_are_addresses_are_the_proxys_addresses() -> None:
    proxy = parse_node_id("sidecar~10.0.0.1~vm.default~d", {"INSTANCE_IPS": " 10.0.0.2, fd00::2 ,::ffff:1.2.3.4"})
    assert proxy.ips == ["10.0.0.1", "10.0.0.2", "fd00::2", "::ffff:1.2.3.4"]
