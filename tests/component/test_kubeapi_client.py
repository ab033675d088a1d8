"""istiod-local's Kubernetes API driven by clients nobody here wrote: the official `kubernetes` Python client,
and raw HTTPS for the exact error bodies (401/403/404/409/400) a kube-apiserver returns."""

from __future__ import annotations

import http.client
import json
import queue
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launchers import IstiodLocal, RegistryFile
from support import poll
from urllib3.exceptions import ProtocolError

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client as kclient  # noqa: E402
from kubernetes import config as kconfig  # noqa: E402
from kubernetes import watch as kwatch  # noqa: E402

MESH = {
    "services": [{"name": "echo", "namespace": "default", "selector": {"app": "echo"},
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}],
    "workloads": [
        {"name": "echo-1", "namespace": "default", "serviceAccount": "echo", "labels": {"app": "echo"},
         "ip": "10.244.0.5", "nodeName": "iacni-node-a"},
        {"name": "echo-2", "namespace": "default", "serviceAccount": "echo", "labels": {"app": "echo"},
         "ip": "10.244.0.6", "nodeName": "iacni-node-b"},
        {"name": "plain", "namespace": "apps", "sidecar": "none", "ip": "10.244.0.7", "nodeName": "iacni-node-a"},
    ],
    "namespaces": {"apps": {"labels": {"istio-injection": "disabled"}}},
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IstiodLocal, RegistryFile, Path]]:
    base = tmp_path_factory.mktemp("kubeapi")
    registry = RegistryFile(base / "mesh.yaml", MESH)
    with IstiodLocal(base / "state", registry=registry, kube_api_addr="127.0.0.1:0") as istiod:
        kubeconfig = istiod.kubeconfig(base / "admin.kubeconfig")
        yield istiod, registry, kubeconfig


@pytest.fixture
def core(api: tuple[IstiodLocal, RegistryFile, Path]) -> Any:
    configuration = kclient.Configuration()
    kconfig.load_kube_config(config_file=str(api[2]), client_configuration=configuration)
    with kclient.ApiClient(configuration) as api_client:
        yield kclient.CoreV1Api(api_client)


def _request(istiod: IstiodLocal, method: str, path: str, token: str | None, body: Any = None,
             content_type: str = "application/json", raw: bool = False) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cadata=istiod.root_pem().decode())
    host, port = istiod.kube_api.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, (json.loads(data) if data.strip() else {})
    finally:
        conn.close()


def _admin_token(istiod: IstiodLocal, tmp_path: Path, identity: str = "kube-system/istiod-local-admin") -> str:
    sa = tmp_path / "sa"
    istiod.kubeconfig(tmp_path / "k", identity=identity, service_account_dir=sa)
    return (sa / "token").read_text()


def test_list_read_and_selectors_through_the_official_client(core: Any) -> None:
    pods = core.list_pod_for_all_namespaces()
    assert {p.metadata.name for p in pods.items} >= {"echo-1", "echo-2", "plain"}
    assert int(pods.metadata.resource_version) > 0
    on_a = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=iacni-node-a")
    assert {p.metadata.name for p in on_a.items} == {"echo-1", "plain"}
    injected = core.list_namespaced_pod("default", label_selector="security.istio.io/tlsMode=istio,app in (echo)")
    assert {p.metadata.name for p in injected.items} == {"echo-1", "echo-2"}
    pod = core.read_namespaced_pod("echo-1", "default")
    assert [c.name for c in pod.spec.containers] == ["app", "istio-proxy"]
    assert [c.name for c in pod.spec.init_containers] == ["istio-validation"]
    status = json.loads(pod.metadata.annotations["sidecar.istio.io/status"])
    assert status["initContainers"] == ["istio-validation"] and status["containers"] == ["istio-proxy"]
    assert pod.status.pod_ip == "10.244.0.5" and pod.status.phase == "Running"
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    namespaces = {n.metadata.name: n.metadata.labels for n in core.list_namespace().items}
    assert {"default", "istio-system", "kube-system", "apps"} <= set(namespaces)
    assert namespaces["apps"]["istio-injection"] == "disabled"
    assert core.read_namespace("apps").status.phase == "Active"


