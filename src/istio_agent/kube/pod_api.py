"""The repair controller's Kubernetes API client: pods listed, watched, patched and deleted through lightkube
(asyncio; chosen by `benchmarks/bench_kube_clients.py`).

Pods are decoded as plain JSON mappings (lightkube's generic resource, a `dict`), so the repair rules
(`cni/repair/rules.py`) read them as the API serves them and no typed model is built for every pod of the node.

lightkube's public client methods cover list, watch and patch but not everything upstream sends: a watch with
bookmarks (`allowWatchBookmarks`) and a delete with `DeleteOptions.preconditions`. Both go through lightkube's
`GenericAsyncClient` (its request builder, auth, TLS and decoding; `lightkube.core.generic_client`), with the
parameters or body upstream's client-go sends. Every failure surfaces as `KubeApiError` with the API's code,
reason and message, or code 0 for a transport failure.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
from lightkube import ALL_NS, ApiError, ConfigError, NotReadyError
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.generic_client import GenericAsyncClient, on_error_raise
from lightkube.generic_resource import create_namespaced_resource

from istio_agent.kube.access import KubeAccess

Pod = create_namespaced_resource("", "v1", "Pod", "pods")
Event = create_namespaced_resource("", "v1", "Event", "events")
LIST_PAGE = 500  # client-go's informers list in pages of this size


class KubeApiError(Exception):
    """A call the API refused (code, reason and message from its Status) or could not be made (code 0)."""

    def __init__(self, code: int, reason: str, message: str, unreachable: bool = False) -> None:
        super().__init__(f"{code} {reason}: {message}" if code else message)
        self.code, self.reason, self.message = code, reason, message
        self.unreachable = unreachable  # no connection could be made: the server may be restarting

    @property
    def expired(self) -> bool:
        """The resourceVersion asked for is too old (410 Gone / Expired): list again."""
        return self.code == 410


@dataclass(frozen=True)
class PodList:
    resource_version: str
    items: list[Mapping[str, Any]]


class PodApi:
    """Pods of every namespace, selected by label and field selectors, at the API `KubeAccess` names.

    The bearer token is read from `access.token_file` on first use and again whenever the API answers 401,
    so a token the kubelet rotated is picked up (lightkube's token-file auth, client-go's rule).
    """

    def __init__(self, access: KubeAccess, *, label_selector: str = "", field_selector: str = "",
                 timeout: float = 10.0) -> None:
        cluster = Cluster(server=access.server, insecure=True) if access.skip_tls_verify \
            else Cluster(server=access.server, certificate_auth=access.ca_file)
        config = KubeConfig.from_one(cluster=cluster, user=User(token_file=access.token_file))
        try:
            self._client = GenericAsyncClient(ConnectionParams(timeout=httpx.Timeout(timeout), trust_env=False),
                                              config=config)
        except (OSError, ConfigError) as exc:  # an unreadable CA file
            raise KubeApiError(0, "", f"CA file {access.ca_file}: {exc}") from None
        self._selectors = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector))
                           if v}

    async def list(self) -> PodList:
        """Every selected pod and the list's resourceVersion (to watch from)."""
        request = self._client.prepare_request("list", res=Pod, namespace=ALL_NS,
                                               params={**self._selectors, "limit": LIST_PAGE})
        listing = self._client.list(request)
        items: list[Mapping[str, Any]] = []
        async with _translated():
            async for item in listing:
                items.append(item)
        try:
            version = listing.resourceVersion
        except NotReadyError:  # the list had no resourceVersion
            version = ""
        return PodList(version, items)

    async def watch(self, resource_version: str, timeout_seconds: int) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        """(type, object) from `resource_version` on, bookmarks included; the server ends each request after
        `timeout_seconds` and lightkube asks again from the last version it saw. Any error ends the iteration
        with `KubeApiError` (an ERROR event carrying 410 included)."""
        request = self._client.prepare_request(
            "list", res=Pod, namespace=ALL_NS, watch=True,
            params={**self._selectors, "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                    "timeoutSeconds": timeout_seconds})
        async with _translated():
            async for kind, obj in self._client.watch(request, on_error=on_error_raise):
                yield kind, obj

    async def patch_status(self, namespace: str, name: str, body: bytes, content_type: str) -> None:
        """PATCH pods/{name}/status (what upstream uses to label: lower privilege than pods)."""
        request = self._client.prepare_request("patch", res=Pod.Status, name=name, namespace=namespace,
                                               obj=json.loads(body), headers={"Content-Type": content_type})
        await self._send(request)

    async def delete(self, namespace: str, name: str, options: Mapping[str, Any]) -> None:
        """DELETE pods/{name} with a DeleteOptions body (upstream's preconditions)."""
        request = self._client.prepare_request("delete", res=Pod, name=name, namespace=namespace)
        request.data = dict(options)
        await self._send(request)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        """POST an Event (what upstream's event recorder writes about the pods it acts on)."""
        request = self._client.prepare_request("post", res=Event, namespace=namespace, obj=Event.from_dict(dict(body)))
        await self._send(request)

    async def _send(self, request: Any) -> None:
        async with _translated():
            response = await self._client.send(self._client.build_adapter_request(request))
            self._client.raise_for_status(response)

    async def close(self) -> None:
        await self._client.close()


class _translated:
    """Turns lightkube's and httpx's errors into `KubeApiError` (the API's Status when it sent one)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, KubeApiError):
            return False
        if isinstance(exc, ApiError):
            status = exc.status
            code = status.code or (exc.response.status_code if exc.response is not None else 0)
            raise KubeApiError(int(code), str(status.reason or ""), str(status.message or "")) from None
        if isinstance(exc, httpx.HTTPStatusError):
            response = exc.response
            raise KubeApiError(response.status_code, response.reason_phrase, _status_message(response)) from None
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | ConnectionRefusedError):
            raise KubeApiError(0, "", f"{type(exc).__name__}: {exc}", unreachable=True) from None
        if isinstance(exc, httpx.HTTPError | OSError | ConfigError):
            raise KubeApiError(0, "", f"{type(exc).__name__}: {exc}") from None
        return False


def _status_message(response: httpx.Response) -> str:
    """The Status message of a refused request, or its status line when the body was not read (a watch)."""
    try:
        return str(json.loads(response.content).get("message", ""))
    except (httpx.ResponseNotRead, ValueError, AttributeError):
        return f"HTTP {response.status_code}"
