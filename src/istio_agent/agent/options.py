"""The one options resolver: environment + flags + mesh config + ProxyConfig -> frozen options per component.

Upstream builds its agent from `NewAgentOptions`, `NewSecurityOptions` and
`envoy.ProxyConfig`; here `resolve_agent_options()` does all of it, once, at
start. Components never read the environment: each gets its own frozen option
object (`SecurityOptions`, `XdsProxyOptions`, `DnsProxyOptions`,
`EnvoyOptions`, `StatusOptions`, `GrpcBootstrapFile`, `HealthCheckOptions`), and every rule that
touches more than one of them is stated here, once:

- the DNS proxy runs when `ISTIO_META_DNS_CAPTURE` or `ISTIO_META_ENABLE_DNS_SERVER`;
- there is an Envoy unless `DISABLE_ENVOY` (and then no SDS server either);
- readiness waits for a NameTable only when both the DNS proxy and Envoy run;
- node metadata is computed once and shared by the Envoy and gRPC bootstraps;
- the cloud platform comes from the environment and the metadata server's answers (`config/platform.py`,
  asked by the loader): PLATFORM_METADATA, and the node's locality when the pod has no locality label, for
  both bootstraps;
- istiod's client certificate is `PROV_CERT`, else the mounted certs with `FILE_MOUNTED_CERTS`;
- the Istio version reported is `ISTIO_VERSION`, else the one this agent is compatible with.

Sans-IO: the inputs (`AgentConfig`, `AgentFlags`, `HostFacts`) are read by
`loader.py`. Only the option modules of the components (and the pure rules
those need) are imported here, each light; the components themselves load only
when the agent starts them. This composition layer sits above the components:
they never import it, they are given their options.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from istio_agent.config import env
from istio_agent.config.cloud_metadata import CloudFacts
from istio_agent.config.errors import ConfigError
from istio_agent.config.gopath import go_join
from istio_agent.config.node import MetadataOptions, NodeIdentity, node_metadata_layers, pilot_sans
from istio_agent.config.platform import Platform, discover, platform_locality
from istio_agent.config.proxyconfig import ProxyConfig
from istio_agent.dns.options import DnsProxyOptions, port53_rules
from istio_agent.envoy.argv import EnvoyLaunch
from istio_agent.envoy.bootstrap.options import BootstrapOptions, locality, locality_label
from istio_agent.envoy.drain import DrainPolicy
from istio_agent.envoy.options import BootstrapSource, EnvoyOptions
from istio_agent.envoy.stats import istio_listener_stats
from istio_agent.grpcxds.bootstrap import GrpcBootstrapFile, GrpcBootstrapOptions, xds_socket_for_bootstrap
from istio_agent.health.options import HealthCheckOptions, parse_readiness_probe
from istio_agent.security.options import (
    CA_ROOT_DEFAULT_PATH,
    CERT_CHAIN_FILE,
    CREDENTIAL_FETCHERS,
    ISTIO_SDS_SOCKET_FILE,
    JWT_FETCHER,
    KEY_FILE,
    ROOT_CERT_FILE,
    WORKLOAD_SDS_DIR,
    CredentialSource,
    SecurityOptions,
)
from istio_agent.status.merged_metrics.merge import MetricsOptions, parse_scrape_annotations
from istio_agent.status.options import StatusOptions
from istio_agent.status.probes.rules import ProbeOptions, parse_app_probers
from istio_agent.version import ISTIO_COMPAT_VERSION
from istio_agent.wasm.core.ssrf import parse_cidrs
from istio_agent.wasm.options import DEFAULT_CACHE_DIR, WasmOptions
from istio_agent.xds.options import XDS_SOCKET_NAME, XdsProxyOptions
from istio_agent.xds.upstream import UpstreamSettings

CERT_PROVIDER_CUSTOM = "custom"
CERT_PROVIDER_NONE = "none"
MOUNTED_ROOT_CERT = "./etc/certs/root-cert.pem"
# proxyMetadata keys naming the client certificate files with FILE_MOUNTED_CERTS (upstream's names)
CLIENT_KEY_METADATA = "ISTIO_META_TLS_CLIENT_KEY"
CLIENT_CHAIN_METADATA = "ISTIO_META_TLS_CLIENT_CERT_CHAIN"
CLIENT_ROOT_METADATA = "ISTIO_META_TLS_CLIENT_ROOT_CERT"
# COMPLIANCE_POLICY values that limit gRPC's TLS 1.2 ciphers to FIPS-approved ones, and those ciphers.
FIPS_POLICIES = ("fips-140-2", "fips-140-3")
FIPS_GRPC_CIPHERS = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                     "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384")
FIRST_CERTIFICATE_HEAD_START = 2.0  # how long start-up waits for the first certificate before loading the rest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentFlags:
    """`pilot-agent proxy` command-line flags, as upstream names them."""

    proxy_type: str = "sidecar"
    domain: str = ""
    mesh_config: str = "./etc/istio/config/mesh"
    service_cluster: str = "istio-proxy"
    proxy_log_level: str = "warning"
    proxy_component_log_level: str = ""
    concurrency: int = 0
    template_file: str = ""
    outlier_log_path: str = ""
    log_as_json: bool = False
    sts_port: int = 0
    profiling: bool = True  # /debug/pprof/ on the status port


@dataclass(frozen=True)
class HostFacts:
    """What the resolver must know about the machine and the pod's files (read by `loader.load_agent_options`)."""

    euid: int = 0
    alt_resolv_conf_exists: bool = False
    mounted_root_cert: bool = False  # ./etc/certs/root-cert.pem is there at start
    # ./var/run/secrets/workload-spiffe-credentials holds a chain, a key and a root at start (upstream's
    # CheckWorkloadCertificate): the workload certificate is mounted, no CA client is made.
    workload_credentials: bool = False
    # A server answers on the workload SDS socket (WORKLOAD_IDENTITY_SOCKET_FILE) / on the credential socket.
    workload_sds_socket_healthy: bool = False
    credential_socket_healthy: bool = False
    # /etc/resolv.conf's text (None: unreadable): on GCP its search list may name the node's zone.
    resolv_conf: str | None = None
    # What the cloud's metadata server told at start (`agent/cloud_probe.py`; nothing: not asked, or no answer).
    cloud: CloudFacts = field(default_factory=CloudFacts)


