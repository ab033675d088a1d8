"""The agent's status server on :15020 (readiness, quit and drain so far).

Envoy's 15021 listener forwards `/healthz/ready` here. `/quitquitquit` and
`/drain` change the pod's state, so they take POST only and only from
localhost (upstream's rule): anything else gets 405 or 403.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from istio_agent.envoy.admin import AdminError, EnvoyAdmin
from istio_agent.envoy.stats import READY_STATS_FILTER, UPDATE_STATS_FILTER, parse_stats
from istio_agent.status.readiness import ReadinessState

log = logging.getLogger(__name__)


@dataclass
class StatusServerOptions:
    port: int = 15020
    host: str = "0.0.0.0"
    admin_port: int = 15000
    no_envoy: bool = False


def is_localhost(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


class StatusServer:
    def __init__(
        self,
        options: StatusServerOptions,
        readiness: ReadinessState,
        on_quit: Callable[[], None],
        on_drain: Callable[[], Awaitable[None]],
        extra_ready_check: Callable[[], str | None] | None = None,
        extra_routes: Sequence[Callable[[web.Application], None]] = (),
    ) -> None:
        self.options = options
        self.readiness = readiness
        self.admin = EnvoyAdmin(options.admin_port)
        self.on_quit = on_quit
        self.on_drain = on_drain
        self.extra_ready_check = extra_ready_check
        self.app = web.Application()
        self.app.router.add_route("*", "/healthz/ready", self.handle_ready)
        self.app.router.add_route("*", "/quitquitquit", self.handle_quit)
        self.app.router.add_route("*", "/drain", self.handle_drain)
        for add_routes in extra_routes:  # app probes, debug endpoints: each part registers its own routes
            add_routes(self.app)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port, reuse_address=True)
        await site.start()
        log.info("status server listening on %s:%d", self.options.host, self.options.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def check_ready(self) -> str | None:
        """None when ready, else why not."""
        if self.options.no_envoy:
            if self.readiness.draining:
                return "server is not live, current state is: DRAINING"
            return self.extra_ready_check() if self.extra_ready_check else None
        update_stats = ready_stats = None
        if self.readiness.needs_envoy_stats():
            try:
                update_stats = parse_stats(await self.admin.stats(UPDATE_STATS_FILTER))
                ready_stats = parse_stats(await self.admin.stats(READY_STATS_FILTER))
            except AdminError as exc:
                self.readiness.last_reason = str(exc)
                return str(exc)
        reason = self.readiness.evaluate(update_stats, ready_stats)
        if reason is None and self.extra_ready_check:
            reason = self.extra_ready_check()
        return reason

    async def handle_ready(self, request: web.Request) -> web.Response:
        reason = await self.check_ready()
        if reason is None:
            return web.Response(status=200)
        log.debug("not ready: %s", reason)
        return web.Response(status=503, text=reason)

    def _refuse(self, request: web.Request) -> web.Response | None:
        if request.method != "POST":
            return web.Response(status=405, text="method not allowed")
        if not is_localhost(request.remote):
            return web.Response(status=403, text="only requests from localhost are allowed")
        return None

    async def handle_quit(self, request: web.Request) -> web.Response:
        refusal = self._refuse(request)
        if refusal is not None:
            return refusal
        log.info("/quitquitquit: shutting down")
        self.on_quit()
        return web.Response(text="OK")

    async def handle_drain(self, request: web.Request) -> web.Response:
        refusal = self._refuse(request)
        if refusal is not None:
            return refusal
        log.info("/drain: draining Envoy's listeners")
        await self.on_drain()
        return web.Response(text="OK")
