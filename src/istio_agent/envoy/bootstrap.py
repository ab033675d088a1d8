"""The Envoy bootstrap (`<configPath>/envoy-rev.json`), built as data.

`render_bootstrap(options)` is a pure function from `BootstrapOptions` to the
bootstrap as a dict, equal (as parsed JSON) to what upstream's template renders
for the same inputs: admin on localhost, ADS to the agent's `XDS` pipe, the
`sds-grpc` pipe, the Prometheus (15090) and readiness (15021) listeners, stats
tags and matchers, tracing and the other ProxyConfig-driven parts.

`write_bootstrap()` is the thin I/O edge: it chooses between this built-in
rendering and a custom template (`customConfigFile`, `proxyBootstrapTemplatePath`,
`--templateFile`, `ISTIO_BOOTSTRAP`, as upstream orders them) and writes the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from istio_agent.config.errors import ConfigError
from istio_agent.envoy import bootstrap_stats as stats
from istio_agent.envoy import bootstrap_tracing as tracing
from istio_agent.envoy.bootstrap_options import (
    AddressFamily,
    BootstrapOptions,
    address_family,
    locality,
    max_downstream_connections,
    runtime_flags,
    service_cluster,
)

# Upstream's default template location; when no file is there the built-in rendering is used.
DEFAULT_TEMPLATE_PATH = "./var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
TEXT_LOG_FORMAT = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"
JSON_LOG_FORMAT = {
    "level": "%l", "time": "%Y-%m-%dT%T.%fZ", "scope": "envoy %n", "caller": "%g:%#", "msg": "%j", "thread": "%t",
}
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = {"name": "envoy.filters.http.router",
           "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def _static_cluster(name: str, address: dict[str, Any], connect_timeout: str) -> dict[str, Any]:
    return {
        "name": name,
        "alt_stat_name": f"{name};",
        "type": "STATIC",
        "connect_timeout": connect_timeout,
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
    }


def _tcp(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"protocol": "TCP", "address": address, "port_value": port}}


def _pipe_cluster(name: str, path: str) -> dict[str, Any]:
    cluster = _static_cluster(name, {"pipe": {"path": path}}, "1s")
    cluster["typed_extension_protocol_options"] = tracing.http2_protocol_options()
    return cluster


def _xds_cluster(path: str) -> dict[str, Any]:
    cluster = _pipe_cluster("xds-grpc", path)
    limits = {"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}
    cluster["circuit_breakers"] = {"thresholds": [{"priority": p, **limits} for p in ("DEFAULT", "HIGH")]}
    cluster["upstream_connection_options"] = {"tcp_keepalive": {"keepalive_time": 300}}
    cluster["max_requests_per_connection"] = 1
    return cluster


def _http_listener(
    family: AddressFamily, address: str, port: int, stat_prefix: str, route_prefix: str, cluster: str,
    filters: list[dict[str, Any]], bypass_overload: bool,
) -> dict[str, Any]:
    listener: dict[str, Any] = {"name": f"{address}_{port}", "address": _tcp(address, port)}
    if family.dual_stack:
        listener["additional_addresses"] = [{"address": _tcp(family.additional_wildcard, port)}]
    listener["ignore_global_conn_limit"] = True
    if bypass_overload:
        listener["bypass_overload_manager"] = True
    manager = {
        "@type": HCM_TYPE,
        "codec_type": "AUTO",
        "stat_prefix": stat_prefix,
        "route_config": {"virtual_hosts": [{
            "name": "backend",
            "domains": ["*"],
            "routes": [{"match": {"prefix": route_prefix}, "route": {"cluster": cluster}}],
        }]},
        "http_filters": [*filters, _ROUTER],
    }
    listener["filter_chains"] = [{"filters": [
        {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager},
    ]}]
    return listener


def _listeners(opts: BootstrapOptions, family: AddressFamily, compression: str) -> list[dict[str, Any]]:
    meta = opts.metadata
    prometheus_port = int(meta.get("ENVOY_PROMETHEUS_PORT") or 15090)
    status_port = int(meta.get("ENVOY_STATUS_PORT") or 15021)
    localhost_only = dict(opts.proxy_config.get("proxyMetadata") or {}).get("METRICS_LOCALHOST_ACCESS_ONLY") == "true"
    metrics_address = family.localhost if localhost_only else family.wildcard
    return [
        _http_listener(family, metrics_address, prometheus_port, "stats", "/stats/prometheus", "prometheus_stats",
                       stats.compression_filters(compression), opts.bypass_overload_manager),
        _http_listener(family, family.wildcard, status_port, "agent", "/healthz/ready", "agent", [],
                       opts.bypass_overload_manager),
    ]


def _clusters(opts: BootstrapOptions, family: AddressFamily, trace: tracing.TracingParts) -> list[dict[str, Any]]:
    clusters = [
        _static_cluster("prometheus_stats", _tcp(family.localhost, opts.admin_port), "0.250s"),
        _static_cluster("agent", _tcp(family.localhost, opts.status_port), "0.250s"),
        _pipe_cluster("sds-grpc", opts.sds_socket),
        _xds_cluster(opts.xds_socket),
    ]
    if trace.cluster is not None:
        clusters.append(trace.cluster)
    pc = opts.proxy_config
    for field, name in (("envoyMetricsService", "envoy_metrics_service"),
                        ("envoyAccessLogService", "envoy_accesslog_service")):
        service = pc.get(field) or {}
        if service.get("address"):
            clusters.append(tracing.remote_service_cluster(name, service, opts.metadata, family.dns_lookup_family,
                                                           opts.host_ip))
    legacy_address = pc.get("envoyMetricsServiceAddress")
    if legacy_address and not (pc.get("envoyMetricsService") or {}).get("address"):
        legacy = {"address": legacy_address}
        clusters.append(tracing.remote_service_cluster(
            "envoy_metrics_service", legacy, opts.metadata, family.dns_lookup_family, opts.host_ip))
    return clusters


def _cluster_manager(opts: BootstrapOptions) -> dict[str, Any]:
    manager: dict[str, Any] = {}
    if opts.metadata.get("OUTLIER_LOG_PATH"):
        manager["outlier_detection"] = {"event_log_path": str(opts.metadata["OUTLIER_LOG_PATH"])}
    lrs = opts.metadata.get("LOAD_STATS_CONFIG_JSON")
    if isinstance(lrs, str) and lrs:
        try:
            manager["load_stats_config"] = json.loads(lrs)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"node metadata LOAD_STATS_CONFIG_JSON: invalid JSON: {exc}") from None
    if opts.deferred_cluster_creation:
        manager["enable_deferred_cluster_creation"] = True
    return manager


def render_bootstrap(opts: BootstrapOptions) -> dict[str, Any]:
    """The bootstrap for `opts`, as a JSON-ready dict (pure: no files, no environment)."""
    family = address_family(opts.instance_ips, opts.dual_stack)
    cluster_name = service_cluster(opts.proxy_config, opts.metadata)
    stats_opts = stats.stats_options(opts.annotations, opts.proxy_config, opts.instance_ips,
                                     opts.exit_on_zero_active_connections)
    trace = tracing.tracing_parts(opts.proxy_config.get("tracing"), opts.metadata, cluster_name,
                                  family.dns_lookup_family, opts.lightstep_token_path, opts.host_ip)
    discovery = opts.metadata_discovery
    extensions: list[dict[str, Any]] = []
    if discovery:
        extensions.append({"name": "metadata_discovery", "typed_config": {
            "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "type_url": "type.googleapis.com/istio.workload.BootstrapExtension",
            "value": {"config_source": {"ads": {}}},
        }})
    extensions.append({"name": "envoy.bootstrap.internal_listener", "typed_config": {
        "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
        "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
        "value": {"buffer_size_kb": 64},
    }})
    log_format: dict[str, Any] = {"json_format": dict(JSON_LOG_FORMAT)} if opts.log_as_json else {
        "text_format": TEXT_LOG_FORMAT}
    ads = {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
    out: dict[str, Any] = {
        "application_log_config": {"log_format": log_format},
        "node": {
            "id": opts.node_id,
            "cluster": cluster_name,
            "locality": locality(opts.metadata),
            "metadata": dict(opts.metadata),
        },
        "layered_runtime": {"layers": [
            {"name": "global config",
             "static_layer": runtime_flags(opts.proxy_config, opts.compliance_policy, opts.strip_fragment)},
            {"name": "admin", "admin_layer": {}},
        ]},
        "bootstrap_extensions": extensions,
        **stats.interval_fields(stats_opts),
        "stats_config": stats.stats_config(stats_opts, discovery),
        "admin": {
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": "/dev/null",
            }}],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": {"socket_address": {"address": family.localhost, "port_value": opts.admin_port}},
        },
        "dynamic_resources": {
            "lds_config": dict(ads),
            "cds_config": dict(ads),
            "ads_config": {
                "api_type": opts.xds_type,
                "set_node_on_first_message_only": True,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
            },
        },
        "static_resources": {
            "clusters": _clusters(opts, family, trace),
            "listeners": _listeners(opts, family, stats_opts.compression),
        },
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                         "DownstreamConnectionsConfig",
                "max_active_downstream_connections": max_downstream_connections(opts.proxy_config, opts.metadata),
            },
        }]},
    }
    if trace.tracing is not None:
        out["tracing"] = trace.tracing
    pc = opts.proxy_config
    metrics_service = bool((pc.get("envoyMetricsService") or {}).get("address") or pc.get("envoyMetricsServiceAddress"))
    sinks = tracing.stats_sinks(metrics_service, str(pc.get("statsdUdpAddress", "")), opts.host_ip)
    if sinks:
        out["stats_sinks"] = sinks
    manager = _cluster_manager(opts)
    if manager:
        out["cluster_manager"] = manager
    if opts.deferred_stats_creation:
        out["deferred_stat_options"] = {"enable_deferred_creation_stats": True}
    return out


def effective_template_path(proxy_config: Any, istio_bootstrap: str = "", template_file: str = "") -> str:
    """Which template upstream would use: customConfigFile; else `--templateFile`, which replaces
    proxyBootstrapTemplatePath; else the default location. `ISTIO_BOOTSTRAP` overrides them all."""
    if istio_bootstrap:
        return istio_bootstrap
    if proxy_config.get("customConfigFile"):
        return str(proxy_config["customConfigFile"])
    if template_file:
        return template_file
    if proxy_config.get("proxyBootstrapTemplatePath"):
        return str(proxy_config["proxyBootstrapTemplatePath"])
    return DEFAULT_TEMPLATE_PATH


def output_file_name(template_path: str) -> str:
    """Envoy reads the file type from its extension, so YAML templates give `envoy-rev.yaml`."""
    yaml = template_path.endswith(".yaml") or template_path.endswith(".yaml.tmpl")
    return "envoy-rev.yaml" if yaml else "envoy-rev.json"


@dataclass(frozen=True)
class WrittenBootstrap:
    path: Path
    template: Path | None


def write_bootstrap(
    opts: BootstrapOptions, workdir: Path, istio_bootstrap: str = "", template_file: str = ""
) -> WrittenBootstrap:
    """Render and write `<configPath>/envoy-rev.json` (relative paths resolve against `workdir`).

    A custom template is rendered with upstream's template parameters; without one the
    built-in rendering is written. A Lightstep tracer's token goes to its own file.
    """
    def resolve(path: str) -> Path:
        return Path(path) if os.path.isabs(path) else workdir / path

    config_dir = resolve(opts.config_path)
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    template = effective_template_path(opts.proxy_config, istio_bootstrap, template_file)
    template_file_path = resolve(template)
    use_template = template != DEFAULT_TEMPLATE_PATH or template_file_path.exists()
    lightstep = (opts.proxy_config.get("tracing") or {}).get("lightstep")
    if isinstance(lightstep, dict):
        token = resolve(opts.lightstep_token_path)
        token.write_text(str(lightstep.get("accessToken", "")))
        token.chmod(0o666)
    if use_template:
        from istio_agent.envoy.bootstrap_params import template_params
        from istio_agent.envoy.bootstrap_template import TemplateError, render_template

        try:
            text = template_file_path.read_text()
        except OSError as exc:
            raise ConfigError(f"bootstrap template {template_file_path}: {exc.strerror}") from None
        try:
            rendered = render_template(text, template_params(opts))
        except TemplateError as exc:
            raise ConfigError(f"bootstrap template {template_file_path}: {exc}") from None
        target = config_dir / output_file_name(template)
    else:
        rendered = json.dumps(render_bootstrap(opts), indent=2) + "\n"
        target = config_dir / "envoy-rev.json"
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(rendered)
    tmp.replace(target)
    return WrittenBootstrap(target, template_file_path if use_template else None)
