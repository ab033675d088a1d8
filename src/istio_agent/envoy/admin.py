"""A minimal async client for Envoy's admin API on localhost.

HTTP/1.1 on h11 (`httpio.client`, the status server's own HTTP stack) over
asyncio streams, one connection per request: the admin API is local and
requests are rare (readiness, drain, stats), and a connection Envoy may have
closed is never reused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import quote

from istio_agent.httpio.client import H1Connection


class AdminError(Exception):
    """Envoy's admin endpoint could not be reached or answered with an error."""


@dataclass(frozen=True)
class AdminResponse:
    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class EnvoyAdmin:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 3.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout

    async def request(self, method: str, path: str) -> AdminResponse:
        try:
            return await asyncio.wait_for(self._request(method, path), self.timeout)
        except (TimeoutError, OSError, ValueError) as exc:
            raise AdminError(f"{method} {path} on Envoy admin port {self.port}: {exc or type(exc).__name__}") from None

    async def _request(self, method: str, path: str) -> AdminResponse:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        connection = H1Connection(reader, writer, keepalive=False)  # closed at once after the answer
        try:
            response = await connection.request("localhost", path, [
                ("Host", "localhost"), ("Content-Length", "0"), ("Connection", "close")], method)
            body = b"".join([chunk async for chunk in response.chunks()])
            return AdminResponse(response.status, body)
        finally:
            connection.close()

    async def stats(self, filter_regex: str, used_only: bool = True) -> str:
        query = ("usedonly&" if used_only else "") + "filter=" + quote(filter_regex, safe="")
        response = await self.request("GET", f"/stats?{query}")
        if response.status != 200:
            raise AdminError(f"/stats answered {response.status}: {response.text[:200]}")
        return response.text

    async def post(self, path: str) -> AdminResponse:
        return await self.request("POST", path)
