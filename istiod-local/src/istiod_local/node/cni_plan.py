"""The local node's CNI side as data: its directories, primary network, install-cni's command line, each pod's
CNI invocation and the status a kubelet would report (no I/O here; `cni_node.py` runs it).

In CNI capture mode the node behaves as a Kubernetes node with the Istio CNI
node agent: its container runtime builds every pod's network through a CNI
chain (loopback on `lo`, then the primary network on `eth0`), and
`install-cni`, running on the node, has appended the `istio-cni` plugin to
that primary network. Everything lives under the node's runtime directory
(`<runtime>/cni/`, removed on teardown), never in /etc/cni or /var/lib/cni:

- `net.d/10-local-node.conflist`: the primary network, Debian's `bridge`
  plugin on the node's bridge (`isGateway`: the pod's default route goes via
  the gateway address, which the node's bridge already holds so that
  istiod-local can bind it before any pod exists) with `host-local` IPAM for
  the pod CIDR, its `dataDir` here too; pods' planned addresses are passed as
  the `ips` capability. install-cni merges its `istio-cni` entry into it.
- `bin/`: where install-cni installs the plugin (CNI_PATH is this, then
  `/usr/lib/cni` for Debian's plugins).
- `cache/`: the CNI runtime's result cache; `ipam/`: host-local's leases;
  `run/`: install-cni's `--cni-agent-run-dir` (its log socket);
  `istio-cni-sa/`: the service-account directory install-cni reads (token,
  ca.crt, namespace), from `istiod-local kubeconfig --identity
  istio-system/istio-cni`.

istiod-local serves its Kubernetes API on the gateway address
(`<gateway>:6443`), which is what `KUBERNETES_SERVICE_HOST`/`PORT` name for
install-cni and what the plugin's kubeconfig then points at.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from istiod_local.node.cni_runtime import RuntimeConf
from istiod_local.node.plan import NodePlan, PodPlan

CNI_VERSION = "1.0.0"  # what Debian's containernetworking-plugins (1.1) speak at most
NETWORK_NAME = "local-node"
CONFLIST_NAME = "10-local-node.conflist"
SYSTEM_CNI_BIN = Path("/usr/lib/cni")
KUBE_API_PORT = 6443
INSTALL_CNI_READY_PORT = 8000  # upstream's fixed readiness port
# Not upstream's 15014: istiod-local, in the same node namespace here (not a pod of its own), has that one.
INSTALL_CNI_MONITORING_PORT = 15015
CNI_IDENTITY = "istio-system/istio-cni"
DEFAULT_EXCLUDED_NAMESPACES = ("kube-system",)  # the istio-cni chart's default
VALIDATION_CONTAINER = "istio-validation"
VALIDATION_FAILED = 126  # what istio-iptables --run-validation exits with when capture is missing
# What install-cni's repair controller does to a pod whose validation failed: repair it in place (the istio-cni
# chart's default), label it, delete it, or nothing.
REPAIR_MODES = ("repair", "label", "delete", "off")
# In-place repair finds pods' network namespaces through the host's procfs: install-cni runs in the host's PID
# namespace here, so that is /proc (upstream's DaemonSet mounts it at /host/proc).
HOST_PROC = "/proc"
UPSTREAM_HOST_PROC = "/host/proc"
NETWORK_CONFIG_SUFFIXES = (".conf", ".conflist", ".json")
# Upstream's install-cni reads fixed paths of its image and DaemonSet: the plugin it installs from
# /opt/cni/bin, into the host's /opt/cni/bin mounted at /host/opt/cni/bin, and its service account at
# the in-cluster path. The node gives it those in a mount namespace of its own (`upstream_install_cni_mounts`).
UPSTREAM_PLUGIN_SOURCE = "/opt/cni/bin"
UPSTREAM_PLUGIN_TARGET = "/host/opt/cni/bin"
SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
UPSTREAM_MOUNT_TARGETS = (UPSTREAM_PLUGIN_SOURCE, UPSTREAM_PLUGIN_TARGET, SERVICE_ACCOUNT_PATH)


@dataclass(frozen=True)
class CniPaths:
    """The node's CNI directories under its runtime directory."""

    root: Path

    @property
    def net_dir(self) -> Path:
        return self.root / "net.d"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def ipam_dir(self) -> Path:
        return self.root / "ipam"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def service_account_dir(self) -> Path:
        return self.root / "istio-cni-sa"

    @property
    def kubeconfig(self) -> Path:
        """The node's own kubeconfig (the kubelet's, in a cluster): reads pods, reports their status."""
        return self.root / "node.kubeconfig"

    @property
    def node_service_account_dir(self) -> Path:
        return self.root / "node-sa"

    @property
    def log_socket(self) -> Path:
        return self.run_dir / "log.sock"

    @property
    def conflist(self) -> Path:
        return self.net_dir / CONFLIST_NAME

    @property
    def upstream_image_bin(self) -> Path:
        """What upstream's install-cni sees as its image's /opt/cni/bin: one empty file, `istio-cni`, onto which
        upstream's plugin is bound in its mount namespace."""
        return self.root / "upstream-image-bin"

    def directories(self) -> list[Path]:
        return [self.root, self.net_dir, self.bin_dir, self.cache_dir, self.ipam_dir, self.run_dir]


