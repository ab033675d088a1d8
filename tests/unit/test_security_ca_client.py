"""CA client rules that need no network: retry classification, server name, root choice, metadata."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from istio_agent.security.ca_client import (
    ca_metadata,
    client_key_and_chain,
    is_retryable,
    resolve_ca_root,
    target_name_override,
    tls_server_name,
)
from istio_agent.security.core.secrets import SecretError, system_bundle_path
from istio_agent.security.credentials import read_token
from istio_agent.security.options import SecurityOptions

RETRYABLE = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "CANCELLED"}


@pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda c: c.name)
def test_retry_classification(code: grpc.StatusCode) -> None:
    assert is_retryable(code) is (code.name in RETRYABLE)


def test_no_status_is_not_retryable() -> None:
    assert is_retryable(None) is False


def test_server_name_rules() -> None:
    assert tls_server_name("istiod.istio-system.svc:15012") == "istiod.istio-system.svc"
    assert tls_server_name("localhost:15012") == "istiod.istio-system.svc"
    assert tls_server_name("127.0.0.1:15012") == "127.0.0.1"
    assert tls_server_name("[::1]:15012") == "::1"
    assert tls_server_name("istiod") == "istiod"
    assert tls_server_name("localhost:15012", istiod_san="istiod.example") == "istiod.example"


def test_root_defaults_to_the_mounted_istio_root(tmp_path: Path) -> None:
    root = tmp_path / "var/run/secrets/istio/root-cert.pem"
    options = SecurityOptions(workdir=tmp_path)
    with pytest.raises(SecretError, match="root CA file for CA does not exist"):
        resolve_ca_root(options)
    root.parent.mkdir(parents=True)
    root.write_text("x")
    assert resolve_ca_root(options) == root


def test_the_resolved_ca_root_is_used_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    assert resolve_ca_root(SecurityOptions(workdir=tmp_path, ca_root_ca="ca.pem")) == tmp_path / "ca.pem"
    with pytest.raises(SecretError, match="root CA file for CA does not exist"):
        resolve_ca_root(SecurityOptions(workdir=tmp_path, ca_root_ca="missing.pem"))


def test_system_root(tmp_path: Path) -> None:
    bundle = system_bundle_path()
    assert bundle is not None, "the test machine has an OS CA bundle"
    assert resolve_ca_root(SecurityOptions(workdir=tmp_path, ca_root_ca="SYSTEM")) == bundle


def test_metadata_carries_cluster_id_headers_and_token() -> None:
    options = SecurityOptions(cluster_id="east", ca_headers=(("x-tenant", "blue"),))
    assert ca_metadata(options, "tok") == [
        ("clusterid", "east"), ("x-tenant", "blue"), ("authorization", "Bearer tok"),
    ]
    assert ca_metadata(options, None) == [("clusterid", "east"), ("x-tenant", "blue")]


def test_token_is_read_fresh_and_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "istio-token"
    assert read_token(path) is None
    path.write_text("first\n")
    assert read_token(path) == "first"
    path.write_text("second")
    assert read_token(path) == "second"
    path.write_text("")
    assert read_token(path) is None


def test_client_key_and_chain_only_as_a_pair(tmp_path: Path) -> None:
    assert client_key_and_chain(tmp_path) == (None, None)
    (tmp_path / "key.pem").write_bytes(b"KEY")
    assert client_key_and_chain(tmp_path) == (None, None)  # a key without its chain is not used
    (tmp_path / "cert-chain.pem").write_bytes(b"CHAIN")
    assert client_key_and_chain(tmp_path) == (b"KEY", b"CHAIN")


def test_target_name_override_only_when_the_name_differs_from_the_host() -> None:
    assert target_name_override("istiod.istio-system.svc:15012", "istiod.istio-system.svc") == []
    assert target_name_override("localhost:15012", "istiod.istio-system.svc") == [
        ("grpc.ssl_target_name_override", "istiod.istio-system.svc")]
