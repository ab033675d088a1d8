"""The local node as data: names, addresses and the commands that build it (no I/O here).

A node is a network namespace holding a Linux bridge with the gateway address
of the pod CIDR (10.244.0.1/24 by default). Each pod is a network namespace
whose `eth0` is one end of a veth pair; the other end sits in the node
namespace, enslaved to the bridge. Pods get a default route via the gateway,
so every address outside the pod CIDR, the service clusterIPs included
(10.96.0.0/16), is routable: outbound capture then sends those connections to
Envoy before they ever leave the pod. istiod-local runs inside the node
namespace, bound to the gateway address, so pods reach it and nothing on the
host's own network changes.

Every namespace is named `ia-<owner pid>-<n>-<role>` (n counts the nodes one
process has built, so a test can hold two at once). The owner pid lets a later
run find what a crashed or killed run left behind (`stale_namespaces`)
without touching a node that another live process is using. Interface names
only need to be unique inside one namespace, so they stay short.

This module computes everything: which `ip` commands build or remove a node
or pod, the `istio-iptables` arguments, the agent's environment and
command line, the registry entries for the pods. `node/local_node.py` runs
them.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from istiod_local.node.upstream import AGENT_IMPLEMENTATIONS

NETNS_PREFIX = "ia-"
NETNS_DIR = "/var/run/netns"
DEFAULT_POD_CIDR = "10.244.0.0/24"
DEFAULT_BRIDGE = "br0"
PROXY_UID = 1337
PROXY_GID = 1337
# The agent runs as the istio-proxy container's user (runAsUser/runAsGroup 1337), and Envoy, which it
# starts, inherits it: capture's `--uid-owner 1337` rule lets both reach istiod and the real destinations.
# The umask is a container runtime's default (the node's own may be anything).
AGENT_UID = PROXY_UID
AGENT_GID = PROXY_GID
AGENT_UMASK = 0o022
# What the istio-proxy container's securityContext adds to the user (allowPrivilegeEscalation: false,
# capabilities: drop ALL): no setuid or file-capability exec regains root, and no capability is left.
CONTAINER_RESTRICTIONS = ("--no-new-privs", "--inh-caps=-all", "--bounding-set=-all")
ISTIOD_SAN = "istiod.istio-system.svc"
ISTIOD_PLAINTEXT_PORT = 15010
ISTIOD_TLS_PORT = 15012
# Where the real istiod (upstream's pilot-discovery, `istiod.py`) listens on the gateway beside istiod-local.
UPSTREAM_ISTIOD_PLAINTEXT_PORT = 15110
UPSTREAM_ISTIOD_TLS_PORT = 15112
UPSTREAM_ISTIOD_MONITORING_PORT = 15114
# Who serves the pods' xDS and certificates: istiod-local, or the real istiod beside it (`istiod.py`).
ISTIOD_LOCAL = "istiod-local"
UPSTREAM_ISTIOD = "istiod"
CONTROL_PLANES = (ISTIOD_LOCAL, UPSTREAM_ISTIOD)
# Ports the injector excludes from inbound capture: Envoy's prometheus, health and the agent's status.
EXCLUDED_INBOUND_PORTS = (15090, 15021, 15020)
# What a local node drains for on pod stop: nothing here holds long-lived connections worth 5 s.
DEFAULT_TERMINATION_DRAIN = "1s"

_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")


class PlanError(ValueError):
    """A node or pod cannot be planned (bad name, duplicate, address outside the CIDR, CIDR full)."""


@dataclass(frozen=True)
class PodSpec:
    """What a pod is: its identity, its app, and whether it gets a sidecar.

    `app` is the app container's argv (empty: no app). With `sidecar=False` the
    pod has neither capture rules nor an agent, like a pod outside the mesh.
    `ip` pins the pod address; otherwise the next free one is taken.
    `proxy_config` fields are merged over the node's (JSON, as `PROXY_CONFIG`).
    `proxyless=True` runs Istio's grpc-agent template instead of the sidecar
    (`node/proxyless.py`): an agent without Envoy and no capture rules.
    `annotations` are the pod's own (the injector's capture annotations among
    them: `sidecar.istio.io/interceptionMode`, `traffic.sidecar.istio.io/...`);
    they shape its capture in either capture mode. `agent=False` leaves a
    sidecar pod's istio-proxy container unstarted (the pod still is one, with
    its capture; a test may put its own listeners on Envoy's ports).
    `agent_implementation` is whose istio-proxy image the pod runs: ours
    ("istio-agent") or upstream's Go `pilot-agent` ("upstream", `upstream.py`),
    with the same user, volumes, environment and arguments.
    `router=True` makes a sidecar pod a gateway, as Istio's gateway injection
    template does: `pilot-agent proxy router`, no capture and no init
    container, ports below 1024 open to uid 1337
    (`net.ipv4.ip_unprivileged_port_start=0`). `host_ports` are
    (host port, container port) pairs the node forwards from the host's
    loopback to the pod (`hostport.py`).
    """

    name: str
    namespace: str = "default"
    service_account: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    app: Sequence[str] = ()
    sidecar: bool = True
    ip: str = ""
    dns_capture: bool = False
    proxy_config: Mapping[str, Any] = field(default_factory=dict)
    agent_env: Mapping[str, str] = field(default_factory=dict)
    app_env: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 1
    proxyless: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    agent: bool = True
    agent_implementation: str = "istio-agent"
    router: bool = False
    host_ports: tuple[tuple[int, int], ...] = ()


CAPTURE_MODES = ("cni", "init")


@dataclass(frozen=True)
class NodePlan:
    """The node namespace, its bridge and addressing."""

    owner: int
    index: int
    netns: str
    bridge: str
    network: ipaddress.IPv4Network
    gateway: str
    capture: str = "cni"  # who programs a sidecar pod's capture: the istio-cni plugin, or istio-init
    control_plane: str = ISTIOD_LOCAL  # whose xDS and certificates the pods get (CONTROL_PLANES)

    @property
    def name(self) -> str:
        """The node's Kubernetes name (`spec.nodeName` of its pods): its namespace's name."""
        return self.netns

    @property
    def prefix(self) -> str:
        """Every namespace of this node starts with it: what teardown looks for."""
        return f"{NETNS_PREFIX}{self.owner}-{self.index}-"

    @property
    def istiod_tls_addr(self) -> str:
        return f"{self.gateway}:{ISTIOD_TLS_PORT}"

    @property
    def istiod_plaintext_addr(self) -> str:
        return f"{self.gateway}:{ISTIOD_PLAINTEXT_PORT}"

    @property
    def discovery_address(self) -> str:
        """Where pods' agents find their control plane (`discoveryAddress`, `CA_ADDR`): istiod-local's TLS
        port, or the real istiod's."""
        port = UPSTREAM_ISTIOD_TLS_PORT if self.control_plane == UPSTREAM_ISTIOD else ISTIOD_TLS_PORT
        return f"{self.gateway}:{port}"

    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.netns}"


