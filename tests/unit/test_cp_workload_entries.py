"""WorkloadGroups and WorkloadEntries: registry parsing, entry naming, and auto-registration decisions (sans-IO).

Time is passed in as plain numbers; nothing here waits.
"""

from __future__ import annotations

import pytest

from istiod_local.controlplane.tokens import TokenIdentity
from istiod_local.controlplane.xds.autoregistration import (
    AutoRegistration,
    RegistrationRefused,
    VmProxy,
    WorkloadEntryOptions,
    entry_name,
    format_time,
)
from istiod_local.controlplane.xds.generators import ProxyContext
from istiod_local.controlplane.xds.generators.endpoints import build_endpoints
from istiod_local.controlplane.xds.mesh import MeshSnapshot, effective_workloads, service_views
from istiod_local.controlplane.xds.proxy import parse_node_id
from istiod_local.controlplane.xds.registry import Registry, RegistryError, parse_registry

REGISTRY = """\
services:
- name: vm
  selector: {app: vm}
  ports: [{name: http, port: 80, targetPort: 8080}]
workloadGroups:
- name: vm
  namespace: default
  metadata: {labels: {app: vm, version: v1}, annotations: {team: a}}
  template: {serviceAccount: vm-sa, ports: {http: 8080}, labels: {app: template, tier: back}}
  probe:
    periodSeconds: 5
    failureThreshold: 3
    httpGet: {path: /ready, port: 8080, scheme: HTTP, httpHeaders: [{name: X-Probe, value: "1"}]}
workloadEntries:
- {name: static-1, address: 10.0.0.9, labels: {app: vm}, serviceAccount: vm-sa, weight: 3}
"""
VM_SA = TokenIdentity("default", "vm-sa")


def registry(text: str = REGISTRY) -> Registry:
    return parse_registry(text, "mesh.yaml")


def vm(ip: str = "10.0.0.5", group: str = "vm", probe: bool = True, **kw: object) -> VmProxy:
    return VmProxy(f"sidecar~{ip}~vm-host.default~default.svc.cluster.local", "default", (ip,), group,
                   readiness_probe=probe, **kw)  # type: ignore[arg-type]


def refused(text: str) -> str:
    with pytest.raises(RegistryError) as info:
        registry(text)
    return str(info.value)


# ---- registry ------------------------------------------------------------------------------------------------


def test_groups_and_entries_parse_with_upstreams_field_names() -> None:
    r = registry()
    group = r.workload_group("default", "vm")
    assert group is not None
    assert group.labels == {"app": "vm", "version": "v1"} and group.annotations == {"team": "a"}
    assert group.template.service_account == "vm-sa" and group.template.ports == {"http": 8080}
    assert group.probe == {"periodSeconds": 5, "failureThreshold": 3,
                           "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP",
                                       "httpHeaders": [{"name": "X-Probe", "value": "1"}]}}
    entry = r.workload_entry("default", "static-1")
    assert entry is not None and (entry.address, entry.weight, entry.service_account) == ("10.0.0.9", 3, "vm-sa")


@pytest.mark.parametrize("probe", ["tcpSocket: {port: 22}", "exec: {command: [true]}", "grpc: {port: 9000}"])
def test_each_probe_method_is_accepted(probe: str) -> None:
    text = f"workloadGroups:\n- name: g\n  template: {{}}\n  probe: {{{probe}}}\n"
    group = registry(text).workload_groups[0]
    assert group.probe is not None and len(group.probe) == 1
    assert group.template.service_account == "default"  # istioctl's default


