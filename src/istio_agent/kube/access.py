"""Where the CNI's long-running parts reach the Kubernetes API: in-cluster settings, as client-go reads them.

`KubeAccess` is shared by install-cni (which writes the plugin's kubeconfig from
it) and the repair controller (which lists and watches pods with it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeAccessError(ValueError):
    """The in-cluster settings are missing or unusable (names the variable or file)."""


@dataclass(frozen=True)
class KubeAccess:
    """The API server's URL, the CA bundle to trust it with and the bearer token file (re-read on use)."""

    server: str
    ca_file: str
    token_file: str
    skip_tls_verify: bool = False

    def token(self) -> str:
        try:
            return Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise KubeAccessError(f"service-account token {self.token_file}: {exc.strerror or exc}") from None


def in_cluster(env: Mapping[str, str], service_account_dir: str = SERVICE_ACCOUNT_DIR, ca_file: str = "",
               skip_tls_verify: bool = False) -> KubeAccess:
    """`KUBERNETES_SERVICE_HOST`/`_PORT` (and install-cni's `KUBERNETES_SERVICE_PROTOCOL`) plus the mounted token.

    `ca_file` overrides the service account's `ca.crt` (install-cni's `--kube-ca-file`).
    """
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeAccessError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (in-cluster access)")
    protocol = env.get("KUBERNETES_SERVICE_PROTOCOL", "") or "https"
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return KubeAccess(f"{protocol}://{bracketed}:{port}", ca_file or os.path.join(service_account_dir, "ca.crt"),
                      os.path.join(service_account_dir, "token"), skip_tls_verify)