@dataclass(frozen=True)
class PodPlan:
    """One pod's namespace, veth pair and address."""

    spec: PodSpec
    netns: str
    ip: str
    prefix_len: int
    gateway: str
    node_veth: str
    pod_veth: str = "eth0"
    node_name: str = ""
    capture: str = "cni"

    @property
    def name(self) -> str:
        return self.spec.name

    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.netns}"


def plan_node(owner: int, index: int = 0, pod_cidr: str = DEFAULT_POD_CIDR,
              bridge: str = DEFAULT_BRIDGE, capture: str = "cni", control_plane: str = ISTIOD_LOCAL) -> NodePlan:
    """Name the node after its owner process; the gateway is the CIDR's first host address."""
    if capture not in CAPTURE_MODES:
        raise PlanError(f"capture {capture!r}: one of {', '.join(CAPTURE_MODES)}")
    if control_plane not in CONTROL_PLANES:
        raise PlanError(f"control plane {control_plane!r}: one of {', '.join(CONTROL_PLANES)}")
    try:
        network = ipaddress.IPv4Network(pod_cidr, strict=True)
    except ValueError as exc:
        raise PlanError(f"pod CIDR {pod_cidr!r}: {exc}") from None
    if network.num_addresses < 4:
        raise PlanError(f"pod CIDR {pod_cidr!r} is too small for a gateway and a pod")
    gateway = str(next(network.hosts()))
    return NodePlan(owner, index, f"{NETNS_PREFIX}{owner}-{index}-node", bridge, network, gateway, capture,
                    control_plane)


