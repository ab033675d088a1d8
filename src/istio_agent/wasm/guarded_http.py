"""HTTP(S) GETs for Wasm fetches, on the product's h11 client, with the SSRF guard at every connection.

Each request resolves its host, refuses the addresses `core/ssrf.py` blocks, and connects to an allowed
address itself (TLS with the URL's name for SNI and verification, unless the host is an insecure registry):
what was checked is what is connected to. Redirects are followed by the same path, so a redirect to a
metadata address is refused like a direct request. A body over the cap fails as soon as it passes the cap.

Why not an HTTP library (aiohttp, httpx): the guard must see the resolved address before the connection, which
both allow only through their own resolver or transport classes, and the agent already carries h11 for its
status server and probes; this is the one small client that Wasm fetches and the registry client share.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from istio_agent.httpio.client import READ_SIZE, H1Connection
from istio_agent.wasm.core.ssrf import Network, blocked_reason
from istio_agent.wasm.core.unbox import ModuleTooLarge

MAX_REDIRECTS = 10
CONNECT_TIMEOUT = 30.0  # upstream's dialer timeout
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class FetchError(Exception):
    """A request that got no usable answer (connection refused, TLS, timeout, blocked address)."""


class BlockedAddress(FetchError):
    """The URL's host resolved to an address Wasm fetches never connect to."""


class PlainHttpServer(FetchError):
    """An HTTPS connection was answered in plain HTTP (registries: retried over http, as upstream)."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    url: str  # after redirects

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)


class GuardedHttp:
    """GET with the SSRF guard, TLS per host, a body cap and redirects."""

    def __init__(self, blocked: Iterable[Network] = (), insecure: Iterable[str] = ()) -> None:
        self.blocked = tuple(blocked)
        self.insecure = frozenset(insecure)
        self._contexts: dict[bool, ssl.SSLContext] = {}

    async def _tls(self, verify: bool) -> ssl.SSLContext:
        """The TLS context, made at the first HTTPS request and off the loop (loading the system's CAs takes
        ~50 ms)."""
        context = self._contexts.get(verify)
        if context is None:
            context = await asyncio.to_thread(ssl.create_default_context)
            if not verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._contexts[verify] = context
        return context

    def _insecure(self, netloc: str, host: str) -> bool:
        return "*" in self.insecure or netloc in self.insecure or host in self.insecure

    async def get(self, url: str, headers: Mapping[str, str] | None = None, *, limit: int,
                  timeout: float) -> Answer:
        """The answer to `GET url` after redirects; FetchError if none, ModuleTooLarge past `limit` bytes."""
        sent = dict(headers or {})
        origin = urlsplit(url).netloc
        for _ in range(MAX_REDIRECTS + 1):
            async with asyncio.timeout(timeout):
                answer = await self._once(url, sent, limit)
            location = answer.header("location")
            if answer.status not in _REDIRECTS or not location:
                return answer
            url = urljoin(url, location)
            if urlsplit(url).netloc != origin:  # credentials never follow a redirect to another host
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
        raise FetchError(f"stopped after {MAX_REDIRECTS} redirects")

    async def _connect(self, host: str, port: int, tls: ssl.SSLContext | None) -> tuple[
            asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FetchError(f"lookup {host}: {exc}") from None
        last: Exception | None = None
        for family, _, _, _, sockaddr in infos:
            ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            reason = blocked_reason(ip, self.blocked)
            if reason is not None:
                raise BlockedAddress(reason)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    return await asyncio.open_connection(
                        str(sockaddr[0]), port, family=family, ssl=tls, server_hostname=host if tls else None,
                        limit=READ_SIZE)
            except ssl.SSLError as exc:
                if "WRONG_VERSION_NUMBER" in str(exc) or "record layer failure" in str(exc):
                    raise PlainHttpServer(f"{host}:{port}: server gave HTTP response to HTTPS client") from None
                raise FetchError(f"TLS with {host}:{port}: {exc}") from None
            except (OSError, TimeoutError) as exc:
                last = exc
        reason = (str(last) or type(last).__name__) if last is not None else "no address"
        raise FetchError(f"dial {host}:{port}: {reason}")

    async def _once(self, url: str, headers: Mapping[str, str], limit: int) -> Answer:
        split = urlsplit(url)
        if split.scheme not in ("http", "https"):
            raise FetchError(f"unsupported scheme in {url}")
        host = split.hostname or ""
        port = split.port or (443 if split.scheme == "https" else 80)
        tls = None
        if split.scheme == "https":
            tls = await self._tls(verify=not self._insecure(split.netloc, host))
        reader, writer = await self._connect(host, port, tls)
        connection = H1Connection(reader, writer, keepalive=False, closer=lambda w: w.transport.abort())
        try:
            target = (split.path or "/") + (f"?{split.query}" if split.query else "")
            response = await connection.request(
                split.netloc, target, [("Host", split.netloc), ("Connection", "close"),
                                       ("User-Agent", "istio-agent-wasm"), *headers.items()])
            if response.content_length is not None and response.content_length > limit:
                raise ModuleTooLarge(limit)
            parts, size = [], 0
            async for chunk in response.chunks():
                size += len(chunk)
                if size > limit:
                    raise ModuleTooLarge(limit)
                parts.append(chunk)
            return Answer(response.status, response.headers, b"".join(parts), url)
        except (ConnectionError, OSError) as exc:
            raise FetchError(f"GET {url}: {exc}") from None
        finally:
            connection.close()
