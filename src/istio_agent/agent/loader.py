"""The resolver's I/O edge: everything the agent knows at start, read once from the pod's files, the process
environment and the host, then resolved (`load_agent_options`).

Order matters and follows upstream: ProxyConfig layers are read first, then its
`proxyMetadata` fills environment variables the container did not set, and
only then is the node identity derived (so `proxyMetadata` can set, say,
`ISTIO_META_DNS_CAPTURE`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from istio_agent.agent.options import (
    MOUNTED_ROOT_CERT,
    AgentConfig,
    AgentFlags,
    AgentOptions,
    HostFacts,
    resolve_agent_options,
)
from istio_agent.config import env
from istio_agent.config.cloud_metadata import SYS_VENDOR, CloudFacts
from istio_agent.config.errors import ConfigError
from istio_agent.config.node import identity_from_env, instance_ips
from istio_agent.config.platform import RESOLV_CONF, zone_from_resolv_conf
from istio_agent.config.proxyconfig import ProxyConfig, build_proxy_config, read_pod_file
from istio_agent.config.proxyconfig_validation import validate_proxy_config
from istio_agent.config.textfile import read_text
from istio_agent.dns.options import ALT_RESOLV_CONF
from istio_agent.security.options import (
    CREDENTIAL_FILES,
    CREDENTIAL_SOCKET,
    ISTIO_SDS_SOCKET_FILE,
    WORKLOAD_CREDENTIALS_DIR,
    WORKLOAD_SDS_DIR,
)

log = logging.getLogger(__name__)
# Host name -> its addresses (the system resolver by default; tests pass their own).
Lookup = Callable[[str], Sequence[str]]

DEFAULT_MESH_CONFIG = "./etc/istio/config/mesh"
POD_LABELS_FILE = "./etc/istio/pod/labels"
POD_ANNOTATIONS_FILE = "./etc/istio/pod/annotations"


def load_agent_config(
    environment: env.Environment,
    workdir: Path,
    proxy_type: str = "sidecar",
    domain: str | None = None,
    mesh_config_path: str = DEFAULT_MESH_CONFIG,
    concurrency: int = 0,
    service_cluster: str = "istio-proxy",
    interfaces: Sequence[tuple[str, str]] = (),
    lookup: Lookup | None = None,
) -> AgentConfig:
    """Read and validate the mesh file, PROXY_CONFIG and pod files; raise ConfigError on bad input.

    `interfaces` are the host's (name, address) pairs of up, non-loopback interfaces; they
    become the proxy's IPs after INSTANCE_IP, as upstream lists them.
    """
    def resolve(p: str) -> Path:
        return Path(p) if Path(p).is_absolute() else workdir / p

    mesh_file = resolve(mesh_config_path)
    try:
        mesh_text: str | None = read_text(mesh_file, f"mesh config {mesh_file}")
    except FileNotFoundError:
        mesh_text = None
    labels = read_pod_file(resolve(POD_LABELS_FILE))
    annotations = read_pod_file(resolve(POD_ANNOTATIONS_FILE))
    proxy_config = build_proxy_config(
        mesh_text, environment.get(env.PROXY_CONFIG), annotations, mesh_source=f"mesh config {mesh_file}",
        check_mesh=validate_proxy_config,
    )
    _apply_flags(proxy_config, concurrency, service_cluster)
    if proxy_config.get("statsdUdpAddress"):
        resolved = resolve_statsd_address(str(proxy_config.get("statsdUdpAddress")), lookup or _system_lookup)
        proxy_config.values["statsdUdpAddress"] = resolved
    validate_proxy_config(proxy_config)  # as upstream: after flags and statsd, before the two annotations
    _apply_annotations(proxy_config, annotations)
    environment = environment.overlay(proxy_config.proxy_metadata)
    excluded = [name.strip() for name in annotations.get(EXCLUDE_INTERFACES_ANNOTATION, "").split(",") if name.strip()]
    ips = instance_ips(environment, interfaces, excluded)
    identity = identity_from_env(environment, proxy_type, domain, ips)
    return AgentConfig(workdir, environment, proxy_config, identity, labels, annotations,
                       labels_file=resolve(POD_LABELS_FILE).is_file())


def _system_lookup(host: str) -> list[str]:
    import socket  # the one network lookup at start, and only for a statsd host name

    return [str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)]


def _split_host_port(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` with a non-empty host (netaddr's split allows an empty one); ValueError if not."""
    host, colon, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not port.isdigit() or int(port) > 65535 or not host or "[" in host or "]" in host:
        raise ValueError(f"address {address!r} must be host:port")
    return host, int(port)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def resolve_statsd_address(address: str, lookup: Lookup) -> str:
    """`statsdUdpAddress` as an IP and port, as upstream resolves it at start (Envoy's statsd sink takes
    no host name): the first IPv4 address, else the last address found; "" (statsd off, with a warning)
    when the address does not parse or the name does not resolve."""
    try:
        host, port = _split_host_port(address)
        candidates = [host] if _is_ip(host) else lookup(host)
    except (ValueError, OSError) as exc:
        log.warning("resolve StatsdUdpAddress failed: %s; statsd is off", exc)
        return ""
    resolved = ""
    for text in candidates:
        try:
            ip = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            continue
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        resolved = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
        if ip.version == 4:
            break
    if not resolved:
        log.warning("resolve StatsdUdpAddress failed: no address for %r; statsd is off", host)
    return resolved


