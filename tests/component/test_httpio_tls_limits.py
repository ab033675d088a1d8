"""`httpio.HttpServer` on a port untrusted clients reach: HTTPS through `httpio.tls`, a handshake that never ends
is cut at the request deadline, connection slots shared by source, a client that stops reading an answer is cut
after the write deadline, and refusals worded by the server."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from istio_agent.httpio.routing import Router
from istio_agent.httpio.server import HttpServer
from istio_agent.httpio.server_core import Limits, Malformed, Request, Response, text_response
from istio_agent.pki.certs import cert_to_pem, issue_server_cert, new_root_ca
from istio_agent.pki.keys import generate_key, key_to_pem

LOOPBACK = "127.0.0.1"


class Endless:
    """A streamed body that never ends (a watch nobody reads)."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def _gen(self) -> AsyncIterator[bytes]:
        while True:
            yield b"x" * 65536
            await asyncio.sleep(0)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def aclose(self) -> None:
        self.closed.set()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    now = time.time()
    ca = new_root_ca(generate_key("ECDSA"), "test", now, 3600)
    key = generate_key("ECDSA")
    cert = issue_server_cert(ca, key, ["localhost"], [LOOPBACK], now, 3600)
    base = tmp_path_factory.mktemp("tls")
    (base / "cert.pem").write_text(cert_to_pem(cert))
    (base / "key.pem").write_bytes(key_to_pem(key))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(Path(base / "cert.pem"), Path(base / "key.pem"))
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return server, client


@pytest.fixture
async def tls_server(tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> AsyncIterator[tuple[HttpServer, int]]:
    endless: list[Endless] = []

    async def echo(request: Request) -> Response:
        return text_response(200, f"{request.method} {request.path} {len(request.body)}")

    async def stream(request: Request) -> Response:
        body = Endless()
        endless.append(body)
        return Response(200, headers=[("Content-Type", "text/plain")], stream=body)

    def render(exc: Malformed) -> Response:
        return Response(exc.status, f'{{"refused":{exc.status},"limit":{exc.limit or 0}}}'.encode(),
                        [("Content-Type", "application/json")])

    router = Router()
    router.add("/echo", echo)
    router.add("/stream", stream)
    limits = Limits(request_timeout=0.5, first_request_timeout=0.5, write_timeout=0.5, max_connections=6,
                    max_per_source=3, max_body_bytes=1000)
    server = HttpServer(router, limits=limits, render_error=render,
                        head_check=lambda head: None if head.header("Authorization") else 10)
    port = await server.start(LOOPBACK, 0, tls=tls_files[0])
    try:
        yield server, port
    finally:
        await server.stop()


async def _https(port: int, client: ssl.SSLContext, data: bytes, timeout: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=client, server_hostname="localhost")
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def test_https_requests_are_served_and_bodies_limited_by_the_head_check(
        tls_server: tuple[HttpServer, int], tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    _, port = tls_server
    ok = await _https(port, tls_files[1], b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: t\r\nContent-Length: 20"
                                          b"\r\nConnection: close\r\n\r\n" + b"a" * 20)
    assert ok.startswith(b"HTTP/1.1 200 OK") and ok.endswith(b"POST /echo 20")
    refused = await _https(port, tls_files[1], b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 413 ") and refused.endswith(b'{"refused":413,"limit":10}')


async def test_a_handshake_never_completed_and_a_dripped_request_are_cut_at_the_deadline(
        tls_server: tuple[HttpServer, int], tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server, port = tls_server
    reader, writer = await asyncio.open_connection(LOOPBACK, port)  # TCP only: no ClientHello ever
    try:
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
    finally:
        writer.close()
    reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=tls_files[1], server_hostname="localhost")
    try:
        writer.write(b"GET /echo HTTP/1.1\r\n")

        async def drip() -> None:  # a byte now and then, never the end of the head
            while True:
                await asyncio.sleep(0.1)
                writer.write(b"X")

        dripping = asyncio.create_task(drip())
        try:
            answer = await asyncio.wait_for(reader.read(), 5.0)
        finally:
            dripping.cancel()
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"refused":408' in answer
    finally:
        writer.close()
    await asyncio.sleep(0.1)
    assert server.connections == 0


async def test_a_source_at_its_limit_competes_with_itself_and_a_busy_connection_stays(
        tls_server: tuple[HttpServer, int], tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server, port = tls_server
    assert server.slots is not None
    # A watch-like stream that is being read stays: it is busy.
    reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=tls_files[1], server_hostname="localhost")
    writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    idle = [await asyncio.open_connection(LOOPBACK, port) for _ in range(4)]  # plain TCP, never a handshake
    try:
        await asyncio.sleep(0.1)
        assert server.slots.count(LOOPBACK) == 3, "the source holds its three slots, no more"
        closed = [r.at_eof() or await _closed_soon(r) for r, _ in idle[:2]]
        assert all(closed), "the oldest idle connections of the source gave way"
        assert len(await reader.read(65536)) > 0, "the busy stream was not evicted"
    finally:
        writer.close()
        for _, w in idle:
            w.close()


async def _closed_soon(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 2.0) == b""
    except (ConnectionResetError, TimeoutError):
        return True


async def test_a_client_that_stops_reading_a_stream_is_cut_after_the_write_deadline(
        tls_server: tuple[HttpServer, int], tls_files: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server, port = tls_server
    _reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=tls_files[1], server_hostname="localhost",
                                                   limit=1024)
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    try:
        deadline = time.monotonic() + 10
        while server.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert server.connections == 0, "the connection that stopped reading was cut"
    finally:
        writer.close()
