"""The agent's status server on :15020: the HTTP edge of readiness, quit and drain, plus the routes parts add.

Envoy's 15021 listener forwards `/healthz/ready` here; the readiness rules
themselves are the sans-IO `ReadinessState` (this server only fetches Envoy's
stats through the agent's one admin client and runs the gRPC bootstrap check).
`/quitquitquit` and `/drain` change the pod's state, so they take POST only and
only from localhost (upstream's rule): anything else gets 405 or 403. The app
probes (`/app-health/...`), merged metrics (`/stats/prometheus`, `/metrics`)
and debug views (`/debug/ndsz`, `/debug/secrets`) are registered by their own
modules through `routes`. HTTP is `httpio` (h11 under asyncio streams): a
request that does not parse, or breaks its limits, is answered 4xx and
counted, and logged in one line per minute at most (`malformed_requests.py`).

As a component, `drain()` marks the agent as draining, so readiness fails from
the moment a termination drain starts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from istio_agent.envoy.admin import AdminError, EnvoyAdmin
from istio_agent.envoy.stats import READY_STATS_FILTER, UPDATE_STATS_FILTER, parse_stats
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.httpio.server_core import Request, Response, go_refusal, text_response
from istio_agent.netaddr import is_localhost
from istio_agent.status.malformed_requests import MalformedRequestLog
from istio_agent.status.options import StatusOptions
from istio_agent.status.readiness import ReadinessState

if TYPE_CHECKING:
    from istio_agent.grpcxds.readiness import BootstrapProbe

log = logging.getLogger(__name__)

RouteAdder = Callable[[Router], None]


async def _nothing_to_drain() -> None:
    return None


class StatusServer:
    name = "status"

    def __init__(
        self,
        options: StatusOptions,
        readiness: ReadinessState,
        *,
        admin: EnvoyAdmin | None = None,
        bootstrap_probe: BootstrapProbe | None = None,
        on_quit: Callable[[], None] = lambda: None,
        on_drain: Callable[[], Awaitable[None]] = _nothing_to_drain,
        routes: Sequence[RouteAdder] = (),
        on_malformed: Callable[[], None] = lambda: None,
    ) -> None:
        self.options = options
        self.readiness = readiness
        self.admin = admin
        self.bootstrap_probe = bootstrap_probe
        self.on_quit = on_quit
        self.on_drain = on_drain
        self.app = Router(clean_paths=True)  # upstream's status port is a Go ServeMux
        self.app.add("/healthz/ready", self.handle_ready)
        self.app.add("/quitquitquit", self.handle_quit)
        self.app.add("/drain", self.handle_drain)
        for add_routes in routes:  # app probes, metrics, debug endpoints: each part registers its own routes
            add_routes(self.app)
        # Requests that do not parse: 4xx, counted, one log line per interval (not a traceback each).
        self.malformed = MalformedRequestLog(on_malformed=on_malformed)
        self._server: HttpServer | None = None

    async def start(self) -> None:
        self._server = HttpServer(self.app, on_malformed=self.malformed, render_error=go_refusal)  # worded as Go's
        await self._server.start(self.options.host, self.options.port)
        log.info("status server listening on %s:%d", self.options.host, self.options.port)

    async def drain(self) -> None:
        self.readiness.draining = True

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def check_ready(self) -> str | None:
        """None when ready, else why not."""
        update_stats = ready_stats = None
        if self.readiness.needs_envoy_stats() and self.admin is not None:
            try:
                update_stats = parse_stats(await self.admin.stats(UPDATE_STATS_FILTER))
                ready_stats = parse_stats(await self.admin.stats(READY_STATS_FILTER))
            except AdminError as exc:
                self.readiness.last_reason = str(exc)
                return str(exc)
        problem = self.bootstrap_probe.check() if self.bootstrap_probe is not None else None
        return self.readiness.evaluate(update_stats, ready_stats, problem)

    async def handle_ready(self, request: Request) -> Response:
        reason = await self.check_ready()
        if reason is None:
            return Response(200)
        log.debug("not ready: %s", reason)
        return text_response(503, reason)

    def _refuse(self, request: Request) -> Response | None:
        if not is_localhost(request.remote):  # asked first, as upstream: from elsewhere any method is 403
            return text_response(403, "only requests from localhost are allowed")
        if request.method != "POST":
            return text_response(405, "method not allowed")
        return None

    async def handle_quit(self, request: Request) -> Response:
        refusal = self._refuse(request)
        if refusal is not None:
            return refusal
        log.info("/quitquitquit: shutting down")
        self.on_quit()
        return text_response(200, "OK")

    async def handle_drain(self, request: Request) -> Response:
        refusal = self._refuse(request)
        if refusal is not None:
            return refusal
        log.info("/drain: draining Envoy's listeners")
        await self.on_drain()
        return text_response(200, "OK")
