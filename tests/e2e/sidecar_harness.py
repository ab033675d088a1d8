"""Shared plumbing for the single-sidecar tests: istiod-local, pod files, one `pilot-agent proxy sidecar`.

Everything runs as real processes (the console scripts from the venv and the
real Envoy), exactly as the issue's demo does by hand. On the host network the
agent and its Envoy use the fixed sidecar ports, so only one agent runs at a
time; `Netns` gives a pod its own network namespace (plus a client namespace
joined by a veth pair) when a test needs traffic capture. Every helper kills
what it started and deletes what it made.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from needs import need, need_root, need_tool
from support import HTTP_NOT_YET, VENV_BIN, LineCollector, serving_addresses, stop_process
from support import poll as support_poll

ISTIOD_LOCAL = VENV_BIN / "istiod-local"
PILOT_AGENT = VENV_BIN / "pilot-agent"
ISTIO_IPTABLES = VENV_BIN / "istio-iptables"
ENVOY = VENV_BIN / "envoy"
PEERS = Path(__file__).resolve().parent / "sidecar_peers.py"
# Ports a sidecar binds in its network namespace: admin, outbound, inbound, status, readiness, prometheus.
SIDECAR_PORTS = (15000, 15001, 15006, 15020, 15021, 15090)
# Held while an agent uses the fixed ports on the host network, so that test runs in other
# processes (other sessions, other files) that take it too never start a second agent there.
HOST_PORTS_LOCK = Path("/tmp/istio-agent-host-sidecar-ports.lock")
SPIFFE_ECHO = "spiffe://cluster.local/ns/default/sa/echo"
# Injector-style capture: everything in and out, Istio's own ports excluded inbound.
CAPTURE_ARGS = ("-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
                "-d", "15090,15021,15020")

T = TypeVar("T")


def registry_yaml(workload_ip: str = "127.0.0.1", mode: str = "PERMISSIVE", extra_services: str = "") -> str:
    """The `echo` service with workload `echo-1` (the agent under test), plus any `extra_services` list items."""
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


def need_sidecar_binaries() -> None:
    for binary in (ISTIOD_LOCAL, PILOT_AGENT, ENVOY):
        need(binary.exists(), f"needs {binary} (run `make setup`)")


def poll(check: Callable[[], T | None], what: str, timeout: float, on_timeout: Callable[[], str] = str) -> T:
    """`support.poll` where an endpoint that does not answer yet (`HTTP_NOT_YET`) counts as "not yet"."""
    return support_poll(check, what, timeout, on_timeout, retry_on=HTTP_NOT_YET)


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
    """The host-network tests need the fixed sidecar ports; wait for a previous agent to let go of them."""
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


def _try_lock(handle: Any) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def http_request(host: str, port: int, path: str, method: str = "GET", timeout: float = 3.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def stats(admin_port: int = 15000, host: str = "127.0.0.1") -> dict[str, int]:
    status, body = http_request(host, admin_port, "/stats")
    assert status == 200, body
    out = {}
    for line in body.decode().splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def netns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


class IstiodLocal:
    """`istiod-local serve --registry` on free (or given) loopback ports."""

    def __init__(self, state_dir: Path, registry: Path, grpc_addr: str = "127.0.0.1:0",
                 secure_addr: str = "127.0.0.1:0", netns: str | None = None) -> None:
        self.proc = subprocess.Popen(
            [*netns_prefix(netns), str(ISTIOD_LOCAL), "serve", "--state-dir", str(state_dir),
             "--grpc-addr", grpc_addr, "--secure-grpc-addr", secure_addr, "--registry", str(registry)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = LineCollector(self.proc.stderr)
        self.plaintext, self.secure = serving_addresses(self.proc, self.log)

    @property
    def secure_port(self) -> int:
        return int(self.secure.rpartition(":")[2])

    @property
    def plaintext_port(self) -> int:
        return int(self.plaintext.rpartition(":")[2])

    def stop(self) -> None:
        stop_process(self.proc)


def write_pod_files(state_dir: Path, pod_dir: Path, service_account: str = "echo", pod: str = "echo-1") -> None:
    """The pod's root certificate and token, through `istiod-local pod-files` as an operator would."""
    subprocess.run(
        [str(ISTIOD_LOCAL), "pod-files", "--state-dir", str(state_dir), "--namespace", "default",
         "--service-account", service_account, "--pod", pod, "--out", str(pod_dir)],
        check=True, capture_output=True, timeout=30)


