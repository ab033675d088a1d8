"""A change to a served object as watchers see it, and what each watcher's selectors make of it (pure).

The store numbers and logs `WatchEvent`s; a watch stream filters them through
`filter_event` (the watcher's namespace, labels and fields) and marks its
progress with `bookmark` objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from istiod_local.controlplane.kubeapi.resources import BY_KEY
from istiod_local.controlplane.kubeapi.selectors import FieldSelector, LabelSelector

OBJECT_SIZE_GUESS = 4096  # what an object costs in the log when its encoded size is not known (a rendered pod)


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    resource: str  # the type's key (resources.py): pods, namespaces, configmaps, leases.coordination.k8s.io, ...
    object: dict[str, Any]
    resource_version: int
    # The object before this change (MODIFIED), so a filtered watch can turn it into ADDED/DELETED.
    previous: dict[str, Any] | None = None
    size: int = OBJECT_SIZE_GUESS  # the object's encoded size, as far as it is known




def matches(obj: dict[str, Any], labels: LabelSelector | None, fields: FieldSelector | None) -> bool:
    if labels is not None and not labels.matches(obj.get("metadata", {}).get("labels") or {}):
        return False
    return fields is None or fields.matches(obj)


def filter_event(event: WatchEvent, labels: LabelSelector | None, fields: FieldSelector | None,
                 namespace: str = "") -> WatchEvent | None:
    """What a watcher with these selectors sees of `event`: as is, as ADDED/DELETED, or nothing.

    A MODIFIED object that starts matching is ADDED to that watcher, one that stops matching is
    DELETED from it, as the apiserver's watch cache reports them.
    """
    def visible(obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if namespace and obj.get("metadata", {}).get("namespace") != namespace:
            return False
        return matches(obj, labels, fields)

    now = visible(event.object)
    if event.type != "MODIFIED":
        return event if now else None
    before = visible(event.previous)
    if now and before:
        return event
    if now:
        return WatchEvent("ADDED", event.resource, event.object, event.resource_version)
    if before:
        return WatchEvent("DELETED", event.resource, event.object, event.resource_version)
    return None


def bookmark(resource: str, resource_version: int) -> dict[str, Any]:
    """A BOOKMARK event's object: only the kind and the resourceVersion the watcher has seen up to."""
    rtype = BY_KEY[resource]
    return {"kind": rtype.kind, "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(resource_version)}}
