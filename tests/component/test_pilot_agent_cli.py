"""`pilot-agent wait`, `request` and `version` through the installed console script."""

from __future__ import annotations

import http.server
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from launchers import PilotAgent, agent_environment, pilot_agent_cli
from support import free_port, poll


class _Handler(http.server.BaseHTTPRequestHandler):
    ready_after = 3
    calls = 0

    def do_GET(self) -> None:
        type(self).calls += 1
        status = 200 if type(self).calls >= type(self).ready_after else 503
        body = f"{self.command} {self.path}".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = b"posted:" + self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[type[_Handler], int]]:
    handler = type("H", (_Handler,), {"calls": 0})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handler, httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_wait_polls_until_ready(server: tuple[type[_Handler], int]) -> None:
    handler, port = server
    result = pilot_agent_cli("wait", f"--url=http://127.0.0.1:{port}/healthz/ready", "--periodMillis=50",
                             "--timeoutSeconds=20")
    assert result.returncode == 0, result.stderr
    assert "Envoy is ready!" in result.stdout
    assert handler.calls >= 3


def test_wait_times_out_with_last_error(server: tuple[type[_Handler], int]) -> None:
    handler, port = server
    handler.ready_after = 10**9
    result = pilot_agent_cli("wait", "--url", f"http://127.0.0.1:{port}/", "--timeoutSeconds", "1",
                             "--periodMillis", "100")
    assert result.returncode != 0
    assert "503" in result.stderr


def test_request_refuses_other_ports() -> None:
    result = pilot_agent_cli("request", "GET", "stats", "--debug-port", "8080")
    assert result.returncode != 0
    assert "8080" in result.stderr


def test_request_prints_only_the_body() -> None:
    handler = type("H", (_Handler,), {"calls": 0, "ready_after": 0})
    try:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 15004), handler)
    except OSError as exc:
        pytest.fail(f"port 15004 busy: {exc}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        result = pilot_agent_cli("request", "GET", "stats/prometheus", "--debug-port", "15004")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "GET /stats/prometheus"
        result = pilot_agent_cli("request", "POST", "drain_listeners", "payload", "--debug-port=15004")
        assert result.stdout == "posted:payload"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_version_and_unknown_flags() -> None:
    result = pilot_agent_cli("version", "-s", "--some-old-flag=1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("client version: ") and result.stdout.strip().count(".") == 2
    assert pilot_agent_cli("version").stdout.startswith("client version: version.BuildInfo{Version:")
    assert pilot_agent_cli("version", "--short=false").stdout.startswith("client version: version.BuildInfo{")


def test_version_formats_are_upstreams() -> None:
    """Upstream's field names in JSON and YAML, and its error (exit 255) for another format."""
    as_json = json.loads(pilot_agent_cli("version", "-o", "json").stdout)
    assert set(as_json["clientVersion"]) == {"version", "revision", "golang_version", "status", "tag"}
    assert pilot_agent_cli("version", "-o", "yaml").stdout.startswith("clientVersion:\n  golang_version: ")
    refused = pilot_agent_cli("version", "-o", "xml")
    assert refused.returncode == 255 and "--output must be 'yaml' or 'json'" in refused.stderr


def accepted_variables() -> list[str]:
    from istio_agent.config.env import REGISTRY
    from istio_agent.config.settings import ACCEPTED

    return sorted(name for name, var in REGISTRY.items() if var.support == ACCEPTED)


def test_proxy_names_set_variables_that_have_no_effect(tmp_path: Path) -> None:
    """A variable upstream honours but this agent only accepts is named in a warning at start, with the reason.

    Every variable upstream's agent reads does something here now: then ENVIRONMENT.md must say so.
    """
    from support import ROOT

    from istio_agent.config.env import REGISTRY

    accepted = accepted_variables()
    if not accepted:
        assert "and 0 only accepted" in (ROOT / "docs/ENVIRONMENT.md").read_text()
        return
    for name in accepted:
        environment = agent_environment(
            discovery="127.0.0.1:1", DISABLE_ENVOY="true", CLOUD_PLATFORM="none",
            PROXY_CONFIG=json.dumps({"statusPort": free_port(), "discoveryAddress": "127.0.0.1:1"}))
        environment[name] = "a-value-of-its-own"
        agent = PilotAgent(tmp_path, environment).start()

        def warned(name: str = name, agent: PilotAgent = agent) -> bool:
            return f"{name} is set but has no effect" in agent.output(200)

        try:
            poll(warned, "the warning", 30, agent.output)
            assert REGISTRY[name].note in agent.output(200)
            agent.signal(signal.SIGTERM)
            assert agent.wait_exit(20) == 0
        finally:
            agent.kill()


@pytest.mark.parametrize("entry", ["istio_agent.cli.proxy_run", "istio_agent.cli.pilot_agent"])
def test_both_proxy_parsers_turn_grpcs_fork_handlers_off(entry: str) -> None:
    """Envoy's fork could abort in gRPC's fork handlers (seen: -6 in 1 of 20 starts): off on either path, unless
    the operator set the variable."""
    import os
    import subprocess
    import sys

    code = f"import os, {entry}; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))"
    base = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "false", out.stderr
    mine = subprocess.run([sys.executable, "-c", code], env={**base, "GRPC_ENABLE_FORK_SUPPORT": "true"},
                          capture_output=True, text=True, timeout=60)
    assert mine.stdout.strip() == "true", mine.stderr
