"""Tracing, metrics-service and access-log-service parts of the bootstrap.

ProxyConfig names remote services by `host:port`; each becomes a STRICT_DNS
cluster, optionally with TLS whose certificates Envoy fetches from the agent's
SDS server by file name (`file-cert:<cert>~<key>`, `file-root:<ca>`), or the
workload identity (`default`/`ROOTCA`) for ISTIO_MUTUAL.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError
from istio_agent.netaddr import AddressError, split_host_port

log = logging.getLogger(__name__)

def http2_protocol_options() -> dict[str, Any]:
    """HTTP/2-only upstream protocol options, as every gRPC cluster in the bootstrap carries."""
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }


def remote_host_port(address: str, field: str, host_ip: str = "") -> tuple[str, int]:
    """A remote service's `host:port` / `[v6]:port` (a host is required); `$(HOST_IP)` is replaced as
    Kubernetes would have done. ConfigError names the ProxyConfig field."""
    try:
        host, port = split_host_port(address)
    except AddressError as err:
        raise ConfigError(f"field {field}: {err}") from None
    if not host:
        raise ConfigError(f"field {field}: address {address!r} must be host:port")
    if host == "$(HOST_IP)" and host_ip:
        host = host_ip
    return host, port


def socket_address(address: str, field: str, host_ip: str = "") -> dict[str, Any]:
    host, port = remote_host_port(address, field, host_ip)
    return {"address": host, "port_value": port}


def _sds_secret(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
                "set_node_on_first_message_only": True,
                "transport_api_version": "V3",
            },
            "resource_api_version": "V3",
        },
    }


def _validation(sans: list[str], root_name: str) -> dict[str, Any]:
    default: dict[str, Any] = {}
    if sans:
        default["match_subject_alt_names"] = [{"exact": s} for s in sans]
    combined: dict[str, Any] = {"default_validation_context": default}
    if root_name:
        combined["validation_context_sds_secret_config"] = _sds_secret(root_name)
    return combined


def transport_socket(
    tls: Mapping[str, Any] | None, sni_name: str, metadata: Mapping[str, Any], is_h2: bool
) -> dict[str, Any] | None:
    """Envoy's upstream TLS socket for a ProxyConfig `tlsSettings`, or None when TLS is off.

    Node metadata TLS_CLIENT_CERT_CHAIN / TLS_CLIENT_KEY / TLS_CLIENT_ROOT_CERT override
    the configured file paths, as upstream does.
    """
    if not tls:
        return None
    mode = tls.get("mode", "DISABLE")
    sans = list(tls.get("subjectAltNames") or [])
    sni = str(tls.get("sni", ""))
    common: dict[str, Any] = {}
    if mode in ("SIMPLE", "MUTUAL"):
        ca = str(metadata.get("TLS_CLIENT_ROOT_CERT") or tls.get("caCertificates", ""))
        if mode == "MUTUAL":
            cert = str(metadata.get("TLS_CLIENT_CERT_CHAIN") or tls.get("clientCertificate", ""))
            key = str(metadata.get("TLS_CLIENT_KEY") or tls.get("privateKey", ""))
            if cert and key:
                common["tls_certificate_sds_secret_configs"] = [_sds_secret(f"file-cert:{cert}~{key}")]
        common["combined_validation_context"] = _validation(sans, f"file-root:{ca}" if ca else "")
        alpn = ["h2"]
    elif mode == "ISTIO_MUTUAL":
        common["tls_certificate_sds_secret_configs"] = [_sds_secret("default")]
        common["combined_validation_context"] = _validation(sans, "ROOTCA")
        alpn = ["istio-peer-exchange", "istio", "h2"]
        sni = sni or sni_name
    else:
        return None
    if is_h2:
        common = {"alpn_protocols": alpn, **common}
    context: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common,
    }
    if sni:
        context["sni"] = sni
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def tcp_keepalive(keepalive: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`upstream_connection_options` from a RemoteService `tcpKeepalive` (whole seconds, zero omitted)."""
    if keepalive is None:
        return None
    out: dict[str, Any] = {}
    if int(keepalive.get("probes", 0) or 0) > 0:
        out["keepalive_probes"] = int(keepalive["probes"])
    for source, target in (("time", "keepalive_time"), ("interval", "keepalive_interval")):
        if keepalive.get(source):
            seconds = int(parse_duration(str(keepalive[source])))
            if seconds > 0:
                out[target] = seconds
    return {"tcp_keepalive": out}


def _load_assignment(name: str, address: dict[str, Any]) -> dict[str, Any]:
    return {
        "cluster_name": name,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": address}}}]}],
    }