@dataclass
class AgentConfig:
    """The agent's start-up facts, before resolution: the layered ProxyConfig, the environment it filled, the pod.

    Read by `loader.load_agent_config()`; `resolve_agent_options()` turns it into per-component options.
    """

    workdir: Path
    environment: env.Environment
    proxy_config: ProxyConfig
    identity: NodeIdentity
    labels: dict[str, str]
    annotations: dict[str, str]
    labels_file: bool = False  # the pod-labels file is there (even empty): then it replaces ISTIO_METAJSON_* LABELS

    def path(self, relative: str) -> Path:
        """A pod path (`./etc/...`) resolved against the agent's working directory."""
        candidate = Path(relative)
        return candidate if candidate.is_absolute() else self.workdir / candidate


@dataclass(frozen=True)
class AgentOptions:
    """Everything one agent runs with. A component that is off has None."""

    workdir: Path
    node: NodeIdentity
    metadata: Mapping[str, Any]
    security: SecurityOptions
    xds: XdsProxyOptions
    dns: DnsProxyOptions | None
    envoy: EnvoyOptions | None
    status: StatusOptions | None
    grpc_bootstrap: GrpcBootstrapFile | None
    # ProxyConfig's readinessProbe, run by the workload health checker (VMs); None when it is unset.
    health: HealthCheckOptions | None = None
    # The Wasm module cache behind the XDS proxy's ECDS rewriting; None: ECDS goes to Envoy as istiod sent it.
    wasm: WasmOptions | None = None
    first_certificate_head_start: float = FIRST_CERTIFICATE_HEAD_START
    # GRPC_SSL_CIPHER_SUITES for the agent's own gRPC (to istiod and the CA) under a compliance policy; the CLI
    # sets it in the process environment before any channel exists.
    grpc_cipher_suites: str = ""
    without_effect: tuple[env.EnvVar[Any], ...] = ()  # set variables this agent only accepts (warned at start)


