"""Where upstream's Go pilot-agent is, for the tests that run it beside ours (one helper, so that one place
says where upstream's commands live).

Upstream's commands are built from the Go module proxy into `<checkout>/.upstream/bin` (`make upstream`),
or wherever `ISTIO_UPSTREAM_BIN` points. The Go agent also reads Envoy's bootstrap template from
`./var/lib/istio/envoy/envoy_bootstrap_tmpl.json` in its working directory, a file of upstream's proxy
image, not of its binary: it is taken from `<bin>/../share/envoy_bootstrap_tmpl.json` when that exists,
else from the Go module cache of the pinned version (`go env GOMODCACHE`). It is upstream's source, never
copied into the repository: a test copies it into its pod's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support import ROOT

UPSTREAM_BIN_ENV = "ISTIO_UPSTREAM_BIN"
# The pinned version (`upstream.version` at the checkout's root names it when present).
PINNED_VERSION = "v0.0.0-20260827124520-eed52ebb66ad"
TEMPLATE_IN_IMAGE = "var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
TEMPLATE_IN_MODULE = "tools/packaging/common/envoy_bootstrap.json"


def upstream_bin() -> Path:
    given = os.environ.get(UPSTREAM_BIN_ENV, "")
    return Path(given) if given else ROOT / ".upstream" / "bin"


def pinned_version() -> str:
    stamp = ROOT / "upstream.version"
    if stamp.is_file():
        text = stamp.read_text().strip()
        if text:
            return text.rpartition("@")[2]
    return PINNED_VERSION


def bootstrap_template() -> Path | None:
    """Upstream's Envoy bootstrap template, or None when neither place has it."""
    shared = upstream_bin().parent / "share" / "envoy_bootstrap_tmpl.json"
    if shared.is_file():
        return shared
    go = shutil.which("go")
    if go is None:
        return None
    try:
        cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    template = Path(cache) / f"istio.io/istio@{pinned_version()}" / TEMPLATE_IN_MODULE
    return template if cache and template.is_file() else None


def missing() -> str:
    """Why upstream's Go pilot-agent cannot run here ("" when it can)."""
    agent = upstream_bin() / "pilot-agent"
    if not os.access(agent, os.X_OK):
        return (f"upstream's Go pilot-agent is not installed at {agent} (run `make upstream`, or point "
                f"{UPSTREAM_BIN_ENV} at a directory holding it)")
    if bootstrap_template() is None:
        return (f"upstream's Envoy bootstrap template is neither in {upstream_bin().parent / 'share'} nor in the "
                f"Go module cache of istio.io/istio@{pinned_version()}")
    return ""


def lay_out_pod(pod_dir: Path) -> None:
    """Give a pod directory the bootstrap template upstream's proxy image has."""
    template = bootstrap_template()
    assert template is not None, missing()
    target = pod_dir / TEMPLATE_IN_IMAGE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(template.read_bytes())
