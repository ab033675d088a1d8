"""The HTTP/1.1 client edge: one h11 connection over asyncio streams, and a keep-alive pool of them.

`H1Connection` runs one exchange at a time on a stream the caller opened (plain
TCP here, TLS in the HTTPS prober); its answer is read in pieces, decoded
(`BodyDecoder`), and the connection is reusable once both sides finished the
exchange. `Pool` keeps connections per (host, port) for the scrapes of Envoy
and the app and for Envoy's admin API: loopback peers asked again and again.
`Closer` ends connections politely in the background (bounded), or drops them.
`fetch_once` is one small request on a connection of its own (the cloud metadata
servers, asked once at start and for the GCE identity token).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from istio_agent.httpio.body import BodyDecoder

READ_SIZE = 65536
SHUTDOWN_TIMEOUT = 5.0  # for a peer's TLS close_notify, then the socket is dropped
IDLE_CONNECTION_TIMEOUT = 90.0  # Go's DefaultTransport.IdleConnTimeout: a kept connection unused this long closes


class Closer:
    """Ends connections: closed politely in the background (bounded), or dropped when the peer is unresponsive.

    The background closes are kept so that the owner's `close` can wait for them.
    """

    def __init__(self) -> None:
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, writer: asyncio.StreamWriter, polite: bool = True) -> None:
        if not polite:
            writer.transport.abort()
            return
        if writer.is_closing():
            return
        writer.close()
        task = asyncio.get_running_loop().create_task(self._wait(writer), name="http-connection-close")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _wait(writer: asyncio.StreamWriter) -> None:
        closed = False
        try:
            async with asyncio.timeout(SHUTDOWN_TIMEOUT):
                await writer.wait_closed()
            closed = True
        except (TimeoutError, OSError):
            pass
        finally:
            if not closed:
                writer.transport.abort()

    async def wait(self, timeout: float) -> None:
        """Give the closes under way `timeout` seconds, then drop what is left (the agent is stopping)."""
        if not self._pending:
            return
        _, late = await asyncio.wait(set(self._pending), timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


def latin1(value: bytes | str) -> str:
    """A header name or value as text (HTTP headers are bytes; latin-1 maps each to one character)."""
    return value.decode("latin-1") if isinstance(value, bytes) else value


class Response:
    """A peer's answer: status, headers (names lower-cased), and the body decoded, read in pieces."""

    def __init__(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status = status
        self.headers = headers
        self.decoder = BodyDecoder(self.header("content-encoding"))

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)

    @property
    def content_length(self) -> int | None:
        value = self.header("content-length")
        return int(value) if value is not None and value.strip().isdigit() else None

    async def read(self, size: int) -> bytes:
        """Up to `size` bytes of the decoded body; b"" at its end."""
        while True:
            out = self.decoder.take(size)
            if out or size <= 0:
                return out
            data = await self._more()
            if data is None:
                return self.decoder.take(size)
            self.decoder.feed(data)

    async def chunks(self, size: int = READ_SIZE) -> AsyncIterator[bytes]:
        """The decoded body in pieces of at most `size` bytes, as they arrive."""
        while True:
            chunk = await self.read(size)
            if not chunk:
                return
            yield chunk

    async def _more(self) -> bytes | None:
        """The next raw piece of the body, None at its end."""
        raise NotImplementedError

    def release(self) -> None:
        """Done with the answer, read or not."""