DISCOVERY_ADDRESS_ANNOTATION = "sidecar.istio.io/discoveryAddress"
EXCLUDE_INTERFACES_ANNOTATION = "traffic.sidecar.istio.io/excludeInterfaces"
STATUS_PORT_ANNOTATION = "status.sidecar.istio.io/port"


def _apply_flags(config: ProxyConfig, concurrency: int, service_cluster: str) -> None:
    """What upstream applies after layering: `--concurrency` and `--serviceCluster`.

    A non-zero `--concurrency` wins over every layer (upstream's legacy flag). With no
    concurrency anywhere, the resolver falls back to ISTIO_CPU_LIMIT and then to Envoy's
    own default (a thread per core), as upstream's default ProxyConfig sets none.
    """
    if concurrency:
        config.values["concurrency"] = concurrency
    if "tracingServiceName" not in config.values and not config.get("serviceCluster"):
        config.values["serviceCluster"] = service_cluster  # only when the cluster name is an empty serviceCluster


def _apply_annotations(config: ProxyConfig, annotations: dict[str, str]) -> None:
    """The two pod annotations upstream applies last, after its validation."""
    if DISCOVERY_ADDRESS_ANNOTATION in annotations:
        config.values["discoveryAddress"] = annotations[DISCOVERY_ADDRESS_ANNOTATION]
    if STATUS_PORT_ANNOTATION in annotations:
        try:
            config.values["statusPort"] = int(annotations[STATUS_PORT_ANNOTATION])
        except ValueError:
            raise ConfigError(
                f"annotation {STATUS_PORT_ANNOTATION}={annotations[STATUS_PORT_ANNOTATION]!r}: not a port"
            ) from None


def load_agent_options(flags: AgentFlags, environment: env.Environment | None = None,
                       workdir: Path | None = None) -> AgentOptions:
    """Read the process environment, the pod's files and host facts, then resolve; ConfigError on bad input."""
    from istio_agent.capture.hostfacts import up_interface_addresses

    try:
        interfaces = up_interface_addresses()
    except OSError:
        interfaces = []  # no netlink here: 127.0.0.1 and ::1, as upstream when it finds no address
    config = load_agent_config(
        environment if environment is not None else env.Environment(),
        workdir or Path.cwd(),
        proxy_type=flags.proxy_type,
        domain=flags.domain or None,
        mesh_config_path=flags.mesh_config,
        concurrency=flags.concurrency,
        service_cluster=flags.service_cluster,
        interfaces=interfaces,
    )
    from istio_agent.security.socket_check import check_socket

    socket_file = config.environment.get(env.WORKLOAD_IDENTITY_SOCKET_FILE) or ISTIO_SDS_SOCKET_FILE
    workload_socket = config.path(WORKLOAD_SDS_DIR) / Path(socket_file).name
    resolv_conf = _read_resolv_conf()
    host = HostFacts(euid=os.geteuid(), alt_resolv_conf_exists=Path(ALT_RESOLV_CONF).exists(),
                     mounted_root_cert=config.path(MOUNTED_ROOT_CERT).is_file(),
                     workload_credentials=all(config.path(WORKLOAD_CREDENTIALS_DIR).joinpath(name).exists()
                                              for name in CREDENTIAL_FILES),
                     workload_sds_socket_healthy=check_socket(workload_socket),
                     credential_socket_healthy=check_socket(config.path(CREDENTIAL_SOCKET)),
                     resolv_conf=resolv_conf, cloud=_ask_the_cloud(config, resolv_conf))
    return resolve_agent_options(config, flags, host)


def _ask_the_cloud(config: AgentConfig, resolv_conf: str | None) -> CloudFacts:
    """What the cloud's metadata server says (`agent/cloud_probe.py`; nothing asked with CLOUD_PLATFORM=none).

    As upstream: the AWS server on its IPv6 address when the proxy has one; GCE's zone asked only when the
    locality would otherwise have none (no locality label, no GCP_ZONE, none in resolv.conf).
    """
    from istio_agent.agent.cloud_probe import probe_cloud
    from istio_agent.envoy.bootstrap.options import locality_label

    environment = config.environment
    zone_wanted = not (locality_label({"LABELS": config.labels}) or environment.get(env.GCP_ZONE)
                       or zone_from_resolv_conf(resolv_conf or ""))
    return probe_cloud(environment, ipv6=any(":" in ip for ip in config.identity.ips), sys_vendor=_sys_vendor(),
                       zone_wanted=zone_wanted)


def _sys_vendor() -> str | None:
    """The DMI system vendor (Azure's sign), None when the machine has none."""
    try:
        return Path(SYS_VENDOR).read_text(errors="replace")
    except OSError:
        return None


def _read_resolv_conf() -> str | None:
    """/etc/resolv.conf's text for the platform's zone rule, None when it cannot be read (as upstream, not fatal)."""
    try:
        return Path(RESOLV_CONF).read_text(errors="replace")
    except OSError:
        return None
