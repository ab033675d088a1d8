"""The Envoy bootstrap (`<configPath>/envoy-rev.json`), built as data.

`render_bootstrap(options)` is a pure function from `BootstrapOptions` to the
bootstrap as a dict, equal (as parsed JSON) to what upstream's template
(`tools/packaging/common/envoy_bootstrap.json`) renders for the same inputs:
admin on localhost, ADS to the agent's `XDS` pipe, the `sds-grpc` pipe (and
`sds-files-grpc` when another SDS server owns the workload socket), the
Prometheus, secure-metrics and status listeners, stats tags and matchers,
tracing, the metrics and access-log services, LRS, the local cluster for
zone-aware balancing and the overload manager's connection limit. The
decisions come from `values.derive()`, which the custom-template
parameters (`params`) share.

`write_bootstrap()` is the thin I/O edge: it chooses between this built-in
rendering and a custom template (`customConfigFile`, `proxyBootstrapTemplatePath`,
`--templateFile`, `ISTIO_BOOTSTRAP`, as upstream orders them) and writes the file.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from istio_agent.config.errors import ConfigError
from istio_agent.config.gopath import go_join
from istio_agent.envoy.bootstrap import stats, tracing
from istio_agent.envoy.bootstrap.listeners import listeners
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.values import BootstrapValues, derive

# Upstream's default template location; when no file is there the built-in rendering is used.
DEFAULT_TEMPLATE_PATH = "./var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
TEXT_LOG_FORMAT = "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"
JSON_LOG_FORMAT = {
    "time": "%Y-%m-%dT%T.%fZ", "level": "%l", "scope": "envoy %n", "msg": "%j", "caller": "%g:%#", "thread": "%t",
}
TYPED_STRUCT = "type.googleapis.com/udpa.type.v1.TypedStruct"


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


def local_cluster() -> dict[str, Any]:
    """ISTIO_META_ENABLE_SELF_DISCOVERY: the proxy's own service over EDS, for zone-aware load balancing."""
    return {
        "name": "local_cluster",
        "alt_stat_name": "local_cluster;",
        "type": "EDS",
        "connect_timeout": "1s",
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.least_request",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
                "locality_lb_config": {"zone_aware_lb_config": {"min_cluster_size": "1"}},
            },
        }}]},
        "eds_cluster_config": {
            "eds_config": {"ads": {}, "resource_api_version": "V3"},
            "service_name": "local_cluster",
        },
    }


def _clusters(values: BootstrapValues) -> list[dict[str, Any]]:
    opts, family = values.opts, values.family
    clusters = [
        _static_cluster("prometheus_stats", _tcp(family.localhost, opts.admin_port), "0.250s"),
        _static_cluster("agent", _tcp(family.localhost, opts.status_port), "0.250s"),
        _pipe_cluster("sds-grpc", opts.sds_socket),
    ]
    if values.custom_file_path:
        clusters.append(_pipe_cluster("sds-files-grpc", values.custom_file_path))
    clusters.append(_xds_cluster(opts.xds_socket))
    if values.tracer is not None:
        clusters.append(tracing.tracer_cluster(values.tracer, family.dns_lookup_family))
    for service in (values.metrics_service, values.access_log_service):
        if service is not None:
            clusters.append(tracing.remote_service_cluster(service, family.dns_lookup_family))
    if values.enable_self_discovery:
        clusters.append(local_cluster())
    return clusters


def _cluster_manager(values: BootstrapValues) -> dict[str, Any]:
    manager: dict[str, Any] = {}
    if values.enable_self_discovery:
        manager["local_cluster_name"] = "local_cluster"
    if values.outlier_log_path:
        manager["outlier_detection"] = {"event_log_path": values.outlier_log_path}
    lrs = values.load_stats_config()
    if lrs is not None:
        manager["load_stats_config"] = lrs
    if values.opts.deferred_cluster_creation:
        manager["enable_deferred_cluster_creation"] = True
    return manager


def _bootstrap_extensions(metadata_discovery: bool) -> list[dict[str, Any]]:
    extensions: list[dict[str, Any]] = []
    if metadata_discovery:
        extensions.append({"name": "metadata_discovery", "typed_config": {
            "@type": TYPED_STRUCT,
            "type_url": "type.googleapis.com/istio.workload.BootstrapExtension",
            "value": {"config_source": {"ads": {}}},
        }})
    extensions.append({"name": "envoy.bootstrap.internal_listener", "typed_config": {
        "@type": TYPED_STRUCT,
        "type_url": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
        "value": {"buffer_size_kb": 64},
    }})
    return extensions


def render_values(values: BootstrapValues) -> dict[str, Any]:
    """The bootstrap for derived `values`, key for key as the template writes it."""
    opts = values.opts
    log_format: dict[str, Any] = {"json_format": dict(JSON_LOG_FORMAT)} if opts.log_as_json else {
        "text_format": TEXT_LOG_FORMAT}
    ads = {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
    out: dict[str, Any] = {
        "application_log_config": {"log_format": log_format},
        "node": {
            "id": opts.node_id,
            "cluster": values.cluster,
            "locality": dict(values.locality),
            "metadata": copy.deepcopy(dict(opts.metadata)),  # the caller may edit what it is handed
        },
        "layered_runtime": {"layers": [
            {"name": "global config", "static_layer": values.runtime_flags},
            {"name": "admin", "admin_layer": {}},
        ]},
        "bootstrap_extensions": _bootstrap_extensions(values.metadata_discovery),
        **stats.interval_fields(values.stats),
        "stats_config": stats.stats_config(values.stats, values.metadata_discovery),
        "admin": {
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": "/dev/null",
            }}],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": {"socket_address": {"address": values.family.localhost, "port_value": opts.admin_port}},
        },
        "dynamic_resources": {
            "lds_config": dict(ads),
            "cds_config": dict(ads),
            "ads_config": {
                "api_type": values.xds_type,
                "set_node_on_first_message_only": True,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
            },
        },
        "static_resources": {"clusters": _clusters(values), "listeners": listeners(values)},
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                         "DownstreamConnectionsConfig",
                "max_active_downstream_connections": values.global_downstream_max_connections,
            },
        }]},
    }
    if values.tracer is not None:
        out["tracing"] = tracing.tracing_config(values.tracer, values.cluster, opts.lightstep_token_path)
    sinks = tracing.stats_sinks(values.metrics_service, values.statsd)
    if sinks:
        out["stats_sinks"] = sinks
    if values.cluster_manager_needed:
        out["cluster_manager"] = _cluster_manager(values)
    if opts.deferred_stats_creation:
        out["deferred_stat_options"] = {"enable_deferred_creation_stats": True}
    return out


def render_bootstrap(opts: BootstrapOptions) -> dict[str, Any]:
    """The bootstrap for `opts`, as a JSON-ready dict (pure: no files, no environment)."""
    return render_values(derive(opts))


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
    path: Path  # where it was written (resolved against the work directory)
    template: Path | None
    for_envoy: str  # the name Envoy is given: upstream's path.Join(configPath, file), relative stays relative


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
        # upstream's os.WriteFile(..., 0o666): the process umask applies, an existing file keeps its mode
        resolve(opts.lightstep_token_path).write_text(str(lightstep.get("accessToken", "")))
    if use_template:
        from istio_agent.envoy.bootstrap.params import template_params
        from istio_agent.envoy.bootstrap.template import TemplateError, render_template

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
    return WrittenBootstrap(target, template_file_path if use_template else None,
                            go_join(opts.config_path, target.name))
