"""A response body as the server meant it: gzip and deflate undone, bounded (sans-IO).

What aiohttp's auto-decompress did for the agent's clients: an app's probe
answer may be compressed, and the prober passes it back decoded.
"""

from __future__ import annotations

import zlib


class BodyDecoder:
    """`feed` the raw body as it arrives, `take` decoded bytes out.

    Each `take` is bounded, so a small compressed body cannot expand without bound in memory. A
    body that does not decode raises ValueError; any other encoding is passed back as it came.
    """

    def __init__(self, content_encoding: str | None) -> None:
        self.encoding = (content_encoding or "").strip().lower()
        self._pending = b""
        self._zlib: zlib._Decompress | None = None
        if self.encoding == "gzip":
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)

    @property
    def identity(self) -> bool:
        return self.encoding not in ("gzip", "deflate")

    def feed(self, data: bytes) -> None:
        self._pending = self._pending + data if self._pending else data

    def take(self, limit: int) -> bytes:
        """Up to `limit` decoded bytes from what was fed (b"" when more must be fed first)."""
        if limit <= 0 or not self._pending:
            return b""
        if self.identity:
            if len(self._pending) <= limit:
                out, self._pending = self._pending, b""
            else:
                out, self._pending = self._pending[:limit], self._pending[limit:]
            return out
        if self._zlib is None:  # deflate: RFC 1950 (zlib) as it should be, raw deflate as some servers send
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS if self._pending[0] & 0x0F == 8 else -zlib.MAX_WBITS)
        try:
            out = self._zlib.decompress(self._pending, limit)
        except zlib.error as exc:
            raise ValueError(f"cannot decode the {self.encoding} body: {exc}") from None
        self._pending = b"" if self._zlib.eof else self._zlib.unconsumed_tail
        return out
