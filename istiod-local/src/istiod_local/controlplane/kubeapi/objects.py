"""Create, update and patch of stored objects, worked out as the apiserver's generic registry does (pure).

What a client sends is checked and shaped here; the store numbers and keeps
the result. The rules are the ones every type shares:

- the body's `kind` and `apiVersion`, when given, must be the type's;
- a create names the object (`metadata.name`, or `generateName` plus five
  characters of Kubernetes' alphabet), a DNS-1123 subdomain; a namespaced
  one lands in the path's namespace (a different `metadata.namespace` is 400);
- labels and annotations follow the same rules as on pods (`validation`);
- an update (PUT) names the same object; a `resourceVersion` in it must be
  the stored one (else 409, the optimistic-concurrency conflict clients retry
  on), and `uid` and `creationTimestamp` stay the stored ones;
- a patch is applied to the stored object (merge, JSON patch, strategic merge
  as a merge with the merge keys the pod patch knows), then checked as an
  update; server-side apply (`apply-patch+yaml`) is refused with 415, as an
  apiserver without that feature answers;
- no stored object is larger than etcd stores (1.5 MiB encoded): 413.

The small map and precondition helpers at the end are shared with the store's
pods (patched labels and annotations kept over registry reloads).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from istiod_local.controlplane.kubeapi import errors, validation
from istiod_local.controlplane.kubeapi.patch import PatchError, PatchTooLarge, apply_patch
from istiod_local.controlplane.kubeapi.resources import OBJECT_MAX_BYTES, ResourceType
from istiod_local.controlplane.kubeapi.watch import dumps

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_SERVER_FIELDS = ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields")


def _kind_checked(rtype: ResourceType, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise errors.bad_request(f"the body of the request is not a {rtype.kind}")
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind not in (None, "", rtype.kind) or api_version not in (None, "", rtype.api_version):
        raise errors.bad_request(f"the API version in the data ({api_version}) does not match the expected API "
                                 f"version ({rtype.api_version})" if kind in (None, "", rtype.kind) else
                                 f"the kind in the data ({kind}) does not match the expected kind ({rtype.kind})")
    meta = body.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise errors.bad_request("metadata must be an object")
    out = dict(body)
    out.update(kind=rtype.kind, apiVersion=rtype.api_version)
    out["metadata"] = dict(meta)
    return out


def _checked_meta(rtype: ResourceType, obj: dict[str, Any], name: str) -> int:
    """Labels, annotations and size checked; the encoded size."""
    meta = obj["metadata"]
    found: list[validation.FieldError] = []
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in value.items()):
            raise errors.bad_request(f"metadata.{key} must be a map of strings")
        found += validation.check_labels(value) if key == "labels" else validation.check_annotations(value)
    if found:
        raise errors.invalid_fields(rtype.kind, name, found)
    size = len(dumps(obj))
    if size > OBJECT_MAX_BYTES:
        raise errors.ApiError(413, f"Request entity too large: limit is {OBJECT_MAX_BYTES}",
                              reason="RequestEntityTooLarge")
    return size


def _check_name(rtype: ResourceType, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise errors.invalid(rtype.kind, "", "metadata.name: Required value: name or generateName is required",
                             resource=rtype.key)
    if len(name) > 253 or not _SUBDOMAIN.match(name):
        raise errors.invalid(rtype.kind, name, f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 '
                             "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
                             "start and end with an alphanumeric character", resource=rtype.key)
    return name


def new_object(rtype: ResourceType, namespace: str, body: Any) -> tuple[dict[str, Any], int]:
    """The object a POST creates (without uid, creationTimestamp and resourceVersion: the store sets them) and
    its encoded size."""
    obj = _kind_checked(rtype, body)
    meta = obj["metadata"]
    name = meta.get("name")
    if not name and isinstance(meta.get("generateName"), str) and meta["generateName"]:
        name = meta["generateName"] + "".join(secrets.choice(_SUFFIX_CHARS) for _ in range(5))
    meta["name"] = _check_name(rtype, name)
    _place(rtype, meta, namespace)
    for key in _SERVER_FIELDS:
        meta.pop(key, None)
    return obj, _checked_meta(rtype, obj, meta["name"])


def _place(rtype: ResourceType, meta: dict[str, Any], namespace: str) -> None:
    if not rtype.namespaced:
        meta.pop("namespace", None)
        return
    given = meta.get("namespace")
    if given not in (None, "", namespace):
        raise errors.bad_request("the namespace of the provided object does not match the namespace sent on the "
                                 "request")
    meta["namespace"] = namespace


def updated_object(rtype: ResourceType, old: dict[str, Any], body: Any, namespace: str,
                   name: str) -> tuple[dict[str, Any], int]:
    """The object a PUT leaves (the body, with what the server owns kept from `old`) and its encoded size."""
    obj = _kind_checked(rtype, body)
    meta = obj["metadata"]
    if meta.get("name") not in (None, "", name):
        raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                                 f"({name})")
    meta["name"] = name
    _place(rtype, meta, namespace)
    given_rv = meta.get("resourceVersion")
    old_meta = old["metadata"]
    if given_rv not in (None, "") and str(given_rv) != old_meta.get("resourceVersion"):
        raise errors.modified_conflict(rtype.key, name)
    given_uid = meta.get("uid")
    if given_uid not in (None, "") and given_uid != old_meta.get("uid"):
        raise errors.conflict(rtype.key, name, f"Precondition failed: UID in precondition: {given_uid}, UID in "
                                               f"object meta: {old_meta.get('uid')}")
    for key in ("uid", "creationTimestamp"):
        if key in old_meta:
            meta[key] = old_meta[key]
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    return obj, _checked_meta(rtype, obj, name)


def patched_object(rtype: ResourceType, old: dict[str, Any], content_type: str, body: Any, namespace: str,
                   name: str) -> tuple[dict[str, Any], int]:
    """The object a PATCH leaves (the patch applied to `old`, then checked as an update)."""
    if content_type.split(";", 1)[0].strip().lower() == "application/apply-patch+yaml":
        raise errors.ApiError(415, "server-side apply is not served here: use a merge, strategic merge or JSON patch",
                              reason="UnsupportedMediaType")
    try:
        result = apply_patch(content_type, old, body)
    except PatchTooLarge as exc:
        raise errors.ApiError(413, str(exc), reason="RequestEntityTooLarge") from None
    except PatchError as exc:
        if str(exc).startswith("the body of the request was in an unknown format"):
            raise errors.ApiError(415, str(exc), reason="UnsupportedMediaType") from None
        raise errors.bad_request(str(exc)) from None
    if not isinstance(result, dict):
        raise errors.bad_request(f"the patch did not leave a {rtype.kind}")
    meta = result.get("metadata")
    if isinstance(meta, dict) and meta.get("resourceVersion") == old["metadata"].get("resourceVersion"):
        meta = dict(meta)
        meta.pop("resourceVersion")  # the stored one, carried along: no precondition
        result = {**result, "metadata": meta}
    return updated_object(rtype, old, result, namespace, name)


def diff_map(before: dict[str, str], after: dict[str, str]) -> dict[str, str | None]:
    """What a client changed in a label or annotation map (None: removed), kept over registry reloads."""
    out: dict[str, str | None] = {k: v for k, v in after.items() if before.get(k) != v}
    out.update({k: None for k in before if k not in after})
    return out


def apply_overrides(base: dict[str, str] | None, overrides: dict[str, str | None]) -> dict[str, str]:
    """A freshly rendered map with what clients changed in it applied again."""
    out = dict(base or {})
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def check_preconditions(resource: str, obj: dict[str, Any], uid: str | None, resource_version: str | None) -> None:
    """DeleteOptions' preconditions: 409 when the object is not the one the client meant."""
    meta = obj["metadata"]
    if uid and uid != meta.get("uid"):
        raise errors.conflict(resource, meta["name"], f"Precondition failed: UID in precondition: {uid}, "
                                                      f"UID in object meta: {meta.get('uid')}")
    if resource_version and resource_version != meta.get("resourceVersion"):
        raise errors.conflict(resource, meta["name"], f"Precondition failed: ResourceVersion in precondition: "
                                                      f"{resource_version}, ResourceVersion in object meta: "
                                                      f"{meta.get('resourceVersion')}")


def without_resource_version(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as compared for "did anything change" (a write that changes nothing keeps its version)."""
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return out
