"""Stand-alone peers for the sidecar tests, run as scripts (often inside a network namespace).

`app PORT`: an HTTP/1.1 keep-alive server; `GET /?ms=N` answers 200 after N ms,
`GET /?hold=1` only once the line `release` arrives on stdin. It prints
`READY` once bound.

`loadgen HOST:PORT`: clients that keep requesting through the sidecar, driven
by lines on stdin so the test decides when things happen:

- at start, `--workers` clients loop on fast requests over keep-alive
  connections; `READY` is printed once each has had one answer;
- `slow` opens `--slow` new connections, each sending one request the app
  holds (`/?hold=1`); `SLOW-SENT` is printed once they are all on the wire;
- `term` (sent right after the agent got SIGTERM): each fast client makes
  `--after-term` more requests and stops; then `FAST-DONE` is printed;
- when the held requests are answered too, one JSON line with the counts is
  printed and the process exits.

Only the standard library is used, so the script runs under any interpreter.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

RELEASE = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        delay_ms = int(query.get("ms", ["0"])[0])
        if delay_ms:
            time.sleep(delay_ms / 1000)
        if query.get("hold"):
            RELEASE.wait(60)
        # Envoy's HTTP connection manager adds these; a request that bypassed the sidecar has neither.
        proxied = "x-request-id" in self.headers or "x-forwarded-proto" in self.headers
        body = json.dumps({"proxied": proxied, "xfcc": self.headers.get("x-forwarded-client-cert", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def run_app(port: int) -> None:
    server = ThreadingHTTPServer(("0.0.0.0", port), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "release":
            RELEASE.set()
    server.shutdown()


class LoadStats:
    """Counts shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.ok_after_term = 0
        self.slow_ok = 0
        self.not_proxied = 0
        self.failed = 0
        self.errors: list[str] = []

    def record(self, ok: bool, error: str = "", after_term: bool = False, slow: bool = False,
               proxied: bool = True) -> None:
        with self.lock:
            self.not_proxied += ok and not proxied
            if ok:
                self.ok += 1
                self.ok_after_term += after_term
                self.slow_ok += slow
            else:
                self.failed += 1
                if len(self.errors) < 10:
                    self.errors.append(error)


def _answer(response: http.client.HTTPResponse) -> tuple[str, bool]:
    """('' or what went wrong, whether the app saw the request come through Envoy)."""
    body = response.read()
    if response.status != 200:
        return f"HTTP {response.status}", False
    return "", bool(json.loads(body).get("proxied"))


def _one_request(conn: http.client.HTTPConnection, path: str) -> tuple[str, bool]:
    """Send one GET on a keep-alive connection (reopened when the server closed it)."""
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        answer = _answer(response)
        if response.will_close:
            conn.close()
        return answer
    except (OSError, http.client.HTTPException, ValueError) as exc:
        conn.close()
        return f"{type(exc).__name__}: {exc}", False


def run_loadgen(target: str, workers: int, slow: int, after_term: int) -> None:
    host, _, port = target.rpartition(":")
    stats = LoadStats()
    term = threading.Event()
    answered = threading.Barrier(workers + 1)

    def fast_client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        first = True
        left = after_term
        while True:
            was_term = term.is_set()
            error, proxied = _one_request(conn, "/?ms=20")
            stats.record(not error, error, after_term=was_term, proxied=proxied)
            if first:
                first = False
                answered.wait()
            if was_term:
                left -= 1
                if left <= 0:
                    break
        conn.close()

    def slow_client(sent: threading.Barrier) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("GET", "/?hold=1")
        except OSError as exc:
            stats.record(False, f"slow send: {exc}", slow=True)
            sent.wait()
            return
        sent.wait()
        try:
            error, proxied = _answer(conn.getresponse())
            stats.record(not error, f"slow: {error}", slow=True, proxied=proxied)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            stats.record(False, f"slow: {type(exc).__name__}: {exc}", slow=True)
        finally:
            conn.close()

    threads = [threading.Thread(target=fast_client) for _ in range(workers)]
    slow_threads: list[threading.Thread] = []
    for thread in threads:
        thread.start()
    answered.wait()
    print("READY", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "slow":
            sent = threading.Barrier(slow + 1)
            slow_threads = [threading.Thread(target=slow_client, args=(sent,)) for _ in range(slow)]
            for thread in slow_threads:
                thread.start()
            sent.wait()
            print("SLOW-SENT", flush=True)
        elif command == "term":
            term.set()
            break
    for thread in threads:
        thread.join()
    print("FAST-DONE", flush=True)
    for thread in slow_threads:
        thread.join()
    print(json.dumps({"ok": stats.ok, "ok_after_term": stats.ok_after_term, "slow_ok": stats.slow_ok,
                      "not_proxied": stats.not_proxied,
                      "failed": stats.failed, "errors": stats.errors}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("app")
    app.add_argument("port", type=int)
    load = sub.add_parser("loadgen")
    load.add_argument("target")
    load.add_argument("--workers", type=int, default=4)
    load.add_argument("--slow", type=int, default=2)
    load.add_argument("--after-term", type=int, default=10)
    args = parser.parse_args()
    if args.command == "app":
        run_app(args.port)
    else:
        run_loadgen(args.target, args.workers, args.slow, args.after_term)


if __name__ == "__main__":
    main()