def plan_pod(node: NodePlan, spec: PodSpec, pods: Iterable[PodPlan]) -> PodPlan:
    """Place a pod on the node: validate its name, pick (or check) its address, name its veth."""
    existing = list(pods)
    if not _POD_NAME.match(spec.name):
        raise PlanError(f"pod name {spec.name!r}: lower-case letters, digits and '-', at most 42 characters")
    if any(p.name == spec.name for p in existing):
        raise PlanError(f"pod {spec.name!r} already exists on this node")
    if spec.agent_implementation not in AGENT_IMPLEMENTATIONS:
        raise PlanError(f"pod {spec.name!r}: agent implementation {spec.agent_implementation!r}: one of "
                        f"{', '.join(AGENT_IMPLEMENTATIONS)}")
    taken = {node.gateway, *(p.ip for p in existing)}
    if spec.ip:
        try:
            address = ipaddress.IPv4Address(spec.ip)
        except ValueError:
            raise PlanError(f"pod {spec.name!r}: ip {spec.ip!r} is not an IPv4 address") from None
        if address not in node.network or address in (node.network.network_address, node.network.broadcast_address):
            raise PlanError(f"pod {spec.name!r}: ip {spec.ip} is not a host address of {node.network}")
        if spec.ip in taken:
            raise PlanError(f"pod {spec.name!r}: ip {spec.ip} is already in use")
        ip = spec.ip
    else:
        free = (str(h) for h in node.network.hosts() if str(h) not in taken)
        ip = next(free, "")
        if not ip:
            raise PlanError(f"pod CIDR {node.network} is full")
    index = int(ipaddress.IPv4Address(ip)) - int(node.network.network_address)
    return PodPlan(spec, f"{node.prefix}{spec.name}", ip, node.network.prefixlen, node.gateway, f"veth{index}",
                   node_name=node.name, capture=node.capture)


# ---- ip(8) commands ------------------------------------------------------------------------------


def bridge_mac(node: NodePlan) -> str:
    """A fixed, locally administered MAC for the bridge: 02:00 and the gateway's four octets.

    Without one, Linux gives a bridge the lowest MAC among its ports and changes it
    whenever a pod with a lower one joins; pods that cached the old gateway MAC then
    send to a port's address, which the bridge does not take as its own, so their new
    connections to istiod hang in SYN-SENT until the ARP entry expires.
    """
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in node.gateway.split("."))


def node_setup_commands(node: NodePlan) -> list[list[str]]:
    """Create the node namespace and its bridge (fixed MAC, see `bridge_mac`) holding the gateway address."""
    ns = node.netns
    return [
        ["ip", "netns", "add", ns],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "link", "add", node.bridge, "address", bridge_mac(node), "type", "bridge"],
        ["ip", "-n", ns, "addr", "add", f"{node.gateway}/{node.network.prefixlen}", "dev", node.bridge],
        ["ip", "-n", ns, "link", "set", node.bridge, "up"],
    ]


def pod_setup_commands(node: NodePlan, pod: PodPlan) -> list[list[str]]:
    """Create the pod namespace and wire it to the bridge; nothing is created in the host's namespace."""
    ns = pod.netns
    return [
        ["ip", "netns", "add", ns],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", node.netns, "link", "add", pod.node_veth, "type", "veth",
         "peer", "name", pod.pod_veth, "netns", ns],
        ["ip", "-n", node.netns, "link", "set", pod.node_veth, "master", node.bridge, "up"],
        ["ip", "-n", ns, "addr", "add", f"{pod.ip}/{pod.prefix_len}", "dev", pod.pod_veth],
        ["ip", "-n", ns, "link", "set", pod.pod_veth, "up"],
        ["ip", "-n", ns, "route", "add", "default", "via", pod.gateway],
    ]


def netns_delete_command(netns: str) -> list[str]:
    """Deleting a namespace takes its veth ends, bridge, addresses and iptables/nft rules with it."""
    return ["ip", "netns", "delete", netns]


def in_netns(netns: str, argv: Sequence[str], uid: int | None = None, gid: int | None = None,
             pdeathsig: str = "SIGTERM") -> list[str]:
    """argv run inside `netns` (`ip netns exec`), optionally as `uid`/`gid`, signalled if its starter dies.

    `setpriv --pdeathsig` is set after the uid change (which would clear it), so a
    killed node owner still takes its pods' processes down; the namespaces
    themselves are then found by `stale_namespaces`.
    """
    return ["ip", "netns", "exec", netns, *as_user(uid, gid, pdeathsig), "--", *argv]


