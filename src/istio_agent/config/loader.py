"""Everything the agent knows at start, read once from the pod's files and environment.

Order matters and follows upstream: ProxyConfig layers are read first, then its
`proxyMetadata` fills environment variables the container did not set, and
only then is the node identity derived (so `proxyMetadata` can set, say,
`ISTIO_META_DNS_CAPTURE`).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.node import NodeIdentity, identity_from_env, instance_ips
from istio_agent.config.proxyconfig import ProxyConfig, build_proxy_config, read_pod_file
from istio_agent.config.proxyconfig_validation import validate_proxy_config
from istio_agent.config.textfile import read_text

log = logging.getLogger(__name__)
# Host name -> its addresses (the system resolver by default; tests pass their own).
Lookup = Callable[[str], Sequence[str]]

DEFAULT_MESH_CONFIG = "./etc/istio/config/mesh"
POD_LABELS_FILE = "./etc/istio/pod/labels"
POD_ANNOTATIONS_FILE = "./etc/istio/pod/annotations"


@dataclass
class AgentConfig:
    """The agent's start-up facts, before resolution: the layered ProxyConfig, the environment it filled, the pod.

    `config.options.resolve_agent_options()` turns this into per-component options.
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
        mesh_text, environment.get(env.PROXY_CONFIG), annotations, mesh_source=f"mesh config {mesh_file}"
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
    """`host:port` or `[v6]:port` (config/ imports nothing outside it, so not netaddr's); ValueError if not."""
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
