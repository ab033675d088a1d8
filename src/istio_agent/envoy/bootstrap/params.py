"""The parameters a custom bootstrap template sees, under upstream's names and in upstream's shapes.

Upstream renders its templates over a map of named options (`nodeID`,
`meta_json_str`, `zipkin`, `config`, ...), many pre-converted to JSON text so
a template can paste them (`"socket_address": {{ .zipkin }}`). An option that
is unset is absent, so `{{ if .zipkin }}` works. `config` is the ProxyConfig and
`metadata` the typed node metadata, both with Go's field names and Go's zero
values (`{{ .config.ProxyAdminPort }}`, `{{ .metadata.Namespace }}`). Every value
comes from the same `values.derive()` the built-in rendering uses,
so upstream's own `envoy_bootstrap.json` renders to the same bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from istio_agent.config.platform import GCP_PROJECT, GCP_PROJECT_NUMBER
from istio_agent.config.protojson import Field, Message
from istio_agent.config.proxyconfig_fields import PROXY_CONFIG
from istio_agent.envoy.bootstrap import tracing
from istio_agent.envoy.bootstrap.gofmt import go_duration, go_json
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.values import BootstrapValues, derive


def go_name(proto_name: str) -> str:
    """protoc-gen-go's field name: CamelCase, a letter after a digit upper-cased (`k8s_sa` -> `K8SSa`)."""
    out: list[str] = []
    upper = True
    for char in proto_name:
        if char == "_":
            upper = True
            continue
        out.append(char.upper() if upper else char)
        upper = char.isdigit()
    return "".join(out)


def _go_value(spec: Field, value: Any) -> Any:
    if spec.map_of is not None:
        if spec.map_of.message is None:
            return dict(value)
        return {key: go_message(spec.map_of.message, item) for key, item in value.items()}
    if spec.repeated:
        return [go_message(spec.message, item) if spec.message is not None else item for item in value]
    if spec.kind == "message" and spec.message is not None:
        return go_message(spec.message, value)
    if spec.kind == "wrapper":
        return {"Value": value}  # a *wrapperspb value: `{{ .config.Concurrency.Value }}`
    return value


def _go_zero(spec: Field) -> Any:
    if spec.map_of is not None or spec.repeated or spec.kind in ("message", "wrapper", "duration"):
        return None  # nil
    if spec.kind == "enum":
        assert spec.enum is not None
        return spec.enum.zero()
    return {"string": "", "bytes": "", "bool": False}.get(spec.kind, 0)


def go_message(message: Message, value: Mapping[str, Any]) -> dict[str, Any]:
    """A message in protojson shape as a Go struct: Go field names, unset fields at their Go zero value."""
    out: dict[str, Any] = {}
    for spec in message.fields:
        name = go_name(spec.name)
        out[name] = _go_value(spec, value[spec.json_name]) if spec.json_name in value else _go_zero(spec)
    return out


