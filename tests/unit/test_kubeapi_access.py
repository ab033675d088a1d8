"""Who may do what (the fixed RBAC), the apiserver's error wording, paths, and the credentials' names."""

from __future__ import annotations

import pytest

from istiod_local.controlplane.kubeapi import errors, rbac
from istiod_local.controlplane.kubeapi.credentials import kubeconfig, parse_identity, serving_names
from istiod_local.controlplane.kubeapi.paths import ResourcePath, parse_path, request_verb, resource_path
from istiod_local.controlplane.tokens import TokenIdentity


@pytest.mark.parametrize(("user", "verb", "resource", "allowed"), [
    (rbac.CNI_USER, "get", "pods", True),
    (rbac.CNI_USER, "watch", "pods", True),
    (rbac.CNI_USER, "patch", "pods/status", True),
    (rbac.CNI_USER, "delete", "pods", True),
    (rbac.CNI_USER, "list", "namespaces", True),
    (rbac.CNI_USER, "delete", "namespaces", False),
    (rbac.CNI_USER, "create", "events", True),
    (rbac.ADMIN_USER, "patch", "pods", True),
    (rbac.ADMIN_USER, "update", "pods", True),  # cluster-admin: what is not served is then 405, not 403
    (rbac.ADMIN_USER, "delete", "namespaces", True),
    (rbac.CNI_USER, "update", "pods", False),
    (rbac.CNI_USER, "deletecollection", "pods", False),
    (rbac.CNI_USER, "list", "secrets", False),
    ("system:serviceaccount:default:echo", "get", "pods", False),
    ("system:serviceaccount:istio-system:istio-ingressgateway", "list", "pods", False),
    (rbac.ISTIOD_USER, "list", "pods", True),  # the real istiod: cluster-admin, as its ClusterRole is wide
    (rbac.ISTIOD_USER, "create", "tokenreviews", True),
    (rbac.CNI_USER, "create", "tokenreviews", False),
    (rbac.CNI_USER, "list", "configmaps", False),
])
def test_rbac(user: str, verb: str, resource: str, allowed: bool) -> None:
    assert rbac.allowed(rbac.Request(user, verb, resource, "default", "x")) is allowed


def test_forbidden_messages_name_scope_and_subresource() -> None:
    user = "system:serviceaccount:default:echo"
    named = errors.forbidden(user, "patch", "pods/status", "p", "ns").status()
    assert named["message"] == ('pods "p" is forbidden: User "system:serviceaccount:default:echo" cannot patch '
                                'resource "pods/status" in API group "" in the namespace "ns"')
    assert named["details"] == {"name": "p", "kind": "pods"} and named["code"] == 403
    cluster = errors.forbidden(user, "list", "pods", "", "").status()
    assert cluster["message"] == ('pods is forbidden: User "system:serviceaccount:default:echo" cannot list '
                                  'resource "pods" in API group "" at the cluster scope')
    assert cluster["details"] == {"kind": "pods"}


def test_status_object_shape() -> None:
    assert errors.unauthorized().status() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                              "status": "Failure", "message": "Unauthorized",
                                              "reason": "Unauthorized", "code": 401}
    assert errors.expired(3, 10).status()["reason"] == "Expired"


@pytest.mark.parametrize(("path", "route"), [
    ("/api/v1/pods", ("pods", "", "")),
    ("/api/v1/namespaces", ("namespaces", "", "")),
    ("/api/v1/namespaces/kube-system", ("namespaces", "", "kube-system")),
    ("/api/v1/namespaces/default/pods", ("pods", "default", "")),
    ("/api/v1/namespaces/default/pods/echo-1", ("pods", "default", "echo-1")),
    ("/api/v1/namespaces/default/pods/echo-1/status", ("pods/status", "default", "echo-1")),
    ("/api/v1/namespaces/default/events", ("events", "default", "")),
    ("/api/v1/namespaces/default/pods/echo-1/log", None),
    ("/api/v1/services", ("services", "", "")),
    ("/api/v1/namespaces/default/services/echo", ("services", "default", "echo")),
    ("/api/v1/services/echo", None),  # a namespaced object is named with its namespace
    ("/api/v1/nodes/n1", ("nodes", "", "n1")),
    ("/api/v1/namespaces/default/nodes/n1", None),  # nodes are cluster-scoped
    ("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
     ("endpointslices.discovery.k8s.io", "default", "")),
    ("/apis/coordination.k8s.io/v1/namespaces/istio-system/leases/x",
     ("leases.coordination.k8s.io", "istio-system", "x")),
    ("/apis/discovery.k8s.io/v1beta1/namespaces/default/endpointslices", None),  # only the version served
    ("/api/v1/namespaces/default/configmaps/x/status", None),
    ("/api/v1/replicationcontrollers", None),
    ("/apis/apps/v1/deployments", None),
])
def test_paths(path: str, route: tuple[str, str, str] | None) -> None:
    parsed = parse_path(path)
    assert (None if parsed is None else (parsed.resource, parsed.namespace, parsed.name)) == route


