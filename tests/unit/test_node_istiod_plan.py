"""The real istiod on the local node, planned (pure): the pods' discovery address, istiod's argv and environment,
the registry's Istio config as Istio resources, the plugged-in intermediate CA."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from istio_agent.pki.certs import new_root_ca, verify_signed_by
from istio_agent.pki.keys import generate_key
from istiod_local.controlplane.xds.registry import parse_registry
from istiod_local.node.istiod import IstiodPlan, issue_intermediate, mesh_config
from istiod_local.node.istiod_config import istio_config, untranslated
from istiod_local.node.istiod_userconfig import RELOAD_LINE, UserConfig, UserResource, failures, file_name
from istiod_local.node.plan import PlanError, PodSpec, agent_environment, plan_node, plan_pod

REGISTRY = """
services:
- {name: echo, namespace: default, selector: {app: echo}, ports: [{name: http, port: 80, targetPort: 8080}]}
- {name: legacy, namespace: default, selector: {app: legacy}, ports: [{name: http, port: 80, targetPort: 8080}]}
- {name: mixed, namespace: default, selector: {tier: x}, ports: [{name: http, port: 80, targetPort: 8080}]}
- {name: off, namespace: plain, selector: {app: off}, ports: [{name: http, port: 80, targetPort: 8080}]}
workloads:
- {name: echo-1, labels: {app: echo, tier: x}, ip: 10.0.0.1}
- {name: legacy-1, labels: {app: legacy, tier: x}, ip: 10.0.0.2, sidecar: none}
- {name: off-1, namespace: plain, labels: {app: off}, ip: 10.0.0.3}
peerAuthentication: {default: STRICT, plain: DISABLE}
serviceEntries:
- name: legacy
  hosts: [legacy.example.internal]
  addresses: [10.97.0.10]
  ports: [{number: 80, name: http, targetPort: 8080, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.2}]
