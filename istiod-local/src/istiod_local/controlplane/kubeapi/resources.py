"""The resource types istiod-local's Kubernetes API serves, and what each supports (pure).

Pods and namespaces (from the registry, with the CNI's patches) and events
(accepted, not kept) have their own handling. Every other type here is a
plain stored object: list, watch, get, create, update, patch and delete with
resourceVersions, as the apiserver's generic registry serves a type with no
strategy of its own. That is what a real istiod asks of a cluster at start
(docs/ISTIOD.md lists each request and why): the Services, EndpointSlices and
the Node are rendered from the registry (`services.py`), the rest start empty
and are whatever clients write (istiod's `istio-ca-root-cert` ConfigMaps, its
leader-election Leases). `tokenreviews` is the one virtual type: a create that
answers and stores nothing.

A type is known by its storage key: the plural for the core group (`pods`,
`configmaps`), `plural.group` otherwise (`endpointslices.discovery.k8s.io`),
as `kubectl api-resources` names them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from istiod_local.controlplane.kubeapi.selectors import NAMESPACE_FIELDS, POD_FIELDS, FieldGetter, path_getter

STORED_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")

_META_FIELDS: dict[str, FieldGetter] = {"metadata.name": path_getter("metadata", "name"),
                                        "metadata.namespace": path_getter("metadata", "namespace")}


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...] = STORED_VERBS
    short_names: tuple[str, ...] = ()
    fields: tuple[tuple[str, FieldGetter], ...] = tuple(_META_FIELDS.items())

    @property
    def key(self) -> str:
        return self.plural if not self.group else f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def field_getters(self) -> dict[str, FieldGetter]:
        return dict(self.fields)


def _core(plural: str, kind: str, namespaced: bool = True, **kw: object) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, **kw)  # type: ignore[arg-type]


_SECRET_FIELDS = (*_META_FIELDS.items(), ("type", path_getter("type")))
_EVENT_FIELDS = (*_META_FIELDS.items(), ("involvedObject.name", path_getter("involvedObject", "name")),
                 ("involvedObject.namespace", path_getter("involvedObject", "namespace")),
                 ("involvedObject.kind", path_getter("involvedObject", "kind")),
                 ("reason", path_getter("reason")), ("type", path_getter("type")))

PODS = "pods"
NAMESPACES = "namespaces"
EVENTS = "events"
SERVICES = "services"
NODES = "nodes"
CONFIGMAPS = "configmaps"
ENDPOINTSLICES = "endpointslices.discovery.k8s.io"
TOKENREVIEWS = "tokenreviews.authentication.k8s.io"

TYPES: tuple[ResourceType, ...] = (
    _core(PODS, "Pod", verbs=("delete", "get", "list", "patch", "watch"), short_names=("po",),
          fields=tuple(POD_FIELDS.items())),
    _core(NAMESPACES, "Namespace", False, verbs=("get", "list", "watch"), short_names=("ns",),
          fields=tuple(NAMESPACE_FIELDS.items())),
    _core(EVENTS, "Event", verbs=("create", "list"), short_names=("ev",), fields=_EVENT_FIELDS),
    _core(CONFIGMAPS, "ConfigMap", short_names=("cm",)),
    _core("secrets", "Secret", fields=_SECRET_FIELDS),
    _core(SERVICES, "Service", short_names=("svc",)),
    _core("endpoints", "Endpoints", short_names=("ep",)),
    _core("serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _core(NODES, "Node", False, short_names=("no",)),
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                 short_names=("crd", "crds")),
    ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                 "MutatingWebhookConfiguration", False),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", False),
    ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=("create",)),
)
BY_KEY: dict[str, ResourceType] = {t.key: t for t in TYPES}
_BY_PATH: dict[tuple[str, str, str], ResourceType] = {(t.group, t.version, t.plural): t for t in TYPES}
# Types that are stored objects with the generic verbs (not pods, namespaces, events or token reviews).
GENERIC: frozenset[str] = frozenset(t.key for t in TYPES if t.verbs == STORED_VERBS)
# What a stored object may cost and how many of one type there may be: the apiserver's own object limit
# (etcd's 1.5 MiB request), and a count no real client of this API comes near (istiod writes one ConfigMap per
# namespace and a few Leases), so that a token holder cannot grow the server without bound.
OBJECT_MAX_BYTES = 1572864  # etcd's default --max-request-bytes (1.5 MiB): the largest object the apiserver stores
MAX_OBJECTS_PER_TYPE = 5000


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def groups() -> dict[str, list[ResourceType]]:
    """The API groups (not the core group) and their types, in the order discovery lists them."""
    out: dict[str, list[ResourceType]] = {}
    for t in TYPES:
        if t.group:
            out.setdefault(t.group, []).append(t)
    return out


def core_types() -> Iterable[ResourceType]:
    return (t for t in TYPES if not t.group)
