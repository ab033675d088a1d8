"""The node metadata that goes into the gRPC bootstrap: only upstream's typed fields.

Upstream builds the bootstrap's `node.metadata` by JSON-encoding its typed
`BootstrapNodeMetadata` struct, whose raw map is tagged `json:"-"`. So a key
set only through an arbitrary `ISTIO_META_FOO` reaches Envoy's bootstrap but
not gRPC's, and each typed key keeps its Go type: string-bools appear only
when true (except METADATA_DISCOVERY, a pointer, which keeps "false"), the
two Envoy ports are numbers, empty strings, lists and maps are left out,
and POD_PORTS is re-encoded as a compact JSON string. Every nested map is
sorted, as protojson writes a `Struct`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from istio_agent.config.gobool import is_true
from istio_agent.config.node import STRING_BOOL_KEYS

_STRING_KEYS = frozenset({
    "ISTIO_VERSION", "ISTIO_REVISION", "NAMESPACE", "NODE_NAME", "WORKLOAD_NAME", "INTERCEPTION_MODE",
    "SERVICE_ACCOUNT", "HTTP_PROXY_PORT", "MESH_ID", "CLUSTER_ID", "NETWORK", "TLS_SERVER_CERT_CHAIN",
    "TLS_SERVER_KEY", "TLS_SERVER_ROOT_CERT", "TLS_CLIENT_CERT_CHAIN", "TLS_CLIENT_KEY", "TLS_CLIENT_ROOT_CERT",
    "BASE", "IDLE_TIMEOUT", "HTTP10", "GENERATOR", "AUTO_REGISTER_GROUP", "WORKLOAD_ENTRY", "UNPRIVILEGED_POD",
    "STS_PORT", "CLOUDRUN_ADDR", "WORKLOAD_IDENTITY_SOCKET_FILE", "NAME", "OWNER", "OUTLIER_LOG_PATH",
    "APP_CONTAINERS", "ISTIO_PROXY_SHA",
    # comma-joined string lists (Go's StringList marshals back to the same string)
    "INSTANCE_IPS", "REQUESTED_NETWORK_VIEW",
})
_STRING_MAP_KEYS = frozenset({"LABELS", "STATIC_LABELS", "ANNOTATIONS", "PLATFORM_METADATA"})
_INT_KEYS = frozenset({"ENVOY_STATUS_PORT", "ENVOY_PROMETHEUS_PORT", "ENVOY_SECURE_METRICS_PORT",
                        "ENVOY_SECURE_MERGED_METRICS_PORT"})
TYPED_KEYS = (_STRING_KEYS | _STRING_MAP_KEYS | frozenset(STRING_BOOL_KEYS) | _INT_KEYS
              | {"PROXY_CONFIG", "PILOT_SAN", "METADATA_DISCOVERY", "POD_PORTS"})


def sorted_json(value: Any) -> Any:
    """`value` with every dict's keys sorted, at every depth (protojson's `Struct` order)."""
    if isinstance(value, Mapping):
        return {str(key): sorted_json(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [sorted_json(item) for item in value]
    return value


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _pod_ports(value: Any) -> str:
    """POD_PORTS as Go re-encodes it: `[{"name":..,"containerPort":..,"protocol":..}]`, compact."""
    text = str(value)
    try:
        ports = json.loads(text)
    except json.JSONDecodeError:
        return text
    if not isinstance(ports, list) or not all(isinstance(p, Mapping) for p in ports):
        return text
    normalised = []
    for port in ports:
        entry: dict[str, Any] = {}
        if port.get("name"):
            entry["name"] = str(port["name"])
        entry["containerPort"] = _int(port.get("containerPort"))
        entry["protocol"] = str(port.get("protocol") or "")
        normalised.append(entry)
    return json.dumps(normalised, separators=(",", ":"), ensure_ascii=False)


def typed_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The typed subset of the agent's node metadata, with Go's types and omissions, keys sorted."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if key not in TYPED_KEYS or value is None:
            continue
        if key in _STRING_KEYS:
            if isinstance(value, str) and value:
                out[key] = value
        elif key in _STRING_MAP_KEYS:
            if isinstance(value, Mapping) and value:
                out[key] = {str(k): str(v) for k, v in value.items()}
        elif key in STRING_BOOL_KEYS:
            if is_true(value):
                out[key] = "true"
        elif key in _INT_KEYS:
            if _int(value):
                out[key] = _int(value)
        elif key == "METADATA_DISCOVERY":
            out[key] = "true" if is_true(value) else "false"
        elif key == "PILOT_SAN":
            if isinstance(value, list | tuple) and value:
                out[key] = [str(item) for item in value]
        elif key == "POD_PORTS":
            if value:
                out[key] = _pod_ports(value)
        elif key == "PROXY_CONFIG" and isinstance(value, Mapping):
            out[key] = dict(value)
    return sorted_json(out)