def as_user(uid: int | None = None, gid: int | None = None, pdeathsig: str = "SIGTERM") -> list[str]:
    """The `setpriv` prefix (up to, not including, its `--`): the death signal, then the user and group.

    A non-root `uid` also gets `CONTAINER_RESTRICTIONS`, as a container with that
    user would: nothing it executes can raise its privileges again.
    """
    wrapper = ["setpriv", "--pdeathsig", pdeathsig]
    if uid is not None:
        wrapper += ["--reuid", str(uid)]
    if gid is not None:
        wrapper += ["--regid", str(gid), "--clear-groups"]
    if uid:
        wrapper += CONTAINER_RESTRICTIONS
    return wrapper


def stale_namespaces(names: Iterable[str], is_alive: Callable[[int], bool], own_pid: int) -> list[str]:
    """Namespaces named `ia-<pid>-...` whose owner is gone: what a crashed or killed run left behind.

    Our own pid's namespaces are never stale (a live node of this process owns them);
    pod namespaces come before the node namespace so veths disappear pod side first.
    """
    stale = []
    for name in names:
        match = re.match(rf"^{re.escape(NETNS_PREFIX)}(\d+)-", name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != own_pid and not is_alive(pid):
            stale.append(name)
    return sorted(stale, key=lambda n: (n.endswith("-node"), n))


def parse_netns_list(text: str) -> list[str]:
    """Names from `ip netns list` (lines like `name (id: 3)`)."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


# ---- capture and the agent --------------------------------------------------------------------


ANNOTATION_PREFIX = "traffic.sidecar.istio.io/"
INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"


def injector_capture_flags(spec: PodSpec) -> list[str]:
    """The istio-iptables flags Istio's injector writes for this pod's annotations (istio-init's and
    istio-validation's arguments): mode, outbound ranges and ports, inbound ports (Envoy's and the status
    port always excluded), excluded and rerouted interfaces. Values pass as given: istio-iptables (and,
    in CNI mode, the plugin) validates them."""
    ann = spec.annotations
    excluded = [str(p) for p in EXCLUDED_INBOUND_PORTS]
    extra = [p.strip() for p in ann.get(f"{ANNOTATION_PREFIX}excludeInboundPorts", "").split(",") if p.strip()]
    args = ["-p", "15001", "-z", "15006", "-u", str(PROXY_UID), "-g", str(PROXY_GID),
            "-m", ann.get(INTERCEPTION_MODE, "REDIRECT"),
            "-i", ann.get(f"{ANNOTATION_PREFIX}includeOutboundIPRanges", "*"),
            "-x", ann.get(f"{ANNOTATION_PREFIX}excludeOutboundIPRanges", ""),
            "-b", ann.get(f"{ANNOTATION_PREFIX}includeInboundPorts", "*"),
            "-d", ",".join(dict.fromkeys(excluded + extra))]
    for flag, key in (("-q", "includeOutboundPorts"), ("-o", "excludeOutboundPorts")):
        if f"{ANNOTATION_PREFIX}{key}" in ann:
            args += [flag, ann[f"{ANNOTATION_PREFIX}{key}"]]
    for key in ("istio.io/reroute-virtual-interfaces", f"{ANNOTATION_PREFIX}kubevirtInterfaces"):
        if key in ann:
            args += ["-k", ann[key]]
            break
    if f"{ANNOTATION_PREFIX}excludeInterfaces" in ann:
        args += ["-c", ann[f"{ANNOTATION_PREFIX}excludeInterfaces"]]
    if spec.dns_capture:
        args.append("--redirect-dns")
    return args


def capture_args(pod: PodPlan) -> list[str]:
    """`istio-iptables` arguments as Istio's injector passes them to istio-init, in the pod's namespace."""
    return ["--network-namespace", pod.netns_path(), *injector_capture_flags(pod.spec)]


def validation_args(pod: PodPlan) -> list[str]:
    """The `istio-validation` init container's `istio-iptables` arguments (CNI mode): the same flags, checked
    instead of applied. It runs in the pod's namespace (the container's), as uid 1337."""
    return [*injector_capture_flags(pod.spec), "--run-validation", "--skip-rule-apply"]


def proxy_config_json(node: NodePlan, pod: PodPlan, defaults: Mapping[str, Any] | None = None) -> str:
    """`PROXY_CONFIG`: istiod at the node's gateway, plus node defaults and the pod's own fields."""
    config: dict[str, Any] = {"discoveryAddress": node.discovery_address,
                              "terminationDrainDuration": DEFAULT_TERMINATION_DRAIN}
    config.update(defaults or {})
    config.update(pod.spec.proxy_config)
    return json.dumps(config, sort_keys=True)


def agent_environment(node: NodePlan, pod: PodPlan, base: Mapping[str, str],
                      proxy_config_defaults: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The istio-proxy container's environment, as the injector sets it, for this node.

    `CA_ADDR` and `discoveryAddress` point at the control plane on the gateway address
    (`NodePlan.discovery_address`); since that is not a name on istiod's serving
    certificate, `ISTIOD_SAN` names the service.
    The agent runs as uid/gid 1337 (`AGENT_UID`), so Envoy runs as its user, as
    upstream's does: no `ISTIO_AGENT_ENVOY_UID`.
    """
    spec = pod.spec
    environment = {key: value for key, value in base.items() if key in ("PATH", "LANG", "LC_ALL", "TZ")}
    environment.update({
        "POD_NAME": spec.name,
        "POD_NAMESPACE": spec.namespace,
        "SERVICE_ACCOUNT": spec.service_account,
        "INSTANCE_IP": pod.ip,
        "ISTIO_META_CLUSTER_ID": "Kubernetes",
        "CA_ADDR": node.discovery_address,
        "ISTIOD_SAN": ISTIOD_SAN,
        "PROXY_CONFIG": proxy_config_json(node, pod, proxy_config_defaults),
        "HOME": "/tmp",
    })
    if spec.dns_capture:
        environment["ISTIO_META_DNS_CAPTURE"] = "true"
    environment.update(spec.agent_env)
    return environment