@dataclass
class SidecarAgent:
    """One `pilot-agent proxy sidecar` in `pod_dir`, talking to istiod-local at `discovery`."""

    pod_dir: Path
    discovery: str
    proxy_config: Mapping[str, Any] = field(default_factory=dict)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    netns: str | None = None
    instance_ip: str = "127.0.0.1"
    proc: subprocess.Popen[str] | None = None
    log: LineCollector | None = None

    def start(self) -> None:
        environment = {
            **os.environ,
            "POD_NAME": "echo-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "echo",
            "INSTANCE_IP": self.instance_ip, "CA_ADDR": self.discovery,
            "PROXY_CONFIG": json.dumps({"discoveryAddress": self.discovery, **self.proxy_config}),
            **self.extra_env,
        }
        self.proc = subprocess.Popen(
            [*netns_prefix(self.netns), str(PILOT_AGENT), "proxy", "sidecar"], cwd=self.pod_dir, env=environment,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = LineCollector(self.proc.stdout)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        return self.log.tail(60) if self.log else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def envoy_pid(self) -> int | None:
        """Envoy is the agent's child process named `envoy`."""
        for child in _children(self.pid):
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "envoy":
                    return child
            except OSError:
                continue
        return None

    def wait_ready(self, timeout: float = 20.0, host: str = "127.0.0.1") -> None:
        def ready() -> bool:
            if not self.alive():
                raise AssertionError(f"the agent exited early:\n{self.output()}")
            return http_request(host, 15021, "/healthz/ready", timeout=1.0)[0] == 200

        poll(ready, "localhost:15021/healthz/ready to answer 200", timeout, self.output)
        # The answer must have come from this agent's Envoy, not from one another test started.
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
        """Cleanup: SIGKILL the agent and its Envoy (Envoy has the agent as parent-death signal too)."""
        if self.proc is None:
            return
        envoy = self.envoy_pid() if self.alive() else None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if envoy is not None:
            try:
                os.kill(envoy, signal.SIGKILL)
            except ProcessLookupError:
                pass
            poll(lambda: not pid_alive(envoy), "Envoy to be gone", 10)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ---- Envoy's view -------------------------------------------------------------------------------


def config_dump(host: str = "127.0.0.1") -> dict[str, Any]:
    status, body = http_request(host, 15000, "/config_dump?include_eds", timeout=5)
    assert status == 200, body[:300]
    result: dict[str, Any] = json.loads(body)
    return result


def dump_section(dump: dict[str, Any], kind: str) -> dict[str, Any]:
    for config in dump["configs"]:
        if config["@type"].endswith("." + kind):
            section: dict[str, Any] = config
            return section
    return {}


def active_secret(dump: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in dump_section(dump, "SecretsConfigDump").get("dynamic_active_secrets", []):
        if item.get("name") == name:
            secret: dict[str, Any] = item["secret"]
            return secret
    return None


def inline_bytes(source: dict[str, Any]) -> bytes:
    """A DataSource from a config dump: inline bytes are base64 in JSON."""
    if "inline_bytes" in source:
        return base64.b64decode(source["inline_bytes"])
    return str(source.get("inline_string", "")).encode()


def active_listener_names(dump: dict[str, Any]) -> set[str]:
    listeners = dump_section(dump, "ListenersConfigDump").get("dynamic_listeners", [])
    return {item["name"] for item in listeners if "active_state" in item}


# ---- network namespaces -------------------------------------------------------------------------


def sh(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
    return done.stdout


class Netns:
    """A pod namespace and a client namespace joined by a veth pair; the pod's traffic is captured."""

    POD_IP = "10.78.0.2"
    CLIENT_IP = "10.78.0.1"

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.pod = f"sc-pod-{tag}"
        self.client = f"sc-cli-{tag}"
        self.created: list[str] = []

    @staticmethod
    def check_prerequisites() -> None:
        need_root()
        need_tool("ip")
        need_tool("curl")
        need_tool("iptables-restore")
        need(ISTIO_IPTABLES.exists(), f"needs {ISTIO_IPTABLES}")

    def create(self) -> None:
        for ns in (self.pod, self.client):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.client)
        for ns, ip in ((self.pod, self.POD_IP), (self.client, self.CLIENT_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", self.pod, str(ISTIO_IPTABLES), *CAPTURE_ARGS)

    def destroy(self) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.created.clear()

    def exec_python(self, ns: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(PEERS), *args],
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def http(self, ns: str, url: str, method: str = "GET") -> tuple[int, str]:
        """A request made from inside `ns` (curl), for ports only reachable there; status 0 when none came."""
        done = subprocess.run(["ip", "netns", "exec", ns, "curl", "-s", "-m", "2", "-X", method, "-o", "-",
                               "-w", "\n%{http_code}", url], capture_output=True, text=True, timeout=10)
        body, _, code = done.stdout.rpartition("\n")
        return int(code or 0), body

