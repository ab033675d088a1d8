"""A metadata server of the tests' own, answering as GCE's, AWS's (IMDSv2) or Azure's does (or never).

Run as a script inside a network namespace where 169.254.169.254 is a local address:

    python cloud_metadata_server.py --cloud gcp|aws|azure|silent --address :: --log requests.jsonl

(`::`, the default: every address of the namespace, IPv4 ones included, so also AWS's [fd00:ec2::254].)

Every request is appended to the log as one JSON line (method, path, headers), so a test can say what was
asked as well as what was learnt; `serving` on stdout says it listens. What it answers follows the clouds'
documented behaviour that the agent relies on:

- gcp: every answer carries `Metadata-Flavor: Google`; `/computeMetadata/v1/...` needs that header from the
  client (403 without), unknown paths are 404; the identity token is `--token-file`'s content.
- aws: `PUT /latest/api/token` with a TTL header gives a session token; `GET /latest/meta-data/...` needs it
  (401 without: IMDSv2 only); `/` lists `latest`.
- azure: `/metadata/...` needs `Metadata: true` (400 without); `/metadata/instance` without `api-version` is
  400 naming the newest versions, with one it is the instance's JSON.
- silent: accepts connections and never answers.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

GCE_VALUES = {
    "project/project-id": "test-project", "project/numeric-project-id": "123456789",
    "instance/name": "vm-1", "instance/id": "4242", "instance/zone": "projects/123456789/zones/europe-west4-b",
    "instance/attributes/cluster-name": "mesh-cluster", "instance/attributes/cluster-location": "europe-west4",
    "instance/attributes/instance-template": "tmpl", "instance/attributes/created-by": "projects/123456789/x",
}
AWS_TOKEN = "aws-session-token"
AWS_VALUES = {"placement/region": "eu-central-1", "placement/availability-zone": "eu-central-1a",
              "instance-id": "i-0123456789abcdef0",
              "iam/info": json.dumps({"Code": "Success", "InstanceProfileArn": "arn:aws:iam::1:instance-profile/x"})}
AZURE_VERSIONS = {"error": "Bad request. api-version was not specified in the request",
                  "newest-versions": ["2021-12-13", "2021-11-15", "2021-11-01"]}
AZURE_INSTANCE = {"compute": {"name": "vm-azure", "location": "northeurope", "vmId": "0e3b-vm", "zone": "3",
                              "tagsList": [{"name": "team", "value": "mesh"}]}, "network": {}}


class Handler(BaseHTTPRequestHandler):
    cloud = "gcp"
    log_path: Path
    token_file: Path | None = None
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        return

    def _record(self) -> None:
        line = json.dumps({"method": self.command, "path": self.path,
                           "headers": {k.lower(): v for k, v in self.headers.items()}})
        with self.lock, self.log_path.open("a") as log:
            log.write(line + "\n")

    def _answer(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._record()
        getattr(self, f"_{self.cloud}")()

    def do_PUT(self) -> None:
        self._record()
        getattr(self, f"_{self.cloud}")()

    def _gcp(self) -> None:
        flavor = {"Metadata-Flavor": "Google"}
        url = urlsplit(self.path)
        if url.path in ("", "/"):
            self._answer(200, "computeMetadata/\n", flavor)
            return
        if self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, "Missing Metadata-Flavor:Google header.", flavor)
            return
        path = url.path.removeprefix("/computeMetadata/v1/")
        if path == "instance/service-accounts/default/identity" and self.token_file is not None:
            query = parse_qs(url.query)
            if query.get("format") != ["full"] or not query.get("audience"):
                self._answer(400, "audience and format=full expected", flavor)
                return
            self._answer(200, self.token_file.read_text(), flavor)
            return
        value = GCE_VALUES.get(path)
        self._answer(200 if value is not None else 404, value if value is not None else "Not Found", flavor)

    def _aws(self) -> None:
        url = urlsplit(self.path)
        if self.command == "PUT":
            if url.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self._answer(200, AWS_TOKEN)
            else:
                self._answer(400, "")
            return
        if url.path in ("", "/"):
            self._answer(200, "latest\n")
            return
        if self.headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
            self._answer(401, "")
            return
        value = AWS_VALUES.get(url.path.removeprefix("/latest/meta-data/"))
        self._answer(200 if value is not None else 404, value or "")

    def _azure(self) -> None:
        url = urlsplit(self.path)
        if not url.path.startswith("/metadata/"):
            self._answer(404, "")
            return
        if self.headers.get("Metadata", "").lower() != "true":
            self._answer(400, json.dumps({"error": "Bad request. Required metadata header not specified"}))
            return
        if url.path == "/metadata/instance" and "api-version" not in parse_qs(url.query):
            self._answer(400, json.dumps(AZURE_VERSIONS))
            return
        if url.path == "/metadata/instance":
            self._answer(200, json.dumps(AZURE_INSTANCE), {"Content-Type": "application/json"})
            return
        self._answer(404, "")


class DualStackServer(ThreadingHTTPServer):
    """`--address ::`: every local address of both families (AWS's IMDS is also at [fd00:ec2::254])."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def serve_silently(address: str, port: int, log_path: Path) -> None:
    """Accept every connection, record it, answer nothing (a metadata server that hangs)."""
    listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if ":" in address:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind((address, port))
    listener.listen(64)
    print("serving", flush=True)
    held = []
    while True:
        connection, _ = listener.accept()
        held.append(connection)
        with log_path.open("a") as log:
            log.write(json.dumps({"method": "CONNECT", "path": "", "headers": {}}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cloud", choices=("gcp", "aws", "azure", "silent"), required=True)
    parser.add_argument("--address", default="::")
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--token-file", type=Path)
    args = parser.parse_args()
    args.log.touch()
    if args.cloud == "silent":
        serve_silently(args.address, args.port, args.log)
        return
    Handler.cloud, Handler.log_path, Handler.token_file = args.cloud, args.log, args.token_file
    server_class = DualStackServer if ":" in args.address else ThreadingHTTPServer
    server = server_class((args.address, args.port), Handler)
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
