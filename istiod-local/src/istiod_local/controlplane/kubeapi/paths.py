"""Which resource a request names and which verb it is, as the apiserver's request info derives them (pure).

Authorization uses `resource_path` and `request_verb` (any path of the API's
shape, served or not); serving uses `parse_path` (the routes this server has)
and `SERVED` (what each route supports once authorized; anything else is 405).
"""

from __future__ import annotations

from dataclasses import dataclass

from istiod_local.controlplane.kubeapi.resources import EVENTS, GENERIC, NAMESPACES, PODS, TOKENREVIEWS, lookup


@dataclass(frozen=True)
class Route:
    resource: str  # a type's key (resources.py: pods, configmaps, leases.coordination.k8s.io, ...) or pods/status
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True)
class ResourcePath:
    """What the apiserver's request info makes of a resource path, for authorization: the API group, the
    namespace (for `namespaces/{name}` the name itself, as upstream sets it), the resource (with its
    subresource, `pods/status`) and the name."""

    group: str
    namespace: str
    resource: str
    name: str


_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def resource_path(path: str) -> ResourcePath | None:
    """The attributes of `/api/v1/...` or `/apis/{group}/{version}/...`; None for a path naming no resource."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) > 1 and rest[0] == "namespaces":
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    if not rest:
        return None
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    return ResourcePath(group, namespace, resource, rest[1] if len(rest) > 1 else "")


_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_verb(method: str, named: bool, watch: bool) -> str:
    """The authorization verb of a resource request, as the apiserver derives it."""
    if method in ("GET", "HEAD"):
        return "watch" if watch else "get" if named else "list"
    if method == "DELETE" and not named:
        return "deletecollection"
    return _METHOD_VERBS.get(method, method.lower())


def _served() -> dict[tuple[str, bool], frozenset[str]]:
    """What each served route supports, once authorized; anything else is 405."""
    out = {
        (PODS, False): frozenset({"list", "watch"}),
        (PODS, True): frozenset({"get", "watch", "patch", "delete"}),
        ("pods/status", True): frozenset({"get", "patch"}),
        (NAMESPACES, False): frozenset({"list", "watch"}),
        (NAMESPACES, True): frozenset({"get", "watch"}),
        (EVENTS, False): frozenset({"create", "list"}),
        (TOKENREVIEWS, False): frozenset({"create"}),
    }
    for key in GENERIC:
        out[key, False] = frozenset({"list", "watch", "create"})
        out[key, True] = frozenset({"get", "watch", "update", "patch", "delete"})
    return out


SERVED: dict[tuple[str, bool], frozenset[str]] = _served()


def parse_path(path: str) -> Route | None:
    """The resource a /api/v1/... or /apis/{group}/{version}/... path names; None when it names none this
    server has (a cluster-scoped type under a namespace, a namespaced one named without its namespace)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if group == "" and len(rest) in (1, 2) and rest[0] == NAMESPACES:
        return Route(NAMESPACES, "", rest[1] if len(rest) == 2 else "")
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    rtype = lookup(group, version, rest[0])
    if rtype is None or (namespace and not rtype.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else ""
    if name and rtype.namespaced and not namespace:
        return None
    if len(rest) == 3:
        if rtype.key == PODS and rest[2] == "status":
            return Route("pods/status", namespace, name)
        return None
    return Route(rtype.key, namespace, name)
