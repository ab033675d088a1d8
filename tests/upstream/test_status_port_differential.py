"""The status port (:15020, and Envoy's :15021 in front of it) against upstream's Go agent's, on generated
requests.

One pair of agents for the module (`upstream_agent_pair`): upstream's `pilot-agent` and ours as sidecars on one
local node with the same ISTIO_KUBE_APP_PROBERS (Kubernetes probes rewritten by the injector: httpGet with paths
with and without their leading slash, a port, headers, HTTP and HTTPS; tcpSocket to a listening and a closed
port; gRPC health with and without a service name; timeouts). The app behind the probes is one small server per
pod, in this process (sockets made in the pod's namespace): its answer for a case is the case's `app` part
(status code, a redirect on the same host or another, a body that is empty, short, HTML, JSON echoing the
request it got, or longer than the 10 KiB a probe relays; a gRPC health status), the same for both pods.

Each case is one request sent to both pods at once, from the node (a kubelet's place, to the pod's address) or
from inside the pod (localhost): a path among the probe paths, unknown and malformed ones, /healthz/ready, the
metrics paths, /debug/ndsz, /quitquitquit and /drain (never POSTed from localhost: that stops the pod; the
module's last test does it once), methods GET HEAD POST PUT DELETE OPTIONS, extra headers (User-Agent, Accept,
Accept-Encoding, Host, a custom one). Compared: the status code; Content-Type; the body
(gunzipped) byte for byte for the app probes (which relay the app's), parsed JSON for /debug/ndsz, and
otherwise its shape (empty or not): the agents' own texts (an error message, their metrics) differ by nature.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st
from support import poll
from upstream_agent_pair import SIDES, AgentPair, NetnsWorkers, Side, agent_pair
from upstream_peers import DIFF_EXAMPLES, Tally, describe, differential

pytestmark = pytest.mark.root

HTTP_PORT, HTTPS_PORT, TCP_PORT, CLOSED_PORT, GRPC_PORT = 8080, 8443, 8081, 8089, 8090
PROBERS: dict[str, dict[str, Any]] = {
    "/app-health/web/readyz": {"httpGet": {"path": "/ready", "port": HTTP_PORT}, "timeoutSeconds": 2},
    "/app-health/web/livez": {"httpGet": {"path": "live?x=1", "port": HTTP_PORT,
                                          "httpHeaders": [{"name": "X-Probe", "value": "live"}]},
                              "timeoutSeconds": 2},
    "/app-health/web/startupz": {"httpGet": {"path": "/start", "port": HTTPS_PORT, "scheme": "HTTPS"},
                                 "timeoutSeconds": 2},
    "/app-lifecycle/web/prestopz": {"httpGet": {"path": "/stop", "port": HTTP_PORT}, "timeoutSeconds": 2},
    "/app-health/tcp/livez": {"tcpSocket": {"port": TCP_PORT}, "timeoutSeconds": 2},
    "/app-health/tcp/readyz": {"tcpSocket": {"port": CLOSED_PORT}, "timeoutSeconds": 2},
    "/app-health/grpc/livez": {"grpc": {"port": GRPC_PORT}, "timeoutSeconds": 2},
    "/app-health/grpc/readyz": {"grpc": {"port": GRPC_PORT, "service": "svc"}, "timeoutSeconds": 2},
}

# --- the app behind the probes ------------------------------------------------------------------------------
BEHAVIOUR: dict[str, Any] = {"status": 200, "body": "short", "redirect": "", "grpc": "SERVING"}
LONG_BODY = b"x" * (12 * 1024)


def app_body(request: BaseHTTPRequestHandler, kind: str) -> tuple[bytes, str | None]:
    if kind == "empty":
        return b"", None
    if kind == "html":
        return b"<html><body>ok</body></html>", None
    if kind == "long":
        return LONG_BODY, "text/plain"
    if kind == "echo":  # what the probe asked the app: method, path, headers but for the connection's own
        skip = {"host", "content-length", "connection"}
        seen = sorted((k.lower(), v) for k, v in request.headers.items() if k.lower() not in skip)
        return json.dumps({"method": request.command, "path": request.path, "headers": seen}).encode(), \
            "application/json"
    return b"ok", "text/plain; charset=utf-8"


class AppHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        behaviour = dict(BEHAVIOUR)
        status = behaviour["status"]
        redirect = behaviour["redirect"].replace("{ip}", self.connection.getsockname()[0])  # the pod's address
        if redirect and "redirected" not in self.path:
            self.send_response(302)
            self.send_header("Location", redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body, content_type = app_body(self, behaviour["body"])
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


class TcpAcceptor:
    """Accepts and closes: what a tcpSocket probe needs."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()


