"""istiod-local's state directory: created once, reused after, keys private, bad state named."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from istio_agent.pki.certs import issue_server_cert, load_pem_chain, verify_signed_by
from istio_agent.pki.keys import generate_key
from istiod_local.controlplane.podfiles import ROOT_CERT_PATH, TOKEN_PATH, write_pod_files
from istiod_local.controlplane.state import (
    ROOT_CERT,
    ROOT_KEY,
    SERVING_CERT,
    SERVING_KEY,
    TOKEN_KEY,
    StateError,
    load_or_create_state,
)
from istiod_local.controlplane.tokens import decode_and_verify

NOW = 1_800_000_000.0


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_start_creates_everything_with_private_keys(tmp_path: Path) -> None:
    state = load_or_create_state(tmp_path / "s", "cluster.local", NOW)
    d = tmp_path / "s"
    for name in (ROOT_KEY, SERVING_KEY, TOKEN_KEY):
        assert _mode(d / name) == 0o600, name
    for name in (ROOT_CERT, SERVING_CERT):
        assert _mode(d / name) == 0o644, name
    from cryptography import x509

    assert state.ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert verify_signed_by(state.serving_cert, state.ca.cert)
    san = state.serving_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"istiod.istio-system.svc", "localhost"}
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert state.ca.cert.subject.rfc4514_string() == "O=cluster.local"


def test_restart_reuses_the_same_keys_and_certificates(tmp_path: Path) -> None:
    first = load_or_create_state(tmp_path, "cluster.local", NOW)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    second = load_or_create_state(tmp_path, "cluster.local", NOW + 3600)
    assert second.ca.cert == first.ca.cert
    assert second.serving_cert == first.serving_cert
    assert second.token_key.private_numbers() == first.token_key.private_numbers()  # type: ignore[union-attr]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_serving_cert_near_expiry_is_reissued_from_the_same_root(tmp_path: Path) -> None:
    state = load_or_create_state(tmp_path, "cluster.local", NOW)
    later = load_or_create_state(tmp_path, "cluster.local", NOW + 360 * 86400)
    assert later.ca.cert == state.ca.cert
    assert later.serving_cert != state.serving_cert
    assert verify_signed_by(later.serving_cert, state.ca.cert)


def test_serving_cert_from_a_foreign_ca_is_replaced(tmp_path: Path) -> None:
    from istio_agent.pki.certs import cert_to_pem, new_root_ca

    state = load_or_create_state(tmp_path, "cluster.local", NOW)
    foreign = new_root_ca(generate_key("ECDSA"), "x", NOW, 86400 * 365)
    bad = issue_server_cert(foreign, state.serving_key, ["localhost"], [], NOW, 86400 * 365)
    (tmp_path / SERVING_CERT).write_text(cert_to_pem(bad))
    again = load_or_create_state(tmp_path, "cluster.local", NOW)
    assert verify_signed_by(again.serving_cert, state.ca.cert)


def test_missing_root_key_is_a_clear_error(tmp_path: Path) -> None:
    load_or_create_state(tmp_path, "cluster.local", NOW)
    (tmp_path / ROOT_KEY).unlink()
    with pytest.raises(StateError, match=r"root-key\.pem"):
        load_or_create_state(tmp_path, "cluster.local", NOW)


def test_corrupt_key_is_a_clear_error(tmp_path: Path) -> None:
    load_or_create_state(tmp_path, "cluster.local", NOW)
    (tmp_path / TOKEN_KEY).write_text("garbage")
    with pytest.raises(StateError, match=r"token-signing-key\.pem"):
        load_or_create_state(tmp_path, "cluster.local", NOW)


def test_root_not_matching_its_key_is_a_clear_error(tmp_path: Path) -> None:
    from istio_agent.pki.keys import key_to_pem

    load_or_create_state(tmp_path, "cluster.local", NOW)
    (tmp_path / ROOT_KEY).write_bytes(key_to_pem(generate_key("ECDSA")))
    with pytest.raises(StateError, match="does not belong"):
        load_or_create_state(tmp_path, "cluster.local", NOW)


def test_state_dir_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StateError, match="f"):
        load_or_create_state(tmp_path / "f", "cluster.local", NOW)


def test_pod_files(tmp_path: Path) -> None:
    state = load_or_create_state(tmp_path / "s", "cluster.local", NOW)
    files = write_pod_files(state, tmp_path / "pod", "default", "sleep", "sleep-1", 600, NOW)
    assert files.root_cert == tmp_path / "pod" / ROOT_CERT_PATH
    assert files.token == tmp_path / "pod" / TOKEN_PATH
    assert load_pem_chain(files.root_cert.read_bytes()) == [state.ca.cert]
    claims = decode_and_verify(files.token.read_text(), state.token_key.public_key(), NOW + 1)
    assert (claims.identity.namespace, claims.identity.service_account, claims.identity.pod_name) == (
        "default", "sleep", "sleep-1")
    assert claims.expires_at == NOW + 600
    assert not files.token.read_text().endswith("\n")


def _serving_ips(state: object) -> list[str]:
    from cryptography import x509

    cert = state.serving_cert  # type: ignore[attr-defined]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def test_serving_cert_names_the_address_serve_listens_on_and_keeps_it(tmp_path: Path) -> None:
    """An agent given CA_ADDR as an address (upstream's Go agent ignores ISTIOD_SAN then) verifies that address."""
    first = load_or_create_state(tmp_path, "cluster.local", NOW)
    assert _serving_ips(first) == ["127.0.0.1"]
    served = load_or_create_state(tmp_path, "cluster.local", NOW + 60, ("10.244.0.1",))
    assert _serving_ips(served) == ["127.0.0.1", "10.244.0.1"]
    assert served.serving_cert != first.serving_cert and verify_signed_by(served.serving_cert, first.ca.cert)
    assert served.serving_key.private_numbers() == first.serving_key.private_numbers()  # type: ignore[union-attr]
    # A reader that asks for no address (pod-files) takes the certificate as it is; another address is added.
    assert load_or_create_state(tmp_path, "cluster.local", NOW + 120).serving_cert == served.serving_cert
    other = load_or_create_state(tmp_path, "cluster.local", NOW + 180, ("10.245.0.1",))
    assert set(_serving_ips(other)) == {"127.0.0.1", "10.244.0.1", "10.245.0.1"}


def test_serve_names_a_listening_ip_but_not_a_wildcard_or_a_name() -> None:
    from istiod_local.controlplane.server import serving_ips

    assert serving_ips("10.244.0.1:15012") == ("10.244.0.1",)
    assert serving_ips("[::1]:15012") == ("::1",)
    assert serving_ips("0.0.0.0:15012") == ()
    assert serving_ips("localhost:15012") == ()
    assert serving_ips("") == ()
