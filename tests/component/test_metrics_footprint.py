"""The agent's modules, imported as a sidecar agent loads them, leave prometheus_client and its HTTP chain out.

istio_agent.metrics stands in for prometheus_client in the agent (its import cost ~3 MB
of anonymous memory per pod, mostly the http.server / socketserver / urllib.request /
wsgiref chain of its exposition module). The running agents are checked too, in
tests/e2e/test_agent_metrics_runtime.py.
"""

from __future__ import annotations

from support import loaded_after

FORBIDDEN = ("prometheus_client", "http.server", "wsgiref", "socketserver", "urllib.request")
AGENT_MODULES = (
    "import istio_agent.agent.run, istio_agent.agent.assembly, istio_agent.memory, istio_agent.status.agent_metrics\n"
    "import istio_agent.security.identity, istio_agent.security.sds, istio_agent.dns.proxy, istio_agent.xds.proxy\n"
    "import istio_agent.status.server, istio_agent.status.merged_metrics.handler, istio_agent.grpcxds\n"
)


def test_agent_modules_load_no_prometheus_client() -> None:
    loaded = loaded_after(AGENT_MODULES)
    assert "istio_agent.metrics" in loaded and "istio_agent.status.merged_metrics.handler" in loaded
    bad = {m for m in loaded if m.startswith(FORBIDDEN)}
    assert not bad, sorted(bad)


def test_rendering_a_registry_loads_no_io_stack() -> None:
    """The package is the data model and two renderers: no sockets, HTTP, email parsing or asyncio."""
    loaded = loaded_after(
        "from istio_agent.metrics import CollectorRegistry, Counter, ProcessCollector, generate_latest,"
        " generate_openmetrics\n"
        "r = CollectorRegistry()\nCounter('c', 'h', ['k'], registry=r).labels('v').inc()\n"
        "ProcessCollector(registry=r)\nassert generate_latest(r) and generate_openmetrics(r)\n")
    heavy = {m for m in loaded if m.startswith((*FORBIDDEN, "http", "email", "socket", "asyncio", "ssl"))}
    assert not heavy, sorted(heavy)
