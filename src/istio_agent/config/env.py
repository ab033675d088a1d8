"""The registry of every environment variable the agent reads.

Upstream declares each variable once with its default and a description; so do
we. Components never call `os.environ` directly: they ask an `Environment`
(built from a plain mapping, so tests pass a dict) for a registered `EnvVar`,
and get a parsed, typed value or a `ConfigError` naming the variable and value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError

T = TypeVar("T")

# Exactly the spellings Go's strconv.ParseBool accepts, which is what upstream's env package uses.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool: 1/t/T/TRUE/true/True and 0/f/F/FALSE/false/False, nothing else."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean (expected true or false): {text!r}")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, default (already parsed), parser and meaning."""

    name: str
    default: T
    description: str
    parse: Callable[[str], T]
    type_name: str


REGISTRY: dict[str, EnvVar[Any]] = {}


def _register(var: EnvVar[T]) -> EnvVar[T]:
    if var.name in REGISTRY:
        raise RuntimeError(f"environment variable {var.name} registered twice")
    REGISTRY[var.name] = var
    return var


def string(name: str, default: str, description: str) -> EnvVar[str]:
    return _register(EnvVar(name, default, description, str, "string"))


def boolean(name: str, default: bool, description: str) -> EnvVar[bool]:
    return _register(EnvVar(name, default, description, parse_bool, "bool"))


def integer(name: str, default: int, description: str) -> EnvVar[int]:
    return _register(EnvVar(name, default, description, lambda s: int(s.strip()), "int"))


def floating(name: str, default: float, description: str) -> EnvVar[float]:
    return _register(EnvVar(name, default, description, lambda s: float(s.strip()), "float"))


def duration(name: str, default: float, description: str) -> EnvVar[float]:
    """A Go-style duration, parsed to seconds."""
    return _register(EnvVar(name, default, description, parse_duration, "duration"))


