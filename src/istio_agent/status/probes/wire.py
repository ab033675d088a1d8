"""HTTPS probes with HTTP/2 offered (ISTIO_ENABLE_HTTP2_PROBING): what goes on the wire, when (sans-IO).

Upstream configures its HTTPS probe transport the way Kubernetes' prober does:
TLS offers ALPN `h2` and `http/1.1`, the app's choice decides the protocol on
that one connection, and an HTTP/2 connection kept between probes is pinged
after 30 s without a frame and given up when the ping is not answered within
15 s (Go's ReadIdleTimeout and PingTimeout); Go's default TLS handshake
(10 s) and idle-connection (90 s) timeouts come with it. Plain-HTTP probes and
HTTPS probes with the setting off offer no ALPN and stay HTTP/1.1, as do
plain-HTTP probes (both through `https` as well).

The request carries what aiohttp sent when it ran the probes, so an app sees
the same probe whichever protocol it picked: the caller's headers, then `Accept: */*` and
`Accept-Encoding: gzip, deflate` unless given, with a gzip or deflate body
decoded before it is passed back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from istio_agent.httpio.body import BodyDecoder as BodyDecoder  # re-exported: the probes decode with it

ALPN_PROTOCOLS = ("h2", "http/1.1")
TLS_HANDSHAKE_TIMEOUT = 10.0  # Go's DefaultTransport.TLSHandshakeTimeout, which upstream keeps
IDLE_CONNECTION_TIMEOUT = 90.0  # Go's DefaultTransport.IdleConnTimeout: a kept connection unused this long closes
H2_READ_IDLE_TIMEOUT = 30.0  # Kubernetes' prober: ping an HTTP/2 connection silent for this long...
H2_PING_TIMEOUT = 15.0  # ...and close it when the ping is not answered within this
DEFAULT_HEADERS = (("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"))  # as aiohttp sent them
# Headers that mean nothing (or are refused) in HTTP/2 (RFC 9113 8.2.2); the framing ones are ours in HTTP/1.1.
_CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
_FRAMING = frozenset({"content-length", "transfer-encoding"})


def request_target(url: str) -> tuple[str, str]:
    """(authority, request target) of a probe URL: `host:port` as written, the path with its query."""
    split = urlsplit(url)
    return split.netloc, (split.path or "/") + (f"?{split.query}" if split.query else "")


def _with_defaults(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    out = list(headers)
    names = {name.lower() for name, _ in out}
    return out + [(name, value) for name, value in DEFAULT_HEADERS if name.lower() not in names]


def h1_headers(authority: str, headers: Iterable[tuple[str, str]], keepalive: bool) -> list[tuple[str, str]]:
    """An HTTP/1.1 GET's headers: Host first, the probe's, the defaults, `Connection: close` unless kept.

    A GET here has no body, so framing headers a probe names are left out (h11 would refuse a
    Content-Length with no body to match it).
    """
    out = [("Host", authority)]
    out += [(n, v) for n, v in _with_defaults(headers) if n.lower() not in _FRAMING and n.lower() != "host"]
    if not keepalive and not any(n.lower() == "connection" for n, _ in out):
        out.append(("Connection", "close"))
    return out


def h2_headers(authority: str, target: str, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """An HTTP/2 GET's header block: pseudo-headers, then the probe's names lower-cased (as HTTP/2 requires).

    Connection-specific headers are dropped (HTTP/2 forbids them; Go's transport leaves them out
    too), Content-Length as the GET has no body, and TE unless it is `trailers`.
    """
    out = [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", target)]
    for name, value in _with_defaults(headers):
        lower = name.lower()
        if lower in _CONNECTION_SPECIFIC or lower in ("host", "content-length"):
            continue
        if lower == "te" and value.strip().lower() != "trailers":
            continue
        out.append((lower, value))
    return out


HealthAction = Literal["ping", "dead", "idle"]


@dataclass
class ConnectionHealth:
    """When an HTTP/2 connection to the app is pinged or given up (Kubernetes' prober settings; times passed in).

    `due(now)` says what to do: "ping" when nothing has been received for `read_idle`
    seconds (call `pinged` once sent), "dead" when a ping went unanswered for
    `ping_timeout`, "idle" when no request has been in flight for `idle_timeout`
    (None: never, for a connection closed after its one probe anyway).
    """

    last_frame: float
    idle_since: float | None = None  # None while a request is in flight
    ping_sent: float | None = None
    read_idle: float = H2_READ_IDLE_TIMEOUT
    ping_timeout: float = H2_PING_TIMEOUT
    idle_timeout: float | None = IDLE_CONNECTION_TIMEOUT

    def received(self, now: float, ping_ack: bool = False) -> None:
        self.last_frame = now
        if ping_ack:
            self.ping_sent = None

    def pinged(self, now: float) -> None:
        self.ping_sent = now

    def requests_in_flight(self, count: int, now: float) -> None:
        if count:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def deadline(self) -> float:
        """The next time `due` may have something to say."""
        times = [self.ping_sent + self.ping_timeout if self.ping_sent is not None
                 else self.last_frame + self.read_idle]
        if self.idle_since is not None and self.idle_timeout is not None:
            times.append(self.idle_since + self.idle_timeout)
        return min(times)

    def due(self, now: float) -> HealthAction | None:
        if self.ping_sent is not None and now >= self.ping_sent + self.ping_timeout:
            return "dead"
        if self.idle_since is not None and self.idle_timeout is not None and now >= self.idle_since + self.idle_timeout:
            return "idle"
        if self.ping_sent is None and now >= self.last_frame + self.read_idle:
            return "ping"
        return None
