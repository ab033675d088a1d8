"""File-backed secrets by resource name: loaded off the event loop, watched while someone subscribes.

The secret cache decides which files back a name (`FileSpec`: mounted
`default`/`ROOTCA`, `file-cert:`, `file-root:`, the OS bundle); this store reads
them (`file_secrets` on a daemon thread, so a slow filesystem delays only the
request that named it), keeps the watch list honest, and reloads on change:
- a watch starts only after a file loaded and validated, from the digest of
  what was served;
- names chosen by SDS callers are watched only while the SDS server says a
  stream subscribes to them (`retain` / `release`); the pod's own mounted
  `default` and `ROOTCA` are fixed paths and stay watched once loaded;
- a change is read FILE_DEBOUNCE_DURATION later, once (writers often touch a
  file twice), retried each poll interval while it does not load (a
  half-written update), and reported to the cache, which pushes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from istio_agent.clock import Cancellable, Clock
from istio_agent.security.core.secrets import SecretError, SecretItem
from istio_agent.security.file_secrets import LoadedSecret, load_key_cert, load_root
from istio_agent.security.filewatch import FileWatcher
from istio_agent.security.offloop import in_daemon_thread
from istio_agent.security.peercred import PeerCredentials

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileSpec:
    """The files behind one resource name: a bundle (`root`) or a pair (`cert`, `key`).

    `checked`: whether an SDS caller must be able to read the files itself (names the
    caller chose); the pod's mounted files and the OS bundle are served as upstream does.
    `always_watched`: fixed pod paths, watched for the agent's life once loaded.
    """

    root: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    checked: bool = True
    always_watched: bool = False

    def load(self, name: str, now: float, caller: PeerCredentials | None) -> LoadedSecret:
        who = caller if self.checked else None
        if self.root is not None:
            return load_root(name, self.root, now, who)
        assert self.cert is not None and self.key is not None
        return load_key_cert(name, self.cert, self.key, now, who)


FileReloaded = Callable[[str, SecretItem], None]


def _same_content(a: SecretItem, b: SecretItem) -> bool:
    return (a.cert_chain, a.private_key, a.root_cert) == (b.cert_chain, b.private_key, b.root_cert)


class FileSecretStore:
    """Loads file-backed secrets and tells `on_reloaded(name, item)` when a watched one changed on disk."""

    def __init__(self, clock: Clock, poll_interval: float, debounce: float, on_reloaded: FileReloaded) -> None:
        self._clock = clock
        self._poll_interval = poll_interval
        self._debounce = debounce
        self._on_reloaded = on_reloaded
        self._watcher = FileWatcher(poll_interval, self._on_files_changed)
        self._specs: dict[str, FileSpec] = {}  # names being watched, and their files
        self._served: dict[str, SecretItem] = {}
        self._retained: set[str] = set()
        self._reload_timers: dict[str, Cancellable] = {}
        self._reloads: dict[str, asyncio.Task[None]] = {}
        self._failing: dict[str, str] = {}  # the last reload error per name, logged once until it changes
        self._changed_while_reloading: set[str] = set()
        # Upstream's num_file_secret_failures_total: secrets that could not be made from their files (a load
        # refused, or a changed file that does not load; a reload retried with the same error counts once).
        self.failures = 0

    @property
    def watch_failures(self) -> int:
        """The watcher's failures (upstream's num_file_watcher_failures_total)."""
        return self._watcher.failures

    async def start(self) -> None:
        await self._watcher.start()

    async def stop(self) -> None:
        for timer in self._reload_timers.values():
            timer.cancel()
        self._reload_timers.clear()
        for task in list(self._reloads.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._reloads.clear()
        await self._watcher.stop()

    def served(self) -> list[SecretItem]:
        """The file secrets currently served and watched, by name."""
        return [self._served[name] for name in sorted(self._served)]

    def watched_files(self) -> dict[Path, set[str]]:
        return self._watcher.watched()

    # --- subscriptions (told by the SDS server) -------------------------------------------------------
    def retain(self, name: str) -> None:
        """A stream subscribes to `name` (the first one): watch its files once they load."""
        self._retained.add(name)

    def release(self, name: str) -> None:
        """The last stream subscribing to `name` went: stop watching its files (unless they are the pod's own)."""
        self._retained.discard(name)
        spec = self._specs.get(name)
        if spec is not None and spec.always_watched:
            return
        self._forget(name)

    def _wanted(self, name: str, spec: FileSpec) -> bool:
        return spec.always_watched or name in self._retained

    def _forget(self, name: str) -> None:
        self._changed_while_reloading.discard(name)
        self._specs.pop(name, None)
        self._served.pop(name, None)
        self._watcher.unwatch(name)
        self._failing.pop(name, None)
        timer = self._reload_timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        task = self._reloads.pop(name, None)
        if task is not None:
            task.cancel()

    # --- loading -----------------------------------------------------------------------------------------
    async def load(self, name: str, spec: FileSpec, caller: PeerCredentials | None = None) -> SecretItem:
        """Read and validate the files of `name` (off the loop); SecretError (SecretRefused) when impossible."""
        try:
            loaded = await in_daemon_thread("cert-file-read", spec.load, name, self._clock.now(), caller)
        except SecretError:
            self.failures += 1
            raise
        if self._wanted(name, spec):  # still wanted once the read finished (a stream may have gone meanwhile)
            self._keep(name, spec, loaded)
        return loaded.item

    def _keep(self, name: str, spec: FileSpec, loaded: LoadedSecret) -> None:
        previous = self._specs.get(name)
        if previous is not None and previous != spec:
            self._watcher.unwatch(name)
        self._specs[name] = spec
        self._served[name] = loaded.item
        for path, digest in loaded.digests.items():
            self._watcher.watch(path, name, digest)

    # --- reloading -----------------------------------------------------------------------------------------
    def _on_files_changed(self, names: set[str]) -> None:
        for name in sorted(names):
            if name in self._reloads:
                self._changed_while_reloading.add(name)  # that reload may have read the earlier content
            elif name not in self._reload_timers:
                self._schedule_reload(name, self._debounce)

    def _schedule_reload(self, name: str, delay: float) -> None:
        when = self._clock.now() + delay
        self._reload_timers[name] = self._clock.call_at(when, functools.partial(self._start_reload, name))

    def _start_reload(self, name: str) -> None:
        self._reload_timers.pop(name, None)
        if name not in self._specs:
            return
        task = asyncio.get_running_loop().create_task(self._reload(name), name=f"cert-file-reload {name}")
        self._reloads[name] = task
        task.add_done_callback(lambda done: self._reloads.pop(name, None) if self._reloads.get(name) is done else None)

    async def _reload(self, name: str) -> None:
        try:
            await self._reload_once(name)
        finally:
            if name in self._changed_while_reloading:
                self._changed_while_reloading.discard(name)
                if name in self._specs and name not in self._reload_timers:
                    self._schedule_reload(name, self._debounce)

    async def _reload_once(self, name: str) -> None:
        spec = self._specs.get(name)
        if spec is None:
            return
        try:
            loaded = await in_daemon_thread("cert-file-read", spec.load, name, self._clock.now(), None)
        except SecretError as exc:
            if self._specs.get(name) is spec:
                # Often a half-written update (key before chain): try again shortly.
                repeated = self._failing.get(name) == str(exc)
                if not repeated:
                    self.failures += 1
                level = logging.DEBUG if repeated else logging.WARNING
                log.log(level, "certificate files for %s changed but cannot be loaded yet: %s", name, exc)
                self._failing[name] = str(exc)
                self._schedule_reload(name, self._poll_interval)
            return
        self._failing.pop(name, None)
        if self._specs.get(name) is not spec:
            return  # released while reading
        previous = self._served.get(name)
        self._served[name] = loaded.item
        if previous is not None and _same_content(previous, loaded.item):
            log.debug("certificate files for %s were touched but hold what is served: no push", name)
            return
        log.info("certificate files for %s changed: pushing", name)
        try:
            self._on_reloaded(name, loaded.item)
        except Exception:
            log.exception("handling the reload of %s failed", name)
