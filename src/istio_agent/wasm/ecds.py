"""The XDS proxy's ECDS hook: each extension config with a remote Wasm module gets a local file before Envoy.

`EcdsRewriter.needs_rewrite()` is a byte scan: an ECDS push without a Wasm filter type in it is forwarded as
the raw bytes it came as. The others are decoded (`core/convert.py`; Envoy's Wasm modules load then, not
before), their modules asked of the cache all at once (one slow module never holds up the others' fetches),
and the response is forwarded rewritten. A module that cannot be had becomes the plugin's fail-open
(allow-all) or fail-closed (deny-all) RBAC stand-in, as upstream's conversion does, so the listener keeps
serving and Envoy ACKs; the reason is logged and counted. A resource that does not decode makes the agent
NACK the whole response to istiod (upstream's NACK: INTERNAL, with the last version Envoy ACKed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from istio_agent.wasm.metrics import WasmMetrics

if TYPE_CHECKING:
    from istio_agent.wasm.cache import WasmModuleCache

log = logging.getLogger(__name__)
# Envoy's Wasm filter type names as they appear in a pushed resource's bytes (a typed struct names them too).
WASM_MARKERS = (b"envoy.extensions.filters.http.wasm.v3.Wasm", b"envoy.extensions.filters.network.wasm.v3.Wasm")


class EcdsRewriter:
    """Converts ECDS responses for Envoy, fetching through `cache`."""

    def __init__(self, cache: WasmModuleCache, metrics: WasmMetrics | None = None) -> None:
        self.cache = cache
        self.metrics = metrics or cache.metrics

    @staticmethod
    def needs_rewrite(data: bytes) -> bool:
        return any(marker in data for marker in WASM_MARKERS)

    async def rewrite(self, data: bytes, delta: bool, version_info: str) -> tuple[bytes, bool]:
        """(response for Envoy, False), or (NACK for istiod, True)."""
        started = time.monotonic()
        try:
            return await self._rewrite(data, delta, version_info)
        finally:
            self.metrics.conversion_duration.observe((time.monotonic() - started) * 1000)

    async def _rewrite(self, data: bytes, delta: bool, version_info: str) -> tuple[bytes, bool]:
        from istio_agent.wasm.core import convert  # Envoy's Wasm protos: loaded by the first Wasm push only

        try:
            ecds = convert.plan(data, delta)
        except Exception as exc:  # not a (Delta)DiscoveryResponse: nothing to convert; Envoy will say
            log.warning("Wasm: ECDS response does not decode (%s); forwarded as it came", exc)
            return data, False
        for _ in range(ecds.passed):
            self.metrics.conversions.inc(convert.NO_REMOTE_LOAD)
        if ecds.errors:
            for _ in ecds.errors:
                self.metrics.conversions.inc(convert.UNMARSHAL_FAILURE)
            log.warning("Wasm: NACK of ECDS response: %s", "; ".join(ecds.errors))
            return convert.nack(ecds, version_info, ecds.errors), True
        fetches = ecds.fetches
        answers = await asyncio.gather(*(self.cache.get(request) for _, request in fetches), return_exceptions=True)
        results: dict[int, str | Exception] = {}
        for (index, _), answer in zip(fetches, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer  # cancellation
            results[index] = answer
        rewritten, outcomes = convert.finish(ecds, results)
        for outcome in outcomes:
            self.metrics.conversions.inc(outcome.status)
            if outcome.error:
                log.error("Wasm: error in converting the wasm config %s to local: %s. applying %s RBAC filter",
                          outcome.name, outcome.error, "allow" if outcome.fail_open else "deny")
            else:
                log.info("Wasm: extension config %s now loads its module from a local file", outcome.name)
        return rewritten, False
