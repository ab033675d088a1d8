"""The one way the tests and the benchmarks start istiod-local and pilot-agent, and write a mesh registry.

- `IstiodLocal`: `istiod-local serve` as a child process. It picks free ports
  (port 0) unless told otherwise and reports them from its serving line
  (its Kubernetes API is off unless `kube_api_addr` is given; `kubeconfig()`
  writes a kubeconfig for it);
  `stop()` then `start()` comes back on the same ports, as a restarted istiod
  keeps its address. `pod_files()` and `token()` run the operator's commands
  against its state directory (they work before it was ever started too).
- `PilotAgent`: one `pilot-agent proxy sidecar` (or any other subcommand) in a
  pod directory, with the environment Istio's injector gives the istio-proxy
  container (`agent_environment()`); readiness, exit, signals, its Envoy child.
- `RegistryFile`: the `--registry` YAML, rewritten atomically (a new file
  renamed over the old one), so that istiod-local's watcher never reads half
  a file and reports a parse error the test did not cause.
- `host_sidecar_ports()`: the cross-process lock an agent must hold while its
  Envoy uses the fixed sidecar ports (15000, 15001, ...) of the host network.
- `local_node()`: a created `istiod_local.node.LocalNode` (network namespaces,
  istiod-local on its gateway, pods) in a fresh work directory, closed after.

Everything here kills what it started. Like `support.py`, it imports no pytest:
the fixtures built on it are in `fixtures.py`, and benchmarks use it directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml
from support import (
    HTTP_NOT_YET,
    ISTIOD_LOCAL,
    PILOT_AGENT,
    LineCollector,
    child_pids,
    http_request,
    open_workdir,
    pid_alive,
    poll,
    port_accepts,
    serving_addresses,
    stop_process,
)

if TYPE_CHECKING:
    from istiod_local.node.local_node import LocalNode

# The agent's ports on its pod's network: Envoy admin, outbound, inbound, status, readiness, Prometheus.
SIDECAR_PORTS = (15000, 15001, 15006, 15020, 15021, 15090)
# Held while an agent uses the fixed ports on the host network, so that test runs in other
# processes (other sessions, other files) that take it too never start a second agent there.
HOST_PORTS_LOCK = Path("/tmp/istio-agent-host-sidecar-ports.lock")
SIDECAR = ("proxy", "sidecar")
KUBE_SERVING_LINE = re.compile(r"kube-apiserver serving on https://(\S+)")


# ---- the mesh registry ---------------------------------------------------------------------------


def echo_registry(workload_ip: str = "127.0.0.1", mode: str = "PERMISSIVE", extra_services: str = "") -> str:
    """The `echo` service with workload `echo-1` (the agent `agent_environment()` describes by default),
    plus any `extra_services` list items."""
    return (
        "services:\n"
        "- name: echo\n"
        "  namespace: default\n"
        "  selector: {app: echo}\n"
        "  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]\n"
        f"{extra_services}"
        "workloads:\n"
        f"- {{name: echo-1, namespace: default, serviceAccount: echo, labels: {{app: echo}}, ip: {workload_ip}}}\n"
        f"peerAuthentication: {{default: {mode}}}\n"
    )


class RegistryFile:
    """istiod-local's `--registry` file: YAML text or a mapping (dumped as YAML), replaced atomically."""

    def __init__(self, path: Path, content: str | Mapping[str, Any] | None = None) -> None:
        self.path = path
        if content is not None:
            self.write(content)

    def write(self, content: str | Mapping[str, Any]) -> None:
        text = content if isinstance(content, str) else yaml.safe_dump(dict(content), sort_keys=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.write_text(text)
        partial.replace(self.path)

    def read(self) -> str:
        return self.path.read_text()

    def __fspath__(self) -> str:
        return str(self.path)


# ---- istiod-local --------------------------------------------------------------------------------


def istiod_local_cli(*args: str, state_dir: Path, env: Mapping[str, str] | None = None,
                     check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """One `istiod-local <args> --state-dir <state_dir>` run (pod-files, token, a serve that must fail)."""
    done = subprocess.run([str(ISTIOD_LOCAL), *args, "--state-dir", str(state_dir)], capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else dict(env))
    if check:
        assert done.returncode == 0, f"istiod-local {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done


def pod_files(state_dir: Path, out: Path, *, namespace: str = "default", service_account: str = "echo",
              pod: str = "", token_ttl: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The pod's mounted root certificate and token under `out`, as an operator makes them; returns `out`.

    Run before any `istiod-local serve`, it also creates the state (root, token key) a server will use.
    """
    args = ["pod-files", "--namespace", namespace, "--service-account", service_account, "--out", str(out)]
    if pod:
        args += ["--pod", pod]
    if token_ttl is not None:
        args += ["--token-ttl", token_ttl]
    istiod_local_cli(*args, state_dir=state_dir, env=env)
    return out


def mint_token(state_dir: Path, *, namespace: str = "default", service_account: str = "echo",
               ttl: str | None = None) -> str:
    """A service-account token from the state's key (`istiod-local token`)."""
    args = ["token", "--namespace", namespace, "--service-account", service_account]
    if ttl is not None:
        args += ["--token-ttl", ttl]
    return istiod_local_cli(*args, state_dir=state_dir).stdout.strip()


class IstiodLocal:
    """`istiod-local serve` in `state_dir`: start(), stop(), start() again on the same ports.

    `prefix` goes before the command (`ip netns exec <ns>`, a CPU-pinning launcher). With `quiet`
    it logs at warning level, so no serving line comes: its ports must then be given, and readiness
    is its TLS port accepting connections (from the caller's network namespace).
    """

    def __init__(self, state_dir: Path, *, registry: Path | RegistryFile | None = None,
                 grpc_addr: str = "127.0.0.1:0", secure_addr: str = "127.0.0.1:0", args: Sequence[str] = (),
                 prefix: Sequence[str] = (), env: Mapping[str, str] | None = None, quiet: bool = False,
                 kube_api_addr: str = "off") -> None:
        self.state_dir = state_dir
        self.registry = registry.path if isinstance(registry, RegistryFile) else registry
        self.grpc_addr, self.secure_addr = grpc_addr, secure_addr
        self.kube_api_addr = kube_api_addr
        self.kube_api = ""
        self.args, self.prefix, self.env, self.quiet = list(args), list(prefix), env, quiet
        self.proc: subprocess.Popen[str] | None = None
        self._log: LineCollector | None = None
        self.plaintext = self.secure = ""
        if any(a == "--kube-api-addr" or a.startswith("--kube-api-addr=") for a in self.args):
            # Passed through `args`, start() would not know to wait for the API's serving line.
            raise ValueError("give the Kubernetes API's address as kube_api_addr=, not in args")
        if quiet and (_port(secure_addr) == 0 or (grpc_addr and _port(grpc_addr) == 0)):
            raise ValueError("a quiet istiod-local logs no serving line: give it fixed ports")

    def argv(self) -> list[str]:
        argv = [*self.prefix, str(ISTIOD_LOCAL), "serve", "--state-dir", str(self.state_dir),
                "--grpc-addr", self.grpc_addr, "--secure-grpc-addr", self.secure_addr]
        if self.registry is not None:
            argv += ["--registry", str(self.registry)]
        if self.quiet:
            argv += ["--log-level", "warning"]
        argv += ["--kube-api-addr", self.kube_api_addr]
        return argv + self.args

    def start(self, timeout: float = 30.0) -> IstiodLocal:
        """Start serving and return once it does (AssertionError, with its log, when it exits or stays silent)."""
        assert not self.running, "istiod-local is already running"
        self.stop()  # reap (and close the pipe of) a previous run that ended on its own
        self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=None if self.env is None else dict(self.env))
        self._log = LineCollector(self.proc.stderr)
        try:
            if self.quiet:
                self.plaintext, self.secure = self.grpc_addr, self.secure_addr
                poll(self._accepting, "istiod-local to listen", timeout, self.log_text)
            else:
                plaintext, secure = serving_addresses(self.proc, self._log, timeout)
                self.plaintext, self.secure = ("" if a == "off" else a for a in (plaintext, secure))
        except BaseException:
            self.stop()
            raise
        if self.kube_api_addr != "off":
            if self.quiet:
                self.kube_api = self.kube_api_addr
            else:
                self.kube_api = poll(self._kube_serving, "istiod-local's Kubernetes API to serve", timeout,
                                     self.log_text)
            self.kube_api_addr = self.kube_api
        # A later start() comes back where this one listened.
        self.grpc_addr, self.secure_addr = self.plaintext, self.secure
        return self

    def _kube_serving(self) -> str | None:
        assert self.proc is not None and self._log is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"istiod-local exited with {self.proc.returncode}:\n{self.log_text()}")
        return next((m.group(1) for m in map(KUBE_SERVING_LINE.search, list(self._log.lines)) if m), None)

    @property
    def kube_api_url(self) -> str:
        """https://host:port of its Kubernetes API (started with `kube_api_addr`)."""
        assert self.kube_api, "istiod-local's Kubernetes API is off"
        return f"https://{self.kube_api}"

    def kubeconfig(self, out: Path, *, identity: str | None = None, token_ttl: str | None = None,
                   service_account_dir: Path | None = None) -> Path:
        """`istiod-local kubeconfig` for its API (admin identity unless `identity` is given); returns `out`."""
        args = ["kubeconfig", "--out", str(out), "--server", self.kube_api_url]
        if identity is not None:
            args += ["--identity", identity]
        if token_ttl is not None:
            args += ["--token-ttl", token_ttl]
        if service_account_dir is not None:
            args += ["--service-account-dir", str(service_account_dir)]
        istiod_local_cli(*args, state_dir=self.state_dir, env=self.env)
        return out

    def _accepting(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"istiod-local exited with {self.proc.returncode}:\n{self.log_text()}")
        return port_accepts(self.secure_port)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after `grace`); its exit code, None when it was not running."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        stop_process(proc, grace)
        self._close(proc)
        return proc.returncode

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send `sig` and wait for the exit code (a test of how it stops); its log is complete afterwards."""
        assert self.proc is not None, "istiod-local is not running"
        proc = self.proc
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout)
        finally:
            self.stop()
        return code

    def _close(self, proc: subprocess.Popen[str]) -> None:
        if self._log is not None:
            self._log.join(5)
        if proc.stderr is not None:
            proc.stderr.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def plaintext_port(self) -> int:
        return _port(self.plaintext)

    @property
    def secure_port(self) -> int:
        return _port(self.secure)

    @property
    def secure_address(self) -> str:
        """The TLS address as agents dial it: `localhost` is a name in istiod-local's serving certificate."""
        return f"localhost:{self.secure_port}"

    @property
    def lines(self) -> list[str]:
        return list(self._log.lines) if self._log is not None else []

    @property
    def log(self) -> LineCollector:
        """Its stderr lines (of the latest start)."""
        assert self._log is not None, "istiod-local was never started"
        return self._log

    def log_text(self) -> str:
        return self._log.text() if self._log is not None else ""

    def pod_files(self, out: Path, **options: Any) -> Path:
        return pod_files(self.state_dir, out, env=self.env, **options)

    def token(self, **options: Any) -> str:
        return mint_token(self.state_dir, **options)

    def root_pem(self) -> bytes:
        return (self.state_dir / "root-cert.pem").read_bytes()

    def __enter__(self) -> IstiodLocal:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _port(address: str) -> int:
    return int(address.rpartition(":")[2] or 0)


