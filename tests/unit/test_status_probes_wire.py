"""HTTPS probes with HTTP/2 offered (sans-IO): the request headers for each protocol, body decoding, and when a
kept HTTP/2 connection is pinged or given up (Kubernetes' prober settings, times passed in)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import pytest

from istio_agent.status.probes.wire import (
    H2_PING_TIMEOUT,
    H2_READ_IDLE_TIMEOUT,
    IDLE_CONNECTION_TIMEOUT,
    BodyDecoder,
    ConnectionHealth,
    h1_headers,
    h2_headers,
    request_target,
)


def test_request_target_keeps_the_port_as_written_and_the_query() -> None:
    assert request_target("https://10.1.2.3:8443/healthz?full=1") == ("10.1.2.3:8443", "/healthz?full=1")
    assert request_target("https://[fd00::1]:443") == ("[fd00::1]:443", "/")


def test_http11_headers_are_what_the_aiohttp_path_sends() -> None:
    sent = h1_headers("10.1.2.3:8443", [("User-Agent", "istio-probe/1.0"), ("X-Probe", "a")], keepalive=False)
    assert sent == [("Host", "10.1.2.3:8443"), ("User-Agent", "istio-probe/1.0"), ("X-Probe", "a"),
                    ("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"), ("Connection", "close")]
    kept = h1_headers("h:1", [("accept", "application/json"), ("Content-Length", "4")], keepalive=True)
    assert kept == [("Host", "h:1"), ("accept", "application/json"), ("Accept-Encoding", "gzip, deflate")]


def test_http2_headers_lower_case_and_leave_out_connection_specific_ones() -> None:
    sent = h2_headers("10.1.2.3:8443", "/ready?x=1", [
        ("User-Agent", "istio-probe/1.0"), ("Connection", "keep-alive"), ("Keep-Alive", "5"), ("Upgrade", "h2c"),
        ("Transfer-Encoding", "chunked"), ("Proxy-Connection", "x"), ("Content-Length", "0"), ("TE", "gzip"),
        ("Accept-Encoding", "identity")])
    assert sent == [(":method", "GET"), (":scheme", "https"), (":authority", "10.1.2.3:8443"), (":path", "/ready?x=1"),
                    ("user-agent", "istio-probe/1.0"), ("accept-encoding", "identity"), ("accept", "*/*")]
    assert ("te", "trailers") in h2_headers("h:1", "/", [("TE", "trailers")])


def _take_all(decoder: BodyDecoder, step: int) -> bytes:
    out = b""
    while chunk := decoder.take(step):
        out += chunk
    return out


@pytest.mark.parametrize(("encoding", "encode"), [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),  # RFC 1950, as it should be
    ("deflate", lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS)),  # raw deflate, as some servers send
    ("", lambda data: data),
    ("br", lambda data: data),  # not offered: passed back as it came
])
def test_bodies_are_decoded_in_bounded_pieces(encoding: str, encode: Callable[[bytes], bytes]) -> None:
    body = b"all good " * 5000
    raw = encode(body)
    decoder = BodyDecoder(encoding.upper() if encoding else None)
    for start in range(0, len(raw), 333):  # fed as it arrives
        decoder.feed(raw[start:start + 333])
    first = decoder.take(100)
    assert len(first) == 100  # never more than asked for
    assert first + _take_all(decoder, 1000) == body


def test_a_body_that_does_not_decode_is_an_error() -> None:
    decoder = BodyDecoder("gzip")
    decoder.feed(b"not gzip at all")
    with pytest.raises(ValueError, match="gzip"):
        decoder.take(10)


def test_a_quiet_connection_is_pinged_and_kept_while_the_app_answers() -> None:
    health = ConnectionHealth(last_frame=100.0)
    health.requests_in_flight(1, 100.0)
    assert health.due(100.0 + H2_READ_IDLE_TIMEOUT - 0.1) is None
    assert health.deadline() == 100.0 + H2_READ_IDLE_TIMEOUT
    now = 100.0 + H2_READ_IDLE_TIMEOUT
    assert health.due(now) == "ping"
    health.pinged(now)
    assert health.due(now + 1) is None  # one ping at a time
    assert health.deadline() == now + H2_PING_TIMEOUT
    health.received(now + 2)  # another frame is not the ack
    assert health.due(now + H2_PING_TIMEOUT) == "dead"


def test_an_answered_ping_keeps_the_connection() -> None:
    health = ConnectionHealth(last_frame=0.0)
    health.requests_in_flight(1, 0.0)
    health.pinged(H2_READ_IDLE_TIMEOUT)
    health.received(H2_READ_IDLE_TIMEOUT + 1, ping_ack=True)
    assert health.due(H2_READ_IDLE_TIMEOUT + H2_PING_TIMEOUT + 1) is None
    assert health.due(2 * H2_READ_IDLE_TIMEOUT + 1) == "ping"


def test_a_kept_connection_unused_for_the_idle_timeout_closes() -> None:
    health = ConnectionHealth(last_frame=0.0)
    health.requests_in_flight(0, 0.0)
    health.received(IDLE_CONNECTION_TIMEOUT - 1, ping_ack=True)  # pings answered all along
    assert health.due(IDLE_CONNECTION_TIMEOUT - 1) is None
    assert health.due(IDLE_CONNECTION_TIMEOUT) == "idle"
    health.requests_in_flight(1, IDLE_CONNECTION_TIMEOUT)  # in use: not idle
    assert health.due(IDLE_CONNECTION_TIMEOUT) is None
    health.requests_in_flight(0, IDLE_CONNECTION_TIMEOUT + 5)
    assert health.due(2 * IDLE_CONNECTION_TIMEOUT) == "ping"  # not idle yet: the idle clock restarted at +5
    assert health.due(2 * IDLE_CONNECTION_TIMEOUT + 5) == "idle"


def test_a_connection_for_one_probe_never_idles_out() -> None:
    health = ConnectionHealth(last_frame=0.0, idle_timeout=None)
    health.requests_in_flight(0, 0.0)
    health.received(10 * IDLE_CONNECTION_TIMEOUT)
    assert health.due(10 * IDLE_CONNECTION_TIMEOUT) is None
