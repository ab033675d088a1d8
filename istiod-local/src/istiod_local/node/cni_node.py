"""The local node's CNI side at work: install-cni as its node agent, pods' networks through the CNI chain,
the istio-validation init container, and pod status reported to the Kubernetes API as a kubelet does.

`NodeCni` is what `LocalNode` uses in CNI capture mode (see `cni_plan.py` for
the layout and the reasons):

- `prepare()` makes `<runtime>/cni/` and writes the primary conflist;
- `start_agent()` (once istiod-local serves its API) writes the service-account
  directory and the node's kubeconfig with `istiod-local kubeconfig`, starts
  `install-cni` in the node namespace and waits for its `/readyz`: from then on
  the conflist holds the `istio-cni` entry and sidecar pods may be created;
- `add(pod)` runs loopback, then the network configuration a container runtime
  would pick from the net dir (the lexically first file), with the pod's
  `CNI_ARGS` and planned address; `delete()` runs DEL through the same lists
  in reverse, releasing the address;
- `start_sandbox(pod)` starts the pod's sandbox process (a pause container's
  part: it holds the namespace, so in-place repair finds it through /proc);
- `validate(pod)` runs the pod's `istio-validation` init container
  (`pilot-agent istio-iptables --run-validation --skip-rule-apply`, uid 1337,
  in the pod namespace), once more when it fails as a kubelet restarts a
  failed init container, and `report()` PATCHes `pods/{name}/status`;
- `stop_agent()` sends install-cni SIGTERM so its cleanup removes our entry,
  the plugin's kubeconfig and the binary.

With `upstream` (`NodeOptions.cni="upstream"`) the node agent is upstream's
Go install-cni, which installs upstream's Go istio-cni plugin: same
directories, API and chain; it runs as root in its own mount namespace
where the paths of its image and DaemonSet are bound (`/opt/cni/bin`
holding only the plugin, `/host/opt/cni/bin`, the service account's
in-cluster path; `cni_plan.upstream_install_cni_mounts`), on mount points
created on the host if missing and removed by `release()`, as proxyless
pods' are.

The API lives on the gateway address inside the node namespace, out of the
host namespace's reach: `KubeApi` (the product's builtins-only client,
`istio_agent.kube.client`) opens each connection from a short-lived thread
that has entered the node namespace (a network namespace is per thread; the
socket keeps it), then speaks HTTPS with the kubeconfig's CA and token from
the calling thread.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from istio_agent.capture.netns import enter_netns
from istio_agent.kube import client as kube
from istiod_local.node import proxyless
from istiod_local.node.cni_plan import (
    CNI_IDENTITY,
    DEFAULT_EXCLUDED_NAMESPACES,
    INSTALL_CNI_READY_PORT,
    SYSTEM_CNI_BIN,
    CniPaths,
    container_id,
    host_veth,
    install_cni_argv,
    install_cni_environment,
    kube_api_addr,
    loopback_attachment,
    pick_network_file,
    pod_attachment,
    pod_status_patch,
    primary_conflist,
    repair_environment,
    result_address,
    sandbox_argv,
    upstream_install_cni_argv,
    upstream_install_cni_mounts,
    upstream_mount_targets,
    validation_status,
)
from istiod_local.node.cni_runtime import (
    CniConfigError,
    CniExecError,
    CniRuntime,
    NetworkList,
    RuntimeConf,
    load_network_file,
    loopback_network,
)
from istiod_local.node.mountpoints import MountPoints
from istiod_local.node.plan import NodePlan, PodPlan, in_netns
from istiod_local.node.processes import NetnsProcess, NodeError, run_ip, spawn
from istiod_local.node.upstream import UpstreamCommands


class KubeApiError(NodeError):
    """A request to istiod-local's Kubernetes API failed (status and the API's message)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def connect_in_netns(netns_path: str, host: str, port: int, timeout: float) -> Any:
    """A TCP connection opened inside another network namespace (by a thread that entered it)."""
    import socket

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            enter_netns(netns_path)
            outcome["socket"] = socket.create_connection((host, port), timeout)
        except OSError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="netns-connect", daemon=True)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["socket"]


