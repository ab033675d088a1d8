"""The VM onboarding files (`istiod-local workload-entry configure`), rendered without I/O.

Upstream's file names and keys are listed here as facts read from
`istioctl/pkg/workload/workload.go` and its testdata.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from istiod_local.controlplane.onboarding import (
    OnboardingOptions,
    canonical_service,
    render_onboarding,
    shell_quote,
)
from istiod_local.controlplane.xds.registry import RegistryError, parse_registry
from istiod_local.controlplane.xds.workloadgroups import WorkloadGroup, parse_workload_group_object

UPSTREAM_FILES = {"cluster.env", "mesh.yaml", "root-cert.pem", "istio-token", "hosts"}
# Keys istioctl writes into cluster.env for every group (proxyMetadata plus its overrides).
UPSTREAM_CLUSTER_ENV_KEYS = {
    "CANONICAL_REVISION", "CANONICAL_SERVICE", "ISTIO_INBOUND_PORTS", "ISTIO_LOCAL_EXCLUDE_PORTS",
    "ISTIO_METAJSON_LABELS", "ISTIO_META_CLUSTER_ID", "ISTIO_META_DNS_CAPTURE", "ISTIO_META_MESH_ID",
    "ISTIO_META_NETWORK", "ISTIO_META_WORKLOAD_NAME", "ISTIO_NAMESPACE", "ISTIO_SERVICE", "ISTIO_SERVICE_CIDR",
    "POD_NAMESPACE", "SERVICE_ACCOUNT", "TRUST_DOMAIN",
}
# proxyMetadata keys of mesh.yaml's defaultConfig.
UPSTREAM_PROXY_METADATA_KEYS = {
    "CANONICAL_REVISION", "CANONICAL_SERVICE", "ISTIO_META_CLUSTER_ID", "ISTIO_META_DNS_CAPTURE",
    "ISTIO_META_MESH_ID", "ISTIO_META_NETWORK", "ISTIO_META_WORKLOAD_NAME", "ISTIO_METAJSON_LABELS",
    "POD_NAMESPACE", "SERVICE_ACCOUNT", "TRUST_DOMAIN",
}

REGISTRY = """\
workloadGroups:
- name: vm
  namespace: apps
  metadata:
    labels: {app: reviews, version: v2}
    annotations:
      proxy.istio.io/config: |
        proxyMetadata: {FROM_ANNOTATION: "yes"}
  template: {serviceAccount: reviews, ports: {http: 9080, grpc: 9090}, network: vm-net}
  probe: {periodSeconds: 5, failureThreshold: 3, tcpSocket: {port: 9080}}
