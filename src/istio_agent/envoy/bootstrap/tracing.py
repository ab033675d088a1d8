"""Tracers, the metrics and access-log services, and the TLS and keepalive settings they carry.

ProxyConfig names each remote collector by `host:port`; each becomes a
STRICT_DNS cluster, optionally with TLS whose certificates Envoy fetches from
the agent's SDS server by file name (`file-cert:<cert>~<key>`,
`file-root:<ca>`), or the workload identity (`default`/`ROOTCA`) for
ISTIO_MUTUAL. The rules are upstream's: a tracer with an empty address is
skipped; of the tracers, Zipkin, Lightstep and Datadog are rendered, while
Stackdriver needs the GCP project in PLATFORM_METADATA (from GCP_METADATA, see
`config/platform.py`; without it the start fails, as upstream's) and then, as
OpenCensus, renders nothing: upstream's template has no Stackdriver tracer, it
only hands the settings to a custom template.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError
from istio_agent.config.platform import GCP_PROJECT
from istio_agent.netaddr import AddressError, split_host_port

log = logging.getLogger(__name__)

TRACERS = ("zipkin", "lightstep", "datadog")  # the ones the bootstrap renders, in the template's order
ALPN_H2 = ["h2"]
ALPN_IN_MESH_H2 = ["istio", "h2"]


def http2_protocol_options() -> dict[str, Any]:
    """HTTP/2-only upstream protocol options, as every gRPC cluster in the bootstrap carries."""
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }


@dataclass(frozen=True)
class HostPort:
    """A collector's address, split as Go's net.SplitHostPort splits it."""

    host: str
    port: int

    def socket_address(self) -> dict[str, Any]:
        return {"address": self.host, "port_value": self.port}

    def fragment(self) -> str:
        """The JSON text upstream's templates paste after `"socket_address":`."""
        return f'{{"address": "{self.host}", "port_value": {self.port}}}'


def host_port(address: str, field: str, host_ip: str = "") -> HostPort:
    """`host:port` / `[v6]:port`; `$(HOST_IP)` becomes HOST_IP (as Kubernetes would have expanded it).

    ConfigError names the ProxyConfig field: upstream fails to write the bootstrap then.
    """
    try:
        host, port = split_host_port(address)
    except AddressError as err:
        raise ConfigError(f"field {field}: {err}") from None
    if not host:  # upstream renders an empty address, which Envoy then refuses; say so here instead
        raise ConfigError(f"field {field}: address {address!r} must be host:port")
    if host == "$(HOST_IP)" and host_ip:
        host = host_ip
    return HostPort(host, port)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


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
    the configured file paths, as upstream does. ALPN is kept only for HTTP/2 collectors.
    """
    if tls is None:
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
        alpn = ALPN_H2
    elif mode == "ISTIO_MUTUAL":
        common["tls_certificate_sds_secret_configs"] = [_sds_secret("default")]
        common["combined_validation_context"] = _validation(sans, "ROOTCA")
        alpn = ALPN_IN_MESH_H2
        sni = sni or sni_name
    else:
        return None
    if is_h2:
        common = {"alpn_protocols": list(alpn), **common}
    context: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common,
    }
    if sni:
        context["sni"] = sni
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _whole_seconds(text: Any) -> int:
    return int(parse_duration(str(text))) if text else 0


def tcp_keepalive(keepalive: Mapping[str, Any]) -> dict[str, Any]:
    """`upstream_connection_options` from a RemoteService `tcpKeepalive` (whole seconds; zero left out)."""
    out: dict[str, Any] = {}
    if int(keepalive.get("probes", 0) or 0) > 0:
        out["keepalive_probes"] = int(keepalive["probes"])
    for source, target in (("time", "keepalive_time"), ("interval", "keepalive_interval")):
        seconds = _whole_seconds(keepalive.get(source))
        if seconds > 0:
            out[target] = seconds
    return {"tcp_keepalive": out}


def tcp_keepalive_template_text(keepalive: Mapping[str, Any]) -> str:
    """The keepalive as upstream's template parameter writes it: Go's encoding/json of wrapper messages,
    so each value is an object (`{"keepalive_probes":{"value":3}}`)."""
    options = tcp_keepalive(keepalive)["tcp_keepalive"]
    return compact({"tcp_keepalive": {name: {"value": value} for name, value in options.items()}})


@dataclass(frozen=True)
class Tracer:
    """The one tracer the bootstrap configures: its kind, collector and TLS (`tls_set`: tlsSettings given)."""

    kind: str
    address: HostPort
    tls: dict[str, Any] | None
    tls_set: bool


@dataclass(frozen=True)
class Stackdriver:
    """The Stackdriver tracer's settings, as upstream hands them to a custom template."""

    project_id: str
    debug: bool
    max_annotations: int
    max_attributes: int
    max_events: int