# --- the cross-cutting rules -------------------------------------------------------------------------------

def dns_proxy_enabled(environment: env.Environment) -> bool:
    return environment.get(env.ISTIO_META_DNS_CAPTURE) or environment.get(env.ISTIO_META_ENABLE_DNS_SERVER)


def envoy_enabled(environment: env.Environment) -> bool:
    return not environment.get(env.DISABLE_ENVOY)


def istio_version(environment: env.Environment) -> str:
    return environment.get(env.ISTIO_VERSION) or ISTIO_COMPAT_VERSION


def xds_client_key_pair(environment: env.Environment, proxy_metadata: Mapping[str, str]) -> tuple[str, str]:
    """(key, chain) the agent presents to istiod (upstream's GetKeyCertsForXDS); ("", "") for none.

    A provisioning certificate (PROV_CERT) wins; with FILE_MOUNTED_CERTS the files the
    ProxyConfig's proxyMetadata names.
    """
    provisioned = environment.get(env.PROV_CERT)
    if provisioned:
        return go_join(provisioned, KEY_FILE), go_join(provisioned, CERT_CHAIN_FILE)
    if environment.get(env.FILE_MOUNTED_CERTS):
        return proxy_metadata.get(CLIENT_KEY_METADATA, ""), proxy_metadata.get(CLIENT_CHAIN_METADATA, "")
    return "", ""


def _no_provider(what: str) -> ConfigError:
    return ConfigError(f"environment variable PILOT_CERT_PROVIDER='none': a root certificate for {what} is "
                       f"required; set {'CA_ROOT_CA' if what == 'the CA' else 'XDS_ROOT_CA'}")


def ca_root(environment: env.Environment) -> str:
    """The root that verifies the CA (upstream's FindRootCAForCA): a file, or SYSTEM for the OS bundle."""
    configured = environment.get(env.CA_ROOT_CA)
    if configured:
        return configured
    provider = environment.get(env.PILOT_CERT_PROVIDER)
    if provider == CERT_PROVIDER_CUSTOM:
        return MOUNTED_ROOT_CERT
    if environment.get(env.PROV_CERT):
        return go_join(environment.get(env.PROV_CERT), ROOT_CERT_FILE)
    if provider == CERT_PROVIDER_NONE:
        raise _no_provider("the CA")
    return CA_ROOT_DEFAULT_PATH


def xds_root(environment: env.Environment, proxy_metadata: Mapping[str, str], host: HostFacts) -> str:
    """The root that verifies istiod's xDS server (upstream's FindRootCAForXDS): a file, or SYSTEM."""
    configured = environment.get(env.XDS_ROOT_CA)
    if configured:
        return configured
    if host.mounted_root_cert:
        return MOUNTED_ROOT_CERT  # old style: a mounted ./etc/certs/root-cert.pem
    if environment.get(env.PROV_CERT):
        return go_join(environment.get(env.PROV_CERT), ROOT_CERT_FILE)
    if environment.get(env.FILE_MOUNTED_CERTS):
        return proxy_metadata.get(CLIENT_ROOT_METADATA, "")
    if environment.get(env.PILOT_CERT_PROVIDER) == CERT_PROVIDER_NONE:
        raise _no_provider("istiod's xDS server")
    return CA_ROOT_DEFAULT_PATH


def grpc_cipher_suites(environment: env.Environment) -> str:
    """gRPC's TLS 1.2 ciphers under COMPLIANCE_POLICY (upstream sets them for Envoy's gRPC client); "" for no limit."""
    return FIPS_GRPC_CIPHERS if environment.get(env.COMPLIANCE_POLICY) in FIPS_POLICIES else ""


