"""A real `install-cni` process on scratch directories, for the tests of the node agent (`InstallCni`).

Each instance writes its own service-account directory (token, ca.crt, namespace) and points
KUBERNETES_SERVICE_HOST/PORT at 127.0.0.1:6443 (nothing needs to answer there: install-cni only
writes the plugin's kubeconfig for it). Ports are free ones (`--readiness-port` is ours, so a dev
machine's busy :8000 does not matter); repair is off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from support import HTTP_NOT_YET, VENV_BIN, LineCollector, free_port, http_request, poll, stop_process

INSTALL_CNI = VENV_BIN / "install-cni"
PLUGIN = VENV_BIN / "istio-cni"
CALICO = {"cniVersion": "0.3.1", "name": "k8s-pod-network", "plugins": [
    {"type": "calico", "ipam": {"type": "calico-ipam"}, "policy": {"type": "k8s"}},
    {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}]}


def write_atomically(path: Path, text: str) -> None:
    """How another CNI agent writes its config: a temporary file renamed over the old one."""
    temporary = path.with_name("." + path.name + ".new")
    temporary.write_text(text)
    temporary.rename(path)


class InstallCni:
    """One install-cni process and its directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.net_dir = root / "net.d"
        self.bin_dir = root / "bin"
        self.run_dir = root / "run"
        self.sa_dir = root / "sa"
        for folder in (self.net_dir, self.bin_dir, self.run_dir, self.sa_dir):
            folder.mkdir()
        (self.sa_dir / "token").write_text("token-one")
        (self.sa_dir / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
        (self.sa_dir / "namespace").write_text("istio-system")
        self.readiness_port = free_port()
        self.monitoring_port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.log: LineCollector | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / "istio-cni-kubeconfig"

    @property
    def socket_path(self) -> Path:
        return self.run_dir / "log.sock"

    def launcher(self) -> bytes:
        """What install-cni installs as istio-cni: the launcher for this installation and run dir."""
        from istio_agent.cni.install.launcher import import_paths, interpreter_of, render

        return render(interpreter_of(PLUGIN), str(self.run_dir / "sidecar-add.sock"), import_paths())

    def args(self, *extra: str) -> list[str]:
        return [str(INSTALL_CNI), f"--mounted-cni-net-dir={self.net_dir}", f"--cni-bin-dir={self.bin_dir}",
                f"--cni-agent-run-dir={self.run_dir}", f"--service-account-dir={self.sa_dir}",
                f"--readiness-port={self.readiness_port}", f"--monitoring-port={self.monitoring_port}",
                "--repair-enabled=false", *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "CNI_", "REPAIR_"))}
        env.update({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"})
        env.update(extra)
        return env

    def start(self, *extra: str, **env: str) -> None:
        self.proc = subprocess.Popen(self.args(*extra), env=self.env(**env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.log = LineCollector(self.proc.stdout)
        poll(lambda: self.status("/healthz") == 200, "install-cni's /healthz", 20, self.output, retry_on=HTTP_NOT_YET)

    def output(self) -> str:
        return self.log.text() if self.log else ""

    def status(self, path: str) -> int:
        return http_request("127.0.0.1", self.readiness_port, path)[0]

    def ready(self) -> bool:
        try:
            return self.status("/readyz") == 200
        except HTTP_NOT_YET:
            return False

    def metrics(self) -> str:
        status, body = http_request("127.0.0.1", self.monitoring_port, "/metrics")
        assert status == 200, f"/metrics on {self.monitoring_port}: {status} {body!r}\n{self.output()}"
        return body.decode()

    def has_entry(self, name: str) -> bool:
        try:
            config = json.loads((self.net_dir / name).read_text())
        except (OSError, ValueError):
            return False
        return "istio-cni" in [p.get("type") for p in config.get("plugins", [])]

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(20)
        assert self.log is not None
        self.log.join(5)
        return code

    def close(self) -> None:
        stop_process(self.proc)
