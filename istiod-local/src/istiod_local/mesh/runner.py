"""`istiod-local up`: bring a mesh file up on a local node, keep it in step with the file, check it.

The I/O edge of the package: `parser`, `planner` and `expect` decide, this
runs. Start: the run lock (`lock.py`), a `LocalNode` (CNI or istio-init
capture; `create()` sweeps what killed runs left), the registry from the
plan, istiod-local, every pod through `LocalNode.add_pods`, then waiting for
every sidecar's `/healthz/ready` and every server app's port. While running
it polls the mesh file once a second: a good new version is re-planned and
applied (pods whose spec changed or that are gone are removed, the registry
rewritten without them, new pods placed, the registry rewritten with them,
then they are started: what a Deployment controller and kubelet do in
turn); a bad one is reported with its line and field and the last good mesh
keeps running. Every 10 s it logs the background traffic the client apps
report. Ctrl-C/SIGTERM (raised as KeyboardInterrupt by the command) tears
everything down through `LocalNode.close()`. The Wasm modules the file names
(`wasmModules:`) are built into `<dir>/wasm/` and served from the node's
namespace (`wasmfiles.py`) before the first pod starts; an edited module is
rebuilt on the same poll.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import json
import os
import queue
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from istiod_local.controlplane.xds.yamlfields import RegistryError
from istiod_local.mesh import wasmfiles
from istiod_local.mesh.checking import CheckResult, MeshCheck
from istiod_local.mesh.istioconfig import refusal
from istiod_local.mesh.istiofiles import IstioFilesError, files_signature, read_istio_config
from istiod_local.mesh.lock import RunLock
from istiod_local.mesh.model import Mesh
from istiod_local.mesh.parser import parse_mesh
from istiod_local.mesh.planner import (
    CapacityError,
    MeshPlan,
    check_capacity,
    plan_mesh,
    registry_document,
)
from istiod_local.mesh.wasmfiles import ModuleServer, WasmModuleError, base_url, build
from istiod_local.mesh.wasmplugins import check_embedded, unserved
from istiod_local.meshview import STATS_INCLUSION_SUFFIXES, MeshEvent, ViewTarget
from istiod_local.node.istiod_userconfig import Rejection, UserResource
from istiod_local.node.local_node import LocalNode, NodeOptions, Pod
from istiod_local.node.plan import ISTIOD_LOCAL, PlanError, PodPlan, PodSpec
from istiod_local.node.processes import NodeError
from istiod_local.node.proxyless import OUTPUT_CERTS
from istiod_local.node.upstream import UPSTREAM, UpstreamCommands, upstream_commands

# Istio's default stats inclusion list leaves out what the check and the live view read: TLS handshakes,
# and the per-cluster request counters and latency histograms the request rates come from.
MESH_PROXY_CONFIG: dict[str, Any] = {"proxyStatsMatcher": {"inclusionSuffixes": [
    "ssl.handshake", *STATS_INCLUSION_SUFFIXES]}}
MONITORING_PORT = 15014  # istiod's monitoring port, where the live view reads istiod-local
TRAFFIC_LOG_EVERY = 10.0


class MeshFileError(RuntimeError):
    """The mesh file cannot be read or parsed (the message names the line and field)."""


def load_mesh(path: Path, upstream: UpstreamCommands | None = None, control_plane: str = ISTIOD_LOCAL,
              gateway: str = "") -> Mesh:
    """The mesh file parsed, with the Istio config it names; with `upstream`, refused when a deployment asks
    for upstream's agent and it is not installed there (before anything is built, or, for an edit, instead of
    applying it). On the embedded control plane, Istio config it does not apply and gateways are refused.
    With the node's `gateway`, a WasmPlugin naming the node's module server must name a module it serves."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MeshFileError(f"{path}: {exc}") from None
    try:
        mesh = read_istio_config(path, parse_mesh(text, str(path)))
    except (RegistryError, IstioFilesError) as exc:
        raise MeshFileError(str(exc)) from None
    if control_plane == ISTIOD_LOCAL:
        refused = refusal(mesh.istio_config)
        gateways = [d.name for d in mesh.deployments if d.mode == "gateway"]
        if gateways:
            refused += ("; " if refused else "") + (
                f"gateway deployments ({', '.join(gateways)}) are programmed by Gateway and VirtualService "
                "resources, which only the real istiod applies: run `istiod-local up --control-plane istiod`")
        if refused:
            raise MeshFileError(f"{path}: {refused}")
        try:
            check_embedded(mesh.istio_config)
        except RegistryError as exc:
            raise MeshFileError(str(exc)) from None
    if gateway:
        served = [wasmfiles.served_name(entry) for entry in mesh.wasm_modules]
        problems = unserved(mesh.istio_config, base_url(gateway), served)
        if problems:
            raise MeshFileError("; ".join(problems))
    wanting = [d.name for d in mesh.deployments if d.agent == UPSTREAM and d.mode != "none"]
    missing = upstream.missing("pilot-agent") if upstream is not None and wanting else ""
    if missing:
        raise MeshFileError(f"{path}: deployment{'s' if len(wanting) > 1 else ''} {', '.join(wanting)} ask for "
                            f"agent: upstream, but {missing}")
    return mesh


