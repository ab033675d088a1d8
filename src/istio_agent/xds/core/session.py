"""What the proxy does with each message of one Envoy stream: the sans-IO core.

One `StreamSession` exists per downstream (Envoy) stream, paired with one
upstream (istiod) stream. It takes raw message bytes and returns raw bytes to
send, never touching a socket:

- every request from Envoy goes upstream unchanged; Envoy's first LDS request
  also triggers the agent's own subscriptions (NDS when DNS is on, PCDS when
  enabled) and the last known health report, because istiod expects them only
  once the proxy is initialising its listeners;
- a response of a type the agent consumes becomes a `Consume` (the I/O edge
  hands it to a callback, then asks for the ACK/NACK); Envoy types become
  `ToEnvoy`, the same bytes to send on; other types become a `Drop`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from istio_agent.protos import typeurls
from istio_agent.xds.core import messages, routing
from istio_agent.xds.core.messages import ErrorDetail, RequestHead, ResponseHead

if TYPE_CHECKING:
    from envoy.config.core.v3 import base_pb2

NodeHook = Callable[["base_pb2.Node"], None]


@dataclass(frozen=True, slots=True)
class Health:
    """The workload's health as the agent reports it to istiod."""

    healthy: bool
    message: str = ""


def health_request(health: Health, delta: bool) -> bytes:
    """A HealthInformation request: empty when healthy, error_detail INTERNAL + message when not."""
    error = None if health.healthy else ErrorDetail(routing.CODE_INTERNAL, health.message)
    return messages.encode_request(typeurls.HEALTH_INFO, delta=delta, error=error)


@dataclass(frozen=True, slots=True)
class ToEnvoy:
    """Send these exact bytes on to Envoy."""

    data: bytes
    type_url: str


@dataclass(frozen=True, slots=True)
class Consume:
    """A response for the agent itself: the first resource's Any value, plus what the ACK needs."""

    type_url: str
    value: bytes
    nonce: str
    version_info: str


@dataclass(frozen=True, slots=True)
class Drop:
    """A response neither consumed nor forwardable; nothing is sent anywhere."""

    type_url: str
    reason: str


ResponseAction = ToEnvoy | Consume | Drop


class StreamSession:
    """Routing state of one proxied stream (SotW or Delta)."""

    def __init__(self, *, delta: bool, consumed: frozenset[str], health: Health | None = None) -> None:
        self.delta = delta
        self.consumed = consumed
        self.health = health
        self.lds_seen = False
        self.requests = 0
        self.responses = 0

    def on_request(self, data: bytes) -> list[bytes]:
        """Envoy sent `data`: what to send upstream, in order. Raises DecodeError on garbage."""
        return self.upstream_requests(messages.request_head(data, self.delta), data)

    def upstream_requests(self, head: RequestHead, data: bytes) -> list[bytes]:
        """`on_request` for a request whose head the caller has already parsed (it needs it too)."""
        self.requests += 1
        out = [data]
        if not self.lds_seen and head.type_url == typeurls.LISTENER:
            self.lds_seen = True
            # Fixed order, as upstream: name table, then proxy config, then health.
            for type_url in (typeurls.NAME_TABLE, typeurls.PROXY_CONFIG):
                if type_url in self.consumed:
                    out.append(messages.encode_request(type_url, delta=self.delta))
            if self.health is not None:
                out.append(health_request(self.health, self.delta))
        return out

    def on_health(self, health: Health) -> list[bytes]:
        """The agent's health changed: the report to send now (none before LDS; it is kept for then)."""
        self.health = health
        return [health_request(health, self.delta)] if self.lds_seen else []

    def on_response(self, data: bytes) -> ResponseAction:
        """istiod sent `data`: forward it, consume it, or drop it. Raises DecodeError on garbage."""
        head = messages.response_head(data, self.delta)
        self.responses += 1
        return self.route(head, data)

    def route(self, head: ResponseHead, data: bytes) -> ResponseAction:
        if head.type_url in self.consumed:
            first = messages.first_resource_value(data, self.delta)
            if first is None:
                # Istio's own types are singletons; an empty push carries nothing to apply or ACK.
                return Drop(head.type_url, "empty response for a consumed type")
            return Consume(head.type_url, first[1], head.nonce, head.version_info)
        if routing.forwardable(head.type_url):
            return ToEnvoy(data, head.type_url)
        return Drop(head.type_url, "not an Envoy type")

    def ack(self, consumed: Consume, error: str | None = None) -> bytes:
        """ACK (or NACK with INTERNAL + `error`) for a consumed response, to send upstream."""
        detail = ErrorDetail(routing.CODE_INTERNAL, error) if error is not None else None
        return messages.encode_request(
            consumed.type_url,
            delta=self.delta,
            response_nonce=consumed.nonce,
            version_info=consumed.version_info,
            error=detail,
        )


def apply_node_hook(data: bytes, delta: bool, hook: NodeHook) -> bytes:
    """Let `hook` edit the Node of a stream's first request; the only request the proxy fully decodes."""
    from envoy.service.discovery.v3 import discovery_pb2

    request = discovery_pb2.DeltaDiscoveryRequest() if delta else discovery_pb2.DiscoveryRequest()
    try:
        request.ParseFromString(data)
    except Exception as exc:
        raise messages.DecodeError(f"malformed first request: {exc}") from None
    hook(request.node)
    return bytes(request.SerializeToString())
