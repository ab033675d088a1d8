"""Registry workloads rendered as the Pods Istio's injector writes (sidecar, grpc-agent, none)."""

from __future__ import annotations

import json
from typing import Any

from istiod_local.controlplane.kubeapi.pods import PodMeta, render_namespace, render_pod
from istiod_local.controlplane.xds.registry import parse_registry

META = PodMeta("11111111-2222-3333-4444-555555555555", "2026-12-01T12:00:00Z", "node-default", "192.0.2.1")
MESH = """
trustDomain: example.org
services:
- {name: echo, selector: {app: echo}, ports: [{name: http, port: 80, targetPort: 8080}, {name: grpc, port: 90}]}
workloads:
- {name: echo-1, serviceAccount: echo, labels: {app: echo, version: v3}, ip: 10.244.0.5, nodeName: node-a}
- name: tuned
  annotations: {traffic.sidecar.istio.io/excludeOutboundIPRanges: 10.0.0.0/8, sidecar.istio.io/interceptionMode: TPROXY}
  captureInit: init
  pod:
    metadata: {labels: {extra: "1"}}
    spec:
      containers:
      - name: istio-proxy
        env: [{name: ISTIO_META_DNS_CAPTURE, value: "true"}, {name: TRUST_DOMAIN, value: overridden}]
        securityContext: {runAsUser: 1500}
- {name: greeter, sidecar: proxyless}
- {name: plain, sidecar: none, labels: {app: plain}}
"""


def _pods() -> dict[str, dict[str, Any]]:
    registry = parse_registry(MESH)
    return {w.name: render_pod(registry, w, META) for w in registry.workloads}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_sidecar_pod_has_the_injectors_shape() -> None:
    pod = _pods()["echo-1"]
    meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
    assert (pod["apiVersion"], pod["kind"], meta["uid"]) == ("v1", "Pod", META.uid)
    assert meta["labels"] == {"app": "echo", "version": "v3", "security.istio.io/tlsMode": "istio",
                              "service.istio.io/canonical-name": "echo", "service.istio.io/canonical-revision": "v3"}
    ann = meta["annotations"]
    assert json.loads(ann["sidecar.istio.io/status"]) == {
        "initContainers": ["istio-validation"], "containers": ["istio-proxy"],
        "volumes": ["workload-socket", "credential-socket", "workload-certs", "istio-envoy", "istio-data",
                    "istio-podinfo", "istio-token", "istiod-ca-cert", "istio-ca-crl"],
        "imagePullSecrets": None, "revision": "default"}
    assert ann["kubectl.kubernetes.io/default-container"] == ann["kubectl.kubernetes.io/default-logs-container"] \
        == "app"
    assert (ann["prometheus.io/scrape"], ann["prometheus.io/port"], ann["prometheus.io/path"]) == (
        "true", "15020", "/stats/prometheus")
    assert ann["sidecar.istio.io/interceptionMode"] == "REDIRECT"
    assert ann["traffic.sidecar.istio.io/excludeInboundPorts"] == "15020"
    assert [c["name"] for c in spec["containers"]] == ["app", "istio-proxy"]
    assert spec["containers"][0]["ports"] == [{"containerPort": 90, "protocol": "TCP", "name": "grpc"},
                                              {"containerPort": 8080, "protocol": "TCP", "name": "http"}]
    proxy = spec["containers"][1]
    assert proxy["args"][:4] == ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"]
    env = _env(proxy)
    for name in ("PILOT_CERT_PROVIDER", "CA_ADDR", "POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "SERVICE_ACCOUNT",
                 "HOST_IP", "ISTIO_CPU_LIMIT", "PROXY_CONFIG", "ISTIO_META_POD_PORTS", "ISTIO_META_APP_CONTAINERS",
                 "ISTIO_META_CLUSTER_ID", "ISTIO_META_NODE_NAME", "ISTIO_META_INTERCEPTION_MODE",
                 "ISTIO_META_WORKLOAD_NAME", "ISTIO_META_OWNER", "ISTIO_META_MESH_ID", "TRUST_DOMAIN"):
        assert name in env, name
    assert env["POD_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
    assert env["ISTIO_META_NODE_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}
    assert env["TRUST_DOMAIN"] == env["ISTIO_META_MESH_ID"] == "example.org"
    assert json.loads(env["ISTIO_META_POD_PORTS"])[1]["containerPort"] == 8080
    assert proxy["ports"] == [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}]
    assert proxy["readinessProbe"]["httpGet"]["port"] == 15021
    assert proxy["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                        "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
                                        "runAsGroup": 1337, "runAsNonRoot": True, "runAsUser": 1337}
    init = spec["initContainers"]
    assert [c["name"] for c in init] == ["istio-validation"]
    assert init[0]["args"] == ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
                               "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020",
                               "--log_output_level=default:info", "--run-validation", "--skip-rule-apply"]
    assert spec["nodeName"] == "node-a" and spec["serviceAccountName"] == "echo"
    assert status["phase"] == "Running" and status["podIP"] == "10.244.0.5"
    assert status["podIPs"] == [{"ip": "10.244.0.5"}] and status["hostIP"] == "192.0.2.1"
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert all(s["ready"] for s in status["containerStatuses"])


