"""The HTTPS edge of istiod-local's Kubernetes API (aiohttp, in istiod-local's event loop).

Thin on purpose: it authenticates the bearer token, asks `rbac` whether the
identity may, parses the selectors, and hands the work to `KubeStore`;
errors leave as the `Status` objects `errors` builds. A watch is a chunked
stream of JSON lines (`{"type": ..., "object": ...}`) fed from the store's
listener through a bounded queue; a watcher too slow to keep up is cut off
(as the apiserver cuts a watcher whose buffer fills), and its client lists
and watches again.

    api = KubeApiServer(KubeApiOptions("127.0.0.1:6443"), plane.state)
    api.update_registry(registry)
    await api.start()          # api.address: the host:port it listens on
    ...
    await api.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import ssl
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from istio_agent.config.gobool import TRUE_SPELLINGS
from istio_agent.netaddr import join_host_port, split_host_port
from istiod_local.controlplane.kubeapi import discovery, errors, rbac
from istiod_local.controlplane.kubeapi.credentials import KUBE_API_AUDIENCE, load_or_issue_serving_cert
from istiod_local.controlplane.kubeapi.selectors import (
    NAMESPACE_FIELDS,
    POD_FIELDS,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from istiod_local.controlplane.kubeapi.store import (
    NAMESPACES,
    PODS,
    KubeStore,
    WatchEvent,
    bookmark,
    filter_event,
)
from istiod_local.controlplane.state import ControlPlaneState
from istiod_local.controlplane.tokens import TokenError, TokenVerifier
from istiod_local.controlplane.xds.registry import Registry

log = logging.getLogger("istiod_local.controlplane.kubeapi")

DEFAULT_ADDR = "127.0.0.1:6443"
JSON = "application/json"
_PUBLIC = frozenset({"/version", "/healthz", "/livez", "/readyz"})
_WATCH_QUEUE = 10_000


@dataclass(frozen=True)
class KubeApiOptions:
    address: str = DEFAULT_ADDR
    default_node: str = "localhost"
    host_ip: str = "127.0.0.1"
    bookmark_interval: float = 60.0
    watch_timeout: float = 1800.0
    history: int = 1000


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(int(now), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(body, separators=(",", ":")).encode(),
                        content_type=JSON)


@dataclass(frozen=True)
class _Route:
    resource: str  # pods, pods/status, namespaces, events, or "" for discovery/unknown
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


# What each served route supports, once authorized; anything else is 405.
_SERVED: dict[tuple[str, bool], frozenset[str]] = {
    (PODS, False): frozenset({"list", "watch"}),
    (PODS, True): frozenset({"get", "watch", "patch", "delete"}),
    ("pods/status", True): frozenset({"get", "patch"}),
    (NAMESPACES, False): frozenset({"list", "watch"}),
    (NAMESPACES, True): frozenset({"get", "watch"}),
    ("events", False): frozenset({"create", "list"}),
}


def parse_path(path: str) -> _Route | None:
    """The resource a /api/v1/... path names; None when it names none this server has."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["api", "v1"]:
        return None
    rest = parts[2:]
    if rest == ["pods"]:
        return _Route(PODS)
    if rest == ["namespaces"]:
        return _Route(NAMESPACES)
    if len(rest) == 2 and rest[0] == "namespaces":
        return _Route(NAMESPACES, "", rest[1])
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, kind, tail = rest[1], rest[2], rest[3:]
        if kind == "pods" and len(tail) <= 1:
            return _Route(PODS, namespace, tail[0] if tail else "")
        if kind == "pods" and len(tail) == 2 and tail[1] == "status":
            return _Route("pods/status", namespace, tail[0])
        if kind == "events" and not tail:
            return _Route("events", namespace)
    return None