def test_status_patch_label_patch_and_delete_as_repair_sends_them(core: Any) -> None:
    # The node, as kubelet: the validation init container failed.
    failed = {"status": {"initContainerStatuses": [{
        "name": "istio-validation", "ready": False, "restartCount": 2, "image": "proxyv2", "imageID": "",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 126, "reason": "Error", "message": "no capture"}}}],
        "phase": "Pending"}}
    pod = core.patch_namespaced_pod_status("echo-2", "default", failed)
    assert pod.status.phase == "Pending"
    assert pod.status.init_container_statuses[0].last_state.terminated.exit_code == 126
    # Upstream repair's label: a merge patch of metadata.labels on pods/{name}/status.
    labelled = core.patch_namespaced_pod_status(
        "echo-2", "default", {"metadata": {"labels": {"cni.istio.io/uninitialized": "true"}}},
        _content_type="application/merge-patch+json")
    assert labelled.metadata.labels["cni.istio.io/uninitialized"] == "true"
    assert labelled.status.phase == "Pending"  # the label patch left the reported status alone
    # Upstream repair's delete: preconditions on uid and resourceVersion.
    stale = kclient.V1DeleteOptions(preconditions=kclient.V1Preconditions(uid=labelled.metadata.uid,
                                                                          resource_version="1"))
    with pytest.raises(kclient.ApiException) as refused:
        core.delete_namespaced_pod("echo-2", "default", body=stale)
    assert refused.value.status == 409
    exact = kclient.V1DeleteOptions(preconditions=kclient.V1Preconditions(
        uid=labelled.metadata.uid, resource_version=labelled.metadata.resource_version))
    core.delete_namespaced_pod("echo-2", "default", body=exact)
    with pytest.raises(kclient.ApiException) as gone:
        core.read_namespaced_pod("echo-2", "default")
    assert gone.value.status == 404


def test_watch_with_a_node_field_selector_sees_registry_changes(api: tuple[IstiodLocal, RegistryFile, Path],
                                                               core: Any) -> None:
    _, registry, _ = api
    listed = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=iacni-node-a")
    events: queue.Queue[tuple[str, str]] = queue.Queue()
    watcher = kwatch.Watch()

    def run() -> None:
        try:
            for event in watcher.stream(core.list_pod_for_all_namespaces,
                                        field_selector="spec.nodeName=iacni-node-a",
                                        resource_version=listed.metadata.resource_version, timeout_seconds=20):
                events.put((event["type"], event["object"].metadata.name))
        except ProtocolError:
            pass  # Watch.stop() shuts the client's socket down under the reading thread

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    changed = json.loads(json.dumps(MESH))
    changed["workloads"][0]["labels"]["version"] = "v2"  # echo-1 modified
    changed["workloads"].pop(2)  # plain deleted
    changed["workloads"].append({"name": "new-1", "namespace": "default", "nodeName": "iacni-node-a"})
    changed["workloads"].append({"name": "elsewhere", "namespace": "default", "nodeName": "iacni-node-z"})
    registry.write(changed)
    seen: list[tuple[str, str]] = []

    def all_seen() -> bool:
        while not events.empty():
            seen.append(events.get())
        return {("MODIFIED", "echo-1"), ("DELETED", "plain"), ("ADDED", "new-1")} <= set(seen)

    try:
        poll(all_seen, "the watch to report the registry change", 15)
    finally:
        watcher.stop()
        registry.write(MESH)
        thread.join(15)
    assert all(name != "elsewhere" for _, name in seen)
    assert all(name != "apps" for _, name in seen)  # the namespace went too, but this watch is of pods
    echo = core.read_namespaced_pod("echo-1", "default")
    assert echo.metadata.labels["service.istio.io/canonical-revision"] == "v2"


def test_watch_from_a_compacted_resource_version_is_expired(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "mesh.yaml", MESH)
    with IstiodLocal(tmp_path / "state", registry=registry, kube_api_addr="127.0.0.1:0",
                     args=["--kube-watch-history", "3"]) as istiod:
        configuration = kclient.Configuration()
        kconfig.load_kube_config(config_file=str(istiod.kubeconfig(tmp_path / "k")),
                                 client_configuration=configuration)
        with kclient.ApiClient(configuration) as api_client:
            core = kclient.CoreV1Api(api_client)
            with pytest.raises(kclient.ApiException) as expired:
                for _ in kwatch.Watch().stream(core.list_pod_for_all_namespaces, resource_version="2",
                                               timeout_seconds=5):
                    pass
            assert expired.value.status == 410
            listed = core.list_pod_for_all_namespaces()
            assert listed.metadata is not None
            current = listed.metadata.resource_version
            code, body = _request(istiod, "GET", f"/api/v1/pods?watch=1&resourceVersion={current}"
                                  "&timeoutSeconds=1", _admin_token(istiod, tmp_path / "t"), raw=True)
            assert code == 200 and body == {}  # a current RV: nothing to replay, the stream ends at its timeout
            # A watch of all pods sees pods only, while namespaces change too.
            token = _admin_token(istiod, tmp_path / "w")
            context = ssl.create_default_context(cadata=istiod.root_pem().decode())
            host, port = istiod.kube_api.rsplit(":", 1)
            conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
            try:
                conn.request("GET", "/api/v1/pods?watch=1&timeoutSeconds=3",
                             headers={"Authorization": f"Bearer {token}"})
                response = conn.getresponse()
                first = json.loads(response.readline())  # the watch is live: its synthetic ADDED came
                changed = json.loads(json.dumps(MESH))
                changed["workloads"].append({"name": "fresh", "namespace": "brand-new"})
                registry.write(changed)
                later = [json.loads(line) for line in response.read().splitlines() if line.strip()]
            finally:
                conn.close()
            assert first["type"] == "ADDED"
            assert ("ADDED", "fresh") in [(e["type"], e["object"]["metadata"]["name"]) for e in later]
            assert {e["object"]["kind"] for e in [first, *later]} == {"Pod"}
        # After a restart, a watch resuming from a version of the previous run is expired, not left waiting.
        istiod.stop()
        istiod.start()
        code, body = _request(istiod, "GET", f"/api/v1/pods?watch=1&resourceVersion={current}&timeoutSeconds=2",
                              token)
        assert (code, body["type"], body["object"]["code"]) == (200, "ERROR", 410)