class Environment:
    """Typed, validated access to a snapshot of the process environment."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values: dict[str, str] = dict(os.environ if values is None else values)

    def get(self, var: EnvVar[T]) -> T:
        raw = self._values.get(var.name)
        if raw is None or (raw == "" and var.type_name != "string"):
            return var.default
        try:
            return var.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"environment variable {var.name}={raw!r}: {exc}") from None

    def raw(self, name: str) -> str | None:
        return self._values.get(name)

    def is_set(self, var: EnvVar[Any]) -> bool:
        return var.name in self._values

    def with_prefix(self, prefix: str) -> Iterator[tuple[str, str]]:
        """Every (name without prefix, value) whose name starts with `prefix`, sorted by name."""
        for name in sorted(self._values):
            if name.startswith(prefix):
                yield name[len(prefix):], self._values[name]

    def overlay(self, extra: Mapping[str, str]) -> Environment:
        """A new environment where `extra` (e.g. ProxyConfig proxyMetadata) fills unset names.

        Upstream applies `proxyMetadata` only to variables that the process does not already
        have, so an explicit container env always wins.
        """
        merged = dict(extra)
        merged.update(self._values)
        return Environment(merged)

    def as_dict(self) -> dict[str, str]:
        return dict(self._values)


# --- identity of the pod --------------------------------------------------------------------------
POD_NAME = string("POD_NAME", "", "Name of the pod, part of the node id.")
POD_NAMESPACE = string("POD_NAMESPACE", "", "Namespace of the pod; SPIFFE id and default domain.")
INSTANCE_IP = string("INSTANCE_IP", "", "The pod IP; first IP of the node id.")
INSTANCE_IPS = string("INSTANCE_IPS", "", "Comma-separated pod IPs (dual stack).")
SERVICE_ACCOUNT = string("SERVICE_ACCOUNT", "", "Kubernetes service account; SPIFFE id.")
ISTIO_META_CLUSTER_ID = string("ISTIO_META_CLUSTER_ID", "Kubernetes", "Cluster id sent as ClusterID.")
ISTIO_VERSION = string("ISTIO_VERSION", "", "Istio version reported in node metadata.")
TRUST_DOMAIN = string("TRUST_DOMAIN", "cluster.local", "SPIFFE trust domain of workload ids.")

# --- configuration layers --------------------------------------------------------------------------
PROXY_CONFIG = string("PROXY_CONFIG", "", "ProxyConfig (YAML or JSON) layered over the mesh defaults.")
PROXY_CONFIG_XDS_AGENT = boolean(
    "PROXY_CONFIG_XDS_AGENT", False, "Receive ProxyConfig (PCDS) over xDS and apply trust bundles."
)

# --- control plane and CA --------------------------------------------------------------------------
CA_ADDR = string("CA_ADDR", "", "Address of the CA; defaults to the ProxyConfig discoveryAddress.")
CA_PROVIDER = string("CA_PROVIDER", "Citadel", "Name of the CA implementation.")
PILOT_CERT_PROVIDER = string("PILOT_CERT_PROVIDER", "istiod", "Who signs istiod's serving certificate.")
XDS_ROOT_CA = string("XDS_ROOT_CA", "", "Root certificate file for istiod's xDS TLS, or SYSTEM.")
CA_ROOT_CA = string("CA_ROOT_CA", "", "Root certificate file for the CA's TLS, or SYSTEM.")
ISTIOD_SAN = string("ISTIOD_SAN", "", "Expected server name of istiod, overriding the address host.")
PROV_CERT = string("PROV_CERT", "", "Directory of a provisioning certificate used as a client cert to the CA.")
XDS_AUTH = boolean("XDS_AUTH", True, "Send the bearer token to istiod.")
JWT_POLICY = string("JWT_POLICY", "third-party-jwt", "Which Kubernetes token the pod has.")
CREDENTIAL_FETCHER_TYPE = string("CREDENTIAL_FETCHER_TYPE", "", "Plugin that fetches the token.")

# --- workload certificates --------------------------------------------------------------------------
SECRET_TTL = duration("SECRET_TTL", 24 * 3600.0, "Requested lifetime of workload certificates.")
SECRET_GRACE_PERIOD_RATIO = floating(
    "SECRET_GRACE_PERIOD_RATIO", 0.5, "Fraction of a certificate's lifetime left when it is rotated."
)
SECRET_GRACE_PERIOD_RATIO_JITTER = floating(
    "SECRET_GRACE_PERIOD_RATIO_JITTER", 0.01, "Random spread added to the grace ratio, so pods do not rotate together."
)
WORKLOAD_RSA_KEY_SIZE = integer("WORKLOAD_RSA_KEY_SIZE", 2048, "RSA key size of workload keys.")
ECC_SIGNATURE_ALGORITHM = string("ECC_SIGNATURE_ALGORITHM", "", "ECDSA for elliptic-curve workload keys.")
ECC_CURVE = string("ECC_CURVE", "P256", "Curve for ECDSA workload keys: P256 or P384.")
OUTPUT_CERTS = string("OUTPUT_CERTS", "", "Directory to which workload certificates are written.")
FILE_MOUNTED_CERTS = boolean("FILE_MOUNTED_CERTS", False, "Use mounted certificates instead of the CA.")
CERT_SIGNER_DOMAIN = string("CERT_SIGNER_DOMAIN", "", "Domain of the Kubernetes CSR signer.")
ISTIO_META_CERT_SIGNER = string("ISTIO_META_CERT_SIGNER", "", "Signer name sent as CertSigner metadata.")
ISTIO_MULTIROOT_MESH = boolean("ISTIO_MULTIROOT_MESH", False, "Trust several roots at once.")
WORKLOAD_IDENTITY_SOCKET_FILE = string(
    "WORKLOAD_IDENTITY_SOCKET_FILE", "socket", "File name of the SDS socket in workload-spiffe-uds."
)

# --- Envoy and lifecycle ------------------------------------------------------------------------------
DISABLE_ENVOY = boolean("DISABLE_ENVOY", False, "Run no Envoy (proxyless gRPC).")
ISTIO_BOOTSTRAP = string("ISTIO_BOOTSTRAP", "", "Path of a custom bootstrap template.")
ISTIO_BOOTSTRAP_OVERRIDE = string("ISTIO_BOOTSTRAP_OVERRIDE", "", "Bootstrap fragment merged over the result.")
ISTIO_DELTA_XDS = boolean("ISTIO_DELTA_XDS", True, "Envoy uses delta xDS.")
MINIMUM_DRAIN_DURATION = duration(
    "MINIMUM_DRAIN_DURATION", 5.0, "With EXIT_ON_ZERO_ACTIVE_CONNECTIONS, drain at least this long."
)
EXIT_ON_ZERO_ACTIVE_CONNECTIONS = boolean(
    "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", False, "Stop Envoy as soon as downstream connections reach zero."
)
ISTIO_META_GENERATOR = string("ISTIO_META_GENERATOR", "", "xDS generator istiod uses (grpc for proxyless).")
ISTIO_AGENT_ENVOY_UID = integer(
    "ISTIO_AGENT_ENVOY_UID", 0,
    "Not upstream. When the agent runs as root, run Envoy as this uid (gid of the same number), e.g. 1337, "
    "so Envoy's own traffic bypasses capture as the istio-proxy user's does; 0 keeps the agent's user.",
)
GRPC_XDS_BOOTSTRAP = string(
    "GRPC_XDS_BOOTSTRAP", "./etc/istio/proxy/grpc-bootstrap.json", "Where the gRPC xDS bootstrap is written."
)

# --- DNS ------------------------------------------------------------------------------------------------
ISTIO_META_DNS_CAPTURE = boolean("ISTIO_META_DNS_CAPTURE", False, "Run the DNS proxy (sidecar).")
ISTIO_META_ENABLE_DNS_SERVER = boolean("ISTIO_META_ENABLE_DNS_SERVER", False, "Run the DNS proxy.")
ISTIO_META_DNS_AUTO_ALLOCATE = boolean("ISTIO_META_DNS_AUTO_ALLOCATE", False, "Ask istiod for auto-allocated VIPs.")
DNS_PROXY_ADDR = string("DNS_PROXY_ADDR", "localhost:15053", "Address of the DNS proxy.")
DNS_FORWARD_PARALLEL = boolean("DNS_FORWARD_PARALLEL", False, "Ask every upstream resolver at once.")

# --- status server ---------------------------------------------------------------------------------------
ISTIO_KUBE_APP_PROBERS = string("ISTIO_KUBE_APP_PROBERS", "", "Rewritten application probes (JSON).")
ISTIO_PROMETHEUS_ANNOTATIONS = string("ISTIO_PROMETHEUS_ANNOTATIONS", "", "Application scrape settings (JSON).")
PILOT_AGENT_MERGE_ENVOY_STATS = boolean(
    "PILOT_AGENT_MERGE_ENVOY_STATS", True, "Include Envoy's stats in the merged metrics."
)

ISTIO_META_PREFIX = "ISTIO_META_"
ISTIO_METAJSON_PREFIX = "ISTIO_METAJSON_"
XDS_HEADER_PREFIX = "XDS_HEADER_"
CA_HEADER_PREFIX = "CA_HEADER_"
