"""App probes through a real `pilot-agent proxy` process (proxyless, so no Envoy and a free status port).

This checks the wiring: the agent parses ISTIO_KUBE_APP_PROBERS at start and
its status server answers `/app-health/...` by probing real apps (HTTP with a
redirect and a loop, TCP, gRPC health), following their state.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from fixtures import AgentStarter
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from launchers import agent_environment
from support import free_port


class AppState:
    healthy = True
    loops = 0


class Handler(BaseHTTPRequestHandler):
    state = AppState()

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self.send_response(200 if self.state.healthy else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/moved":
            self.send_response(301)
            self.send_header("Location", "/healthz")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/loop":
            self.state.loops += 1
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


@dataclass
class Agent:
    status_port: int
    app: AppState
    tcp: socket.socket
    grpc_health: health.HealthServicer


@pytest.fixture
def agent(tmp_path: Path, start_agent: AgentStarter) -> Iterator[Agent]:
    with contextlib.ExitStack() as apps:
        state = AppState()
        handler = type("BoundHandler", (Handler,), {"state": state})
        http_server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        apps.callback(http_server.server_close)
        threading.Thread(target=http_server.serve_forever, daemon=True).start()
        apps.callback(http_server.shutdown)
        tcp = apps.enter_context(socket.socket())
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
        grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
        grpc_server.start()
        apps.callback(grpc_server.stop, None)
        app_port = http_server.server_address[1]
        probers = {
            "/app-health/web/livez": {"httpGet": {"path": "/moved", "port": app_port}},
            "/app-health/web/startupz": {"httpGet": {"path": "/loop", "port": app_port}},
            "/app-health/db/readyz": {"tcpSocket": {"port": tcp.getsockname()[1]}},
            "/app-health/api/readyz": {"grpc": {"port": grpc_port}},
        }
        status_port = free_port()
        environment = agent_environment(
            proxy_config={"statusPort": status_port, "discoveryAddress": "127.0.0.1:1"}, DISABLE_ENVOY="true",
            ISTIO_KUBE_APP_PROBERS=json.dumps(probers))
        start_agent(tmp_path, environment).wait_answering(status_port, "/app-health/none/livez")
        yield Agent(status_port, state, tcp, servicer)


def test_probes_through_the_agent_follow_the_apps(agent: Agent) -> None:
    port = agent.status_port
    assert get(port, "/app-health/web/livez") == 200  # 301 to the same host, followed
    agent.app.healthy = False
    assert get(port, "/app-health/web/livez") == 503
    agent.app.healthy = True
    assert get(port, "/app-health/web/livez") == 200

    assert get(port, "/app-health/web/startupz") == 500  # a redirect loop
    assert agent.app.loops == 10

    assert get(port, "/app-health/db/readyz") == 200
    agent.tcp.close()
    assert get(port, "/app-health/db/readyz") == 500

    assert get(port, "/app-health/api/readyz") == 200
    agent.grpc_health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert get(port, "/app-health/api/readyz") == 500

    assert get(port, "/app-health/unknown/livez") == 400
