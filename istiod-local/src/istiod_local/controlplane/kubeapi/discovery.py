"""Discovery documents and server-side tables, as kubectl reads them (pure).

kubectl finds resources through `/api` and `/api/v1` (the legacy discovery
documents; it asks for the aggregated form first and falls back when the
answer is plain `application/json`) and `/apis` (the groups of `resources.TYPES`). `kubectl
get` asks for a `meta.k8s.io/v1` `Table` so the server decides the columns;
`table()` renders the apiserver's columns for pods and namespaces.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from istiod_local.controlplane.kubeapi import resources

KUBE_VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "istiod-local",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0",
                "compiler": "gc", "platform": "linux/amd64"}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def api_group_list() -> dict[str, Any]:
    """`/apis`: every group served, each with its one version."""
    out = []
    for group, types in resources.groups().items():
        version = {"groupVersion": f"{group}/{types[0].version}", "version": types[0].version}
        out.append({"name": group, "versions": [version], "preferredVersion": version})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}


def _entry(rtype: resources.ResourceType) -> dict[str, Any]:
    out: dict[str, Any] = {"name": rtype.plural, "singularName": rtype.singular, "namespaced": rtype.namespaced,
                           "kind": rtype.kind, "verbs": sorted(rtype.verbs)}
    if rtype.short_names:
        out["shortNames"] = list(rtype.short_names)
    if rtype.key == "pods":
        out["categories"] = ["all"]
    return out


def api_resource_list() -> dict[str, Any]:
    """`/api/v1`."""
    items = [_entry(t) for t in resources.core_types()]
    items.append({"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod",
                  "verbs": ["get", "patch"]})
    return {"kind": "APIResourceList", "groupVersion": "v1", "resources": sorted(items, key=lambda i: i["name"])}


def group_resource_list(group: str, version: str) -> dict[str, Any] | None:
    """`/apis/{group}/{version}`; None for a group or version not served."""
    types = [t for t in resources.groups().get(group, []) if t.version == version]
    if not types:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
            "resources": [_entry(t) for t in types]}


def group_document(group: str) -> dict[str, Any] | None:
    """`/apis/{group}`."""
    for entry in api_group_list()["groups"]:
        if entry["name"] == group:
            return {"kind": "APIGroup", "apiVersion": "v1", **entry}
    return None


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a meta.k8s.io/v1 Table first (v1beta1 tables are served as v1)."""
    for item in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip() for p in item.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
    return False


def _parse_time(text: str) -> float | None:
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    except (TypeError, ValueError):
        return None


def human_duration(seconds: float) -> str:
    """Kubernetes' HumanDuration (the AGE column): 45s, 5m10s, 3h4m, 2d5h, ..."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // (24 * 365)}y"


def _age(obj: dict[str, Any], now: float) -> str:
    created = _parse_time(obj.get("metadata", {}).get("creationTimestamp", ""))
    return "<unknown>" if created is None else human_duration(now - created)


def _pod_cells(pod: dict[str, Any], now: float) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for init in status.get("initContainerStatuses") or []:
        terminated = (init.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            reason = f"Init:{terminated.get('reason') or 'Error'}"
            break
        waiting = (init.get("state") or {}).get("waiting")
        if waiting:
            reason = f"Init:{waiting.get('reason') or 'Waiting'}"
            break
    else:
        for container in statuses:
            waiting = (container.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason"):
                reason = waiting["reason"]
    total = len(spec.get("containers") or [])
    return [pod["metadata"]["name"], f"{ready}/{total}", reason, str(restarts), _age(pod, now),
            status.get("podIP") or "<none>", spec.get("nodeName") or "<none>",
            status.get("nominatedNodeName") or "<none>", "<none>"]


_POD_COLUMNS = [("Name", "string", "name", 0), ("Ready", "string", "", 0), ("Status", "string", "", 0),
                ("Restarts", "string", "", 0), ("Age", "string", "", 0), ("IP", "string", "", 1),
                ("Node", "string", "", 1), ("Nominated Node", "string", "", 1), ("Readiness Gates", "string", "", 1)]
_NAME_AGE_COLUMNS = [("Name", "string", "name", 0), ("Age", "string", "", 0)]
_NAMESPACE_COLUMNS = [("Name", "string", "name", 0), ("Status", "string", "", 0), ("Age", "string", "", 0)]


def _columns(spec: list[tuple[str, str, str, int]]) -> list[dict[str, Any]]:
    return [{"name": name, "type": kind, "format": fmt, "description": "", "priority": priority}
            for name, kind, fmt, priority in spec]


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(resource: str, objects: Iterable[dict[str, Any]], resource_version: str, now: float,
          include_object: str = "Metadata", columns: bool = True) -> dict[str, Any]:
    """A `Table` with the apiserver's columns (pods, namespaces; name and age for the rest), `includeObject`
    honoured."""
    rows = []
    for obj in objects:
        if resource == "pods":
            cells = _pod_cells(obj, now)
        elif resource == "namespaces":
            cells = [obj["metadata"]["name"], (obj.get("status") or {}).get("phase", ""), _age(obj, now)]
        else:
            cells = [obj["metadata"]["name"], _age(obj, now)]
        row: dict[str, Any] = {"cells": cells}
        row_object = _row_object(obj, include_object)
        if row_object is not None:
            row["object"] = row_object
        rows.append(row)
    out: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                           "metadata": {"resourceVersion": resource_version}}
    if columns:
        out["columnDefinitions"] = _columns(_POD_COLUMNS if resource == "pods" else _NAMESPACE_COLUMNS
                                            if resource == "namespaces" else _NAME_AGE_COLUMNS)
    out["rows"] = rows
    return out
