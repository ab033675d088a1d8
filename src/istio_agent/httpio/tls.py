"""Server-side TLS for `HttpServer`'s connections, on `ssl.MemoryBIO` (the standard library's sans-IO TLS).

asyncio's own TLS transport gives every connection a 256 KiB read buffer: measured, an idle TLS
connection cost 280 KiB of resident memory, and a thousand of them left the heap 270 MB larger after
they had all closed. Here the connection's bytes go through the plain socket stream into OpenSSL's
memory BIOs and the only buffers are OpenSSL's record buffers and the stream's (about 24 KiB per idle
connection, measured the same way).

`TlsStream` offers the part of an asyncio StreamReader/StreamWriter pair that the server uses (`read`,
`write`, `drain`, `close`, `wait_closed`, `transport`, `get_extra_info`); `handshake()` runs first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

RECORD_READ = 16 * 1024 + 512  # one TLS record, with its header and tag


class TlsStream:
    """One server-side TLS connection over a plain stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
        self._reader, self._writer = reader, writer
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.transport = writer.transport

    async def handshake(self) -> None:
        """Complete the TLS handshake (ssl.SSLError or ConnectionError when it fails)."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if not await self._fill():
                    raise ConnectionResetError("the peer closed the connection during the TLS handshake") from None
        self._flush()

    async def _fill(self) -> bool:
        """Ciphertext from the socket into the TLS object; False at the peer's end of stream."""
        data = await self._reader.read(RECORD_READ)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self._writer.write(data)

    async def read(self, n: int) -> bytes:
        """Up to `n` bytes of plaintext; b"" once the peer has closed (with or without close_notify)."""
        while True:
            try:
                return self._tls.read(n)
            except ssl.SSLWantReadError:
                self._flush()
                if not await self._fill():
                    with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLZeroReturnError, ssl.SSLEOFError):
                        return self._tls.read(n)  # what was buffered before the end, if anything
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = self._tls.write(view)
            view = view[written:]
        self._flush()

    async def drain(self) -> None:
        await self._writer.drain()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._tls
        return self._writer.get_extra_info(name, default)

    def close(self) -> None:
        """Send close_notify when the connection can still carry it, then close the socket."""
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self._tls.unwrap()
        with contextlib.suppress(OSError, RuntimeError):
            self._flush()
        self._writer.close()

    async def wait_closed(self) -> None:
        await self._writer.wait_closed()
