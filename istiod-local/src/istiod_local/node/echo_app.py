"""A tiny HTTP echo app for pods on the local node, and the client that calls it.

`python -m istiod_local.node.echo_app serve --port 8080` answers every GET with
JSON naming the pod that served it and the request's path and headers
(lower-cased), so a caller can see what the server side of the mesh added,
such as `x-forwarded-client-cert`.

`python -m istiod_local.node.echo_app get URL` prints
`{"status": ..., "body": ...}` (the body parsed as JSON when it is) and
exits 0 on any HTTP answer, 1 when no answer came (refused, reset, timeout),
so a test can tell "the mesh said 503" from "nothing answered".
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from typing import Any


def send_json(handler: http.server.BaseHTTPRequestHandler, payload: Any) -> None:
    """Answer 200 with `payload` as JSON (keys sorted), the way every app of the local node replies."""
    body = json.dumps(payload, sort_keys=True).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        send_json(self, {
            "pod": os.environ.get("POD_NAME", socket.gethostname()),
            "path": self.path,
            "headers": {key.lower(): value for key, value in self.headers.items()},
        })

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.client_address[0]} {format % args}\n")


def serve(host: str, port: int) -> None:
    server = http.server.ThreadingHTTPServer((host, port), EchoHandler)
    print(f"echo app listening on {host}:{port}", file=sys.stderr, flush=True)
    server.serve_forever()


def get(url: str, timeout: float) -> int:
    status: int
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"}))
        return 1
    text = raw.decode("utf-8", "replace")
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    print(json.dumps({"status": status, "body": body}, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="serve the echo app")
    serve_parser.add_argument("--host", default="0.0.0.0")
    serve_parser.add_argument("--port", type=int, default=8080)
    get_parser = sub.add_parser("get", help="GET a URL and print status and body as JSON")
    get_parser.add_argument("url")
    get_parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.host, args.port)
        return 0
    return get(args.url, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
