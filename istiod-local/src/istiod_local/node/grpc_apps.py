"""Small gRPC apps for pods of the local node: a greeter, its clients, a TLS probe and a load generator.

Proxyless pods run them with grpcio's own xDS support, reading
`GRPC_XDS_BOOTSTRAP` (the agent's bootstrap); sidecar pods run the same apps
in plain mode behind Envoy. There are no generated stubs: the methods take
and return raw bytes, and replies are JSON.

- `serve --port P [--plain]`: the greeter (`/test.Greeter/Hello` answers with
  what the server saw of the caller: peer identities, transport security, the
  serial of the client certificate; `/test.Greeter/Echo` returns the request).
  With xDS: `grpc.server(..., xds=True)` and `xds_server_credentials` (mTLS or
  not is for istiod to decide). It first logs whether the bootstrap and the
  certificates were there when it started.
- `client --control-port C`: a long-running proxyless client, driven over
  HTTP on 127.0.0.1:C (`GET /call?target=xds:///...&fresh=1`), so one process
  makes every call of a test; `fresh=1` dials a new connection.
- `call --target T [--plain]`: one RPC, JSON result on stdout (exit 0 either way).
- `tls-peer --addr IP:PORT --cert-dir D`: a TLS handshake presenting D's
  workload certificate; prints the serial and SANs the server presented.
- `bench --target T [--plain]`: sequential RPC latency (p50, p99), then
  throughput with N calls in flight, as JSON.

`--cert-refresh-interval` (serve, client) is for tests only: it makes the app
read a copy of its bootstrap whose file_watcher `refresh_interval` is shorter
than upstream's 900s, because grpc-core re-reads the certificate files only
at that interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import statistics
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import grpc.experimental
from cryptography import x509

from istiod_local.node.echo_app import send_json

SERVICE = "test.Greeter"
HELLO = f"/{SERVICE}/Hello"
ECHO = f"/{SERVICE}/Echo"


def _override_refresh_interval(interval: str) -> None:
    """Point GRPC_XDS_BOOTSTRAP at a copy with a shorter certificate refresh (tests only, see the docstring)."""
    original = Path(os.environ["GRPC_XDS_BOOTSTRAP"])
    bootstrap = json.loads(original.read_text())
    bootstrap["certificate_providers"]["default"]["config"]["refresh_interval"] = interval
    copy = original.with_name(f"{original.stem}-refresh-{interval}.json")
    copy.write_text(json.dumps(bootstrap, indent=2))
    os.environ["GRPC_XDS_BOOTSTRAP"] = str(copy)


def _startup_report() -> dict[str, Any]:
    path = os.environ.get("GRPC_XDS_BOOTSTRAP", "")
    report: dict[str, Any] = {"bootstrap": path, "bootstrap_present": bool(path) and Path(path).is_file()}
    if report["bootstrap_present"]:
        provider = json.loads(Path(path).read_text()).get("certificate_providers", {}).get("default", {})
        files = [v for k, v in provider.get("config", {}).items() if k.endswith("_file")]
        report["cert_files_present"] = bool(files) and all(Path(f).is_file() for f in files)
    return report


def peer_certificate_serial(pem: str) -> str:
    """The serial of a PEM certificate as lower-case hex (what tests compare)."""
    return format(x509.load_pem_x509_certificate(pem.encode()).serial_number, "x")


def _hello(request: bytes, context: grpc.ServicerContext) -> bytes:
    auth = {key: [v.decode(errors="replace") for v in values] for key, values in context.auth_context().items()}
    pems = auth.pop("x509_pem_cert", [])
    return json.dumps({
        "pod": os.environ.get("POD_NAME", socket.gethostname()),
        "identities": [i.decode() for i in (context.peer_identities() or [])],
        "transport_security_type": auth.get("transport_security_type", []),
        "sans": auth.get("x509_subject_alternative_name", []),
        "peer_serial": peer_certificate_serial(pems[0]) if pems else "",
        "peer": context.peer(),
    }, sort_keys=True).encode()


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def serve(port: int, plain: bool, workers: int) -> None:
    print(json.dumps(_startup_report()), file=sys.stderr, flush=True)
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Hello": grpc.unary_unary_rpc_method_handler(_hello),
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
    })
    executor = futures.ThreadPoolExecutor(workers)
    if plain:
        server = grpc.server(executor, handlers=[handler])
        server.add_insecure_port(f"0.0.0.0:{port}")
    else:
        server = grpc.server(executor, handlers=[handler], xds=True)
        server.add_secure_port(f"0.0.0.0:{port}", grpc.xds_server_credentials(grpc.insecure_server_credentials()))
    server.start()
    print(f"greeter serving on 0.0.0.0:{port} ({'plain' if plain else 'xds'})", file=sys.stderr, flush=True)
    server.wait_for_termination()


def _credentials(plain: bool) -> grpc.ChannelCredentials | None:
    return None if plain else grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())


def _channel(target: str, plain: bool, fresh: bool) -> grpc.Channel:
    # A local subchannel pool: this channel shares no connection with earlier ones, so the call handshakes anew.
    options = [("grpc.use_local_subchannel_pool", 1)] if fresh else []
    credentials = _credentials(plain)
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def call(target: str, plain: bool, timeout: float, channel: grpc.Channel | None = None) -> dict[str, Any]:
    """One Hello; `{"ok": true, "reply": ...}` or `{"ok": false, "code": ..., "details": ...}`."""
    owned = channel is None
    channel = channel or _channel(target, plain, fresh=True)
    try:
        reply = channel.unary_unary(HELLO)(b"hello", timeout=timeout, wait_for_ready=not plain)
        return {"ok": True, "reply": json.loads(reply)}
    except grpc.RpcError as exc:
        return {"ok": False, "code": exc.code().name, "details": exc.details()}
    finally:
        if owned:
            channel.close()


class _Client:
    """The long-running client: one process, a channel per target kept across calls unless `fresh`."""

    def __init__(self) -> None:
        self.channels: dict[str, grpc.Channel] = {}
        self.lock = threading.Lock()

    def handle(self, query: dict[str, str]) -> dict[str, Any]:
        target = query["target"]
        timeout = float(query.get("timeout", "10"))
        if query.get("fresh") == "1":
            return call(target, False, timeout)
        with self.lock:
            channel = self.channels.get(target) or self.channels.setdefault(target, _channel(target, False, False))
        return call(target, False, timeout, channel)


def run_client(control_port: int) -> None:
    print(json.dumps(_startup_report()), file=sys.stderr, flush=True)
    client = _Client()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            parsed = urllib.parse.urlparse(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query))
            if parsed.path != "/call" or "target" not in query:
                self.send_error(404)
                return
            send_json(self, client.handle(query))

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", control_port), Handler)
    print(f"client control on 127.0.0.1:{control_port}", file=sys.stderr, flush=True)
    server.serve_forever()


def tls_peer(addr: str, cert_dir: Path, timeout: float) -> dict[str, Any]:
    """Handshake as a mesh client would (our workload certificate, the mesh root) and report the server's leaf."""
    host, _, port = addr.rpartition(":")
    context = ssl.create_default_context(cafile=str(cert_dir / "root-cert.pem"))
    context.check_hostname = False  # SPIFFE ids, not host names
    context.load_cert_chain(str(cert_dir / "cert-chain.pem"), str(cert_dir / "key.pem"))
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw, \
                context.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {"serial": format(cert.serial_number, "x"),
            "sans": [str(u) for u in sans.get_values_for_type(x509.UniformResourceIdentifier)]}


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def _bench(target: str, plain: bool, seconds: float, concurrency: int, payload: bytes) -> dict[str, Any]:
    credentials = _credentials(plain)
    channel = (grpc.aio.insecure_channel(target) if credentials is None
               else grpc.aio.secure_channel(target, credentials))
    async with channel:
        echo: Callable[..., Any] = channel.unary_unary(ECHO)
        await echo(payload, timeout=30, wait_for_ready=True)  # resolve, connect, handshake
        for _ in range(200):  # warm-up
            await echo(payload, timeout=10)
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await echo(payload, timeout=10)
            latencies.append(time.perf_counter() - start)
        count = 0
        errors = 0

        async def worker(stop: float) -> None:
            nonlocal count, errors
            while time.perf_counter() < stop:
                try:
                    await echo(payload, timeout=10)
                    count += 1
                except grpc.aio.AioRpcError:
                    errors += 1

        begin = time.perf_counter()
        stop = begin + seconds
        await asyncio.gather(*(worker(stop) for _ in range(concurrency)))
        elapsed = time.perf_counter() - begin
    latencies.sort()
    return {"p50_ms": _percentile(latencies, 0.50) * 1e3, "p99_ms": _percentile(latencies, 0.99) * 1e3,
            "mean_ms": statistics.fmean(latencies) * 1e3, "sequential_rpcs": len(latencies),
            "rps": count / elapsed, "concurrent_rpcs": count, "concurrency": concurrency, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="the greeter server")
    p_serve.add_argument("--port", type=int, default=50051)
    p_serve.add_argument("--plain", action="store_true", help="no xDS: a plain insecure server (behind a sidecar)")
    p_serve.add_argument("--workers", type=int, default=8)
    p_serve.add_argument("--cert-refresh-interval", default="", help="tests only: file_watcher refresh override")
    p_client = sub.add_parser("client", help="the long-running proxyless client")
    p_client.add_argument("--control-port", type=int, default=8081)
    p_client.add_argument("--cert-refresh-interval", default="", help="tests only: file_watcher refresh override")
    p_call = sub.add_parser("call", help="one RPC")
    p_call.add_argument("--target", required=True)
    p_call.add_argument("--plain", action="store_true")
    p_call.add_argument("--timeout", type=float, default=5.0)
    p_tls = sub.add_parser("tls-peer", help="the certificate a server presents")
    p_tls.add_argument("--addr", required=True)
    p_tls.add_argument("--cert-dir", type=Path, required=True)
    p_tls.add_argument("--timeout", type=float, default=5.0)
    p_bench = sub.add_parser("bench", help="latency and throughput")
    p_bench.add_argument("--target", required=True)
    p_bench.add_argument("--plain", action="store_true")
    p_bench.add_argument("--seconds", type=float, default=5.0)
    p_bench.add_argument("--concurrency", type=int, default=16)
    p_bench.add_argument("--payload", type=int, default=64)
    args = parser.parse_args(argv)
    if getattr(args, "cert_refresh_interval", ""):
        _override_refresh_interval(args.cert_refresh_interval)
    if args.command == "serve":
        serve(args.port, args.plain, args.workers)
    elif args.command == "client":
        run_client(args.control_port)
    elif args.command == "call":
        print(json.dumps(call(args.target, args.plain, args.timeout), sort_keys=True))
    elif args.command == "tls-peer":
        print(json.dumps(tls_peer(args.addr, args.cert_dir, args.timeout), sort_keys=True))
    else:
        result = asyncio.run(_bench(args.target, args.plain, args.seconds, args.concurrency, b"x" * args.payload))
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
