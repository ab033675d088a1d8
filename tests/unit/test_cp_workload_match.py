"""Which workload a proxy is: its node id's pod name and namespace first, its IP only as an unambiguous fallback.

Workloads may share an address (hostNetwork pods, several workloads on one
VM, two proxyless apps on one loopback), so the IP alone cannot say who is
asking: a shared one must never hand one workload's inbound config or
identity to another.
"""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators import ProxyContext
from istiod_local.controlplane.xds.generators.grpc_generator import GrpcGenerator
from istiod_local.controlplane.xds.mesh import ConnectedPod, WorkloadIndex, build_snapshot
from istiod_local.controlplane.xds.proxy import parse_node_id
from istiod_local.controlplane.xds.registry import Workload, parse_registry

SHARED = """
services:
- name: alpha
  selector: {app: alpha}
  ports: [{name: grpc, port: 7001, targetPort: 17001}]
- name: beta
  selector: {app: beta}
  ports: [{name: grpc, port: 7002, targetPort: 17002}]
- name: both
  selector: {tier: back}
  ports: [{name: grpc, port: 7003, targetPort: 17003}]
workloads:
- {name: alpha-1, serviceAccount: alpha, labels: {app: alpha, tier: back}, ip: 127.0.0.1}
- {name: beta-1, serviceAccount: beta, labels: {app: beta, tier: back}, ip: 127.0.0.1}
- {name: vm-1, serviceAccount: vm, labels: {app: vm}, ip: 10.0.0.9}
- {name: other-1, namespace: other, serviceAccount: other, labels: {app: alpha}, ip: 10.0.0.9}
"""
INBOUND = "xds.istio.io/grpc/lds/inbound/127.0.0.1:"


def node_id(pod: str, ip: str = "127.0.0.1", namespace: str = "default") -> str:
    return f"sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local"


def context(pod: str, ip: str = "127.0.0.1", connected: dict[tuple[str, str], ConnectedPod] | None = None,
            **meta: Any) -> ProxyContext:
    snapshot = build_snapshot(1, parse_registry(SHARED), connected or {})
    return ProxyContext.build(snapshot, parse_node_id(node_id(pod, ip), {"GENERATOR": "grpc", **meta}))


def inbound_ports(ctx: ProxyContext) -> list[int]:
    return [target.port.target_port for target in ctx.inbound]


def test_workloads_on_one_ip_are_told_apart_by_pod_name() -> None:
    alpha, beta = context("alpha-1"), context("beta-1")
    assert alpha.workload is not None and alpha.workload.name == "alpha-1"
    assert alpha.workload.service_account == "alpha"
    assert beta.workload is not None and beta.workload.name == "beta-1"
    assert beta.workload.service_account == "beta"
    assert inbound_ports(alpha) == [17001, 17003]
    assert inbound_ports(beta) == [17002, 17003]


def test_each_gets_only_its_own_server_listeners() -> None:
    names = [f"{INBOUND}17001", f"{INBOUND}17002"]
    for pod, port in (("alpha-1", 17001), ("beta-1", 17002)):
        resources = GrpcGenerator().generate(typeurls.LISTENER, context(pod), names)
        assert sorted(resources) == [f"{INBOUND}{port}"], pod
        listener = listener_pb2.Listener()
        assert resources[f"{INBOUND}{port}"].Unpack(listener)
        assert listener.address.socket_address.port_value == port


def test_a_name_match_wins_over_another_workloads_ip() -> None:
    ctx = context("beta-1", ip="10.0.0.9")  # vm-1's address, but the node id names beta-1
    assert ctx.workload is not None and ctx.workload.name == "beta-1"


def test_the_ip_is_a_fallback_only_when_it_names_one_workload() -> None:
    vm = context("vm-host", ip="10.0.0.9")  # an agent named after its host, not its registry entry
    assert vm.workload is not None and vm.workload.name == "vm-1"  # other-1 shares the IP, in another namespace
    shared = context("stranger", ip="127.0.0.1")  # alpha-1 and beta-1: ambiguous, so neither
    assert shared.workload is None and shared.inbound == ()


def test_an_ambiguous_pod_is_what_it_said_it_was_on_connecting() -> None:
    stranger = ConnectedPod("default", "stranger", "127.0.0.1", "stranger", {"app": "beta"})
    ctx = context("stranger", connected={("default", "stranger"): stranger})
    assert ctx.workload is not None and (ctx.workload.name, ctx.workload.registered) == ("stranger", False)
    assert ctx.workload.service_account == "stranger"


def test_a_connected_pod_matched_by_ip_is_not_a_second_workload() -> None:
    host = ConnectedPod("default", "vm-host", "10.0.0.9", "vm", {"app": "vm"})
    snapshot = build_snapshot(1, parse_registry(SHARED), {("default", "vm-host"): host})
    assert [w.name for w in snapshot.workloads if w.ip == "10.0.0.9"] == ["vm-1", "other-1"]


def test_a_shared_address_and_port_is_one_endpoint() -> None:
    snapshot = build_snapshot(1, parse_registry(SHARED))
    both = snapshot.service("both.default.svc.cluster.local")
    assert both is not None
    endpoints = snapshot.endpoints(both, both.ports[0])
    assert [(e.address, e.port) for e in endpoints] == [("127.0.0.1", 17003)]
    assert endpoints[0].workload is not None and endpoints[0].workload.name == "alpha-1"  # the first in the file
    assert snapshot.service_accounts(both) == ["spiffe://cluster.local/ns/default/sa/alpha",
                                               "spiffe://cluster.local/ns/default/sa/beta"]


def test_workload_index_rules() -> None:
    a = Workload("a", "default", "a", {}, "10.0.0.1")
    b = Workload("b", "default", "b", {}, "10.0.0.1")
    c = Workload("c", "default", "c", {}, "10.0.0.2")
    index = WorkloadIndex([a, b, c])
    assert index.match("default", "b", ["10.0.0.2"]) is b
    assert index.match("default", "x", ["10.0.0.2"]) is c
    assert index.match("default", "x", ["10.0.0.1"]) is None
    assert index.match("default", "x", ["10.0.0.2", "10.0.0.2"]) is c
    assert index.match("default", "x", ["10.0.0.2", "10.0.0.1"]) is None  # two IPs, different workloads
    assert index.match("other", "x", ["10.0.0.2"]) is None
    assert index.by_name("default", "a") is a and index.by_name("default", "x") is None
