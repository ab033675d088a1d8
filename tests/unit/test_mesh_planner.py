"""The planner: pods and apps from the mesh file, and the registry istiod-local gets for them."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from istiod_local.controlplane.xds.registry import parse_registry
from istiod_local.mesh.parser import parse_mesh
from istiod_local.mesh.planner import MAX_PODS, CapacityError, check_capacity, plan_mesh, registry_document
from istiod_local.mesh.runner import MeshFileError, MeshRun, UpOptions
from istiod_local.node.plan import PodPlan, PodSpec, agent_argv, plan_node, plan_pod, registry_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = (EXAMPLES / "mesh.yaml").read_text()


def _place(specs: Sequence[PodSpec]) -> list[PodPlan]:
    node, plans = plan_node(1), list[PodPlan]()
    for spec in specs:
        plans.append(plan_pod(node, spec, plans))
    return plans


def test_pods_are_named_after_their_deployment_and_scale_multiplies_replicas() -> None:
    mesh = parse_mesh("deployments:\n- {name: a, replicas: 2}\n- {name: b, replicas: 0}\n- {name: c}\n")
    assert [p.name for p in plan_mesh(mesh).pods] == ["a-1", "a-2", "c-1"]
    scaled = plan_mesh(mesh, scale=3)
    assert [p.name for p in scaled.pods] == [f"a-{i}" for i in range(1, 7)] + ["c-1", "c-2", "c-3"]
    assert scaled.deployment_of["a-6"] == "default/a"
    with pytest.raises(ValueError, match="scale"):
        plan_mesh(mesh, scale=0)


def test_pod_specs_carry_identity_mode_and_dns_capture() -> None:
    plan = plan_mesh(parse_mesh(EXAMPLE), python="py")
    specs = {p.name: p for p in plan.pods}
    ratings = specs["ratings-1"]
    assert (ratings.namespace, ratings.service_account, ratings.sidecar, ratings.proxyless) == \
        ("secure", "ratings", True, False)
    assert specs["reviews-v2-1"].labels == {"app": "reviews", "version": "v2"}
    assert specs["greeter-1"].proxyless and not specs["greeter-1"].dns_capture
    assert not specs["legacy-1"].sidecar
    assert specs["sleep-1"].dns_capture
    assert plan.ready_ports == {"frontend-1": 8080, "reviews-v1-1": 8080, "reviews-v2-1": 8080, "ratings-1": 8080,
                                "tcp-echo-1": 9000, "greeter-1": 50051, "legacy-1": 8080}


def test_apps_call_by_name_with_dns_capture_and_by_cluster_ip_without() -> None:
    plan = plan_mesh(parse_mesh(EXAMPLE), python="py")
    specs = {p.name: p for p in plan.pods}
    ratings_ip = plan.cluster_ips["secure/ratings"]
    assert list(specs["reviews-v1-1"].app) == ["py", "-m", "istiod_local.mesh.apps", "--pod", "reviews-v1-1",
                                               "http-echo", "--port", "8080",
                                               "--next", "http://ratings.secure.svc.cluster.local:9080/"]
    assert list(specs["reviews-v2-1"].app)[-1] == f"http://{ratings_ip}:9080/"
    sleep = list(specs["sleep-1"].app)
    assert "tcp://tcp-echo.secure.svc.cluster.local:9000" in sleep
    assert "http://legacy.example.internal:80/" in sleep
    assert list(specs["greeter-client-1"].app)[-2:] == ["--call", "xds:///greeter.default.svc.cluster.local:7070"]
    assert list(specs["greeter-1"].app) == ["py", "-m", "istiod_local.node.grpc_apps", "serve", "--port", "50051"]
    assert specs["legacy-1"].app[5] == "http-echo"


def test_a_grpc_server_behind_a_sidecar_serves_plaintext_to_its_envoy() -> None:
    mesh = parse_mesh("deployments:\n- name: g\n  app: {kind: grpc-server, port: 50051}\n")
    assert plan_mesh(mesh).pods[0].app[-1] == "--plain"


def test_the_registry_is_valid_and_lists_every_pod_service_policy_and_entry_endpoint() -> None:
    plan = plan_mesh(parse_mesh(EXAMPLE), python="py")
    pods = _place(plan.pods)
    registry = parse_registry(yaml.safe_dump(registry_document(plan, pods)))
    assert {w.name for w in registry.workloads} == {p.name for p in plan.pods}
    assert registry.mtls_mode("secure") == "STRICT" and registry.mtls_mode("default") == "PERMISSIVE"
    assert {f"{s.namespace}/{s.name}": s.cluster_ip for s in registry.services} == plan.cluster_ips
    (entry,) = registry.service_entries
    legacy_ip = next(p.ip for p in pods if p.name == "legacy-1")
    assert (entry.hosts, entry.addresses, entry.endpoints, entry.resolution) == \
        (("legacy.example.internal",), ("10.97.0.10",), (legacy_ip,), "STATIC")
    sidecars = {w.name: w.sidecar for w in registry.workloads}
    assert (sidecars["greeter-1"], sidecars["legacy-1"], sidecars["sleep-1"]) == ("proxyless", "none", "envoy")
    assert registry.namespaces["secure"] == {"istio-injection": "enabled"}


def test_cluster_ips_are_stable_across_edits() -> None:
    first = plan_mesh(parse_mesh(EXAMPLE)).cluster_ips
    edited = plan_mesh(parse_mesh(EXAMPLE.replace("- name: reviews-v1\n", "- name: reviews-v1\n  replicas: 3\n")))
    assert edited.cluster_ips == first


def test_capacity_is_checked_before_anything_is_planned_and_names_the_limit() -> None:
    many = parse_mesh("deployments:\n" + "".join(f"- {{name: d{n}, replicas: 100}}\n" for n in range(10_000)))
    with pytest.raises(CapacityError, match=rf"1000000 pods .* a local node holds at most {MAX_PODS}"):
        plan_mesh(many)
    example = parse_mesh(EXAMPLE)
    with pytest.raises(CapacityError, match=r"times --scale 100000\); a local node holds at most"):
        plan_mesh(example, scale=100_000)
    assert check_capacity(example, 2) == 2 * len(plan_mesh(example).pods)


def test_up_refuses_a_mesh_over_capacity_or_its_pod_cidr_before_building_anything(tmp_path: Path) -> None:
    mesh_file = tmp_path / "mesh.yaml"
    mesh_file.write_text(EXAMPLE)
    shutil.copytree(EXAMPLES / "wasm", tmp_path / "wasm")
    for scale, words in ((100_000, "a local node holds at most"), (100, "--pod-cidr 10.244.0.0/24 holds 253")):
        run = MeshRun(UpOptions(mesh_file, tmp_path / "up", scale=scale))
        with pytest.raises(MeshFileError, match=words):
            run.start()
        assert not (tmp_path / "up" / "node").exists(), "nothing was built"


def test_a_gateways_first_pod_runs_the_router_and_takes_the_host_ports() -> None:
    mesh = parse_mesh("namespaces: [{name: istio-system}]\ndeployments:\n- name: gw\n  namespace: istio-system\n"
                      "  replicas: 2\n  mode: gateway\n  hostPorts: [{hostPort: 31380, containerPort: 8080}]\n")
    first, second = plan_mesh(mesh, python="py").pods
    assert first.router and first.sidecar and not first.proxyless and first.host_ports == ((31380, 8080),)
    assert second.router and second.host_ports == ()  # the host has each port once
    placed = plan_pod(plan_node(1), first, [])
    assert agent_argv(placed, "pilot-agent")[:3] == ["pilot-agent", "proxy", "router"]
    assert registry_workload(placed)["sidecar"] == "router"
