"""The status server and the agent's HTTP clients load no aiohttp (h11 under asyncio streams instead).

aiohttp and its companions (yarl, multidict, frozenlist, aiosignal, propcache,
aiohappyeyeballs) cost every agent 8-13 MB of resident memory; istiod-local may
keep them, the per-pod agent must not. Checked twice: in a fresh interpreter
importing every module the assembly loads for the status server and the
health checker, and in a real `pilot-agent proxy sidecar` (with its Envoy)
asked for readiness, merged metrics and an HTTP app probe, whose every import
`PYTHONPROFILEIMPORTTIME` lists.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fixtures import AgentStarter
from launchers import agent_environment, http_request
from support import free_port, loaded_after

AIOHTTP_FAMILY = ("aiohttp", "yarl", "multidict", "frozenlist", "aiosignal", "propcache", "aiohappyeyeballs")


def aiohttp_family(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in AIOHTTP_FAMILY}


def test_the_status_server_its_routes_and_clients_load_no_aiohttp() -> None:
    loaded = loaded_after(
        "import istio_agent.agent.assembly, istio_agent.status.server, istio_agent.status.merged_metrics.handler\n"
        "import istio_agent.status.probes.prober, istio_agent.status.probes.https, istio_agent.status.ndsz\n"
        "import istio_agent.status.secrets_debug, istio_agent.health.probers, istio_agent.health.runner\n"
        "import istio_agent.envoy.admin, istio_agent.envoy.supervisor\n")
    assert "h11" in loaded and "istio_agent.httpio.server" in loaded
    assert aiohttp_family(loaded) == set()


class App(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"# TYPE app_up gauge\napp_up 1\n" if self.path == "/metrics" else b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def app() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), App)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_running_sidecar_agent_never_imports_aiohttp(tmp_path: Path, start_agent: AgentStarter, app: int) -> None:
    status_port = free_port()
    environment = agent_environment(
        proxy_config={"statusPort": status_port, "discoveryAddress": "127.0.0.1:1"},
        ISTIO_KUBE_APP_PROBERS=json.dumps({"/app-health/web/livez": {"httpGet": {"path": "/", "port": app}}}),
        ISTIO_PROMETHEUS_ANNOTATIONS=json.dumps({"scrape": "true", "port": str(app), "path": "/metrics"}),
        PYTHONPROFILEIMPORTTIME="1")
    agent = start_agent(tmp_path, environment)
    agent.wait_answering(status_port, "/healthz/ready", timeout=60)
    assert http_request("127.0.0.1", status_port, "/app-health/web/livez") == (200, b"ok")
    status, body = http_request("127.0.0.1", status_port, "/stats/prometheus")
    assert status == 200 and b"app_up 1" in body
    agent.signal(signal.SIGTERM)
    agent.wait_exit(60)
    output = agent.output(lines=100000)
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", output, re.M))
    assert {"h11", "istio_agent.status.server", "istio_agent.status.probes.https"} <= imported, output[-3000:]
    assert aiohttp_family(imported) == set()
