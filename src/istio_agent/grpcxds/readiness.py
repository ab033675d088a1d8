"""Readiness of a proxyless pod: the gRPC bootstrap loads and its certificate files exist.

Upstream's probe loads the bootstrap once and keeps it; every later check
only looks for the files of its `file_watcher` certificate provider, so the
pod turns ready when the agent has written the workload certificate to
OUTPUT_CERTS (the app would fail its mTLS handshakes before that).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from istio_agent.grpcxds.bootstrap import FILE_WATCHER_PLUGIN


class BootstrapError(ValueError):
    """The bootstrap file is not a bootstrap upstream's loader would accept."""


def watched_files(bootstrap: Any) -> list[str]:
    """Certificate, key and CA paths of the `file_watcher` provider (none without one); BootstrapError if malformed.

    The checks mirror Go's unmarshalling into upstream's Bootstrap struct: a
    wrong JSON type for a known field fails the load; unknown fields are ignored.
    """
    if not isinstance(bootstrap, dict):
        raise BootstrapError("not a JSON object")
    for key, kind in (("xds_servers", list), ("node", dict), ("certificate_providers", dict),
                      ("server_listener_resource_name_template", str)):
        if bootstrap.get(key) is not None and not isinstance(bootstrap[key], kind):
            raise BootstrapError(f"{key}: expected a JSON {kind.__name__.replace('dict', 'object')}")
    for name, provider in (bootstrap.get("certificate_providers") or {}).items():
        if not isinstance(provider, dict):
            raise BootstrapError(f"certificate_providers.{name}: expected a JSON object")
        if provider.get("plugin_name") != FILE_WATCHER_PLUGIN:
            continue
        config = provider.get("config") or {}
        if not isinstance(config, dict):
            raise BootstrapError(f"certificate_providers.{name}.config: expected a JSON object")
        files = [config.get(k) or "" for k in ("certificate_file", "private_key_file", "ca_certificate_file")]
        if not all(isinstance(f, str) for f in files):
            raise BootstrapError(f"certificate_providers.{name}.config: file names must be strings")
        return files
    return []


class BootstrapProbe:
    """`check()` → None when ready, else why not. Relative paths resolve against `workdir` (the pod root)."""

    def __init__(self, path: Path, workdir: Path, exists: Callable[[Path], bool] = Path.exists) -> None:
        self.path = path
        self.workdir = workdir
        self._exists = exists
        self._files: list[str] | None = None

    def _load(self) -> list[str]:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise BootstrapError(exc.strerror or str(exc)) from None
        try:
            parsed = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BootstrapError(f"invalid JSON: {exc}") from None
        return watched_files(parsed)

    def check(self) -> str | None:
        if self._files is None:
            try:
                self._files = self._load()
            except BootstrapError as exc:
                return f"failed loading {self.path}: {exc}"
        for name in self._files:
            if not name or not self._exists(self.workdir / name):
                return f"{name} does not exist"
        return None
