"""One server-side HTTP/1.1 connection, sans-IO: h11 plus the limits a port anyone may reach needs.

h11 parses and frames; this adds what a server open to the pod network must
decide itself, with time passed in:

- a request that is not HTTP is refused at its first bytes (a TLS ClientHello or
  binary garbage never ends a line, so h11 alone would wait for more);
- methods outside RFC 9110's (and PATCH), versions other than 1.0/1.1, a request
  target or header field over 8190 bytes, a head over 64 KiB and a body over
  1 MiB are refused (400, 431 or 413), as aiohttp's limits did;
- a request's head and body must arrive within `request_timeout` of its first
  byte (slowloris), and an idle keep-alive connection is closed after
  `idle_timeout` (`first_request_timeout`, when set, for a new connection's
  first request to begin);
- a server that authenticates may look at a request's head before its body is
  read (`head_check`): refuse it, or give it a smaller body limit, so a client
  without credentials cannot make the server buffer megabytes;
- pipelined requests are answered one after another, in order.

A refused request is a `Malformed` with the status to answer; the connection
is closed after that answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol
from urllib.parse import unquote

import h11

MAX_HEAD_BYTES = 64 * 1024
MAX_FIELD_BYTES = 8190  # aiohttp's max_line_size / max_field_size
MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT = 10.0
IDLE_TIMEOUT = 75.0  # aiohttp's keepalive_timeout
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_LONGEST_METHOD = max(len(m) for m in METHODS)
# The bytes Go's net/http takes in a Host header (httpguts.ValidHostHeader): anything else is a 400.
_HOST_BYTES = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!$%&()*+,-.:;=['[]_~"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json; charset=utf-8"


@dataclass(frozen=True)
class Limits:
    """What one connection may cost; the defaults are the status server's."""

    max_head_bytes: int = MAX_HEAD_BYTES
    max_field_bytes: int = MAX_FIELD_BYTES
    max_body_bytes: int = MAX_BODY_BYTES
    request_timeout: float = REQUEST_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    # None: as `idle_timeout`. A port open to untrusted clients wants a new connection to start talking soon.
    first_request_timeout: float | None = None
    # How long one write of a response may wait for the client to read (None: as long as it takes); a client
    # that stops reading a streamed response is cut off after it.
    write_timeout: float | None = None
    # Connection slots (None: no cap), shared by source as `admission.ConnectionSlots` decides.
    max_connections: int | None = None
    max_per_source: int | None = None
    # A connection's kernel send buffer (SO_SNDBUF; None: the kernel's autotuning, up to tcp_wmem's maximum, 4 MiB
    # by default). Smaller bounds what a client that stops reading costs before the server sees it blocked.
    send_buffer_bytes: int | None = None


