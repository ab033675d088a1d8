"""The agent's own metrics, fed by a real SecretCache signing with a real in-process CA.

Values are read back through prometheus_client's text parser from the registry's exposition,
which is what the merged endpoint serves first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeSigner
from prometheus_client.parser import text_string_to_metric_families

from istio_agent.clock import VirtualClock
from istio_agent.dns.metrics import DnsMetrics
from istio_agent.metrics import CollectorRegistry, generate_latest
from istio_agent.pki import certs, keys
from istio_agent.security.cache import SecretCache
from istio_agent.security.options import SecurityOptions
from istio_agent.status.agent_metrics import (
    XDS_AGENT_NACK,
    XDS_CONNECT,
    XDS_DISCONNECT,
    XDS_ENVOY_NACK,
    XDS_PUSH,
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
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


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
            assert got[("istio_agent_num_outgoing_requests_total", (("request_type", "csr"),))] == 1
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
            assert got[("istio_agent_num_failed_outgoing_requests_total", (("request_type", "csr"),))] >= 1
            assert got[("istio_agent_ca_request_duration_seconds_count", ())] >= 3
            assert got[("istio_agent_outgoing_latency_total", (("request_type", "csr"),))] > 0
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
    metrics.xds_event(XDS_UPSTREAM_FAILURE, "UNAVAILABLE")
    metrics.xds_event("a kind from the future", "x")
    got = values(registry)
    assert got[("istio_agent_xds_pushes_total", (("type", "cds"),))] == 2
    assert got[("istio_agent_xds_pushes_total", (("type", "nds"),))] == 1
    assert got[("istio_agent_xds_nacks_total", (("by", "envoy"), ("type", "cds")))] == 1
    assert got[("istio_agent_xds_nacks_total", (("by", "agent"), ("type", "nds")))] == 1
    assert got[("istio_agent_xds_proxy_connections", (("mode", "delta"),))] == 1
    assert got[("istio_agent_xds_proxy_streams_total", (("mode", "delta"),))] == 1
    assert got[("istio_agent_istiod_connection_failures_total", ())] == 1
    metrics.xds_event(XDS_DISCONNECT, "delta")
    assert values(registry)[("istio_agent_xds_proxy_connections", (("mode", "delta"),))] == 0


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