def kube_api_addr(node: NodePlan) -> str:
    return f"{node.gateway}:{KUBE_API_PORT}"


def primary_conflist(node: NodePlan, ipam_dir: Path) -> dict[str, Any]:
    """The node's primary network: bridge + host-local for the pod CIDR, leases kept in `ipam_dir`."""
    return {
        "cniVersion": CNI_VERSION,
        "name": NETWORK_NAME,
        "plugins": [{
            "type": "bridge",
            "bridge": node.bridge,
            "isGateway": True,
            "ipMasq": False,
            "hairpinMode": False,
            "capabilities": {"ips": True},
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": str(node.network), "gateway": node.gateway}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(ipam_dir),
            },
        }],
    }


def pick_network_file(names: Sequence[str]) -> str | None:
    """The network configuration a container runtime uses: the lexically first `.conf`/`.conflist`/`.json`."""
    candidates = sorted(n for n in names if n.endswith(NETWORK_CONFIG_SUFFIXES) and not n.startswith("."))
    return candidates[0] if candidates else None


def container_id(pod: PodPlan, generation: int) -> str:
    """The pod sandbox's id as a container runtime makes one (64 hex digits), new for each incarnation."""
    return hashlib.sha256(f"{pod.netns}/{generation}".encode()).hexdigest()


def pod_cni_args(pod: PodPlan, sandbox_id: str) -> tuple[tuple[str, str], ...]:
    """`CNI_ARGS` as the kubelet's runtime passes them (IgnoreUnknown, so plugins not knowing K8S_* accept it)."""
    return (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", pod.spec.namespace), ("K8S_POD_NAME", pod.name),
            ("K8S_POD_INFRA_CONTAINER_ID", sandbox_id))


def pod_attachment(pod: PodPlan, sandbox_id: str) -> RuntimeConf:
    """The pod's `eth0` on the primary network, its planned address asked for through the `ips` capability."""
    return RuntimeConf(sandbox_id, pod.netns_path(), pod.pod_veth, pod_cni_args(pod, sandbox_id),
                       {"ips": [f"{pod.ip}/{pod.prefix_len}"]})


def sandbox_argv(pod: PodPlan) -> list[str]:
    """The pod sandbox's process, what a pause container is: it holds the pod's network namespace for as long as
    the pod lives, so the namespace has a process even while no container runs (a pod whose init container
    keeps failing). In-place repair finds a pod's namespace through its processes, as on a Kubernetes node.
    No death signal: it is killed with its namespace (`remove_netns`, and the sweep of a dead owner's)."""
    return ["ip", "netns", "exec", pod.netns, "sleep", "infinity"]


def loopback_attachment(pod: PodPlan, sandbox_id: str) -> RuntimeConf:
    return RuntimeConf(sandbox_id, pod.netns_path(), "lo", pod_cni_args(pod, sandbox_id))


def result_address(result: Mapping[str, Any]) -> str:
    """The first IPv4 address (no prefix) of a CNI result, or ""."""
    for entry in result.get("ips") or []:
        address = str(entry.get("address", "")).split("/")[0] if isinstance(entry, dict) else ""
        try:
            if ipaddress.ip_address(address).version == 4:
                return address
        except ValueError:
            continue
    return ""


