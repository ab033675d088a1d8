"""A "VM" on the local node as data: its machine root, mounts and commands (no I/O here; `local_node.py` runs them).

Istio's VM guide onboards a machine in three steps: generate the files for a
WorkloadGroup (`istioctl x workload entry configure`, here `istiod-local
workload-entry configure`), copy them to their absolute paths on the machine,
and start the agent as a system service (`istio.service` → `istio-start.sh`).
A local node's VM does the same on one host:

- **Network**: a namespace wired to the node's bridge as an init-mode pod's
  is (`plan.pod_setup_commands`: veth, the pod CIDR, default route via the
  gateway), whatever the node's capture mode: a VM has no CNI. Its address is
  reserved like a pod's (`plan_pod`), so `--internalIP` is known before it starts.
- **Machine**: a long-lived holder process (`sleep infinity`) owns the VM's
  mount and UTS namespaces (hostname = the VM's name, what `hostname -s`
  gives the start script as POD_NAME). In them, directories of the VM's own
  root (under the node's runtime directory) are bind-mounted onto the
  guide's paths (`BINDS`): `/etc/certs` (root-cert.pem; OUTPUT_CERTS),
  `/var/run/secrets` (tokens/istio-token), `/etc/istio/config` (mesh),
  `/etc/istio/proxy` (the agent's bootstrap and XDS socket),
  `/var/lib/istio/envoy` (cluster.env, sidecar.env), `/var/log/istio`, and
  the files `/etc/hosts` (the host's plus the onboarding `hosts` lines),
  `/etc/resolv.conf` (`resolv_conf`), `/etc/passwd`, `/etc/group` (the host's plus `istio-proxy`, uid/gid 1337,
  as the package's postinst adds it). Every later VM process (the start
  script, the app, a test's command) enters the holder's namespaces
  (`nsenter`), so they all see one machine. The node's agent image mounts
  (`container.AgentImage`) are made there too, so uid 1337 reaches the Python.
- **Service**: the start script runs as the unit's ExecStart would (after its
  ExecStartPre, `install -d -o istio-proxy /var/run/secrets`), from `/`, with
  a service's environment (`unit_environment`: no USER or HOME), so it takes
  the service path: capture cleaned and applied, then the agent as
  istio-proxy with its output in `/var/log/istio/istio.log` and
  `istio.err.log`. Its stop runs `istio-start.sh clean` (ExecStopPost).

The host's own paths are never written: missing mount points are created
empty (`mountpoints.py`) and removed when the last node using them closes.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from istiod_local.node.plan import AGENT_GID, AGENT_UID, NodePlan, PodPlan, as_user

# (directory under the VM root, absolute path on the VM, owner uid or None for root)
BINDS: tuple[tuple[str, str, int | None], ...] = (
    ("etc/certs", "/etc/certs", AGENT_UID),
    ("var/run/secrets", "/var/run/secrets", AGENT_UID),
    ("etc/istio/config", "/etc/istio/config", AGENT_UID),
    ("etc/istio/proxy", "/etc/istio/proxy", AGENT_UID),
    ("var/lib/istio/envoy", "/var/lib/istio/envoy", AGENT_UID),
    ("var/log/istio", "/var/log/istio", AGENT_UID),
)
FILE_BINDS = ("/etc/hosts", "/etc/passwd", "/etc/group", "/etc/resolv.conf")
# Where the onboarding files go (the VM guide's copy step): file name → path under the VM root.
ONBOARDING = {
    "root-cert.pem": "etc/certs/root-cert.pem",
    "istio-token": "var/run/secrets/tokens/istio-token",
    "mesh.yaml": "etc/istio/config/mesh",
    "cluster.env": "var/lib/istio/envoy/cluster.env",
}
ONBOARDING_FILES = ("cluster.env", "mesh.yaml", "root-cert.pem", "istio-token", "hosts")
PROXY_USER = "istio-proxy"
# What systemd gives a system service without User=: its default PATH and no USER/HOME.
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOLDER_READY = "holder-ready"

if TYPE_CHECKING:
    from istiod_local.node.processes import NetnsProcess


@dataclass(frozen=True)
class VmSpec:
    """A VM of a WorkloadGroup: its name (hostname, POD_NAME), the group, and its app.

    `sidecar_env` are this machine's sidecar.env settings (the node adds
    ISTIO_BIN_BASE and the Envoy path). `configure_args` are extra
    `workload-entry configure` flags. `ip` pins the VM's address.
    """

    name: str
    group: str
    namespace: str = "default"
    app: Sequence[str] = ()
    app_env: Mapping[str, str] = field(default_factory=dict)
    sidecar_env: Mapping[str, str] = field(default_factory=dict)
    autoregister: bool = True
    configure_args: Sequence[str] = ()
    ip: str = ""


def mount_targets() -> list[str]:
    """The directories a VM mounts on: they must exist on the host (empty) while a VM runs."""
    return sorted(target for _, target, _ in BINDS)


def configure_argv(istiod_local: str, state_dir: str, registry: str, spec: VmSpec, node: NodePlan, vm: PodPlan,
                   out: str) -> list[str]:
    """`istiod-local workload-entry configure` for this VM: the group from the registry, istiod at the node's
    gateway (`hosts` maps istiod's name there), the VM's own address as its internal IP."""
    argv = [istiod_local, "workload-entry", "configure", "--state-dir", state_dir, "--registry", registry,
            "--name", spec.group, "--namespace", spec.namespace, "-o", out,
            "--discovery-address", node.istiod_tls_addr, "--internalIP", vm.ip]
    if spec.autoregister:
        argv.append("--autoregister")
    return argv + list(spec.configure_args)


def with_proxy_user(passwd: str, group: str) -> tuple[str, str]:
    """/etc/passwd and /etc/group with `istio-proxy` (1337) added when missing, as the package's postinst does."""
    def has(text: str, name: str) -> bool:
        return any(line.split(":", 1)[0] == name for line in text.splitlines())

    def ending(text: str) -> str:
        return text if not text or text.endswith("\n") else text + "\n"

    if not has(passwd, PROXY_USER):
        passwd = ending(passwd) + f"{PROXY_USER}:x:{AGENT_UID}:{AGENT_GID}::/var/lib/istio:/usr/sbin/nologin\n"
    if not has(group, PROXY_USER):
        group = ending(group) + f"{PROXY_USER}:x:{AGENT_GID}:\n"
    return passwd, group


def hosts_with(hosts: str, onboarding_hosts: str) -> str:
    """The VM's /etc/hosts: the host's, then the onboarding `hosts` lines (the guide appends them)."""
    base = hosts if not hosts or hosts.endswith("\n") else hosts + "\n"
    extra = onboarding_hosts if not onboarding_hosts or onboarding_hosts.endswith("\n") else onboarding_hosts + "\n"
    return base + extra


def resolv_conf() -> str:
    """The VM's resolver: a loopback address where nothing listens, so every query is refused at once.

    The host's nameserver is out of the VM's reach, and a query to it times out;
    gRPC's c-ares resolver (the agent's CA and XDS clients) asks DNS before it
    reads /etc/hosts, so the onboarding `hosts` line for istiod would only be
    found after seconds of timeouts, beyond the agent's 5 s connect budget. A
    closed port elsewhere is no better: ICMP port-unreachable is rate-limited,
    except on loopback. With DNS capture the app's queries to it reach the
    agent's DNS proxy, which answers mesh names and finds nothing else.
    """
    return "nameserver 127.0.0.1\n"


def sidecar_env_text(values: Mapping[str, str]) -> str:
    """sidecar.env lines (`KEY='value'`, quoted for the script's `.`), sorted."""
    for key in values:
        if not key.replace("_", "").isalnum() or key[0].isdigit():
            raise ValueError(f"sidecar.env: {key!r} is not a shell variable name")
    return "".join(f"{key}={shlex.quote(values[key])}\n" for key in sorted(values))


def holder_argv(netns: str, hostname: str, root: str, image: str, ready_file: str) -> list[str]:
    """The VM's holder: its netns, new mount and UTS namespaces, the image and the VM's binds, then sleep.

    Touches `ready_file` once everything is mounted; `ip netns exec`, `unshare`,
    `sh` and `sleep` all exec, so the pid held is the holder's own.
    """
    binds = [f"mount --bind {shlex.quote(root + '/' + src)} {shlex.quote(dst)}" for src, dst, _ in BINDS]
    binds += [f"mount --bind {shlex.quote(root + dst)} {shlex.quote(dst)}" for dst in FILE_BINDS]
    steps = ["set -e", *( [image] if image else []), *binds, f"hostname {shlex.quote(hostname)}",
             f"touch {shlex.quote(ready_file)}", "exec sleep infinity"]
    return ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "setpriv", "--pdeathsig", "SIGKILL", "--", "sh", "-c", "; ".join(steps)]