@dataclass(frozen=True)
class TracingParts:
    """The cluster (if any) and the `tracing` block (if any) one ProxyConfig `tracing` yields."""

    cluster: dict[str, Any] | None
    tracing: dict[str, Any] | None
    lightstep_token: str | None = None


def tracing_parts(
    tracing: Mapping[str, Any] | None,
    metadata: Mapping[str, Any],
    service_cluster: str,
    dns_lookup_family: str,
    lightstep_token_path: str,
    host_ip: str = "",
) -> TracingParts:
    """Zipkin, Lightstep and Datadog as upstream renders them; other tracers are left to the Telemetry API."""
    if not tracing:
        return TracingParts(None, None)
    tls = transport_socket(tracing.get("tlsSettings"), "tracer", metadata, is_h2="lightstep" in tracing)

    def cluster(name: str, address: str, field: str, extra: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "alt_stat_name": f"{name};"}
        if tls is not None:
            out["transport_socket"] = tls
        out.update(extra)
        out["load_assignment"] = _load_assignment(name, socket_address(address, field, host_ip))
        return out

    dns = {"type": "STRICT_DNS", "respect_dns_ttl": True, "dns_lookup_family": dns_lookup_family}
    if "zipkin" in tracing:
        address = str((tracing["zipkin"] or {}).get("address", ""))
        zipkin = cluster("zipkin", address, "tracing.zipkin.address", {
            **dns, "dns_refresh_rate": "30s", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
        })
        config = {
            "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
            "collector_cluster": "zipkin",
            "collector_endpoint": "/api/v2/spans",
            "collector_endpoint_version": "HTTP_JSON",
            "trace_id_128bit": True,
            "shared_span_context": False,
        }
        return TracingParts(zipkin, {"http": {"name": "envoy.tracers.zipkin", "typed_config": config}})
    if "lightstep" in tracing:
        lightstep = tracing["lightstep"] or {}
        ls = cluster("lightstep", str(lightstep.get("address", "")), "tracing.lightstep.address", {
            "typed_extension_protocol_options": http2_protocol_options(),
            **dns, "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
        })
        config = {
            "@type": "type.googleapis.com/envoy.config.trace.v3.LightstepConfig",
            "collector_cluster": "lightstep",
            "access_token_file": lightstep_token_path,
        }
        return TracingParts(ls, {"http": {"name": "envoy.tracers.lightstep", "typed_config": config}},
                            lightstep_token=str(lightstep.get("accessToken", "")))
    if "datadog" in tracing:
        address = str((tracing["datadog"] or {}).get("address", ""))
        dd = cluster("datadog_agent", address, "tracing.datadog.address", {
            "connect_timeout": "1s", **dns, "lb_policy": "ROUND_ROBIN",
        })
        config = {
            "@type": "type.googleapis.com/envoy.config.trace.v3.DatadogConfig",
            "collector_cluster": "datadog_agent",
            "service_name": service_cluster,
        }
        return TracingParts(dd, {"http": {"name": "envoy.tracers.datadog", "typed_config": config}})
    for unsupported in ("stackdriver", "openCensusAgent"):
        if unsupported in tracing:
            log.warning("tracing.%s is not supported by this Envoy; no bootstrap tracer configured", unsupported)
    return TracingParts(None, None)


def remote_service_cluster(
    name: str, service: Mapping[str, Any], metadata: Mapping[str, Any], dns_lookup_family: str, host_ip: str = ""
) -> dict[str, Any]:
    """`envoy_metrics_service` / `envoy_accesslog_service`: HTTP/2 STRICT_DNS clusters."""
    out: dict[str, Any] = {"name": name, "alt_stat_name": f"{name};", "type": "STRICT_DNS"}
    tls = transport_socket(service.get("tlsSettings"), name, metadata, is_h2=True)
    if tls is not None:
        out["transport_socket"] = tls
    keepalive = tcp_keepalive(service.get("tcpKeepalive"))
    if keepalive is not None:
        out["upstream_connection_options"] = keepalive
    out.update({
        "respect_dns_ttl": True,
        "dns_lookup_family": dns_lookup_family,
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": http2_protocol_options(),
        "load_assignment": _load_assignment(name, socket_address(str(service.get("address", "")), name, host_ip)),
    })
    return out


def stats_sinks(metrics_service: bool, statsd_address: str, host_ip: str = "") -> list[dict[str, Any]]:
    sinks: list[dict[str, Any]] = []
    if metrics_service:
        sinks.append({
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig",
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "envoy_metrics_service"}},
            },
        })
    if statsd_address:
        sinks.append({
            "name": "envoy.stat_sinks.statsd",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink",
                "address": {"socket_address": socket_address(statsd_address, "statsdUdpAddress", host_ip)},
            },
        })
    return sinks