# Typed node metadata (model.BootstrapNodeMetadata): JSON key, Go field name, Go zero value.
_METADATA_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("PROXY_CONFIG", "ProxyConfig", None), ("ISTIO_VERSION", "IstioVersion", ""),
    ("ISTIO_REVISION", "IstioRevision", ""), ("LABELS", "Labels", None), ("STATIC_LABELS", "StaticLabels", None),
    ("ANNOTATIONS", "Annotations", None), ("INSTANCE_IPS", "InstanceIPs", None), ("NAMESPACE", "Namespace", ""),
    ("NODE_NAME", "NodeName", ""), ("WORKLOAD_NAME", "WorkloadName", ""),
    ("INTERCEPTION_MODE", "InterceptionMode", ""), ("SERVICE_ACCOUNT", "ServiceAccount", ""),
    ("HTTP_PROXY_PORT", "HTTPProxyPort", ""), ("MESH_ID", "MeshID", ""), ("CLUSTER_ID", "ClusterID", ""),
    ("NETWORK", "Network", ""), ("REQUESTED_NETWORK_VIEW", "RequestedNetworkView", None),
    ("POD_PORTS", "PodPorts", None), ("TLS_SERVER_CERT_CHAIN", "TLSServerCertChain", ""),
    ("TLS_SERVER_KEY", "TLSServerKey", ""), ("TLS_SERVER_ROOT_CERT", "TLSServerRootCert", ""),
    ("TLS_CLIENT_CERT_CHAIN", "TLSClientCertChain", ""), ("TLS_CLIENT_KEY", "TLSClientKey", ""),
    ("TLS_CLIENT_ROOT_CERT", "TLSClientRootCert", ""), ("BASE", "CertBaseDir", ""),
    ("IDLE_TIMEOUT", "IdleTimeout", ""), ("HTTP10", "HTTP10", ""), ("GENERATOR", "Generator", ""),
    ("ENABLE_SELF_DISCOVERY", "EnableSelfDiscovery", False), ("DNS_CAPTURE", "DNSCapture", False),
    ("DNS_AUTO_ALLOCATE", "DNSAutoAllocate", False), ("DNS_PROXY_ADDR", "DNSProxyAddr", ""),
    ("ENABLE_HBONE", "EnableHBONE", False), ("DISABLE_HBONE_SEND", "DisableHBONESend", False),
    ("AUTO_REGISTER_GROUP", "AutoRegisterGroup", ""), ("WORKLOAD_ENTRY", "WorkloadEntry", ""),
    ("UNPRIVILEGED_POD", "UnprivilegedPod", ""), ("PLATFORM_METADATA", "PlatformMetadata", None),
    ("STS_PORT", "StsPort", ""), ("ENVOY_STATUS_PORT", "EnvoyStatusPort", 0),
    ("ENVOY_PROMETHEUS_PORT", "EnvoyPrometheusPort", 0),
    ("ENVOY_SECURE_METRICS_PORT", "EnvoySecureMetricsPort", 0),
    ("ENVOY_SECURE_MERGED_METRICS_PORT", "EnvoySecureMergedMetricsPort", 0),
    ("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "ExitOnZeroActiveConnections", False),
    ("INBOUND_LISTENER_EXACT_BALANCE", "InboundListenerExactBalance", False),
    ("OUTBOUND_LISTENER_EXACT_BALANCE", "OutboundListenerExactBalance", False),
    ("CLOUDRUN_ADDR", "CloudrunAddr", ""), ("METADATA_DISCOVERY", "MetadataDiscovery", None),
    ("ENVOY_SKIP_DEPRECATED_LOGS", "EnvoySkipDeprecatedLogs", False),
    ("WORKLOAD_IDENTITY_SOCKET_FILE", "WorkloadIdentitySocketFile", ""), ("NAME", "InstanceName", ""),
    ("OWNER", "Owner", ""), ("PILOT_SAN", "PilotSubjectAltName", None), ("OUTLIER_LOG_PATH", "OutlierLogPath", ""),
    ("APP_CONTAINERS", "AppContainers", ""), ("ISTIO_PROXY_SHA", "IstioProxySHA", ""),
)
_BOOL_FIELDS = frozenset(go for _, go, zero in _METADATA_FIELDS if zero is False) | {"MetadataDiscovery"}


def go_metadata(metadata: Mapping[str, Any], xds_root_cert: str = "") -> dict[str, Any]:
    """The typed node metadata as the Go struct a template reads (`.metadata.Namespace`), with `Raw`."""
    out: dict[str, Any] = {}
    for key, go, zero in _METADATA_FIELDS:
        value = metadata.get(key, zero)
        if go in _BOOL_FIELDS and isinstance(value, str):
            value = value == "true"
        elif go in ("InstanceIPs", "RequestedNetworkView") and isinstance(value, str):
            value = value.split(",") if value else []
        elif go == "ProxyConfig" and isinstance(value, Mapping):
            value = go_message(PROXY_CONFIG, value)
        out[go] = value
    out["XDSRootCert"] = xds_root_cert
    out["Raw"] = dict(metadata)
    return out


def _address_params(params: dict[str, Any], values: BootstrapValues) -> None:
    if values.pilot_grpc_address is not None:
        params["pilot_grpc_address"] = values.pilot_grpc_address.fragment()
    if values.statsd is not None:
        params["statsd"] = values.statsd.fragment()
    trace = values.tracer
    sd = values.stackdriver
    if sd is not None:
        params.update(stackdriver=True, stackdriverProjectID=sd.project_id, stackdriverDebug=sd.debug,
                      stackdriverMaxAnnotations=sd.max_annotations, stackdriverMaxAttributes=sd.max_attributes,
                      stackdriverMaxEvents=sd.max_events)
    if trace is not None:
        params[trace.kind] = trace.address.fragment()
        if trace.kind == "lightstep":
            params["lightstepToken"] = values.opts.lightstep_token_path
    tracing_settings = values.proxy_config.get("tracing")
    if isinstance(tracing_settings, Mapping) and tracing_settings.get("tlsSettings") is not None:
        tls = trace.tls if trace is not None else tracing.transport_socket(
            tracing_settings["tlsSettings"], "tracer", values.metadata, is_h2="lightstep" in tracing_settings)
        params["tracing_tls"] = tracing.compact(tls) if tls is not None else ""
    for prefix, service in (("envoy_metrics_service", values.metrics_service),
                            ("envoy_accesslog_service", values.access_log_service)):
        if service is None:
            continue
        params[f"{prefix}_address"] = service.address.fragment()
        if service.tls_set:
            params[f"{prefix}_tls"] = tracing.compact(service.tls) if service.tls is not None else ""
        if service.keepalive is not None:
            params[f"{prefix}_tcp_keepalive"] = tracing.tcp_keepalive_template_text(service.keepalive)


