"""Who may do what through istiod-local's Kubernetes API: a small fixed RBAC (pure).

Two identities are bound:

- `system:serviceaccount:istio-system:istio-cni`, the CNI's identity (the
  plugin's kubeconfig, install-cni and its repair controller), to the role
  below, as upstream's `istio-cni` ClusterRole grants it pods and namespaces, and
- `system:serviceaccount:kube-system:istiod-local-admin`, the identity
  `istiod-local kubeconfig` writes by default, for kubectl and the local node
  (which reports pod status as a kubelet would), as cluster-admin: it may do
  anything, so what it asks that is not served is 404 or 405, never 403, and
- `system:serviceaccount:istio-system:istiod`, the real istiod's identity
  (`istiod-local kubeconfig --identity istio-system/istiod`), also as
  cluster-admin: upstream's istiod ClusterRole reads every type here and
  writes ConfigMaps, Leases, webhook configurations and token reviews, which
  is all this API serves besides pods, so a narrower role would grant the same.

The CNI's role: get, list and watch pods and namespaces; patch and delete pods;
get and patch pods/status; create and list events (none are kept: a list is empty). Every other authenticated identity
is denied (403); an unauthenticated request never gets this far (401). The server asks before it looks at
what the request would do, so a verb or a resource outside the role is 403 even where the server would not
serve it (405, 404) to an identity the role allows.
"""

from __future__ import annotations

from dataclasses import dataclass

CNI_USER = "system:serviceaccount:istio-system:istio-cni"
ADMIN_USER = "system:serviceaccount:kube-system:istiod-local-admin"
ADMIN_IDENTITY = "kube-system/istiod-local-admin"
CNI_IDENTITY = "istio-system/istio-cni"
ISTIOD_USER = "system:serviceaccount:istio-system:istiod"
ISTIOD_IDENTITY = "istio-system/istiod"

ROLE: frozenset[tuple[str, str]] = frozenset(
    {(verb, "pods") for verb in ("get", "list", "watch", "patch", "delete")}
    | {(verb, "namespaces") for verb in ("get", "list", "watch")}
    | {("get", "pods/status"), ("patch", "pods/status"), ("create", "events"), ("list", "events")}
)
BINDINGS: dict[str, frozenset[tuple[str, str]]] = {CNI_USER: ROLE}
# The admin identity is bound as cluster-admin is: every verb on every resource of every group.
SUPERUSERS = frozenset({ADMIN_USER, ISTIOD_USER})


@dataclass(frozen=True)
class Request:
    """One request's authorization attributes, as the apiserver derives them."""

    user: str
    verb: str  # get | list | watch | patch | delete | deletecollection | create | update | ...
    resource: str  # pods, pods/status, namespaces, events, or any other the path names
    namespace: str = ""  # for namespaces/{name}, the name (as the apiserver's request info sets it)
    name: str = ""
    group: str = ""  # the API group; every rule here is for the core group ""


def allowed(request: Request) -> bool:
    if request.user in SUPERUSERS:
        return True
    return request.group == "" and (request.verb, request.resource) in BINDINGS.get(request.user, frozenset())
