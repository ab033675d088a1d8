"""The apps of `istiod-local up`'s pods: `python -m istiod_local.mesh.apps <kind> ...`.

Every kind takes `--pod NAME` (before the kind), the name its answers carry.

- `http-echo --port P [--next URL ...]`: answers every request (any
  method) with JSON naming its pod, the request's method, path and headers
  (`x-forwarded-client-cert` among them) and, having called each `--next`
  URL first, what those answered (a chain: A's request calls B, whose
  request calls C); 502 when a next hop failed, so the failure shows
  upstream. It passes the `end-user` header (and the request id and
  tracing headers) on to its next hops, as bookinfo's apps do, so a route
  on `end-user` applies all along the chain. Two request headers are for
  the check: `x-echo-next: skip` answers without calling the next hops
  (one hop is probed), `x-echo-sleep: S` answers after S seconds (at most
  30: a route's timeout is probed).
- `tcp-echo --port P`: replies `<pod> <line>` to each line it reads.
- `client --call URL ... [--interval S]`: calls each URL every S seconds
  (`http://`, `tcp://host:port`, `grpc://host:port` in plaintext, through
  the pod's sidecar) and prints a JSON summary line every 10 s.
- `grpc-client --call xds:///host:port ... [--control-port C]`: the same
  over proxyless gRPC (grpcio's xDS, `GRPC_XDS_BOOTSTRAP`), with a control
  port on 127.0.0.1 taking `GET /call?target=...` (one call on a fresh
  channel) so the check's probes run in the app's own xDS client.
- `probe PROBES_JSON`: runs `[{"kind", "address"}, ...]` in parallel
  (http, tcp, grpc plaintext, grpc-xds through the control port) and
  prints one JSON list of `{"answered", "status", "pod", "xfcc",
  "identities", "headers", "text", "error"}` (`headers`: an HTTP answer's
  response headers): what `mesh.expect.observe` reads. An
  `http-series` probe (`method`, `headers`, `count`, `timeout`) sends
  `count` requests one after another and answers `{"answered", "results":
  [[status, pod, seconds, text], ...]}` (status 0: no answer; text: the
  start of a body that is not the echo's JSON): what
  `mesh.configcheck.judge` reads.

grpc is imported only by the kinds that speak it: an HTTP pod's app stays small.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import socket
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent import futures
from typing import Any

SUMMARY_EVERY = 10.0
POD = socket.gethostname()  # `--pod NAME` (the planner passes the pod's name) replaces it


# What the echo passes on to its next hops (bookinfo's apps pass the same: the user, the request id, tracing).
PROPAGATED = ("end-user", "x-request-id", "x-b3-traceid", "x-b3-spanid", "x-b3-parentspanid", "x-b3-sampled",
              "traceparent", "tracestate")
SKIP_NEXT = "x-echo-next"
SLEEP = "x-echo-sleep"
MAX_SLEEP = 30.0


def http_get(url: str, timeout: float, method: str = "GET",
             headers: dict[str, str] | None = None) -> dict[str, Any]:
    """GET (or `method`) `url`: `{"answered": True, "status", "body", "headers"}` on any HTTP answer (the
    response's headers, names lowercased), else `{"answered": False, "error"}`."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, raw, got = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, raw, got = exc.code, exc.read(), exc.headers
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return {"answered": False, "error": f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"}
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace")[:200]
    return {"answered": True, "status": status, "body": body,
            "headers": {name.lower(): value for name, value in (got.items() if got is not None else [])}}


def tcp_ping(address: str, timeout: float) -> dict[str, Any]:
    """One line to a tcp-echo server; answered when its `<pod> <line>` reply came back."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as conn:
            conn.sendall(b"ping\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except OSError as exc:
        return {"answered": False, "error": f"{type(exc).__name__}: {exc}"}
    text = reply.decode("utf-8", "replace").strip()
    if not text.endswith(" ping"):
        return {"answered": False, "error": f"connection closed ({text!r})" if text else "connection closed"}
    return {"answered": True, "pod": text.rpartition(" ")[0]}


def grpc_call(target: str, timeout: float, plain: bool) -> dict[str, Any]:
    from istiod_local.node.grpc_apps import call

    return probe_result(call(target, plain, timeout))


def http_series(address: str, method: str, headers: dict[str, str], count: int, timeout: float) -> dict[str, Any]:
    """`count` requests one after another: `[status, pod, seconds, text]` each (status 0: no answer)."""
    results = []
    for _ in range(max(1, min(count, 1000))):
        started = time.monotonic()
        answer = http_get(address, timeout, method, headers)
        elapsed = round(time.monotonic() - started, 3)
        body = answer.get("body")
        pod = body.get("pod", "") if isinstance(body, dict) else ""
        text = "" if isinstance(body, dict) else str(body if answer.get("answered") else answer.get("error"))[:80]
        results.append([answer.get("status", 0) if answer.get("answered") else 0, pod, elapsed, text])
    return {"answered": True, "results": results}


def probe_one(kind: str, address: str, timeout: float, control_port: int = 8081,
              spec: dict[str, Any] | None = None) -> dict[str, Any]:
    if kind == "http":
        answer = http_get(address, timeout)
        body = answer.pop("body", None)
        if isinstance(body, dict):
            answer["pod"] = body.get("pod", "")
            answer["xfcc"] = body.get("headers", {}).get("x-forwarded-client-cert", "")
        elif body is not None:
            answer["text"] = str(body)[:80]
        return answer
    if kind == "http-series":
        spec = spec or {}
        return http_series(address, str(spec.get("method", "GET")), dict(spec.get("headers") or {}),
                           int(spec.get("count", 1)), float(spec.get("timeout", timeout)))
    if kind == "tcp":
        return tcp_ping(address, timeout)
    if kind == "grpc":
        return grpc_call(address, timeout, plain=True)
    if kind == "grpc-xds":
        query = urllib.parse.urlencode({"target": address, "timeout": str(timeout)})
        answer = http_get(f"http://127.0.0.1:{control_port}/call?{query}", timeout + 5)
        if not answer.get("answered") or answer.get("status") != 200:
            return {"answered": False, "error": f"control port: {answer.get('error') or answer.get('status')}"}
        result: dict[str, Any] = answer["body"]
        return result
    return {"answered": False, "error": f"unknown probe kind {kind!r}"}


def call_once(url: str, timeout: float) -> tuple[bool, str]:
    """A background call; (ok, error)."""
    scheme, _, rest = url.partition("://")
    if scheme == "http":
        answer = http_get(url, timeout)
        ok = answer.get("status") == 200
        return ok, "" if ok else str(answer.get("error") or f"HTTP {answer.get('status')}")
    if scheme == "tcp":
        answer = tcp_ping(rest, timeout)
    elif scheme == "grpc":
        answer = grpc_call(rest, timeout, plain=True)
    else:
        return False, f"unknown scheme {scheme!r}"
    return bool(answer["answered"]), str(answer.get("error", ""))


class _Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    next_hops: list[str] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        try:
            delay = min(MAX_SLEEP, max(0.0, float(self.headers.get(SLEEP, "0") or 0)))
        except ValueError:
            delay = 0.0
        if delay:
            time.sleep(delay)
        calls = []
        passed = {k: v for k, v in self.headers.items() if k.lower() in PROPAGATED}
        hops = [] if self.headers.get(SKIP_NEXT, "").lower() == "skip" else self.next_hops
        for url in hops:
            answer = http_get(url, 2.0, headers=passed)
            body = answer.get("body")
            calls.append({"url": url, "status": answer.get("status"), "error": answer.get("error", ""),
                          "pod": body.get("pod", "") if isinstance(body, dict) else "",
                          "calls": body.get("calls", []) if isinstance(body, dict) else []})
        failed = any(c["status"] != 200 for c in calls)
        payload = json.dumps({"pod": POD, "method": self.command, "path": self.path, "calls": calls,
                              "headers": {k.lower(): v for k, v in self.headers.items()}}, sort_keys=True).encode()
        self.send_response(502 if failed else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _answer

    def log_message(self, format: str, *args: Any) -> None:
        return None


def serve_http(port: int, next_hops: list[str]) -> None:
    handler = type("Echo", (_Echo,), {"next_hops": next_hops})
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), handler)
    print(f"http-echo on :{port}, next hops {next_hops}", file=sys.stderr, flush=True)
    server.serve_forever()


class _TcpEcho(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(f"{POD} ".encode() + line.rstrip(b"\r\n") + b"\n")


def serve_tcp(port: int) -> None:
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer(("0.0.0.0", port), _TcpEcho)
    server.daemon_threads = True
    print(f"tcp-echo on :{port}", file=sys.stderr, flush=True)
    server.serve_forever()


def call_loop(urls: list[str], interval: float, call: Callable[[str, float], tuple[bool, str]]) -> None:
    """Call every URL each `interval`; a cumulative JSON summary line on stdout every 10 s."""
    counts = {url: {"ok": 0, "failed": 0, "last_error": ""} for url in urls}
    next_summary = time.monotonic() + SUMMARY_EVERY
    while True:
        started = time.monotonic()
        for url in urls:
            ok, error = call(url, min(2.0, max(interval, 0.5)))
            entry = counts[url]
            entry["ok" if ok else "failed"] += 1  # type: ignore[operator]
            if not ok:
                entry["last_error"] = error[:120]
        if time.monotonic() >= next_summary:
            print(json.dumps({"traffic": counts}, sort_keys=True), flush=True)
            next_summary += SUMMARY_EVERY
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


def grpc_client(urls: list[str], interval: float, control_port: int) -> None:
    import grpc
    import grpc.experimental

    from istiod_local.node.echo_app import send_json
    from istiod_local.node.grpc_apps import call

    credentials = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    channels: dict[str, grpc.Channel] = {}

    def background(url: str, timeout: float) -> tuple[bool, str]:
        channel = channels.get(url) or channels.setdefault(url, grpc.secure_channel(url, credentials))
        result = call(url, False, timeout, channel)
        return bool(result["ok"]), "" if result["ok"] else f"{result['code']}: {result['details']}"

    class Control(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            parsed = urllib.parse.urlparse(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query))
            if parsed.path != "/call" or "target" not in query:
                self.send_error(404)
                return
            send_json(self, probe_result(call(query["target"], False, float(query.get("timeout", "5")))))

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", control_port), Control)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"grpc-client control on 127.0.0.1:{control_port}, calling {urls}", file=sys.stderr, flush=True)
    call_loop(urls, interval, background)


def probe_result(result: dict[str, Any]) -> dict[str, Any]:
    """grpc_apps.call's result as a probe answer."""
    if not result["ok"]:
        return {"answered": False, "error": f"{result['code']}: {result['details']}"}
    reply = result["reply"]
    return {"answered": True, "pod": reply.get("pod", ""), "identities": reply.get("identities", [])}


def run_probes(probes: list[dict[str, Any]], timeout: float, control_port: int) -> list[dict[str, Any]]:
    with futures.ThreadPoolExecutor(max(1, min(16, len(probes)))) as pool:
        jobs = [pool.submit(probe_one, p["kind"], p["address"], timeout, control_port, p) for p in probes]
        out = []
        for job in jobs:
            try:
                out.append(job.result())
            except Exception as exc:  # one broken probe must not hide the others' answers
                out.append({"answered": False, "error": f"{type(exc).__name__}: {exc}"})
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_http = sub.add_parser("http-echo")
    p_http.add_argument("--port", type=int, required=True)
    p_http.add_argument("--next", action="append", default=[])
    p_tcp = sub.add_parser("tcp-echo")
    p_tcp.add_argument("--port", type=int, required=True)
    for name in ("client", "grpc-client"):
        p = sub.add_parser(name)
        p.add_argument("--call", action="append", default=[])
        p.add_argument("--interval", type=float, default=1.0)
        p.add_argument("--control-port", type=int, default=8081)
    p_probe = sub.add_parser("probe")
    p_probe.add_argument("probes", help="a JSON list of {kind, address}")
    p_probe.add_argument("--timeout", type=float, default=3.0)
    p_probe.add_argument("--control-port", type=int, default=8081)
    parser.add_argument("--pod", default="", help="the pod's name, for the answers (default: the host name)")
    args = parser.parse_args(argv)
    global POD
    POD = args.pod or POD
    if args.command == "http-echo":
        serve_http(args.port, args.next)
    elif args.command == "tcp-echo":
        serve_tcp(args.port)
    elif args.command == "client":
        call_loop(args.call, args.interval, call_once)
    elif args.command == "grpc-client":
        grpc_client(args.call, args.interval, args.control_port)
    else:
        print(json.dumps(run_probes(json.loads(args.probes), args.timeout, args.control_port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
