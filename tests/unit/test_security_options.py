"""SecurityOptions as the options resolver builds them from the env registry, ProxyConfig and node identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import HostFacts, security_options
from istio_agent.config.env import Environment
from istio_agent.config.errors import ConfigError
from istio_agent.security.options import SecurityOptions


def build(values: dict[str, str], tmp_path: Path, host: HostFacts | None = None) -> SecurityOptions:
    return security_options(load_agent_config(Environment(values), tmp_path), host)


def test_defaults(tmp_path: Path) -> None:
    opts = build({"POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "sleep"}, tmp_path)
    assert opts.spiffe_id == "spiffe://cluster.local/ns/default/sa/sleep"
    assert opts.ca_address == "istiod.istio-system.svc:15012"
    assert opts.key_algorithm == "RSA" and opts.rsa_key_size == 2048
    assert opts.secret_ttl == 24 * 3600 and opts.grace_period_ratio == 0.5
    assert opts.sds_socket_path == tmp_path / "var/run/secrets/workload-spiffe-uds/socket"
    assert opts.token_path == tmp_path / "var/run/secrets/tokens/istio-token"
    assert opts.output_dir is None
    assert not opts.plaintext_ca


def test_environment_overrides(tmp_path: Path) -> None:
    opts = build(
        {
            "POD_NAMESPACE": "ns", "SERVICE_ACCOUNT": "sa", "TRUST_DOMAIN": "example.org", "CA_ADDR": "localhost:15010",
            "SECRET_TTL": "20s", "ECC_SIGNATURE_ALGORITHM": "ECDSA", "OUTPUT_CERTS": "out",
            "CA_HEADER_X-Tenant": "blue", "ISTIO_META_CLUSTER_ID": "east", "WORKLOAD_IDENTITY_SOCKET_FILE": "sds",
        },
        tmp_path,
        HostFacts(workload_sds_socket_healthy=True),  # another server's socket: it must answer there
    )
    assert opts.spiffe_id == "spiffe://example.org/ns/ns/sa/sa"
    assert opts.plaintext_ca
    assert opts.secret_ttl == 20.0
    assert opts.key_algorithm == "ECDSA"
    assert opts.output_dir == tmp_path / "out"
    assert opts.ca_headers == (("x-tenant", "blue"),)
    assert opts.cluster_id == "east"
    assert opts.sds_socket_path.name == "sds"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SECRET_GRACE_PERIOD_RATIO", "1.5"),
        ("ECC_SIGNATURE_ALGORITHM", "ED25519"),
        ("ECC_CURVE", "P521"),
        ("WORKLOAD_RSA_KEY_SIZE", "1024"),
        ("WORKLOAD_IDENTITY_SOCKET_FILE", "../socket"),
        ("SECRET_TTL", "soon"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=name):
        build({name: value}, tmp_path)


@pytest.mark.parametrize("bits", ["1024", "8193", "65536"])
def test_rsa_key_sizes_outside_2048_to_8192_are_refused_by_name_and_value(bits: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"WORKLOAD_RSA_KEY_SIZE={bits}: must be between 2048 and 8192 bits"):
        build({"WORKLOAD_RSA_KEY_SIZE": bits}, tmp_path)


@pytest.mark.parametrize("bits", [2048, 3072, 8192])
def test_rsa_key_sizes_in_range_are_taken(bits: int, tmp_path: Path) -> None:
    assert build({"WORKLOAD_RSA_KEY_SIZE": str(bits)}, tmp_path).rsa_key_size == bits


def test_plaintext_follows_the_15010_rule_unless_forced(tmp_path: Path) -> None:
    assert SecurityOptions(ca_address="istiod:15010").plaintext_ca
    assert not SecurityOptions(ca_address="istiod:15012").plaintext_ca
    assert SecurityOptions(ca_address="127.0.0.1:4000", ca_plaintext=True).plaintext_ca
    assert not SecurityOptions(ca_address="istiod:15010", ca_plaintext=False).plaintext_ca
