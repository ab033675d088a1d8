"""The files Kubernetes would mount into an injected pod, written from istiod-local's state.

An injected pod finds the mesh root at `var/run/secrets/istio/root-cert.pem`
(the `istio-ca-root-cert` ConfigMap) and its identity at
`var/run/secrets/tokens/istio-token` (a projected service-account token with
audience `istio-ca`). Both are written 0644, as Kubernetes mounts them by
default, so an agent running as another user (istio-proxy) can read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from istiod_local.controlplane.state import ControlPlaneState, write_file_atomic
from istiod_local.controlplane.tokens import TokenIdentity, issue_token

ROOT_CERT_PATH = Path("var/run/secrets/istio/root-cert.pem")
TOKEN_PATH = Path("var/run/secrets/tokens/istio-token")


@dataclass(frozen=True)
class PodFiles:
    root_cert: Path
    token: Path


def pod_token(
    state: ControlPlaneState, namespace: str, service_account: str, pod: str, ttl_seconds: float, now: float
) -> str:
    return issue_token(state.token_key, TokenIdentity(namespace, service_account, pod), now, ttl_seconds)


def write_pod_files(
    state: ControlPlaneState, pod_dir: Path | str, namespace: str, service_account: str, pod: str,
    ttl_seconds: float, now: float,
) -> PodFiles:
    """Write (or refresh) the root certificate and the token under `pod_dir`, creating directories."""
    base = Path(pod_dir)
    root_path, token_path = base / ROOT_CERT_PATH, base / TOKEN_PATH
    for path in (root_path, token_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(root_path, state.root_cert_pem.encode(), 0o644)
    token = pod_token(state, namespace, service_account, pod, ttl_seconds, now)
    write_file_atomic(token_path, token.encode(), 0o644)
    return PodFiles(root_path, token_path)
