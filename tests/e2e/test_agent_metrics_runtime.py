"""What a running agent imports, and its merged metrics page through promtool, for a sidecar and a proxyless agent.

A real `pilot-agent proxy sidecar` with Envoy, istiod-local and the DNS proxy on,
then a proxyless one (the grpc-agent template's environment), each run with
`PYTHONPROFILEIMPORTTIME=1` so its log lists every module the process imported
while it started, served and was scraped. Neither may load prometheus_client or
the HTTP server / urllib chain it brings (istio_agent.metrics replaces it:
~3 MB of anonymous memory per pod). The sidecar's merged `/stats/prometheus`
(agent + DNS + process metrics + Envoy) passes `promtool check metrics` in text
and in OpenMetrics (exit 3 is lint only).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment, echo_registry, host_sidecar_ports
from needs import need_sidecar_binaries, need_tool
from support import HTTP_NOT_YET, free_port, http_request, poll, scrape_metrics

FORBIDDEN = ("prometheus_client", "http.server", "wsgiref", "socketserver", "urllib.request")
OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def imported(log: Path) -> set[str]:
    """Module names from the `import time: self | cumulative | name` lines of the log."""
    out = set()
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            out.add(line.rsplit("|", 1)[1].strip())
    return out


def forbidden(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] == "prometheus_client" or m in FORBIDDEN}


def promtool(body: bytes) -> None:
    done = subprocess.run([need_tool("promtool"), "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert done.returncode in (0, 3), f"promtool check metrics exit {done.returncode}: {done.stderr[-2000:]!r}"


@pytest.fixture(scope="module")
def istiod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IstiodLocal, Path]]:
    need_sidecar_binaries()
    base = tmp_path_factory.mktemp("metrics-runtime")
    with IstiodLocal(base / "state", registry=RegistryFile(base / "mesh.yaml", echo_registry())) as server:
        yield server, base


def test_sidecar_imports_no_prometheus_client_and_its_page_passes_promtool(
        istiod: tuple[IstiodLocal, Path]) -> None:
    server, base = istiod
    log = base / "sidecar.log"
    with host_sidecar_ports():
        sidecar = PilotAgent(server.pod_files(base / "pod", pod="echo-1"), agent_environment(
            discovery=server.secure_address, ISTIO_META_DNS_CAPTURE="true", DNS_PROXY_ADDR=f"127.0.0.1:{free_port()}",
            PYTHONPROFILEIMPORTTIME="1"), log_file=log)
        try:
            sidecar.start().wait_ready(timeout=30)
            ctype, text = scrape_metrics(15020, "text/plain;version=0.0.4")
            assert ctype.startswith("text/plain") and b"istio_agent_dns_requests_total" in text
            assert b"envoy_server_live" in text and b"istio_agent_process_resident_memory_bytes" in text
            promtool(text)
            ctype, om = scrape_metrics(15020, OPENMETRICS_ACCEPT)
            promtool(om)
        finally:
            sidecar.kill()
    modules = imported(log)
    assert {"istio_agent.metrics", "istio_agent.status.merged_metrics.handler"} <= modules, sorted(modules)[:50]
    assert not forbidden(modules), sorted(forbidden(modules))


def test_proxyless_agent_imports_no_prometheus_client(istiod: tuple[IstiodLocal, Path]) -> None:
    server, base = istiod
    pod, log, status_port = base / "proxyless-pod", base / "proxyless.log", free_port()
    server.pod_files(pod, pod="sleep-1", service_account="sleep")
    environment = agent_environment(
        pod="sleep-1", service_account="sleep", discovery=server.secure_address,
        proxy_config={"statusPort": status_port, "configPath": str(pod / "etc/istio/proxy")},
        ISTIO_META_GENERATOR="grpc", DISABLE_ENVOY="true", OUTPUT_CERTS=str(pod / "var/lib/istio/data"),
        PYTHONPROFILEIMPORTTIME="1")
    agent = PilotAgent(pod, environment, log_file=log)
    try:
        agent.start()
        def ready() -> bool:
            assert agent.alive(), f"the proxyless agent exited:\n{agent.output()}"
            return http_request("127.0.0.1", status_port, "/healthz/ready", timeout=1.0)[0] == 200

        poll(ready, "the proxyless agent to be ready", 30, agent.output, retry_on=HTTP_NOT_YET)
        _, body = scrape_metrics(status_port, "text/plain;version=0.0.4")
        assert b"istio_agent_process_resident_memory_bytes" in body
        promtool(body)
    finally:
        agent.kill()
    modules = imported(log)
    assert "istio_agent.metrics" in modules, sorted(modules)[:50]
    assert not forbidden(modules), sorted(forbidden(modules))
