"""Traffic through istiod-local's config: outbound capture, mTLS between sidecars, x-forwarded-client-cert.

One Envoy plays both sidecars inside its own network namespace, whose
iptables rules stand in for istio-iptables: the app's connection to the
service VIP goes to 15001, the sidecar's connection to the pod address goes
to 15006, and traffic from 127.0.0.6 (the inbound cluster's source) passes.
So a request to `http://<clusterIP>/` really crosses virtualOutbound, the
`0.0.0.0_80` route, the ISTIO_MUTUAL cluster, virtualInbound's mTLS chain
and the inbound cluster to a real HTTP server, which reports the headers it
got. With STRICT, a plaintext connection to the pod is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cp_envoy_harness import EnvoyUnderTest, envoy_with_istiod, nothing_rejected
from needs import need_tool
from support import HTTP_NOT_YET, eventually

from istiod_local.controlplane.xds.registry import parse_registry

POD_IP = "127.0.0.2"
VIP = "127.0.0.20"
NODE = f"sidecar~{POD_IP}~echo-1.default~default.svc.cluster.local"
REGISTRY = f"""
services:
- name: echo
  selector: {{app: echo}}
  ports: [{{name: http, port: 80, targetPort: 8080, protocol: HTTP}}]
  clusterIP: {VIP}
workloads:
- {{name: echo-1, serviceAccount: echo, labels: {{app: echo}}, ip: {POD_IP}}}
peerAuthentication: {{default: %s}}
"""
CAPTURE = f"""
ip link set lo up
iptables -t nat -A OUTPUT -p tcp -s 127.0.0.6 -j RETURN
iptables -t nat -A OUTPUT -p tcp -d {VIP} --dport 80 -j REDIRECT --to-ports 15001
iptables -t nat -A OUTPUT -p tcp -d {POD_IP} --dport 8080 -j REDIRECT --to-ports 15006
"""
ECHO_APP = f"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("{POD_IP}", 8080), H).serve_forever()
"""
CLIENT = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except Exception as exc:
    print("ERROR", type(exc).__name__, exc); sys.exit(1)
"""


def _in_netns(envoy: EnvoyUnderTest, *argv: str) -> list[str]:
    return ["nsenter", f"--net=/proc/{envoy.process.pid}/ns/net", *argv]


@pytest.fixture
def tools() -> Iterator[None]:
    for tool in ("iptables", "nsenter", "ip"):
        need_tool(tool)
    yield


def _app(envoy: EnvoyUnderTest, work: Path) -> subprocess.Popen[bytes]:
    with (work / "app.log").open("wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(_in_netns(envoy, sys.executable, "-c", ECHO_APP), stdout=subprocess.DEVNULL,
                                stderr=log)


def _get(envoy: EnvoyUnderTest, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_in_netns(envoy, sys.executable, "-c", CLIENT, url), capture_output=True, text=True,
                          timeout=30)


async def _ready(envoy: EnvoyUnderTest) -> None:
    await eventually(lambda: {"virtualOutbound", "virtualInbound", "0.0.0.0_80"} <= set(envoy.active_listeners())
                     and not envoy.warming_clusters() and envoy.active_clusters(), "Envoy to be configured",
                     retry_on=HTTP_NOT_YET)


async def test_request_to_cluster_ip_crosses_mtls_with_client_identity(tools: None) -> None:
    async with envoy_with_istiod(parse_registry(REGISTRY % "STRICT"), delta=True, node_id=NODE,
                                 netns_prelude=CAPTURE) as envoy:
        app = _app(envoy, envoy.work)
        try:
            await _ready(envoy)
            nothing_rejected(envoy)
            result = await eventually(lambda: (r := _get(envoy, f"http://{VIP}/")).returncode == 0 and r,
                                      "a request through both sidecars", retry_on=HTTP_NOT_YET)
            headers = json.loads(result.stdout)
            xfcc = headers.get("x-forwarded-client-cert", "")
            assert "URI=spiffe://cluster.local/ns/default/sa/echo" in xfcc, headers
            assert "By=spiffe://cluster.local/ns/default/sa/echo" in xfcc, headers
            stats = envoy.stats()
            assert stats.get("cluster.outbound|80||echo.default.svc.cluster.local;.ssl.handshake", 0) >= 1

            # STRICT: the same pod address, reached in plaintext (no client sidecar), is refused.
            plain = _get(envoy, f"http://{POD_IP}:8080/")
            assert plain.returncode != 0 and "ERROR" in plain.stdout
        finally:
            app.kill()
            app.wait()


async def test_permissive_accepts_plaintext_without_client_cert(tools: None) -> None:
    async with envoy_with_istiod(parse_registry(REGISTRY % "PERMISSIVE"), delta=False, node_id=NODE,
                                 netns_prelude=CAPTURE) as envoy:
        app = _app(envoy, envoy.work)
        try:
            await _ready(envoy)
            result = await eventually(lambda: (r := _get(envoy, f"http://{POD_IP}:8080/")).returncode == 0 and r,
                                      "a plaintext request to the pod", retry_on=HTTP_NOT_YET)
            assert "x-forwarded-client-cert" not in json.loads(result.stdout)
            meshed = _get(envoy, f"http://{VIP}/")
            assert meshed.returncode == 0, meshed.stdout
            assert "spiffe://cluster.local/ns/default/sa/echo" in json.loads(meshed.stdout)["x-forwarded-client-cert"]
        finally:
            app.kill()
            app.wait()