class KubeApi:
    """The node's client for the API (the kubelet's): GET a pod, PATCH its status.

    The product's builtins-only client (`istio_agent.kube.client`) with the kubeconfig's server, CA and token,
    each connection opened from inside the node's network namespace.
    """

    def __init__(self, config: kube.KubeConfig, netns_path: str, timeout: float = 10.0) -> None:
        self.config = config
        self.netns_path = netns_path
        self.timeout = timeout
        self._tls = kube.tls_context(config) if config.scheme == "https" else None

    @property
    def server(self) -> str:
        return f"{self.config.scheme}://{self.config.host}:{self.config.port}"

    def _connect(self, host: str, port: int, timeout: float) -> Any:
        return connect_in_netns(self.netns_path, host, port, timeout)

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None,
                content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        try:
            status, text = kube.request(self.config, method, path, data, content_type,
                                        self.timeout, self._connect, self._tls, user_agent="istiod-local-node")
        except kube.ApiError as exc:
            raise KubeApiError(f"{method} {self.server}{path}: {exc}") from None
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            payload = {"message": text.decode(errors="replace")[:500]}
        return status, payload if isinstance(payload, dict) else {}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, pod = self.request("GET", kube.pod_path(self.config, namespace, name))
        if status == 404:
            return None
        if status != 200:
            raise KubeApiError(f"GET pod {namespace}/{name}: {status} {pod.get('message', '')}", status)
        return pod

    def patch_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        path = kube.pod_path(self.config, namespace, name) + "/status"
        status, pod = self.request("PATCH", path, body, "application/strategic-merge-patch+json")
        if status != 200:
            raise KubeApiError(f"PATCH pod {namespace}/{name}/status: {status} {pod.get('message', '')}", status)
        return pod


def read_kubeconfig(path: Path) -> kube.KubeConfig:
    """The current context's server, CA and token of a kubeconfig (as the product's client reads one)."""
    try:
        return kube.load_kubeconfig(str(path))
    except (OSError, kube.KubeconfigError) as exc:
        raise NodeError(f"kubeconfig {path}: {exc!r}") from None