def concurrency(config: AgentConfig) -> int | None:
    """Envoy's worker threads: ProxyConfig's (or --concurrency), else ISTIO_CPU_LIMIT, else Envoy's own default."""
    configured = config.proxy_config.concurrency
    if configured is not None:
        return configured
    limit = config.environment.get(env.ISTIO_CPU_LIMIT)
    return limit if limit > 0 else None


def metadata_dns_proxy_addr(environment: env.Environment) -> str:
    """DNS_PROXY_ADDR in node metadata: the variable when set (upstream's rule), else the default when DNS is on."""
    explicit = environment.raw(env.DNS_PROXY_ADDR.name) or ""
    if explicit:
        return explicit
    return env.DNS_PROXY_ADDR.default if dns_proxy_enabled(environment) else ""


# --- per component ---------------------------------------------------------------------------------------

def metadata_options(config: AgentConfig, flags: AgentFlags, host: HostFacts | None = None,
                     platform: Platform | None = None) -> MetadataOptions:
    pc = config.proxy_config
    host = host or HostFacts()
    environment = config.environment
    return MetadataOptions(
        environment=environment,
        proxy_config=pc.to_json(),
        instance_ips=tuple(config.identity.ips),
        labels=config.labels,
        labels_file=config.labels_file,
        annotations=config.annotations,
        pilot_san=tuple(pilot_sans(pc.discovery_address, str(pc.get("controlPlaneAuthPolicy", "")))),
        outlier_log_path=flags.outlier_log_path,
        envoy_status_port=environment.get(env.ENVOY_STATUS_PORT),
        envoy_prometheus_port=environment.get(env.ENVOY_PROMETHEUS_PORT),
        envoy_secure_metrics_port=environment.get(env.ENVOY_SECURE_METRICS_PORT),
        envoy_secure_merged_metrics_port=environment.get(env.ENVOY_SECURE_MERGED_METRICS_PORT),
        workload_identity_socket_file=environment.get(env.WORKLOAD_IDENTITY_SOCKET_FILE),
        # PEER_METADATA_DISCOVERY when set; unset, node metadata follows ENABLE_HBONE (upstream's rule).
        metadata_discovery=(environment.get(env.PEER_METADATA_DISCOVERY)
                            if environment.is_set(env.PEER_METADATA_DISCOVERY) else None),
        exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
        envoy_skip_deprecated_logs=environment.get(env.ENVOY_SKIP_DEPRECATED_LOGS),
        sts_port=flags.sts_port,
        istio_version=istio_version(environment),
        dns_proxy_addr=metadata_dns_proxy_addr(environment),
        credential_socket_exists=host.credential_socket_healthy,
        custom_credentials_file_exists=host.workload_sds_socket_healthy,
        platform_metadata=platform.metadata if platform is not None else {},
    )