def agent_argv(pod: PodPlan, pilot_agent: str) -> list[str]:
    """`pilot-agent proxy sidecar` (or `router` for a gateway) with the injector's flags (one Envoy worker by
    default on a small node)."""
    kind = "router" if pod.spec.router else "sidecar"
    return [pilot_agent, "proxy", kind, "--domain", f"{pod.spec.namespace}.svc.cluster.local",
            "--proxyLogLevel", "warning", "--proxyComponentLogLevel", "misc:error",
            "--log_output_level", "default:info", "--concurrency", str(pod.spec.concurrency)]


def downward_api_text(values: Mapping[str, str]) -> str:
    """Labels/annotations as the downward API writes them: `key="value"` lines, sorted."""
    return "".join(f"{key}={json.dumps(str(values[key]))}\n" for key in sorted(values))


# istio-proxy env the CNI plugin reads from the pod (as upstream's does) to shape the capture.
_CAPTURE_ENV = ("INVALID_DROP", "ISTIO_DUAL_STACK")


def registry_workload(pod: PodPlan) -> dict[str, Any]:
    """One pod's `workloads:` entry: identity and planned IP, and what istiod-local's Kubernetes API needs to
    render it as Istio's injector would (its node, sidecar kind, who captures, its annotations, the
    istio-proxy env the CNI plugin reads), so that the plugin derives from the Pod the capture this plan
    would give istio-iptables."""
    spec = pod.spec
    entry: dict[str, Any] = {"name": pod.name, "namespace": spec.namespace, "serviceAccount": spec.service_account,
                             "labels": dict(spec.labels), "ip": pod.ip}
    if pod.node_name:
        entry["nodeName"] = pod.node_name
    entry["sidecar"] = ("proxyless" if spec.proxyless else "router" if spec.router else "envoy" if spec.sidecar
                        else "none")
    entry["captureInit"] = pod.capture
    if spec.annotations:
        entry["annotations"] = dict(spec.annotations)
    env = [{"name": "ISTIO_META_DNS_CAPTURE", "value": "true"}] if spec.dns_capture and not spec.proxyless else []
    env += [{"name": key, "value": spec.agent_env[key]} for key in _CAPTURE_ENV if key in spec.agent_env]
    if env:
        entry["pod"] = {"spec": {"containers": [{"name": "istio-proxy", "env": env}]}}
    return entry


def registry_workloads(pods: Iterable[PodPlan]) -> list[dict[str, Any]]:
    """The `workloads:` entries of istiod-local's registry for these pods (`registry_workload`)."""
    return [registry_workload(p) for p in pods]