def _stats_params(params: dict[str, Any], values: BootstrapValues) -> None:
    opts = values.stats
    for key, items in (("inclusionPrefix", opts.prefixes), ("inclusionSuffix", opts.suffixes),
                       ("inclusionRegexps", opts.regexps), ("extraStatTags", opts.extra_tags)):
        if items:
            params[key] = list(items)
    params["histogram_buckets"] = [{"match": {"prefix": prefix}, "buckets": list(bounds)}
                                   for prefix, bounds in opts.histogram_buckets] or None
    if opts.flush_interval is not None:
        params["stats_flush_interval"] = go_duration(opts.flush_interval)
    if opts.eviction_interval is not None:
        params["stats_eviction_interval"] = f"{opts.eviction_interval}s"
    params["envoy_metrics_stats_compression"] = values.stats_compression


def params_for(values: BootstrapValues, xds_root_cert: str = "") -> dict[str, Any]:
    """Upstream's template parameter map for derived `values` (pkg/bootstrap/option for the names)."""
    opts, meta, family = values.opts, values.metadata, values.family
    discovery = values.discovery_address
    params: dict[str, Any] = {
        "nodeID": opts.node_id,
        "nodeType": opts.node_type,
        "pilot_SAN": "[" + ",".join(f'{{"exact":"{s}"}}' for s in meta.get("PILOT_SAN") or []) + "]",
        "log_json": opts.log_as_json,
        "discovery_host": discovery.split(":")[0],
        "metadata": go_metadata(meta, xds_root_cert),
        "xds_type": values.xds_type,
        "metadata_discovery": values.metadata_discovery,
        "metrics_localhost_access_only": values.metrics_localhost_access_only,
        "workload_identity_socket_file": str(meta.get("WORKLOAD_IDENTITY_SOCKET_FILE", "")),
        "meta_json_str": go_json(dict(meta)),
        "runtime_flags": go_json(values.runtime_flags),
        "envoy_status_port": values.envoy_status_port,
        "envoy_prometheus_port": values.envoy_prometheus_port,
        "global_downstream_max_connections": values.global_downstream_max_connections,
        "localhost": family.localhost,
        "wildcard": family.wildcard,
        "dns_lookup_family": family.dns_lookup_family,
        "config": go_message(PROXY_CONFIG, values.proxy_config),
        "cluster": values.cluster,
        "discovery_address": discovery,
        "xds_root_cert": xds_root_cert,
    }
    params.update(values.locality)
    for key, value in (("outlier_log_path", values.outlier_log_path), ("custom_file_path", values.custom_file_path),
                       ("secure_metrics_port", values.secure_metrics_port),
                       ("secure_merged_metrics_port", values.secure_merged_metrics_port),
                       ("load_stats_config_json_str", values.load_stats_config_json)):
        if value or (key == "load_stats_config_json_str" and value is not None):
            params[key] = value
    platform = values.platform_metadata
    if GCP_PROJECT_NUMBER in platform:
        params["gcp_project_number"] = platform[GCP_PROJECT_NUMBER]
    if values.sts_port > 0:
        params.update(sts=True, sts_port=values.sts_port)
        if GCP_PROJECT in platform:
            params["gcp_project_id"] = platform[GCP_PROJECT]
    if family.dual_stack:
        params.update(dual_stack=True, additional_wildcard=family.additional_wildcard,
                      additional_localhost=family.additional_localhost)
    if values.status_port_proxy_protocol:
        params["envoy_status_port_enable_proxy_protocol"] = True
    if values.enable_self_discovery:
        params["enable_self_discovery"] = True
    _stats_params(params, values)
    _address_params(params, values)
    return params


def template_params(opts: BootstrapOptions) -> dict[str, Any]:
    """Upstream's template parameter map for `opts`."""
    return params_for(derive(opts))
