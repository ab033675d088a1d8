"""The HTTPS edge of istiod-local's Kubernetes API, in istiod-local's event loop beside xDS and the CA.

Thin on purpose: it authenticates the bearer token, asks `rbac` whether the
identity may, parses the selectors, and hands the work to `KubeStore`;
errors leave as the `Status` objects `errors` builds. A watch is a chunked
stream of JSON lines (`{"type": ..., "object": ...}`, `watch.WatchStream`).

Under `istiod-local up` the port listens on the node's gateway, which every
pod reaches, so the edge is the product's `httpio` server with the limits of
a port open to strangers (on aiohttp there was no deadline for a request's
head, no connection cap, and asyncio's TLS kept 256 KiB per connection):

- a connection's TLS handshake and each request's head and body must arrive
  within `request_timeout`; connections share `max_connections` slots, at most
  `max_per_source` per client address (`httpio.admission`);
- the token is checked on the request's head, before its body is read: without
  a valid one a body may be 64 KiB, with one 3 MiB (the apiserver's
  `MaxRequestBodyBytes`: 413 `Request entity too large: limit is 3145728`);
- a client that stops reading an answer is cut after `write_timeout`, and a
  watcher that falls `watch_buffer_bytes` behind is cut at once (`watch`);
- bodies are decoded and patches worked out off the loop, one at a time in a
  worker thread (`podpatch`), at most `max_mutating_in_flight` waiting (then
  429, as the apiserver's `--max-mutating-requests-inflight`); only the commit
  runs on the loop, and each object's JSON is encoded once for every reader;
- freed memory goes back to the kernel shortly after connections close.

    api = KubeApiServer(KubeApiOptions("127.0.0.1:6443"), plane.state)
    api.update_registry(registry)
    await api.start()          # api.address: the host:port it listens on
    ...
    await api.stop()
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import ssl
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

from istio_agent.config.gobool import TRUE_SPELLINGS
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.httpio.server_core import Limits, Request, Response
from istio_agent.memory import MemoryTrimmer
from istio_agent.netaddr import join_host_port, split_host_port
from istiod_local.controlplane.kubeapi import discovery, errors, jsonbody, objects, rbac, tokenreview
from istiod_local.controlplane.kubeapi.credentials import KUBE_API_AUDIENCE, load_or_issue_serving_cert
from istiod_local.controlplane.kubeapi.paths import SERVED, Route, parse_path, request_verb, resource_path
from istiod_local.controlplane.kubeapi.podpatch import PatchedPod, check_field_validation, patch_pod_object
from istiod_local.controlplane.kubeapi.resources import BY_KEY, EVENTS, GENERIC, PODS, TOKENREVIEWS
from istiod_local.controlplane.kubeapi.responses import JSON, json_response, refusal, status_response
from istiod_local.controlplane.kubeapi.selectors import SelectorError, parse_field_selector, parse_label_selector
from istiod_local.controlplane.kubeapi.store import KubeStore, StaleObject, WatchEvent
from istiod_local.controlplane.kubeapi.watch import MAX_BUFFERED_BYTES, ObjectJson, WatchRequest, WatchStream, dumps
from istiod_local.controlplane.state import ControlPlaneState
from istiod_local.controlplane.tokens import TokenClaims, TokenError, TokenVerifier
from istiod_local.controlplane.xds.registry import Registry

log = logging.getLogger("istiod_local.controlplane.kubeapi")

DEFAULT_ADDR = "127.0.0.1:6443"
_PUBLIC = frozenset({"/version", "/healthz", "/livez", "/readyz"})
MAX_BODY_BYTES = 3 * 1024 * 1024  # the apiserver's MaxRequestBodyBytes
UNAUTHENTICATED_BODY_BYTES = 64 * 1024
OFF_LOOP_BODY_BYTES = 64 * 1024  # bodies larger than this are decoded in the worker
# The kernel's send buffer per connection: autotuned, it reaches 4 MiB for a client that stops reading, which the
# server would encrypt and copy for each of 500 stalled watchers (seconds of the loop per 1 MB patch).
SEND_BUFFER_BYTES = 64 * 1024
_PATCH_ATTEMPTS = 5
T = TypeVar("T")


@dataclass(frozen=True)
class KubeApiOptions:
    address: str = DEFAULT_ADDR
    default_node: str = "localhost"
    host_ip: str = "127.0.0.1"
    bookmark_interval: float = 60.0
    watch_timeout: float = 1800.0
    history: int = 1000
    request_timeout: float = 10.0
    write_timeout: float = 10.0
    max_connections: int = 1024
    max_per_source: int = 256
    max_mutating_in_flight: int = 16
    watch_buffer_bytes: int = MAX_BUFFERED_BYTES


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(int(now), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeApiServer:
    """The API as one component: `update_registry`, `start`, `stop`, `address`."""

    name = "Kubernetes API"

    def __init__(self, options: KubeApiOptions, state: ControlPlaneState,
                 clock: Callable[[], float] = time.time) -> None:
        self.options = options
        self.state = state
        self._clock = clock
        self.verifier = TokenVerifier(state.token_key.public_key(), audience=KUBE_API_AUDIENCE)
        self._review_verifiers: dict[str, TokenVerifier] = {}
        self.store = KubeStore(options.default_node, options.host_ip, options.history,
                               first_version=max(1, int(clock() * 1_000_000)))
        self.objects = ObjectJson()
        self._server: HttpServer | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._trimmer: MemoryTrimmer | None = None
        self._stopping = False
        self._mutating = 0
        self._watches: set[WatchStream] = set()
        self.store.subscribe(self._fan_out)
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

    def limits(self) -> Limits:
        o = self.options
        return Limits(max_body_bytes=MAX_BODY_BYTES, request_timeout=o.request_timeout,
                      first_request_timeout=o.request_timeout, write_timeout=o.write_timeout,
                      max_connections=o.max_connections, max_per_source=o.max_per_source,
                      send_buffer_bytes=SEND_BUFFER_BYTES)

    async def start(self) -> None:
        host, port = split_host_port(self.options.address)
        router = Router()
        router.add("/", self._handle, prefix=True)
        self._trimmer = MemoryTrimmer()
        server = HttpServer(router, limits=self.limits(), on_malformed=self._malformed, head_check=self._head_check,
                            render_error=refusal, on_connection_closed=self._trimmer.soon)
        try:
            bound = await server.start(host or None, port, tls=self._ssl_context(host or "127.0.0.1"))
        except OSError as exc:
            raise OSError(f"kube API: cannot listen on {self.options.address} (--kube-api-addr; off disables it): "
                          f"{exc.strerror or exc}") from exc
        self._server = server
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubeapi-work")
        await self._trimmer.start()
        self.address = join_host_port(host, bound)
        log.info("kube-apiserver serving on https://%s (resourceVersion %d, default node %s)", self.address,
                 self.store.resource_version, self.options.default_node)

    async def stop(self) -> None:
        """Watches end cleanly (their last chunk written, as at a timeout), then the listener closes."""
        self._stopping = True
        for stream in list(self._watches):
            stream.stop()
        if self._watches:
            await asyncio.wait([s.done for s in self._watches], timeout=2.0)
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)
        trimmer, self._trimmer = self._trimmer, None
        if trimmer is not None:
            await trimmer.stop()

    @property
    def connections(self) -> int:
        """Connections open now (for tests and benchmarks)."""
        return self._server.connections if self._server is not None else 0

    # ---- the edge's hooks -----------------------------------------------------------------------

    def _malformed(self, peer: str | None, reason: str) -> None:
        log.debug("kube API: refused a request from %s: %s", peer, reason)

    def _head_check(self, request: Request) -> int | None:
        """The body a request may send, decided on its head: 3 MiB with a valid token, else 64 KiB."""
        try:
            return None if self._user(request) is not None else UNAUTHENTICATED_BODY_BYTES
        except errors.ApiError:
            return UNAUTHENTICATED_BODY_BYTES

    # ---- requests -------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        try:
            response = await self._dispatch(request, {k: v[0] for k, v in parse_qs(request.query_string,
                                                                                     keep_blank_values=True).items()})
            log.debug("kube API: %s %s?%s: %d", request.method, request.path, request.query_string, response.status)
            return response
        except errors.ApiError as exc:
            log.debug("kube API: %s %s?%s: %d", request.method, request.path, request.query_string, exc.code)
            return status_response(exc)
        except Exception as exc:  # a bug here must still answer as an apiserver does, and be seen
            log.exception("kube API: %s %s failed", request.method, request.path)
            return status_response(errors.ApiError(500, f"Internal error occurred: {exc}"))

    def _user(self, request: Request) -> str | None:
        header = request.header("Authorization", "") or ""
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

    async def _dispatch(self, request: Request, query: dict[str, str]) -> Response:
        user = self._user(request)
        path = request.path.rstrip("/") or "/"
        if path in _PUBLIC:
            return json_response(discovery.KUBE_VERSION) if path == "/version" else \
                Response(200, b"ok", [("Content-Type", "text/plain; charset=utf-8")])
        if user is None:
            raise errors.unauthorized()
        if path == "/api":
            return json_response(discovery.api_versions(self.address))
        if path == "/api/v1":
            return json_response(discovery.api_resource_list())
        if path == "/apis":
            return json_response(discovery.api_group_list())
        group_path = path.split("/")[2:] if path.startswith("/apis/") else []
        if len(group_path) in (1, 2):
            document = discovery.group_document(group_path[0]) if len(group_path) == 1 else \
                discovery.group_resource_list(group_path[0], group_path[1])
            if document is None:
                raise errors.ApiError(404, "the server could not find the requested resource", reason="NotFound")
            return json_response(document)
        # Authorization comes first, from the path and the method alone, as the apiserver's filter chain has
        # it: a request the identity may not make is 403 whatever this server would have done with it.
        attributes = resource_path(path)
        if attributes is None:
            raise errors.ApiError(404, "the server could not find the requested resource", reason="NotFound")
        verb = request_verb(request.method, bool(attributes.name), query.get("watch", "") in TRUE_SPELLINGS)
        if not rbac.allowed(rbac.Request(user, verb, attributes.resource, attributes.namespace, attributes.name,
                                         attributes.group)):
            raise errors.forbidden(user, verb, attributes.resource, attributes.name, attributes.namespace,
                                   attributes.group)
        route = parse_path(path)
        if route is None:
            raise errors.ApiError(404, "the server could not find the requested resource", reason="NotFound")
        if request.method == "HEAD" or verb not in SERVED.get((route.resource, bool(route.name)), frozenset()):
            raise errors.method_not_allowed(request.method)
        if verb == "watch":
            return self._watch(request, query, route)
        if verb == "list" and route.resource == EVENTS:  # kubectl describe asks; none are kept
            return json_response({"kind": "EventList", "apiVersion": "v1",
                          "metadata": {"resourceVersion": str(self.store.resource_version)}, "items": []})
        if verb == "list":
            return self._list(request, query, route)
        if verb == "get":
            return self._get(request, query, route)
        if verb in ("patch", "delete", "create", "update"):
            return await self._mutate(request, query, route, verb)
        raise errors.method_not_allowed(request.method)

    def _selectors(self, query: dict[str, str], resource: str) -> tuple[Any, Any]:
        fields = BY_KEY[resource].field_getters()
        try:
            return (parse_label_selector(query.get("labelSelector", "")),
                    parse_field_selector(query.get("fieldSelector", ""), fields))
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from None

    def _list(self, request: Request, query: dict[str, str], route: Route) -> Response:
        labels, fields = self._selectors(query, route.resource)
        items, rv = self.store.list_objects(route.resource, route.namespace, labels, fields)
        if discovery.wants_table(request.header("Accept", "") or ""):
            return json_response(discovery.table(route.resource, items, str(rv), self._clock(),
                                         query.get("includeObject", "Metadata")))
        rtype = BY_KEY[route.resource]
        head = dumps({"kind": rtype.list_kind, "apiVersion": rtype.api_version,
                      "metadata": {"resourceVersion": str(rv)}})[:-1]
        return json_response(head + b',"items":[' + b",".join(self.objects.get(item) for item in items) + b"]}")

    def _get(self, request: Request, query: dict[str, str], route: Route) -> Response:
        resource = PODS if route.resource == "pods/status" else route.resource
        obj = self.store.get(resource, route.namespace, route.name)
        if discovery.wants_table(request.header("Accept", "") or ""):
            return json_response(discovery.table(resource, [obj], obj["metadata"]["resourceVersion"], self._clock(),
                                         query.get("includeObject", "Metadata")))
        return json_response(self.objects.get(obj))

    # ---- writes: off the loop, bounded ------------------------------------------------------------

    async def _off_loop(self, work: Callable[..., T], *args: Any) -> T:
        if self._worker is None:
            raise errors.ApiError(503, "the server is shutting down", reason="ServiceUnavailable")
        return await asyncio.get_running_loop().run_in_executor(self._worker, work, *args)

    async def _body(self, request: Request, required: bool) -> Any:
        raw = request.body
        if not raw.strip():
            if required:
                raise errors.bad_request("the request body is empty")
            return None
        if len(raw) > OFF_LOOP_BODY_BYTES:
            return await self._off_loop(jsonbody.decode, raw)
        return jsonbody.decode(raw)

    async def _mutate(self, request: Request, query: dict[str, str], route: Route, verb: str) -> Response:
        if self._mutating >= self.options.max_mutating_in_flight:
            raise errors.ApiError(429, "Too many requests, please try again later.")
        self._mutating += 1
        try:
            if route.resource in GENERIC:
                return await self._write(request, route, verb)
            if verb == "patch":
                return await self._patch(request, query, route)
            if verb == "delete":
                return await self._delete(request, route)
            if route.resource == TOKENREVIEWS:
                return await self._token_review(request)
            return await self._create_event(request, route)
        finally:
            self._mutating -= 1

    async def _patch(self, request: Request, query: dict[str, str], route: Route) -> Response:
        field_validation = check_field_validation(query.get("fieldValidation", ""))
        sub = "status" if route.resource == "pods/status" else ""
        content_type = request.header("Content-Type", "") or ""
        raw = request.body
        if not raw.strip():
            raise errors.bad_request("the request body is empty")
        for _ in range(_PATCH_ATTEMPTS):  # the pod changed while the patch was worked out: work it out again
            old = self.store.get(PODS, route.namespace, route.name)
            patched = await self._off_loop(_work_out_patch, raw, old, route.name, content_type, sub, field_validation)
            try:
                obj = self.store.commit_patch(route.namespace, route.name, old, patched, sub,
                                              before_emit=partial(self._remember, patched=patched))
                break
            except StaleObject:
                continue
        else:
            raise errors.modified_conflict(PODS, route.name)
        warnings = [("Warning", f"299 - {json.dumps(text)}") for text in patched.warnings]
        return json_response(self.objects.get(obj), headers=warnings)

    async def _write(self, request: Request, route: Route, verb: str) -> Response:
        """create, update, patch or delete of a stored object (`objects` works the body out, off the loop)."""
        rtype = BY_KEY[route.resource]
        if verb == "delete":
            return await self._delete(request, route)
        if verb in ("create", "update"):  # a patch's media type names its format (`objects.patched_object`)
            _check_json_body(request.header("Content-Type", "") or "")
        if verb == "create":
            if rtype.namespaced and not route.namespace:
                raise errors.ApiError(404, "the server could not find the requested resource", reason="NotFound")
            body = await self._body(request, True)
            obj, size = await self._off_loop(objects.new_object, rtype, route.namespace, body)
            created = self.store.create(route.resource, obj, rfc3339(self._clock()), size)
            return json_response(self.objects.get(created), 201)
        raw = request.body
        if not raw.strip():
            raise errors.bad_request("the request body is empty")
        content_type = request.header("Content-Type", "") or ""
        for _ in range(_PATCH_ATTEMPTS):  # the object changed while the change was worked out: again
            old = self.store.get(route.resource, route.namespace, route.name)
            new, size = await self._off_loop(_work_out_write, raw, rtype, old, verb, content_type, route.namespace,
                                              route.name)
            try:
                obj = self.store.commit_object(route.resource, old, new, size)
                break
            except StaleObject:
                continue
        else:
            raise errors.modified_conflict(route.resource, route.name)
        return json_response(self.objects.get(obj))

    async def _token_review(self, request: Request) -> Response:
        body = await self._body(request, True)
        return json_response(tokenreview.review(body, self._verify_for_review, KUBE_API_AUDIENCE), 201)

    def _verify_for_review(self, token: str, audience: str) -> TokenClaims:
        verifier = self._review_verifiers.get(audience)
        if verifier is None:
            verifier = TokenVerifier(self.state.token_key.public_key(), audience=audience)
            if len(self._review_verifiers) < tokenreview.MAX_AUDIENCES:  # the audiences istiod asks for: a few
                self._review_verifiers[audience] = verifier
        return verifier.verify(token, self._clock())

    def _remember(self, committed: dict[str, Any], patched: PatchedPod) -> None:
        """The committed object's JSON, from the worker's encoding (before watchers are told of it)."""
        self.objects.put(committed, patched.encoded(committed["metadata"]["resourceVersion"]))

    async def _delete(self, request: Request, route: Route) -> Response:
        body = await self._body(request, False)
        preconditions = body.get("preconditions") if isinstance(body, dict) else None
        if not isinstance(preconditions, dict):
            preconditions = {}
        obj = self.store.delete(route.resource, route.namespace, route.name, preconditions.get("uid"),
                                preconditions.get("resourceVersion"))
        log.info("kube API: %s %s/%s deleted", route.resource, route.namespace, route.name)
        return json_response(self.objects.get(obj))

    async def _create_event(self, request: Request, route: Route) -> Response:
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
        log.info("kube API: event %s/%s: %s %s", route.namespace, meta["name"], str(body.get("reason", ""))[:200],
                 str(body.get("message", ""))[:1000])
        return json_response(body, 201)

    # ---- watch ----------------------------------------------------------------------------------

    def _fan_out(self, event: WatchEvent) -> None:
        for stream in list(self._watches):
            stream.deliver(event)

    def _watch(self, request: Request, query: dict[str, str], route: Route) -> Response:
        resource = route.resource
        labels, fields = self._selectors(query, resource)
        if route.name:  # a watch on one object: /pods/{name}?watch=1
            fields = parse_field_selector(f"metadata.name={route.name}", BY_KEY[resource].field_getters())
        try:
            timeout = float(query.get("timeoutSeconds", "") or self.options.watch_timeout)
        except ValueError:
            raise errors.bad_request("timeoutSeconds must be a number") from None
        if not math.isfinite(timeout) or timeout < 0:
            raise errors.bad_request("timeoutSeconds must be a number") from None
        # sendInitialEvents (client-go's WatchList): every object first, whatever the resourceVersion.
        initial_events = query.get("sendInitialEvents", "") in TRUE_SPELLINGS
        expired = None
        try:
            initial = self.store.watch_start(resource, "" if initial_events else query.get("resourceVersion", ""))
        except errors.ApiError as exc:
            if exc.code != 410:
                raise
            initial, expired = [], exc.status()
        watch = WatchRequest(resource, route.namespace, labels, fields,
                             discovery.wants_table(request.header("Accept", "") or ""),
                             query.get("includeObject", "Metadata"),
                             query.get("allowWatchBookmarks", "") in TRUE_SPELLINGS, initial_events, timeout)
        stream = WatchStream(watch, initial, objects=self.objects, current_version=lambda: self.store.resource_version,
                             now=self._clock, bookmark_interval=self.options.bookmark_interval, expired=expired,
                             max_bytes=self.options.watch_buffer_bytes)
        if self._stopping:
            stream.stop()
        self._watches.add(stream)
        stream.on_close = lambda: self._watches.discard(stream)
        return Response(200, headers=[("Content-Type", JSON), ("Cache-Control", "no-cache")], stream=stream)


def _work_out_patch(raw: bytes, old: dict[str, Any], name: str, content_type: str, subresource: str,
                    field_validation: str) -> PatchedPod:
    """In the worker: the body decoded and the patch applied, checked and encoded."""
    body = jsonbody.decode(raw, "patch")
    return patch_pod_object(old, name, content_type, body, subresource, field_validation)


def _check_json_body(content_type: str) -> None:
    """A create's or an update's body is JSON here: anything else (kubectl sends protobuf first) is 415, which
    client-go answers by sending JSON instead, as it does for a server without protobuf."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in ("", "application/json", "*/*"):
        raise errors.ApiError(415, 'the body of the request was in an unknown format - accepted media types '
                                   'include: application/json', reason="UnsupportedMediaType")


def _work_out_write(raw: bytes, rtype: Any, old: dict[str, Any], verb: str, content_type: str, namespace: str,
                    name: str) -> tuple[dict[str, Any], int]:
    """In the worker: an update's or a patch's body decoded and the new object worked out."""
    body = jsonbody.decode(raw, "patch" if verb == "patch" else "the request body")
    if verb == "patch":
        return objects.patched_object(rtype, old, content_type, body, namespace, name)
    return objects.updated_object(rtype, old, body, namespace, name)
