"""Prerequisites of a test: skip when one is missing, or fail under `REQUIRE_ALL=1` (set by CI).

So that a missing tool or missing root privileges can never make the suite look greener than it
is. Tests import these as `from needs import ...`: a module of its own, because `conftest` is a
different module in every tier that has one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import CONFORMANCE, ENVOY, ISTIOD_LOCAL, PILOT_AGENT

if TYPE_CHECKING:
    from istiod_local.node.upstream import UpstreamCommands


def require_all() -> bool:
    return os.environ.get("REQUIRE_ALL", "") not in ("", "0", "false")


def need(condition: bool, reason: str) -> None:
    """Skip (or, under REQUIRE_ALL, fail) when a prerequisite is missing."""
    if condition:
        return
    if require_all():
        pytest.fail(f"REQUIRE_ALL=1 and a prerequisite is missing: {reason}")
    pytest.skip(reason)


def need_root() -> None:
    need(os.geteuid() == 0, "needs root (network namespaces, iptables)")


def need_tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")
    need(path is not None, f"needs the '{name}' tool on PATH")
    assert path is not None
    return path


def need_file(path: Path, what: str = "") -> Path:
    need(path.exists(), f"needs {what or path} at {path} (run `make setup`)")
    return path


def need_conformance(sub: str) -> Path:
    folder = CONFORMANCE / sub
    need(folder.is_dir(), f"conformance kit not found at {folder}")
    return folder


def need_sidecar_binaries() -> None:
    """istiod-local, pilot-agent and Envoy, for a test that starts a sidecar without the tier's fixtures."""
    for binary in (ISTIOD_LOCAL, PILOT_AGENT, ENVOY):
        need_file(binary)


def need_upstream_commands(*commands: str) -> UpstreamCommands:
    """Upstream's Go commands (and, with pilot-agent, its bootstrap template) where the local node looks for them
    (`ISTIO_UPSTREAM_BIN`, else `<checkout>/.upstream/bin`: `istiod_local.node.upstream`)."""
    from istiod_local.node.upstream import upstream_commands

    found = upstream_commands()
    missing = found.missing(*commands)
    need(not missing, missing)
    return found
