"""Clear errors for the files istiod is reached with: a token file that is not there, a root with no certificate.

Both the CA client and the XDS proxy's upstream read them; the messages name the
path tried, so that the CA's "no authorization header" or a failed TLS handshake
is not the only clue. No connection is made here: the root is refused before any
channel exists (the CA's refusal itself is in tests/component/test_security_ca_token.py).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from istio_agent.security.ca_client import CaClient
from istio_agent.security.core.secrets import SecretError
from istio_agent.security.credentials import read_token
from istio_agent.security.options import SecurityOptions
from istio_agent.xds.upstream import UpstreamError, UpstreamSettings, call_metadata, root_certificates

TOKEN = "var/run/secrets/tokens/istio-token"
ROOT = "var/run/secrets/istio/root-cert.pem"


def test_a_missing_or_empty_token_is_warned_about_by_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / TOKEN
    with caplog.at_level(logging.WARNING):
        assert read_token(path) is None
        path.parent.mkdir(parents=True)
        path.write_text("\n")
        assert read_token(path) is None
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [f"no bearer token sent: cannot read token file {path}: No such file or directory",
                        f"no bearer token sent: token file {path} is empty"]


def test_the_xds_upstream_names_the_token_path_it_tried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        metadata = asyncio.run(call_metadata(UpstreamSettings("localhost:15012", workdir=tmp_path)))
    assert all(key != "authorization" for key, _ in metadata), "no header, as upstream"
    assert str(tmp_path / TOKEN) in caplog.text


async def test_a_ca_root_with_no_certificate_is_named(tmp_path: Path) -> None:
    root = tmp_path / ROOT
    root.parent.mkdir(parents=True)
    root.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    client = CaClient(SecurityOptions(workdir=tmp_path, ca_address="istiod.istio-system.svc:15012"))
    try:
        with pytest.raises(SecretError, match=f"root CA file for CA {root} holds no certificate"):
            await client.sign(b"csr", 600)
    finally:
        await client.close()


def test_an_xds_root_with_no_certificate_is_named(tmp_path: Path) -> None:
    root = tmp_path / "custom.pem"
    root.write_text("empty\n")
    with pytest.raises(UpstreamError, match=f"root CA for XDS {root} holds no certificate"):
        root_certificates(UpstreamSettings("localhost:15012", workdir=tmp_path, root_ca="custom.pem"))