@pytest.mark.parametrize(("text", "where"), [
    ("workloadGroups:\n- {name: g}\n", "mesh.yaml:2: workloadGroups[0].template: is required"),
    ("workloadGroups:\n- name: g\n  template: {}\n  probe: {periodSeconds: 1}\n",
     "workloadGroups[0].probe: must have exactly one of httpGet"),
    ("workloadGroups:\n- name: g\n  template: {}\n  probe: {httpGet: {port: 80}, tcpSocket: {port: 80}}\n",
     "got httpGet, tcpSocket"),
    ("workloadGroups:\n- name: g\n  template: {}\n  probe: {periodSeconds: -1, tcpSocket: {port: 1}}\n",
     "workloadGroups[0].probe.periodSeconds: must be between 0"),
    ("workloadGroups:\n- name: g\n  template: {}\n  probe:\n    httpGet: {port: 80, scheme: FTP}\n",
     "mesh.yaml:5: workloadGroups[0].probe.httpGet.scheme: must be one of HTTP, HTTPS"),
    ("workloadGroups:\n- name: g\n  template: {}\n  probe: {exec: {command: []}}\n",
     "workloadGroups[0].probe.exec.command: must not be empty"),
    ("workloadGroups:\n- name: g\n  template: {serviceAccount: Bad_SA}\n",
     "workloadGroups[0].template.serviceAccount: must be a DNS label"),
    ("workloadGroups:\n- name: g\n  template: {name: x}\n", "workloadGroups[0].template.name: unknown field"),
    ("workloadEntries:\n- {name: e}\n", "workloadEntries[0].address: is required"),
    ("workloadEntries:\n- {name: e, address: vm.example}\n", "workloadEntries[0].address: must be an IP address"),
    ("workloadEntries:\n- {name: e, address: 10.0.0.1, ports: {http: 0}}\n",
     "workloadEntries[0].ports.http: must be between 1 and 65535"),
    ("workloadEntries:\n- {name: e, address: 10.0.0.1}\n- {name: e, address: 10.0.0.2}\n",
     "mesh.yaml:3: workloadEntries[1].name: workload entry default/e is already defined at workloadEntries[0]"),
])
def test_bad_values_are_named_by_path(text: str, where: str) -> None:
    assert where in refused(text)


# ---- naming and the entry's content ------------------------------------------------------------------------------


def test_entry_names_as_upstream_builds_them() -> None:
    assert entry_name("vm", "10.0.0.5") == "vm-10.0.0.5"
    assert entry_name("vm", "fd00::5", "net1") == "vm-fd00--5-net1"
    long = entry_name("g" * 300, "10.0.0.5")
    assert len(long) == 253 and long.endswith("-10.0.0.5")


def test_proxy_address_is_instance_ips_first_then_node_id() -> None:
    node = "sidecar~10.0.0.5~vm-host.default~default.svc.cluster.local"
    assert VmProxy.from_proxy(parse_node_id(node, {"AUTO_REGISTER_GROUP": "vm"})).ips == ("10.0.0.5",)
    proxy = parse_node_id(node, {"AUTO_REGISTER_GROUP": "vm", "INSTANCE_IPS": "192.168.1.4,10.0.0.5",
                                 "PROXY_CONFIG": {"readinessProbe": {"tcpSocket": {"port": 1}}}})
    vm_proxy = VmProxy.from_proxy(proxy)
    assert vm_proxy.ips[0] == "192.168.1.4" and vm_proxy.readiness_probe and vm_proxy.is_vm()
    assert not vm_proxy.is_vm(WorkloadEntryOptions(auto_registration=False))


def test_registered_entry_takes_template_group_and_proxy_labels_and_marks_annotations() -> None:
    auto = AutoRegistration(options=WorkloadEntryOptions(grace_period=10))
    r = registry()
    proxy = vm(labels={"tier": "front", "istio-locality": "r/z"}, network="net1")
    name = auto.connect("c1", proxy, VM_SA, r, 1000.5)
    assert name == "vm-10.0.0.5-net1"
    entry, healthy = auto.entries(r)[-1]
    assert entry.labels == {"app": "vm", "version": "v1", "tier": "front"}
    assert entry.service_account == "vm-sa" and entry.address == "10.0.0.5" and entry.network == "net1"
    assert entry.annotations == {
        "istio.io/autoRegistrationGroup": "vm", "team": "a", "proxy.istio.io/health-checks-enabled": "true",
        "istio.io/workloadController": "istiod-local", "istio.io/connectedAt": "1970-01-01T00:16:40.5Z"}
    assert not healthy  # health checks enabled, no report yet


def test_time_format_is_rfc3339nano() -> None:
    assert format_time(0) == "1970-01-01T00:00:00Z"
    assert format_time(1.25) == "1970-01-01T00:00:01.25Z"


# ---- identity -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("identity", "reason"), [
    (None, "requires a verified identity"),
    (TokenIdentity("default", "other"), "service account mismatch: token for 'other', entry wants 'vm-sa'"),
    (TokenIdentity("prod", "vm-sa"), "namespace mismatch"),
])
def test_another_identity_cannot_register(identity: TokenIdentity | None, reason: str) -> None:
    auto = AutoRegistration()
    with pytest.raises(RegistrationRefused) as info:
        auto.connect("c1", vm(), identity, registry(), 0)
    assert reason in str(info.value)
    assert len(auto.entries(registry())) == 1  # only the static entry


