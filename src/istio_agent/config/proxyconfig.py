"""ProxyConfig and its layering, as the agent sees it at start.

Upstream builds the effective ProxyConfig from the built-in defaults, then the
mesh file's `defaultConfig`, then the `PROXY_CONFIG` environment variable, then
the pod's `proxy.istio.io/config` annotation. Each later layer replaces whole
top-level fields (a `tracing` block replaces the whole `tracing` block), except
`proxyMetadata`, whose entries are merged key by key.

Values are kept in their protobuf-JSON shape (camelCase keys, durations as
seconds after validation) because the bootstrap template consumes exactly that
shape. Field names in either camelCase or snake_case are accepted, as protojson
accepts both; unknown fields are dropped with a warning, as upstream does.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError

log = logging.getLogger(__name__)

Checker = Callable[[str, Any], Any]


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"field {name}: expected a string, got {value!r}")
    return value


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"field {name}: expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"field {name}: expected an integer, got {value!r}") from None


def _check_port(name: str, value: Any) -> int:
    port = _check_int(name, value)
    if not 0 <= port <= 65535:
        raise ConfigError(f"field {name}: port {port} out of range 0-65535")
    return port


def _check_optional_int(name: str, value: Any) -> int | None:
    return None if value is None else _check_int(name, value)


def _check_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"field {name}: expected true or false, got {value!r}")


def _check_duration(name: str, value: Any) -> float:
    """Durations: `"45s"` (protojson), Go spellings like `"1m30s"`, or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"field {name}: expected a duration such as \"45s\", got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise ConfigError(f"field {name}: expected a duration such as \"45s\", got {value!r}") from None
    elif isinstance(value, Mapping) and set(value) <= {"seconds", "nanos"}:
        seconds = float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    else:
        raise ConfigError(f"field {name}: expected a duration such as \"45s\", got {value!r}")
    if seconds < 0:
        raise ConfigError(f"field {name}: duration {value!r} is negative")
    return seconds


