"""ISTIO_ENABLE_HTTP2_PROBING against a real Envoy as the app, through a real `pilot-agent proxy` and in process.

One Envoy serves three apps with direct responses: `app_h2`, HTTPS that only
speaks HTTP/2 (ALPN `h2` alone, codec HTTP2: an HTTP/1.1 request is a protocol
error); `app_h1`, HTTPS that only speaks HTTP/1.1 (ALPN `http/1.1`, codec
HTTP1); `app_plain`, plain HTTP that would take h2c as readily as HTTP/1.1
(codec AUTO). Envoy's own counters (`http.<app>.downstream_cx_http2_total`,
...) say which protocol each app was spoken to in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures import AgentStarter
from launchers import agent_environment
from needs import need
from support import ENVOY, HTTP_NOT_YET, eventually, free_port, http_request, poll, stop_process

from istio_agent.pki.certs import cert_to_pem, issue_server_cert, new_root_ca
from istio_agent.pki.keys import generate_key, key_to_pem
from istio_agent.status.probes.prober import AppProber
from istio_agent.status.probes.rules import PROBE_USER_AGENT, AppProbe, HttpGetAction, ProbeOptions

LOOPBACK = "127.0.0.1"
BODY = "ready over the wire"


def _routes(port: int) -> list[dict[str, Any]]:
    def answer(path: str, status: int, body: str = "", **extra: Any) -> dict[str, Any]:
        response: dict[str, Any] = {"status": status}
        if body:
            response["body"] = {"inline_string": body}
        return {"match": {"path": path, **extra}, "direct_response": response}

    def exact(name: str, value: str) -> dict[str, Any]:
        return {"name": name, "string_match": {"exact": value}}

    return [
        answer("/ready", 200, BODY),
        answer("/sick", 503, "warming caches"),
        {"match": {"path": "/to-ready"}, "redirect": {"path_redirect": "/ready", "response_code": "FOUND"}},
        # The probe's own headers and the rewritten Host (:authority in HTTP/2) reach the app.
        answer("/headers", 200, "headers as sent", headers=[
            exact("user-agent", PROBE_USER_AGENT), exact("x-probe", "h2"), exact(":authority", f"{LOOPBACK}:{port}")]),
        answer("/headers", 400, "headers not as sent"),
    ]


def _listener(name: str, port: int, certs: Path | None, alpn: list[str], codec: str) -> dict[str, Any]:
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                    ".HttpConnectionManager",
           "stat_prefix": name, "codec_type": codec,
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
           "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": _routes(port)}]}}
    chain: dict[str, Any] = {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                          "typed_config": hcm}]}
    if certs is not None:
        chain["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"alpn_protocols": alpn, "tls_certificates": [{
                "certificate_chain": {"filename": str(certs / "cert.pem")},
                "private_key": {"filename": str(certs / "key.pem")}}]}}}
    return {"name": name, "address": {"socket_address": {"address": LOOPBACK, "port_value": port}},
            "filter_chains": [chain]}


def _certificates(directory: Path) -> Path:
    now = time.time()
    ca = new_root_ca(generate_key("ECDSA"), "probe-h2-test", now, 3600)
    key = generate_key("ECDSA")
    (directory / "cert.pem").write_text(cert_to_pem(issue_server_cert(ca, key, [], [LOOPBACK], now, 3600)))
    (directory / "key.pem").write_bytes(key_to_pem(key))
    return directory


@dataclass
class EnvoyApps:
    process: subprocess.Popen[bytes]
    admin: str
    h2: int
    h1: int
    plain: int

    def stats(self) -> dict[str, int]:
        host, port = self.admin.rsplit(":", 1)
        status, body = http_request(host, int(port), "/stats?filter=^http\\.app_", timeout=5)
        assert status == 200, body
        pairs = (line.split(": ", 1) for line in body.decode().splitlines() if ": " in line)
        return {name: int(value) for name, value in pairs if value.strip().isdigit()}

    def stat(self, app: str, name: str) -> int:
        return self.stats().get(f"http.{app}.{name}", 0)


@pytest.fixture
def envoy_apps(tmp_path: Path) -> Iterator[EnvoyApps]:
    need(ENVOY.exists(), f"needs the Envoy binary at {ENVOY}")
    certs = _certificates(tmp_path)
    h2, h1, plain = free_port(), free_port(), free_port()
    config = {
        "admin": {"address": {"socket_address": {"address": LOOPBACK, "port_value": 0}}},
        "static_resources": {"listeners": [
            _listener("app_h2", h2, certs, ["h2"], "HTTP2"),
            _listener("app_h1", h1, certs, ["http/1.1"], "HTTP1"),
            _listener("app_plain", plain, None, [], "AUTO"),
        ]},
    }
    (tmp_path / "envoy.json").write_text(json.dumps(config))
    admin_file = tmp_path / "admin-address"
    log_path = tmp_path / "envoy.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(ENVOY), "-c", str(tmp_path / "envoy.json"), "--admin-address-path", str(admin_file),
             "--disable-hot-restart", "--concurrency", "1", "-l", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def serving() -> str:
            """Envoy LIVE (its listeners bound); no connection to an app's port, which its counters would show."""
            assert process.poll() is None, f"Envoy exited: {log_path.read_text()[-2000:]}"
            admin = admin_file.read_text().strip() if admin_file.exists() else ""
            if not admin:
                return ""
            host, port = admin.rsplit(":", 1)
            return admin if http_request(host, int(port), "/ready", timeout=2)[0] == 200 else ""

        admin = poll(serving, "Envoy's app listeners", 30, lambda: log_path.read_text()[-2000:],
                     retry_on=HTTP_NOT_YET)
        yield EnvoyApps(process, admin, h2, h1, plain)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a test may have stopped it
        stop_process(process)


