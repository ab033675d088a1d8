"""The resource types istiod-local's Kubernetes API serves for a real istiod, through the official `kubernetes`
client: Services, EndpointSlices and Nodes from the registry; ConfigMaps, Leases and the rest as stored objects
(create, get, replace, patch, delete, watch, conflicts); discovery of the API groups; TokenReview."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchers import IstiodLocal, RegistryFile

from istiod_local.controlplane.podfiles import pod_token
from istiod_local.controlplane.state import load_or_create_state

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client as kubernetes_client  # noqa: E402
from kubernetes import config as kconfig  # noqa: E402
from kubernetes import watch as kwatch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

K: Any = kubernetes_client  # the client's models and APIs, used untyped as the other client tests use them

MESH = {
    "services": [{"name": "echo", "namespace": "default", "selector": {"app": "echo"}, "clusterIP": "10.96.0.20",
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"},
                            {"name": "grpc", "port": 7070, "targetPort": 7070, "protocol": "GRPC"}]}],
    "workloads": [
        {"name": "echo-1", "namespace": "default", "serviceAccount": "echo", "labels": {"app": "echo"},
         "ip": "10.244.0.5", "nodeName": "node-a"},
        {"name": "echo-2", "namespace": "default", "serviceAccount": "echo", "labels": {"app": "echo"},
         "ip": "10.244.0.6", "nodeName": "node-b"},
        {"name": "other", "namespace": "default", "serviceAccount": "other", "labels": {"app": "other"},
         "ip": "10.244.0.7", "nodeName": "node-a"},
    ],
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IstiodLocal, Path, Path]]:
    base = tmp_path_factory.mktemp("kubeobjects")
    registry = RegistryFile(base / "mesh.yaml", MESH)
    with IstiodLocal(base / "state", registry=registry, kube_api_addr="127.0.0.1:0") as istiod:
        yield istiod, istiod.kubeconfig(base / "istiod.kubeconfig", identity="istio-system/istiod"), base


@pytest.fixture
def client(api: tuple[IstiodLocal, Path, Path]) -> Iterator[Any]:
    configuration = K.Configuration()
    kconfig.load_kube_config(config_file=str(api[1]), client_configuration=configuration)
    with K.ApiClient(configuration) as api_client:
        yield api_client


def _refused(call: Any) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


def test_services_endpointslices_and_nodes_are_the_registrys(client: Any) -> None:
    core, discovery = K.CoreV1Api(client), K.DiscoveryV1Api(client)
    service = core.read_namespaced_service("echo", "default")
    assert service.spec.cluster_ip == "10.96.0.20" and service.spec.selector == {"app": "echo"}
    assert [(p.name, p.port, p.target_port, p.app_protocol) for p in service.spec.ports] == [
        ("http", 80, 8080, "http"), ("grpc", 7070, 7070, "grpc")]
    slices = discovery.list_namespaced_endpoint_slice("default",
                                                      label_selector="kubernetes.io/service-name=echo").items
    assert len(slices) == 1
    endpoints = slices[0].endpoints
    assert [(e.addresses, e.target_ref.name, e.conditions.ready) for e in endpoints] == [
        (["10.244.0.5"], "echo-1", True), (["10.244.0.6"], "echo-2", True)]
    assert endpoints[0].target_ref.uid == core.read_namespaced_pod("echo-1", "default").metadata.uid
    assert {(p.name, p.port) for p in slices[0].ports} == {("http", 8080), ("grpc", 7070)}
    nodes = {n.metadata.name for n in core.list_node().items}
    assert {"node-a", "node-b"} <= nodes


def test_an_endpoint_follows_its_pods_readiness(client: Any) -> None:
    core, discovery = K.CoreV1Api(client), K.DiscoveryV1Api(client)
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    def echo_2_ready() -> bool:
        found = discovery.read_namespaced_endpoint_slice("echo-istiod-local", "default")
        return next(e.conditions.ready for e in found.endpoints if e.target_ref.name == "echo-2")

    core.patch_namespaced_pod_status("echo-2", "default", not_ready)
    try:
        assert echo_2_ready() is False
    finally:
        core.patch_namespaced_pod_status("echo-2", "default", ready)
    assert echo_2_ready() is True


def test_configmaps_are_created_read_replaced_patched_and_deleted(client: Any) -> None:
    core = K.CoreV1Api(client)
    body = K.V1ConfigMap(metadata=K.V1ObjectMeta(name="istio-ca-root-cert", labels={"a": "1"}),
                               data={"root-cert.pem": "x"})
    created = core.create_namespaced_config_map("default", body)
    try:
        assert created.metadata.uid and created.metadata.namespace == "default"
        assert _refused(lambda: core.create_namespaced_config_map("default", body)).status == 409
        created.data["root-cert.pem"] = "y"
        replaced = core.replace_namespaced_config_map("istio-ca-root-cert", "default", created)
        assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
        assert replaced.metadata.uid == created.metadata.uid
        # A replace from the old version is a conflict, as optimistic concurrency has it.
        stale = _refused(lambda: core.replace_namespaced_config_map("istio-ca-root-cert", "default", created))
        assert stale.status == 409 and "the object has been modified" in str(stale.body)
        patched = core.patch_namespaced_config_map("istio-ca-root-cert", "default",
                                                   {"metadata": {"labels": {"b": "2"}}, "data": {"extra": "z"}})
        assert patched.metadata.labels == {"a": "1", "b": "2"} and patched.data == {"root-cert.pem": "y", "extra": "z"}
        listed = core.list_config_map_for_all_namespaces(field_selector="metadata.name=istio-ca-root-cert").items
        assert [c.metadata.namespace for c in listed] == ["default"]
    finally:
        core.delete_namespaced_config_map("istio-ca-root-cert", "default")
    assert _refused(lambda: core.read_namespaced_config_map("istio-ca-root-cert", "default")).status == 404


def test_generate_name_labels_and_size_are_checked(client: Any) -> None:
    core = K.CoreV1Api(client)
    made = core.create_namespaced_secret("istio-system", K.V1Secret(
        metadata=K.V1ObjectMeta(generate_name="istio-remote-"), string_data={"k": "v"}))
    try:
        assert made.metadata.name.startswith("istio-remote-") and len(made.metadata.name) == len("istio-remote-") + 5
    finally:
        core.delete_namespaced_secret(made.metadata.name, "istio-system")
    bad = _refused(lambda: core.create_namespaced_config_map("default", K.V1ConfigMap(
        metadata=K.V1ObjectMeta(name="x", labels={"bad key!": "v"}))))
    assert bad.status == 422
    assert _refused(lambda: core.create_namespaced_config_map("default", K.V1ConfigMap(
        metadata=K.V1ObjectMeta(name="Upper")))).status == 422
    huge = _refused(lambda: core.create_namespaced_config_map("default", K.V1ConfigMap(
        metadata=K.V1ObjectMeta(name="huge"), data={"k": "x" * 1_600_000})))
    assert huge.status == 413


def test_a_watch_sees_creates_updates_and_deletes_of_leases_in_order(client: Any) -> None:
    leases = K.CoordinationV1Api(client)
    listed = leases.list_namespaced_lease("istio-system")
    seen: list[tuple[str, str, int]] = []
    watcher = kwatch.Watch()

    def watch() -> None:
        for event in watcher.stream(leases.list_namespaced_lease, "istio-system",
                                    resource_version=listed.metadata.resource_version, timeout_seconds=10):
            obj = event["object"]
            seen.append((event["type"], obj.spec.holder_identity or "", int(obj.metadata.resource_version)))
            if event["type"] == "DELETED":
                watcher.stop()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    # The changes may come before the watch is open: it replays them from the list's resourceVersion.
    lease = leases.create_namespaced_lease("istio-system", K.V1Lease(
        metadata=K.V1ObjectMeta(name="istio-leader"), spec=K.V1LeaseSpec(holder_identity="a")))
    lease.spec.holder_identity = "b"
    leases.replace_namespaced_lease("istio-leader", "istio-system", lease)
    leases.delete_namespaced_lease("istio-leader", "istio-system")
    thread.join(15)
    assert [(t, h) for t, h, _ in seen] == [("ADDED", "a"), ("MODIFIED", "b"), ("DELETED", "b")]
    versions = [v for _, _, v in seen]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_discovery_names_the_groups_and_the_crd_list_is_empty(client: Any) -> None:
    groups = {g.name: g.preferred_version.version for g in K.ApisApi(client).get_api_versions().groups}
    assert groups["discovery.k8s.io"] == "v1" and groups["coordination.k8s.io"] == "v1"
    assert groups["apiextensions.k8s.io"] == "v1" and groups["authentication.k8s.io"] == "v1"
    resources = {r.name for r in K.DiscoveryV1Api(client).get_api_resources().resources}
    assert resources == {"endpointslices"}
    crds = K.ApiextensionsV1Api(client).list_custom_resource_definition()
    assert crds.items == []
    webhooks = K.AdmissionregistrationV1Api(client).list_mutating_webhook_configuration()
    assert webhooks.items == []


def test_token_review_answers_for_istiod_local_tokens(api: tuple[IstiodLocal, Path, Path], client: Any) -> None:
    state = load_or_create_state(api[0].state_dir, "cluster.local", time.time())
    token = pod_token(state, "default", "echo", "echo-1", 600, time.time())
    reviews = K.AuthenticationV1Api(client)
    answer = reviews.create_token_review(K.V1TokenReview(spec=K.V1TokenReviewSpec(
        token=token, audiences=["istio-ca"])))
    assert answer.status.authenticated is True
    assert answer.status.user.username == "system:serviceaccount:default:echo"
    assert answer.status.user.extra["authentication.kubernetes.io/pod-name"] == ["echo-1"]
    assert answer.status.audiences == ["istio-ca"]
    wrong = reviews.create_token_review(K.V1TokenReview(spec=K.V1TokenReviewSpec(
        token=token, audiences=["someone-else"])))
    assert wrong.status.authenticated is False and wrong.status.error
    forged = reviews.create_token_review(K.V1TokenReview(spec=K.V1TokenReviewSpec(
        token=token[:-4] + "AAAA", audiences=["istio-ca"])))
    assert forged.status.authenticated is False


def test_the_cni_identity_may_not_review_tokens_or_read_configmaps(api: tuple[IstiodLocal, Path, Path]) -> None:
    cni = api[0].kubeconfig(api[2] / "cni.kubeconfig", identity="istio-system/istio-cni")
    configuration = K.Configuration()
    kconfig.load_kube_config(config_file=str(cni), client_configuration=configuration)
    with K.ApiClient(configuration) as api_client:
        denied = _refused(lambda: K.AuthenticationV1Api(api_client).create_token_review(
            K.V1TokenReview(spec=K.V1TokenReviewSpec(token="x"))))
        assert denied.status == 403
        assert _refused(lambda: K.CoreV1Api(api_client).list_namespaced_config_map("default")).status == 403


def test_a_body_that_is_not_json_is_unsupported(api: tuple[IstiodLocal, Path, Path]) -> None:
    """kubectl 1.32 sends protobuf for built-in kinds: the answer is 415, the apiserver's for a media type it
    does not decode, not a 400 about bad JSON."""
    istiod = api[0]
    context = ssl.create_default_context(cadata=istiod.root_pem().decode())
    host, port = istiod.kube_api.rsplit(":", 1)
    token = yaml.safe_load(api[1].read_text())["users"][0]["user"]["token"]
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request("POST", "/api/v1/namespaces/default/configmaps", body=b"k8s\x00\x0a\x0f",
                     headers={"Content-Type": "application/vnd.kubernetes.protobuf",
                              "Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        assert response.status == 415 and b"UnsupportedMediaType" in response.read()
    finally:
        conn.close()
