"""The agent's own metrics, fed by a real SecretCache signing with a real in-process CA.

Values are read back through prometheus_client's OpenMetrics parser from the registry's OpenMetrics
exposition, which keeps every series under the name a scraper stores (its text parser would read
upstream's sums, `istio_agent_xds_proxy_requests 8`, as `..._total`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeSigner
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from istio_agent.clock import VirtualClock
from istio_agent.dns.metrics import DnsMetrics
from istio_agent.metrics import CollectorRegistry, generate_latest, generate_openmetrics
from istio_agent.pki import certs, keys
from istio_agent.security.cache import SecretCache
from istio_agent.security.options import SecurityOptions
from istio_agent.status.agent_metrics import (
    SDS_EXPIRED_NONCE,
    SDS_INTERNAL_ERROR,
    SDS_REJECTED,
    SDS_SENT,
    XDS_AGENT_NACK,
    XDS_CONNECT,
    XDS_DISCONNECT,
    XDS_DOWNSTREAM_END,
    XDS_ENVOY_NACK,
    XDS_PUSH,
    XDS_UPSTREAM_END,
    XDS_UPSTREAM_FAILURE,
    AgentMetrics,
    type_label,
)

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
NAME_TABLE = "type.googleapis.com/istio.networking.nds.v1.NameTable"


def options(tmp_path: Path, **overrides: object) -> SecurityOptions:
    base: dict[str, object] = dict(
        workdir=tmp_path, namespace="default", service_account="sleep", key_algorithm="ECDSA",
        retry_initial=0.05, retry_max=0.2, file_poll_interval=0.05, grace_period_ratio_jitter=0.0,
    )
    base.update(overrides)
    return SecurityOptions(**base)  # type: ignore[arg-type]


def values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_openmetrics(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def text_types(registry: CollectorRegistry) -> dict[str, str]:
    """Each family's type as the text exposition (what upstream's agent serves) declares it."""
    lines = generate_latest(registry).decode().splitlines()
    return {line.split()[2]: line.split()[3] for line in lines if line.startswith("# TYPE ")}


def test_certificate_expiry_rotations_and_ca_outcomes(tmp_path: Path) -> None:
    clock = VirtualClock()

    async def scenario() -> None:
        registry = CollectorRegistry(auto_describe=True)
        metrics = AgentMetrics(registry, clock=clock.now)
        signer = FakeSigner(clock.now, root_ttl=7200)
        cache = SecretCache(options(tmp_path, secret_ttl=2.0), metrics.metered_signer(signer), clock=clock)
        metrics.watch_secrets(cache)
        await cache.start()
        try:
            first = await cache.get("default")
            got = values(registry)
            assert got[("istio_agent_cert_expiry_timestamp_seconds", (("resource_name", "default"),))] == first.expires
            remaining = got[("istio_agent_cert_expiry_seconds", (("resource_name", "default"),))]
            assert remaining == 2.0
            # The ROOTCA bundle reports its root's own expiry (2 h), not the leaf's.
            root_expiry = got[("istio_agent_cert_expiry_timestamp_seconds", (("resource_name", "ROOTCA"),))]
            assert root_expiry == certs.not_after(signer.ca.cert)
            assert got[("istio_agent_ca_requests_total", (("code", "OK"),))] == 1
            assert got[("istio_agent_num_outgoing_requests", (("request_type", "csr"),))] == 1
            assert got[("istio_agent_certificates_issued_total", ())] == 1

            # The scheduled rotation (at half of 2 s) is pushed and counted.
            await clock.sleep(1.5)
            assert values(registry)[("istio_agent_cert_rotations_total", (("resource_name", "default"),))] == 1
            # A new trust bundle pushes ROOTCA.
            other = certs.new_root_ca(keys.generate_key("ECDSA"), "other", clock.now(), 3600)
            cache.set_extra_roots("pcds", [other.cert_pem])
            assert values(registry)[("istio_agent_cert_rotations_total", (("resource_name", "ROOTCA"),))] == 1

            signer.down = True
            await clock.sleep(1.0)
            got = values(registry)
            assert got[("istio_agent_ca_requests_total", (("code", "UNAVAILABLE"),))] >= 1
            assert got[("istio_agent_num_failed_outgoing_requests", (("request_type", "csr"),))] >= 1
            assert got[("istio_agent_ca_request_duration_seconds_count", ())] >= 3
            assert got[("istio_agent_outgoing_latency", (("request_type", "csr"),))] > 0
        finally:
            await cache.stop()

    clock.run(scenario())


def test_xds_events_by_type() -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry, process_metrics=False)
    metrics.xds_event(XDS_CONNECT, "delta")
    metrics.xds_event(XDS_PUSH, CLUSTER)
    metrics.xds_event(XDS_PUSH, CLUSTER)
    metrics.xds_event(XDS_PUSH, NAME_TABLE)
    metrics.xds_event(XDS_ENVOY_NACK, CLUSTER)
    metrics.xds_event(XDS_AGENT_NACK, NAME_TABLE)
    metrics.xds_event(XDS_UPSTREAM_FAILURE, "dial")
    metrics.xds_event(XDS_UPSTREAM_FAILURE, "UNAVAILABLE")  # a stream that ended: a termination, not a failure
    metrics.xds_event(XDS_UPSTREAM_END, "error")
    metrics.xds_event(XDS_DOWNSTREAM_END, "cancelled")
    metrics.xds_event(XDS_DOWNSTREAM_END, "cancelled")
    metrics.xds_event("a kind from the future", "x")
    got = values(registry)
    assert got[("istio_agent_xds_pushes_total", (("type", "cds"),))] == 2
    assert got[("istio_agent_xds_pushes_total", (("type", "nds"),))] == 1
    assert got[("istio_agent_xds_nacks_total", (("by", "envoy"), ("type", "cds")))] == 1
    assert got[("istio_agent_xds_nacks_total", (("by", "agent"), ("type", "nds")))] == 1
    assert got[("istio_agent_xds_proxy_connections", (("mode", "delta"),))] == 1
    assert got[("istio_agent_xds_proxy_streams_total", (("mode", "delta"),))] == 1
    assert got[("istio_agent_istiod_connection_failures", ())] == 1
    assert got[("istio_agent_istiod_connection_terminations", (("type", "error"),))] == 1
    assert got[("istio_agent_istiod_connection_terminations", (("type", "cancelled"),))] == 0
    assert got[("istio_agent_envoy_connection_terminations", (("type", "cancelled"),))] == 2
    assert got[("istio_agent_envoy_connection_terminations", (("type", "error"),))] == 0
    metrics.xds_event(XDS_DISCONNECT, "delta")
    assert values(registry)[("istio_agent_xds_proxy_connections", (("mode", "delta"),))] == 0


def test_sds_events_retries_and_start_up_as_upstreams_pkg_xds_and_agent_record_them() -> None:
    registry = CollectorRegistry()
    now = [0.0]
    metrics = AgentMetrics(registry, clock=lambda: now[0], process_metrics=False)
    assert ("istio_agent_startup_duration_seconds", ()) not in values(registry)  # absent until ready
    metrics._process_start = 100.0
    now[0] = 103.5
    metrics.envoy_ready()
    now[0] = 200.0
    metrics.envoy_ready()  # only the first time counts
    metrics.sds_event(SDS_SENT, 0.002)
    metrics.sds_event(SDS_SENT, 0.5)
    metrics.sds_event(SDS_REJECTED, 0.0)
    metrics.sds_event(SDS_EXPIRED_NONCE, 0.0)
    metrics.sds_event(SDS_INTERNAL_ERROR, 0.0)
    metrics.ca_retry()
    metrics.ca_retry()
    got = values(registry)
    assert got[("istio_agent_startup_duration_seconds", ())] == 3.5
    assert got[("istio_agent_pilot_xds_send_time_count", ())] == 2
    assert got[("istio_agent_pilot_xds_send_time_bucket", (("le", "0.01"),))] == 1
    assert got[("istio_agent_pilot_xds_send_time_bucket", (("le", "1.0"),))] == 2
    assert got[("istio_agent_pilot_total_xds_rejects", (("type", "sds"),))] == 1
    assert got[("istio_agent_pilot_xds_expired_nonce", (("type", "sds"),))] == 1
    assert got[("istio_agent_pilot_total_xds_internal_errors", ())] == 1
    assert got[("istio_agent_pilot_xds_write_timeout", ())] == 0
    assert got[("istio_agent_num_outgoing_retries", (("request_type", "csr"),))] == 2
    assert got[("istio_agent_pilot_xds_recv_max", ())] == 0  # no XDS proxy watched
    assert got[("istio_agent_num_file_secret_failures_total", ())] == 0
    types = text_types(registry)
    for name in ("istio_agent_num_outgoing_retries", "istio_agent_pilot_total_xds_rejects",
                 "istio_agent_num_file_watcher_failures_total", "istio_agent_xds_proxy_requests",
                 "istio_agent_istiod_connection_terminations"):
        assert types[name] == "counter", name
    assert types["istio_agent_startup_duration_seconds"] == "gauge"
    assert types["istio_agent_pilot_xds_send_time"] == "histogram"


def test_type_labels() -> None:
    assert type_label(CLUSTER) == "cds"
    assert type_label("type.googleapis.com/some.Unknown") == "type.googleapis.com/some.Unknown"


def test_dns_and_process_metrics_share_the_registry() -> None:
    registry = CollectorRegistry(auto_describe=True)
    AgentMetrics(registry)
    DnsMetrics(registry)
    names = {name for name, _ in values(registry)}
    assert "istio_agent_dns_requests_total" in names
    assert "istio_agent_process_cpu_seconds_total" in names
    assert "istio_agent_cert_expiry_seconds" not in names  # no secrets watched: no series
    assert all(name.startswith("istio_agent_") for name in names)


def test_two_agents_do_not_collide() -> None:
    AgentMetrics(CollectorRegistry(auto_describe=True))
    AgentMetrics(CollectorRegistry(auto_describe=True))
    with pytest.raises(ValueError, match="Duplicated"):
        AgentMetrics(registry := CollectorRegistry(auto_describe=True))
        AgentMetrics(registry)
