"""The registry file: parsing, defaults, errors that name line and field, stable VIPs, the watcher."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from istiod_local.controlplane.xds.allocation import allocate_auto_vips, allocate_cluster_ips, fnv1a32
from istiod_local.controlplane.xds.registry import Registry, RegistryError, parse_registry
from istiod_local.controlplane.xds.watcher import RegistryWatcher

ISSUE_EXAMPLE = """\
trustDomain: cluster.local            # optional
services:
- name: echo
  namespace: default
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
  clusterIP: 10.96.0.20               # optional: allocated from 10.96.0.0/16 otherwise
workloads:
- name: echo-1
  namespace: default
  serviceAccount: echo
  labels: {app: echo}
  ip: 10.244.0.5                      # optional: the local node assigns one
peerAuthentication: {default: PERMISSIVE}   # namespace -> PERMISSIVE | STRICT
"""


def test_issue_example_parses() -> None:
    r = parse_registry(ISSUE_EXAMPLE, "mesh.yaml")
    assert r.trust_domain == "cluster.local"
    (svc,) = r.services
    assert (svc.name, svc.namespace, dict(svc.selector), svc.cluster_ip) == ("echo", "default", {"app": "echo"},
                                                                             "10.96.0.20")
    assert not svc.cluster_ip_allocated
    (port,) = svc.ports
    assert (port.name, port.port, port.target_port, port.protocol) == ("http", 80, 8080, "HTTP")
    assert svc.hostname() == "echo.default.svc.cluster.local"
    (w,) = r.workloads
    assert (w.name, w.namespace, w.service_account, dict(w.labels), w.ip) == ("echo-1", "default", "echo",
                                                                              {"app": "echo"}, "10.244.0.5")
    assert r.mtls_mode("default") == "PERMISSIVE"
    assert r.spiffe_id("default", "echo") == "spiffe://cluster.local/ns/default/sa/echo"


def test_defaults_and_protocol_from_port_name() -> None:
    r = parse_registry("""
services:
- name: api
  ports:
  - {name: grpc-api, port: 9000}
  - {name: http2, port: 9001}
  - {name: web, port: 9002}
  - {port: 9003, protocol: HTTP}
