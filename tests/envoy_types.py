"""Envoy's own protos for every typed_config a rendered bootstrap may hold, so tests parse bootstraps as Envoy
does (`as_envoy_bootstrap`): an unknown field or typed_config fails the parse."""

from __future__ import annotations

import importlib
from typing import Any

from google.protobuf import json_format

BOOTSTRAP_TYPES = (
    "envoy.config.bootstrap.v3.bootstrap_pb2",
    "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2",
    "envoy.extensions.filters.http.router.v3.router_pb2",
    "envoy.extensions.filters.http.compressor.v3.compressor_pb2",
    "envoy.extensions.compression.brotli.compressor.v3.brotli_pb2",
    "envoy.extensions.compression.zstd.compressor.v3.zstd_pb2",
    "envoy.extensions.compression.gzip.compressor.v3.gzip_pb2",
    "envoy.extensions.access_loggers.file.v3.file_pb2",
    "envoy.extensions.upstreams.http.v3.http_protocol_options_pb2",
    "envoy.extensions.resource_monitors.downstream_connections.v3.downstream_connections_pb2",
    "envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2",
    "envoy.extensions.filters.listener.proxy_protocol.v3.proxy_protocol_pb2",
    "envoy.extensions.load_balancing_policies.least_request.v3.least_request_pb2",
    "udpa.type.v1.typed_struct_pb2",
    "envoy.config.trace.v3.zipkin_pb2",
    "envoy.config.trace.v3.datadog_pb2",
    "envoy.config.trace.v3.lightstep_pb2",
    "envoy.config.metrics.v3.stats_pb2",
    "envoy.config.metrics.v3.metrics_service_pb2",
    "envoy.extensions.transport_sockets.tls.v3.tls_pb2",
)


def as_envoy_bootstrap(bootstrap: dict[str, Any]) -> Any:
    """`bootstrap` parsed into Envoy's v3 Bootstrap message (ValueError-like ParseError when it is not one)."""
    modules = [importlib.import_module(name) for name in BOOTSTRAP_TYPES]
    return json_format.ParseDict(bootstrap, modules[0].Bootstrap())
