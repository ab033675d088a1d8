"""install-cni's metrics, upstream's names (cni/pkg/install/monitoring.go), on a registry of its own.

`istio_cni_installs_total{result}` counts each time the installation became
ready (SUCCESS: the first install and every reinstall after a change took our
entry or binary away) and each failed step (COPY_BINARIES_FAILURE,
CREATE_KUBECONFIG_FAILURE, CREATE_CNI_CONFIG_FAILURE); `istio_cni_install_ready`
is 1 while installed. The repair controller adds its own to the same registry
(`CurrentRepairRun`). On the product's own `istio_agent.metrics`, as the agent:
one metrics stack in the product. Upstream (OpenCensus/OTel) exports no
`_created` series; `assembly.run_install_cni` turns them off (`without_created_series`).
"""

from __future__ import annotations

from collections.abc import Iterable

from istio_agent.metrics import CollectorRegistry, Counter, Gauge, Metric, ProcessCollector
from istio_agent.metrics.instruments import set_created_series


def without_created_series() -> None:
    """No `_created` series in this process (process-wide, as prometheus_client's switch was): install-cni's
    process calls it once before its metrics are made."""
    set_created_series(False)


class InstallMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        self.installs = Counter("istio_cni_installs",
                                "Total number of CNI plugins installed by the Istio CNI installer",
                                ["result"], registry=self.registry)
        self.ready = Gauge("istio_cni_install_ready", "Whether the CNI plugin installation is ready or not",
                           registry=self.registry)


class CurrentRepairRun:
    """A collector on install-cni's registry showing the metrics of the repair controller's current run.

    Each run gets a registry of its own (a restarted controller registers its counters again, which
    one shared registry would refuse as duplicates); its counters start again from zero, which
    Prometheus reads as a counter reset.
    """

    def __init__(self) -> None:
        self.current: CollectorRegistry | None = None

    def collect(self) -> Iterable[Metric]:
        return iter(()) if self.current is None else self.current.collect()

    def describe(self) -> Iterable[Metric]:
        return iter(())
