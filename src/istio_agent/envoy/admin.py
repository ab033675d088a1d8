"""A minimal async client for Envoy's admin API on localhost.

Plain HTTP/1.1 over asyncio streams, one connection per request: the admin API
is local and requests are rare (readiness, drain, stats), so this avoids a
client library on the agent's start-up path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import quote


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
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            raise AdminError(f"{method} {path} on Envoy admin port {self.port}: {exc or type(exc).__name__}") from None

    async def _request(self, method: str, path: str) -> AdminResponse:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            writer.write(head.encode())
            await writer.drain()
            status_line = await reader.readline()
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
                raise ValueError(f"bad status line {status_line!r}")
            status = int(parts[1])
            length: int | None = None
            chunked = False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
                elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                    chunked = True
            if chunked:
                body = await _read_chunked(reader)
            elif length is not None:
                body = await reader.readexactly(length)
            else:
                body = await reader.read()
            return AdminResponse(status, body)
        finally:
            writer.close()

    async def stats(self, filter_regex: str, used_only: bool = True) -> str:
        query = ("usedonly&" if used_only else "") + "filter=" + quote(filter_regex, safe="")
        response = await self.request("GET", f"/stats?{query}")
        if response.status != 200:
            raise AdminError(f"/stats answered {response.status}: {response.text[:200]}")
        return response.text

    async def post(self, path: str) -> AdminResponse:
        return await self.request("POST", path)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = await reader.readline()
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readline()
