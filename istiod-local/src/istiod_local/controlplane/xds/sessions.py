"""ADS protocol state for one stream, without I/O: requests and pushes in, responses out.

`SotwSession` speaks State-of-the-World ADS, `DeltaSession` incremental ADS.
Both take a `generate(type_url, names)` callable bound to the current mesh
snapshot, so the session decides *what* to send and the server only moves
bytes. Rules, as istiod applies them:

* the first request for a type is answered (even with nothing, so the
  client's initialisation completes); LDS, CDS and NDS are wildcard when the
  client names nothing;
* an ACK (matching nonce, no error) is answered only when it changes the
  subscription; a NACK is logged with the client's error and not answered;
  a request carrying an older nonce is stale and ignored (SotW);
* a push sends each watched type whose content changed, clusters first;
  endpoints of clusters that changed are re-sent even when equal, because
  Envoy re-warms a replaced cluster.

Health reports (`istio.v1.HealthInformation`) ride on the stream as requests
and never get a response; the ADS server takes them before they reach a
session (they set a WorkloadEntry's health, `autoregistration.py`).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from istio_agent.protos import typeurls
from istiod_local.controlplane.xds.generators.base import Resources

log = logging.getLogger("istiod_local.controlplane.ads")

Generate = Callable[[str, Collection[str] | None], Resources]
CONTROL_PLANE = base_pb2.ControlPlane(identifier='{"Component":"istiod-local"}')

# Types where an empty subscription means "everything" (SotW and legacy Delta wildcard).
WILDCARD_TYPES = frozenset({typeurls.CLUSTER, typeurls.LISTENER, typeurls.NAME_TABLE})
# Push order: clusters before their endpoints, listeners before their routes (make before break).
PUSH_ORDER = (typeurls.CLUSTER, typeurls.ENDPOINT, typeurls.LISTENER, typeurls.ROUTE, typeurls.NAME_TABLE)


def new_nonce() -> str:
    return uuid.uuid4().hex


def resource_version(resource: bytes) -> str:
    return hashlib.blake2b(resource, digest_size=8).hexdigest()


def _digest(resources: Resources) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(resources):
        h.update(name.encode() + b"\0" + resources[name].type_url.encode() + b"\0" + resources[name].value)
    return h.digest()


def push_order(types: Iterable[str]) -> list[str]:
    present = set(types)
    ordered = [t for t in PUSH_ORDER if t in present]
    return ordered + sorted(present - set(ordered))


@dataclass
class SotwWatch:
    names: frozenset[str] | None  # None: wildcard
    nonce: str = ""
    version: str = ""
    acked_version: str = ""
    digest: bytes = b""
    nacked: str = ""  # the error of the last NACK, until an ACK clears it


W = TypeVar("W")


class _Session(Generic[W]):
    """What both ADS flavours keep per stream: who, which types, how to generate, and the watches."""

    def __init__(self, proxy_id: str, served: Collection[str], generate: Generate,
                 nonce: Callable[[], str] = new_nonce) -> None:
        self.proxy_id = proxy_id
        self.served = frozenset(served)
        self._generate = generate
        self._nonce = nonce
        self.watches: dict[str, W] = {}


class SotwSession(_Session[SotwWatch]):
    """State-of-the-World ADS for one stream."""

    def _respond(self, type_url: str, watch: SotwWatch, version: str) -> discovery_pb2.DiscoveryResponse:
        resources = self._generate(type_url, watch.names)
        return self._response(type_url, watch, version, resources, _digest(resources))

    def _response(self, type_url: str, watch: SotwWatch, version: str, resources: Resources,
                  digest: bytes) -> discovery_pb2.DiscoveryResponse:
        watch.nonce, watch.version, watch.digest = self._nonce(), version, digest
        return discovery_pb2.DiscoveryResponse(
            version_info=version, type_url=type_url, nonce=watch.nonce, control_plane=CONTROL_PLANE,
            resources=[resources[name] for name in sorted(resources)],
        )

    def on_request(self, request: discovery_pb2.DiscoveryRequest,
                   version: str) -> list[discovery_pb2.DiscoveryResponse]:
        type_url = request.type_url
        if type_url not in self.served:
            if type_url != typeurls.HEALTH_INFO:
                log.debug("ADS: %s asked for unsupported type %s", self.proxy_id, type_url)
            return []
        names = frozenset(request.resource_names) if request.resource_names else None
        if names is None and type_url not in WILDCARD_TYPES:
            names = frozenset()
        watch = self.watches.get(type_url)
        if watch is None or not request.response_nonce:
            watch = self.watches[type_url] = SotwWatch(names)
            return [self._respond(type_url, watch, version)]
        if request.response_nonce != watch.nonce:
            return []  # stale: the client has not seen our latest response yet
        if request.HasField("error_detail"):
            watch.nacked = request.error_detail.message
            log.warning("ADS:%s: NACK from %s for version %s: %s", typeurls.short(type_url), self.proxy_id,
                        watch.version, request.error_detail.message)
            return []
        watch.acked_version, watch.nacked = watch.version, ""
        if names != watch.names:
            watch.names = names
            return [self._respond(type_url, watch, version)]
        return []

    def on_push(self, version: str) -> list[discovery_pb2.DiscoveryResponse]:
        out = []
        clusters_changed = False
        for type_url in push_order(self.watches):
            watch = self.watches[type_url]
            resources = self._generate(type_url, watch.names)
            digest = _digest(resources)
            force = type_url == typeurls.ENDPOINT and clusters_changed
            if digest == watch.digest and not force:
                continue
            if type_url == typeurls.CLUSTER:
                clusters_changed = True
            out.append(self._response(type_url, watch, version, resources, digest))
        return out


@dataclass
class DeltaWatch:
    wildcard: bool
    names: set[str] = field(default_factory=set)
    sent: dict[str, str] = field(default_factory=dict)  # what the client holds: name -> version
    nonce: str = ""
    nacked: str = ""


class DeltaSession(_Session[DeltaWatch]):
    """Incremental (Delta) ADS for one stream."""

    def _current(self, type_url: str, watch: DeltaWatch) -> Resources:
        return self._generate(type_url, None if watch.wildcard else watch.names)

    def _response(self, type_url: str, watch: DeltaWatch, version: str, current: Resources, names: Iterable[str],
                  removed: Iterable[str]) -> discovery_pb2.DeltaDiscoveryResponse:
        resources = []
        for name in sorted(set(names)):
            any_resource = current[name]
            resource_ver = resource_version(any_resource.value)
            watch.sent[name] = resource_ver
            resources.append(discovery_pb2.Resource(name=name, version=resource_ver, resource=any_resource))
        gone = sorted(set(removed))
        for name in gone:
            watch.sent.pop(name, None)
        watch.nonce = self._nonce()
        return discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=version, type_url=type_url, nonce=watch.nonce, control_plane=CONTROL_PLANE,
            resources=resources, removed_resources=gone,
        )

    @staticmethod
    def _diff(watch: DeltaWatch, current: Resources, force: Collection[str] = ()) -> tuple[list[str], list[str]]:
        changed = [n for n, r in current.items()
                   if n in force or watch.sent.get(n) != resource_version(r.value)]
        removed = [n for n in watch.sent if n not in current]
        return changed, removed

    def on_request(self, request: discovery_pb2.DeltaDiscoveryRequest,
                   version: str) -> list[discovery_pb2.DeltaDiscoveryResponse]:
        type_url = request.type_url
        if type_url not in self.served:
            if type_url != typeurls.HEALTH_INFO:
                log.debug("ADS: %s asked for unsupported type %s (delta)", self.proxy_id, type_url)
            return []
        subscribe = set(request.resource_names_subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        watch = self.watches.get(type_url)
        if watch is None:
            wildcard = "*" in subscribe or (not subscribe and type_url in WILDCARD_TYPES)
            watch = self.watches[type_url] = DeltaWatch(wildcard, subscribe - {"*"},
                                                        dict(request.initial_resource_versions))
            current = self._current(type_url, watch)
            changed, removed = self._diff(watch, current)
            removed += [n for n in watch.names if n not in current]
            return [self._response(type_url, watch, version, current, changed, removed)]
        if request.response_nonce and request.response_nonce == watch.nonce:
            if request.HasField("error_detail"):
                watch.nacked = request.error_detail.message
                log.warning("ADS:%s: NACK from %s (delta): %s", typeurls.short(type_url), self.proxy_id,
                            request.error_detail.message)
            else:
                watch.nacked = ""
        if "*" in unsubscribe:
            watch.wildcard = False
        for name in unsubscribe - {"*"}:
            watch.names.discard(name)
            watch.sent.pop(name, None)
        if not subscribe:
            return []
        became_wildcard = "*" in subscribe and not watch.wildcard
        watch.wildcard = watch.wildcard or "*" in subscribe
        watch.names |= subscribe - {"*"}
        current = self._current(type_url, watch)
        if became_wildcard:
            send, _ = self._diff(watch, current)
        else:
            # Explicit (re)subscriptions are always answered, even when the client should already hold them.
            send = [n for n in subscribe if n in current]
        # A name that does not exist is reported removed, so the client stops waiting for it.
        missing = [n for n in subscribe - {"*"} if n not in current]
        return [self._response(type_url, watch, version, current, send, missing)]

    def on_push(self, version: str) -> list[discovery_pb2.DeltaDiscoveryResponse]:
        out = []
        changed_clusters: list[str] = []
        for type_url in push_order(self.watches):
            watch = self.watches[type_url]
            current = self._current(type_url, watch)
            force = [n for n in changed_clusters if n in current] if type_url == typeurls.ENDPOINT else []
            changed, removed = self._diff(watch, current, force)
            if type_url == typeurls.CLUSTER:
                changed_clusters = changed
            if changed or removed:
                out.append(self._response(type_url, watch, version, current, changed, removed))
        return out
