"""Who is asking: the proxy as istiod sees it, from the xDS `Node` (id + metadata).

The node id is `<type>~<ip>~<pod>.<namespace>~<dns domain>`
(`sidecar~10.244.0.5~echo-1.default~default.svc.cluster.local`); the metadata
carries labels, service account, the generator to use (`GENERATOR: grpc`
for proxyless clients) and feature flags such as `DNS_AUTO_ALLOCATE`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import base_pb2
from google.protobuf import json_format

from istio_agent.config.gobool import is_true

PROXY_TYPES = ("sidecar", "router", "waypoint")


class ProxyError(ValueError):
    """The node cannot be served (malformed id); the message goes back to the client."""


@dataclass(frozen=True)
class Proxy:
    """A connected proxy's identity and the metadata the generators read."""

    id: str
    type: str
    ip: str
    pod_name: str
    namespace: str
    dns_domain: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        raw = self.metadata.get("LABELS")
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}

    @property
    def service_account(self) -> str:
        return str(self.metadata.get("SERVICE_ACCOUNT") or "")

    @property
    def generator(self) -> str:
        return str(self.metadata.get("GENERATOR") or "")

    @property
    def dns_auto_allocate(self) -> bool:
        return is_true(self.metadata.get("DNS_AUTO_ALLOCATE", ""))

    @property
    def dns_capture(self) -> bool:
        return is_true(self.metadata.get("DNS_CAPTURE", ""))

    @property
    def ips(self) -> list[str]:
        return list(dict.fromkeys([self.ip, *instance_ips(self.id, self.metadata)]))

    @property
    def proxy_config(self) -> Mapping[str, Any]:
        raw = self.metadata.get("PROXY_CONFIG")
        return raw if isinstance(raw, Mapping) else {}

    @property
    def key(self) -> tuple[str, str]:
        """The pod this proxy runs for, as (namespace, name)."""
        return (self.namespace, self.pod_name)


def valid_ip(text: str) -> bool:
    """An IPv4 or IPv6 address and nothing else (no prefix length, no zone, no leading zeros, no spaces)."""
    if "%" in text:  # a zone names an interface of the proxy's own host: no address for anyone else to reach
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def instance_ips(node_id: str, metadata: Mapping[str, Any]) -> list[str]:
    """The addresses INSTANCE_IPS lists; ProxyError naming the first that is not an IP address.

    A WorkloadEntry is made from the first one and its address is pushed in the EDS of every proxy that
    calls the service: what is not an IP (`evil`, `300.1.1.1`, `10.0.0.1/8`, `1.2.3.4 ; rm`) is refused with
    the stream, as a node id's bad IP is."""
    raw = str(metadata.get("INSTANCE_IPS") or "")
    listed = [ip.strip() for ip in raw.split(",") if ip.strip()]
    for ip in listed:
        if not valid_ip(ip):
            raise ProxyError(f"node {node_id!r}: INSTANCE_IPS {raw!r}: {ip!r} is not an IP address")
    return listed


def parse_node_id(node_id: str, metadata: Mapping[str, Any] | None = None) -> Proxy:
    """Parse a node id; NAME/NAMESPACE metadata win over the id's `pod.namespace` part, as upstream."""
    meta = dict(metadata or {})
    parts = node_id.split("~")
    if len(parts) != 4:
        raise ProxyError(f"node id {node_id!r} is not <type>~<ip>~<pod>.<namespace>~<domain>")
    proxy_type, ip, pod_ns, domain = parts
    if proxy_type not in PROXY_TYPES:
        raise ProxyError(f"node id {node_id!r}: proxy type {proxy_type!r} is not one of {', '.join(PROXY_TYPES)}")
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        raise ProxyError(f"node id {node_id!r}: {ip!r} is not an IP address") from None
    instance_ips(node_id, meta)
    pod, _, namespace = pod_ns.rpartition(".") if "." in pod_ns else (pod_ns, "", "")
    namespace = str(meta.get("NAMESPACE") or namespace)
    pod = str(meta.get("NAME") or pod)
    if not namespace:
        raise ProxyError(f"node id {node_id!r} names no namespace (<pod>.<namespace>)")
    return Proxy(node_id, proxy_type, ip, pod, namespace, domain, meta)


def proxy_from_node(node: base_pb2.Node) -> Proxy:
    metadata = json_format.MessageToDict(node.metadata) if node.HasField("metadata") else {}
    return parse_node_id(node.id, metadata)
