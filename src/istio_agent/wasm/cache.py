"""The Wasm module cache on disk (upstream's LocalFileCache): fetch once, verify, keep, purge.

`WasmModuleCache.get()` answers with the path of a verified module: from the cache when `core/cache_state.py`
says the request is served by a module already there, else after a fetch (`fetchers.py`) checked against the
requested sha256 (a mismatch names both digests) and against the Wasm magic. Requests for the same module at the
same time share one fetch; a caller that gives up does not cancel it. Files are named by digests only under
the cache directory and written whole (a temporary file, then renamed), so Envoy never reads half a module.
The bookkeeping is saved beside the modules after each change, so that a restarted agent serves them without
a refetch. Every `purge_interval` the modules unused for `module_expiry` are removed; beyond `max_cache_bytes`
the least recently used go first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from istio_agent.clock import Clock, SystemClock
from istio_agent.periodic import Periodic
from istio_agent.wasm import metrics as m
from istio_agent.wasm.core.cache_state import OCI_PREFIX, CacheKey, CacheState, FetchRequest
from istio_agent.wasm.core.unbox import is_wasm
from istio_agent.wasm.metrics import WasmMetrics
from istio_agent.wasm.options import WasmOptions

if TYPE_CHECKING:
    from istio_agent.wasm.fetchers import HttpFetcher, ImageFetcher, PreparedImage
    from istio_agent.wasm.guarded_http import GuardedHttp

log = logging.getLogger(__name__)
STATE_FILE = "wasm-modules.json"


def _fetch_errors() -> tuple[type[Exception], ...]:
    """What a failed fetch raises (the fetchers' modules are loaded by the first fetch)."""
    from istio_agent.wasm.core.oci import ImageError
    from istio_agent.wasm.core.unbox import LayerError, ModuleTooLarge
    from istio_agent.wasm.guarded_http import FetchError

    return (FetchError, ImageError, LayerError, ModuleTooLarge, TimeoutError, OSError)


class WasmFetchError(Exception):
    """A module that could not be had; the message says why (it ends up in the agent's log and in a NACK)."""


class WasmModuleCache:
    """Verified modules on disk, by URL and checksum; a component (`start` loads and purges, `stop` saves)."""

    name = "wasm-cache"

    def __init__(self, options: WasmOptions, metrics: WasmMetrics | None = None, clock: Clock | None = None,
                 http: GuardedHttp | None = None) -> None:
        self.options = options
        self.metrics = metrics or WasmMetrics()
        self.clock = clock or SystemClock()
        self.dir = options.cache_dir
        self.state = CacheState()
        self._http = http
        self._fetchers: tuple[HttpFetcher, ImageFetcher] | None = None
        self._flights: dict[tuple[CacheKey, str], asyncio.Task[str]] = {}
        self._purger = Periodic(options.purge_interval, self._purge_step, "wasm-cache-purge")
        self.fetches = 0  # remote fetches started (tests and the benchmark)

    # --- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.load()
        await self._purger.start()

    async def stop(self) -> None:
        await self._purger.stop()
        for task in list(self._flights.values()):
            task.cancel()
        await asyncio.gather(*self._flights.values(), return_exceptions=True)

    def load(self) -> None:
        """The modules a previous run left (those whose file is still there, with its size)."""
        try:
            data = json.loads((self.dir / STATE_FILE).read_bytes())
        except (OSError, ValueError):
            return
        sizes = {}
        for item in data.get("modules", []) if isinstance(data, dict) else []:
            path = str(item.get("path", "")) if isinstance(item, dict) else ""
            with contextlib.suppress(OSError, ValueError):
                sizes[path] = (self.dir / path).stat().st_size
        self.state = CacheState.from_json(data, sizes)
        self.metrics.cache_entries.set(len(self.state))
        log.info("Wasm cache: %d module(s) found in %s", len(self.state), self.dir)

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write(self.dir / STATE_FILE, json.dumps(self.state.to_json(), sort_keys=True).encode())

    def fetchers(self) -> tuple[HttpFetcher, ImageFetcher]:
        """The HTTP and OCI fetchers, made (and their modules loaded) at the first fetch."""
        if self._fetchers is None:
            from istio_agent.wasm.fetchers import HttpFetcher, ImageFetcher
            from istio_agent.wasm.guarded_http import GuardedHttp

            options = self.options
            http = self._http or GuardedHttp(options.blocked_cidrs, options.insecure_registries)
            self._fetchers = (HttpFetcher(http, self.clock.sleep, options.http_request_timeout,
                                          options.http_request_max_retries),
                              ImageFetcher(http, options.http_request_timeout))
        return self._fetchers

    # --- lookups ----------------------------------------------------------------------------------------------
    async def get(self, request: FetchRequest) -> str:
        """The absolute path of the module `request` names; WasmFetchError with the reason if none can be had."""
        key = CacheKey(request.url, request.checksum, request.resource_name, request.resource_version)
        flight = (key, request.pull_policy)
        task = self._flights.get(flight)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._get(key, request), name="wasm-fetch")
            self._flights[flight] = task
            task.add_done_callback(lambda _t: self._flights.pop(flight, None))
        return await asyncio.shield(task)

    async def _get(self, key: CacheKey, request: FetchRequest) -> str:
        entry, checksum = self.state.lookup(key, request.pull_policy, self.clock.now())
        if entry is not None and (self.dir / entry.path).is_file():
            self.metrics.cache_lookups.inc("true")
            return str(self.dir / entry.path)
        if entry is not None:  # its file went away: fetch it again
            self.state.remove(key.name, checksum)
        self.metrics.cache_lookups.inc("false")
        self.fetches += 1
        try:
            async with asyncio.timeout(request.timeout):
                return await self._fetch(key, checksum, request)
        except TimeoutError:
            self.metrics.remote_fetches.inc(m.DOWNLOAD_FAILURE)
            raise WasmFetchError(f"fetching {key.url} took longer than {request.timeout:g}s") from None

    async def _fetch(self, key: CacheKey, checksum: str, request: FetchRequest) -> str:
        url, limit = key.url, self.options.max_module_size
        http_fetcher, image_fetcher = self.fetchers()
        errors = _fetch_errors()
        scheme = urlsplit(url).scheme
        prepared: PreparedImage | None = None
        if scheme in ("http", "https"):
            try:
                module = await http_fetcher.fetch(url, limit)
            except errors as exc:
                self.metrics.remote_fetches.inc(m.DOWNLOAD_FAILURE)
                raise WasmFetchError(str(exc) or type(exc).__name__) from None
            digest = hashlib.sha256(module).hexdigest()
        elif scheme == "oci":
            try:
                prepared = await image_fetcher.prepare(url[len(OCI_PREFIX):], request.pull_secret, limit)
            except errors as exc:
                self.metrics.remote_fetches.inc(m.MANIFEST_FAILURE)
                raise WasmFetchError(f"could not fetch Wasm OCI image: {exc}") from None
            digest, module = prepared.digest, b""
        else:
            raise WasmFetchError(f"unsupported Wasm module downloading URL scheme: {scheme}")
        if not checksum:
            found = self.state.find(key, digest, self.clock.now())
            if found is not None and (self.dir / found.path).is_file():
                return str(self.dir / found.path)
        elif digest != checksum:
            self.metrics.remote_fetches.inc(m.CHECKSUM_MISMATCHED)
            raise WasmFetchError(f"module downloaded from {url} has checksum {digest}, which does not match: "
                                 f"{checksum}")
        if prepared is not None:
            try:
                module = await prepared.module()
            except errors as exc:
                self.metrics.remote_fetches.inc(m.DOWNLOAD_FAILURE)
                raise WasmFetchError(f"could not fetch Wasm binary: {exc}") from None
        if not is_wasm(module):
            self.metrics.remote_fetches.inc(m.FETCH_FAILURE)
            raise WasmFetchError(f"fetched Wasm binary from {url} is invalid")
        self.metrics.remote_fetches.inc(m.FETCH_SUCCESS)
        return await asyncio.to_thread(self._store, key, digest, module)

    def _store(self, key: CacheKey, digest: str, module: bytes) -> str:
        """Write the module (if new), record it, drop what is over the budget, save: its absolute path."""
        entry = self.state.add(key, digest, len(module), self.clock.now())
        target = self.dir / entry.path
        if not target.is_file() or target.stat().st_size != len(module):
            target.parent.mkdir(parents=True, exist_ok=True)
            self._write(target, module)
        for name, checksum in self.state.over_budget(self.options.max_cache_bytes, keep=(key.name, digest)):
            self._remove(name, checksum)
        self.metrics.cache_entries.set(len(self.state))
        self.save()
        return str(target)

    @staticmethod
    def _write(target: Path, data: bytes) -> None:
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(temporary, 0o644)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def _remove(self, name: str, checksum: str) -> None:
        entry = self.state.remove(name, checksum)
        if entry is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / entry.path).unlink()
            with contextlib.suppress(OSError):
                (self.dir / entry.path).parent.rmdir()  # only when empty

    # --- purge ------------------------------------------------------------------------------------------------
    def purge(self) -> int:
        """Remove the modules unused for longer than the expiry; how many went."""
        expired = self.state.expired(self.clock.now(), self.options.module_expiry)
        for name, checksum in expired:
            self._remove(name, checksum)
            log.debug("Wasm cache: removed stale module %s (%s)", name, checksum)
        self.metrics.cache_entries.set(len(self.state))
        if expired:
            self.save()
        return len(expired)

    async def _purge_step(self) -> None:
        try:
            self.purge()
        except OSError as exc:
            log.error("Wasm cache: purge failed: %s", exc)