def host_veth(result: Mapping[str, Any], bridge: str) -> str:
    """The node-side end of the pod's veth, from the bridge plugin's result (an interface with no sandbox)."""
    for entry in result.get("interfaces") or []:
        if isinstance(entry, dict) and not entry.get("sandbox") and entry.get("name") not in (None, "", bridge):
            return str(entry["name"])
    return ""


def install_cni_argv(install_cni: str, paths: CniPaths, repair: str,
                     excluded_namespaces: Sequence[str] = DEFAULT_EXCLUDED_NAMESPACES) -> list[str]:
    """install-cni as the istio-cni DaemonSet runs it, against this node's directories.

    Chained into the node's primary network; repair watching this node's pods and repairing in place (the
    host's /proc is this one), labelling or deleting those whose validation failed.
    """
    if repair not in REPAIR_MODES:
        raise ValueError(f"cni repair {repair!r}: one of {', '.join(REPAIR_MODES)}")
    argv = [install_cni,
            "--mounted-cni-net-dir", str(paths.net_dir),
            "--cni-bin-dir", str(paths.bin_dir),
            "--service-account-dir", str(paths.service_account_dir),
            "--cni-agent-run-dir", str(paths.run_dir),
            "--log-uds-socket", str(paths.log_socket),
            "--chained-cni-plugin=true",
            "--exclude-namespaces", ",".join(excluded_namespaces),
            "--monitoring-port", str(INSTALL_CNI_MONITORING_PORT),
            f"--repair-enabled={'false' if repair == 'off' else 'true'}"]
    if repair != "off":
        argv += _repair_mode_flags(repair)
    if repair == "repair":
        argv += ["--repair-host-proc-dir", HOST_PROC]
    return argv


def _repair_mode_flags(repair: str) -> list[str]:
    return [f"--repair-label-pods={'true' if repair == 'label' else 'false'}",
            f"--repair-delete-pods={'true' if repair == 'delete' else 'false'}"]


def upstream_install_cni_argv(install_cni: str, paths: CniPaths, repair: str) -> list[str]:
    """Upstream's install-cni as the istio-cni DaemonSet runs it: the same choices as `install_cni_argv`, in the
    flags it has (its plugin and service-account paths are its image's, see `upstream_install_cni_mounts`; its
    log socket is `<run dir>/log.sock`; the excluded namespaces come from EXCLUDE_NAMESPACES)."""
    if repair not in REPAIR_MODES:
        raise ValueError(f"cni repair {repair!r}: one of {', '.join(REPAIR_MODES)}")
    argv = [install_cni,
            "--mounted-cni-net-dir", str(paths.net_dir),
            "--cni-agent-run-dir", str(paths.run_dir),
            "--chained-cni-plugin=true",
            "--monitoring-port", str(INSTALL_CNI_MONITORING_PORT),
            f"--repair-enabled={'false' if repair == 'off' else 'true'}"]
    if repair != "off":
        argv += _repair_mode_flags(repair)
    return argv


def repair_environment(repair: str) -> dict[str, str]:
    """In-place repair is REPAIR_REPAIR_PODS, which upstream's install-cni reads from the environment only (ours
    reads it too, and has the flag); "false" for the other modes, whatever the caller's environment says."""
    return {"REPAIR_REPAIR_PODS": "true" if repair == "repair" else "false"}


def upstream_install_cni_mounts(paths: CniPaths, istio_cni: str, repair: str = "label") -> list[tuple[str, str]]:
    """(host path, container path) binds, in order, that give upstream's install-cni its image and volumes: the
    plugin at /opt/cni/bin/istio-cni (the only file there), the node's CNI bin directory as the host's, the
    service-account directory at the in-cluster path, and for in-place repair the host's /proc at /host/proc
    (the chart's `cni-host-procfs` volume)."""
    mounts = [(str(paths.upstream_image_bin), UPSTREAM_PLUGIN_SOURCE),
              (istio_cni, f"{UPSTREAM_PLUGIN_SOURCE}/istio-cni"),
              (str(paths.bin_dir), UPSTREAM_PLUGIN_TARGET),
              (str(paths.service_account_dir), SERVICE_ACCOUNT_PATH)]
    return [*mounts, (HOST_PROC, UPSTREAM_HOST_PROC)] if repair == "repair" else mounts


