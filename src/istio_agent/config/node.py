"""The proxy's identity towards istiod: node id and node metadata.

The node id `<type>~<ip>~<pod>.<namespace>~<domain>` is how istiod finds the
proxy's pod; the metadata is everything else istiod (and the bootstrap) reads
about it. Both are pure functions of the environment and pod files, so the
same inputs always give the same node.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from istio_agent.config import env
from istio_agent.config.errors import ConfigError

PROXY_TYPES = ("sidecar", "router")


def instance_ips(environment: env.Environment) -> list[str]:
    """Pod IPs: `INSTANCE_IP` first, then `INSTANCE_IPS`, duplicates and non-IPs dropped.

    Falls back to 127.0.0.1 when nothing usable is set, as upstream does for
    agents started outside a pod.
    """
    ips: list[str] = []
    candidates = [environment.get(env.INSTANCE_IP), *environment.get(env.INSTANCE_IPS).split(",")]
    for candidate in candidates:
        text = candidate.strip()
        if not text:
            continue
        try:
            ipaddress.ip_address(text)
        except ValueError:
            continue
        if text not in ips:
            ips.append(text)
    return ips or ["127.0.0.1"]


def default_domain(namespace: str) -> str:
    return f"{namespace}.svc.cluster.local" if namespace else "cluster.local"


def node_id(proxy_type: str, ip: str, pod_name: str, namespace: str, domain: str) -> str:
    if proxy_type not in PROXY_TYPES:
        raise ConfigError(f"proxy type {proxy_type!r} is not one of {', '.join(PROXY_TYPES)}")
    return f"{proxy_type}~{ip}~{pod_name}.{namespace}~{domain}"


@dataclass(frozen=True)
class NodeIdentity:
    """Who this proxy is: what goes into the node id and the SPIFFE id."""

    proxy_type: str
    ips: tuple[str, ...]
    pod_name: str
    namespace: str
    service_account: str
    domain: str
    trust_domain: str
    cluster_id: str

    @property
    def id(self) -> str:
        return node_id(self.proxy_type, self.ips[0], self.pod_name, self.namespace, self.domain)

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"


def identity_from_env(environment: env.Environment, proxy_type: str, domain: str | None) -> NodeIdentity:
    namespace = environment.get(env.POD_NAMESPACE)
    return NodeIdentity(
        proxy_type=proxy_type,
        ips=tuple(instance_ips(environment)),
        pod_name=environment.get(env.POD_NAME),
        namespace=namespace,
        service_account=environment.get(env.SERVICE_ACCOUNT),
        domain=domain or default_domain(namespace),
        trust_domain=environment.get(env.TRUST_DOMAIN),
        cluster_id=environment.get(env.ISTIO_META_CLUSTER_ID),
    )


def node_metadata(
    environment: env.Environment,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    proxy_config_json: Mapping[str, Any],
    ips: list[str],
) -> dict[str, Any]:
    """Node metadata sent to istiod: ISTIO_META_*, ISTIO_METAJSON_*, pod labels and annotations."""
    meta: dict[str, Any] = {}
    for key, raw in environment.with_prefix(env.ISTIO_METAJSON_PREFIX):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"environment variable {env.ISTIO_METAJSON_PREFIX}{key}: invalid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"environment variable {env.ISTIO_METAJSON_PREFIX}{key}: expected a JSON object")
        meta.update(value)
    for key, value in environment.with_prefix(env.ISTIO_META_PREFIX):
        meta[key] = value
    pod_labels = {k: v for k, v in labels.items() if k != "pod-template-hash"}
    if pod_labels:
        meta["LABELS"] = {**meta.get("LABELS", {}), **pod_labels}
    if annotations:
        meta["ANNOTATIONS"] = {**meta.get("ANNOTATIONS", {}), **annotations}
    meta["INSTANCE_IPS"] = ",".join(ips)
    version = environment.get(env.ISTIO_VERSION)
    if version:
        meta.setdefault("ISTIO_VERSION", version)
    namespace = environment.get(env.POD_NAMESPACE)
    if namespace:
        meta.setdefault("NAMESPACE", namespace)
    pod = environment.get(env.POD_NAME)
    if pod:
        meta.setdefault("NAME", pod)
    meta.setdefault("CLUSTER_ID", environment.get(env.ISTIO_META_CLUSTER_ID))
    meta["PROXY_CONFIG"] = dict(proxy_config_json)
    if environment.get(env.ISTIO_META_DNS_CAPTURE) or environment.get(env.ISTIO_META_ENABLE_DNS_SERVER):
        meta["DNS_PROXY_ADDR"] = environment.get(env.DNS_PROXY_ADDR)
    return meta