"""


@pytest.mark.parametrize(("control_plane", "address"), [("istiod-local", "10.244.0.1:15012"),
                                                        ("istiod", "10.244.0.1:15112")])
def test_the_pods_are_pointed_at_the_nodes_control_plane(control_plane: str, address: str) -> None:
    node = plan_node(1, control_plane=control_plane)
    pod = plan_pod(node, PodSpec("echo-1"), [])
    env = agent_environment(node, pod, {})
    assert env["CA_ADDR"] == address and f'"discoveryAddress": "{address}"' in env["PROXY_CONFIG"]
    assert env["ISTIOD_SAN"] == "istiod.istio-system.svc"
    assert node.istiod_tls_addr == "10.244.0.1:15012"  # istiod-local stays where it is either way


def test_an_unknown_control_plane_is_refused() -> None:
    with pytest.raises(PlanError, match="control plane 'pilot'"):
        plan_node(1, control_plane="pilot")


def test_istiods_argv_and_environment() -> None:
    plan = IstiodPlan(Path("/w"), "10.244.0.1", "10.244.0.1:6443")
    argv = plan.argv("/bin/pilot-discovery")
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert argv[:2] == ["/bin/pilot-discovery", "discovery"]
    assert flags["--registries"] == "Kubernetes" and flags["--configDir"] == "/w/config"
    assert flags["--secureGRPCAddr"] == "10.244.0.1:15112" and flags["--kubeconfig"] == "/w/kubeconfig"
    env = plan.environment({"PATH": "/usr/bin", "SECRET": "x"})
    assert env["ROOT_CA_DIR"] == "/w/etc/cacerts" and "SECRET" not in env
    assert env["PILOT_ENABLE_ALPN_FILTER"] == "false" and env["PILOT_ENABLE_METADATA_EXCHANGE"] == "false"
    assert env["XDS_AUTH"] == "true"
    assert mesh_config(plan)["defaultProviders"] == {"metrics": []}


def test_the_registry_becomes_peer_authentications_service_entries_and_istio_mutual_rules() -> None:
    docs = istio_config(parse_registry(REGISTRY))
    by_kind: dict[str, list[dict[str, object]]] = {}
    for doc in docs:
        by_kind.setdefault(str(doc["kind"]), []).append(doc)
    assert [(d["metadata"], d["spec"]) for d in by_kind["PeerAuthentication"]] == [
        ({"name": "default", "namespace": "default"}, {"mtls": {"mode": "STRICT"}}),
        ({"name": "default", "namespace": "plain"}, {"mtls": {"mode": "DISABLE"}})]
    (entry,) = by_kind["ServiceEntry"]
    assert entry["spec"] == {"hosts": ["legacy.example.internal"], "addresses": ["10.97.0.10"],
                             "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
                             "location": "MESH_EXTERNAL", "resolution": "STATIC",
                             "endpoints": [{"address": "10.0.0.2"}]}
    # Only where every pod takes mTLS: not `legacy` (no sidecar), not `mixed` (one of two), not in DISABLE.
    assert [d["spec"] for d in by_kind["DestinationRule"]] == [
        {"host": "echo.default.svc.cluster.local", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}]


def test_what_is_not_translated_is_named() -> None:
    assert untranslated(parse_registry(REGISTRY)) == []


def test_the_intermediate_is_a_ca_the_root_signs() -> None:
    root = new_root_ca(generate_key("ECDSA"), "cluster.local", 1_000_000.0, 3600 * 24 * 365)
    intermediate = issue_intermediate(root, "cluster.local", 1_000_000.0)
    assert verify_signed_by(intermediate.cert, root.cert)
    constraints = intermediate.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0


def test_a_users_istio_config_replaces_what_it_decides_of_the_translation() -> None:
    user = [{"kind": "PeerAuthentication", "metadata": {"name": "default", "namespace": "default"},
             "spec": {"mtls": {"mode": "PERMISSIVE"}}},
            {"kind": "PeerAuthentication", "metadata": {"name": "one", "namespace": "plain"},
             "spec": {"selector": {"matchLabels": {"app": "off"}}, "mtls": {"mode": "STRICT"}}},
            {"kind": "DestinationRule", "metadata": {"name": "echo", "namespace": "default"},
             "spec": {"host": "echo", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}},
            {"kind": "ServiceEntry", "metadata": {"name": "legacy", "namespace": "default"}, "spec": {}}]
    docs = istio_config(parse_registry(REGISTRY), user)
    # the namespace-wide PeerAuthentication of default is the user's; plain's selector one leaves plain's own
    assert [(d["kind"], d["metadata"]["namespace"]) for d in docs] == [("PeerAuthentication", "plain")]


def test_istiods_rejections_are_read_from_its_log_and_each_resource_has_a_file(tmp_path: Path) -> None:
    line = ("2026-12-02T05:44:54.795363Z\twarn\tFailed to parse /x/config/user/001-virtualservice-default-bad.yaml: "
            "configuration is invalid: duration must be greater than 1ms")
    assert failures(f"{RELOAD_LINE}\n{line}\nwarn\tunable to reload file configuration /x: ...\n") == [
        ("/x/config/user/001-virtualservice-default-bad.yaml", "configuration is invalid: duration must be greater "
                                                                 "than 1ms")]
    document = {"kind": "VirtualService", "metadata": {"name": "bad", "namespace": "default"}, "spec": {}}
    assert file_name(1, document) == "001-virtualservice-default-bad.yaml"
    config = UserConfig(tmp_path / "config", tmp_path / "istiod.log")
    resources = [UserResource("VirtualService default/bad", "a.yaml:1", document),
                 UserResource("VirtualService default/ok", "a.yaml:9", {**document, "metadata": {"name": "ok"}})]
    assert config.apply(resources, running=False) == []
    assert sorted(p.name for p in (tmp_path / "config" / "user").iterdir()) == [
        "000-virtualservice-default-bad.yaml", "001-virtualservice--ok.yaml"]
    config.apply(resources[1:], running=False)  # a resource gone: its file goes, the others are renumbered
    assert [p.name for p in (tmp_path / "config" / "user").iterdir()] == ["000-virtualservice--ok.yaml"]
