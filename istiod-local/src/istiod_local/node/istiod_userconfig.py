"""A user's Istio config in the real istiod's `--configDir`, and what istiod says of it.

istiod watches its config directory (fsnotify on every directory under it,
events debounced 250 ms) and then reads every `*.yaml`/`*.yml` file again,
validating each resource as it does a CRD's (`crd.ParseInputs`). One
invalid resource fails the whole reload: istiod logs `Failed to parse
<file>: <why>` and keeps the config it had, for every file. Measured here: a
change is read ~0.25 s after the write and pushed ~0.1 s later.

So each resource is written to a file of its own under `config/user/`
(`<nnn>-<kind>-<namespace>-<name>.yaml`, atomically: istiod sees whole
files), and after each write `UserConfig.apply` reads istiod's log from
where it was: when istiod names one of these files, the file is moved to
`rejected/` beside the config directory (so the next reload takes all the
others) and the resource is reported with istiod's own message
(`Rejection`); then it waits for the next reload, until one names none.
At start the directory holds no user file (istiod refuses to start on an
invalid one); `RealIstiod` applies them once it is ready.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from istiod_local.controlplane.state import write_file_atomic

USER_DIR = "user"
REJECTED_DIR = "rejected"
RELOAD_LINE = "Triggering reload of file configuration"
FAILED = re.compile(r"Failed to parse (?P<path>\S+?): (?P<message>.*)$")
RELOAD_WAIT = 5.0  # a write is read within ~0.3 s; this is the bound
SETTLE = 0.3  # after a reload starts, its failure lines follow within microseconds; this covers a busy machine


@dataclass(frozen=True)
class UserResource:
    """One resource to give istiod: its `Kind namespace/name`, where it was read, the object."""

    key: str
    source: str
    document: Mapping[str, Any]


@dataclass(frozen=True)
class Rejection:
    key: str
    source: str
    message: str  # istiod's own words

    def show(self) -> str:
        return f"istiod rejected {self.key} ({self.source}): {self.message}"


def file_name(index: int, document: Mapping[str, Any]) -> str:
    metadata = document.get("metadata") or {}
    parts = [str(document.get("kind", "")).lower(), str(metadata.get("namespace", "")), str(metadata.get("name", ""))]
    safe = "-".join(re.sub(r"[^a-z0-9.-]", "_", p.lower()) for p in parts)
    return f"{index:03d}-{safe}.yaml"


def failures(log_text: str) -> list[tuple[str, str]]:
    """(file, message) of each `Failed to parse` line istiod logged."""
    out = []
    for line in log_text.splitlines():
        found = FAILED.search(line)
        if found:
            out.append((found.group("path"), found.group("message").strip()))
    return out


class UserConfig:
    """The user files of one istiod's config directory (see the module docstring)."""

    def __init__(self, config_dir: Path, log: Path) -> None:
        self.dir = config_dir / USER_DIR
        self.rejected_dir = config_dir.parent / REJECTED_DIR
        self.log = log
        self.rejections: list[Rejection] = []
        self._written: dict[str, bytes] = {}

    def _log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with self.log.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def write(self, resources: Iterable[UserResource]) -> dict[str, UserResource]:
        """Write what changed, remove what is gone; the files (by path) istiod will read."""
        self.dir.mkdir(parents=True, exist_ok=True)
        wanted: dict[str, tuple[UserResource, bytes]] = {}
        for index, resource in enumerate(resources):
            data = yaml.safe_dump(dict(resource.document), sort_keys=False).encode()
            wanted[str(self.dir / file_name(index, resource.document))] = (resource, data)
        for path in list(self._written):
            if path not in wanted:
                Path(path).unlink(missing_ok=True)
                del self._written[path]
        for path, (_, data) in wanted.items():
            if self._written.get(path) != data or not Path(path).exists():
                write_file_atomic(Path(path), data, 0o644)
                self._written[path] = data
        return {path: resource for path, (resource, _) in wanted.items()}

    def apply(self, resources: Iterable[UserResource], running: bool = True) -> list[Rejection]:
        """Give istiod these resources; the ones it rejects, with its message (also kept in `rejections`)."""
        offset = self._log_size()
        before = dict(self._written)
        files = self.write(resources)
        if before == self._written or not running:
            return self.rejections if before == self._written else []
        self.rejections = []
        while True:
            seen = self._wait_reload(offset)
            if seen is None:
                break
            failed = [(p, m) for p, m in failures(self._log_since(seen)) if p in files]
            offset = seen + len(RELOAD_LINE)  # the next reload is after this one
            if not failed:
                break
            for path, message in dict(failed).items():
                resource = files.pop(path)
                self.rejected_dir.mkdir(parents=True, exist_ok=True)
                Path(path).replace(self.rejected_dir / Path(path).name)
                self._written.pop(path, None)
                self.rejections.append(Rejection(resource.key, resource.source, message))
        return self.rejections

    def _wait_reload(self, offset: int) -> int | None:
        """Wait for istiod's next reload after `offset`, then for its outcome; the log offset where it began
        (None: no reload within RELOAD_WAIT)."""
        deadline = time.monotonic() + RELOAD_WAIT
        while time.monotonic() < deadline:
            text = self._log_since(offset)
            at = text.find(RELOAD_LINE)
            if at >= 0:
                time.sleep(SETTLE)
                return offset + len(text[:at].encode())
            time.sleep(0.05)
        return None
