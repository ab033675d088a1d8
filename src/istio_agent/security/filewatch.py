"""Watching mounted certificate files without inotify.

Kubernetes updates a secret volume by writing a new `..<timestamp>` directory
and atomically swapping the `..data` symlink; the visible file names are
symlinks through `..data`, so neither their own mtime nor their inode changes.
Hashing what the path currently resolves to catches that swap, in-place
rewrites, and files that appear or vanish, at the cost of reading a few KiB
per poll. Polling runs only while at least one file is watched, so an agent
that serves no file-backed secret never wakes up for them.

Re-reads follow the SDS path's rules (`filereads`: regular files only, 4 MiB
cap) and run on their own daemon thread per file, never on the event loop: a
file on a hung filesystem holds up only its own next check (a file whose read
is still outstanding is skipped by later polls), not the other files nor the
agent. A watch starts from the digest of the content the cache actually served
and ends when the cache unwatches the name (its last SDS subscriber went).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from istio_agent.periodic import Periodic
from istio_agent.security.filereads import file_digest
from istio_agent.security.offloop import in_daemon_thread

log = logging.getLogger(__name__)


class FileWatcher:
    """Polls a set of files; each file maps to the keys (resource names) that depend on it."""

    def __init__(self, interval: float, on_change: Callable[[set[str]], None]) -> None:
        self._on_change = on_change
        self._digests: dict[Path, str | None] = {}
        self._keys: dict[Path, set[str]] = {}
        self._reading: dict[Path, asyncio.Task[None]] = {}
        self._ticker = Periodic(interval, self._tick, "cert-file-watcher")
        self._started = False
        # Upstream's num_file_watcher_failures_total counts watches its inotify watcher could not add and the
        # errors it reported. A poll has no watch to add: what fails here is a watched file becoming unreadable
        # (missing, refused), counted once until it reads again, and a change that could not be handled.
        self.failures = 0

    def watch(self, path: Path, key: str, digest: str | None) -> None:
        """Watch `path` for `key`; `digest` is that of the content just loaded (kept if the path is watched already)."""
        path = Path(path)
        if path not in self._keys:
            self._keys[path] = set()
            self._digests[path] = digest
        self._keys[path].add(key)
        if self._started and not self._ticker.running:
            self._ticker.start_soon()

    def unwatch(self, key: str) -> None:
        """Stop watching files for `key`; a file no other key depends on is forgotten."""
        for path in [p for p, keys in self._keys.items() if key in keys]:
            keys = self._keys[path]
            keys.discard(key)
            if keys:
                continue
            del self._keys[path]
            self._digests.pop(path, None)
            task = self._reading.pop(path, None)
            if task is not None:
                task.cancel()
        if not self._keys and self._ticker.running:
            asyncio.get_running_loop().create_task(self._stop_ticker_if_idle())

    def watched(self) -> dict[Path, set[str]]:
        return {path: set(keys) for path, keys in self._keys.items()}

    async def poll_once(self) -> None:
        """Check every watched file whose previous read has finished, and wait for these checks."""
        tasks = self._start_checks()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def start(self) -> None:
        self._started = True
        if self._keys:
            await self._ticker.start()

    async def stop(self) -> None:
        self._started = False
        await self._ticker.stop()
        tasks = list(self._reading.values())
        self._reading.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_ticker_if_idle(self) -> None:
        await self._ticker.stop()
        if self._started and self._keys:  # a watch arrived while stopping
            self._ticker.start_soon()

    async def _tick(self) -> None:
        self._start_checks()

    def _start_checks(self) -> list[asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        started: list[asyncio.Task[None]] = []
        for path in list(self._keys):
            if path in self._reading:
                continue  # still reading it from an earlier poll
            task = loop.create_task(self._check(path), name=f"cert-file-check {path}")
            self._reading[path] = task
            task.add_done_callback(functools.partial(self._forget_read, path))
            started.append(task)
        return started

    def _forget_read(self, path: Path, task: asyncio.Task[None]) -> None:
        if self._reading.get(path) is task:
            del self._reading[path]

    async def _check(self, path: Path) -> None:
        digest = await in_daemon_thread("cert-file-digest", file_digest, path)
        keys = self._keys.get(path)
        if keys is None or digest == self._digests.get(path):
            return
        if digest is None:
            self.failures += 1
        self._digests[path] = digest
        try:
            self._on_change(set(keys))
        except Exception:
            self.failures += 1
            log.exception("certificate file watch failed for %s", path)