class EventLog:
    """One line per event on stdout (what a non-terminal gets, and the default without the live view).

    Once the live view runs (`to_view`), events go to it instead: on a terminal it shows them under
    "recent events" (a print would tear its screen), otherwise its plain log prints them.
    """

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.view_queue: queue.Queue[MeshEvent | str] | None = None
        self.print_lines = True

    def to_view(self, events: queue.Queue[MeshEvent | str], print_lines: bool) -> None:
        self.view_queue, self.print_lines = events, print_lines

    def event(self, text: str) -> None:
        if self.view_queue is not None:
            self.view_queue.put(MeshEvent(time.time(), text))
        if self.print_lines:
            print(f"{time.strftime('%H:%M:%S')} {text}", file=self.stream, flush=True)


@dataclass
class UpOptions:
    mesh_file: Path
    directory: Path
    capture: str = "cni"
    cni: str = "istio-agent"  # the node's CNI agent: ours or upstream's install-cni (NodeOptions.cni)
    control_plane: str = "istiod-local"  # the pods' control plane: istiod-local or the real istiod beside it
    scale: int = 1
    timeout: float = 120.0
    pod_cidr: str = "10.244.0.0/24"
    python: str = sys.executable
    proxy_config: Mapping[str, Any] = field(default_factory=lambda: dict(MESH_PROXY_CONFIG))
    upstream: UpstreamCommands = field(default_factory=upstream_commands)  # for `agent: upstream` deployments


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree_rss_kb(root: int, tree: Mapping[int, list[int]]) -> int:
    """VmRSS of `root` and all its descendants (the agent's wrappers, the agent, its Envoy)."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_kb(pid)
        todo += tree.get(pid, [])
    return total


class MeshRun:
    """A mesh file brought up on one local node; see the module docstring."""

    def __init__(self, options: UpOptions, log: EventLog | None = None) -> None:
        self.options = options
        self.log = log or EventLog()
        self.directory = options.directory.resolve()
        self.lock = RunLock(self.directory)
        self.node: LocalNode | None = None
        self.plan: MeshPlan | None = None
        self.pods: dict[str, Pod] = {}
        self.started = time.monotonic()
        self.ready_s: float | None = None
        self._signature: tuple[Any, ...] | None = None
        self._last_error = ""
        self._reported_exits: set[str] = set()
        self.rejected: list[Rejection] = []  # the Istio config istiod rejected, as it is now
        self._next_traffic = 0.0
        self.modules = ModuleServer(self.directory / "wasm", self.directory / "node" / "logs" / "wasm-modules.log",
                                    options.python)
        self.module_digests: dict[str, str] = {}  # served name -> sha256, as built last

    # ---- start and stop

    def start(self, before_pods: Callable[[], None] | None = None) -> None:
        """Lock, build the node, start istiod-local and every pod, wait until all are ready.

        `before_pods` runs once istiod-local is up and before the first pod is made (the live view starts
        there, so it shows the pods coming up)."""
        mesh = self._load()  # a broken file fails before anything
        self._signature = self._stat(mesh)
        try:  # capacity first, before anything is planned
            problem = cidr_problem(check_capacity(mesh, self.options.scale), self.options.pod_cidr)
        except CapacityError as exc:
            raise MeshFileError(str(exc)) from None
        if problem:
            raise MeshFileError(problem)
        self.plan = plan_mesh(mesh, self.options.scale, self.options.python)
        self.lock.acquire()
        self._build_modules(mesh)
        self.node = node = LocalNode(NodeOptions(
            workdir=self.directory / "node", istiod_state=self.directory / "istiod",
            registry=self.directory / "registry.yaml", pod_cidr=self.options.pod_cidr,
            ready_timeout=self.options.timeout, proxy_config=self.options.proxy_config,
            capture=self.options.capture, python=self.options.python, upstream_bin=self.options.upstream.bin,
            cni=self.options.cni if self.options.capture == "cni" else "istio-agent",
            control_plane=self.options.control_plane))
        node.create()
        agent = " by upstream's install-cni" if node.cni is not None and node.cni.upstream is not None else ""
        self.log.event(f"node {node.plan.netns}: bridge {node.plan.bridge} {node.plan.gateway}/"
                       f"{node.plan.network.prefixlen}, capture {self.options.capture}{agent}, logs in {node.logs}")
        self._serve_modules(mesh)
        plans = node.plan_pods(self.plan.pods)
        self._write_registry(plans)
        if node.real_istiod is not None:  # kept for its start: the registry's translation leaves out what it decides
            node.set_istio_config(user_resources(mesh))
        node.start_istiod(["--monitoring-addr", self.monitoring_addr] if monitoring_supported() else [])
        self.log.event(f"istiod-local on {node.plan.istiod_tls_addr}, registry {node.registry}")
        if node.real_istiod is not None:
            self.log.event(f"the real istiod (pilot-discovery) on {node.plan.discovery_address}, serving the pods; "
                           f"log {node.real_istiod.log}")
            self._istio_config_applied(node.set_istio_config(user_resources(mesh)), mesh)
        if before_pods is not None:
            before_pods()
        self._start_pods(plans)
        self.ready_s = time.monotonic() - self.started
        self.log.event(f"mesh ready: {len(self.pods)} pods in {self.ready_s:.1f} s")

    @property
    def monitoring_addr(self) -> str:
        assert self.node is not None
        return f"{self.node.plan.gateway}:{MONITORING_PORT}"

    def view_targets(self) -> list[ViewTarget]:
        """The running pods as the live view watches them (called from its thread once a second)."""
        out = []
        for pod in list(self.pods.values()):
            spec = pod.plan.spec
            mode = "proxyless" if spec.proxyless else "sidecar" if spec.sidecar else "none"
            # A proxyless pod has no Envoy to ask for its certificate: read the one its agent writes.
            cert = str(pod.dir / OUTPUT_CERTS.lstrip("/") / "cert-chain.pem") if spec.proxyless else ""
            out.append(ViewTarget(name=pod.name, namespace=spec.namespace, ip=pod.ip, netns=pod.netns, mode=mode,
                                  service_account=spec.service_account, cert_file=cert,
                                  agent=spec.agent_implementation))
        return out

    def close(self) -> None:
        try:
            self.modules.stop()
            if self.node is not None:
                self.node.close()
        finally:
            self.lock.release()

    # ---- pods and registry

    def _load(self) -> Mesh:
        return load_mesh(self.options.mesh_file, self.options.upstream, self.options.control_plane,
                         _gateway(self.options.pod_cidr))

    def _build_modules(self, mesh: Mesh) -> None:
        """Build the mesh's Wasm modules into the served directory; MeshFileError names a module that fails.
        A module whose bytes changed is logged with its new digest."""
        if not mesh.wasm_modules and not self.module_digests:
            return
        try:
            digests = build(self.options.mesh_file, mesh.wasm_modules, self.modules.directory)
        except WasmModuleError as exc:
            raise MeshFileError(str(exc)) from None
        for name, digest in digests.items():
            if self.module_digests.get(name) != digest:
                verb = "rebuilt" if name in self.module_digests else "built"
                self.log.event(f"Wasm module {name} {verb}: sha256 {digest}")
        self.module_digests = digests

    def _serve_modules(self, mesh: Mesh) -> None:
        """Start the node's module server the first time the mesh has modules (it then stays until close)."""
        if not mesh.wasm_modules or self.modules.running():
            return
        assert self.node is not None
        plan = self.node.plan
        self.modules.start(plan.netns, plan.netns_path(), plan.gateway, self.options.timeout)
        self.log.event(f"Wasm modules served to the pods on {base_url(plan.gateway)}: "
                       f"{', '.join(self.module_digests)}")

    def _istio_config_applied(self, rejections: list[Rejection], mesh: Mesh) -> None:
        self.rejected = list(rejections)
        if mesh.istio_config:
            kinds: dict[str, int] = {}
            for resource in mesh.istio_config:
                kinds[resource.kind] = kinds.get(resource.kind, 0) + 1
            shown = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            self.log.event(f"Istio config given to the real istiod: {shown}"
                           + (f" ({len(rejections)} rejected)" if rejections else ""))
        for rejection in rejections:
            self.log.event(rejection.show())

    def _write_registry(self, plans: list[PodPlan]) -> None:
        assert self.node is not None and self.plan is not None
        text = yaml.safe_dump(registry_document(self.plan, plans), sort_keys=False)
        partial = self.node.registry.with_name(f".{self.node.registry.name}.partial")
        partial.write_text(text)
        partial.replace(self.node.registry)  # istiod-local polls it and pushes the change
        self.node.registry_changed()  # the real istiod's config, when it serves the pods

    def _start_pods(self, plans: list[PodPlan]) -> None:
        assert self.node is not None and self.plan is not None
        if not plans:
            return
        started = self.node.add_pods(plans)
        for pod in started:
            self.pods[pod.name] = pod
        ports = {p.name: self.plan.ready_ports[p.name] for p in started if p.name in self.plan.ready_ports}
        self.node.wait_ready(started, ports)
        for pod in started:
            self.log.event(f"pod {pod.plan.spec.namespace}/{pod.name} ready: {pod.ip}, {self._mode(pod.plan.spec)}")

    @staticmethod
    def _mode(spec: PodSpec) -> str:
        mode = "proxyless" if spec.proxyless else "sidecar" if spec.sidecar else "no mesh"
        return f"{mode} (upstream's agent)" if spec.sidecar and spec.agent_implementation == UPSTREAM else mode

    def _remove_pod(self, name: str) -> None:
        assert self.node is not None
        self.node.remove_pod(name)
        self.pods.pop(name, None)

    def apply(self, mesh: Mesh) -> None:
        """Bring the running mesh to `mesh`: remove, re-register, add (see the module docstring)."""
        assert self.node is not None and self.plan is not None
        new = plan_mesh(mesh, self.options.scale, self.options.python)
        wanted = {spec.name: spec for spec in new.pods}
        gone = [name for name, pod in self.pods.items() if wanted.get(name) != pod.plan.spec]
        kept = [pod.plan for name, pod in self.pods.items() if name not in gone]
        old, self.plan = self.plan, new
        if gone:
            self._write_registry(kept)
            for name in gone:
                self._remove_pod(name)
                self.log.event(f"pod {name} removed")
        added = self.node.plan_pods([spec for spec in new.pods if spec.name not in self.pods])
        self._write_registry(kept + added)
        if self.node.real_istiod is not None and old.mesh.istio_config != mesh.istio_config:
            self._istio_config_applied(self.node.set_istio_config(user_resources(mesh)), mesh)
        self._start_pods(added)
        changes = [f"{len(gone)} pods removed"] if gone else []
        changes += [f"{len(added)} pods added"] if added else []
        if old.mesh.namespaces != mesh.namespaces:
            changes.append("namespaces/PeerAuthentication: " + ", ".join(
                f"{n.name} {n.peer_authentication}" for n in mesh.namespaces))
        if old.mesh.services != mesh.services or old.mesh.service_entries != mesh.service_entries:
            changes.append("services updated")
        if old.mesh.istio_config != mesh.istio_config:
            changes.append("Istio config updated")
        self.log.event(f"mesh file change applied: {'; '.join(changes) or 'registry rewritten'}")

    # ---- running

    def _stat(self, mesh: Mesh | None = None) -> tuple[Any, ...] | None:
        """The mesh file's and its Istio config files' (see `istiofiles.files_signature`)."""
        try:
            st = os.stat(self.options.mesh_file)
        except OSError:
            return None
        mesh = mesh or (self.plan.mesh if self.plan is not None else None)
        entries = mesh.istio_config_paths if mesh is not None else ()
        modules = mesh.wasm_modules if mesh is not None else ()
        return (st.st_mtime_ns, st.st_size, st.st_ino, files_signature(self.options.mesh_file, entries),
                wasmfiles.files_signature(self.options.mesh_file, modules))

    def poll_mesh_file(self) -> None:
        """Apply the mesh file if it changed; a bad version is reported once and the last good one kept."""
        signature = self._stat()
        if signature == self._signature:
            return
        self._signature = signature
        try:
            mesh = self._load()
            self._build_modules(mesh)
        except MeshFileError as exc:
            if str(exc) != self._last_error:
                self.log.event(f"mesh file refused, keeping the last good mesh: {exc}")
            self._last_error = str(exc)
            return
        self._last_error = ""
        assert self.plan is not None
        if mesh == self.plan.mesh:
            return
        try:
            self._serve_modules(mesh)
            self.apply(mesh)
        except (NodeError, PlanError) as exc:  # e.g. a pod that never got ready, a pod CIDR too small
            self.log.event(f"applying the mesh file failed: {exc}")

    def watch_processes(self) -> None:
        for pod in list(self.pods.values()):
            for proc in pod.processes():
                if not proc.running() and proc.name not in self._reported_exits:
                    self._reported_exits.add(proc.name)
                    self.log.event(proc.describe_exit())

    def traffic_report(self) -> list[str]:
        """What each client app last reported (its cumulative call counts), one line per pod."""
        assert self.node is not None
        lines = []
        for name in sorted(self.pods):
            summary = _last_traffic(self.node.logs / f"{name}-app.log")
            if summary:
                parts = [f"{url} {c.get('ok', 0)} ok/{c.get('failed', 0)} failed" for url, c in sorted(summary.items())]
                lines.append(f"traffic {name}: " + "; ".join(parts))
        return lines

    def tick(self) -> None:
        """One second of running: the mesh file, dead processes, and now and then the traffic."""
        self.poll_mesh_file()
        self.watch_processes()
        now = time.monotonic()
        if now >= self._next_traffic:
            if self._next_traffic:
                for line in self.traffic_report():
                    self.log.event(line)
            self._next_traffic = now + TRAFFIC_LOG_EVERY

    def run_forever(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self.log.event(f"running; edit {self.options.mesh_file} to change the mesh; Ctrl-C stops everything")
        while True:
            self.tick()
            sleep(1.0)

    # ---- measuring and checking

    def rss_per_pod_mb(self) -> float | None:
        """Mean VmRSS of each sidecar pod's agent process tree (agent + Envoy), in MB."""
        tree = _children()
        sizes = [process_tree_rss_kb(pod.agent.pid, tree) for pod in self.pods.values()
                 if pod.agent is not None and pod.plan.spec.sidecar and not pod.plan.spec.proxyless]
        return round(sum(sizes) / len(sizes) / 1024, 1) if sizes else None

    def check(self) -> CheckResult:
        """Every probe of the check (`checking.py`), the ones that did not hold retried. What istiod rejected
        is not in force, so nothing is expected of it (it is listed as not checked)."""
        assert self.node is not None and self.plan is not None
        plan = self.plan
        rejected = {r.key for r in self.rejected}
        if rejected:
            mesh = dataclasses.replace(plan.mesh, istio_config=tuple(r for r in plan.mesh.istio_config
                                                                     if r.key not in rejected))
            plan = dataclasses.replace(plan, mesh=mesh)
        result = MeshCheck(self.node, self.pods, plan, self.options.python).run()
        result.notes += [f"{r.key} ({r.source}): rejected by istiod, not in force" for r in self.rejected]
        return result


def user_resources(mesh: Mesh) -> list[UserResource]:
    """The mesh's Istio config as the real istiod is given it."""
    return [UserResource(r.key, r.source, r.document) for r in mesh.istio_config]


def _gateway(pod_cidr: str) -> str:
    """The node's gateway address for this pod CIDR (its first host), "" when the CIDR is not one."""
    try:
        return str(next(ipaddress.IPv4Network(pod_cidr, strict=True).hosts()))
    except (ValueError, StopIteration):
        return ""


def cidr_problem(pods: int, pod_cidr: str) -> str:
    """Why `pods` pods do not fit the pod CIDR (its gateway takes one address), or ""."""
    try:
        network = ipaddress.IPv4Network(pod_cidr, strict=True)
    except ValueError as exc:
        return f"--pod-cidr {pod_cidr!r}: {exc}"
    room = max(0, network.num_addresses - 3)  # network, broadcast and gateway addresses
    if pods <= room:
        return ""
    prefix = max(8, 32 - (pods + 3 - 1).bit_length())
    return (f"the mesh has {pods} pods but --pod-cidr {pod_cidr} holds {room}: "
            f"use a larger one, such as --pod-cidr {network.network_address}/{prefix}")


def monitoring_supported() -> bool:
    """Whether istiod-local has its monitoring port (`serve --monitoring-addr`, read by the live view's istiod
    line); asked of the module that serves it, since nothing outside cli/ may import the command lines."""
    return importlib.util.find_spec("istiod_local.controlplane.monitoring") is not None


def _last_traffic(log: Path) -> dict[str, dict[str, Any]]:
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode(errors="replace")
    except OSError:
        return {}
    for line in reversed(tail.splitlines()):
        if line.startswith('{"traffic"'):
            try:
                traffic: dict[str, dict[str, Any]] = json.loads(line)["traffic"]
                return traffic
            except (ValueError, KeyError):
                return {}
    return {}