class H1Connection:
    """One HTTP/1.1 connection on h11; `keepalive` False asks the peer to close after each answer."""

    protocol = "http/1.1"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keepalive: bool,
                 closer: Callable[[asyncio.StreamWriter], None] = asyncio.StreamWriter.close) -> None:
        self.reader, self.writer, self.keepalive, self.closer = reader, writer, keepalive, closer
        self.h11 = h11.Connection(h11.CLIENT)
        self.last_used = asyncio.get_running_loop().time()

    def usable(self, now: float) -> bool:
        return (not self.writer.is_closing() and not self.reader.at_eof() and self.h11.our_state is h11.IDLE
                and now - self.last_used < IDLE_CONNECTION_TIMEOUT)

    async def request(self, authority: str, target: str, headers: Iterable[tuple[str, str]],
                      method: str = "GET") -> H1Response:
        """Send a request without a body (`headers` complete, Host first) and read the answer's head."""
        try:
            data = self.h11.send(h11.Request(method=method, target=target, headers=list(headers)))
            data = (data or b"") + (self.h11.send(h11.EndOfMessage()) or b"")
            self.writer.write(data)
            await self.writer.drain()
            while True:
                event = await self.next_event()
                if isinstance(event, h11.Response):
                    return H1Response(self, event)
                if not isinstance(event, h11.InformationalResponse):
                    raise ConnectionError(f"unexpected HTTP/1.1 event {type(event).__name__}")
        except h11.ProtocolError as exc:
            raise ConnectionError(f"HTTP/1.1: {exc}") from None

    async def next_event(self) -> object:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(READ_SIZE))
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the peer closed the connection")
            return event

    def finished_cleanly(self) -> bool:
        """Both sides done with this exchange and the connection may carry another: ready it."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self.last_used = asyncio.get_running_loop().time()
            return True
        return False

    def close(self) -> None:
        self.closer(self.writer)


class H1Response(Response):
    def __init__(self, connection: H1Connection, event: h11.Response) -> None:
        super().__init__(event.status_code, [(latin1(n).lower(), latin1(v)) for n, v in event.headers])
        self.connection = connection
        self.ended = False

    async def _more(self) -> bytes | None:
        if self.ended:
            return None
        try:
            event = await self.connection.next_event()
        except h11.ProtocolError as exc:
            raise ConnectionError(f"HTTP/1.1: {exc}") from None
        if isinstance(event, h11.Data):
            return bytes(event.data)
        self.ended = True  # EndOfMessage
        return None

    def release(self) -> None:
        """Take what is already buffered (an empty body usually is): a finished exchange leaves the
        connection reusable; nothing more is read from the socket."""
        with contextlib.suppress(h11.ProtocolError):
            while not self.ended:
                event = self.connection.h11.next_event()
                if event is h11.NEED_DATA or not isinstance(event, (h11.Data, h11.EndOfMessage)):
                    break
                self.ended = isinstance(event, h11.EndOfMessage)


class PooledResponse:
    """An answer from `Pool`: `release()` once read to the end keeps its connection, `close()` drops it."""

    def __init__(self, pool: Pool, key: tuple[str, int], response: H1Response) -> None:
        self._pool, self._key, self.response = pool, key, response
        self.status, self._done = response.status, False

    def header(self, name: str) -> str | None:
        return self.response.header(name)

    @property
    def content_length(self) -> int | None:
        return self.response.content_length

    def chunks(self, size: int = READ_SIZE) -> AsyncIterator[bytes]:
        return self.response.chunks(size)

    async def read(self) -> bytes:
        """The whole (decoded) body; for small answers only."""
        return b"".join([chunk async for chunk in self.chunks()])

    def release(self) -> None:
        if not self._done:
            self._done = True
            self.response.release()
            self._pool._put_back(self._key, self.response.connection)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self.response.connection.close()


class Pool:
    """Plain-HTTP connections kept per (host, port) for reuse; no limit (loopback peers, one scrape at a time each)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[H1Connection]] = {}
        self._closer = Closer()

    async def request(self, url: str, headers: Iterable[tuple[str, str]] = (), method: str = "GET") -> PooledResponse:
        """`method url` with `headers` (Host is the URL's); the answer's head read, its body not yet."""
        split = urlsplit(url)
        host, port = split.hostname or "", split.port or 80
        target = (split.path or "/") + (f"?{split.query}" if split.query else "")
        key = (host, port)
        connection = await self._acquire(key)
        sent = [("Host", split.netloc), *((n, v) for n, v in headers if n.lower() != "host")]
        if method in ("POST", "PUT", "PATCH") and not any(n.lower() == "content-length" for n, _ in sent):
            sent.append(("Content-Length", "0"))
        try:
            response = await connection.request(split.netloc, target, sent, method)
        except BaseException:
            connection.close()
            raise
        return PooledResponse(self, key, response)

    async def _acquire(self, key: tuple[str, int]) -> H1Connection:
        now = asyncio.get_running_loop().time()
        kept = self._idle.get(key, [])
        while kept:
            connection = kept.pop()
            if connection.usable(now):
                return connection
            connection.close()
        reader, writer = await asyncio.open_connection(key[0], key[1], limit=READ_SIZE)
        return H1Connection(reader, writer, True, self._closer)

    def _put_back(self, key: tuple[str, int], connection: H1Connection) -> None:
        if connection.finished_cleanly() and connection.usable(asyncio.get_running_loop().time()):
            self._idle.setdefault(key, []).append(connection)
        else:
            connection.close()

    async def close(self) -> None:
        for kept in self._idle.values():
            for connection in kept:
                connection.close()
        self._idle.clear()
        await self._closer.wait(timeout=1.0)


@dataclass(frozen=True)
class Answer:
    """A whole, small answer: status, headers (names lower-cased) and the decoded body."""

    status: int
    headers: dict[str, str]
    body: bytes


async def fetch_once(url: str, headers: Iterable[tuple[str, str]] = (), method: str = "GET", *,
                     limit: int = 1024 * 1024) -> Answer:
    """`method url` on a connection of its own, closed after; the answer read whole (ValueError past `limit`
    bytes). The caller bounds the time (`asyncio.timeout`); OSError and ConnectionError when it fails."""
    split = urlsplit(url)
    target = (split.path or "/") + (f"?{split.query}" if split.query else "")
    reader, writer = await asyncio.open_connection(split.hostname or "", split.port or 80, limit=READ_SIZE)
    connection = H1Connection(reader, writer, keepalive=False)
    try:
        sent = [("Host", split.netloc), *((n, v) for n, v in headers if n.lower() != "host")]
        if method in ("POST", "PUT", "PATCH"):
            sent.append(("Content-Length", "0"))
        response = await connection.request(split.netloc, target, [*sent, ("Connection", "close")], method)
        body = b""
        async for chunk in response.chunks():
            body += chunk
            if len(body) > limit:
                raise ValueError(f"answer from {url} over {limit} bytes")
        return Answer(response.status, dict(response.headers), body)
    finally:
        writer.transport.abort()