workloads:
- {name: api-1}
""")
    (svc,) = r.services
    assert svc.namespace == "default"
    assert [p.protocol for p in svc.ports] == ["GRPC", "HTTP2", "TCP", "HTTP"]
    assert all(p.target_port == p.port for p in svc.ports)
    assert r.workloads[0].service_account == "default" and r.workloads[0].ip == ""
    assert parse_registry("{}") == Registry()
    for empty in ("", "\n", "# nothing yet\n"):
        with pytest.raises(RegistryError, match="the registry is empty"):
            parse_registry(empty, "mesh.yaml")


def test_mtls_mode_falls_back_to_root_namespace_then_permissive() -> None:
    r = parse_registry("peerAuthentication: {istio-system: STRICT, legacy: DISABLE}")
    assert r.mtls_mode("legacy") == "DISABLE"
    assert r.mtls_mode("default") == "STRICT"
    assert parse_registry("{}").mtls_mode("default") == "PERMISSIVE"


@pytest.mark.parametrize(("text", "line", "field", "words"), [
    ("services:\n- name: echo\n  ports: [{port: 80, protocol: UDP}]\n", 3, "services[0].ports[0].protocol",
     "must be one of HTTP, HTTP2, GRPC, TCP"),
    ("services:\n- name: echo\n  ports:\n  - port: 80\n    targetport: 8080\n", 5, "services[0].ports[0].targetport",
     "unknown field"),
    ("services:\n- name: Echo\n  ports: [{port: 80}]\n", 2, "services[0].name", "DNS label"),
    ("services:\n- name: echo\n", 2, "services[0].ports", "is required"),
    ("services:\n- name: echo\n  ports: [{port: 70000}]\n", 3, "services[0].ports[0].port", "between 1 and 65535"),
    ("services:\n- name: echo\n  ports: [{port: '80'}]\n", 3, "services[0].ports[0].port", "must be an integer"),
    ("services:\n- name: a\n  ports: [{port: 80}, {port: 80}]\n", 3, "services[0].ports[1].port", "already declared"),
    ("services:\n- name: a\n  ports: [{port: 80}]\n  clusterIP: 10.96.0.999\n", 4, "services[0].clusterIP",
     "IP address"),
    ("services:\n- name: a\n  ports: [{port: 80}]\n  clusterIP: 10.96.0.7\n- name: b\n  ports: [{port: 80}]\n"
     "  clusterIP: 10.96.0.7\n", 7, "services[1].clusterIP", "already used by services[0]"),
    ("services:\n- {name: a, ports: [{port: 1}]}\n- {name: a, ports: [{port: 2}]}\n", 3, "services[1].name",
     "already defined"),
    ("workloads: {a: 1}\n", 1, "workloads", "must be a list"),
    ("workloads:\n- {name: w, ip: 10.0.0.1}\n- {name: w, ip: 10.0.0.2}\n", 3, "workloads[1].name",
     "workload default/w is already defined at workloads[0]"),
    ("workloads:\n- {name: w}\n- name: v\n  ip: 10.0.0.256\n", 4, "workloads[1].ip", "must be an IP address"),
    ("workloads:\n- name: w\n  labels: {app: [x]}\n", 3, "workloads[0].labels.app", "must be a string"),
    ("peerAuthentication: {default: MUTUAL}\n", 1, "peerAuthentication.default", "PERMISSIVE, STRICT"),
    ("serviceEntries:\n- hosts: [api.example.com]\n  ports: [{number: 443}]\n  resolution: STATIC\n", 4,
     "serviceEntries[0].resolution", "STATIC needs endpoints"),
    ("serviceEntries:\n- hosts: ['bad host']\n  ports: [{number: 443}]\n", 2, "serviceEntries[0].hosts[0]",
     "not a DNS name"),
    ("serviceEntries:\n- hosts: [a.com]\n  ports: [{port: 443}]\n", 3, "serviceEntries[0].ports[0].port",
     "unknown field"),
    ("serviceEntries:\n- hosts: [a.com]\n  addresses: [1.2.3]\n  ports: [{number: 1}]\n", 3,
     "serviceEntries[0].addresses[0]", "IP address"),
    ("bogus: 1\n", 1, "bogus", "unknown field"),
    ("services: [\n", 2, "", "invalid YAML"),
])
def test_errors_name_line_and_field(text: str, line: int, field: str, words: str) -> None:
    with pytest.raises(RegistryError) as info:
        parse_registry(text, "mesh.yaml")
    err = info.value
    assert (err.line, err.field) == (line, field), str(err)
    assert words in str(err)
    assert str(err).startswith(f"mesh.yaml:{line}: ")


def test_workloads_may_share_an_ip_but_not_a_name() -> None:
    """hostNetwork pods and the workloads of one VM share their host's address, as in a cluster."""
    registry = parse_registry("workloads:\n- {name: a, ip: 127.0.0.1}\n- {name: b, ip: 127.0.0.1}\n"
                              "- {name: a, namespace: other, ip: 127.0.0.1}\n")
    assert [(w.namespace, w.name, w.ip) for w in registry.workloads] == [
        ("default", "a", "127.0.0.1"), ("default", "b", "127.0.0.1"), ("other", "a", "127.0.0.1")]


def test_allocated_cluster_ips_are_stable_and_order_independent() -> None:
    names = [f"svc{i}" for i in range(50)]
    doc = "services:\n" + "".join(f"- {{name: {n}, ports: [{{port: 80}}]}}\n" for n in names)
    first = {s.name: s.cluster_ip for s in parse_registry(doc).services}
    reversed_doc = "services:\n" + "".join(f"- {{name: {n}, ports: [{{port: 80}}]}}\n" for n in reversed(names))
    assert {s.name: s.cluster_ip for s in parse_registry(reversed_doc).services} == first
    assert len(set(first.values())) == len(names)
    network = ipaddress.ip_network("10.96.0.0/16")
    assert all(ipaddress.ip_address(ip) in network for ip in first.values())
    assert all(s.cluster_ip_allocated for s in parse_registry(doc).services)
    # Adding a service does not move the others (no collision among these names).
    grown = parse_registry(doc + "- {name: newcomer, ports: [{port: 80}]}\n")
    assert {s.name: s.cluster_ip for s in grown.services if s.name != "newcomer"} == first