def upstream_mount_targets(repair: str) -> tuple[str, ...]:
    """The mount points upstream's install-cni needs on the host (created empty when missing)."""
    return (*UPSTREAM_MOUNT_TARGETS, UPSTREAM_HOST_PROC) if repair == "repair" else UPSTREAM_MOUNT_TARGETS


def install_cni_environment(node: NodePlan, base: Mapping[str, str]) -> dict[str, str]:
    """The DaemonSet's environment: the API's in-cluster address (the gateway) and this node's name."""
    environment = {key: value for key, value in base.items() if key in ("PATH", "LANG", "LC_ALL", "TZ")}
    environment.update({"KUBERNETES_SERVICE_HOST": node.gateway, "KUBERNETES_SERVICE_PORT": str(KUBE_API_PORT),
                        "KUBERNETES_NODE_NAME": node.name, "HOME": "/tmp"})
    return environment


_STATES = ("waiting", "running", "terminated")


def _state(kind: str = "", value: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A container state with the other two kinds set to null: a kubelet's patch replaces the state it had
    (a strategic merge patch would otherwise keep, say, an earlier `terminated` beside the new `waiting`)."""
    state: dict[str, Any] = dict.fromkeys(_STATES)
    if kind:
        state[kind] = dict(value or {})
    return state


def _terminated(code: int, at: str, message: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                             "startedAt": at, "finishedAt": at}
    if message:
        state["message"] = message
    return _state("terminated", state)


def validation_status(codes: Sequence[int], at: str, message: str = "") -> dict[str, Any]:
    """The istio-validation init container's status after its runs (exit codes, first to last), as a kubelet
    reports it: the last run as the state, the one before as `lastState` (a failed init container is
    restarted: while it keeps failing, the kubelet shows CrashLoopBackOff with the last termination)."""
    if not codes:
        raise ValueError("validation_status needs at least one run")
    last = codes[-1]
    status: dict[str, Any] = {"name": VALIDATION_CONTAINER, "ready": last == 0, "restartCount": len(codes) - 1,
                              "started": False, "lastState": _state()}
    if last == 0:
        status["state"] = _terminated(0, at)
    elif len(codes) > 1:
        status["state"] = _state("waiting", {
            "reason": "CrashLoopBackOff", "message": f"back-off restarting failed container {VALIDATION_CONTAINER}"})
    else:
        status["state"] = _terminated(last, at, message)
    if len(codes) > 1:
        status["lastState"] = _terminated(codes[-2] if last == 0 else last, at, message)
    return status


def pod_status_patch(address: str, host_ip: str, init: Sequence[Mapping[str, Any]],
                     running: Sequence[str], waiting: Sequence[str], at: str) -> dict[str, Any]:
    """The body of a kubelet's PATCH of `pods/{name}/status` (strategic merge): phase, addresses, init
    container statuses and the containers' (`running` started, `waiting` held back by a failed init)."""
    initialized = all(s.get("ready") for s in init)
    containers = [{"name": name, "ready": True, "started": True, "restartCount": 0, "lastState": _state(),
                   "state": _state("running", {"startedAt": at})} for name in running]
    containers += [{"name": name, "ready": False, "started": False, "restartCount": 0, "lastState": _state(),
                    "state": _state("waiting", {"reason": "PodInitializing"})} for name in waiting]
    ready = initialized and not waiting

    def condition(kind: str, ok: bool) -> dict[str, Any]:
        return {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None, "lastTransitionTime": at}

    status: dict[str, Any] = {
        "phase": "Running" if initialized else "Pending",
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": address, "podIPs": [{"ip": address}] if address else [],
        "conditions": [condition("Initialized", initialized), condition("Ready", ready),
                       condition("ContainersReady", ready), condition("PodScheduled", True)],
        "containerStatuses": containers,
    }
    if init:
        status["initContainerStatuses"] = [dict(s) for s in init]
    return {"status": status}
