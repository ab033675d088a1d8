"""Reloading the registry file when it changes; a bad edit never replaces a good registry.

Polling `stat` twice a second is enough for a hand-edited file and needs no
inotify binding; it also sees editors that replace the file by rename. A
change whose content fails to parse is logged with the line and field, kept
in `last_error`, and the registry in service stays as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from istio_agent.periodic import Periodic
from istiod_local.controlplane.xds.registry import Registry, decode_registry, parse_registry
from istiod_local.controlplane.xds.yamlfields import RegistryError

log = logging.getLogger("istiod_local.controlplane.registry")

RegistryListener = Callable[[Registry], Awaitable[None] | None]


class RegistryWatcher:
    """Watches one registry file and reports each good new version to `on_change`."""

    def __init__(self, path: Path | str, on_change: RegistryListener, interval: float = 0.5) -> None:
        self.path = Path(path)
        self._on_change = on_change
        self._signature: tuple[int, int, int, int] | None = None
        self._digest = b""
        self._ticker = Periodic(interval, self._tick, f"registry-watch:{self.path}")
        self.last_error: str | None = None
        self.current: Registry | None = None

    def load(self) -> Registry:
        """The first load: errors propagate (a control plane must not start on a broken registry)."""
        signature = self._stat()
        data = self.path.read_bytes()
        registry = parse_registry(decode_registry(data, str(self.path)), str(self.path))
        self._signature, self._digest, self.current = signature, hashlib.sha256(data).digest(), registry
        return registry

    def _stat(self) -> tuple[int, int, int, int]:
        st = os.stat(self.path)
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)

    def poll(self) -> Registry | None:
        """One check: the new registry if the file changed to something valid, else None."""
        try:
            signature = self._stat()
        except OSError as exc:
            self._record_error(f"{self.path}: cannot read registry: {exc.strerror or exc}")
            return None
        if signature == self._signature:
            return None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._record_error(f"{self.path}: cannot read registry: {exc.strerror or exc}")
            return None
        self._signature = signature
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return None
        try:
            registry = parse_registry(decode_registry(data, str(self.path)), str(self.path))
        except RegistryError as exc:
            self._digest = digest
            self._record_error(f"registry refused, previous configuration stays in service: {exc}")
            return None
        self._digest, self.current, self.last_error = digest, registry, None
        log.info("registry %s reloaded: %d services, %d workloads, %d service entries", self.path,
                 len(registry.services), len(registry.workloads), len(registry.service_entries))
        return registry

    def _record_error(self, message: str) -> None:
        if message != self.last_error:
            log.error("%s", message)
        self.last_error = message

    async def _tick(self) -> None:
        # Parsing a big registry takes a while; keep the event loop (and every ADS stream) running meanwhile.
        registry = await asyncio.to_thread(self.poll)
        if registry is not None:
            try:
                result = self._on_change(registry)
                if result is not None:
                    await result
            except Exception:
                log.exception("registry change handler failed")

    async def start(self) -> None:
        await self._ticker.start()

    async def stop(self) -> None:
        await self._ticker.stop()
