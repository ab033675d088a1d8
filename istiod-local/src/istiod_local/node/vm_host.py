"""The local node's VMs (`LocalNode.add_vm` and the rest): machines onboarded as Istio's VM guide does.

A VM is a network namespace on the node's bridge, wired as an init-mode pod (a VM has no CNI), with a
root of its own where the onboarding files `istiod-local workload-entry configure` writes are copied to
the guide's paths, and `packaging/vm/istio-start.sh` run as istio.service runs it (`vm.py` holds the
pure parts: paths, binds, unit environment, command lines). These are `LocalNode`'s methods, kept
here so the pod side of the node reads on its own; each is typed on `LocalNode` (whose state it uses).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from istiod_local.node import vm
from istiod_local.node.plan import AGENT_GID, PodSpec, pod_setup_commands
from istiod_local.node.processes import NetnsProcess, NodeError, run_ip, spawn, tail, wait_for

if TYPE_CHECKING:
    from istiod_local.node.container import AgentImage
    from istiod_local.node.mountpoints import MountPoints
    from istiod_local.node.plan import NodePlan, PodPlan
    from istiod_local.node.runtime import NodeRuntime

VM_START_SCRIPT = Path(__file__).resolve().parents[4] / "packaging" / "vm" / "istio-start.sh"
FILE_WAIT = """
import os, sys, time
path, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while not os.path.exists(path):
    if time.monotonic() > deadline:
        sys.exit(f"{path} did not appear")
    time.sleep(0.02)