def test_init_mode_annotations_and_the_pod_overlay() -> None:
    pod = _pods()["tuned"]
    spec = pod["spec"]
    init = spec["initContainers"][0]
    assert init["name"] == "istio-init"
    assert init["args"][init["args"].index("-x") + 1] == "10.0.0.0/8"
    assert init["args"][init["args"].index("-m") + 1] == "TPROXY"
    assert "--run-validation" not in init["args"]
    assert init["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW"]
    assert init["securityContext"]["runAsUser"] == 0
    proxy = spec["containers"][1]
    env = _env(proxy)
    assert env["ISTIO_META_DNS_CAPTURE"] == "true" and env["TRUST_DOMAIN"] == "overridden"
    assert list(env).index("TRUST_DOMAIN") < list(env).index("ISTIO_META_DNS_CAPTURE")  # merged in place
    assert proxy["securityContext"]["runAsUser"] == 1500
    assert proxy["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]  # TPROXY
    assert pod["metadata"]["labels"]["extra"] == "1"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] == "TPROXY"
    assert spec["nodeName"] == "node-default"
    assert "podIP" not in pod["status"]


def test_proxyless_and_plain_pods() -> None:
    pods = _pods()
    grpc = pods["greeter"]
    assert "initContainers" not in grpc["spec"]
    assert json.loads(grpc["metadata"]["annotations"]["sidecar.istio.io/status"])["initContainers"] is None
    assert "security.istio.io/tlsMode" not in grpc["metadata"]["labels"]
    env = _env(grpc["spec"]["containers"][1])
    assert env["DISABLE_ENVOY"] == "true" and env["ISTIO_META_GENERATOR"] == "grpc"
    assert grpc["spec"]["containers"][1]["readinessProbe"]["httpGet"]["port"] == 15020
    plain = pods["plain"]
    assert [c["name"] for c in plain["spec"]["containers"]] == ["app"]
    assert "annotations" not in plain["metadata"] and "initContainers" not in plain["spec"]
    assert plain["metadata"]["labels"] == {"app": "plain"}


def test_rendering_is_deterministic_and_fresh() -> None:
    first, second = _pods(), _pods()
    assert first == second
    first["echo-1"]["metadata"]["labels"]["x"] = "y"
    assert "x" not in _pods()["echo-1"]["metadata"]["labels"]


def test_namespace_object() -> None:
    ns = render_namespace("apps", {"istio-injection": "enabled"}, "uid-1", "2026-12-01T12:00:00Z")
    assert ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "apps", "istio-injection": "enabled"}
    assert ns["status"] == {"phase": "Active"}