def test_error_bodies_are_the_apiservers(api: tuple[IstiodLocal, RegistryFile, Path], tmp_path: Path) -> None:
    istiod = api[0]
    admin = _admin_token(istiod, tmp_path)
    code, body = _request(istiod, "GET", "/api/v1/pods", None)
    assert (code, body) == (401, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                  "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    assert _request(istiod, "GET", "/api/v1/pods", "not-a-jwt")[0] == 401
    ca_token = istiod.token(namespace="default", service_account="echo")  # audience istio-ca: not for the API
    assert _request(istiod, "GET", "/api/v1/pods", ca_token)[0] == 401
    other = _admin_token(istiod, tmp_path / "o", identity="default/echo")
    code, body = _request(istiod, "GET", "/api/v1/namespaces/default/pods/echo-1", other)
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods "echo-1" is forbidden: User "system:serviceaccount:default:echo" cannot get '
                               'resource "pods" in API group "" in the namespace "default"')
    assert body["details"] == {"name": "echo-1", "kind": "pods"}
    code, body = _request(istiod, "GET", "/api/v1/namespaces/default/pods/nope", admin)
    assert (code, body["reason"], body["message"], body["details"]) == (
        404, "NotFound", 'pods "nope" not found', {"name": "nope", "kind": "pods"})
    code, body = _request(istiod, "PATCH", "/api/v1/namespaces/default/pods/echo-1", admin,
                          {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}},
                          "application/merge-patch+json")
    assert (code, body["reason"]) == (409, "Conflict")
    assert body["message"].startswith('Operation cannot be fulfilled on pods "echo-1": the object has been modified')
    code, body = _request(istiod, "GET", "/api/v1/pods?fieldSelector=spec.foo%3Dbar", admin)
    assert (code, body["reason"], body["message"]) == (400, "BadRequest", "field label not supported: spec.foo")
    assert _request(istiod, "PUT", "/api/v1/namespaces/default/pods/echo-1", admin, {})[0] == 405


def test_authorization_comes_before_dispatch(api: tuple[IstiodLocal, RegistryFile, Path], tmp_path: Path) -> None:
    """A verb or resource outside the identity's role is 403 (not 405/404); 405 only for an authorized identity."""
    istiod = api[0]
    admin = _admin_token(istiod, tmp_path / "a")
    cni = _admin_token(istiod, tmp_path / "c", identity="istio-system/istio-cni")
    user = "system:serviceaccount:istio-system:istio-cni"
    code, body = _request(istiod, "DELETE", "/api/v1/namespaces/shop", cni)
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"] == (f'namespaces "shop" is forbidden: User "{user}" cannot delete resource "namespaces" '
                               'in API group "" in the namespace "shop"')
    assert body["details"] == {"name": "shop", "kind": "namespaces"}
    code, body = _request(istiod, "PUT", "/api/v1/namespaces/default/pods/echo-1", cni, {})
    assert (code, body["message"]) == (403, f'pods "echo-1" is forbidden: User "{user}" cannot update resource '
                                            '"pods" in API group "" in the namespace "default"')
    code, body = _request(istiod, "DELETE", "/api/v1/namespaces/default/pods", cni)
    assert (code, body["message"]) == (403, f'pods is forbidden: User "{user}" cannot deletecollection resource '
                                            '"pods" in API group "" in the namespace "default"')
    code, body = _request(istiod, "GET", "/api/v1/secrets", cni)
    assert (code, body["message"]) == (403, f'secrets is forbidden: User "{user}" cannot list resource "secrets" '
                                            'in API group "" at the cluster scope')
    code, body = _request(istiod, "GET", "/apis/apps/v1/namespaces/default/deployments/web", cni)
    assert (code, body["message"], body["details"]) == (
        403, f'deployments.apps "web" is forbidden: User "{user}" cannot get resource "deployments" in API group '
             '"apps" in the namespace "default"', {"name": "web", "group": "apps", "kind": "deployments"})
    code, body = _request(istiod, "GET", "/api/v1/namespaces/default/events?watch=1", cni)
    assert code == 403 and 'cannot watch resource "events"' in body["message"]
    # Authorized, but not served here: 405 (upstream would update the pod or delete the namespace).
    assert _request(istiod, "PUT", "/api/v1/namespaces/default/pods/echo-1", admin, {})[0] == 405
    assert _request(istiod, "DELETE", "/api/v1/namespaces/shop", admin)[0] == 405
    assert _request(istiod, "GET", "/api/v1/namespaces/default/pods/echo-1", cni)[0] == 200
