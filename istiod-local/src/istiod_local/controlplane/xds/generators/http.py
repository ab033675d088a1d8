"""The HTTP connection manager as istiod configures it for sidecars (outbound via RDS, inbound inline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3 import protocol_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.grpc_stats.v3 import config_pb2 as grpc_stats_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2

from istiod_local.controlplane.xds.generators.envoy import ads_config_source, boolean, duration, pack

HCM_FILTER = "envoy.filters.network.http_connection_manager"
HCM = hcm_pb2.HttpConnectionManager

# Istio's own HTTP filters (metadata exchange, stats, ALPN override) exist only in istio-proxy builds;
# with upstream Envoy the sidecar keeps the standard ones in istiod's order.
_FORWARD_CLIENT_CERT = {
    "SANITIZE": HCM.SANITIZE, "FORWARD_ONLY": HCM.FORWARD_ONLY, "APPEND_FORWARD": HCM.APPEND_FORWARD,
    "SANITIZE_SET": HCM.SANITIZE_SET, "ALWAYS_FORWARD_ONLY": HCM.ALWAYS_FORWARD_ONLY,
}


def _http_filters() -> list[hcm_pb2.HttpFilter]:
    return [
        hcm_pb2.HttpFilter(name="envoy.filters.http.grpc_stats", typed_config=pack(grpc_stats_pb2.FilterConfig(
            emit_filter_state=True, stats_for_all_methods=boolean(False)))),
        hcm_pb2.HttpFilter(name="envoy.filters.http.fault", typed_config=pack(fault_pb2.HTTPFault())),
        hcm_pb2.HttpFilter(name="envoy.filters.http.cors", typed_config=pack(cors_pb2.Cors())),
        hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=pack(router_pb2.Router())),
    ]


def _base(stat_prefix: str, http2: bool) -> hcm_pb2.HttpConnectionManager:
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        codec_type=HCM.AUTO,
        http_filters=_http_filters(),
        use_remote_address=boolean(False),
        upgrade_configs=[HCM.UpgradeConfig(upgrade_type="websocket")],
        stream_idle_timeout=duration(0),
        normalize_path=boolean(True),
        path_with_escaped_slashes_action=HCM.KEEP_UNCHANGED,
        request_id_extension=hcm_pb2.RequestIDExtension(typed_config=pack(
            uuid_pb2.UuidRequestIdConfig(use_request_id_for_trace_sampling=boolean(True)))),
    )
    if http2:
        hcm.http2_protocol_options.CopyFrom(protocol_pb2.Http2ProtocolOptions())
    return hcm


def outbound_hcm(stat_prefix: str, route_name: str) -> hcm_pb2.HttpConnectionManager:
    hcm = _base(stat_prefix, http2=False)
    hcm.rds.CopyFrom(hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=route_name))
    return hcm


def forward_client_cert(proxy_config: Mapping[str, Any]) -> int:
    """ProxyConfig `proxyHeaders.forwardedClientCert`, APPEND_FORWARD for sidecars by default."""
    headers = proxy_config.get("proxyHeaders")
    mode = headers.get("forwardedClientCert") if isinstance(headers, Mapping) else None
    return _FORWARD_CLIENT_CERT.get(str(mode), HCM.APPEND_FORWARD)


def inbound_hcm(stat_prefix: str, route_config: route_pb2.RouteConfiguration, http2: bool,
                forward_mode: int = HCM.APPEND_FORWARD) -> hcm_pb2.HttpConnectionManager:
    """Inbound HTTP: the route is inline, and the peer's certificate goes to the app in x-forwarded-client-cert."""
    hcm = _base(stat_prefix, http2)
    hcm.route_config.CopyFrom(route_config)
    hcm.forward_client_cert_details = forward_mode  # type: ignore[assignment]
    hcm.set_current_client_cert_details.CopyFrom(HCM.SetCurrentClientCertDetails(
        subject=boolean(True), uri=True, dns=True))
    hcm.server_name = "istio-envoy"
    hcm.server_header_transformation = HCM.OVERWRITE
    return hcm


def hcm_filter(hcm: hcm_pb2.HttpConnectionManager) -> listener_components_pb2.Filter:
    return listener_components_pb2.Filter(name=HCM_FILTER, typed_config=pack(hcm))

