"""The objects istiod-local's Kubernetes API serves, with resourceVersions and a watch log (sans-IO).

One counter numbers every change, as etcd's revision does: each object
carries the `resourceVersion` of its last change, a list reports the
counter, and the log keeps the last `history` changes (at most
`history_bytes` of objects: a few large pods must not pin hundreds of
megabytes of old versions) so a watch from a
resourceVersion replays what came after it. A resourceVersion older than
the log's start is `410 Expired` (the client lists again), as the
apiserver's watch cache answers.

Pods come from the registry (`apply_registry`, on every reload): a new
workload is ADDED, a changed one MODIFIED, a removed one DELETED. What
clients changed through the API survives a reload of a pod that is still
there: the status the node reported with PATCH .../status and the labels
and annotations patched in. A pod deleted through the API stays deleted
until its registry entry changes (or leaves and comes back), as a pod
without a controller to recreate it would.

Nothing here does I/O or reads a clock: `now` is an RFC 3339 string given
by the caller; listeners are plain callables the server registers.

Objects are never changed in place once stored: a change makes a new object
(sharing what did not change), so `get`, `list_objects` and events hand out
the stored objects themselves, without copying; callers must not change them.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from istiod_local.controlplane.kubeapi import errors
from istiod_local.controlplane.kubeapi.changes import OBJECT_SIZE_GUESS, WatchEvent, bookmark, filter_event, matches
from istiod_local.controlplane.kubeapi.objects import (
    apply_overrides,
    check_preconditions,
    diff_map,
    without_resource_version,
)
from istiod_local.controlplane.kubeapi.podpatch import PatchedPod, patch_pod_object
from istiod_local.controlplane.kubeapi.pods import (
    DEFAULT_HOST_IP,
    PodMeta,
    render_inputs,
    render_namespace,
    render_pod,
)
from istiod_local.controlplane.kubeapi.resources import (
    BY_KEY,
    ENDPOINTSLICES,
    MAX_OBJECTS_PER_TYPE,
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
)
from istiod_local.controlplane.kubeapi.selectors import FieldSelector, LabelSelector
from istiod_local.controlplane.kubeapi.services import derived_objects, refreshed_slices
from istiod_local.controlplane.xds.registry import Registry, Workload

__all__ = ["NAMESPACES", "PODS", "KubeStore", "StaleObject", "WatchEvent", "bookmark", "filter_event", "matches"]
# Namespaces every cluster has, whether or not the registry names them.
BUILTIN_NAMESPACES = ("default", "istio-system", "kube-system")
DEFAULT_HISTORY = 1000
DEFAULT_HISTORY_BYTES = 4 * 1024 * 1024

Key = tuple[str, str]  # (namespace, name); namespace "" for namespaces


@dataclass
class _Entry:
    rendered: dict[str, Any]  # what the registry says, without resourceVersion
    current: dict[str, Any]  # what is served
    workload: Workload | None = None
    inputs: Any = None  # what `rendered` was rendered from (the same inputs need no new rendering)
    status_override: dict[str, Any] | None = None
    label_overrides: dict[str, str | None] = field(default_factory=dict)
    annotation_overrides: dict[str, str | None] = field(default_factory=dict)
    from_registry: bool = True  # False: a client created it (a reload of the registry leaves it alone)


class StaleObject(Exception):
    """The object changed between working a patch out and committing it."""


class KubeStore:
    """Every served object, the resourceVersions and the change log.

    The registry owns pods, namespaces, Services, EndpointSlices and Nodes (`apply_registry`); clients own
    what they create (`create`, `replace`, `commit_object`, `delete`: ConfigMaps, Leases, ...)."""

    def __init__(self, default_node: str, host_ip: str = DEFAULT_HOST_IP, history: int = DEFAULT_HISTORY,
                 first_version: int = 1, history_bytes: int = DEFAULT_HISTORY_BYTES) -> None:
        """`first_version`: where resourceVersions start. The server starts them from the clock (in
        microseconds), so that they never go back across a restart: a watch resuming from a version of
        an earlier run is older than anything here and gets 410 Expired (its client lists again),
        instead of silently waiting for versions it has already seen."""
        if history < 1:
            raise ValueError(f"watch history must be at least 1 event, got {history}")
        if first_version < 1:
            raise ValueError(f"resourceVersions start at 1 or later, got {first_version}")
        self.default_node = default_node
        self.host_ip = host_ip
        self._rv = first_version
        self._entries: dict[str, dict[Key, _Entry]] = {t: {} for t in BY_KEY}
        self._log: deque[WatchEvent] = deque()
        self._history = history
        self._history_bytes = history_bytes
        self._logged_bytes = 0
        # The newest resourceVersion no longer in the log (at first: all before this store existed).
        self._compacted = first_version - 1
        self._incarnations: dict[Key, int] = {}
        self._tombstones: dict[Key, Workload] = {}
        self._listeners: list[Callable[[WatchEvent], None]] = []
        self._registry = Registry()
        self._now = ""  # the time of the last change a caller dated (for objects rendered as a side effect)

    # ---- reading --------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    @staticmethod
    def key(resource: str, namespace: str, name: str) -> Key:
        return (namespace if BY_KEY[resource].namespaced else "", name)

    def count(self, resource: str) -> int:
        return len(self._entries[resource])

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        entry = self._entries[resource].get(self.key(resource, namespace, name))
        if entry is None:
            raise errors.not_found(resource, name)
        return entry.current

    def list_objects(self, resource: str, namespace: str = "", labels: LabelSelector | None = None,
             fields: FieldSelector | None = None) -> tuple[list[dict[str, Any]], int]:
        """Matching objects, sorted by namespace and name, and the collection's resourceVersion."""
        out = []
        for (ns, _), entry in sorted(self._entries[resource].items()):
            if namespace and ns != namespace:
                continue
            if matches(entry.current, labels, fields):
                out.append(entry.current)
        return out, self._rv

    def watch_start(self, resource: str, resource_version: str) -> list[WatchEvent]:
        """The events a new watch begins with: synthetic ADDED for "" and "0", else the log after that RV.

        Raises ApiError 410 when the RV is older than the log keeps, 400 when it is not a number.
        """
        if resource_version in ("", "0"):
            return [WatchEvent("ADDED", resource, e.current, int(e.current["metadata"]["resourceVersion"]))
                    for _, e in sorted(self._entries[resource].items())]
        try:
            since = int(resource_version)
        except ValueError:
            raise errors.bad_request(f'invalid resource version "{resource_version}"') from None
        if since < self._compacted:
            raise errors.expired(since, self._compacted + 1)
        return [e for e in self._log if e.resource == resource and e.resource_version > since]

    def subscribe(self, listener: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Call `listener` with every change from now on; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # ---- changes --------------------------------------------------------------------------------

    def _emit(self, kind: str, resource: str, obj: dict[str, Any], previous: dict[str, Any] | None = None,
              size: int = OBJECT_SIZE_GUESS) -> None:
        event = WatchEvent(kind, resource, obj, self._rv, previous, size)
        self._log.append(event)
        self._logged_bytes += size
        while len(self._log) > 1 and (len(self._log) > self._history or self._logged_bytes > self._history_bytes):
            dropped = self._log.popleft()
            self._compacted = dropped.resource_version
            self._logged_bytes -= dropped.size
        for listener in list(self._listeners):
            listener(event)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A new version of `obj` (shallow: what it shares with `obj` is never changed in place)."""
        self._rv += 1
        out = dict(obj)
        out["metadata"] = {**obj["metadata"], "resourceVersion": str(self._rv)}
        return out

    def _uid(self, resource: str, key: Key) -> str:
        incarnation = self._incarnations.get(self._ident(resource, key), 0)
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"istiod-local:{resource}/{key[0]}/{key[1]}/{incarnation}"))

    def apply_registry(self, registry: Registry, now: str) -> list[WatchEvent]:
        """Bring pods and namespaces in line with a (re)loaded registry; the events it caused."""
        first_rv = self._rv
        names = set(BUILTIN_NAMESPACES) | {w.namespace for w in registry.workloads} \
            | {s.namespace for s in registry.services} | set(registry.namespaces)
        namespaces: dict[Key, tuple[dict[str, Any], Workload | None, Any]] = {}
        for name in names:
            existing = self._entries[NAMESPACES].get(("", name))
            uid, created = ((existing.current["metadata"]["uid"], existing.current["metadata"]["creationTimestamp"])
                            if existing is not None else (self._uid(NAMESPACES, ("", name)), now))
            namespaces["", name] = (render_namespace(name, registry.namespaces.get(name, {}), uid, created), None,
                                    None)
        self._sync(NAMESPACES, namespaces)
        pods: dict[Key, tuple[dict[str, Any], Workload | None, Any]] = {}
        for workload in registry.workloads:
            key = (workload.namespace, workload.name)
            entry = self._entries[PODS].get(key)
            if entry is None and self._tombstones.get(key) == workload:
                continue  # deleted through the API and unchanged since
            self._tombstones.pop(key, None)
            inputs = render_inputs(registry, workload)
            if entry is not None and entry.inputs == inputs:
                pods[key] = (entry.rendered, workload, inputs)
                continue
            if entry is not None:
                meta = PodMeta(entry.current["metadata"]["uid"], entry.current["metadata"]["creationTimestamp"],
                               self.default_node, self.host_ip)
            else:
                meta = PodMeta(self._uid(PODS, key), now, self.default_node, self.host_ip)
            pods[key] = (render_pod(registry, workload, meta), workload, inputs)
        wanted = {(w.namespace, w.name) for w in registry.workloads}
        self._tombstones = {k: w for k, w in self._tombstones.items() if k in wanted}
        self._sync(PODS, pods)
        self._registry, self._now = registry, now
        self._sync_derived()
        return [e for e in self._log if e.resource_version > first_rv]

    def _dated(self, resource: str, key: Key) -> tuple[str, str]:
        """The uid and creationTimestamp of the object at `key`: kept if there is one, else new."""
        existing = self._entries[resource].get(key)
        if existing is not None:
            return existing.current["metadata"].get("uid", ""), existing.current["metadata"].get(
                "creationTimestamp", self._now)
        return self._uid(resource, key), self._now

    def _sync_derived(self) -> None:
        """Services, EndpointSlices and Nodes, as a cluster's controllers keep them for the registry and the
        pods served now (a pod's readiness, reported through pods/status, moves its endpoint)."""
        pods = [e.current for e in self._entries[PODS].values()]
        derived = derived_objects(self._registry, pods, self._dated, self.default_node, self.host_ip)
        for resource in (SERVICES, ENDPOINTSLICES, NODES):
            self._sync(resource, {key: (obj, None, None) for key, obj in derived[resource].items()})

    def _refresh_endpoints(self, *changed: dict[str, Any]) -> None:
        """The EndpointSlices of the services that select a changed pod (as it was or is now): what a pod's
        patch or delete moves, without rendering every service's slice again."""
        slices = refreshed_slices(self._registry, changed, self._entries[PODS], self._dated)
        if slices:
            self._sync(ENDPOINTSLICES, {key: (obj, None, None) for key, obj in slices.items()}, prune=False)

    def _sync(self, resource: str, desired: dict[Key, tuple[dict[str, Any], Workload | None, Any]],
              prune: bool = True) -> None:
        """Make the registry's objects of `resource` what `desired` says; `prune`: and remove the others."""
        entries = self._entries[resource]
        for key in sorted(set(entries) - set(desired) if prune else ()):
            if not entries[key].from_registry:
                continue
            entry = entries.pop(key)
            self._forget(resource, key)
            self._emit("DELETED", resource, self._stamp(entry.current))
        for key in sorted(desired):
            rendered, workload, inputs = desired[key]
            found = entries.get(key)
            if found is not None and not found.from_registry:  # the registry takes over what a client made
                entries[key] = _Entry(rendered, self._stamp(rendered), workload, inputs)
                self._emit("MODIFIED", resource, entries[key].current, found.current)
                continue
            if found is None:
                entries[key] = _Entry(rendered, self._stamp(rendered), workload, inputs)
                self._emit("ADDED", resource, entries[key].current)
                continue
            entry = found
            entry.workload, entry.inputs = workload, inputs
            if rendered == entry.rendered:
                continue
            entry.rendered = rendered
            served = dict(rendered)
            meta = served["metadata"] = dict(rendered["metadata"])
            if entry.label_overrides:
                meta["labels"] = apply_overrides(meta.get("labels"), entry.label_overrides)
            if entry.annotation_overrides:
                meta["annotations"] = apply_overrides(meta.get("annotations"), entry.annotation_overrides)
            if entry.status_override is not None:
                served["status"] = entry.status_override
            previous = entry.current
            if without_resource_version(served) == without_resource_version(previous):
                continue
            entry.current = self._stamp(served)
            self._emit("MODIFIED", resource, entry.current, previous)

    @staticmethod
    def _ident(resource: str, key: Key) -> Key:
        if resource == PODS:
            return key
        return ("#ns", key[1]) if resource == NAMESPACES else (f"#{resource}/{key[0]}", key[1])

    def _forget(self, resource: str, key: Key) -> None:
        ident = self._ident(resource, key)
        self._incarnations[ident] = self._incarnations.get(ident, 0) + 1

    def patch_pod(self, namespace: str, name: str, content_type: str, body: Any,
                  subresource: str = "", field_validation: str = "Warn") -> dict[str, Any]:
        """PATCH pods/{name} or pods/{name}/status; the new object (unchanged RV when nothing changed).

        In one step, on the caller's thread; the server works the patch out off its loop (`podpatch`) and
        commits it here with `commit_patch`."""
        old = self.get(PODS, namespace, name)
        return self.commit_patch(namespace, name, old, patch_pod_object(old, name, content_type, body, subresource,
                                                                         field_validation), subresource)

    def commit_patch(self, namespace: str, name: str, old: dict[str, Any], patched: PatchedPod,
                     subresource: str = "", before_emit: Callable[[dict[str, Any]], None] | None = None
                     ) -> dict[str, Any]:
        """Store `patched`, worked out from `old`; StaleObject when the pod changed since (work it out again).

        `before_emit` sees the stored object before listeners hear of it."""
        entry = self._entries[PODS].get((namespace, name))
        if entry is None:
            raise errors.not_found(PODS, name)
        if entry.current is not old:
            raise StaleObject(name)
        if patched.unchanged:
            return old
        result = patched.object
        old_meta, meta = old["metadata"], result["metadata"]
        entry.label_overrides.update(diff_map(old_meta.get("labels") or {}, meta.get("labels") or {}))
        entry.annotation_overrides.update(diff_map(old_meta.get("annotations") or {},
                                                    meta.get("annotations") or {}))
        if subresource == "status" and result.get("status") != old.get("status"):
            entry.status_override = result.get("status")
        entry.current = self._stamp(result)
        if before_emit is not None:
            before_emit(entry.current)
        self._emit("MODIFIED", PODS, entry.current, old, max(len(patched.template), OBJECT_SIZE_GUESS))
        self._refresh_endpoints(old, entry.current)
        return entry.current

    def delete_pod(self, namespace: str, name: str, uid: str | None = None,
                   resource_version: str | None = None) -> dict[str, Any]:
        """DELETE with DeleteOptions' preconditions; the object as deleted."""
        key = (namespace, name)
        entry = self._entries[PODS].get(key)
        if entry is None:
            raise errors.not_found(PODS, name)
        check_preconditions(PODS, entry.current, uid, resource_version)
        del self._entries[PODS][key]
        self._forget(PODS, key)
        if entry.workload is not None:
            self._tombstones[key] = entry.workload
        final = self._stamp(entry.current)
        self._emit("DELETED", PODS, final)
        self._refresh_endpoints(final)
        return final

    # ---- objects clients own ----------------------------------------------------------------------

    def create(self, resource: str, obj: dict[str, Any], now: str, size: int = OBJECT_SIZE_GUESS) -> dict[str, Any]:
        """Store a new object (named, namespaced and checked by the caller: `objects.new_object`)."""
        meta = obj["metadata"]
        key = self.key(resource, meta.get("namespace", ""), meta["name"])
        entries = self._entries[resource]
        if key in entries:
            raise errors.already_exists(resource, meta["name"])
        if len(entries) >= MAX_OBJECTS_PER_TYPE:
            raise errors.quota_exceeded(resource, meta["name"], MAX_OBJECTS_PER_TYPE)
        self._now = now
        stored = dict(obj)
        stored["metadata"] = {**meta, "uid": self._uid(resource, key), "creationTimestamp": now}
        entry = _Entry(stored, self._stamp(stored), from_registry=False)
        entries[key] = entry
        self._emit("ADDED", resource, entry.current, size=size)
        return entry.current

    def commit_object(self, resource: str, old: dict[str, Any], new: dict[str, Any],
                      size: int = OBJECT_SIZE_GUESS) -> dict[str, Any]:
        """Replace `old` (as read) by `new` (an update or a patch worked out from it); StaleObject when the
        object changed since, the old object itself when nothing changed."""
        meta = old["metadata"]
        entry = self._entries[resource].get(self.key(resource, meta.get("namespace", ""), meta["name"]))
        if entry is None:
            raise errors.not_found(resource, meta["name"])
        if entry.current is not old:
            raise StaleObject(meta["name"])
        if without_resource_version(new) == without_resource_version(old):
            return old
        entry.current = self._stamp(new)  # on a registry object: until the registry renders it differently
        self._emit("MODIFIED", resource, entry.current, old, size)
        return entry.current

    def delete(self, resource: str, namespace: str, name: str, uid: str | None = None,
               resource_version: str | None = None) -> dict[str, Any]:
        """DELETE of an object clients own, with DeleteOptions' preconditions (pods: `delete_pod`)."""
        if resource == PODS:
            return self.delete_pod(namespace, name, uid, resource_version)
        key = self.key(resource, namespace, name)
        entry = self._entries[resource].get(key)
        if entry is None:
            raise errors.not_found(resource, name)
        check_preconditions(resource, entry.current, uid, resource_version)
        del self._entries[resource][key]
        self._forget(resource, key)
        final = self._stamp(entry.current)
        self._emit("DELETED", resource, final)
        return final


