"""The mesh file's parser: the default example, defaults, and errors naming the line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from istiod_local.controlplane.xds.yamlfields import RegistryError
from istiod_local.mesh.model import App, Target
from istiod_local.mesh.parser import parse_mesh

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mesh.yaml"


def test_the_default_example_has_everything_the_issue_asks_for() -> None:
    mesh = parse_mesh(EXAMPLE.read_text(), str(EXAMPLE))
    assert mesh.mtls_mode("secure") == "STRICT"
    modes = {d.name: d.mode for d in mesh.deployments}
    assert "proxyless" in modes.values() and "none" in modes.values()
    reviews = mesh.service("default/reviews")
    assert reviews is not None
    assert {d.labels["version"] for d in mesh.backends(reviews)} == {"v1", "v2"}
    # the chain: frontend -> reviews -> ratings
    frontend = mesh.deployment("default/frontend")
    assert frontend is not None and [t.service for t in frontend.app.next] == ["default/reviews"]
    assert {t.service for d in mesh.backends(reviews) for t in d.app.next} == {"secure/ratings"}
    assert {p.protocol for s in mesh.services for p in s.ports} == {"HTTP", "TCP", "GRPC"}
    sleep = mesh.deployment("default/sleep")
    assert sleep is not None and sleep.dns_capture
    assert Target("legacy.example.internal", 80, "HTTP", entry="legacy") in sleep.app.calls
    (entry,) = mesh.service_entries
    assert entry.endpoints[0].deployment == "default/legacy"
    assert mesh.deployment("default/legacy") is not None


def test_a_gateway_deployment_and_the_istio_config_it_names() -> None:
    mesh = parse_mesh("istioConfig: [istio/, extra.yaml]\nnamespaces: [{name: istio-system}]\n"
                      "deployments:\n- name: gw\n  namespace: istio-system\n  mode: gateway\n"
                      "  labels: {istio: ingressgateway}\n  hostPorts: [{hostPort: 31380, containerPort: 8080}]\n")
    (gateway,) = mesh.deployments
    assert (gateway.mode, gateway.app, [(h.host_port, h.container_port) for h in gateway.host_ports]) == \
        ("gateway", App(), [(31380, 8080)])
    assert mesh.istio_config_paths == ("istio/", "extra.yaml") and mesh.istio_config == ()
    assert not mesh.namespace("istio-system").mode_given


def test_defaults_follow_kubernetes_conventions() -> None:
    mesh = parse_mesh("services:\n- name: web\n  ports: [{name: http-web, port: 80}]\n"
                      "deployments:\n- name: web\n  app: {kind: http-echo, port: 80}\n- name: idle\n")
    (service,) = mesh.services
    assert service.namespace == "default" and service.selector == {"app": "web"}
    assert (service.ports[0].protocol, service.ports[0].target_port) == ("HTTP", 80)
    web, idle = mesh.deployments
    assert (web.replicas, web.service_account, web.labels, web.mode, web.dns_capture) == \
        (1, "web", {"app": "web"}, "sidecar", False)
    assert idle.app == App()
    assert mesh.mtls_mode("default") == "PERMISSIVE"


def test_a_call_resolves_short_names_namespaces_fqdns_and_single_ports() -> None:
    mesh = parse_mesh(
        "namespaces: [{name: other}]\n"
        "services:\n- {name: a, ports: [{port: 80, protocol: HTTP}]}\n"
        "- {name: b, namespace: other, ports: [{port: 81, protocol: HTTP}, {port: 82, protocol: TCP}]}\n"
        "deployments:\n- name: c\n  app: {kind: client, calls: [a, 'b.other:82', 'a.default.svc.cluster.local:80']}\n")
    calls = mesh.deployments[0].app.calls
    assert [(t.service, t.port, t.protocol) for t in calls] == \
        [("default/a", 80, "HTTP"), ("other/b", 82, "TCP"), ("default/a", 80, "HTTP")]


ERRORS = [
    ("kind: Deployment\n", 1, "kind", "must be 'Mesh'"),
    ("namespaces:\n- name: x\n  peerAuthentication: strict\n", 3, "namespaces[0].peerAuthentication",
     "STRICT, PERMISSIVE, DISABLE"),
    ("deployments:\n- name: a\n  replicas: two\n", 3, "deployments[0].replicas", "integer"),
    ("deployments:\n- name: a\n  replicas: " + "9" * 5000 + "\n", 3, "deployments[0].replicas",
     "must be between 0 and 100, got a number of 5000 digits"),
    ("deployments:\n- name: a\n  replicas: 017\n", 3, "deployments[0].replicas", "must be a decimal integer"),
    ("deployments:\n- name: a\n  namespace: nowhere\n", 3, "deployments[0].namespace", "not declared"),
    ("deployments:\n- name: a\n  mode: ambient\n", 3, "deployments[0].mode", "sidecar, proxyless, none"),
    ("deployments:\n- name: a\n  app: {kind: http-echo}\n", 3, "deployments[0].app.port", "needs the port"),
    ("deployments:\n- name: a\n  app: {kind: client, calls: [nothing:80]}\n", 3, "deployments[0].app.calls[0]",
     "no service default/nothing"),
    ("services:\n- {name: s, ports: [{port: 80}, {port: 81}]}\ndeployments:\n- name: a\n"
     "  app: {kind: client, calls: [s]}\n", 5, "deployments[0].app.calls[0]", "has 2 ports: add :port"),
    ("services:\n- {name: s, ports: [{port: 80, protocol: HTTP}]}\ndeployments:\n- name: a\n  mode: proxyless\n"
     "  app: {kind: grpc-client, calls: ['s:80']}\n", 6, "deployments[0].app.calls[0]", "only gRPC"),
    ("deployments:\n- name: a\n  mode: none\n  dnsCapture: true\n", 4, "deployments[0].dnsCapture", "sidecar"),
    ("deployments:\n- name: a\n  mode: none\n  app: client\n", 4, "deployments[0].app", "through a sidecar"),
    ("deployments:\n- name: a\n- name: a\n  namespace: default\n", 3, "deployments[1].name", "already defined"),
    ("serviceEntries:\n- name: e\n  hosts: [e.test]\n  ports: [{number: 80}]\n", 2, "serviceEntries[0].resolution",
     "STATIC needs endpoints"),
    ("serviceEntries:\n- name: e\n  hosts: [e.test]\n  ports: [{number: 80}]\n  endpoints: [{deployment: gone}]\n",
     5, "serviceEntries[0].endpoints[0].deployment", "no deployment default/gone"),
    ("serviceEntries:\n- name: e\n  hosts: [e.test]\n  ports: [{number: 80, protocol: HTTP}]\n"
     "  endpoints: [{address: 10.0.0.1}]\ndeployments:\n- name: a\n  app: {kind: client, calls: ['e.test']}\n",
     8, "deployments[0].app.calls[0]", "needs dnsCapture"),
    ("deployments:\n- name: a\n  unknown: 1\n", 3, "deployments[0].unknown", "unknown field"),
    ("deployments:\n- name: a\n  hostPorts: [{hostPort: 8080, containerPort: 80}]\n", 3,
     "deployments[0].hostPorts", "only a gateway deployment has host ports; mode is sidecar"),
    ("deployments:\n- name: a\n  mode: gateway\n  app: {kind: http-echo, port: 80}\n", 4, "deployments[0].app",
     "a gateway runs no app"),
    ("deployments:\n- {name: a, mode: gateway, hostPorts: [{hostPort: 8080, containerPort: 80}]}\n"
     "- {name: b, mode: gateway, hostPorts: [{hostPort: 8080, containerPort: 80}]}\n", 3,
     "deployments[1].hostPorts[0].hostPort", "host port 8080 is already given at deployments[0].hostPorts[0]"),
    ("istioConfig: istio/\n", 1, "istioConfig", "must be a list"),
    ("", 0, "", "empty"),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), ERRORS, ids=[e[2] or e[3] for e in ERRORS])
def test_errors_name_the_line_and_field(text: str, line: int, field: str, words: str) -> None:
    with pytest.raises(RegistryError) as caught:
        parse_mesh(text, "mesh.yaml")
    error = caught.value
    assert (error.line, error.field) == (line, field), str(error)
    assert words in error.problem, str(error)
    assert str(error).startswith(f"mesh.yaml:{line}: " if line else "mesh.yaml: ")
