"""install-cni's metrics on the product's `istio_agent.metrics` render as they did on prometheus_client (the
oracle here): the same registry contents (installs, readiness, the repair run's counter, the process metrics),
built in both the way install-cni builds them, give the same bytes, with no `_created` series in either."""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client
import prometheus_client.metrics
import pytest
from prometheus_client.exposition import generate_latest as their_text

from istio_agent.cni.install.metrics import CurrentRepairRun, InstallMetrics, without_created_series
from istio_agent.cni.repair.controller import RepairMetrics
from istio_agent.metrics import CollectorRegistry, generate_latest
from istio_agent.metrics import instruments as our_instruments


@pytest.fixture(autouse=True)
def no_created_series(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As install-cni's process: both libraries' process-wide switch off, put back after the test."""
    monkeypatch.setattr(our_instruments, "USE_CREATED", True)
    monkeypatch.setattr(prometheus_client.metrics, "_use_created", True)
    without_created_series()
    prometheus_client.disable_created_metrics()
    yield


def theirs() -> bytes:
    """install-cni's registry as it was built on prometheus_client."""
    registry = prometheus_client.CollectorRegistry(auto_describe=True)
    prometheus_client.ProcessCollector(registry=registry)
    installs = prometheus_client.Counter("istio_cni_installs",
                                         "Total number of CNI plugins installed by the Istio CNI installer",
                                         ["result"], registry=registry)
    ready = prometheus_client.Gauge("istio_cni_install_ready", "Whether the CNI plugin installation is ready or not",
                                    registry=registry)
    run = prometheus_client.CollectorRegistry(auto_describe=True)
    repaired = prometheus_client.Counter("istio_cni_repair_pods_repaired",
                                         "Total number of pods repaired by repair controller", ["type", "result"],
                                         registry=run)
    registry.register(run)  # type: ignore[arg-type]  # the current run's registry, seen through the view
    installs.labels("SUCCESS").inc()
    installs.labels("SUCCESS").inc()
    installs.labels("CREATE_CNI_CONFIG_FAILURE").inc()
    ready.set(1)
    repaired.labels(type="label", result="SUCCESS").inc()
    repaired.labels(type="label", result="FAIL").inc(2)
    return their_text(registry)


def ours() -> bytes:
    metrics = InstallMetrics()
    view = CurrentRepairRun()
    metrics.registry.register(view)
    view.current = CollectorRegistry(auto_describe=True)
    repair = RepairMetrics(view.current)
    metrics.installs.labels("SUCCESS").inc()
    metrics.installs.labels("SUCCESS").inc()
    metrics.installs.labels("CREATE_CNI_CONFIG_FAILURE").inc()
    metrics.ready.set(1)
    repair.count("label", "SUCCESS")
    repair.count("label", "FAIL")
    repair.count("label", "FAIL")
    return generate_latest(metrics.registry)


def split(text: bytes) -> tuple[list[str], list[str]]:
    """(the process metrics' HELP/TYPE lines and sample names, every other line): process values move."""
    process, rest = [], []
    for line in text.decode().splitlines():
        if line.startswith(("process_", "# HELP process_", "# TYPE process_")):
            process.append(line if line.startswith("#") else line.split(" ")[0])
        else:
            rest.append(line)
    return process, rest


def test_install_cni_metrics_render_as_they_did_on_prometheus_client() -> None:
    our_process, our_rest = split(ours())
    their_process, their_rest = split(theirs())
    assert our_rest == their_rest
    assert our_process == their_process and "process_resident_memory_bytes" in our_process
    assert 'istio_cni_installs_total{result="SUCCESS"} 2.0' in our_rest
    assert 'istio_cni_repair_pods_repaired_total{result="FAIL",type="label"} 2.0' in our_rest
    assert not any("_created" in line for line in our_rest)


def test_without_a_repair_run_the_view_shows_nothing() -> None:
    metrics = InstallMetrics()
    metrics.registry.register(CurrentRepairRun())
    assert b"istio_cni_repair" not in generate_latest(metrics.registry)