def test_the_overlay_cannot_change_the_pods_identity() -> None:
    registry = parse_registry("workloads: [{name: a, pod: {metadata: {name: b, uid: x, resourceVersion: '9'}}}]")
    pod = render_pod(registry, registry.workloads[0], META)
    assert (pod["metadata"]["name"], pod["metadata"]["uid"]) == ("a", META.uid)
    assert "resourceVersion" not in pod["metadata"]


def test_the_sidecars_probes_are_the_injection_templates() -> None:
    """Defaults: startupProbe (global.proxy.startupProbe: enabled, failureThreshold 600) and readinessProbe
    (delay 0, period 15, 4 failures), both httpGet /healthz/ready on 15021, as the apiserver serves them."""
    proxy = _pods()["echo-1"]["spec"]["containers"][1]
    assert proxy["startupProbe"] == {"failureThreshold": 600, "httpGet": {"path": "/healthz/ready", "port": 15021,
                                                                          "scheme": "HTTP"},
                                     "periodSeconds": 1, "successThreshold": 1, "timeoutSeconds": 3}
    assert proxy["readinessProbe"] == {"failureThreshold": 4, "httpGet": {"path": "/healthz/ready", "port": 15021,
                                                                          "scheme": "HTTP"},
                                       "periodSeconds": 15, "successThreshold": 1, "timeoutSeconds": 3}
    grpc = _pods()["greeter"]["spec"]["containers"][1]
    assert "startupProbe" not in grpc and grpc["readinessProbe"]["httpGet"]["port"] == 15020  # grpc-agent template


def test_probe_annotations_and_a_zero_status_port() -> None:
    registry = parse_registry("""
workloads:
- name: slow
  annotations: {readiness.status.sidecar.istio.io/initialDelaySeconds: "5",
                readiness.status.sidecar.istio.io/periodSeconds: "2",
                readiness.status.sidecar.istio.io/failureThreshold: "30"}
- name: unprobed
  annotations: {status.sidecar.istio.io/port: "0"}
""")
    pods = {w.name: render_pod(registry, w, META)["spec"]["containers"][1] for w in registry.workloads}
    slow = pods["slow"]["readinessProbe"]
    assert (slow["initialDelaySeconds"], slow["periodSeconds"], slow["failureThreshold"]) == (5, 2, 30)
    assert pods["slow"]["startupProbe"]["periodSeconds"] == 1
    assert "readinessProbe" not in pods["unprobed"] and "startupProbe" not in pods["unprobed"]


def test_pod_ports_env_is_laid_out_as_the_template_renders_it() -> None:
    env = _env(_pods()["echo-1"]["spec"]["containers"][1])
    assert env["ISTIO_META_POD_PORTS"] == ('[\n    {"name":"grpc","containerPort":90,"protocol":"TCP"}\n'
                                           '    ,{"name":"http","containerPort":8080,"protocol":"TCP"}\n]')
    assert _env(_pods()["greeter"]["spec"]["containers"][1])["ISTIO_META_POD_PORTS"] == "[\n]"


def test_a_router_pod_is_the_gateway_templates() -> None:
    registry = parse_registry("workloads:\n- {name: gw-1, namespace: istio-system, sidecar: router, "
                              "labels: {istio: ingressgateway}}\n")
    pod = render_pod(registry, registry.workloads[0], META)
    proxy = pod["spec"]["containers"][1]
    assert proxy["name"] == "istio-proxy" and proxy["args"][:2] == ["proxy", "router"]
    # no capture: no init container, no capture annotations, no tlsMode label (the CNI plugin skips a router)
    assert "initContainers" not in pod["spec"]
    annotations = pod["metadata"]["annotations"]
    assert not [a for a in annotations if a.startswith("traffic.sidecar.istio.io/")]
    assert "sidecar.istio.io/interceptionMode" not in annotations
    assert json.loads(annotations["sidecar.istio.io/status"])["initContainers"] is None
    assert "security.istio.io/tlsMode" not in pod["metadata"]["labels"]
    assert pod["spec"]["securityContext"] == {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start",
                                                            "value": "0"}]}