def test_a_missing_group_refuses_with_failed_precondition() -> None:
    with pytest.raises(RegistrationRefused) as info:
        AutoRegistration().connect("c1", vm(group="nope"), VM_SA, registry(), 0)
    assert info.value.code == "FAILED_PRECONDITION" and "cannot find WorkloadGroup default/nope" in str(info.value)


def test_a_plain_proxy_is_no_vm() -> None:
    assert AutoRegistration().connect("c1", vm(group=""), VM_SA, registry(), 0) == ""


# ---- disconnect, grace, reconnect -------------------------------------------------------------------------------


def names(auto: AutoRegistration, r: Registry) -> list[str]:
    return [e.name for e, _ in auto.entries(r)]


def test_the_entry_outlives_its_last_stream_by_the_grace_period() -> None:
    auto, r = AutoRegistration(options=WorkloadEntryOptions(grace_period=10)), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    auto.connect("c2", vm(), VM_SA, r, 101)  # a second stream of the same VM
    auto.disconnect("c1", 102)
    assert auto.next_deadline() is None  # c2 still connected
    auto.disconnect("c2", 103)
    assert auto.next_deadline() == 113
    entry = next(e for e, _ in auto.entries(r) if e.name == "vm-10.0.0.5")
    assert "istio.io/connectedAt" not in entry.annotations
    assert entry.annotations["istio.io/disconnectedAt"] == format_time(103)
    assert not auto.expire(112.9) and "vm-10.0.0.5" in names(auto, r)
    assert auto.expire(113) and names(auto, r) == ["static-1"]


def test_a_reconnect_within_the_grace_period_keeps_the_entry_and_its_health() -> None:
    auto, r = AutoRegistration(options=WorkloadEntryOptions(grace_period=10)), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    auto.report_health("c1", True, "", 101)
    auto.disconnect("c1", 102)
    auto.connect("c2", vm(), VM_SA, r, 105)
    assert auto.next_deadline() is None
    assert not auto.expire(200)
    entry, healthy = auto.entries(r)[-1]
    assert entry.name == "vm-10.0.0.5" and healthy
    assert entry.annotations["istio.io/connectedAt"] == format_time(105)


def test_reconnecting_with_another_identity_is_refused_even_while_the_entry_lingers() -> None:
    auto, r = AutoRegistration(options=WorkloadEntryOptions(grace_period=10)), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    auto.disconnect("c1", 101)
    with pytest.raises(RegistrationRefused):
        auto.connect("c2", vm(), TokenIdentity("default", "other"), r, 102)


# ---- health -------------------------------------------------------------------------------------------------


def test_health_reports_set_the_condition_and_decide_eds() -> None:
    auto, r = AutoRegistration(), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    assert auto.report_health("c1", True, "", 101)
    assert auto.entries(r)[-1][1]
    assert not auto.report_health("c1", True, "", 102)  # no change
    assert auto.report_health("c1", False, "connection refused", 103)
    condition = auto.health("default", "vm-10.0.0.5")
    assert condition is not None and condition.as_status()["status"] == "False"
    assert condition.as_status()["message"] == "connection refused"
    assert not auto.entries(r)[-1][1]


def test_without_a_probe_the_entry_is_healthy_whatever_is_reported() -> None:
    auto, r = AutoRegistration(), registry()
    auto.connect("c1", vm(probe=False), VM_SA, r, 100)
    assert auto.entries(r)[-1][1]
    auto.report_health("c1", False, "down", 101)
    assert auto.entries(r)[-1][1]  # the condition is kept, but EDS ignores it without the annotation


def test_health_from_a_stream_with_no_entry_is_ignored() -> None:
    assert not AutoRegistration().report_health("nobody", False, "x", 1)


