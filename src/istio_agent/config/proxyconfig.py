"""ProxyConfig and its layering, as the agent sees it at start.

Upstream builds the effective ProxyConfig from the built-in defaults, then the
mesh file's `defaultConfig`, then the `PROXY_CONFIG` environment variable, then
the pod's `proxy.istio.io/config` annotation. Each later layer replaces whole
top-level fields (a `tracing` block replaces the whole `tracing` block), except
`proxyMetadata`, whose entries are merged key by key.

Every field is checked as upstream's parser checks it, nested messages
included (`config/proxyconfig_fields.py` is the type, `config/protojson.py` the
reader): a value of the wrong type fails the start naming the layer, the field
path and the value. Values are kept in protobuf-JSON shape (camelCase keys;
top-level durations as seconds, which the resolver reads; nested messages
exactly as upstream's marshaller writes them), because node metadata and the
bootstrap template consume that shape. Field names in either camelCase or
snake_case are accepted; unknown fields are dropped with a warning, as upstream
does. Setting one member of a oneof (`serviceCluster` / `tracingServiceName`)
in a later layer clears the other, as it does upstream.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from istio_agent.config import protojson
from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError
from istio_agent.config.gounquote import go_unquote
from istio_agent.config.proxyconfig_fields import PROXY_CONFIG
from istio_agent.config.textfile import read_text

log = logging.getLogger(__name__)

# Every ProxyConfig field upstream defines (istio.mesh.v1alpha1.ProxyConfig), by protojson name.
FIELDS: dict[str, protojson.Field] = {spec.json_name: spec for spec in PROXY_CONFIG.fields}
# Top-level durations are held as seconds (what the resolver reads) and written back as "45s".
DURATION_FIELDS = frozenset(name for name, spec in FIELDS.items() if spec.kind == "duration")
PORT_FIELDS = frozenset({"proxyAdminPort", "statusPort"})
# The proxyHeaders settings a later layer that leaves them unset does not clear.
KEPT_PROXY_HEADERS = ("forwardedClientCert", "requestId", "attemptCount", "server", "envoyDebugHeaders")
ONEOFS: dict[str, tuple[str, ...]] = {}
for _spec in PROXY_CONFIG.fields:
    if _spec.oneof:
        ONEOFS[_spec.oneof] = (*ONEOFS.get(_spec.oneof, ()), _spec.json_name)


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
}


def parse_layer(fields: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Validate one layer of ProxyConfig; errors name `source`, the field path and the value.

    The result holds exactly the fields the layer sets (zero values included, since they
    replace a lower layer's value), top-level durations in seconds.
    """
    def warn(text: str) -> None:
        log.warning("%s: %s", source, text.replace(f"of {PROXY_CONFIG.full_name}", "of ProxyConfig"))

    try:
        values = protojson.read_fields(PROXY_CONFIG, fields, "", warn)
        for name in PORT_FIELDS & values.keys():
            if not 0 <= values[name] <= 65535:  # upstream's start-up validation refuses these
                raise ConfigError(f"field {name}: port {values[name]} out of range 0-65535")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    for name in DURATION_FIELDS & values.keys():
        values[name] = parse_duration(values[name])
    return values


class _NotPlainJson(Exception):
    """The text uses a JSON form that PyYAML reads differently (floats, NaN): parse it as YAML."""


def _refuse(text: str) -> Any:
    raise _NotPlainJson(text)


# PyYAML takes a mapping key only within 1,024 characters of the ':' after it, on the same line.
_MAX_KEY = 1000
_MAX_GAP = " " * 20


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if any(len(key) > _MAX_KEY for key, _ in pairs):
        raise _NotPlainJson(pairs)
    return dict(pairs)  # a repeated key: the last wins, as in PyYAML


def plain_json(text: str) -> Any:
    """`text` parsed as JSON when PyYAML would give exactly the same value, else `_NotPlainJson`.

    That is one line (line breaks around it aside) of printable ASCII JSON without backslash escapes,
    floats, NaN/Infinity, keys over 1,000 characters or runs of 20 spaces (PyYAML reads `1e3` as a
    string, handles escapes its own way, refuses tabs, DEL, a key split from its ':' by a line break or
    over 1,024 characters): objects, arrays, plain strings, integers, true, false and null then read the
    same either way. The injector writes PROXY_CONFIG as such JSON, so an agent never loads PyYAML
    (~1 MB) unless a layer is YAML.
    """
    body = text.strip(" \r\n")  # line breaks around the document are nothing to either (`value: |` adds one)
    if not (body.isascii() and body.isprintable()) or "\\" in body or _MAX_GAP in body:
        raise _NotPlainJson(text)
    try:
        return json.loads(body, parse_float=_refuse, parse_constant=_refuse, object_pairs_hook=_pairs)
    except ValueError:
        raise _NotPlainJson(text) from None


