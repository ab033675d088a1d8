"""API errors as a kube-apiserver writes them: a `Status` object with the HTTP code (pure).

Clients (client-go, the Python client, kubectl) decide by `reason` and
`code`, and show `message`, so both follow the apiserver's wording:
`pods "x" not found`, `pods "x" is forbidden: User "..." cannot get resource
"pods" in API group "" in the namespace "ns"`, `Operation cannot be
fulfilled on pods "x": ...`.
"""

from __future__ import annotations

from typing import Any

from istiod_local.controlplane.kubeapi import validation

# Kind in a 403/404/409 Status' details is the resource (plural), as the apiserver writes it (a 422's is the kind).
REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
           406: "NotAcceptable", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge",
           415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError"}


class ApiError(Exception):
    """An error response: `status()` is its body, `code` its HTTP status."""

    def __init__(self, code: int, message: str, reason: str | None = None, name: str | None = None,
                 kind: str | None = None, causes: list[dict[str, str]] | None = None, group: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "")
        self.name = name
        self.kind = kind
        self.causes = causes
        self.group = group

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason}
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if details:
            body["details"] = details
        body["code"] = self.code
        return body


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized")


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, f'{resource} "{name}" not found', name=name, kind=resource)


def forbidden(user: str, verb: str, resource: str, name: str, namespace: str, group: str = "") -> ApiError:
    """The RBAC denial, worded as the apiserver words it (with or without a name, a namespace, a group)."""
    base = resource.split("/", 1)[0]
    qualified = f"{base}.{group}" if group else base
    subject = f'{qualified} "{name}"' if name else qualified
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    message = (f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group '
               f'"{group}" {scope}')
    return ApiError(403, message, name=name or None, kind=base, group=group)


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {resource} "{name}": {why}', name=name, kind=resource)


def modified_conflict(resource: str, name: str) -> ApiError:
    return conflict(resource, name, "the object has been modified; please apply your changes to the latest "
                                    "version and try again")


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, f"too old resource version: {requested} ({oldest})", reason="Expired")


def method_not_allowed(method: str) -> ApiError:
    return ApiError(405, f"the server does not allow this method on the requested resource ({method})",
                    reason="MethodNotAllowed")


def invalid(kind: str, name: str, message: str, resource: str = "pods",
            causes: list[dict[str, str]] | None = None) -> ApiError:
    return ApiError(422, f'{kind} "{name}" is invalid: {message}', name=name, kind=resource, causes=causes)


def invalid_fields(kind: str, name: str, found: list[validation.FieldError]) -> ApiError:
    """422 for failed field rules, as the apiserver's NewInvalid builds it (details name the kind, not the
    resource, and list each rule as a cause)."""
    return ApiError(422, f'{kind} "{name}" is invalid: {validation.aggregate(found)}', name=name, kind=kind,
                    causes=[e.cause() for e in found])


def already_exists(resource: str, name: str) -> ApiError:
    """`resource` as the apiserver names it in messages: `configmaps`, `leases.coordination.k8s.io`."""
    return ApiError(409, f'{resource} "{name}" already exists', reason="AlreadyExists", name=name, kind=resource)


def quota_exceeded(resource: str, name: str, limit: int) -> ApiError:
    """Too many objects of one type: refused as a ResourceQuota refuses a create (403)."""
    return ApiError(403, f'{resource} "{name}" is forbidden: exceeded quota: istiod-local, '
                         f'requested: count/{resource}=1, limited: count/{resource}={limit}', reason="Forbidden",
                    name=name, kind=resource)
