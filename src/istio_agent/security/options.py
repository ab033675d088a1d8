"""Everything the identity component needs, in one frozen struct (upstream's `security.Options`).

The options resolver (`agent/options.py`) builds it once from the environment
registry, the effective ProxyConfig and the node identity, validating every
value; the component never reads the environment, and tests construct it
directly with plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# Pod paths, relative to the working directory (as in a pod).
TOKEN_PATH = "./var/run/secrets/tokens/istio-token"
CA_ROOT_DEFAULT_PATH = "./var/run/secrets/istio/root-cert.pem"
MOUNTED_CERTS_DIR = "./etc/certs"
WORKLOAD_CREDENTIALS_DIR = "./var/run/secrets/workload-spiffe-credentials"
WORKLOAD_SDS_DIR = "./var/run/secrets/workload-spiffe-uds"
ISTIO_SDS_SOCKET_FILE = "socket"  # the agent's own server's file name in WORKLOAD_SDS_DIR
# Another SDS server's sockets: credentials by name, and the agent's files-only server when it owns the workload one.
CREDENTIAL_SOCKET = "./var/run/secrets/credential-uds/socket"
FILE_CREDENTIAL_SOCKET = "./var/run/secrets/credential-uds/files-socket"
SYSTEM_ROOTS = "SYSTEM"

CERT_CHAIN_FILE = "cert-chain.pem"
KEY_FILE = "key.pem"
ROOT_CERT_FILE = "root-cert.pem"
# What a mounted workload certificate directory holds (upstream's CheckWorkloadCertificate looks for all three).
CREDENTIAL_FILES = (CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE)

KeyAlgorithm = Literal["RSA", "ECDSA"]
# CREDENTIAL_FETCHER_TYPE values (upstream's).
JWT_FETCHER = "JWT"
GCE_FETCHER = "GoogleComputeEngine"
CREDENTIAL_FETCHERS = (JWT_FETCHER, GCE_FETCHER)


@dataclass(frozen=True)
class CredentialSource:
    """Where the bearer token sent to the CA and istiod comes from (upstream's credential fetcher).

    `JWT`: the token file, read per call. `GoogleComputeEngine`: the VM's identity token from the GCE metadata
    server (`metadata_host`, "" for 169.254.169.254) for `audience` (the trust domain), asked per call and
    written to the token file (`security/credentials.py`).
    """

    fetcher: str = JWT_FETCHER
    metadata_host: str = ""
    audience: str = "cluster.local"


@dataclass(frozen=True)
class SecurityOptions:
    """Options of the CA client, secret cache and SDS server (upstream's `security.Options`)."""

    workdir: Path = field(default_factory=Path.cwd)
    trust_domain: str = "cluster.local"
    namespace: str = "default"
    service_account: str = "default"
    cluster_id: str = "Kubernetes"
    # CA connection.
    ca_address: str = "istiod.istio-system.svc:15012"
    ca_root_ca: str = ""  # the CA's root as upstream's FindRootCAForCA chose it: a file, SYSTEM, "" for the default
    istiod_san: str = ""
    prov_cert: str = ""
    ca_headers: tuple[tuple[str, str], ...] = ()
    cert_signer: str = ""
    ca_call_timeout: float = 10.0
    credentials: CredentialSource = field(default_factory=CredentialSource)  # CREDENTIAL_FETCHER_TYPE
    keepalive_interval: float = 30.0  # GRPC_KEEPALIVE_INTERVAL
    keepalive_timeout: float = 10.0  # GRPC_KEEPALIVE_TIMEOUT
    # None applies upstream's rule (plaintext iff the address ends in :15010); tests and
    # local setups on other ports can force it.
    ca_plaintext: bool | None = None
    # Workload certificates.
    secret_ttl: float = 24 * 3600.0
    grace_period_ratio: float = 0.5
    grace_period_ratio_jitter: float = 0.01
    key_algorithm: KeyAlgorithm = "RSA"
    rsa_key_size: int = 2048
    ecc_curve: str = "P256"
    pkcs8_keys: bool = False  # PKCS8_KEY: else PKCS#1 (RSA) / SEC1 (EC) keys, as upstream writes them
    output_certs: str = ""
    output_file_mode: int = 0o600  # 0o644 under Kubernetes (KUBERNETES_SERVICE_HOST), as upstream shares them
    file_mounted_certs: bool = False
    file_debounce: float = 0.1  # FILE_DEBOUNCE_DURATION: a changed certificate file is read this long after
    # SDS server.
    run_sds_server: bool = True
    socket_file: str = "socket"
    # Another SDS server answers on the workload socket: ours serves only file certificates, on
    # FILE_CREDENTIAL_SOCKET, and asks no CA (upstream's ServeOnlyFiles).
    serve_only_files: bool = False
    # Retry pacing of the cache (pre-warm and rotation) and file polling.
    retry_initial: float = 0.1
    retry_max: float = 10.0
    file_poll_interval: float = 0.5

    # --- derived paths -------------------------------------------------------------------------------
    def path(self, pod_path: str) -> Path:
        """A pod path (`./etc/...`) or absolute path, resolved against the working directory."""
        candidate = Path(pod_path)
        return candidate if candidate.is_absolute() else self.workdir / candidate

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @property
    def token_path(self) -> Path:
        return self.path(TOKEN_PATH)

    @property
    def sds_socket_path(self) -> Path:
        return self.path(WORKLOAD_SDS_DIR) / self.socket_file

    @property
    def sds_listen_path(self) -> Path:
        """Where the agent's own SDS server listens."""
        return self.path(FILE_CREDENTIAL_SOCKET) if self.serve_only_files else self.sds_socket_path

    @property
    def output_dir(self) -> Path | None:
        return self.path(self.output_certs) if self.output_certs else None

    @property
    def plaintext_ca(self) -> bool:
        """Upstream speaks plaintext to istiod's insecure port 15010 and TLS everywhere else."""
        if self.ca_plaintext is not None:
            return self.ca_plaintext
        return self.ca_address.endswith(":15010")