STACKDRIVER_DEFAULT_MAX = 200  # upstream's default for each of the three limits


def platform_metadata(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """Node metadata's PLATFORM_METADATA (config/platform.py), {} when there is none."""
    value = metadata.get("PLATFORM_METADATA")
    return value if isinstance(value, Mapping) else {}


def stackdriver(tracing: Mapping[str, Any] | None, metadata: Mapping[str, Any]) -> Stackdriver | None:
    """The Stackdriver settings when ProxyConfig asks for that tracer, else None.

    Its project is PLATFORM_METADATA's gcp_project (present, even if empty, as
    upstream checks it); without one it is a ConfigError, as upstream fails then.
    """
    if not tracing or "stackdriver" not in tracing:
        return None
    platform = platform_metadata(metadata)
    if GCP_PROJECT not in platform:
        raise ConfigError("tracing.stackdriver: unable to process Stackdriver tracer: missing GCP Project "
                          "(PLATFORM_METADATA has it only from GCP_METADATA: this agent never asks the GCP "
                          "metadata server)")
    settings = tracing["stackdriver"] or {}

    def limit(name: str) -> int:
        value = settings.get(name)
        return STACKDRIVER_DEFAULT_MAX if value is None else int(value)

    return Stackdriver(str(platform[GCP_PROJECT]), bool(settings.get("debug", False)),
                       limit("maxNumberOfAnnotations"), limit("maxNumberOfAttributes"),
                       limit("maxNumberOfMessageEvents"))


def tracer(tracing: Mapping[str, Any] | None, metadata: Mapping[str, Any], host_ip: str = "") -> Tracer | None:
    """The tracer ProxyConfig `tracing` asks for, or None (Stackdriver too: it renders no tracer).

    ConfigError for Stackdriver without a GCP project (`stackdriver()`).
    """
    if not tracing:
        return None
    if stackdriver(tracing, metadata) is not None:
        return None  # upstream's template renders no Stackdriver tracer
    if "openCensusAgent" in tracing:
        log.warning("tracing.openCensusAgent renders no bootstrap tracer (as upstream); use the Telemetry API")
    for kind in TRACERS:
        if kind not in tracing:
            continue
        address = str((tracing[kind] or {}).get("address", ""))
        if not address:
            return None  # upstream skips a tracer whose address is empty
        tls_settings = tracing.get("tlsSettings")
        tls = transport_socket(tls_settings, "tracer", metadata, is_h2=kind == "lightstep")
        return Tracer(kind, host_port(address, f"tracing.{kind}.address", host_ip), tls, tls_settings is not None)
    return None


@dataclass(frozen=True)
class RemoteService:
    """envoyMetricsService / envoyAccessLogService with an address, resolved for rendering."""

    name: str  # the cluster: envoy_metrics_service / envoy_accesslog_service
    address: HostPort
    tls: dict[str, Any] | None
    tls_set: bool
    keepalive: Mapping[str, Any] | None


def remote_service(name: str, field: str, service: Mapping[str, Any] | None, metadata: Mapping[str, Any],
                   host_ip: str = "") -> RemoteService | None:
    if not service or not service.get("address"):
        return None
    tls_settings = service.get("tlsSettings")
    return RemoteService(
        name, host_port(str(service["address"]), f"{field}.address", host_ip),
        transport_socket(tls_settings, name, metadata, is_h2=True), tls_settings is not None,
        service.get("tcpKeepalive"),
    )


def metrics_service(proxy_config: Mapping[str, Any], metadata: Mapping[str, Any],
                    host_ip: str = "") -> RemoteService | None:
    """`envoyMetricsService`; the deprecated `envoyMetricsServiceAddress` alone no longer configures one."""
    service = proxy_config.get("envoyMetricsService")
    if proxy_config.get("envoyMetricsServiceAddress") and not (service or {}).get("address"):
        if service is None:
            # Upstream dereferences the absent envoyMetricsService here and stops at start.
            raise ConfigError("field envoyMetricsServiceAddress: deprecated and no longer rendered; "
                              "set envoyMetricsService.address instead")
        log.warning("field envoyMetricsServiceAddress is deprecated and has no effect; use envoyMetricsService")
    return remote_service("envoy_metrics_service", "envoyMetricsService", service, metadata, host_ip)


def remote_service_cluster(service: RemoteService, dns_lookup_family: str) -> dict[str, Any]:
    """`envoy_metrics_service` / `envoy_accesslog_service`: HTTP/2 STRICT_DNS clusters."""
    out: dict[str, Any] = {"name": service.name, "alt_stat_name": f"{service.name};", "type": "STRICT_DNS"}
    if service.tls is not None:
        out["transport_socket"] = service.tls
    if service.keepalive is not None:
        out["upstream_connection_options"] = tcp_keepalive(service.keepalive)
    out.update({
        "respect_dns_ttl": True,
        "dns_lookup_family": dns_lookup_family,
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": http2_protocol_options(),
        "load_assignment": _load_assignment(service.name, service.address),
    })
    return out


def _load_assignment(name: str, address: HostPort) -> dict[str, Any]:
    return {
        "cluster_name": name,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": address.socket_address()}}}]}],
    }


def tracer_cluster(trace: Tracer, dns_lookup_family: str) -> dict[str, Any]:
    """The collector's cluster, field for field as the template writes it for each tracer."""
    name = "datadog_agent" if trace.kind == "datadog" else trace.kind
    out: dict[str, Any] = {"name": name, "alt_stat_name": f"{name};"}
    if trace.tls is not None:
        out["transport_socket"] = trace.tls
    dns = {"type": "STRICT_DNS", "respect_dns_ttl": True, "dns_lookup_family": dns_lookup_family}
    if trace.kind == "zipkin":
        out.update({**dns, "dns_refresh_rate": "30s", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN"})
    elif trace.kind == "lightstep":
        out.update({"typed_extension_protocol_options": http2_protocol_options(), **dns,
                    "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN"})
    else:
        out.update({"connect_timeout": "1s", **dns, "lb_policy": "ROUND_ROBIN"})
    out["load_assignment"] = _load_assignment(name, trace.address)
    return out


def tracing_config(trace: Tracer, service_cluster: str, lightstep_token_path: str) -> dict[str, Any]:
    """The bootstrap's `tracing` block for the tracer."""
    if trace.kind == "zipkin":
        return {"http": {"name": "envoy.tracers.zipkin", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
            "collector_cluster": "zipkin",
            "collector_endpoint": "/api/v2/spans",
            "collector_endpoint_version": "HTTP_JSON",
            "trace_id_128bit": True,
            "shared_span_context": False,
        }}}
    if trace.kind == "lightstep":
        return {"http": {"name": "envoy.tracers.lightstep", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.LightstepConfig",
            "collector_cluster": "lightstep",
            "access_token_file": lightstep_token_path,
        }}}
    return {"http": {"name": "envoy.tracers.datadog", "typed_config": {
        "@type": "type.googleapis.com/envoy.config.trace.v3.DatadogConfig",
        "collector_cluster": "datadog_agent",
        "service_name": service_cluster,
    }}}


def stats_sinks(metrics: RemoteService | None, statsd: HostPort | None) -> list[dict[str, Any]]:
    sinks: list[dict[str, Any]] = []
    if metrics is not None:
        sinks.append({
            "name": "envoy.stat_sinks.metrics_service",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.MetricsServiceConfig",
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "envoy_metrics_service"}},
            },
        })
    if statsd is not None:
        sinks.append({
            "name": "envoy.stat_sinks.statsd",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.metrics.v3.StatsdSink",
                "address": {"socket_address": statsd.socket_address()},
            },
        })
    return sinks
