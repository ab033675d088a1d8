"""Who may do what through istiod-local's Kubernetes API: a small fixed RBAC (pure).

Two identities are bound to the one role istiod-local has:

- `system:serviceaccount:istio-system:istio-cni`, the CNI's identity (the
  plugin's kubeconfig, install-cni and its repair controller), as upstream's
  `istio-cni` ClusterRole grants it pods and namespaces, and
- `system:serviceaccount:kube-system:istiod-local-admin`, the identity
  `istiod-local kubeconfig` writes by default, for kubectl and the local node
  (which reports pod status as a kubelet would).

The role: get, list and watch pods and namespaces; patch and delete pods;
get and patch pods/status; create and list events (none are kept: a list is empty). Every other authenticated identity
is denied (403); an unauthenticated request never gets this far (401).
"""

from __future__ import annotations

from dataclasses import dataclass

CNI_USER = "system:serviceaccount:istio-system:istio-cni"
ADMIN_USER = "system:serviceaccount:kube-system:istiod-local-admin"
ADMIN_IDENTITY = "kube-system/istiod-local-admin"
CNI_IDENTITY = "istio-system/istio-cni"

ROLE: frozenset[tuple[str, str]] = frozenset(
    {(verb, "pods") for verb in ("get", "list", "watch", "patch", "delete")}
    | {(verb, "namespaces") for verb in ("get", "list", "watch")}
    | {("get", "pods/status"), ("patch", "pods/status"), ("create", "events"), ("list", "events")}
)
BINDINGS: dict[str, frozenset[tuple[str, str]]] = {CNI_USER: ROLE, ADMIN_USER: ROLE}


@dataclass(frozen=True)
class Request:
    """One request's authorization attributes, as the apiserver derives them."""

    user: str
    verb: str  # get | list | watch | patch | delete | create | update
    resource: str  # pods, pods/status, namespaces, events
    namespace: str = ""
    name: str = ""


def allowed(request: Request) -> bool:
    return (request.verb, request.resource) in BINDINGS.get(request.user, frozenset())