def _check_str_map(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"field {name}: expected a map of strings, got {value!r}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, str | int | float):
            raise ConfigError(f"field {name}.{key}: expected a string, got {item!r}")
        out[str(key)] = str(item)
    return out


def _check_str_list(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"field {name}: expected a list of strings, got {value!r}")
    return list(value)


def _check_message(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"field {name}: expected an object, got {value!r}")
    return copy.deepcopy(dict(value))


def _enum(*allowed: str) -> Checker:
    def check(name: str, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(allowed):
            return allowed[value]
        if not isinstance(value, str) or value not in allowed:
            raise ConfigError(f"field {name}: {value!r} is not one of {', '.join(allowed)}")
        return value

    return check


# Every ProxyConfig field upstream defines (istio.mesh.v1alpha1.ProxyConfig), by protojson name.
FIELDS: dict[str, Checker] = {
    "configPath": _check_str,
    "binaryPath": _check_str,
    "serviceCluster": _check_str,
    "tracingServiceName": _enum("APP_LABEL_AND_NAMESPACE", "CANONICAL_NAME_ONLY", "CANONICAL_NAME_AND_NAMESPACE"),
    "drainDuration": _check_duration,
    "parentShutdownDuration": _check_duration,
    "discoveryAddress": _check_str,
    "discoveryRefreshDelay": _check_duration,
    "zipkinAddress": _check_str,
    "statsdUdpAddress": _check_str,
    "envoyMetricsServiceAddress": _check_str,
    "proxyAdminPort": _check_port,
    "availabilityZone": _check_str,
    "controlPlaneAuthPolicy": _enum("NONE", "MUTUAL_TLS", "INHERIT"),
    "customConfigFile": _check_str,
    "statNameLength": _check_int,
    "concurrency": _check_optional_int,
    "proxyBootstrapTemplatePath": _check_str,
    "interceptionMode": _enum("REDIRECT", "TPROXY", "NONE"),
    "tracing": _check_message,
    "sds": _check_message,
    "envoyAccessLogService": _check_message,
    "envoyMetricsService": _check_message,
    "proxyMetadata": _check_str_map,
    "runtimeValues": _check_str_map,
    "statusPort": _check_port,
    "extraStatTags": _check_str_list,
    "gatewayTopology": _check_message,
    "terminationDrainDuration": _check_duration,
    "meshId": _check_str,
    "readinessProbe": _check_message,
    "proxyStatsMatcher": _check_message,
    "holdApplicationUntilProxyStarts": _check_bool,
    "caCertificatesPem": _check_str_list,
    "image": _check_message,
    "privateKeyProvider": _check_message,
    "proxyHeaders": _check_message,
    "fileFlushInterval": _check_duration,
    "fileFlushMinSizeKb": _check_int,
    "serviceAccountMTLS": _check_bool,
}

DEFAULTS: dict[str, Any] = {
    "configPath": "./etc/istio/proxy",
    "binaryPath": "/usr/local/bin/envoy",
    "serviceCluster": "istio-proxy",
    "drainDuration": 45.0,
    "terminationDrainDuration": 5.0,
    "discoveryAddress": "istiod.istio-system.svc:15012",
    "proxyAdminPort": 15000,
    "controlPlaneAuthPolicy": "MUTUAL_TLS",
    "statNameLength": 189,
    "statusPort": 15020,
    "concurrency": 2,
}

_CAMEL = re.compile(r"_([a-z0-9])")


def _camel(name: str) -> str:
    return _CAMEL.sub(lambda m: m.group(1).upper(), name)


def parse_layer(fields: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Validate one layer of ProxyConfig; errors name `source`, the field and the value."""
    out: dict[str, Any] = {}
    for raw_name, value in fields.items():
        name = _camel(str(raw_name))
        check = FIELDS.get(name)
        if check is None:
            log.warning("%s: ignoring unknown ProxyConfig field %r", source, raw_name)
            continue
        if value is None and name != "concurrency":
            continue
        try:
            out[name] = check(name, value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return out


def load_document(text: str, source: str) -> dict[str, Any]:
    """Parse YAML (a superset of JSON) that must hold an object; empty text is an empty object."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML or JSON{where}: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected an object, got {doc!r}")
    return doc


@dataclass
class ProxyConfig:
    """The effective ProxyConfig: validated protojson-shaped values over upstream's defaults."""

    values: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULTS))
    # Fields some layer set explicitly (as opposed to upstream defaults).
    explicit: set[str] = field(default_factory=set)

    def apply(self, layer: Mapping[str, Any]) -> None:
        """Lay a validated layer over this config: fields replace, proxyMetadata entries merge."""
        for name, value in layer.items():
            self.explicit.add(name)
            if name == "proxyMetadata":
                merged = dict(self.values.get("proxyMetadata", {}))
                merged.update(value)
                self.values[name] = merged
            else:
                self.values[name] = copy.deepcopy(value)

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    @property
    def config_path(self) -> str:
        return str(self.values["configPath"])

    @property
    def binary_path(self) -> str:
        return str(self.values["binaryPath"])

    @property
    def discovery_address(self) -> str:
        return str(self.values["discoveryAddress"])

    @property
    def drain_duration(self) -> float:
        return float(self.values["drainDuration"])

    @property
    def termination_drain_duration(self) -> float:
        return float(self.values["terminationDrainDuration"])

    @property
    def proxy_admin_port(self) -> int:
        return int(self.values["proxyAdminPort"])

    @property
    def status_port(self) -> int:
        return int(self.values["statusPort"])

    @property
    def concurrency(self) -> int | None:
        value = self.values.get("concurrency")
        return None if value is None else int(value)

    @property
    def proxy_metadata(self) -> dict[str, str]:
        return dict(self.values.get("proxyMetadata", {}))

    def to_json(self) -> dict[str, Any]:
        """Protojson form (durations back to `"Ns"` strings), e.g. for the bootstrap's node metadata."""
        from istio_agent.config.durations import format_duration

        out: dict[str, Any] = {}
        for name, value in self.values.items():
            if FIELDS.get(name) is _check_duration:
                out[name] = format_duration(value)
            else:
                out[name] = copy.deepcopy(value)
        return out


PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"


def parse_annotations(text: str) -> dict[str, str]:
    """Parse the downward-API annotations file: `key="value"` lines, values Go-quoted."""
    out: dict[str, str] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"annotations line {line_no}: expected key=\"value\", got {line!r}")
        value = value.strip()
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = value[1:-1]
        out[key.strip()] = value
    return out


def read_pod_file(path: Path) -> dict[str, str]:
    """Read a downward-API labels/annotations file; a missing file is an empty map."""
    try:
        return parse_annotations(path.read_text())
    except FileNotFoundError:
        return {}


def build_proxy_config(
    mesh_text: str | None,
    proxy_config_env: str,
    annotations: Mapping[str, str],
    mesh_source: str = "mesh config",
) -> ProxyConfig:
    """Layer mesh `defaultConfig`, `PROXY_CONFIG` and the pod annotation over the defaults."""
    config = ProxyConfig()
    if mesh_text:
        mesh = load_document(mesh_text, mesh_source)
        default_config = mesh.get("defaultConfig") or {}
        if not isinstance(default_config, dict):
            raise ConfigError(f"{mesh_source}: field defaultConfig: expected an object, got {default_config!r}")
        config.apply(parse_layer(default_config, f"{mesh_source} defaultConfig"))
    if proxy_config_env.strip():
        config.apply(parse_layer(load_document(proxy_config_env, "PROXY_CONFIG"), "PROXY_CONFIG"))
    annotation = annotations.get(PROXY_CONFIG_ANNOTATION, "")
    if annotation.strip():
        source = f"annotation {PROXY_CONFIG_ANNOTATION}"
        config.apply(parse_layer(load_document(annotation, source), source))
    return config
