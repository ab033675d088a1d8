"""A PATCH of a Pod worked out from the stored object alone, without the store (pure).

The work is CPU-bound and grows with the object (apply the patch, check the
result against the Pod's schema, encode it), so the server runs it off the
event loop that also serves xDS and the CA, and only the commit (a new
resourceVersion, the watch event) happens on the loop. Everything here reads
the stored object, which is never changed in place, and builds a new one.

The apiserver's bounds apply: a JSON patch's operations and copies
(`patch.PatchLimits`), a stored object's encoded size (etcd's 1.5 MiB request
limit, `OBJECT_MAX_BYTES`; 413 naming it), nesting (`jsonbody.MAX_DEPTH`).
Fields a Pod does not have are dropped, with a warning unless
`fieldValidation=Ignore`, or refused with `fieldValidation=Strict`; values of
the wrong type are refused (`schema`).
"""

from __future__ import annotations

import copy
import json
import secrets
from dataclasses import dataclass
from typing import Any

from istiod_local.controlplane.kubeapi import errors, jsonbody, schema, validation
from istiod_local.controlplane.kubeapi.patch import PatchError, PatchLimits, PatchTooLarge, apply_patch
from istiod_local.controlplane.kubeapi.resources import OBJECT_MAX_BYTES

FIELD_VALIDATION = ("Ignore", "Warn", "Strict")
SPEC_CHANGE = ("spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
               "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
               "to existing tolerations)")


@dataclass(frozen=True)
class PatchedPod:
    """The new Pod (its resourceVersion still the old one), its JSON with a placeholder for the new one, and the
    warnings for the response; `unchanged` when the patch changed nothing."""

    object: dict[str, Any]
    template: bytes
    placeholder: bytes
    warnings: tuple[str, ...] = ()
    unchanged: bool = False

    def encoded(self, resource_version: str) -> bytes:
        """The committed object's JSON: the template with its resourceVersion."""
        return self.template.replace(self.placeholder, json.dumps(resource_version).encode(), 1)


def check_field_validation(value: str) -> str:
    """The `fieldValidation` query parameter ("" is the apiserver's default, Warn); 422 for another value."""
    if value in ("", *FIELD_VALIDATION):
        return value or "Warn"
    raise errors.ApiError(422, f'PatchOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: '
                               f'{json.dumps(value)}: supported values: "", "Ignore", "Strict", "Warn"',
                          kind="PatchOptions", name="")


def _spec_without_images(spec: Any) -> Any:
    """A pod's spec with what the apiserver lets an update change (images, activeDeadlineSeconds) blanked."""
    out = copy.deepcopy(spec) if isinstance(spec, dict) else spec
    if isinstance(out, dict):
        out.pop("activeDeadlineSeconds", None)
        out.pop("tolerations", None)
        for key in ("containers", "initContainers", "ephemeralContainers"):
            for container in out.get(key) or []:
                if isinstance(container, dict):
                    container.pop("image", None)
    return out


def _applied(old: dict[str, Any], name: str, content_type: str, body: Any, limits: PatchLimits) -> dict[str, Any]:
    try:
        result = apply_patch(content_type, old, body, limits)
    except PatchTooLarge as exc:
        raise errors.ApiError(413, f"Request entity too large: {exc}") from None
    except PatchError as exc:
        if str(exc).startswith("the body of the request was in an unknown format"):
            raise errors.ApiError(415, str(exc)) from None
        raise errors.invalid("Pod", name, str(exc)) from None
    if not isinstance(result, dict) or not isinstance(result.get("metadata", {}), dict):
        raise errors.invalid("Pod", name, "the patched object is not a Pod")
    if jsonbody.depth(result) > jsonbody.MAX_DEPTH:
        raise errors.invalid("Pod", name, f"the patched object nests deeper than {jsonbody.MAX_DEPTH} levels")
    return result


def _checked(result: dict[str, Any], name: str, field_validation: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The result with the fields a Pod lacks dropped, and the warnings to give; 422 for wrong types, and for
    unknown fields under Strict."""
    checked = schema.check(result)
    if checked.mismatches:
        found = [validation.FieldError(m.field, "FieldValueTypeInvalid", f"Invalid value: {m.got}: must be "
                                                                          f"{m.expected}") for m in checked.mismatches]
        raise errors.invalid_fields("Pod", name, found)
    unknown = tuple(f'unknown field "{path}"' for path in checked.unknown)
    if unknown and field_validation == "Strict":
        raise errors.invalid("Pod", name, f"patch: strict decoding error: {', '.join(unknown)}")
    return checked.object, unknown if field_validation == "Warn" else ()


def patch_pod_object(old: dict[str, Any], name: str, content_type: str, body: Any, subresource: str = "",
                     field_validation: str = "Warn", limits: PatchLimits = PatchLimits(),
                     max_bytes: int = OBJECT_MAX_BYTES) -> PatchedPod:
    """PATCH pods/{name} (or its status) of the stored `old`; ApiError for what the apiserver refuses."""
    result = _applied(old, name, content_type, body, limits)
    # The patch shares untouched parts with `old`: copy what is changed here.
    result = dict(result)
    meta = result["metadata"] = dict(result.get("metadata") or {})
    wanted_rv = meta.get("resourceVersion")
    if wanted_rv not in (None, "") and str(wanted_rv) != old["metadata"]["resourceVersion"]:
        raise errors.modified_conflict("pods", name)
    for key in ("name", "namespace", "uid", "creationTimestamp"):
        if meta.get(key) != old["metadata"].get(key):
            raise errors.invalid("Pod", name, f"metadata.{key}: Invalid value: field is immutable")
    result["apiVersion"], result["kind"] = "v1", "Pod"
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and (not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())):
            raise errors.invalid("Pod", name, f"metadata.{key}: Invalid value: must map strings to strings")
    result, warnings = _checked(result, name, field_validation)
    meta = result["metadata"] = dict(result["metadata"])
    found = validation.check_labels(meta.get("labels") or {}) + validation.check_annotations(meta.get("annotations")
                                                                                             or {})
    if found:
        raise errors.invalid_fields("Pod", name, found)
    if subresource == "status":
        result["spec"] = old.get("spec")
    else:
        result["status"] = old.get("status")
        if _spec_without_images(result.get("spec")) != _spec_without_images(old.get("spec")):
            raise errors.invalid("Pod", name, SPEC_CHANGE)
    meta["resourceVersion"] = old["metadata"]["resourceVersion"]
    if result == old:
        return PatchedPod(old, b"", b"", warnings, unchanged=True)
    placeholder = secrets.token_hex(16)
    template = json.dumps({**result, "metadata": {**meta, "resourceVersion": placeholder}},
                          separators=(",", ":")).encode()
    if len(template) > max_bytes:
        raise errors.ApiError(413, f"Request entity too large: limit is {max_bytes}: the patched Pod would be "
                                   f"{len(template)} bytes (one object is stored in at most {max_bytes} bytes, "
                                   f"etcd's request limit)", reason="RequestEntityTooLarge")
    return PatchedPod(result, template, json.dumps(placeholder).encode(), warnings)