class KubeApiServer:
    """The API as one component: `update_registry`, `start`, `stop`, `address`."""

    name = "Kubernetes API"

    def __init__(self, options: KubeApiOptions, state: ControlPlaneState,
                 clock: Callable[[], float] = time.time) -> None:
        self.options = options
        self.state = state
        self._clock = clock
        self.verifier = TokenVerifier(state.token_key.public_key(), audience=KUBE_API_AUDIENCE)
        self.store = KubeStore(options.default_node, options.host_ip, options.history,
                               first_version=max(1, int(clock() * 1_000_000)))
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        # Each open watch: its queue, and a future done once its stream has ended.
        self._watches: dict[asyncio.Future[None], asyncio.Queue[WatchEvent | None]] = {}
        self.address = ""

    # ---- lifecycle ------------------------------------------------------------------------------

    def update_registry(self, registry: Registry) -> None:
        """The registry (first load or reload): pods and namespaces follow it, watchers see the changes."""
        events = self.store.apply_registry(registry, rfc3339(self._clock()))
        if events:
            log.info("kube API: registry applied at resourceVersion %d (%d changes)", self.store.resource_version,
                     len(events))

    def _ssl_context(self, host: str) -> ssl.SSLContext:
        cert_pem, key_pem = load_or_issue_serving_cert(self.state, host, self._clock())
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="iakube-") as tmp:
            cert_file, key_file = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert_file.write_bytes(cert_pem)
            key_file.touch(0o600)
            key_file.write_bytes(key_pem)
            context.load_cert_chain(cert_file, key_file)
        context.set_alpn_protocols(["http/1.1"])
        return context

    async def start(self) -> None:
        host, port = split_host_port(self.options.address)
        app = web.Application(client_max_size=3 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host or None, port, ssl_context=self._ssl_context(host or "127.0.0.1"),
                           reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(f"kube API: cannot listen on {self.options.address} (--kube-api-addr; off disables it): "
                          f"{exc.strerror or exc}") from exc
        self._runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        self.address = join_host_port(host, bound)
        log.info("kube-apiserver serving on https://%s (resourceVersion %d, default node %s)", self.address,
                 self.store.resource_version, self.options.default_node)

    async def stop(self) -> None:
        """Watches end cleanly (their last chunk written, as at a timeout), then the listener closes."""
        self._stopping.set()
        for watch_queue in self._watches.values():
            with contextlib.suppress(asyncio.QueueFull):
                watch_queue.put_nowait(None)
        if self._watches:
            await asyncio.wait(list(self._watches), timeout=2.0)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # ---- requests -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except errors.ApiError as exc:
            return _json(exc.status(), exc.code)
        except Exception as exc:  # a bug here must still answer as an apiserver does, and be seen
            log.exception("kube API: %s %s failed", request.method, request.path)
            return _json(errors.ApiError(500, f"Internal error occurred: {exc}").status(), 500)

    def _user(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.unauthorized()
        try:
            return self.verifier.verify(token.strip(), self._clock()).identity.subject
        except TokenError as exc:
            log.debug("kube API: token refused: %s", exc)
            raise errors.unauthorized() from None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        user = self._user(request)
        path = request.path.rstrip("/") or "/"
        if path in _PUBLIC:
            return _json(discovery.KUBE_VERSION) if path == "/version" else web.Response(text="ok")
        if user is None:
            raise errors.unauthorized()
        if path == "/api":
            return _json(discovery.api_versions(self.address))
        if path == "/api/v1":
            return _json(discovery.api_resource_list())
        if path == "/apis":
            return _json(discovery.api_group_list())
        # Authorization comes first, from the path and the method alone, as the apiserver's filter chain has
        # it: a request the identity may not make is 403 whatever this server would have done with it.
        attributes = resource_path(path)
        if attributes is None:
            raise errors.ApiError(404, "the server could not find the requested resource", reason="NotFound")
        verb = request_verb(request.method, bool(attributes.name), request.query.get("watch", "") in TRUE_SPELLINGS)
        if not rbac.allowed(rbac.Request(user, verb, attributes.resource, attributes.namespace, attributes.name,
                                         attributes.group)):
            raise errors.forbidden(user, verb, attributes.resource, attributes.name, attributes.namespace,
                                   attributes.group)
        route = parse_path(path)
        if route is None:
            raise errors.ApiError(404, "the server could not find the requested resource", reason="NotFound")
        if request.method == "HEAD" or verb not in _SERVED.get((route.resource, bool(route.name)), frozenset()):
            raise errors.method_not_allowed(request.method)
        if verb == "watch":
            return await self._watch(request, route)
        if verb == "list" and route.resource == "events":  # kubectl describe asks; none are kept
            return _json({"kind": "EventList", "apiVersion": "v1",
                          "metadata": {"resourceVersion": str(self.store.resource_version)}, "items": []})
        if verb == "list":
            return self._list(request, route)
        if verb == "get":
            return self._get(request, route)
        if verb == "patch":
            return await self._patch(request, route)
        if verb == "delete":
            return await self._delete(request, route)
        return await self._create_event(request, route)  # the one create served

    def _selectors(self, request: web.Request, resource: str) -> tuple[Any, Any]:
        fields = POD_FIELDS if resource == PODS else NAMESPACE_FIELDS
        try:
            return (parse_label_selector(request.query.get("labelSelector", "")),
                    parse_field_selector(request.query.get("fieldSelector", ""), fields))
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from None

    def _render(self, request: web.Request, resource: str, items: list[dict[str, Any]], rv: int) -> web.Response:
        if discovery.wants_table(request.headers.get("Accept", "")):
            return _json(discovery.table(resource, items, str(rv), self._clock(),
                                         request.query.get("includeObject", "Metadata")))
        kind = "PodList" if resource == PODS else "NamespaceList"
        return _json({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}, "items": items})

    def _list(self, request: web.Request, route: _Route) -> web.Response:
        labels, fields = self._selectors(request, route.resource)
        items, rv = self.store.list_objects(route.resource, route.namespace, labels, fields)
        return self._render(request, route.resource, items, rv)

    def _get(self, request: web.Request, route: _Route) -> web.Response:
        resource = PODS if route.resource == "pods/status" else route.resource
        obj = self.store.get(resource, route.namespace, route.name)
        if discovery.wants_table(request.headers.get("Accept", "")):
            return _json(discovery.table(resource, [obj], obj["metadata"]["resourceVersion"], self._clock(),
                                         request.query.get("includeObject", "Metadata")))
        return _json(obj)

    async def _body(self, request: web.Request, required: bool) -> Any:
        raw = await request.read()
        if not raw.strip():
            if required:
                raise errors.bad_request("the request body is empty")
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"the request body is not valid JSON: {exc}") from None

    async def _patch(self, request: web.Request, route: _Route) -> web.Response:
        body = await self._body(request, True)
        sub = "status" if route.resource == "pods/status" else ""
        obj = self.store.patch_pod(route.namespace, route.name, request.headers.get("Content-Type", ""), body, sub)
        return _json(obj)

    async def _delete(self, request: web.Request, route: _Route) -> web.Response:
        body = await self._body(request, False)
        preconditions = body.get("preconditions") if isinstance(body, dict) else None
        if not isinstance(preconditions, dict):
            preconditions = {}
        obj = self.store.delete_pod(route.namespace, route.name, preconditions.get("uid"),
                                    preconditions.get("resourceVersion"))
        log.info("kube API: pod %s/%s deleted", route.namespace, route.name)
        return _json(obj)

    async def _create_event(self, request: web.Request, route: _Route) -> web.Response:
        """Events are accepted (201, as created) and logged, not stored: nothing here lists them."""
        body = await self._body(request, True)
        if not isinstance(body, dict):
            raise errors.bad_request("the request body is not an Event")
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        meta.setdefault("namespace", route.namespace)
        if not meta.get("name"):
            meta["name"] = f"{meta.get('generateName', 'event.')}{uuid.uuid4().hex[:10]}"
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(self.store.resource_version),
                    creationTimestamp=rfc3339(self._clock()))
        log.info("kube API: event %s/%s: %s %s", route.namespace, meta["name"], body.get("reason", ""),
                 body.get("message", ""))
        return _json(body, 201)

    # ---- watch ----------------------------------------------------------------------------------

    async def _watch(self, request: web.Request, route: _Route) -> web.StreamResponse:
        resource = route.resource
        labels, fields = self._selectors(request, resource)
        if route.name:  # a watch on one object: /pods/{name}?watch=1
            fields = parse_field_selector(f"metadata.name={route.name}", POD_FIELDS if resource == PODS
                                          else NAMESPACE_FIELDS)
        table = discovery.wants_table(request.headers.get("Accept", ""))
        include = request.query.get("includeObject", "Metadata")
        bookmarks = request.query.get("allowWatchBookmarks", "") in TRUE_SPELLINGS
        try:
            timeout = float(request.query.get("timeoutSeconds", "") or self.options.watch_timeout)
        except ValueError:
            raise errors.bad_request("timeoutSeconds must be a number") from None
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(_WATCH_QUEUE)
        overflowed = False

        def deliver(event: WatchEvent) -> None:
            nonlocal overflowed
            if event.resource != resource:
                return
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                overflowed = True

        try:
            # sendInitialEvents (client-go's WatchList): every object first, whatever the resourceVersion.
            initial_events = request.query.get("sendInitialEvents", "") in TRUE_SPELLINGS
            initial = self.store.watch_start(resource, "" if initial_events else
                                             request.query.get("resourceVersion", ""))
            expired = None
        except errors.ApiError as exc:
            if exc.code != 410:
                raise
            initial, expired = [], exc
        unsubscribe = self.store.subscribe(deliver)
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watches[ended] = queue
        first_table = True
        try:
            await response.prepare(request)
            if expired is not None:
                await self._send(response, {"type": "ERROR", "object": expired.status()})
                return response

            async def send(event: WatchEvent) -> None:
                nonlocal first_table
                seen = filter_event(event, labels, fields, route.namespace)
                if seen is None:
                    return
                obj = seen.object
                if table:
                    obj = discovery.table(resource, [obj], obj["metadata"]["resourceVersion"], self._clock(),
                                          include, columns=first_table)
                    first_table = False
                await self._send(response, {"type": seen.type, "object": obj})

            for event in initial:
                await send(event)
            if initial_events:  # the end of the initial state, as the apiserver marks it
                end = bookmark(resource, self.store.resource_version)
                end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
                await self._send(response, {"type": "BOOKMARK", "object": end})
            deadline = asyncio.get_running_loop().time() + timeout
            next_bookmark = asyncio.get_running_loop().time() + self.options.bookmark_interval
            while not self._stopping.is_set():
                now = asyncio.get_running_loop().time()
                if now >= deadline:
                    break
                wait = min(deadline, next_bookmark if bookmarks else deadline) - now
                try:
                    item = await asyncio.wait_for(queue.get(), max(wait, 0.0))
                except TimeoutError:
                    item = None
                if overflowed:
                    log.warning("kube API: a watch of %s fell %d events behind and was closed", resource,
                                _WATCH_QUEUE)
                    break
                if item is not None:
                    await send(item)
                    continue
                if self._stopping.is_set():
                    break
                if bookmarks and asyncio.get_running_loop().time() >= next_bookmark:
                    await self._send(response, {"type": "BOOKMARK",
                                                "object": bookmark(resource, self.store.resource_version)})
                    next_bookmark = asyncio.get_running_loop().time() + self.options.bookmark_interval
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the client went away
        finally:
            unsubscribe()
            self._watches.pop(ended, None)
            if not ended.done():
                ended.set_result(None)
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, event: dict[str, Any]) -> None:
        await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
