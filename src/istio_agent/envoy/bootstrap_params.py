"""The parameters a custom bootstrap template sees, under upstream's names.

Upstream renders its templates over a map of named options (`nodeID`,
`meta_json_str`, `zipkin`, `config`, ...), many pre-converted to JSON text so a
template can paste them (`"socket_address": {{ .zipkin }}`). Options that are
unset are absent, so `{{ if .zipkin }}` works. `config` is the ProxyConfig with
Go field names (`{{ .config.ProxyAdminPort }}`). Everything is derived from the
same `BootstrapOptions` the built-in rendering uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from istio_agent.envoy import bootstrap_stats as stats
from istio_agent.envoy import bootstrap_tracing as tracing
from istio_agent.envoy.bootstrap_options import (
    BootstrapOptions,
    address_family,
    locality,
    runtime_flags,
    service_cluster,
)
from istio_agent.envoy.bootstrap_template import go_json


def _address(address: str, field: str, host_ip: str) -> str:
    host, port = tracing.remote_host_port(address, field, host_ip)
    return f'{{"address": "{host}", "port_value": {port}}}'


def go_field_names(value: Any) -> Any:
    """ProxyConfig in protojson shape with Go's exported field names (`proxyAdminPort` -> `ProxyAdminPort`)."""
    if isinstance(value, Mapping):
        return {(k[:1].upper() + k[1:]) if isinstance(k, str) else k: go_field_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [go_field_names(v) for v in value]
    return value


def template_params(opts: BootstrapOptions) -> dict[str, Any]:
    """Upstream's template parameter map for `opts` (see pkg/bootstrap/option for the names)."""
    pc = opts.proxy_config
    meta = opts.metadata
    family = address_family(opts.instance_ips, opts.dual_stack)
    cluster = service_cluster(pc, meta)
    stats_opts = stats.stats_options(opts.annotations, pc, opts.instance_ips, opts.exit_on_zero_active_connections)
    discovery_address = str(pc.get("discoveryAddress", ""))
    params: dict[str, Any] = {
        "nodeID": opts.node_id,
        "nodeType": opts.node_id.split("~")[0],
        "cluster": cluster,
        "meta_json_str": go_json(dict(meta)),
        "metadata": dict(meta),
        "runtime_flags": go_json(runtime_flags(pc, opts.compliance_policy, opts.strip_fragment)),
        "pilot_SAN": "[" + ",".join(f'{{"exact":"{s}"}}' for s in meta.get("PILOT_SAN") or []) + "]",
        "xds_type": opts.xds_type,
        "metadata_discovery": opts.metadata_discovery,
        "discovery_address": discovery_address,
        "discovery_host": discovery_address.split(":")[0],
        "xds_root_cert": "",
        "log_json": opts.log_as_json,
        "config": go_field_names(dict(pc)),
        "localhost": family.localhost,
        "wildcard": family.wildcard,
        "dns_lookup_family": family.dns_lookup_family,
        "envoy_status_port": int(meta.get("ENVOY_STATUS_PORT") or 0),
        "envoy_prometheus_port": int(meta.get("ENVOY_PROMETHEUS_PORT") or 0),
        "workload_identity_socket_file": str(meta.get("WORKLOAD_IDENTITY_SOCKET_FILE", "")),
        "metrics_localhost_access_only":
            dict(pc.get("proxyMetadata") or {}).get("METRICS_LOCALHOST_ACCESS_ONLY") == "true",
        "deferred_cluster_creation": opts.deferred_cluster_creation,
        "deferred_stats_creation": opts.deferred_stats_creation,
        "bypass_overload_manager": opts.bypass_overload_manager,
        "histogram_buckets": [{"match": {"prefix": p}, "buckets": list(b)} for p, b in stats_opts.histogram_buckets],
        "stats_compression": stats_opts.compression,
    }
    params.update(locality(meta))
    if family.dual_stack:
        params.update(dual_stack=True, additional_wildcard=family.additional_wildcard,
                      additional_localhost=family.additional_localhost)
    if meta.get("OUTLIER_LOG_PATH"):
        params["outlier_log_path"] = meta["OUTLIER_LOG_PATH"]
    if discovery_address:
        params["pilot_grpc_address"] = _address(discovery_address, "discoveryAddress", opts.host_ip)
    for key, values in (("inclusionPrefix", stats_opts.prefixes), ("inclusionSuffix", stats_opts.suffixes),
                        ("inclusionRegexps", stats_opts.regexps), ("extraStatTags", stats_opts.extra_tags)):
        if values:
            params[key] = list(values)
    if stats_opts.flush_interval is not None:
        params["stats_flush_interval"] = f"{stats_opts.flush_interval:g}s"
    if stats_opts.eviction_interval is not None:
        params["stats_eviction_interval"] = f"{stats_opts.eviction_interval:g}s"
    if pc.get("statsdUdpAddress"):
        params["statsd"] = _address(str(pc["statsdUdpAddress"]), "statsdUdpAddress", opts.host_ip)
    if meta.get("STS_PORT"):
        params.update(sts=True, sts_port=int(meta["STS_PORT"]))
    if isinstance(meta.get("LOAD_STATS_CONFIG_JSON"), str):
        params["load_stats_config_json_str"] = meta["LOAD_STATS_CONFIG_JSON"]
    _tracing_params(params, opts)
    _remote_service_params(params, opts)
    return params


def _tracing_params(params: dict[str, Any], opts: BootstrapOptions) -> None:
    trace = opts.proxy_config.get("tracing") or {}
    if not trace:
        return
    for key, name in (("zipkin", "zipkin"), ("lightstep", "lightstep"), ("datadog", "datadog")):
        if key in trace:
            params[name] = _address(str((trace[key] or {}).get("address", "")), f"tracing.{key}.address", opts.host_ip)
            if key == "lightstep":
                params["lightstepToken"] = opts.lightstep_token_path
            break
    tls = tracing.transport_socket(trace.get("tlsSettings"), "tracer", opts.metadata, is_h2="lightstep" in trace)
    if tls is not None:
        params["tracing_tls"] = json.dumps(tls, separators=(",", ":"))


def _remote_service_params(params: dict[str, Any], opts: BootstrapOptions) -> None:
    pc = opts.proxy_config
    for field, prefix in (("envoyMetricsService", "envoy_metrics_service"),
                          ("envoyAccessLogService", "envoy_accesslog_service")):
        service = pc.get(field) or {}
        if not service.get("address"):
            continue
        params[f"{prefix}_address"] = _address(str(service["address"]), field, opts.host_ip)
        tls = tracing.transport_socket(service.get("tlsSettings"), prefix, opts.metadata, is_h2=True)
        if tls is not None:
            params[f"{prefix}_tls"] = json.dumps(tls, separators=(",", ":"))
        keepalive = tracing.tcp_keepalive(service.get("tcpKeepalive"))
        if keepalive is not None:
            params[f"{prefix}_tcp_keepalive"] = json.dumps(keepalive, separators=(",", ":"))
    if pc.get("envoyMetricsServiceAddress") and "envoy_metrics_service_address" not in params:
        params["envoy_metrics_service_address"] = _address(
            str(pc["envoyMetricsServiceAddress"]), "envoyMetricsServiceAddress", opts.host_ip)