class HealthServicer(health.HealthServicer):
    def Check(self, request: Any, context: Any) -> Any:
        status = BEHAVIOUR["grpc"]
        if status == "UNIMPLEMENTED":
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no health here")
        return health_pb2.HealthCheckResponse(status=getattr(health_pb2.HealthCheckResponse, status))


class PodApp:
    """The app of one pod: HTTP, HTTPS, a TCP acceptor and gRPC health, listening in the pod's namespace."""

    def __init__(self, inside: NetnsWorkers, cert_dir: Path) -> None:
        def listen() -> tuple[ThreadingHTTPServer, ThreadingHTTPServer, socket.socket, grpc.Server]:
            plain = ThreadingHTTPServer(("0.0.0.0", HTTP_PORT), AppHandler)
            tls = ThreadingHTTPServer(("0.0.0.0", HTTPS_PORT), AppHandler)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert_dir / "cert.pem", cert_dir / "key.pem")
            tls.socket = context.wrap_socket(tls.socket, server_side=True)
            tcp = socket.create_server(("0.0.0.0", TCP_PORT))
            server = grpc.server(futures.ThreadPoolExecutor(4))
            health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
            server.add_insecure_port(f"0.0.0.0:{GRPC_PORT}")
            server.start()
            return plain, tls, tcp, server

        self.plain, self.tls, tcp, self.grpc = inside.run(listen)
        self.tcp = TcpAcceptor(tcp)
        for server in (self.plain, self.tls):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.plain, self.tls):
            server.shutdown()
            server.server_close()
        self.tcp.sock.close()
        self.grpc.stop(0)


def write_self_signed(directory: Path) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "app")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=2))
            .sign(key, hashes.SHA256()))
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))


# --- generated requests ---------------------------------------------------------------------------------------
# Paths that are not clean too: Go's ServeMux redirects them (307) to their clean form, as ours does.
PATHS = [*PROBERS] * 3 + [
    "//app-health/web/livez", "/app-health/./web/readyz", "/x/../healthz/ready", "//stats/prometheus?x=1", "/a/..",
    "/app-health/nope/livez", "/app-health/web/bogus", "/app-health/web/readyz/", "/app-health/web/readyz?x=1",
    "/APP-HEALTH/web/readyz", "/app-health/", "/app-lifecycle/web/poststartz",
    "/healthz/ready", "/healthz/ready", "/healthz/ready?full=1", "/healthz/ready/x", "/healthz",
    "/stats/prometheus", "/metrics", "/quitquitquit", "/drain", "/debug/ndsz", "/", "/unknown", "/stats",
]
# Hosts outside Go's Host grammar too (`kube-probe/1.31`): a 400 from both.
HEADERS: st.SearchStrategy[dict[str, str]] = st.one_of(st.just(dict[str, str]()), st.dictionaries(
    st.sampled_from(["User-Agent", "Accept", "Accept-Encoding", "X-Custom"]),
    st.sampled_from(["kube-probe/1.31", "text/plain", "gzip", "*/*", "v", "", "app.local",
                     "application/openmetrics-text; version=1.0.0"]), max_size=3)).flatmap(
    lambda headers: st.sampled_from([None, None, "app.local", "app.local:8080", "10.1.2.3", "kube-probe/1.31"]).map(
        lambda host: {**headers, "Host": host} if host else headers))
APP = st.fixed_dictionaries({
    "status": st.sampled_from([200, 200, 201, 204, 301, 400, 404, 418, 500, 503]),
    "body": st.sampled_from(["short", "empty", "html", "echo", "echo", "long"]),
    "redirect": st.sampled_from(["", "", "", "/ready?redirected=1", "http://{ip}:8080/x?redirected=1",
                                 "http://other.invalid/x"]),
    "grpc": st.sampled_from(["SERVING", "SERVING", "NOT_SERVING", "UNKNOWN", "UNIMPLEMENTED"]),
})


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    path = draw(st.sampled_from(PATHS))
    method = draw(st.sampled_from(["GET"] * 6 + ["HEAD", "POST", "PUT", "DELETE", "OPTIONS"]))
    source = draw(st.sampled_from(["node", "node", "localhost"]))
    if path.startswith(("/quitquitquit", "/drain")) and method == "POST":
        source = "node"  # from localhost that stops (or drains) the pod: the last test does it once
    port = 15021 if path.startswith("/healthz") and draw(st.booleans()) else 15020
    return {"path": path, "method": method, "source": source, "port": port, "headers": draw(HEADERS),
            "app": draw(APP)}