def test_a_static_health_checked_entry_is_controlled_by_its_proxy() -> None:
    text = REGISTRY + ("- {name: db-vm, address: 10.0.0.7, labels: {app: db}, serviceAccount: vm-sa,\n"
                       "   annotations: {proxy.istio.io/health-checks-enabled: 'true'}}\n")
    auto, r = AutoRegistration(options=WorkloadEntryOptions(grace_period=5)), registry(text)
    assert not dict((e.name, h) for e, h in auto.entries(r))["db-vm"]  # never reported: unhealthy
    proxy = vm(ip="10.0.0.7", group="", workload_entry="db-vm")
    assert auto.connect("c1", proxy, VM_SA, r, 10) == "db-vm"
    auto.report_health("c1", True, "", 11)
    assert dict((e.name, h) for e, h in auto.entries(r))["db-vm"]
    auto.disconnect("c1", 12)
    auto.expire(17)  # its health condition goes with the grace period; the entry stays
    assert dict((e.name, h) for e, h in auto.entries(r)) == {"static-1": True, "db-vm": False}
    with pytest.raises(RegistrationRefused, match="does not exist"):
        auto.connect("c2", vm(group="", workload_entry="ghost"), VM_SA, r, 20)


# ---- registry changes -----------------------------------------------------------------------------------------


def test_an_entry_goes_with_its_group_and_comes_back_with_it() -> None:
    auto, r = AutoRegistration(), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    without = registry(REGISTRY.split("workloadGroups:")[0])
    assert auto.update_registry(without, 101) and names(auto, without) == []
    assert auto.update_registry(r, 102) and "vm-10.0.0.5" in names(auto, r)
    assert auto.entry_for("c1") == "vm-10.0.0.5"


# ---- into the mesh ------------------------------------------------------------------------------------------------


def eds_addresses(r: Registry, entries: object) -> list[tuple[str, int, int]]:
    snapshot = MeshSnapshot(1, r, effective_workloads(r, {}, entries), service_views(r))  # type: ignore[arg-type]
    from envoy.config.endpoint.v3 import endpoint_pb2

    cla = endpoint_pb2.ClusterLoadAssignment()
    build_endpoints(snapshot)["outbound|80||vm.default.svc.cluster.local"].Unpack(cla)
    return sorted((lb.endpoint.address.socket_address.address, lb.endpoint.address.socket_address.port_value,
                   lb.load_balancing_weight.value) for group in cla.endpoints for lb in group.lb_endpoints)


def test_entries_are_endpoints_of_selecting_services_while_healthy() -> None:
    auto, r = AutoRegistration(), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    assert eds_addresses(r, auto.entries(r)) == [("10.0.0.9", 8080, 3)]  # the new one is not yet healthy
    auto.report_health("c1", True, "", 101)
    assert eds_addresses(r, auto.entries(r)) == [("10.0.0.5", 8080, 1), ("10.0.0.9", 8080, 3)]
    auto.report_health("c1", False, "503", 102)
    assert eds_addresses(r, auto.entries(r)) == [("10.0.0.9", 8080, 3)]


def test_the_vm_proxy_finds_its_entry_as_its_own_workload_with_spiffe_identity() -> None:
    auto, r = AutoRegistration(), registry()
    auto.connect("c1", vm(), VM_SA, r, 100)
    snapshot = MeshSnapshot(1, r, effective_workloads(r, {}, auto.entries(r)), service_views(r))
    proxy = parse_node_id("sidecar~10.0.0.5~vm-host.default~default.svc.cluster.local", {"AUTO_REGISTER_GROUP": "vm"})
    ctx = ProxyContext.build(snapshot, proxy)
    own = snapshot.workload_for(proxy)
    assert own is not None and own.name == "vm-10.0.0.5" and ctx is not None
    view = snapshot.service("vm.default.svc.cluster.local")
    assert view is not None and snapshot.service_accounts(view) == ["spiffe://cluster.local/ns/default/sa/vm-sa"]


def test_istiods_switches_turn_registration_health_and_the_identity_check_off() -> None:
    r = registry()
    off = AutoRegistration(options=WorkloadEntryOptions(auto_registration=False))
    assert off.connect("c1", vm(), VM_SA, r, 0) == ""
    no_check = AutoRegistration(options=WorkloadEntryOptions(validate_identity=False))
    assert no_check.connect("c1", vm(), None, r, 0) == "vm-10.0.0.5"
    no_health = AutoRegistration(options=WorkloadEntryOptions(health_checks=False))
    no_health.connect("c1", vm(), VM_SA, r, 0)
    assert not no_health.report_health("c1", False, "down", 1)
    assert no_health.entries(r)[-1][1]  # health does not decide EDS
