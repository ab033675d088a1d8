"""An HTTPS probe's HTTP/2 connection (the `h2` state machine under asyncio streams), for an app that selected h2.

`https` dials, and hands the connection here when ALPN says h2; this
module is imported only then. One task per connection reads frames, routes
them to the probes' streams and keeps `ConnectionHealth`'s rules: a quiet
connection is pinged, an unanswered ping or (when kept) an idle spell closes
it. Flow-control window is given back as a probe reads its body, so an app
cannot make the agent buffer more than a window per stream; a probe done
early (the body cap, a redirect) cancels its stream and the connection stays
usable for the next probe when connections are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from istio_agent.httpio.client import READ_SIZE, Closer, Response, latin1
from istio_agent.status.probes.wire import ConnectionHealth, h2_headers

log = logging.getLogger("istio_agent.probes")

PING_DATA = b"istio-pr"  # any 8 bytes


class H2Stream:
    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.response: asyncio.Future[tuple[int, list[tuple[str, str]]]] = (
            asyncio.get_running_loop().create_future())
        self.chunks: deque[tuple[bytes, int]] = deque()  # (data, flow-controlled length) not read yet
        self.ended = False
        self.error: BaseException | None = None
        self.changed = asyncio.Event()

    def fail(self, error: BaseException) -> None:
        if self.ended or self.error:
            return
        self.error = error
        if not self.response.done():
            self.response.set_exception(error)
            self.response.exception()  # retrieved: nobody may be waiting any more
        self.changed.set()


class H2Connection:
    protocol = "h2"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, health: ConnectionHealth,
                 closer: Closer) -> None:
        loop = asyncio.get_running_loop()
        self.reader, self.writer, self.health, self.closer = reader, writer, health, closer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        # As Go's client: no server push.
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 65536,
        })
        self.h2.initiate_connection()
        self.streams: dict[int, H2Stream] = {}
        self.health.requests_in_flight(0, loop.time())
        self.closed: str | None = None  # why, once closed
        self.going_away = False
        self._flush()
        self.task = loop.create_task(self._run(), name="probe-h2-connection")

    def usable(self, now: float) -> bool:
        return (self.closed is None and not self.going_away and self.health.due(now) not in ("dead", "idle")
                and self.h2.open_outbound_streams < self.h2.remote_settings.max_concurrent_streams)

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def request(self, authority: str, target: str, headers: Iterable[tuple[str, str]]) -> Response:
        if self.closed is not None:
            raise ConnectionError(f"HTTP/2 connection closed: {self.closed}")
        stream = H2Stream(self.h2.get_next_available_stream_id())
        self.streams[stream.id] = stream
        self.health.requests_in_flight(len(self.streams), asyncio.get_running_loop().time())
        try:
            try:
                self.h2.send_headers(stream.id, h2_headers(authority, target, headers), end_stream=True)
            except h2.exceptions.H2Error as exc:  # a header HTTP/2 cannot carry, say
                raise ConnectionError(f"HTTP/2 request refused: {exc}") from None
            self._flush()
            await self.writer.drain()
            status, response_headers = await stream.response
        except BaseException:
            self.forget(stream)
            raise
        return H2Response(self, stream, status, response_headers)

    def forget(self, stream: H2Stream) -> None:
        """The caller is done with `stream`: cancel it if the app is still sending, give back its window."""
        if self.streams.pop(stream.id, None) is None:
            return
        if self.closed is None:
            unread = sum(length for _, length in stream.chunks)
            stream.chunks.clear()
            with contextlib.suppress(h2.exceptions.H2Error):
                if not stream.ended and stream.error is None:
                    self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
                if unread:
                    self.h2.acknowledge_received_data(unread, stream.id)  # the connection's window only
            self._flush()
        self.health.requests_in_flight(len(self.streams), asyncio.get_running_loop().time())
        if self.going_away and not self.streams:
            self.close("the app sent GOAWAY")

    def acknowledge(self, stream: H2Stream, length: int) -> None:
        if self.closed is None and length:
            with contextlib.suppress(h2.exceptions.H2Error):
                self.h2.acknowledge_received_data(length, stream.id)
            self._flush()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        reason = "the app closed the connection"
        polite = True
        try:
            while self.closed is None:
                timeout = max(0.0, self.health.deadline() - loop.time())
                try:
                    data: bytes | None = await asyncio.wait_for(self.reader.read(READ_SIZE), timeout)
                except TimeoutError:
                    data = None
                now = loop.time()
                if data == b"":
                    break
                if data:
                    events = self.h2.receive_data(data)
                    self.health.received(now, any(isinstance(e, h2.events.PingAckReceived) for e in events))
                    for event in events:
                        self._on_event(event)
                    self._flush()
                action = self.health.due(now)
                if action == "ping":
                    self.h2.ping(PING_DATA)
                    self._flush()
                    self.health.pinged(now)
                elif action == "dead":
                    reason = f"no answer to a ping within {self.health.ping_timeout:g}s"
                    polite = False  # nobody there to answer a TLS close either
                    break
                elif action == "idle":
                    reason = "idle"
                    break
        except h2.exceptions.H2Error as exc:
            reason = f"HTTP/2 protocol error: {exc}"
        except OSError as exc:
            reason = str(exc) or type(exc).__name__
        except Exception as exc:  # a bug here must still fail the probes waiting on this connection
            log.warning("probe HTTP/2 connection failed", exc_info=True)
            reason = f"{type(exc).__name__}: {exc}"
        if self.closed is None:
            log.debug("probe HTTP/2 connection closed: %s", reason)
            self.close(reason, polite)

    def _on_event(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream and not stream.response.done():
            headers = [(latin1(n).lower(), latin1(v)) for n, v in event.headers or ()]
            status = next((v for n, v in headers if n == ":status"), "")
            if status.isdigit():
                stream.response.set_result((int(status), [(n, v) for n, v in headers if not n.startswith(":")]))
            else:
                stream.fail(ConnectionError(f"HTTP/2 response without a valid :status ({status!r})"))
        elif isinstance(event, h2.events.DataReceived) and stream:
            stream.chunks.append((bytes(event.data or b""), event.flow_controlled_length or 0))
            stream.changed.set()
        elif isinstance(event, h2.events.DataReceived) and event.stream_id:  # a stream given up: the window only
            with contextlib.suppress(h2.exceptions.H2Error):
                self.h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and stream:
            stream.ended = True
            stream.changed.set()
        elif isinstance(event, h2.events.StreamReset) and stream:
            stream.fail(ConnectionError(f"the app reset the HTTP/2 stream ({event.error_code!r})"))
        elif isinstance(event, h2.events.PushedStreamReceived) and event.pushed_stream_id:
            self.h2.reset_stream(event.pushed_stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True
            last = event.last_stream_id or 0
            for other in list(self.streams.values()):
                if other.id > last or event.error_code:
                    other.fail(ConnectionError(f"the app sent GOAWAY ({event.error_code!r})"))
            if not self.streams:
                self.close("the app sent GOAWAY")

    def close(self, reason: str = "closed by the prober", polite: bool = True) -> None:
        if self.closed is not None:
            return
        self.closed = reason
        for stream in self.streams.values():
            stream.fail(ConnectionError(f"HTTP/2 connection closed: {reason}"))
        with contextlib.suppress(h2.exceptions.H2Error):
            self.h2.close_connection()
            self._flush()
        self.closer(self.writer, polite)
        if self.task is not asyncio.current_task():
            self.task.cancel()


class H2Response(Response):
    def __init__(self, connection: H2Connection, stream: H2Stream, status: int,
                 headers: list[tuple[str, str]]) -> None:
        super().__init__(status, headers)
        self.connection, self.stream = connection, stream

    async def _more(self) -> bytes | None:
        stream = self.stream
        while True:
            if stream.chunks:
                data, length = stream.chunks.popleft()
                self.connection.acknowledge(stream, length)
                return data
            if stream.ended:
                return None
            if stream.error is not None:
                raise stream.error
            stream.changed.clear()
            await stream.changed.wait()

    def release(self) -> None:
        self.connection.forget(self.stream)
