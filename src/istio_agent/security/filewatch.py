"""Watching mounted certificate files without inotify.

Kubernetes updates a secret volume by writing a new `..<timestamp>` directory
and atomically swapping the `..data` symlink; the visible file names are
symlinks through `..data`, so neither their own mtime nor their inode changes.
Hashing what the path currently resolves to catches that swap, in-place
rewrites, and files that appear or vanish, at the cost of reading a few KiB
per poll. Polling runs only while at least one file is watched, so an agent
that serves no file-backed secret never wakes up for them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from istio_agent.periodic import Periodic

log = logging.getLogger(__name__)


def file_digest(path: Path) -> str | None:
    """SHA-256 of the content `path` resolves to now; None when it is missing or unreadable."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class FileWatcher:
    """Polls a set of files; each file maps to the keys (resource names) that depend on it."""

    def __init__(self, interval: float, on_change: Callable[[set[str]], None]) -> None:
        self._on_change = on_change
        self._digests: dict[Path, str | None] = {}
        self._keys: dict[Path, set[str]] = {}
        self._ticker = Periodic(interval, self._tick, "cert-file-watcher")
        self._started = False

    def watch(self, path: Path, key: str) -> None:
        """Start watching `path` for `key`, taking its current content as the baseline."""
        path = Path(path)
        if path not in self._keys:
            self._keys[path] = set()
            self._digests[path] = file_digest(path)
        self._keys[path].add(key)
        if self._started and not self._ticker.running:
            self._ticker.start_soon()

    def watched(self) -> dict[Path, set[str]]:
        return {path: set(keys) for path, keys in self._keys.items()}

    def poll_once(self) -> set[str]:
        """Keys whose files changed since the last poll."""
        changed: set[str] = set()
        for path, keys in self._keys.items():
            digest = file_digest(path)
            if digest != self._digests[path]:
                self._digests[path] = digest
                changed |= keys
        return changed

    async def start(self) -> None:
        self._started = True
        if self._keys:
            await self._ticker.start()

    async def stop(self) -> None:
        self._started = False
        await self._ticker.stop()

    async def _tick(self) -> None:
        try:
            changed = self.poll_once()
            if changed:
                self._on_change(changed)
        except Exception:
            log.exception("certificate file watch failed")
