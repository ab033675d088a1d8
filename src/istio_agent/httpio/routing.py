"""Which handler answers a request (sans-IO): exact paths and prefixes, by method, with aiohttp's 404 and 405.

Routes are added by the parts that own them (the status server's readiness,
probes, metrics, debug views); `on_close` collects what they must release when
the server stops (client connections, probe pools).
"""

from __future__ import annotations

import html
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


def go_clean_path(path: str) -> str:
    """Go's ServeMux `cleanPath`: rooted, `.` and `..` resolved, repeated slashes collapsed, a trailing slash kept.

    (Not `posixpath.normpath`, which keeps a leading `//`.)
    """
    rooted = path if path.startswith("/") else "/" + path
    parts: list[str] = []
    for part in rooted.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    cleaned = "/" + "/".join(parts)
    return cleaned + "/" if rooted.endswith("/") and cleaned != "/" else cleaned


def clean_path_redirect(method: str, location: str) -> Response:
    """The 307 Go's ServeMux answers for a path that is not clean: text/html for GET and HEAD, a body for GET."""
    headers = [("Location", location)]
    if method not in ("GET", "HEAD"):
        return Response(307, b"", headers)
    body = f'<a href="{html.escape(location)}">Temporary Redirect</a>.\n\n' if method == "GET" else ""
    return Response(307, body.encode(), [("Content-Type", "text/html; charset=utf-8"), *headers])


class Router:
    """Routes in the order added; the first whose path matches decides (405 when its methods do not).

    `clean_paths`: a request whose path is not clean (`//x`, `/a/../b`, `/./x`) is redirected (307) to its
    clean form before any route is looked at, as Go's ServeMux does (the status port: upstream serves it
    on one). CONNECT is left alone, as there.
    """

    def __init__(self, *, clean_paths: bool = False) -> None:
        self.routes: list[Route] = []
        self.cleanups: list[Cleanup] = []
        self.clean_paths = clean_paths

    def add(self, path: str, handler: Handler, methods: Iterable[str] | None = None, *, prefix: bool = False) -> None:
        self.routes.append(Route(path, handler, frozenset(methods) if methods is not None else None, prefix))

    def add_get(self, path: str, handler: Handler) -> None:
        """GET, and HEAD answered as GET without the body (aiohttp's add_get)."""
        self.add(path, handler, ("GET", "HEAD"))

    def on_close(self, cleanup: Cleanup) -> None:
        self.cleanups.append(cleanup)

    def resolve(self, method: str, path: str, target: str | None = None) -> Handler | Response:
        """The handler for this request, or the answer when there is none (`target`: the request line's, for
        `clean_paths`, which looks at the path as sent, still escaped)."""
        if self.clean_paths and target is not None and target.startswith("/") and method != "CONNECT":
            sent, question, query = target.partition("?")
            cleaned = go_clean_path(sent)
            if cleaned != sent:
                return clean_path_redirect(method, cleaned + question + query if query else cleaned)
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
