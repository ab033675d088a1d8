"""Which handler answers a request (sans-IO): exact paths and prefixes, by method, with aiohttp's 404 and 405.

Routes are added by the parts that own them (the status server's readiness,
probes, metrics, debug views); `on_close` collects what they must release when
the server stops (client connections, probe pools).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from istio_agent.httpio.server_core import Request, Response, text_response

Handler = Callable[[Request], Awaitable[Response]]
Cleanup = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Route:
    path: str
    handler: Handler
    methods: frozenset[str] | None  # None: any method
    prefix: bool = False

    def matches(self, path: str) -> bool:
        return path.startswith(self.path) if self.prefix else path == self.path


class Router:
    """Routes in the order added; the first whose path matches decides (405 when its methods do not)."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self.cleanups: list[Cleanup] = []

    def add(self, path: str, handler: Handler, methods: Iterable[str] | None = None, *, prefix: bool = False) -> None:
        self.routes.append(Route(path, handler, frozenset(methods) if methods is not None else None, prefix))

    def add_get(self, path: str, handler: Handler) -> None:
        """GET, and HEAD answered as GET without the body (aiohttp's add_get)."""
        self.add(path, handler, ("GET", "HEAD"))

    def on_close(self, cleanup: Cleanup) -> None:
        self.cleanups.append(cleanup)

    def resolve(self, method: str, path: str) -> Handler | Response:
        """The handler for this request, or the answer when there is none."""
        allowed: set[str] = set()
        for route in self.routes:
            if not route.matches(path):
                continue
            if route.methods is None or method in route.methods:
                return route.handler
            allowed |= route.methods
        if allowed:
            return text_response(405, "405: Method Not Allowed", [("Allow", ",".join(sorted(allowed)))])
        return text_response(404, "404: Not Found")
