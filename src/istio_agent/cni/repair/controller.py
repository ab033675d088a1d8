"""The repair controller's I/O edge: list and watch the selected pods, act on the broken ones (being written)."""

from __future__ import annotations

import asyncio
import logging

import prometheus_client

from istio_agent.cni.kubeaccess import KubeAccess
from istio_agent.cni.repair.options import RepairOptions

log = logging.getLogger("istio_agent.cni.repair")


async def run_repair(options: RepairOptions, access: KubeAccess, registry: prometheus_client.CollectorRegistry) -> None:
    """Run until cancelled: watch `options`' pods through the API at `access`, count on `registry`."""
    if not options.enabled:
        log.info("CNI repair controller is disabled")
        return
    log.warning("the CNI repair controller is not built yet: %s is not watched", access.server)
    await asyncio.Event().wait()