@dataclass
class Attachment:
    """A pod's networks as the chain made them: what DEL needs, and what the node learnt."""

    sandbox_id: str
    networks: list[tuple[NetworkList, RuntimeConf]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    address: str = ""
    node_veth: str = ""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class NodeCni:
    """install-cni, the CNI runtime and the API client of one node in CNI capture mode."""

    def __init__(self, node: NodePlan, runtime_path: Path, bin_dir: Path, logs: Path, istiod_state: Path,
                 base_env: Mapping[str, str], repair: str = "repair", ready_timeout: float = 60.0,
                 plugin_timeout: float = 60.0, upstream: UpstreamCommands | None = None) -> None:
        self.node = node
        self.upstream = upstream  # upstream's install-cni and istio-cni in place of ours
        self._mountpoints = MountPoints(upstream_mount_targets(repair), f"{node.owner}-{node.index}-cni")
        self.paths = CniPaths(runtime_path / "cni")
        self.bin_dir = bin_dir
        self.logs = logs
        self.istiod_state = istiod_state
        self.base_env = {key: value for key, value in base_env.items() if key in ("PATH", "LANG", "LC_ALL")}
        self.repair = repair
        self.ready_timeout = ready_timeout
        self.runtime = CniRuntime([self.paths.bin_dir, SYSTEM_CNI_BIN], self.paths.cache_dir, node.netns_path(),
                                  self.base_env, plugin_timeout)
        self.agent: NetnsProcess | None = None
        self.agent_exit: int | None = None  # install-cni's exit status once stopped
        self.conflist_written = b""  # the primary conflist as the node wrote it
        self.conflist_at_stop = b""  # and as install-cni's SIGTERM cleanup left it
        self.plugin_left_at_stop = False
        self.status_errors: list[str] = []  # status PATCHes the API refused or missed (also in logs/kubelet.log)
        self.api: KubeApi | None = None
        self._generations = itertools.count(1)  # sandbox incarnations; `add` may run in several threads at once

    # ---- the node's network and its agent

    def prepare(self) -> None:
        """The CNI directories and the primary network (before any pod or agent)."""
        for folder in self.paths.directories():
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.upstream is not None:
            missing = self.upstream.missing("install-cni", "istio-cni")
            if missing:
                raise NodeError(f"the node's CNI agent is to be upstream's: {missing}")
            self.paths.upstream_image_bin.mkdir(mode=0o700, exist_ok=True)
            (self.paths.upstream_image_bin / "istio-cni").touch(mode=0o755)  # upstream's plugin is bound on it
            self._mountpoints.acquire()
        conflist = primary_conflist(self.node, self.paths.ipam_dir)
        partial = self.paths.net_dir / f".{self.paths.conflist.name}.partial"
        self.conflist_written = (json.dumps(conflist, indent=2) + "\n").encode()
        partial.write_bytes(self.conflist_written)
        partial.chmod(0o644)
        partial.replace(self.paths.conflist)

    def start_agent(self) -> NetnsProcess:
        """Credentials from istiod-local, then install-cni in the node namespace; returns once it is ready."""
        if self.agent is not None and self.agent.running():
            return self.agent
        istiod_local = str(self.bin_dir / "istiod-local")
        server = f"https://{kube_api_addr(self.node)}"
        run_ip([istiod_local, "kubeconfig", "--state-dir", str(self.istiod_state), "--out",
                str(self.paths.root / "istio-cni.kubeconfig"), "--service-account-dir",
                str(self.paths.service_account_dir), "--server", server, "--identity", CNI_IDENTITY], timeout=60)
        run_ip([istiod_local, "kubeconfig", "--state-dir", str(self.istiod_state), "--out",
                str(self.paths.kubeconfig), "--service-account-dir", str(self.paths.node_service_account_dir),
                "--server", server], timeout=60)
        self.api = KubeApi(read_kubeconfig(self.paths.kubeconfig), self.node.netns_path())
        env = {**install_cni_environment(self.node, self.base_env), **repair_environment(self.repair)}
        if self.upstream is None:
            argv = install_cni_argv(str(self.bin_dir / "install-cni"), self.paths, self.repair)
        else:
            argv = upstream_install_cni_argv(str(self.upstream.install_cni), self.paths, self.repair)
            env["EXCLUDE_NAMESPACES"] = ",".join(DEFAULT_EXCLUDED_NAMESPACES)
        argv += ["--repair-node-name", self.node.name] if self.repair != "off" else []
        if self.upstream is None:
            command = in_netns(self.node.netns, argv)
        else:
            mounts = upstream_install_cni_mounts(self.paths, str(self.upstream.istio_cni), self.repair)
            command = proxyless.in_container(self.node.netns, mounts, argv)
        self.agent = spawn("install-cni", command, self.logs / "install-cni.log", env=env)
        self.wait_agent_ready()
        return self.agent

    def agent_ready(self) -> bool:
        """install-cni's `/readyz` (200 once installed and while our entry holds)."""
        target = kube.KubeConfig("http", self.node.gateway, INSTALL_CNI_READY_PORT)
        try:
            status, _ = kube.request(target, "GET", "/readyz", timeout=2.0, user_agent="istiod-local-node",
                                     connect=lambda host, port, timeout: connect_in_netns(
                                         self.node.netns_path(), host, port, timeout))
        except kube.ApiError:
            return False
        return status == 200

    def wait_agent_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not self.agent_ready():
            if self.agent is None or not self.agent.running():
                raise NodeError(f"install-cni is not running: {self.agent.describe_exit() if self.agent else ''}")
            if time.monotonic() > deadline:
                raise NodeError(f"timed out after {self.ready_timeout:.0f}s waiting for install-cni's /readyz; "
                                f"its log:\n{self.agent.describe_exit()}")
            time.sleep(0.05)

    def wait_api(self, timeout: float) -> None:
        """Until the API answers (after an istiod-local restart): any HTTP status will do."""
        if self.api is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api.request("GET", "/version")
                return
            except KubeApiError as exc:
                if time.monotonic() > deadline:
                    raise NodeError(f"timed out after {timeout:.0f}s waiting for the Kubernetes API: {exc}") from None
            time.sleep(0.05)

    def stop_agent(self, grace: float) -> int | None:
        """SIGTERM: install-cni removes our conflist entry, the plugin's kubeconfig and the binary."""
        if self.agent is None:
            return None
        self.agent_exit = self.agent.stop(grace)
        self.agent = None
        try:  # what its cleanup left, for whoever checks it before the runtime directory goes
            self.conflist_at_stop = self.paths.conflist.read_bytes()
        except OSError:
            self.conflist_at_stop = b""
        self.plugin_left_at_stop = (self.paths.bin_dir / "istio-cni").exists()
        return self.agent_exit

    def release(self) -> None:
        """Give back the host mount points upstream's install-cni used (after it stopped)."""
        self._mountpoints.release()

    # ---- pods

    def wait_in_api(self, pod: PodPlan, timeout: float) -> dict[str, Any] | None:
        """The pod as the API serves it, waiting for the registry to list it (a kubelet only runs pods the API
        has); None when the node has no API yet (install-cni not started: nothing in the chain asks)."""
        if self.api is None:
            return None
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = self.api.get_pod(pod.spec.namespace, pod.name)
            except KubeApiError as exc:
                found, error = None, str(exc)
            else:
                error = "not found"
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise NodeError(f"pod {pod.spec.namespace}/{pod.name} is not in istiod-local's Kubernetes API "
                                f"({error}): list it in the registry (plan.registry_workloads) before adding it")
            time.sleep(0.1)

    def start_sandbox(self, pod: PodPlan) -> NetnsProcess:
        """The pod's sandbox process in its (new) namespace, before its networks are attached."""
        return spawn(f"{pod.name} sandbox", sandbox_argv(pod), self.logs / f"{pod.name}-sandbox.log")

    def primary_network(self) -> NetworkList:
        """The network a container runtime uses: the lexically first configuration in the net dir."""
        try:
            names = [entry.name for entry in self.paths.net_dir.iterdir()]
        except OSError as exc:
            raise NodeError(f"reading {self.paths.net_dir}: {exc}") from None
        chosen = pick_network_file(names)
        if chosen is None:
            raise NodeError(f"no network configuration in {self.paths.net_dir}")
        try:
            return load_network_file(self.paths.net_dir / chosen)
        except CniConfigError as exc:
            raise NodeError(str(exc)) from None

    def add(self, pod: PodPlan) -> Attachment:
        """The pod's networks through the chain: loopback on `lo`, then the primary network on `eth0`.

        On failure the attachments made so far are deleted again (as a runtime
        tears a failed sandbox down) and NodeError names the plugin's error.
        """
        attachment = Attachment(container_id(pod, next(self._generations)))
        steps = [(loopback_network(), loopback_attachment(pod, attachment.sandbox_id)),
                 (self.primary_network(), pod_attachment(pod, attachment.sandbox_id))]
        try:
            for network, runtime in steps:
                result = self.runtime.add(network, runtime)
                attachment.networks.append((network, runtime))
                attachment.results.append(result)
        except (CniExecError, CniConfigError) as exc:
            failed = steps[len(attachment.networks)]
            attachment.networks.append(failed)  # DEL of the failed one too: its plugins may hold an address
            self.delete(attachment, strict=False)
            raise NodeError(f"CNI ADD for pod {pod.name}: {exc}") from exc
        attachment.address = result_address(attachment.results[-1])
        attachment.node_veth = host_veth(attachment.results[-1], self.node.bridge)
        if attachment.address and attachment.address != pod.ip:
            self.delete(attachment, strict=False)
            raise NodeError(f"CNI ADD for pod {pod.name} gave {attachment.address}, not the planned {pod.ip}")
        return attachment

    def check(self, attachment: Attachment) -> None:
        """CHECK through each network with its cached result (what a runtime asks of a running pod)."""
        for network, runtime in attachment.networks:
            try:
                self.runtime.check(network, runtime)
            except (CniExecError, CniConfigError) as exc:
                raise NodeError(f"CNI CHECK of {runtime.netns}: {exc}") from exc

    def delete(self, attachment: Attachment, strict: bool = True) -> list[str]:
        """DEL through each network in reverse order (releases the address); the problems met, if not strict."""
        problems = []
        for network, runtime in reversed(attachment.networks):
            try:
                self.runtime.delete(network, runtime)
            except (CniExecError, CniConfigError) as exc:
                if strict:
                    raise NodeError(f"CNI DEL of {runtime.netns}: {exc}") from exc
                problems.append(str(exc))
        attachment.networks.clear()
        return problems

    def validate(self, pod: PodPlan, argv: Sequence[str], attempts: int = 2) -> list[int]:
        """Run istio-validation (`argv`: its container's command, uid 1337 in the pod namespace) until it passes
        or `attempts` runs failed, as a kubelet restarts a failed init container; the exit codes, in order."""
        log = self.logs / f"{pod.name}-validation.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        codes = []
        for _ in range(attempts):
            with log.open("ab") as out:
                try:
                    done = subprocess.run(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, timeout=60, cwd="/",
                                          env={**self.base_env, "HOME": "/tmp"})
                except (OSError, subprocess.TimeoutExpired) as exc:
                    raise NodeError(f"istio-validation for pod {pod.name}: {exc}") from None
            codes.append(done.returncode)
            if done.returncode == 0:
                break
        return codes

    def report(self, pod: PodPlan, address: str, validation: Sequence[int], running: Sequence[str],
               waiting: Sequence[str], message: str = "") -> None:
        """PATCH the pod's status as its kubelet: init container runs, containers, phase and address."""
        if self.api is None:
            return
        at = _now()
        init = [validation_status(validation, at, message)] if validation else []
        body = pod_status_patch(address, self.node.gateway, init, running, waiting, at)
        try:
            self.api.patch_status(pod.spec.namespace, pod.name, body)
        except KubeApiError as exc:  # a kubelet never fails a pod over a status update: it is noted, not raised
            self.status_errors.append(str(exc))
            with (self.logs / "kubelet.log").open("a") as log:
                log.write(f"{at} status of pod {pod.spec.namespace}/{pod.name} not reported: {exc}\n")