def security_options(config: AgentConfig, host: HostFacts | None = None, *,
                     run_sds_server: bool = True) -> SecurityOptions:
    """The identity's options (upstream's NewSecurityOptions), every value validated."""
    host = host or HostFacts()
    environment, node = config.environment, config.identity
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
    if not 2048 <= rsa_bits <= 8192:
        # Above 8192 bits a key takes minutes to generate on one core (65536: hours), for no gain.
        raise ConfigError(f"environment variable WORKLOAD_RSA_KEY_SIZE={rsa_bits}: must be between 2048 and 8192 bits")
    socket_file = environment.get(env.WORKLOAD_IDENTITY_SOCKET_FILE) or "socket"
    if Path(socket_file).name != socket_file or socket_file in (".", ".."):
        raise ConfigError(
            f"environment variable WORKLOAD_IDENTITY_SOCKET_FILE={socket_file!r}: must be a file name, not a path"
        )
    if socket_file != ISTIO_SDS_SOCKET_FILE and not host.workload_sds_socket_healthy:
        # As upstream: another server's socket was asked for, and nobody answers there.
        raise ConfigError(f"environment variable WORKLOAD_IDENTITY_SOCKET_FILE={socket_file!r}: no SDS server "
                          f"answers on {WORKLOAD_SDS_DIR}/{socket_file}")
    if environment.get(env.CA_PROVIDER) != "Citadel":
        raise ConfigError(f"environment variable CA_PROVIDER={environment.get(env.CA_PROVIDER)!r}: only 'Citadel' "
                          "(istiod's CA) is supported")
    if environment.get(env.PROV_CERT) and environment.get(env.FILE_MOUNTED_CERTS):
        raise ConfigError("environment variables PROV_CERT and FILE_MOUNTED_CERTS=true are mutually exclusive")
    headers = tuple((name.lower(), value) for name, value in environment.with_prefix(env.CA_HEADER_PREFIX))
    ca_address = environment.get(env.CA_ADDR) or config.proxy_config.discovery_address
    # As upstream, the CA's root is looked for only when a CA client is made (not with mounted workload
    # certificates or another SDS server) and speaks TLS (not to the plaintext :15010).
    mounted = environment.get(env.FILE_MOUNTED_CERTS) or host.workload_credentials or host.workload_sds_socket_healthy
    needs_ca_root = not mounted and not ca_address.endswith(":15010")
    return SecurityOptions(
        workdir=config.workdir,
        trust_domain=node.trust_domain,
        namespace=node.namespace,
        service_account=node.service_account,
        cluster_id=node.cluster_id,
        ca_address=ca_address,
        credentials=credential_source(config),
        ca_root_ca=ca_root(environment) if needs_ca_root else environment.get(env.CA_ROOT_CA),
        keepalive_interval=environment.get(env.GRPC_KEEPALIVE_INTERVAL),
        keepalive_timeout=environment.get(env.GRPC_KEEPALIVE_TIMEOUT),
        # As upstream: ISTIOD_SAN names the CA's certificate only when the CA is the discovery address (CA_ADDR
        # unset); a CA_ADDR given is verified as written.
        istiod_san="" if environment.get(env.CA_ADDR) else environment.get(env.ISTIOD_SAN),
        prov_cert=environment.get(env.PROV_CERT),
        ca_headers=headers,
        cert_signer=environment.get(env.ISTIO_META_CERT_SIGNER),
        secret_ttl=ttl,
        grace_period_ratio=ratio,
        grace_period_ratio_jitter=jitter,
        key_algorithm="ECDSA" if algorithm == "ECDSA" else "RSA",
        rsa_key_size=rsa_bits,
        ecc_curve=curve,
        pkcs8_keys=environment.get(env.PKCS8_KEY),
        output_certs=environment.get(env.OUTPUT_CERTS),
        output_file_mode=0o644 if environment.get(env.KUBERNETES_SERVICE_HOST) else 0o600,
        file_mounted_certs=environment.get(env.FILE_MOUNTED_CERTS),
        file_debounce=environment.get(env.FILE_DEBOUNCE_DURATION),
        run_sds_server=run_sds_server,
        socket_file=socket_file,
        serve_only_files=host.workload_sds_socket_healthy,
    )


def positive(environment: env.Environment, var: env.EnvVar[int]) -> int:
    value = environment.get(var)
    if value <= 0:
        raise ConfigError(f"environment variable {var.name}={value}: must be positive")
    return value


def credential_source(config: AgentConfig) -> CredentialSource:
    """CREDENTIAL_FETCHER_TYPE (upstream's NewCredFetcher): the token file, or the GCE metadata server's identity
    token for the trust domain; any other value stops the start, as upstream's."""
    environment = config.environment
    fetcher = environment.get(env.CREDENTIAL_FETCHER_TYPE) or JWT_FETCHER
    if fetcher not in CREDENTIAL_FETCHERS:
        raise ConfigError(f"failed to create credential fetcher: invalid credential fetcher type {fetcher} "
                          f"(environment variable CREDENTIAL_FETCHER_TYPE: {' or '.join(CREDENTIAL_FETCHERS)})")
    return CredentialSource(fetcher, environment.get(env.GCE_METADATA_HOST), config.identity.trust_domain)