class Malformed(Exception):
    """A request refused before any handler saw it: answer `status` with `reason`, then close.

    `limit` is the number a 413 or 431 exceeded, for servers that word their own refusals."""

    def __init__(self, reason: str, status: int = 400, limit: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.status, self.limit = reason, status, limit


@dataclass(frozen=True)
class Request:
    """One request as handlers see it: header names as the client wrote them, the path percent-decoded."""

    method: str
    target: str
    path: str
    query_string: str
    headers: tuple[tuple[str, str], ...]
    remote: str | None
    http_version: str = "1.1"
    body: bytes = b""

    def header(self, name: str, default: str | None = None) -> str | None:
        lower = name.lower()
        return next((value for key, value in self.headers if key.lower() == lower), default)


class BodyStream(Protocol):
    """A response body produced while it is sent; `aclose` is always called, even when nothing was read."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@dataclass
class Response:
    """What a handler answers: a body, or a `stream` sent chunked; `gzip` compresses it on the way out."""

    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: BodyStream | None = None
    gzip: bool = False


def text_response(status: int, text: str, headers: Iterable[tuple[str, str]] = ()) -> Response:
    return Response(status, text.encode(), [("Content-Type", TEXT), *headers])


def json_response(status: int, text: str) -> Response:
    return Response(status, text.encode(), [("Content-Type", JSON)])


# A request's head (its body not yet read) -> the body limit for it (None: the connection's), or Malformed.
HeadCheck = Callable[[Request], int | None]


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def go_refusal(refused: Malformed) -> Response:
    """A refusal worded as Go's net/http words a bad request (`400 Bad Request: malformed Host header`), for a
    server that stands for a Go one (`HttpServer(render_error=go_refusal)`)."""
    return text_response(refused.status, f"{refused.status} {_phrase(refused.status)}: {refused.reason}")


def error_bytes(status: int, reason: str, *, body: bytes | None = None, content_type: str = TEXT,
                headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A complete answer to a request h11 could not take (its state may be ERROR): always closes.

    The body is `reason` as text unless a server words its refusals itself (`body`, `content_type`)."""
    data = reason.encode("utf-8", "replace") if body is None else body
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return (f"HTTP/1.1 {status} {_phrase(status)}\r\nContent-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode() + data


def _latin1(value: bytes) -> str:
    return value.decode("latin-1")


def check_request_start(buffered: bytes) -> None:
    """Refuse what cannot begin a request line, as soon as its first bytes show it (Malformed)."""
    if not buffered:
        return
    if buffered[0] == 0x16:
        raise Malformed("TLS handshake on a plaintext HTTP port")
    method, space, _ = buffered[:_LONGEST_METHOD + 1].partition(b" ")
    if any(byte not in _TCHAR for byte in method):
        raise Malformed("not an HTTP request")
    if space and _latin1(method) not in METHODS:
        raise Malformed(f"unsupported method {_latin1(method)[:20]!r}")
    if not space and len(method) > _LONGEST_METHOD:
        raise Malformed("unsupported method")


class ServerConnection:
    """The request/response cycle of one connection; the edge feeds bytes and the time, and writes what it gets."""

    def __init__(self, now: float, remote: str | None = None, limits: Limits = Limits(),
                 head_check: HeadCheck | None = None) -> None:
        self.limits = limits
        self.remote = remote
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        self._head: h11.Request | None = None
        self._head_check = head_check
        self._body = bytearray()
        self._body_limit = limits.max_body_bytes
        self._started: float | None = None  # first byte of the request being read
        self._idle_since = now
        self._served = False  # a request has been answered (the first request's wait is over)
        self._eof = False

    # ---- receiving ---------------------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> None:
        """Bytes from the socket (b"": the peer closed its side)."""
        if not data:
            self._eof = True
        elif self._started is None:
            self._started = now
        self.h11.receive_data(data)

    def deadline(self) -> float:
        """Until when to wait for more bytes before giving up on the connection."""
        if self._started is not None:
            return self._started + self.limits.request_timeout
        first = self.limits.first_request_timeout
        if first is not None and not self._served:
            return self._idle_since + first
        return self._idle_since + self.limits.idle_timeout

    @property
    def mid_request(self) -> bool:
        """Bytes of a request have arrived (a timeout now is the client's fault, worth a 408)."""
        return self._started is not None

    def next_request(self) -> Request | h11.ConnectionClosed | None:
        """The next complete request; None when more bytes are needed; ConnectionClosed when the peer is gone.

        Raises Malformed for a request to refuse.
        """
        while True:
            if self._head is None and self.h11.their_state is h11.IDLE:
                check_request_start(self.h11.trailing_data[0])
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                if self._eof:
                    return h11.ConnectionClosed()  # a request cut short by the peer's close: nobody to answer
                status = exc.error_status_hint if 400 <= exc.error_status_hint < 500 else 400
                raise Malformed(str(exc) or "malformed request", status) from None
            if event is h11.NEED_DATA:
                return None
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return h11.ConnectionClosed()
            if isinstance(event, h11.Request):
                self._check_head(event)
                self._head = event
                self._body_limit = self.limits.max_body_bytes
                if self._head_check is not None:
                    limit = self._head_check(self._make_request(event, b""))
                    if limit is not None:
                        self._body_limit = min(limit, self._body_limit)
                        self._check_length(event, self._body_limit)
            elif isinstance(event, h11.Data):
                if len(self._body) + len(event.data) > self._body_limit:
                    raise Malformed(f"request body over {self._body_limit} bytes", 413, self._body_limit)
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return self._request()

    def _check_head(self, event: h11.Request) -> None:
        method = _latin1(event.method)
        if method not in METHODS:
            raise Malformed(f"unsupported method {method[:20]!r}")
        if event.http_version not in (b"1.0", b"1.1"):
            raise Malformed(f"unsupported HTTP version {_latin1(event.http_version)[:10]!r}")
        if len(event.target) > self.limits.max_field_bytes:
            raise Malformed(f"request target over {self.limits.max_field_bytes} bytes", 414)
        size = len(event.target)
        self._check_length(event, self.limits.max_body_bytes)
        # Go's server refuses a Host outside these bytes (each of our servers stands for a Go one upstream; h11
        # has already refused a second Host).
        if any(name == b"host" and value.translate(None, _HOST_BYTES) for name, value in event.headers):
            raise Malformed("malformed Host header")
        for name, value in event.headers.raw_items():
            field_size = len(name) + len(value) + 2
            if field_size > self.limits.max_field_bytes:
                raise Malformed(f"header field over {self.limits.max_field_bytes} bytes", 431)
            size += field_size
        if size > self.limits.max_head_bytes:
            raise Malformed(f"request head over {self.limits.max_head_bytes} bytes", 431)

    @staticmethod
    def _check_length(event: h11.Request, limit: int) -> None:
        for name, value in event.headers:
            if name == b"content-length" and int(value) > limit:
                raise Malformed(f"request body over {limit} bytes", 413, limit)

    def _request(self) -> Request:
        head = self._head
        assert head is not None
        request = self._make_request(head, bytes(self._body))
        self._head, self._body = None, bytearray()
        return request

    def _make_request(self, head: h11.Request, body: bytes) -> Request:
        target = _latin1(head.target)
        path, _, query = target.partition("?")
        if "://" in path and not path.startswith("/"):  # absolute form: the path is what follows the authority
            rest = path.split("://", 1)[1]
            path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
        return Request(
            method=_latin1(head.method), target=target, path=unquote(path), query_string=query,
            headers=tuple((_latin1(n), _latin1(v)) for n, v in head.headers.raw_items()),
            remote=self.remote, http_version=_latin1(head.http_version), body=body)

    # ---- sending -----------------------------------------------------------------------------------------

    def interim(self) -> bytes:
        """`100 Continue` when the client waits for it before sending its body (b"" otherwise)."""
        if self.h11.they_are_waiting_for_100_continue:
            return self.h11.send(h11.InformationalResponse(status_code=100, headers=[], reason="Continue")) or b""
        return b""

    def start_response(self, status: int, headers: Iterable[tuple[str, str]]) -> bytes:
        return self.h11.send(h11.Response(status_code=status, headers=list(headers), reason=_phrase(status))) or b""

    def send_body(self, data: bytes) -> bytes:
        return self.h11.send(h11.Data(data=data)) or b"" if data else b""

    def end_response(self) -> bytes:
        return self.h11.send(h11.EndOfMessage()) or b""

    def next_cycle(self, now: float) -> bool:
        """After a response: ready for the next request (True), or the connection must close."""
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            return False
        self.h11.start_next_cycle()
        self._served = True
        self._idle_since = now
        self._started = now if self.h11.trailing_data[0] else None  # a pipelined request is already under way
        return True
