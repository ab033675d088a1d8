"""install-cni's metrics, upstream's names (cni/pkg/install/monitoring.go), on a registry of its own.

`istio_cni_installs_total{result}` counts each time the installation became
ready (SUCCESS: the first install and every reinstall after a change took our
entry or binary away) and each failed step (COPY_BINARIES_FAILURE,
CREATE_KUBECONFIG_FAILURE, CREATE_CNI_CONFIG_FAILURE); `istio_cni_install_ready`
is 1 while installed. The repair controller adds its own to the same registry.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge


class InstallMetrics:
    def __init__(self) -> None:
        prometheus_client.disable_created_metrics()  # upstream (OpenCensus/OTel) exports no _created series
        self.registry = CollectorRegistry(auto_describe=True)
        prometheus_client.ProcessCollector(registry=self.registry)
        self.installs = Counter("istio_cni_installs",
                                "Total number of CNI plugins installed by the Istio CNI installer",
                                ["result"], registry=self.registry)
        self.ready = Gauge("istio_cni_install_ready", "Whether the CNI plugin installation is ready or not",
                           registry=self.registry)