def xds_options(config: AgentConfig, host: HostFacts | None = None) -> XdsProxyOptions:
    environment, pc = config.environment, config.proxy_config
    key, chain = xds_client_key_pair(environment, pc.proxy_metadata)
    headers = tuple((name.lower(), value) for name, value in environment.with_prefix(env.XDS_HEADER_PREFIX))
    upstream = UpstreamSettings(
        address=pc.discovery_address,
        workdir=config.workdir,
        root_ca=xds_root(environment, pc.proxy_metadata, host or HostFacts()),
        istiod_san=environment.get(env.ISTIOD_SAN),
        send_token=environment.get(env.XDS_AUTH),
        credentials=credential_source(config),
        cluster_id=config.identity.cluster_id,
        headers=headers,
        client_key=key,
        client_chain=chain,
        keepalive_interval=environment.get(env.GRPC_KEEPALIVE_INTERVAL),
        keepalive_timeout=environment.get(env.GRPC_KEEPALIVE_TIMEOUT),
        insecure=pc.get("controlPlaneAuthPolicy") == "NONE",
    )
    return XdsProxyOptions(
        socket_path=config.path(pc.config_path) / XDS_SOCKET_NAME,
        upstream=upstream,
        dns_enabled=dns_proxy_enabled(environment),
        pcds_enabled=environment.get(env.PROXY_CONFIG_XDS_AGENT),
        max_receive_message_size=positive(environment, env.ISTIO_GPRC_MAXRECVMSGSIZE),
        max_concurrent_streams=positive(environment, env.ISTIO_GPRC_MAXSTREAMS),
    )


def wasm_options(config: AgentConfig) -> WasmOptions | None:
    """The Wasm cache (upstream's WASM_* variables), or None when remote load conversion is off."""
    environment = config.environment
    if not environment.get(env.ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION):
        return None
    blocked, problems = parse_cidrs(environment.get(env.BLOCKED_CIDRS_IN_WASM_FETCH))
    for problem in problems:  # skipped, as upstream does
        log.warning("%s: %s", env.BLOCKED_CIDRS_IN_WASM_FETCH.name, problem)
    insecure = frozenset(h.strip() for h in environment.get(env.WASM_INSECURE_REGISTRIES).split(",") if h.strip())
    return WasmOptions(
        cache_dir=config.path("." + DEFAULT_CACHE_DIR),
        purge_interval=environment.get(env.WASM_PURGE_INTERVAL),
        module_expiry=environment.get(env.WASM_MODULE_EXPIRY),
        insecure_registries=insecure,
        http_request_timeout=environment.get(env.WASM_HTTP_REQUEST_TIMEOUT),
        http_request_max_retries=environment.get(env.WASM_HTTP_REQUEST_MAX_RETRIES),
        blocked_cidrs=blocked,
        max_module_size=positive(environment, env.ISTIO_WASM_MAX_BINARY_SIZE_BYTES),
        max_cache_bytes=positive(environment, env.WASM_CACHE_MAX_BYTES),
    )


def dns_options(config: AgentConfig, host: HostFacts) -> DnsProxyOptions | None:
    environment = config.environment
    if not dns_proxy_enabled(environment):
        return None
    options = DnsProxyOptions(
        addr=environment.get(env.DNS_PROXY_ADDR),
        namespace=config.identity.namespace,
        domain=config.identity.domain,
        forward_parallel=environment.get(env.DNS_FORWARD_PARALLEL),
        upstream_timeout=environment.get(env.DNS_FORWARD_TIMEOUT),
    )
    return port53_rules(options, host.euid, host.alt_resolv_conf_exists)


def node_platform_locality(metadata: Mapping[str, Any], platform: Platform, host: HostFacts) -> dict[str, str]:
    """The platform's locality when the pod has no locality label (only then is the platform asked, as upstream)."""
    return {} if locality_label(metadata) else platform_locality(platform, host.resolv_conf)


