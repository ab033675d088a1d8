"""Every option upstream's `pkg/bootstrap` derives for its template, derived once.

Upstream turns its `bootstrap.Config` (node, metadata, ProxyConfig, compliance
policy) into a map of named options that its template reads. `derive()` makes
the same decisions, into one typed value, and both rendering paths read it: the
built-in rendering (`render.render_bootstrap`) and the parameter map a
custom Go template sees (`params.template_params`). So a rule (which
tracer, which listeners, which limit) is stated once and the two cannot
disagree. Pure: no files, no environment; a bad address is a ConfigError
naming the ProxyConfig field, as upstream fails to write the bootstrap then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from istio_agent.config.errors import ConfigError
from istio_agent.envoy.bootstrap import stats, tracing
from istio_agent.envoy.bootstrap.options import (
    FILE_CREDENTIAL_SOCKET,
    AddressFamily,
    BootstrapOptions,
    address_family,
    locality,
    max_downstream_connections,
    runtime_flags,
    service_cluster,
)
from istio_agent.envoy.bootstrap.tracing import HostPort, RemoteService, Tracer

METRICS_LOCALHOST_ACCESS_ONLY = "METRICS_LOCALHOST_ACCESS_ONLY"  # a proxyMetadata entry
# The raw metadata key set when another SDS server owns the workload socket (config.node.FILE_CREDENTIAL_KEY).
FILE_CREDENTIAL_KEY = "file-credential"


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class BootstrapValues:
    """What the template is rendered from, under names close to upstream's options."""

    opts: BootstrapOptions
    cluster: str
    locality: dict[str, str]
    runtime_flags: dict[str, Any]
    xds_type: str
    metadata_discovery: bool
    family: AddressFamily
    envoy_status_port: int
    envoy_prometheus_port: int
    secure_metrics_port: int  # 0: no mTLS listener for Envoy's stats
    secure_merged_metrics_port: int  # 0: no mTLS listener for the merged stats
    metrics_localhost_access_only: bool
    status_port_proxy_protocol: bool
    enable_self_discovery: bool
    custom_file_path: str  # the sds-files-grpc pipe when another SDS server owns the workload socket
    stats: stats.StatsOptions
    stats_compression: bool
    tracer: Tracer | None
    stackdriver: tracing.Stackdriver | None  # no tracer rendered; its settings go to a custom template
    statsd: HostPort | None
    metrics_service: RemoteService | None
    access_log_service: RemoteService | None
    pilot_grpc_address: HostPort | None
    outlier_log_path: str
    load_stats_config_json: str | None
    global_downstream_max_connections: int
    sts_port: int

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.opts.metadata

    @property
    def platform_metadata(self) -> Mapping[str, Any]:
        """PLATFORM_METADATA (config/platform.py): GCP project facts for custom templates and Stackdriver."""
        return tracing.platform_metadata(self.metadata)

    @property
    def proxy_config(self) -> Mapping[str, Any]:
        return self.opts.proxy_config

    @property
    def discovery_address(self) -> str:
        return str(self.proxy_config.get("discoveryAddress", ""))

    @property
    def metrics_address(self) -> str:
        """The :15090 listener's address: loopback when proxyMetadata METRICS_LOCALHOST_ACCESS_ONLY is "true"."""
        return self.family.localhost if self.metrics_localhost_access_only else self.family.wildcard

    @property
    def additional_metrics_address(self) -> str:
        return self.family.additional_localhost if self.metrics_localhost_access_only else \
            self.family.additional_wildcard

    @property
    def cluster_manager_needed(self) -> bool:
        """The template writes `cluster_manager` only for an outlier log, LRS or the local cluster."""
        return bool(self.outlier_log_path or self.load_stats_config_json or self.enable_self_discovery)

    def load_stats_config(self) -> dict[str, Any] | None:
        """LOAD_STATS_CONFIG_JSON parsed; the template pastes it, so it must be a JSON object."""
        if not self.load_stats_config_json:
            return None
        try:
            value = json.loads(self.load_stats_config_json)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"node metadata LOAD_STATS_CONFIG_JSON: invalid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError("node metadata LOAD_STATS_CONFIG_JSON: expected a JSON object")
        return value


def derive(opts: BootstrapOptions) -> BootstrapValues:
    """Upstream's template options for `opts` (config.go's toTemplateParams and its helpers)."""
    pc, meta = opts.proxy_config, opts.metadata
    lrs = meta.get("LOAD_STATS_CONFIG_JSON")
    discovery = str(pc.get("discoveryAddress", ""))
    statsd = str(pc.get("statsdUdpAddress", ""))
    return BootstrapValues(
        opts=opts,
        cluster=service_cluster(pc, meta),
        locality=locality(meta, opts.platform_locality),
        runtime_flags=runtime_flags(pc, opts.compliance_policy, opts.strip_fragment),
        xds_type=opts.xds_type,
        metadata_discovery=opts.metadata_discovery,
        family=address_family(opts.instance_ips, opts.dual_stack),
        envoy_status_port=_int(meta.get("ENVOY_STATUS_PORT")),
        envoy_prometheus_port=_int(meta.get("ENVOY_PROMETHEUS_PORT")),
        secure_metrics_port=_int(meta.get("ENVOY_SECURE_METRICS_PORT")),
        secure_merged_metrics_port=_int(meta.get("ENVOY_SECURE_MERGED_METRICS_PORT")),
        metrics_localhost_access_only=dict(pc.get("proxyMetadata") or {}).get(METRICS_LOCALHOST_ACCESS_ONLY) == "true",
        status_port_proxy_protocol=opts.status_port_proxy_protocol,
        enable_self_discovery=meta.get("ENABLE_SELF_DISCOVERY") == "true",
        custom_file_path=FILE_CREDENTIAL_SOCKET if FILE_CREDENTIAL_KEY in meta else "",
        stats=stats.stats_options(opts.annotations, pc, opts.instance_ips, opts.exit_on_zero_active_connections),
        stats_compression=stats.stats_compression(pc),
        tracer=tracing.tracer(pc.get("tracing"), meta, opts.host_ip),
        stackdriver=tracing.stackdriver(pc.get("tracing"), meta),
        statsd=tracing.host_port(statsd, "statsdUdpAddress", opts.host_ip) if statsd else None,
        metrics_service=tracing.metrics_service(pc, meta, opts.host_ip),
        access_log_service=tracing.remote_service("envoy_accesslog_service", "envoyAccessLogService",
                                                  pc.get("envoyAccessLogService"), meta, opts.host_ip),
        pilot_grpc_address=tracing.host_port(discovery, "discoveryAddress", opts.host_ip) if discovery else None,
        outlier_log_path=str(meta.get("OUTLIER_LOG_PATH") or ""),
        load_stats_config_json=lrs if isinstance(lrs, str) else None,
        global_downstream_max_connections=max_downstream_connections(pc),
        sts_port=_int(meta.get("STS_PORT")),
    )
