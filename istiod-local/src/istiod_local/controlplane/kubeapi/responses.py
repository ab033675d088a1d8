"""The API's answers as HTTP responses: JSON bodies, `Status` errors, and the edge's refusals worded as the
apiserver words them (a body over the limit is `Request entity too large: limit is 3145728`)."""

from __future__ import annotations

from typing import Any

from istio_agent.httpio.server_core import Malformed, Response
from istiod_local.controlplane.kubeapi import errors
from istiod_local.controlplane.kubeapi.watch import dumps

JSON = "application/json"


def json_response(body: bytes | Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
    """`body` as JSON (bytes are sent as they are: an object's shared encoding)."""
    data = body if isinstance(body, bytes) else dumps(body)
    return Response(status, data, [("Content-Type", JSON), *(headers or [])])


def status_response(exc: errors.ApiError) -> Response:
    """The error's Status; a 429 says when to retry, as the apiserver's inflight limit does."""
    return json_response(exc.status(), exc.code, [("Retry-After", "1")] if exc.code == 429 else None)


def refusal(exc: Malformed) -> Response:
    """A request the HTTP edge refused before any handler saw it."""
    if exc.status == 413 and exc.limit is not None:
        return status_response(errors.ApiError(413, f"Request entity too large: limit is {exc.limit}"))
    if exc.status == 408:
        return status_response(errors.ApiError(408, f"Timeout: {exc.reason}", reason="Timeout"))
    return status_response(errors.ApiError(exc.status, exc.reason, reason="BadRequest"))
