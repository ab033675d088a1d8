"""Everything the identity component needs, in one frozen struct.

Built once from the environment registry, the effective ProxyConfig and the
node identity (as upstream builds `security.Options`), so the component never
reads `os.environ` and tests construct it directly with plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from istio_agent.config import env
from istio_agent.config.errors import ConfigError

if TYPE_CHECKING:
    from istio_agent.config.loader import AgentConfig
    from istio_agent.config.node import NodeIdentity
    from istio_agent.config.proxyconfig import ProxyConfig

# Pod paths, relative to the working directory (as in a pod).
TOKEN_PATH = "./var/run/secrets/tokens/istio-token"
CA_ROOT_DEFAULT_PATH = "./var/run/secrets/istio/root-cert.pem"
MOUNTED_CERTS_DIR = "./etc/certs"
WORKLOAD_CREDENTIALS_DIR = "./var/run/secrets/workload-spiffe-credentials"
WORKLOAD_SDS_DIR = "./var/run/secrets/workload-spiffe-uds"
SYSTEM_ROOTS = "SYSTEM"

CERT_CHAIN_FILE = "cert-chain.pem"
KEY_FILE = "key.pem"
ROOT_CERT_FILE = "root-cert.pem"

KeyAlgorithm = Literal["RSA", "ECDSA"]


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
    ca_root_ca: str = ""
    xds_root_ca: str = ""
    istiod_san: str = ""
    prov_cert: str = ""
    ca_headers: tuple[tuple[str, str], ...] = ()
    cert_signer: str = ""
    ca_call_timeout: float = 10.0
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
    output_certs: str = ""
    file_mounted_certs: bool = False
    # SDS server.
    run_sds_server: bool = True
    socket_file: str = "socket"
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
    def output_dir(self) -> Path | None:
        return self.path(self.output_certs) if self.output_certs else None

    @property
    def plaintext_ca(self) -> bool:
        """Upstream speaks plaintext to istiod's insecure port 15010 and TLS everywhere else."""
        if self.ca_plaintext is not None:
            return self.ca_plaintext
        return self.ca_address.endswith(":15010")

    # --- construction ------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: AgentConfig, *, run_sds_server: bool = True) -> SecurityOptions:
        """Options from the agent's loaded config (environment already overlaid with proxyMetadata)."""
        return cls.from_parts(
            config.environment, config.proxy_config, config.identity, workdir=config.workdir,
            run_sds_server=run_sds_server,
        )

    @classmethod
    def from_parts(
        cls,
        environment: env.Environment,
        proxy_config: ProxyConfig,
        node: NodeIdentity,
        *,
        workdir: Path | None = None,
        run_sds_server: bool = True,
    ) -> SecurityOptions:
        """Options from the env registry, ProxyConfig (discoveryAddress) and the node identity."""
        ratio = environment.get(env.SECRET_GRACE_PERIOD_RATIO)
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"environment variable SECRET_GRACE_PERIOD_RATIO={ratio}: must be between 0 and 1")
        jitter = environment.get(env.SECRET_GRACE_PERIOD_RATIO_JITTER)
        if jitter < 0.0:
            raise ConfigError(f"environment variable SECRET_GRACE_PERIOD_RATIO_JITTER={jitter}: must not be negative")
        ttl = environment.get(env.SECRET_TTL)
        if ttl <= 0:
            raise ConfigError(f"environment variable SECRET_TTL={ttl}s: must be positive")
        algorithm = environment.get(env.ECC_SIGNATURE_ALGORITHM).strip().upper()
        if algorithm not in ("", "ECDSA"):
            raise ConfigError(f"environment variable ECC_SIGNATURE_ALGORITHM={algorithm!r}: only ECDSA is supported")
        curve = environment.get(env.ECC_CURVE).strip().upper() or "P256"
        if curve not in ("P256", "P384"):
            raise ConfigError(f"environment variable ECC_CURVE={curve!r}: expected P256 or P384")
        rsa_bits = environment.get(env.WORKLOAD_RSA_KEY_SIZE)
        if rsa_bits < 2048:
            raise ConfigError(f"environment variable WORKLOAD_RSA_KEY_SIZE={rsa_bits}: at least 2048 bits")
        socket_file = environment.get(env.WORKLOAD_IDENTITY_SOCKET_FILE) or "socket"
        if Path(socket_file).name != socket_file or socket_file in (".", ".."):
            raise ConfigError(
                f"environment variable WORKLOAD_IDENTITY_SOCKET_FILE={socket_file!r}: must be a file name, not a path"
            )
        headers = tuple((name.lower(), value) for name, value in environment.with_prefix(env.CA_HEADER_PREFIX))
        return cls(
            workdir=workdir or Path.cwd(),
            trust_domain=node.trust_domain,
            namespace=node.namespace,
            service_account=node.service_account,
            cluster_id=node.cluster_id,
            ca_address=environment.get(env.CA_ADDR) or proxy_config.discovery_address,
            ca_root_ca=environment.get(env.CA_ROOT_CA),
            xds_root_ca=environment.get(env.XDS_ROOT_CA),
            istiod_san=environment.get(env.ISTIOD_SAN),
            prov_cert=environment.get(env.PROV_CERT),
            ca_headers=headers,
            cert_signer=environment.get(env.ISTIO_META_CERT_SIGNER),
            secret_ttl=ttl,
            grace_period_ratio=ratio,
            grace_period_ratio_jitter=jitter,
            key_algorithm="ECDSA" if algorithm == "ECDSA" else "RSA",
            rsa_key_size=rsa_bits,
            ecc_curve=curve,
            output_certs=environment.get(env.OUTPUT_CERTS),
            file_mounted_certs=environment.get(env.FILE_MOUNTED_CERTS),
            run_sds_server=run_sds_server,
            socket_file=socket_file,
        )