# ---- through a real pilot-agent ---------------------------------------------------------------------------


def _probers(apps: EnvoyApps) -> dict[str, Any]:
    def https(port: int, path: str, **extra: Any) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": port, "scheme": "HTTPS", **extra}}

    return {
        "/app-health/h2/livez": https(apps.h2, "/ready"),
        "/app-health/h2/readyz": https(apps.h2, "/sick"),
        "/app-health/h2/startupz": https(apps.h2, "/to-ready"),
        "/app-health/h2headers/livez": https(apps.h2, "/headers", httpHeaders=[{"name": "X-Probe", "value": "h2"}]),
        "/app-health/h1/livez": https(apps.h1, "/ready"),
        "/app-health/plain/livez": {"httpGet": {"path": "/ready", "port": apps.plain}},
    }


def _start(tmp_path: Path, start_agent: AgentStarter, apps: EnvoyApps, **variables: str) -> int:
    status_port = free_port()
    environment = agent_environment(
        proxy_config={"statusPort": status_port, "discoveryAddress": "127.0.0.1:1"}, DISABLE_ENVOY="true",
        ISTIO_KUBE_APP_PROBERS=json.dumps(_probers(apps)))
    environment.update(variables)
    start_agent(tmp_path, environment).wait_answering(status_port, "/app-health/none/livez")
    return status_port


def test_https_probes_speak_http2_to_an_app_that_selects_h2(
        tmp_path: Path, start_agent: AgentStarter, envoy_apps: EnvoyApps) -> None:
    """The default (ISTIO_ENABLE_HTTP2_PROBING unset, true): h2 where the app selects it, HTTP/1.1 elsewhere."""
    port = _start(tmp_path, start_agent, envoy_apps)
    assert http_request(LOOPBACK, port, "/app-health/h2/livez") == (200, BODY.encode())
    assert http_request(LOOPBACK, port, "/app-health/h2/readyz") == (503, b"warming caches")
    assert http_request(LOOPBACK, port, "/app-health/h2/startupz") == (200, BODY.encode())  # 302 followed
    assert http_request(LOOPBACK, port, "/app-health/h2headers/livez") == (200, b"headers as sent")
    assert envoy_apps.stat("app_h2", "downstream_rq_http2_total") == 5  # the redirect's two requests included
    assert envoy_apps.stat("app_h2", "downstream_cx_total") == 5  # no keep-alive: one connection each
    assert envoy_apps.stat("app_h2", "downstream_cx_protocol_error") == 0

    # An HTTPS app that selects http/1.1 is probed over HTTP/1.1; plain HTTP is never h2c.
    assert http_request(LOOPBACK, port, "/app-health/h1/livez") == (200, BODY.encode())
    assert http_request(LOOPBACK, port, "/app-health/plain/livez") == (200, BODY.encode())
    for app in ("app_h1", "app_plain"):
        assert envoy_apps.stat(app, "downstream_rq_http1_total") == 1
        assert envoy_apps.stat(app, "downstream_cx_http2_total") == 0


def test_with_http2_probing_off_https_probes_are_http11_only(
        tmp_path: Path, start_agent: AgentStarter, envoy_apps: EnvoyApps) -> None:
    port = _start(tmp_path, start_agent, envoy_apps, ISTIO_ENABLE_HTTP2_PROBING="false")
    assert http_request(LOOPBACK, port, "/app-health/h2/livez") == (500, b"")  # the h2-only app refuses HTTP/1.1
    assert envoy_apps.stat("app_h2", "downstream_cx_protocol_error") == 1  # HTTP/1.1 bytes where h2 was due
    assert envoy_apps.stat("app_h2", "downstream_rq_total") == 0
    assert http_request(LOOPBACK, port, "/app-health/h1/livez") == (200, BODY.encode())
    assert http_request(LOOPBACK, port, "/app-health/plain/livez") == (200, BODY.encode())
    assert envoy_apps.stat("app_h1", "downstream_rq_http1_total") == 1