def test_allocation_avoids_taken_and_reserved_addresses() -> None:
    key = "default/echo"
    natural = allocate_cluster_ips([key], [])[key]
    moved = allocate_cluster_ips([key], [natural])[key]
    assert moved != natural
    assert "10.96.0.1" not in allocate_cluster_ips([f"ns/s{i}" for i in range(2000)], []).values()
    assert fnv1a32(b"") == 0x811C9DC5 and fnv1a32(b"a") == 0xE40C292C  # the FNV-1a test vectors


def test_auto_vips_for_service_entries_without_addresses() -> None:
    r = parse_registry("""
serviceEntries:
- hosts: [api.example.com, db.example.com]
  ports: [{number: 443, name: tls}]
  resolution: DNS
- hosts: [fixed.example.com]
  addresses: [192.0.2.10]
  ports: [{number: 80, name: http}]
- hosts: [passthrough.example.com, '*.wild.example.com']
  ports: [{number: 80}]
  resolution: NONE
""")
    assert set(r.auto_vips) == {"api.example.com", "db.example.com"}
    for ip in r.auto_vips.values():
        address = ipaddress.ip_address(ip)
        assert address in ipaddress.ip_network("240.240.0.0/16")
        assert int(address) & 0xFF not in (0, 255)
    assert r.auto_vips == parse_registry(r"""
serviceEntries:
- {hosts: [db.example.com, api.example.com], ports: [{number: 443}], resolution: DNS}
""").auto_vips
    many = allocate_auto_vips([f"ns/h{i}.com" for i in range(3000)])
    assert len(set(many.values())) == 3000


def test_watcher_reloads_and_keeps_previous_on_bad_edit(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(ISSUE_EXAMPLE)
    seen: list[Registry] = []
    watcher = RegistryWatcher(path, seen.append)
    first = watcher.load()
    assert watcher.poll() is None  # nothing changed

    path.write_text(ISSUE_EXAMPLE.replace("port: 80,", "port: 81,"))
    os.utime(path, ns=(1, 1))
    changed = watcher.poll()
    assert changed is not None and changed.services[0].ports[0].port == 81

    path.write_text(ISSUE_EXAMPLE.replace("protocol: HTTP", "protocol: SMTP"))
    os.utime(path, ns=(2, 2))
    assert watcher.poll() is None
    assert watcher.last_error and "mesh.yaml:6: services[0].ports[0].protocol" in watcher.last_error
    assert watcher.current == changed

    path.unlink()
    assert watcher.poll() is None and "cannot read registry" in (watcher.last_error or "")
    path.write_text(ISSUE_EXAMPLE)
    back = watcher.poll()
    assert back == first and watcher.last_error is None


def test_a_registry_truncated_while_serving_is_refused_and_the_previous_stays(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text("services:\n- {name: echo, namespace: default, ports: [{port: 80}]}\n")
    watcher = RegistryWatcher(path, lambda registry: None)
    first = watcher.load()
    path.write_text("")  # what `> mesh.yaml` or an editor leaves mid-write
    os.utime(path, ns=(1, 1))
    assert watcher.poll() is None
    assert watcher.current is first and [s.name for s in watcher.current.services] == ["echo"]
    assert watcher.last_error is not None and "the registry is empty" in watcher.last_error
    assert "previous configuration stays in service" in watcher.last_error


def test_a_registry_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_bytes(b"services:\n- {name: caf\xe9, namespace: default}\n")
    with pytest.raises(RegistryError, match=r"mesh.yaml:2: not UTF-8 text \(byte 0xe9"):
        RegistryWatcher(path, lambda registry: None).load()
