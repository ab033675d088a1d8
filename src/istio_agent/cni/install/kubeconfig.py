"""The plugin's kubeconfig (`<cni-agent-run-dir>/istio-cni-kubeconfig`), rendered as upstream writes it.

Upstream builds a client-go `Config` (cluster `local`, user `istio-cni`, context
`istio-cni-context`) and marshals it with sigs.k8s.io/yaml: keys sorted, lists
not indented under their key. `render_kubeconfig` produces the same text from
the server URL, the CA bytes (or insecure-skip-tls-verify) and the token bytes
as read (not trimmed, as upstream). Scalars that plain YAML would misread are
written double-quoted (valid YAML; go-yaml would pick another quoting style).
Pure: the edge reads the files and writes the result (`installer.py`).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass

CLUSTER_NAME = "local"
USER_NAME = "istio-cni"
CONTEXT_NAME = "istio-cni-context"

_PLAIN = re.compile(r"[A-Za-z0-9_./+=-][A-Za-z0-9_./+=:@-]*")
_AMBIGUOUS = re.compile(r"(?i)(y|n|yes|no|true|false|on|off|null|~|[-+]?(\d[\d_]*)?\.?\d+([eE][-+]?\d+)?|0x[0-9a-f]+|"
                        r"0o[0-7]+|[-+]?\.(inf|nan)|\d+:\d+(:\d+)*)")


def yaml_scalar(text: str) -> str:
    """A string as a YAML scalar: plain when unambiguous, otherwise double-quoted (JSON escapes are YAML's)."""
    if text and _PLAIN.fullmatch(text) and not _AMBIGUOUS.fullmatch(text) and not text.endswith(":"):
        return text
    return json.dumps(text)


@dataclass(frozen=True)
class KubeconfigInputs:
    """What the kubeconfig says: the API server, how to trust it, and the bearer token."""

    server: str
    token: bytes
    ca_data: bytes | None  # None with skip_tls_verify
    skip_tls_verify: bool = False


def render_kubeconfig(inputs: KubeconfigInputs) -> str:
    """The kubeconfig text (apiVersion v1, keys sorted as sigs.k8s.io/yaml writes them)."""
    cluster = []
    if inputs.ca_data is not None and not inputs.skip_tls_verify:
        cluster.append(f"    certificate-authority-data: {base64.b64encode(inputs.ca_data).decode()}")
    if inputs.skip_tls_verify:
        cluster.append("    insecure-skip-tls-verify: true")
    cluster.append(f"    server: {yaml_scalar(inputs.server)}")
    token = inputs.token.decode("utf-8", errors="replace")
    return "\n".join([
        "apiVersion: v1",
        "clusters:",
        "- cluster:",
        *cluster,
        f"  name: {CLUSTER_NAME}",
        "contexts:",
        "- context:",
        f"    cluster: {CLUSTER_NAME}",
        f"    user: {USER_NAME}",
        f"  name: {CONTEXT_NAME}",
        f"current-context: {CONTEXT_NAME}",
        "kind: Config",
        "users:",
        f"- name: {USER_NAME}",
        "  user:",
        f"    token: {yaml_scalar(token)}",
        "",
    ])