# ---- in process: connections kept, pinged and given up ----------------------------------------------------


def _prober(keepalive: bool) -> AppProber:
    return AppProber(ProbeOptions(pod_ip=LOOPBACK, keepalive=keepalive, bind_probe_source=False))


def _probe(port: int, path: str = "/ready") -> AppProbe:
    return AppProbe("/app-health/app/readyz", HttpGetAction(port=port, path=path, scheme="HTTPS"), 2.0)


@pytest.mark.parametrize(("keepalive", "connections"), [(False, 4), (True, 1)])
@pytest.mark.parametrize("app", ["app_h2", "app_h1"])
async def test_https_connections_are_kept_only_with_probe_keepalive(
        envoy_apps: EnvoyApps, app: str, keepalive: bool, connections: int) -> None:
    """ENABLE_PROBE_KEEPALIVE_CONNECTIONS holds with HTTP/2 offered: one connection for every probe when on
    (HTTP/2 and HTTP/1.1 alike, a redirect's second request included), one per request when off."""
    port = envoy_apps.h2 if app == "app_h2" else envoy_apps.h1
    prober = _prober(keepalive)
    try:
        assert (await prober.probe(_probe(port))).status == 200
        assert (await prober.probe(_probe(port, "/to-ready"))).status == 200
        assert (await prober.probe(_probe(port, "/sick"))).status == 503
    finally:
        await prober.close()
    stats = await asyncio.to_thread(envoy_apps.stats)
    assert stats[f"http.{app}.downstream_cx_total"] == connections
    assert stats[f"http.{app}.downstream_rq_total"] == 4


async def test_concurrent_probes_leave_one_kept_http2_connection(envoy_apps: EnvoyApps) -> None:
    from istio_agent.status.probes.https import HttpsProber

    https = HttpsProber(keepalive=True)
    prober = _prober(keepalive=True)
    prober._https_prober = https
    try:
        results = await asyncio.gather(*(prober.probe(_probe(envoy_apps.h2)) for _ in range(4)))
        assert [result.status for result in results] == [200] * 4
        [kept] = https.kept()
        assert (await prober.probe(_probe(envoy_apps.h2, "/sick"))).status == 503
        assert https.kept() == [kept]
    finally:
        await prober.close()
    stats = await asyncio.to_thread(envoy_apps.stats)
    assert stats["http.app_h2.downstream_rq_http2_total"] == 5
    assert stats["http.app_h2.downstream_cx_total"] <= 4  # the fifth probe dialled nothing


async def test_a_kept_http2_connection_is_pinged_and_given_up_when_the_app_stops_answering(
        envoy_apps: EnvoyApps) -> None:
    """Kubernetes' settings with short times: a quiet kept connection is pinged and stays while the app answers;
    when the app stops (SIGSTOP) the unanswered ping closes it, and the next probe dials anew."""
    from istio_agent.status.probes.h2 import H2Connection
    from istio_agent.status.probes.https import HttpsProber

    https = HttpsProber(keepalive=True, read_idle=0.2, ping_timeout=0.5)
    prober = _prober(keepalive=True)
    prober._https_prober = https
    try:
        assert (await prober.probe(_probe(envoy_apps.h2))).status == 200
        [connection] = https.kept()
        assert isinstance(connection, H2Connection)
        started = connection.health.last_frame
        await eventually(lambda: connection.health.last_frame > started + 0.5, "ping acks on the kept connection")
        assert connection.closed is None
        assert (await prober.probe(_probe(envoy_apps.h2))).status == 200
        assert https.kept() == [connection]

        os.kill(envoy_apps.process.pid, signal.SIGSTOP)
        try:
            await eventually(lambda: connection.closed is not None, "the unanswered ping to close the connection")
        finally:
            os.kill(envoy_apps.process.pid, signal.SIGCONT)
        assert connection.closed is not None and "ping" in connection.closed
        assert (await prober.probe(_probe(envoy_apps.h2))).status == 200
        assert https.kept() != [connection]
    finally:
        await prober.close()
    stats = await asyncio.to_thread(envoy_apps.stats)
    assert stats["http.app_h2.downstream_cx_total"] == 2
    assert stats["http.app_h2.downstream_rq_total"] == 3