# ---- pilot-agent ---------------------------------------------------------------------------------


def pilot_agent_cli(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                    timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """One `pilot-agent <args>` run to its end (wait, request, secrets, version, a start that must fail)."""
    return subprocess.run([str(PILOT_AGENT), *args], cwd=cwd, env=None if env is None else dict(env),
                          capture_output=True, text=True, timeout=timeout)


def agent_environment(*, pod: str = "echo-1", namespace: str = "default", service_account: str = "echo",
                      instance_ip: str = "127.0.0.1", discovery: str | None = None,
                      proxy_config: Mapping[str, Any] | None = None, base: Mapping[str, str] | None = None,
                      **variables: str) -> dict[str, str]:
    """The istio-proxy container's environment as the injector writes it, on top of `base` (this process's).

    `discovery` is istiod's address for both xDS and the CA; `variables` are any other settings
    (DISABLE_ENVOY="true", OUTPUT_CERTS=..., ...).
    """
    environment = dict(os.environ if base is None else base)
    environment.update(POD_NAME=pod, POD_NAMESPACE=namespace, SERVICE_ACCOUNT=service_account,
                       INSTANCE_IP=instance_ip)
    config = dict(proxy_config or {})
    if discovery is not None:
        environment["CA_ADDR"] = discovery
        config.setdefault("discoveryAddress", discovery)
    if config:
        environment["PROXY_CONFIG"] = json.dumps(config)
    environment.update(variables)
    return environment


class PilotAgent:
    """One `pilot-agent` process (`proxy sidecar` unless told otherwise) working in `pod_dir`.

    `executable` is this checkout's venv's `pilot-agent` unless another installation's is given.

    Its output (stdout and stderr) is collected for failure messages, or written to `log_file`.
    `prefix` goes before the command (`ip netns exec <ns>`). `executable` may be upstream's Go `pilot-agent`
    (a benchmark's second arm).
    """

    def __init__(self, pod_dir: Path, env: Mapping[str, str], *, args: Sequence[str] = SIDECAR,
                 prefix: Sequence[str] = (), log_file: Path | None = None, executable: Path = PILOT_AGENT) -> None:
        self.pod_dir, self.env, self.executable = pod_dir, dict(env), executable
        self.args, self.prefix, self.log_file = list(args), list(prefix), log_file
        self.proc: subprocess.Popen[str] | None = None
        self.log: LineCollector | None = None
        self._log_handle: IO[str] | None = None

    @property
    def runs_envoy(self) -> bool:
        return self.args[:1] == ["proxy"] and self.env.get("DISABLE_ENVOY", "") != "true"

    @property
    def uses_host_sidecar_ports(self) -> bool:
        """An Envoy sidecar on the host's network binds the fixed sidecar ports there."""
        return self.runs_envoy and not self.prefix

    def start(self) -> PilotAgent:
        assert self.proc is None, "the agent was started already"
        if self.log_file is not None:
            self._log_handle = self.log_file.open("a")
        self.proc = subprocess.Popen([*self.prefix, str(self.executable), *self.args], cwd=self.pod_dir, env=self.env,
                                     stdout=self._log_handle or subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if self._log_handle is None:
            self.log = LineCollector(self.proc.stdout)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self, lines: int = 60) -> str:
        if self.log is not None:
            return self.log.tail(lines)
        if self.log_file is not None and self.log_file.exists():
            return "".join(self.log_file.read_text(errors="replace").splitlines(keepends=True)[-lines:])
        return ""

    def envoy_pid(self) -> int | None:
        """Envoy is the agent's child process named `envoy`."""
        for child in child_pids(self.pid):
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "envoy":
                    return child
            except OSError:
                continue
        return None

    def _running(self) -> None:
        if not self.alive():
            raise AssertionError(f"the agent exited early:\n{self.output()}")

    def wait_answering(self, port: int, path: str = "/healthz/ready", timeout: float = 20.0,
                       host: str = "127.0.0.1") -> tuple[int, bytes]:
        """The first answer, whatever its status, of the agent's HTTP server on `port`."""
        def answered() -> tuple[int, bytes]:
            self._running()
            return http_request(host, port, path, timeout=1.0)

        return poll(answered, f"{host}:{port}{path} to answer", timeout, self.output, retry_on=HTTP_NOT_YET)

    def wait_ready(self, timeout: float = 20.0, host: str = "127.0.0.1") -> None:
        """Envoy's readiness listener (15021) answers 200, and it is this agent's Envoy that answers."""
        def ready() -> bool:
            self._running()
            return http_request(host, 15021, "/healthz/ready", timeout=1.0)[0] == 200

        poll(ready, f"{host}:15021/healthz/ready to answer 200", timeout, self.output, retry_on=HTTP_NOT_YET)
        assert self.alive() and self.envoy_pid() is not None, f"ready, but not this agent:\n{self.output()}"

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not exit within {timeout:g}s:\n{self.output()}") from None

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """Cleanup: SIGKILL the agent and its Envoy (which would also go by its parent-death signal)."""
        if self.proc is None:
            return
        envoy = self.envoy_pid() if self.alive() else None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if envoy is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(envoy, signal.SIGKILL)
            poll(lambda: not pid_alive(envoy), "Envoy to be gone", 10)
        if self.log is not None:
            self.log.join(5)
        for stream in (self.proc.stdout, self._log_handle):
            if stream is not None:
                stream.close()


# ---- the host's sidecar ports --------------------------------------------------------------------


def port_in_use(port: int) -> bool:
    """True when something listens on `port` (a listener on any local address blocks a wildcard bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def wait_sidecar_ports_free(timeout: float = 15.0) -> None:
    """A host-network agent needs the fixed sidecar ports; wait for a previous agent to let go of them."""
    poll(lambda: not any(port_in_use(p) for p in SIDECAR_PORTS), "the sidecar ports to be free", timeout,
         lambda: "busy: " + ", ".join(str(p) for p in SIDECAR_PORTS if port_in_use(p)))


@contextlib.contextmanager
def host_sidecar_ports(timeout: float = 180.0) -> Iterator[None]:
    """Exclusive use of the host's sidecar ports: the cross-process lock, then the ports free."""
    with HOST_PORTS_LOCK.open("a") as handle:
        poll(lambda: _try_lock(handle), f"the host sidecar ports lock {HOST_PORTS_LOCK}", timeout)
        try:
            # Agents started without the lock (other test files) may still hold the ports for a while.
            wait_sidecar_ports_free(timeout=60)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# ---- a local node --------------------------------------------------------------------------------


@contextlib.contextmanager
def local_node(prefix: str, **options: Any) -> Iterator[LocalNode]:
    """A created LocalNode (`NodeOptions(**options)`) working in a fresh directory; closed (every namespace,
    process and runtime directory it made gone) and the directory removed afterwards. Its registry is
    `node.registry`; its pods' directories are under `node.runtime.path` (where the agent and Envoy,
    uid 1337, reach them). `ISTIO_AGENT_TEST_NODE_CAPTURE=init` runs the node in init-container capture mode
    (NodeOptions.capture) unless the test chooses; the default is the node's own ("cni")."""
    from istiod_local.node.local_node import LocalNode, NodeOptions

    if os.environ.get("ISTIO_AGENT_TEST_NODE_CAPTURE"):
        options.setdefault("capture", os.environ["ISTIO_AGENT_TEST_NODE_CAPTURE"])
    with open_workdir(prefix) as base:
        node = LocalNode(NodeOptions(workdir=base / "node", **options))
        try:
            node.create()
            yield node
        finally:
            node.close()
