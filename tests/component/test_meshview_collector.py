"""The view's collector against a real Envoy: per-cluster rates, errors and percentiles from its admin stats.

Envoy (static config, admin on a free loopback port) fronts a small HTTP
backend through a cluster named as istiod names outbound clusters, with
istiod's `<cluster>;` stat name; requests are sent through it, some answered
503. The collector's rounds must turn Envoy's counters and histogram buckets
into the same rates and error counts, keep one admin connection for all its
rounds, and report the agent's status port as unreachable (there is none here)
without losing what Envoy said.
"""

from __future__ import annotations

import http.server
import io
import json
import queue
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from needs import need_file
from support import ENVOY, poll

from istiod_local.meshview import MeshEvent, MeshWatcher, ViewTarget, run_view
from istiod_local.meshview.collector import ENVOY_STATS_QUERY
from istiod_local.meshview.render import render_text

CLUSTER = "outbound|80||echo.default.svc.cluster.local"


class Backend(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 503 if self.path.startswith("/fail") else 200
        body = b"ok\n"
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def envoy_config(backend_port: int) -> str:
    return json.dumps({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "outbound", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                                 "HttpConnectionManager",
                        "stat_prefix": "outbound",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    }}]}],
            }],
            "clusters": [{
                "name": CLUSTER, "alt_stat_name": CLUSTER + ";", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": backend_port}}}}]}]},
            }],
        },
    })


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(admin port, listener port) of a running Envoy in front of the backend."""
    need_file(ENVOY)
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    config = tmp_path / "envoy.json"
    config.write_text(envoy_config(backend.server_address[1]))
    admin_file = tmp_path / "admin"
    log = (tmp_path / "envoy.log").open("w")
    proc = subprocess.Popen([str(ENVOY), "-c", str(config), "--admin-address-path", str(admin_file),
                             "--use-dynamic-base-id", "-l", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        admin = poll(lambda: admin_file.exists() and admin_file.read_text().strip(), "Envoy's admin address", 30,
                     lambda: (tmp_path / "envoy.log").read_text())
        admin_port = int(str(admin).rsplit(":", 1)[1])

        def listener() -> int | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/listeners?format=json", timeout=5) as r:
                statuses = json.load(r).get("listener_statuses", [])
            ports = [s["local_address"]["socket_address"].get("port_value") for s in statuses]
            return ports[0] if ports and ports[0] else None

        yield admin_port, poll(listener, "Envoy's listener", 30)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        backend.shutdown()
        backend.server_close()


def send(port: int, path: str, count: int) -> None:
    for _ in range(count):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            exc.close()


def admin_connections(admin_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats?filter=^http\\.admin\\.downstream_cx_total$",
                                timeout=5) as response:
        return int(response.read().decode().split(":")[1])


def test_rates_errors_and_latency_from_a_real_envoy(envoy: tuple[int, int]) -> None:
    admin_port, listener_port = envoy
    target = ViewTarget("client-1", "default", "127.0.0.1", None, "sidecar", "sleep", admin_port=admin_port,
                        status_port=1)  # no agent here: its status port refuses
    clock = [1000.0]
    watcher = MeshWatcher(lambda: [target], None, clock=lambda: clock[0], window=60.0)
    try:
        send(listener_port, "/", 1)  # the cluster's stats exist from the first request on (usedonly)
        first = watcher.step()
        assert first.service("echo.default") is not None
        send(listener_port, "/", 40)
        send(listener_port, "/fail", 10)

        def counted() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}{ENVOY_STATS_QUERY}", timeout=5) as r:
                text = r.read().decode()
            return f'"cluster.{CLUSTER};.upstream_rq_total","value":51' in text.replace(" ", "")

        poll(counted, "Envoy to count the requests", 20)
        clock[0] += 10.0  # ten seconds pass between the two rounds, as far as the view knows
        view = poll(lambda: (v := watcher.step()).service("echo.default").p99_ms is not None and v,  # type: ignore[union-attr]
                    "the histogram's flush (Envoy merges histograms every 5 s)", 30, interval=0.5)
        echo = view.service("echo.default")
        assert echo is not None and echo.host == "echo.default.svc.cluster.local"
        assert echo.requests == 50 and echo.rps == pytest.approx(5.0) and echo.errors_per_s == pytest.approx(1.0)
        assert echo.p50_ms is not None and echo.p99_ms is not None and 0 <= echo.p50_ms <= echo.p99_ms
        pod = view.pod("client-1")
        assert pod is not None and pod.ready is None and "status port" in pod.error
        assert not pod.identity_confirmed  # no certificates in this Envoy: the expected identity, dimmed
        connections_before = admin_connections(admin_port)
        for _ in range(6):  # a slow round (agent metrics, /certs) among them
            watcher.step()
        # Every round used the one kept-alive admin connection: only the count's own request opened one.
        assert admin_connections(admin_port) - connections_before == 1
        text = render_text(view)
        assert "echo.default" in text and "default/client-1" in text
    finally:
        watcher.close()


@pytest.mark.parametrize("live", [False, True])
def test_run_view_prints_changes_or_draws_tables_until_stopped(envoy: tuple[int, int], live: bool) -> None:
    admin_port, listener_port = envoy
    send(listener_port, "/", 3)
    target = ViewTarget("client-1", "default", "127.0.0.1", None, "sidecar", "sleep", admin_port=admin_port,
                        status_port=1)
    events: queue.Queue[MeshEvent | str] = queue.Queue()
    events.put("mesh.yaml applied: echo replicas 1 -> 2")
    out = io.StringIO()
    stop = threading.Event()
    viewer = threading.Thread(target=run_view, args=(lambda: [target], None, stop, events), daemon=True,
                              kwargs={"out": out, "interval": 0.2, "live": live})
    viewer.start()
    try:
        expected = "default/client-1" if live else "pod default/client-1 added: 127.0.0.1 sidecar"
        poll(lambda: expected in out.getvalue() and "mesh.yaml applied" in out.getvalue(), "the view's output", 20,
             out.getvalue)
    finally:
        stop.set()
        viewer.join(10)
    assert not viewer.is_alive()
    text = out.getvalue()
    if live:
        assert "pods (1; 0 of 1 in the mesh ready)" in text and "echo.default" in text
    else:
        lines = text.splitlines()
        assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in lines), text
        assert sum("mesh.yaml applied" in line for line in lines) == 1  # each change once


def test_a_proxyless_pods_identity_from_its_certificate_file(tmp_path: Path) -> None:
    from istio_agent.pki import certs, keys

    key = keys.generate_key("ECDSA")
    ca = certs.new_root_ca(key, "cluster.local", time.time(), 86400.0)
    identity = "spiffe://cluster.local/ns/default/sa/greeter"
    leaf = certs.sign_workload_csr(ca, certs.load_csr(certs.build_csr(key, [identity])), identity, time.time(), 3600.0)
    chain = tmp_path / "var/lib/istio/data/cert-chain.pem"
    target = ViewTarget("greeter-1", "default", "127.0.0.1", None, "proxyless", "greeter", status_port=1,
                        cert_file=str(chain))
    watcher = MeshWatcher(lambda: [target], None)
    try:
        before = watcher.step().pod("greeter-1")
        assert before is not None and not before.identity_confirmed  # not written yet: no error either
        assert "certificate file" not in before.error
        chain.parent.mkdir(parents=True)
        chain.write_text(certs.cert_to_pem(leaf) + certs.cert_to_pem(ca.cert))
        watcher.collector.slow_every = 1
        pod = watcher.step().pod("greeter-1")
        assert pod is not None and pod.identity_confirmed and pod.identity == identity
        assert pod.cert_expires_in is not None and 3500 < pod.cert_expires_in <= 3600
        chain.write_text("garbage")
        assert "certificate file" in (watcher.step().pod("greeter-1") or pod).error
    finally:
        watcher.close()