def load_document(text: str, source: str) -> dict[str, Any]:
    """Parse YAML (a superset of JSON) that must hold an object; empty text is an empty object."""
    if text.lstrip().startswith("{"):
        try:
            doc = plain_json(text)
        except _NotPlainJson:
            pass
        else:
            return _as_object(doc, source)
    import yaml  # not for plain JSON (above): PyYAML is ~1 MB the agent otherwise never loads

    try:
        doc = yaml.load(text, Loader=go_yaml_loader()) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML or JSON{where}: {exc}") from None
    return _as_object(doc, source)


_GO_YAML_LOADER: Any = None


def go_yaml_loader() -> Any:
    """PyYAML's SafeLoader reading booleans as upstream's YAML (go-yaml v2, under sigs.k8s.io/yaml) does: YAML
    1.1's spellings plus `y`, `Y`, `n` and `N`, so `ISTIO_META_X: y` is the boolean true there as here."""
    global _GO_YAML_LOADER
    if _GO_YAML_LOADER is None:
        import re

        import yaml

        class GoYamlLoader(yaml.SafeLoader):
            bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}

        GoYamlLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
        _GO_YAML_LOADER = GoYamlLoader
    return _GO_YAML_LOADER


def _as_object(doc: Any, source: str) -> dict[str, Any]:
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
        """Lay a validated layer over this config: fields replace, proxyMetadata entries merge, and a new
        proxyHeaders keeps the earlier layer's header settings it leaves unset (upstream's MergeProxyConfig)."""
        for name, value in layer.items():
            self.explicit.add(name)
            oneof = FIELDS[name].oneof if name in FIELDS else ""
            for other in ONEOFS.get(oneof, ()):
                if other != name:
                    self.values.pop(other, None)
            if name == "proxyMetadata":
                merged = dict(self.values.get("proxyMetadata", {}))
                merged.update(value)
                self.values[name] = merged
            elif name == "proxyHeaders" and isinstance(self.values.get(name), Mapping):
                earlier = self.values[name]
                kept = {key: earlier[key] for key in KEPT_PROXY_HEADERS if key in earlier and key not in value}
                self.values[name] = {**copy.deepcopy(value), **copy.deepcopy(kept)}
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
        """Protojson form, as upstream marshals it into node metadata: durations back to `"45s"`, and
        fields holding their zero value (an empty string, 0, false, the first enum value) left out."""
        out: dict[str, Any] = {}
        for name, value in self.values.items():
            spec = FIELDS.get(name)
            if spec is None:
                out[name] = copy.deepcopy(value)
            elif name in DURATION_FIELDS:
                out[name] = protojson.format_duration_json(float(value))
            elif not protojson.is_zero(spec, value):
                out[name] = copy.deepcopy(value)
        return out


PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"


def parse_annotations(text: str) -> dict[str, str]:
    """A downward-API labels/annotations file, read as upstream reads it: `key="value"` lines with Go-quoted
    values; a line without `=` is skipped; a value that does not unquote fails the whole file (ConfigError)."""
    out: dict[str, str] = {}
    for line_no, line in enumerate(text.split("\n"), start=1):
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            out[key] = go_unquote(value)
        except ValueError as exc:
            raise ConfigError(f"line {line_no}: {exc}") from None
    return out


def read_pod_file(path: Path) -> dict[str, str]:
    """A downward-API labels/annotations file; missing is an empty map. A file that does not parse is left out
    with a warning naming it and the line, as upstream's agent carries on without it."""
    source = f"pod file {path}"
    try:
        return parse_annotations(read_text(path, source))
    except FileNotFoundError:
        return {}
    except ConfigError as exc:
        message = str(exc) if str(exc).startswith(source) else f"{source} {exc}"
        log.warning("%s; its labels or annotations are not used", message)
        return {}


def build_proxy_config(
    mesh_text: str | None,
    proxy_config_env: str,
    annotations: Mapping[str, str],
    mesh_source: str = "mesh config",
    check_mesh: Callable[[ProxyConfig], None] | None = None,
) -> ProxyConfig:
    """Layer mesh `defaultConfig`, `PROXY_CONFIG` and the pod annotation over the defaults.

    `check_mesh` sees the mesh file's layer over the defaults before the later layers: upstream validates the
    mesh config it reads (its `defaultConfig` too) whatever PROXY_CONFIG or the annotation then replace.
    """
    config = ProxyConfig()
    if mesh_text:
        mesh = load_document(mesh_text, mesh_source)
        default_config = mesh.get("defaultConfig") or {}
        if not isinstance(default_config, dict):
            raise ConfigError(f"{mesh_source}: field defaultConfig: expected an object, got {default_config!r}")
        config.apply(parse_layer(default_config, f"{mesh_source} defaultConfig"))
        if check_mesh is not None:
            try:
                check_mesh(config)
            except ConfigError as exc:
                raise ConfigError(f"{mesh_source}: {exc}") from None
    if proxy_config_env.strip():
        config.apply(parse_layer(load_document(proxy_config_env, "PROXY_CONFIG"), "PROXY_CONFIG"))
    annotation = annotations.get(PROXY_CONFIG_ANNOTATION, "")
    if annotation.strip():
        source = f"annotation {PROXY_CONFIG_ANNOTATION}"
        config.apply(parse_layer(load_document(annotation, source), source))
    return config
