"""The GoogleComputeEngine credential fetcher against a GCE metadata server of ours on loopback (GCE_METADATA_HOST).

Both users of the token go through it: the CA client's calls (tests/node/test_cloud_metadata_netns.py gets a
certificate from istiod-local with it) and the XDS proxy's streams, whose call metadata is checked here; a
server that gives no token fails the call instead of sending none.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from istio_agent.security.credentials import CredentialError, bearer_token
from istio_agent.security.options import GCE_FETCHER, CredentialSource
from istio_agent.xds import upstream
from istio_agent.xds.upstream import UpstreamSettings

TOKEN_PATH = "var/run/secrets/tokens/istio-token"


class Gce(BaseHTTPRequestHandler):
    token = "header.payload.signature"
    paths: list[tuple[str, str | None]] = []

    def log_message(self, *args: object) -> None:
        return

    def do_GET(self) -> None:
        Gce.paths.append((self.path, self.headers.get("Metadata-Flavor")))
        ok = self.path.startswith("/computeMetadata/v1/instance/service-accounts/default/identity?") and \
            self.headers.get("Metadata-Flavor") == "Google" and Gce.token
        body = (Gce.token + "\n" if ok else "no").encode()
        self.send_response(200 if ok else 404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def gce() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Gce)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Gce.paths = []
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_identity_token_is_fetched_written_and_sent(gce: str, tmp_path: Path) -> None:
    source = CredentialSource(GCE_FETCHER, gce, "example.org")
    assert await bearer_token(source, tmp_path / TOKEN_PATH) == Gce.token
    written = tmp_path / TOKEN_PATH
    assert written.read_text() == Gce.token + "\n" and os.stat(written).st_mode & 0o777 == 0o640
    assert Gce.paths == [("/computeMetadata/v1/instance/service-accounts/default/identity?audience=example.org"
                          "&format=full", "Google")]
    settings = UpstreamSettings("istiod:15012", workdir=tmp_path, credentials=source, cluster_id="c1")
    assert (await upstream.call_metadata(settings))[-1] == ("authorization", f"Bearer {Gce.token}")
    assert len(Gce.paths) == 2, "asked again for every call"


async def test_no_token_from_the_server_fails_the_call(gce: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.setattr(Gce, "token", "")
    source = CredentialSource(GCE_FETCHER, gce, "cluster.local")
    with pytest.raises(CredentialError, match="answered 404"):
        await bearer_token(source, tmp_path / TOKEN_PATH)
    with pytest.raises(upstream.UpstreamError, match="fetch platform credential"):
        await upstream.call_metadata(UpstreamSettings("istiod:15012", workdir=tmp_path, credentials=source))
    unreachable = CredentialSource(GCE_FETCHER, "127.0.0.1:1", "cluster.local")
    with pytest.raises(CredentialError, match="GCE metadata server"):
        await bearer_token(unreachable, tmp_path / TOKEN_PATH)
    assert not (tmp_path / TOKEN_PATH).exists()