"""


def group() -> WorkloadGroup:
    found = parse_registry(REGISTRY).workload_group("apps", "vm")
    assert found is not None
    return found


def env_of(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def render(**options: object) -> dict[str, bytes]:
    return render_onboarding(group(), OnboardingOptions(**options), "ROOT PEM\n", "TOKEN")  # type: ignore[arg-type]


def test_onboarding_files_have_upstreams_names_and_keys() -> None:
    files = render(autoregister=True, ingress_ip="192.0.2.1")
    assert set(files) == UPSTREAM_FILES
    env = env_of(files["cluster.env"].decode())
    assert UPSTREAM_CLUSTER_ENV_KEYS | {"ISTIO_META_AUTO_REGISTER_GROUP"} <= set(env)
    mesh = yaml.safe_load(files["mesh.yaml"])
    assert set(mesh) == {"defaultConfig"}
    config = mesh["defaultConfig"]
    assert {"discoveryAddress", "proxyMetadata", "readinessProbe"} <= set(config)
    assert UPSTREAM_PROXY_METADATA_KEYS | {"ISTIO_META_AUTO_REGISTER_GROUP"} <= set(config["proxyMetadata"])
    assert config["readinessProbe"] == {"periodSeconds": 5, "failureThreshold": 3, "tcpSocket": {"port": 9080}}
    assert files["hosts"] == b"192.0.2.1 istiod.istio-system.svc\n"
    assert files["root-cert.pem"] == b"ROOT PEM\n" and files["istio-token"] == b"TOKEN"


def test_values_follow_the_group() -> None:
    files = render(autoregister=True, trust_domain="example.org", cluster_id="c1", discovery_port=15443)
    env = env_of(files["cluster.env"].decode())
    assert env["ISTIO_META_AUTO_REGISTER_GROUP"] == "'vm'"
    assert env["ISTIO_INBOUND_PORTS"] == "'9090,9080'"  # by port name: grpc, http
    assert env["ISTIO_SERVICE"] == "'vm.apps'" and env["SERVICE_ACCOUNT"] == "'reviews'"
    assert env["ISTIO_LOCAL_EXCLUDE_PORTS"] == "'22,15090,15021,15020'"
    assert env["FROM_ANNOTATION"] == "'yes'"  # proxyMetadata from proxy.istio.io/config reaches the env too
    md = yaml.safe_load(files["mesh.yaml"])["defaultConfig"]["proxyMetadata"]
    assert (md["CANONICAL_SERVICE"], md["CANONICAL_REVISION"]) == ("reviews", "v2")
    assert (md["TRUST_DOMAIN"], md["ISTIO_META_CLUSTER_ID"], md["ISTIO_META_NETWORK"]) == ("example.org", "c1",
                                                                                            "vm-net")
    assert json.loads(md["ISTIO_METAJSON_LABELS"]) == {
        "app": "reviews", "version": "v2", "service.istio.io/canonical-name": "reviews",
        "service.istio.io/canonical-revision": "v2"}
    assert json.loads(md["ISTIO_META_POD_PORTS"]) == [{"name": "grpc", "containerPort": 9090, "protocol": ""},
                                                      {"name": "http", "containerPort": 9080, "protocol": ""}]
    assert yaml.safe_load(files["mesh.yaml"])["defaultConfig"]["discoveryAddress"] == "istiod.istio-system.svc:15443"


def test_without_autoregister_or_dns_capture_their_keys_are_absent() -> None:
    env = env_of(render(capture_dns=False)["cluster.env"].decode())
    assert "ISTIO_META_AUTO_REGISTER_GROUP" not in env and "ISTIO_META_DNS_CAPTURE" not in env


def test_revision_internal_and_external_ips() -> None:
    env = env_of(render(revision="canary", internal_ip="10.1.0.4")["cluster.env"].decode())
    assert env["CA_ADDR"] == "'istiod-canary.istio-system.svc:15012'" and env["ISTIO_SVC_IP"] == "'10.1.0.4'"
    env = env_of(render(external_ip="203.0.113.9")["cluster.env"].decode())
    assert env["ISTIO_SVC_IP"] == "'203.0.113.9'" and env["REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION"] == "'true'"
    assert render(revision="canary", ingress_ip="10.0.0.1")["hosts"] == b"10.0.0.1 istiod-canary.istio-system.svc\n"
    assert render()["hosts"] == b""  # no address to map istiod's name to


def test_mesh_yaml_quotes_as_go_yaml_does() -> None:
    text = render()["mesh.yaml"].decode()
    assert '    ISTIO_META_DNS_CAPTURE: "true"\n' in text and '    ISTIO_META_MESH_ID: ""\n' in text
    keys = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("    ISTIO_META")]
    assert keys.index("ISTIO_META_WORKLOAD_NAME") < keys.index("ISTIO_METAJSON_LABELS")


def test_shell_quote_is_upstreams() -> None:
    assert shell_quote("") == "''"
    assert shell_quote("latest") == "'latest'"  # its character class lets almost nothing through unquoted
    assert shell_quote("*") == "'*'" and shell_quote(",./-") == ",./-"
    assert shell_quote("it's") == "'it'\"'\"'s'"


def test_canonical_service_fallbacks() -> None:
    assert canonical_service({}, "wg") == ("wg", "latest")
    assert canonical_service({"app": "a", "app.kubernetes.io/name": "b"}, "wg") == ("b", "latest")
    assert canonical_service({"version": "v1", "service.istio.io/canonical-revision": "r"}, "wg") == ("wg", "r")


def test_a_workload_group_object_file() -> None:
    text = ("apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata:\n  name: foo\n  namespace: bar\n"
            "spec:\n  template: {serviceAccount: vm-serviceaccount}\n  probe: {httpGet: {port: 8080}}\n")
    parsed, annotations = parse_workload_group_object(text, "wg.yaml")
    assert (parsed.name, parsed.namespace, parsed.template.service_account) == ("foo", "bar", "vm-serviceaccount")
    assert parsed.probe == {"httpGet": {"port": 8080}} and annotations == {}
    with pytest.raises(RegistryError, match=re.escape("wg.yaml:2: kind: must be WorkloadGroup")):
        parse_workload_group_object(text.replace("kind: WorkloadGroup", "kind: WorkloadEntry"), "wg.yaml")
    with pytest.raises(RegistryError, match=re.escape("wg.yaml:7: spec.template: is required")):
        parse_workload_group_object(text.split("  template")[0] + "  probe: {tcpSocket: {port: 1}}\n", "wg.yaml")
