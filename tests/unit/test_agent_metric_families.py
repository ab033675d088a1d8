"""Every metric family upstream's agent can export on :15020, and ours under the same name, type and labels.

Upstream's list is read from its source at the pinned version (the packages linked into pilot-agent that
declare metrics, registered under `istio_agent_` by its status server), written down here as facts. A
running Go agent shows only the families that have a value by then; `tests/e2e/test_agent_metrics_upstream.py`
compares two running pods. Here the agent's registry is built as the assembly builds it and each family
checked, so that a family that upstream's agent records only in rare cases (a CSR retried, a file secret
that does not load) is held to upstream's shape too.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from istio_agent.dns.metrics import DnsMetrics
from istio_agent.metrics import CollectorRegistry, generate_latest
from istio_agent.security.core.secrets import SecretItem
from istio_agent.status.agent_metrics import AgentMetrics
from istio_agent.status.merged_metrics.handler import ScrapeCounters
from istio_agent.wasm.metrics import WasmMetrics

# name: (type in the text exposition, label names)
UPSTREAM: dict[str, tuple[str, frozenset[str]]] = {
    # pilot/cmd/pilot-agent/metrics
    "istio_agent_startup_duration_seconds": ("gauge", frozenset()),
    "istio_agent_scrapes_total": ("counter", frozenset()),
    "istio_agent_scrape_failures_total": ("counter", frozenset({"type"})),
    # pkg/istio-agent/metrics
    "istio_agent_istiod_connection_failures": ("counter", frozenset()),
    "istio_agent_istiod_connection_terminations": ("counter", frozenset({"type"})),
    "istio_agent_envoy_connection_terminations": ("counter", frozenset({"type"})),
    "istio_agent_xds_proxy_requests": ("counter", frozenset()),
    "istio_agent_xds_proxy_responses": ("counter", frozenset()),
    # security/pkg/nodeagent/cache, security/pkg/monitoring
    "istio_agent_outgoing_latency": ("counter", frozenset({"request_type"})),
    "istio_agent_num_outgoing_requests": ("counter", frozenset({"request_type"})),
    "istio_agent_num_failed_outgoing_requests": ("counter", frozenset({"request_type"})),
    "istio_agent_num_outgoing_retries": ("counter", frozenset({"request_type"})),
    "istio_agent_num_file_watcher_failures_total": ("counter", frozenset()),
    "istio_agent_num_file_secret_failures_total": ("counter", frozenset()),
    "istio_agent_cert_expiry_seconds": ("gauge", frozenset({"resource_name"})),
    # pkg/dns/client
    "istio_agent_dns_requests_total": ("counter", frozenset()),
    "istio_agent_dns_upstream_requests_total": ("counter", frozenset()),
    "istio_agent_dns_upstream_failures_total": ("counter", frozenset()),
    "istio_agent_dns_upstream_request_duration_seconds": ("histogram", frozenset()),
    # pkg/wasm
    "istio_agent_wasm_cache_entries": ("gauge", frozenset()),
    "istio_agent_wasm_cache_lookup_count": ("counter", frozenset({"hit"})),
    "istio_agent_wasm_remote_fetch_count": ("counter", frozenset({"result"})),
    "istio_agent_wasm_config_conversion_count": ("counter", frozenset({"result"})),
    "istio_agent_wasm_config_conversion_duration": ("histogram", frozenset()),
    # pkg/xds, as the agent's SDS server and XDS proxy record them
    "istio_agent_pilot_total_xds_internal_errors": ("counter", frozenset()),
    "istio_agent_pilot_xds_expired_nonce": ("counter", frozenset({"type"})),
    "istio_agent_pilot_total_xds_rejects": ("counter", frozenset({"type"})),
    "istio_agent_pilot_xds_write_timeout": ("counter", frozenset()),
    "istio_agent_pilot_xds_recv_max": ("gauge", frozenset()),
    "istio_agent_pilot_xds_send_time": ("histogram", frozenset()),
    # Go's process collector
    "istio_agent_process_cpu_seconds_total": ("counter", frozenset()),
    "istio_agent_process_max_fds": ("gauge", frozenset()),
    "istio_agent_process_open_fds": ("gauge", frozenset()),
    "istio_agent_process_resident_memory_bytes": ("gauge", frozenset()),
    "istio_agent_process_start_time_seconds": ("gauge", frozenset()),
    "istio_agent_process_virtual_memory_bytes": ("gauge", frozenset()),
    "istio_agent_process_virtual_memory_max_bytes": ("gauge", frozenset()),
    "istio_agent_process_network_receive_bytes_total": ("counter", frozenset()),
    "istio_agent_process_network_transmit_bytes_total": ("counter", frozenset()),
}

# Upstream's families ours does not have, and why (docs/PILOT-AGENT.md#metrics says the same).
NOT_HERE = {
    r"istio_agent_go_.*": "Go's runtime collector (goroutines, GC, memstats): a Python process has no Go runtime",
    r"istio_agent_pilot_xds_(cds|eds|lds|rds)_reject": "pkg/xds records them for CDS/EDS/LDS/RDS NACKs; the "
                                                       "agent's pkg/xds server serves SDS only, so never",
    r"istio_agent_pilot_worker_queue_(depth|latency|duration)": "pkg/queue's, off unless "
                                                                "ISTIO_ENABLE_CONTROLLER_QUEUE_METRICS, and the "
                                                                "agent's one queue (a delayed queue) records none",
    r"istio_agent_istio_build": "pkg/version's; pilot-agent never records it",
}


def our_families() -> dict[str, tuple[str, frozenset[str]]]:
    registry = CollectorRegistry(auto_describe=True)
    metrics = AgentMetrics(registry)
    scrapes = ScrapeCounters(registry)
    DnsMetrics(registry)
    wasm = WasmMetrics(registry)
    # Give the families whose series appear only once used a series each, so their labels show.
    metrics._ready_after = 1.0
    workload = SecretItem("default", cert_chain=b"chain", expires=2e9)
    metrics._cache = SimpleNamespace(snapshot=lambda: [workload], issued=1, file_failures=0,  # type: ignore[assignment]
                                     file_watch_failures=0)
    metrics.sds_event("rejected", 0.0)
    metrics.sds_event("expired_nonce", 0.0)
    scrapes.scrapes.inc()
    wasm.cache_lookups.inc("true")
    wasm.remote_fetches.inc("success")
    wasm.conversions.inc("success")
    page = generate_latest(registry).decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M))
    labels: dict[str, set[str]] = {name: set() for name in types}
    for line in page.splitlines():
        if line.startswith("#"):
            continue
        sample = re.split(r"[{ ]", line, maxsplit=1)[0]
        for family in (sample, *(sample[: -len(s)] for s in ("_bucket", "_sum", "_count") if sample.endswith(s))):
            if family in labels:
                labels[family] |= set(re.findall(r'([a-zA-Z_]\w*)="', line)) - {"le"}
                break
    return {name: (typ, frozenset(labels[name])) for name, typ in types.items()}


def test_every_upstream_family_is_ours_with_its_type_and_labels() -> None:
    ours = our_families()
    assert {name: ours.get(name) for name in UPSTREAM} == UPSTREAM


def test_the_exceptions_are_none_of_ours() -> None:
    ours = our_families()
    for pattern in NOT_HERE:
        assert not [name for name in ours if re.fullmatch(pattern, name)], pattern
        assert not [name for name in UPSTREAM if re.fullmatch(pattern, name)], pattern