# --- asking and comparing -------------------------------------------------------------------------------------
def send(address: str, port: int, case: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    headers = {"Host": f"{address}:{port}", **case["headers"], "Connection": "close"}
    head = f"{case['method']} {case['path']} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.sendall((head + "Content-Length: 0\r\n\r\n").encode())
            response = http.client.HTTPResponse(sock, method=case["method"])
            response.begin()
            body = response.read()
            return {"status": response.status, "headers": {k.lower(): v for k, v in response.getheaders()},
                    "body": body}
    except (OSError, http.client.HTTPException) as exc:
        return {"error": type(exc).__name__}


def ask(pair: AgentPair, side: Side, case: dict[str, Any]) -> dict[str, Any]:
    if case["source"] == "localhost":
        return side.inside.run(lambda: send("127.0.0.1", case["port"], case))
    return pair.outside.run(lambda: send(side.ip, case["port"], case))


def normal_form(answer: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    if "error" in answer:
        return answer
    headers = answer["headers"]
    body = answer["body"]
    if headers.get("content-encoding") == "gzip" and body:
        body = gzip.decompress(body)
    path = case["path"].partition("?")[0]
    # Content-Encoding is not compared: whether to gzip for a client that accepts it is each server's choice
    # (Go's gzip handler compresses bodies from 1 KiB, a relayed probe's too; ours only the metrics); the
    # bodies are compared decoded.
    form: dict[str, Any] = {"status": answer["status"], "content-type": headers.get("content-type")}
    if answer["status"] == 307:
        form["location"] = headers.get("location")
    if path in PROBERS or path.startswith(("/app-health/", "/app-lifecycle/")):
        form["body"] = body.decode(errors="replace")
        # Upstream's relay has Go sniff a Content-Type from the app's body (DetectContentType); ours sets none.
        # The kubelet reads only the status: not compared (docs/UPSTREAM.md).
        form.pop("content-type")
        if case["app"].get("body") == "echo" and body.startswith(b"{"):
            form["body"] = echoed(json.loads(body), case)
    elif path == "/debug/ndsz" and answer["status"] == 200:
        form["body"] = json.loads(body)
    else:
        form["body"] = "non-empty" if body else "empty"
    return form


CLIENT_DEFAULTS = ("user-agent", "accept", "accept-encoding", "referer")
# Deliberate: ours sends a probe's own httpHeaders; upstream relays only the request's (the kubelet sends them).
PROBE_HEADERS = ("x-probe",)


def echoed(seen: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    """What the app saw, less the headers each probe client adds when the request has none (Go's client:
    `User-Agent: Go-http-client/1.1`, `Accept-Encoding: gzip`, a `Referer` on a followed redirect; ours: its
    own): a kubelet always sends its
    User-Agent and Accept, so only a request without them shows the difference (docs/UPSTREAM.md)."""
    given_headers = {key.lower() for key, value in case["headers"].items() if value}  # Go adds to an empty one
    headers = [(k, v) for k, v in seen["headers"] if (
        (k not in CLIENT_DEFAULTS and k not in PROBE_HEADERS) or k in given_headers)]
    return {**seen, "headers": headers}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentPair]:
    certs = tmp_path_factory.mktemp("app-cert")
    write_self_signed(certs)
    with agent_pair("ia-statusdiff-", agent_env={"ISTIO_KUBE_APP_PROBERS": json.dumps(PROBERS)}) as pair:
        apps = [PodApp(pair.sides[side].inside, certs) for side in SIDES]
        try:
            yield pair
        finally:
            for app in apps:
                app.close()


@pytest.mark.timeout(120 + 3 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_status_port_differential(pair: AgentPair) -> None:
    tally = Tally("status-port")

    @differential
    @given(case=requests())
    def compare(case: dict[str, Any]) -> None:
        BEHAVIOUR.update(case["app"])
        expected, got = (normal_form(answer, case) for answer in pair.both(lambda side: ask(pair, side, case)))
        assert got == expected, (f"case {describe(case)}\nupstream: {describe(expected)}\nours:     {describe(got)}\n"
                                 + "".join(f"{side}'s agent log:\n{pair.logs(side, 12)}\n" for side in SIDES))
        tally.count(f"equal, {case['path'].partition('?')[0]} {expected.get('status', expected.get('error'))}")

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1


def test_quitquitquit_from_localhost_ends_both_agents(pair: AgentPair) -> None:
    """Last (it stops both pods): POST /quitquitquit from inside each pod is answered 200 "OK" and the agent
    exits, in both."""
    case = {"path": "/quitquitquit", "method": "POST", "source": "localhost", "port": 15020, "headers": {},
            "app": {}}
    answers = pair.both(lambda side: ask(pair, side, case))
    forms = [normal_form(answer, case) for answer in answers]
    assert forms[1] == forms[0] and forms[0]["status"] == 200, forms
    for side in SIDES:
        agent = pair.sides[side].pod.agent
        assert agent is not None
        poll(lambda a=agent: not a.running(), f"{side}'s agent to exit", timeout=30)  # type: ignore[misc]