def bootstrap_options(config: AgentConfig, flags: AgentFlags, metadata: Mapping[str, Any],
                      platform_locality: Mapping[str, str] | None = None) -> BootstrapOptions:
    environment = config.environment
    return BootstrapOptions(
        node_id=config.identity.id,
        proxy_config=config.proxy_config.to_json(),
        metadata=metadata,
        instance_ips=tuple(dict.fromkeys(config.identity.ips)),
        delta_xds=environment.get(env.ISTIO_DELTA_XDS),
        dual_stack=environment.get(env.ISTIO_DUAL_STACK),
        log_as_json=flags.log_as_json,
        compliance_policy=environment.get(env.COMPLIANCE_POLICY),
        strip_fragment=environment.get(env.HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED),
        host_ip=environment.get(env.HOST_IP),
        status_port_proxy_protocol=environment.get(env.ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL),
        platform_locality=dict(platform_locality or {}),
    )


def envoy_options(config: AgentConfig, flags: AgentFlags, metadata: Mapping[str, Any],
                  platform_locality: Mapping[str, str] | None = None) -> EnvoyOptions | None:
    environment, pc = config.environment, config.proxy_config
    if not envoy_enabled(environment):
        return None
    launch = EnvoyLaunch(
        config_file="",
        drain_duration=pc.drain_duration,
        node_ips=tuple(config.identity.ips),
        log_level=flags.proxy_log_level,  # component levels in it win over --proxyComponentLogLevel (argv.py)
        component_log_level=flags.proxy_component_log_level,
        concurrency=concurrency(config),
        skip_deprecated_logs=environment.get(env.ENVOY_SKIP_DEPRECATED_LOGS),
        enable_core_dump=environment.get(env.ISTIO_ENVOY_ENABLE_CORE_DUMP),
        file_flush_interval_ms=int(pc.get("fileFlushInterval", 1.0) * 1000),
        file_flush_min_size_kb=int(pc.get("fileFlushMinSizeKb") or 0),
    )
    uid = environment.get(env.ISTIO_AGENT_ENVOY_UID)
    return EnvoyOptions(
        bootstrap=bootstrap_options(config, flags, metadata, platform_locality),
        source=BootstrapSource(
            istio_bootstrap=environment.get(env.ISTIO_BOOTSTRAP),
            template_file=flags.template_file,
            override_path=environment.get(env.ISTIO_BOOTSTRAP_OVERRIDE),
            host_ip=environment.get(env.HOST_IP),
        ),
        launch=launch,
        workdir=config.workdir,
        binary_path=pc.binary_path,
        run_as=(uid, uid) if uid > 0 else None,
        admin_port=pc.proxy_admin_port,
        drain=DrainPolicy(
            termination_drain_duration=pc.termination_drain_duration,
            exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
            minimum_drain_duration=environment.get(env.MINIMUM_DRAIN_DURATION),
            istio_listener_stats=istio_listener_stats(
                environment.get(var) for var in (env.ENVOY_STATUS_PORT, env.ENVOY_PROMETHEUS_PORT,
                                                 env.ENVOY_SECURE_METRICS_PORT, env.ENVOY_SECURE_MERGED_METRICS_PORT)),
        ),
        drain_inbound_only=config.identity.proxy_type == "sidecar",
        extra_env=(("GRPC_SSL_CIPHER_SUITES", ciphers),) if (ciphers := grpc_cipher_suites(environment)) else (),
    )


def metrics_options(config: AgentConfig) -> MetricsOptions:
    """What the merged scrape reads; a bad ISTIO_PROMETHEUS_ANNOTATIONS raises ConfigError."""
    environment = config.environment
    merge_envoy = environment.get(env.PILOT_AGENT_MERGE_ENVOY_STATS) and envoy_enabled(environment)
    targets = parse_scrape_annotations(environment.get(env.ISTIO_PROMETHEUS_ANNOTATIONS),
                                       config.proxy_config.status_port)
    if config.identity.proxy_type != "sidecar":
        targets = ()  # gateways expose 15020; they scrape no app
    envoy_port = environment.get(env.ENVOY_PROMETHEUS_PORT)  # the bootstrap's Prometheus listener
    return MetricsOptions(envoy_port=envoy_port if merge_envoy else None, app_targets=targets,
                          localhost_only=environment.get(env.METRICS_LOCALHOST_ACCESS_ONLY),
                          created_series=not environment.get(env.PROMETHEUS_DISABLE_CREATED_SERIES))


