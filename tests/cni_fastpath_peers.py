"""A real install-cni serving the istio-cni fast path, against a `cni_peers.PodApi`, for the fast-path tests.

install-cni runs as the node agent would (root): its service-account directory holds the pod API's
token and CA and KUBERNETES_SERVICE_HOST/PORT point at it, so the kubeconfig it writes for the plugin
reaches that API. Its bin dir then holds the launcher (`bin/istio-cni`), which a test runs side by side
with the console script (`.venv/bin/istio-cni`, always in-process) on the same environment and stdin.
Directories come from `tempfile.mkdtemp` (short paths: a unix socket path must fit in 108 bytes) and are
made 0755 so a non-root caller can reach the socket to be refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from cni_peers import TOKEN, PodApi
from support import HTTP_NOT_YET, VENV_BIN, LineCollector, free_port, http_request, poll, stop_process

INSTALL_CNI = VENV_BIN / "install-cni"
CONSOLE_SCRIPT = VENV_BIN / "istio-cni"
PRIMARY = {"cniVersion": "0.3.1", "name": "k8s-pod-network", "plugins": [{"type": "bridge"}]}


class FastPathAgent:
    """install-cni on scratch directories, its pod API given (or a closed port: the API down)."""

    def __init__(self, api: PodApi | None, api_port: int = 0) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="iacni-fp-"))
        self.root.chmod(0o755)
        self.net_dir, self.bin_dir = self.root / "net.d", self.root / "bin"
        self.run_dir, self.sa_dir = self.root / "run", self.root / "sa"
        for folder in (self.net_dir, self.bin_dir, self.run_dir, self.sa_dir):
            folder.mkdir()
            folder.chmod(0o755)
        (self.net_dir / "10-bridge.conflist").write_text(json.dumps(PRIMARY))
        (self.sa_dir / "token").write_text(TOKEN)
        (self.sa_dir / "ca.crt").write_bytes(api.ca_pem if api is not None else b"")
        (self.sa_dir / "namespace").write_text("istio-system")
        self.port = api.port if api is not None else api_port
        self.readiness_port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.log: LineCollector | None = None

    @property
    def launcher(self) -> Path:
        return self.bin_dir / "istio-cni"

    @property
    def socket(self) -> Path:
        return self.run_dir / "sidecar-add.sock"

    def start(self) -> FastPathAgent:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "CNI_", "REPAIR_"))}
        env.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(self.port))
        argv = [str(INSTALL_CNI), f"--mounted-cni-net-dir={self.net_dir}", f"--cni-bin-dir={self.bin_dir}",
                f"--cni-agent-run-dir={self.run_dir}", f"--service-account-dir={self.sa_dir}",
                f"--readiness-port={self.readiness_port}", "--monitoring-port=0", "--repair-enabled=false",
                "--log_output_level=all:debug"]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = LineCollector(self.proc.stdout)
        poll(self.ready, "install-cni ready (launcher, kubeconfig and entry installed)", 20, self.output)
        assert self.socket.exists(), self.output()
        return self

    def ready(self) -> bool:
        try:
            return http_request("127.0.0.1", self.readiness_port, "/readyz")[0] == 200
        except HTTP_NOT_YET:
            return False

    def output(self) -> str:
        return self.log.text() if self.log else ""

    def fast_path_answers(self) -> int:
        """How many calls install-cni says it answered on the fast path."""
        return self.output().count(" answered with status ")

    def answers_reach(self, count: int) -> int:
        """The answers logged, once at least `count` are (install-cni logs a call after the caller has its answer)."""
        return poll(lambda: (n := self.fast_path_answers()) >= count and n, f"install-cni's log of {count} answers",
                    10, self.output)

    def config(self, **fields: Any) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
                "cni_agent_run_dir": str(self.run_dir), "exclude_namespaces": ["kube-system"],
                "pod_namespace": "istio-system", "plugin_log_level": "debug",
                "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.78.0.2/24", "interface": 0}]},
                **fields}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        stop_process(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)


# A path that exists but is no network namespace: the fast path takes the call (it declines one whose netns it
# cannot see), and a case that went as far as entering it would fail there, never touch this host's rules.
NOT_A_NETNS = "/dev/null"
GONE_NETNS = "/var/run/netns/iacni-gone"


def cni_env(command: str = "ADD", pod_name: str = "app-1", namespace: str = "shop", netns: str = "",
            **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": command, "CNI_CONTAINERID": "c0ffee",
           "CNI_NETNS": netns or NOT_A_NETNS, "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod_name}",
           "ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES": "2", "ISTIO_CNI_POD_RETRIEVAL_INTERVAL": "10ms"}
    env.update(extra)
    return {k: v for k, v in env.items() if v != ""}


def run_plugin(executable: Path, env: dict[str, str], stdin: bytes | dict[str, Any],
               **popen: Any) -> subprocess.CompletedProcess[bytes]:
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    return subprocess.run([str(executable)], input=data, env=env, capture_output=True, timeout=60, check=False,
                          **popen)