def enter_argv(holder_pid: int, argv: Sequence[str], uid: int | None = None, gid: int | None = None,
               cwd: str = "/") -> list[str]:
    """argv on the VM: in the holder's network, mount and UTS namespaces, from `cwd`, as root unless `uid`."""
    # cd after entering: a directory opened before (nsenter --wd) would resolve paths in the host's mounts.
    return ["nsenter", f"--target={holder_pid}", "--net", "--mount", "--uts", *as_user(uid, gid), "--",
            "sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]


def unit_environment(base: Mapping[str, str]) -> dict[str, str]:
    """istio.service's environment as systemd gives a system service: its PATH, the locale, no USER or HOME."""
    environment = {key: value for key, value in base.items() if key in ("LANG", "LC_ALL", "TZ")}
    environment["PATH"] = UNIT_PATH
    return environment


def exec_start_pre() -> list[str]:
    """The unit's ExecStartPre (`+`: as root): /var/run/secrets the agent's."""
    return ["install", "-d", "-o", PROXY_USER, "-m", "0755", "/var/run/secrets"]


def app_environment(spec: VmSpec, vm: PodPlan, base: Mapping[str, str]) -> dict[str, str]:
    """The VM app's environment: a plain process of the machine (POD_NAME so the echo app names the VM)."""
    environment = {key: value for key, value in base.items() if key in ("PATH", "LANG", "LC_ALL", "TZ")}
    environment.update({"HOME": "/tmp", "POD_NAME": spec.name, "INSTANCE_IP": vm.ip})
    environment.update(spec.app_env)
    return environment


@dataclass
class Vm:
    """A VM on the node: its plan (address, netns), its root, and its processes (pids held by the node)."""

    spec: VmSpec
    plan: PodPlan
    root: str  # the VM's own root under the node's runtime directory (the binds' sources)
    onboarding: str  # where `workload-entry configure` wrote the files
    holder: NetnsProcess | None = None  # owns the VM's mount and UTS namespaces
    agent: NetnsProcess | None = None  # the start script, then (exec) the agent
    app: NetnsProcess | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def processes(self) -> list[NetnsProcess]:
        """Agent and app first, the holder (their namespaces) last."""
        return [p for p in (self.agent, self.app, self.holder) if p is not None]

    @property
    def ip(self) -> str:
        return self.plan.ip

    @property
    def netns(self) -> str:
        return self.plan.netns