def test_serving_names_cover_the_listen_address() -> None:
    dns, ips = serving_names("10.10.0.1")
    assert "kubernetes.default.svc.cluster.local" in dns and ips == ["127.0.0.1", "10.10.0.1"]
    dns, ips = serving_names("node-1.example")
    assert dns[-1] == "node-1.example" and ips == ["127.0.0.1"]
    assert serving_names("::1")[1] == ["127.0.0.1", "::1"]


def test_identity_and_kubeconfig_document() -> None:
    assert parse_identity("istio-system/istio-cni") == TokenIdentity("istio-system", "istio-cni")
    assert parse_identity("system:serviceaccount:a:b") == TokenIdentity("a", "b")
    for bad in ("nobody", "/x", "a/", "a/b/c"):
        with pytest.raises(ValueError, match="namespace/serviceaccount"):
            parse_identity(bad)
    doc = kubeconfig("https://127.0.0.1:6443", "PEM", "tok", TokenIdentity("istio-system", "istio-cni"))
    assert doc["current-context"] == doc["contexts"][0]["name"]
    assert doc["contexts"][0]["context"]["user"] == doc["users"][0]["name"]
    assert doc["users"][0]["user"] == {"token": "tok"}
    assert doc["clusters"][0]["cluster"]["certificate-authority-data"] == "UEVN"


@pytest.mark.parametrize(("path", "attributes"), [
    ("/api/v1/pods", ResourcePath("", "", "pods", "")),
    ("/api/v1/namespaces", ResourcePath("", "", "namespaces", "")),
    ("/api/v1/namespaces/shop", ResourcePath("", "shop", "namespaces", "shop")),
    ("/api/v1/namespaces/shop/status", ResourcePath("", "shop", "namespaces/status", "shop")),
    ("/api/v1/namespaces/default/pods", ResourcePath("", "default", "pods", "")),
    ("/api/v1/namespaces/default/pods/p/status", ResourcePath("", "default", "pods/status", "p")),
    ("/api/v1/namespaces/default/pods/p/log", ResourcePath("", "default", "pods/log", "p")),
    ("/api/v1/secrets", ResourcePath("", "", "secrets", "")),
    ("/apis/apps/v1/namespaces/ns/deployments/web", ResourcePath("apps", "ns", "deployments", "web")),
    ("/api/v1", None),
    ("/apis/apps/v1", None),
    ("/version", None),
])
def test_authorization_attributes_of_a_path(path: str, attributes: ResourcePath | None) -> None:
    assert resource_path(path) == attributes


@pytest.mark.parametrize(("method", "named", "watch", "verb"), [
    ("GET", False, False, "list"), ("GET", True, False, "get"), ("GET", False, True, "watch"),
    ("GET", True, True, "watch"), ("HEAD", True, False, "get"), ("POST", False, False, "create"),
    ("PUT", True, False, "update"), ("PATCH", True, False, "patch"), ("DELETE", True, False, "delete"),
    ("DELETE", False, False, "deletecollection"),
])
def test_verb_of_a_request(method: str, named: bool, watch: bool, verb: str) -> None:
    assert request_verb(method, named, watch) == verb


def test_forbidden_in_a_named_group() -> None:
    err = errors.forbidden(rbac.CNI_USER, "get", "deployments", "web", "ns", "apps").status()
    assert err["message"].startswith('deployments.apps "web" is forbidden: ')
    assert err["message"].endswith('cannot get resource "deployments" in API group "apps" in the namespace "ns"')
    assert err["details"] == {"name": "web", "group": "apps", "kind": "deployments"}
