"""Real peers for istio-cni's tests: a pod API over HTTPS with bearer tokens, and the node agent's log socket.

`PodApi` serves `GET /api/v1/namespaces/{ns}/pods/{name}` from a dict the
test fills, answering as a kube-apiserver does (a `Status` object for 401
and 404), over TLS with a CA it made; `write_kubeconfig` writes the
kubeconfig install-cni would write for it. `LogSocket` is an HTTP server on
a Unix socket recording the bodies POSTed to `/log`. Both run on threads
in the test process and record what they were asked, so a test can assert
on the requests the plugin made.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import socketserver
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "iacni-test-token"


def make_tls(folder: Path) -> tuple[Path, Path, bytes]:
    """A CA and a serving certificate for 127.0.0.1 / localhost: (cert file, key file, CA PEM)."""
    from istio_agent.pki.certs import issue_server_cert, new_root_ca
    from istio_agent.pki.keys import generate_key, key_to_pem

    now = time.time()
    ca = new_root_ca(generate_key("ECDSA"), "iacni-test", now, 3600)
    key = generate_key("ECDSA")
    cert = issue_server_cert(ca, key, ["localhost"], ["127.0.0.1"], now, 3600)
    from cryptography.hazmat.primitives import serialization

    cert_file, key_file = folder / "api.crt", folder / "api.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key_to_pem(key))
    return cert_file, key_file, ca.cert_pem


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


class PodApi:
    """A minimal kube-apiserver for pod GETs (HTTPS, bearer token)."""

    def __init__(self, folder: Path) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Authorization header)
        cert_file, key_file, self.ca_pem = make_tls(folder)
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                api.requests.append((self.path, self.headers.get("Authorization", "")))
                parts = self.path.split("?")[0].strip("/").split("/")
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, status_body(401, "Unauthorized", "Unauthorized"))
                    return
                if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
                    pod = api.pods.get((parts[3], parts[5]))
                    if pod is None:
                        self._send(404, status_body(404, "NotFound", f'pods "{parts[5]}" not found'))
                    else:
                        self._send(200, json.dumps(pod).encode())
                    return
                self._send(404, status_body(404, "NotFound", "the server could not find the requested resource"))

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert_file), str(key_file))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def add_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = pod

    def pod_requests(self) -> list[str]:
        return [path for path, _ in self.requests if "/pods/" in path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_kubeconfig(run_dir: Path, server: str, ca_pem: bytes | None, token: str = TOKEN) -> Path:
    """The kubeconfig as install-cni writes it (YAML, sigs.k8s.io/yaml's layout)."""
    cluster = (f"    certificate-authority-data: {base64.b64encode(ca_pem).decode()}\n" if ca_pem is not None
               else "    insecure-skip-tls-verify: true\n")
    text = ("apiVersion: v1\nclusters:\n- cluster:\n" + cluster + f"    server: {server}\n  name: local\n"
            "contexts:\n- context:\n    cluster: local\n    user: istio-cni\n  name: istio-cni-context\n"
            "current-context: istio-cni-context\nkind: Config\nusers:\n- name: istio-cni\n  user:\n"
            f"    token: {token}\n")
    path = run_dir / "istio-cni-kubeconfig"
    path.write_text(text)
    return path


class LogSocket:
    """The node agent's log socket: records every JSON body POSTed to /log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bodies: list[Any] = []
        sock_server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def address_string(self) -> str:
                return "unix"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if self.path == "/log":
                    sock_server.bodies.append(json.loads(body))
                self.send_response(200 if self.path == "/log" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        if path.exists():
            path.unlink()
        self.server = Server(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for body in self.bodies for line in body]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def closed_port() -> int:
    """A loopback port nothing listens on (bound then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DripApi:
    """A slow (or hostile) kube-apiserver: it answers any request with its status line and headers at once, then
    one byte of a long body every `interval` seconds, for as long as the client stays. Each read comes well
    within any per-read timeout, so only a deadline on the whole request ends the wait.

    HTTPS with a CA of its own (`ca_pem`, `url`), as the kubeconfig install-cni writes expects; `open_now` is
    how many clients it is dripping to at this moment, `served` how many it has taken in all.
    """

    def __init__(self, folder: Path, interval: float = 0.5) -> None:
        cert_file, key_file, self.ca_pem = make_tls(folder)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert_file), str(key_file))
        self.interval = interval
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self.listener.getsockname()[1])
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.open_now = 0
        self.served = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, raw: socket.socket) -> None:
        with self.lock:
            self.open_now += 1
            self.served += 1
        conn = raw
        try:
            raw.settimeout(10)
            conn = self.context.wrap_socket(raw, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
            while not self.stopped.wait(self.interval):
                conn.sendall(b" ")
        except OSError:
            return
        finally:
            with self.lock:
                self.open_now -= 1
            conn.close()

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
