"""The bootstrap's static listeners, in the template's order.

1. Prometheus (`ENVOY_PROMETHEUS_PORT`, 15090): `/stats/prometheus` to Envoy's
   admin, with the stats compressors unless ProxyConfig `statsCompression` is
   false; on loopback when proxyMetadata `METRICS_LOCALHOST_ACCESS_ONLY` is "true".
2. Secure metrics (`ENVOY_SECURE_METRICS_PORT`, off by default): the same stats
   over mTLS with the workload certificate, client certificates required.
3. Secure merged metrics (`ENVOY_SECURE_MERGED_METRICS_PORT`): the agent's
   merged `/stats/prometheus` and `/metrics` over mTLS.
4. Status (`ENVOY_STATUS_PORT`, 15021): `/healthz/ready` to the agent, taking the
   PROXY protocol when `ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL` is set.

All of them ignore the global connection limit; with ISTIO_DUAL_STACK the
Prometheus and status listeners also bind the other family (spelt
`additionalAddresses`, as the template spells it, so parsed JSON compares equal).
"""

from __future__ import annotations

from typing import Any

from istio_agent.envoy.bootstrap import stats
from istio_agent.envoy.bootstrap.values import BootstrapValues

HCM = "envoy.filters.network.http_connection_manager"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def _router() -> dict[str, Any]:
    """A fresh filter each time, like every part of the bootstrap: a caller that edits what it was handed (protobuf's
    `ParseDict` takes an Any's `@type` out and puts it back last) must not change the next rendering's bytes."""
    return {"name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def _tls_inspector() -> dict[str, Any]:
    return {"name": "envoy.filters.listener.tls_inspector", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}


def _proxy_protocol() -> dict[str, Any]:
    return {"name": "envoy.listener.proxy_protocol", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol",
        "allow_requests_without_proxy_protocol": True}}


def _tcp(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"protocol": "TCP", "address": address, "port_value": port}}


def _manager(stat_prefix: str, routes: list[tuple[str, str]], filters: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": HCM, "typed_config": {
        "@type": HCM_TYPE,
        "codec_type": "AUTO",
        "stat_prefix": stat_prefix,
        "route_config": {"virtual_hosts": [{
            "name": "backend",
            "domains": ["*"],
            "routes": [{"match": {"prefix": prefix}, "route": {"cluster": cluster}} for prefix, cluster in routes],
        }]},
        "http_filters": [*filters, _router()],
    }}


def _base(values: BootstrapValues, address: str, port: int) -> dict[str, Any]:
    listener: dict[str, Any] = {"name": f"{address}_{port}", "address": _tcp(address, port),
                                "ignore_global_conn_limit": True}
    if values.opts.bypass_overload_manager:
        listener["bypass_overload_manager"] = True
    return listener


def _sds(name: str) -> dict[str, Any]:
    return {"name": name, "sds_config": {
        "api_config_source": {
            "api_type": "GRPC",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
            "set_node_on_first_message_only": True,
            "transport_api_version": "V3",
        },
        "resource_api_version": "V3",
    }}


def mtls_transport_socket() -> dict[str, Any]:
    """The workload certificate (`default`), client certificates required and checked against `ROOTCA`."""
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "require_client_certificate": True,
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [_sds("default")],
            "combined_validation_context": {
                "default_validation_context": {},
                "validation_context_sds_secret_config": _sds("ROOTCA"),
            },
        },
    }}


def prometheus_listener(values: BootstrapValues) -> dict[str, Any]:
    port = values.envoy_prometheus_port
    listener = _base(values, values.metrics_address, port)
    if values.family.dual_stack:
        listener["additionalAddresses"] = [{"address": _tcp(values.additional_metrics_address, port)}]
    filters = stats.compression_filters(values.stats_compression)
    listener["filter_chains"] = [{"filters": [
        _manager("stats", [("/stats/prometheus", "prometheus_stats")], filters)]}]
    return listener


def secure_metrics_listener(values: BootstrapValues, port: int, merged: bool) -> dict[str, Any]:
    listener = _base(values, values.family.wildcard, port)
    listener["listener_filters"] = [_tls_inspector()]
    routes = [("/stats/prometheus", "agent"), ("/metrics", "agent")] if merged else \
        [("/stats/prometheus", "prometheus_stats")]
    listener["filter_chains"] = [{
        "filter_chain_match": {"transport_protocol": "tls"},
        "transport_socket": mtls_transport_socket(),
        "filters": [_manager("secure_merged_stats" if merged else "secure_stats", routes, [])],
    }]
    return listener


def status_listener(values: BootstrapValues) -> dict[str, Any]:
    port = values.envoy_status_port
    listener = _base(values, values.family.wildcard, port)
    if values.family.dual_stack:
        listener["additionalAddresses"] = [{"address": _tcp(values.family.additional_wildcard, port)}]
    if values.status_port_proxy_protocol:
        listener["listener_filters"] = [_proxy_protocol()]
    listener["filter_chains"] = [{"filters": [_manager("agent", [("/healthz/ready", "agent")], [])]}]
    return listener


def listeners(values: BootstrapValues) -> list[dict[str, Any]]:
    out = [prometheus_listener(values)]
    if values.secure_metrics_port:
        out.append(secure_metrics_listener(values, values.secure_metrics_port, merged=False))
    if values.secure_merged_metrics_port:
        out.append(secure_metrics_listener(values, values.secure_merged_metrics_port, merged=True))
    out.append(status_listener(values))
    return out