"""


class _NodeOptions(Protocol):
    """What of `NodeOptions` the VM methods read."""

    @property
    def bin_dir(self) -> Path: ...
    @property
    def python(self) -> str: ...
    @property
    def stop_grace(self) -> float: ...
    @property
    def ready_timeout(self) -> float: ...


class _Node(Protocol):
    """What of `LocalNode` its VM methods use (their `self`)."""

    @property
    def options(self) -> _NodeOptions: ...
    plan: NodePlan
    runtime: NodeRuntime
    logs: Path
    istiod_state: Path
    registry: Path
    proxy_config: dict[str, Any]
    istiod: NetnsProcess | None
    vms: dict[str, vm.Vm]
    _vm_mountpoints: MountPoints
    _image: AgentImage
    _created: bool
    _closed: bool

    def plan_pods(self, specs: Iterable[PodSpec]) -> list[PodPlan]: ...
    def _install_envoy(self) -> None: ...
    def _onboard_vm(self, machine: vm.Vm) -> None: ...
    def _stop_vm_agent(self, machine: vm.Vm) -> None: ...
    def start_vm_agent(self, machine: vm.Vm | str) -> NetnsProcess: ...
    def start_vm_app(self, machine: vm.Vm | str) -> NetnsProcess: ...
    def in_vm(self, machine: vm.Vm | str, argv: Sequence[str]) -> list[str]: ...


class VmHosting:
    """`LocalNode`'s VM methods (a mixin: the node holds the VMs, `self.vms`, beside its pods; `_Node` names
    what of the node they use)."""

    def add_vm(self: _Node, spec: vm.VmSpec, start: bool = True) -> vm.Vm:
        """A VM of `spec.group`: its netns on the bridge, its onboarding files at the guide's paths, its app,
        and (`start`) the start script as istio.service runs it. Needs istiod-local running (the files come
        from `istiod-local workload-entry configure`, which reads its state and registry)."""
        if not self._created or self._closed:
            raise NodeError("the node is not running (create() first)")
        if spec.name in self.vms:
            raise NodeError(f"VM {spec.name} is already running")
        plan = self.plan_pods([PodSpec(spec.name, namespace=spec.namespace, sidecar=False, ip=spec.ip)])[0]
        base = self.runtime.path / "vms" / spec.name
        machine = vm.Vm(spec, plan, str(base / "root"), str(base / "onboarding"))
        self.vms[spec.name] = machine
        for argv in pod_setup_commands(self.plan, plan):  # a VM has no CNI: wired as an init-mode pod
            run_ip(argv)
        self._vm_mountpoints.acquire()
        self._onboard_vm(machine)
        ready = base / vm.HOLDER_READY
        holder = vm.holder_argv(plan.netns, spec.name, machine.root, self._image.script(), str(ready))
        machine.holder = spawn(f"{spec.name} machine", holder, self.logs / f"{spec.name}-machine.log")
        wait_for([self.options.python, "-c", FILE_WAIT, str(ready), "20"], f"VM {spec.name}'s mounts", 25,
                 [machine.holder])
        if spec.app:
            self.start_vm_app(machine)
        if start:
            self.start_vm_agent(machine)
        return machine

    def _onboard_vm(self: _Node, machine: vm.Vm) -> None:
        """Generate the onboarding files and copy them where the VM guide puts them (owned by istio-proxy)."""
        spec, root, out = machine.spec, Path(machine.root), Path(machine.onboarding)
        out.mkdir(parents=True, exist_ok=True)
        run_ip(vm.configure_argv(str(self.options.bin_dir / "istiod-local"), str(self.istiod_state),
                                 str(self.registry), spec,
                                 self.plan, machine.plan, str(out)), timeout=60)
        missing = [name for name in vm.ONBOARDING_FILES if not (out / name).is_file()]
        if missing:
            raise NodeError(f"VM {spec.name}: workload-entry configure wrote no {', '.join(missing)} in {out}")
        for _, target, _ in vm.BINDS:
            (root / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / "var/run/secrets/tokens").mkdir(parents=True, exist_ok=True)
        for name, path in vm.ONBOARDING.items():
            shutil.copyfile(out / name, root / path)
        self._install_envoy()
        settings = {"ISTIO_BIN_BASE": str(self.options.bin_dir),
                    "PROXY_CONFIG": json.dumps({"binaryPath": self.proxy_config["binaryPath"],
                                                "terminationDrainDuration": "1s"}),
                    **spec.sidecar_env}
        (root / "var/lib/istio/envoy/sidecar.env").write_text(vm.sidecar_env_text(settings))
        passwd, group = vm.with_proxy_user(Path("/etc/passwd").read_text(), Path("/etc/group").read_text())
        (root / "etc/passwd").write_text(passwd)
        (root / "etc/group").write_text(group)
        (root / "etc/resolv.conf").write_text(vm.resolv_conf())
        (root / "etc/hosts").write_text(vm.hosts_with(Path("/etc/hosts").read_text(), (out / "hosts").read_text()))
        for source, _, uid in vm.BINDS:
            if uid is not None:
                for folder, _, files in os.walk(root / source):
                    os.chown(folder, uid, AGENT_GID)
                    for name in files:
                        os.chown(Path(folder) / name, uid, AGENT_GID)
        script = _vm_start_script(machine)  # where the package puts it, under the VM's root (the checkout may be
        script.parent.mkdir(parents=True, exist_ok=True)  # out of reach: a 0700 home, hidden in the VM's mounts)
        shutil.copyfile(VM_START_SCRIPT, script)
        script.chmod(0o755)
        os.chmod(root, 0o755)
        os.chmod(root.parent, 0o755)

    def start_vm_agent(self: _Node, machine: vm.Vm | str) -> NetnsProcess:
        """`systemctl start istio`: ExecStartPre, then istio-start.sh from `/` with a service's environment."""
        machine = self.vms[machine] if isinstance(machine, str) else machine
        if machine.agent is not None and machine.agent.running():
            raise NodeError(f"VM {machine.name}'s agent is already running")
        assert machine.holder is not None
        env = vm.unit_environment(os.environ)
        run_ip(vm.enter_argv(machine.holder.pid, vm.exec_start_pre()))
        argv = vm.enter_argv(machine.holder.pid, ["bash", str(_vm_start_script(machine))])
        machine.agent = spawn(f"{machine.name} istio.service", argv, self.logs / f"{machine.name}-service.log",
                              env=env)
        return machine.agent

    def _stop_vm_agent(self: _Node, machine: vm.Vm) -> None:
        """`systemctl stop istio`: SIGTERM to the agent, then ExecStopPost (`istio-start.sh clean`)."""
        if machine.agent is not None:
            machine.agent.stop(self.options.stop_grace)
        if machine.holder is not None and machine.holder.running():
            with (self.logs / f"{machine.name}-service.log").open("ab") as log:
                subprocess.run(vm.enter_argv(machine.holder.pid, ["bash", str(_vm_start_script(machine)), "clean"]),
                               stdout=log, stderr=subprocess.STDOUT, env=vm.unit_environment(os.environ),
                               timeout=60, check=False)

    def stop_vm_agent(self: _Node, machine: vm.Vm | str) -> None:
        self._stop_vm_agent(self.vms[machine] if isinstance(machine, str) else machine)

    def start_vm_app(self: _Node, machine: vm.Vm | str) -> NetnsProcess:
        """The VM's app, as root on the machine (its connections go through the capture)."""
        machine = self.vms[machine] if isinstance(machine, str) else machine
        assert machine.holder is not None
        machine.app = spawn(f"{machine.name} app", vm.enter_argv(machine.holder.pid, list(machine.spec.app)),
                            self.logs / f"{machine.name}-app.log",
                            env=vm.app_environment(machine.spec, machine.plan, os.environ))
        return machine.app

    def stop_vm_app(self: _Node, machine: vm.Vm | str) -> None:
        machine = self.vms[machine] if isinstance(machine, str) else machine
        if machine.app is not None:
            machine.app.stop(self.options.stop_grace)
            machine.app = None

    def in_vm(self: _Node, machine: vm.Vm | str, argv: Sequence[str]) -> list[str]:
        """`argv` wrapped to run on the VM (its network, mounts and hostname; as root, from `/`)."""
        machine = self.vms[machine] if isinstance(machine, str) else machine
        assert machine.holder is not None
        return vm.enter_argv(machine.holder.pid, argv)

    def vm_exec(self: _Node, machine: vm.Vm | str, argv: Sequence[str],
                timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a command on the VM and return its result (never raises on exit code)."""
        return subprocess.run(self.in_vm(machine, argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=vm.unit_environment(os.environ) | {"HOME": "/tmp"})

    def wait_vm_ready(self: _Node, machine: vm.Vm | str) -> None:
        """Wait for the VM's Envoy to be ready (`:15021/healthz/ready`, as a load balancer's check would)."""
        machine = self.vms[machine] if isinstance(machine, str) else machine
        timeout = self.options.ready_timeout
        watch = [p for p in (machine.agent, machine.holder, self.istiod) if p is not None]
        try:
            wait_for(self.in_vm(machine, [str(self.options.bin_dir / "pilot-agent"), "wait", "--timeoutSeconds",
                                          str(int(timeout)), "--periodMillis", "100"]),
                     f"VM {machine.name} to be ready", timeout + 5, watch)
        except NodeError as exc:  # the agent's own output is on the VM (/var/log/istio), not in the node's logs
            logs = Path(machine.root) / "var/log/istio"
            raise NodeError(f"{exc}\n{logs}/istio.log:\n{tail(logs / 'istio.log')}\n"
                            f"{logs}/istio.err.log:\n{tail(logs / 'istio.err.log')}") from None


def _vm_start_script(machine: vm.Vm) -> Path:
    """The VM's copy of `packaging/vm/istio-start.sh`, at the package's path under the VM's own root."""
    return Path(machine.root) / "usr/local/bin/istio-start.sh"