def probe_options(config: AgentConfig) -> ProbeOptions:
    """ISTIO_KUBE_APP_PROBERS, validated (ConfigError naming the probe path and field fails the start), and how
    probes connect (ENABLE_PROBE_KEEPALIVE_CONNECTIONS, ISTIO_ENABLE_HTTP2_PROBING)."""
    return ProbeOptions(
        probers=parse_app_probers(config.environment.get(env.ISTIO_KUBE_APP_PROBERS)),
        # REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION: probe the app on localhost, as before upstream used the pod IP.
        pod_ip=("localhost" if config.environment.get(env.REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION)
                else config.identity.ips[0] if config.identity.ips else "127.0.0.1"),
        status_port=config.proxy_config.status_port,
        keepalive=config.environment.get(env.ENABLE_PROBE_KEEPALIVE_CONNECTIONS),
        http2=config.environment.get(env.ISTIO_ENABLE_HTTP2_PROBING),
    )


def status_options(config: AgentConfig, profiling: bool = True) -> StatusOptions | None:
    environment, pc = config.environment, config.proxy_config
    probes, metrics = probe_options(config), metrics_options(config)  # validated even when the server is off
    if pc.status_port <= 0:
        return None
    with_envoy = envoy_enabled(environment)
    return StatusOptions(
        port=pc.status_port,
        envoy_enabled=with_envoy,
        dns_enabled=dns_proxy_enabled(environment) and with_envoy,
        probes=probes,
        metrics=metrics,
        profiling=profiling,
    )


def grpc_bootstrap(config: AgentConfig, metadata: Mapping[str, Any],
                   platform_locality: Mapping[str, str] | None = None) -> GrpcBootstrapFile | None:
    """GRPC_XDS_BOOTSTRAP for proxyless apps; upstream writes it whenever the path is set (default: always)."""
    target = config.environment.get(env.GRPC_XDS_BOOTSTRAP)
    if not target:
        return None
    content = GrpcBootstrapOptions(
        node_id=config.identity.id,
        metadata=metadata,
        xds_uds_path=xds_socket_for_bootstrap(config.proxy_config.config_path),
        locality=locality(metadata, platform_locality),
        discovery_address=config.proxy_config.discovery_address,
        cert_dir=config.environment.get(env.OUTPUT_CERTS),
    )
    return GrpcBootstrapFile(config.path(target), content)


def health_check_options(config: AgentConfig) -> HealthCheckOptions | None:
    """The workload health check when ProxyConfig has a `readinessProbe` (upstream's only condition)."""
    return parse_readiness_probe(
        config.proxy_config.get("readinessProbe"), tuple(config.identity.ips),
        legacy_localhost=config.environment.get(env.REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION))


def resolve_agent_options(config: AgentConfig, flags: AgentFlags, host: HostFacts) -> AgentOptions:
    """All options of one agent; ConfigError (naming the variable, field or flag and the value) on bad input."""
    platform = discover(config.environment, host.cloud)
    layers = node_metadata_layers(metadata_options(config, flags, host, platform))
    metadata = layers.merged()
    node_locality = node_platform_locality(metadata, platform, host)
    xds = xds_options(config, host)
    with_envoy = envoy_enabled(config.environment)
    return AgentOptions(
        workdir=config.workdir,
        node=config.identity,
        metadata=metadata,
        security=security_options(config, host, run_sds_server=with_envoy),
        xds=xds,
        dns=dns_options(config, host),
        envoy=envoy_options(config, flags, metadata, node_locality),
        status=status_options(config, flags.profiling),
        grpc_bootstrap=grpc_bootstrap(config, layers.typed_view(), node_locality),
        health=health_check_options(config),
        wasm=wasm_options(config) if with_envoy else None,
        without_effect=tuple(config.environment.without_effect()),
        grpc_cipher_suites=grpc_cipher_suites(config.environment),
    )
