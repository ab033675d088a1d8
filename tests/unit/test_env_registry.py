"""The env registry: every upstream agent variable declared, each saying how much of it is honoured, and the
generated reference table in step with it."""

from __future__ import annotations

from support import ROOT

from istio_agent.config import env
from istio_agent.config.envtable import render_markdown
from istio_agent.config.envvar import ACCEPTED, HONOURED, PARTIAL

# The variables upstream's pilot-agent (pilot/cmd/pilot-agent, pkg/istio-agent, pkg/bootstrap, pkg/envoy and the
# features it reads) declares at the pinned commit: facts, listed here to see that none is missing.
UPSTREAM_AGENT_VARIABLES = frozenset([
    "CA_ADDR", "CA_PROVIDER", "CA_ROOT_CA", "CERT_SIGNER_DOMAIN", "CLOUD_PLATFORM", "COMPLIANCE_POLICY",
    "CREDENTIAL_FETCHER_TYPE", "CREDENTIAL_IDENTITY_PROVIDER", "DISABLE_ENVOY", "DNS_FORWARD_PARALLEL",
    "DNS_FORWARD_TIMEOUT", "DNS_PROXY_ADDR", "ECC_CURVE", "ECC_SIGNATURE_ALGORITHM",
    "ENABLE_PROBE_KEEPALIVE_CONNECTIONS", "ENVOY_PROMETHEUS_PORT", "ENVOY_SECURE_MERGED_METRICS_PORT",
    "ENVOY_SECURE_METRICS_PORT", "ENVOY_SKIP_DEPRECATED_LOGS", "ENVOY_STATUS_PORT",
    "ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "FILE_DEBOUNCE_DURATION",
    "FILE_MOUNTED_CERTS", "GCP_METADATA", "GCP_QUOTA_PROJECT", "GCP_ZONE", "GRPC_KEEPALIVE_INTERVAL",
    "GRPC_KEEPALIVE_TIMEOUT", "GRPC_XDS_BOOTSTRAP", "HOST_IP", "HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED",
    "INSTANCE_IP", "ISTIOD_SAN", "ISTIO_BOOTSTRAP", "ISTIO_BOOTSTRAP_OVERRIDE", "ISTIO_CPU_LIMIT",
    "ISTIO_DELTA_XDS", "ISTIO_DUAL_STACK", "ISTIO_ENABLE_HTTP2_PROBING", "ISTIO_ENVOY_ENABLE_CORE_DUMP",
    "ISTIO_KUBE_APP_PROBERS", "ISTIO_META_CERT_SIGNER", "ISTIO_META_CLUSTER_ID", "ISTIO_META_DNS_CAPTURE",
    "ISTIO_META_ENABLE_DNS_SERVER", "ISTIO_META_ENABLE_SELF_DISCOVERY", "ISTIO_MULTIROOT_MESH",
    "ISTIO_PROMETHEUS_ANNOTATIONS", "JWT_POLICY", "METRICS_LOCALHOST_ACCESS_ONLY", "MINIMUM_DRAIN_DURATION",
    "OUTPUT_CERTS", "PEER_METADATA_DISCOVERY", "PILOT_CERT_PROVIDER", "PILOT_AGENT_MERGE_ENVOY_STATS", "PKCS8_KEY",
    "POD_NAME", "POD_NAMESPACE", "PROV_CERT", "PROXY_CONFIG", "PROXY_CONFIG_XDS_AGENT",
    "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", "SECRET_GRACE_PERIOD_RATIO", "SECRET_GRACE_PERIOD_RATIO_JITTER",
    "SECRET_TTL", "SERVICE_ACCOUNT", "TRUST_DOMAIN", "WASM_HTTP_REQUEST_MAX_RETRIES", "WASM_HTTP_REQUEST_TIMEOUT",
    "WASM_INSECURE_REGISTRIES", "WASM_MODULE_EXPIRY", "WASM_PURGE_INTERVAL", "WORKLOAD_IDENTITY_SOCKET_FILE",
    "WORKLOAD_RSA_KEY_SIZE", "XDS_AUTH", "XDS_AUTH_PROVIDER", "XDS_ROOT_CA",
])


def test_every_upstream_agent_variable_is_registered() -> None:
    assert sorted(UPSTREAM_AGENT_VARIABLES - env.REGISTRY.keys()) == []


def test_each_entry_says_how_much_it_is_honoured() -> None:
    for var in env.REGISTRY.values():
        assert var.support in (HONOURED, PARTIAL, ACCEPTED), var.name
        assert var.support == HONOURED or var.note, f"{var.name} is {var.support}: the note must say why"
        assert var.description, var.name


def test_our_own_variables_say_so() -> None:
    ours = sorted(name for name, var in env.REGISTRY.items() if not var.upstream)
    assert ours == ["INSTANCE_IPS", "ISTIO_AGENT_ENVOY_UID", "ISTIO_VERSION", "PROMETHEUS_DISABLE_CREATED_SERIES",
                    "WASM_CACHE_MAX_BYTES"]
    assert all(env.REGISTRY[name].description.startswith("Not upstream.") for name in ours)


def test_the_generated_reference_is_in_sync() -> None:
    on_disk = (ROOT / "docs/ENVIRONMENT.md").read_text()
    assert on_disk == render_markdown(), "run `make docs` and commit docs/ENVIRONMENT.md"
