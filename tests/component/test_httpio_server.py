"""The status server's HTTP edge (`httpio.server`) on real loopback sockets: what a reachable port must survive.

Slow clients are cut at their request deadline (a short one here), pipelined
requests are answered in order on one connection, bad input is answered and
reported, a failing handler costs only its own request, streamed bodies are
framed and gzip-compressed, HEAD gets no body, and `httpio.client`'s pool
reuses its connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from istio_agent.httpio.client import Pool
from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.httpio.server_core import Limits, Request, Response, text_response

LOOPBACK = "127.0.0.1"


class Chunks:
    def __init__(self, parts: list[bytes]) -> None:
        self.parts, self.closed = parts, False

    async def _gen(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def aclose(self) -> None:
        self.closed = True


Served = tuple[int, list[tuple[str | None, str]], list[Chunks], list[str]]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    malformed: list[tuple[str | None, str]] = []
    streams: list[Chunks] = []
    peers: list[str] = []

    async def echo(request: Request) -> Response:
        peers.append(str(request.remote))
        return text_response(200, f"{request.method} {request.path}")

    async def fail(request: Request) -> Response:
        raise RuntimeError("handler bug")

    async def stream(request: Request) -> Response:
        body = Chunks([b"a" * 5000, b"", b"b" * 5000])
        streams.append(body)
        return Response(200, headers=[("Content-Type", "text/plain")], stream=body,
                        gzip="gzip" in (request.header("Accept-Encoding") or ""))

    router = Router()
    router.add("/echo", echo)
    router.add("/fail", fail)
    router.add_get("/stream", stream)
    server = HttpServer(router, limits=Limits(request_timeout=0.5, idle_timeout=1.0),
                        on_malformed=lambda peer, reason: malformed.append((peer, reason)))
    port = await server.start(LOOPBACK, 0)
    try:
        yield port, malformed, streams, peers
    finally:
        await server.stop()


async def exchange(port: int, data: bytes, pause: float | None = None, timeout: float = 5.0) -> bytes:
    """Send `data` (its last byte after `pause` seconds when given), then read until the server closes."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        if pause is None:
            writer.write(data)
        else:
            writer.write(data[:-1])
            await writer.drain()
            await asyncio.sleep(pause)
            writer.write(data[-1:])
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order_on_one_connection(served: Served) -> None:
    port, malformed, _, _ = served
    answer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
                                  b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                                  b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    assert answer.index(b"GET /echo") < answer.index(b"POST /echo") < answer.rindex(b"GET /echo")
    assert malformed == []


async def test_a_slow_request_is_cut_at_its_deadline_with_408(served: Served) -> None:
    port, _, _, peers = served
    answer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", pause=1.5)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout")
    assert peers == [], "the handler never ran"


async def test_an_idle_keepalive_connection_is_closed(served: Served) -> None:
    port, _, _, _ = served
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed, nothing said
    finally:
        writer.close()


@pytest.mark.parametrize(("data", "status"), [
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", b"400"),
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    (b"GET /echo HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
])
async def test_bad_input_is_answered_reported_and_closed(served: Served, data: bytes, status: bytes) -> None:
    port, malformed, _, peers = served
    answer = await exchange(port, data)
    assert answer.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in answer
    assert [peer for peer, _ in malformed] == [LOOPBACK] and peers == []


async def test_a_failing_handler_costs_only_its_request(served: Served) -> None:
    port, _, _, _ = served
    answer = await exchange(port, b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n"
                                  b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error") and b"HTTP/1.1 200 OK" in answer


async def test_streamed_bodies_are_chunked_gzipped_when_asked_and_head_has_none(served: Served) -> None:
    port, _, streams, _ = served
    pool = Pool()
    try:
        plain = await pool.request(f"http://{LOOPBACK}:{port}/stream")
        assert plain.header("transfer-encoding") == "chunked"
        assert await plain.read() == b"a" * 5000 + b"b" * 5000
        plain.release()
        packed = await pool.request(f"http://{LOOPBACK}:{port}/stream", [("Accept-Encoding", "gzip")])
        assert packed.header("content-encoding") == "gzip"
        raw = b"".join([data async for data in packed.response.chunks()])  # decoded by the client's BodyDecoder
        assert raw == b"a" * 5000 + b"b" * 5000
        packed.release()
        assert len(pool._idle[(LOOPBACK, port)]) == 1, "one connection, kept and reused"
    finally:
        await pool.close()
    head = await exchange(port, b"HEAD /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert [s.closed for s in streams] == [True, True, True], "every body stream closed, HEAD's unread one too"
