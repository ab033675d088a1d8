"""Application probes rewritten by the injector: parsing and the kubelet-style rules (sans-IO).

The injector moves each container's liveness/readiness/startup probe (and
httpGet lifecycle hooks) onto the agent's status port and passes the original
probe in `ISTIO_KUBE_APP_PROBERS`, a JSON object mapping a status-server path
(`/app-health/<container>/livez`, ...) to `{httpGet|tcpSocket|grpc,
timeoutSeconds}`. The agent then probes the app the way the kubelet would have:
so an app keeps its probe semantics even when the mesh captures its traffic.

This module holds everything that needs no socket: the parser (a malformed
variable fails agent start with the path and field named, upstream's rule is
to refuse the whole variable), request construction (URL, headers, Host) and
the redirect policy (kubelet's: 3xx answered as success, redirects followed
only to the same host and at most ten requests in all).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

from istio_agent.config.errors import ConfigError
from istio_agent.netaddr import join_host_port

ENV_NAME = "ISTIO_KUBE_APP_PROBERS"  # named in errors; the options resolver reads the variable
APP_PROBER_PATH = re.compile(r"^/(app-health|app-lifecycle)/[^/]+/(livez|readyz|startupz|prestopz|poststartz)$")
PROBE_USER_AGENT = "istio-probe/1.0"
MAX_BODY_BYTES = 10 * 1024  # what upstream passes back of the app's answer
MAX_REQUESTS = 10  # Go's http.Client (and so the kubelet) gives up when the 10th response still redirects
DEFAULT_TIMEOUT_SECONDS = 1.0  # Kubernetes' default timeoutSeconds
FOLLOWED_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Source addresses upstream binds for probes, so that capture rules let them reach the app directly.
PROBE_SOURCE_V4 = "127.0.0.6"
PROBE_SOURCE_V6 = "::6"
# Request headers never forwarded from the kubelet's request to the app.
_NOT_FORWARDED = frozenset({
    "host", "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade", "content-length",
})


@dataclass(frozen=True)
class HttpGetAction:
    port: int
    path: str = "/"
    scheme: str = "HTTP"  # HTTP or HTTPS
    host: str = ""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TcpSocketAction:
    port: int
    host: str = ""


@dataclass(frozen=True)
class GrpcAction:
    port: int
    service: str = ""


Action = HttpGetAction | TcpSocketAction | GrpcAction


@dataclass(frozen=True)
class AppProbe:
    """One rewritten probe: the status-server path it answers on, what to do, and its time budget."""

    path: str
    action: Action
    timeout: float = DEFAULT_TIMEOUT_SECONDS


# ---- parsing --------------------------------------------------------------------------------------------


def _where(path: str, field_name: str = "") -> str:
    return f"{ENV_NAME}[{json.dumps(path)}]" + (f".{field_name}" if field_name else "")


def _port(value: Any, path: str, field_name: str) -> int:
    """Probe ports must be numbers: named ports cannot be resolved outside the kubelet (upstream refuses them too)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{_where(path, field_name)}: must be an integer port 1-65535 "
                          f"(named ports are not supported), got {json.dumps(value)}")
    if not 1 <= value <= 65535:
        raise ConfigError(f"{_where(path, field_name)}: port {value} is out of range 1-65535")
    return value


def _string(obj: Mapping[str, Any], key: str, path: str, prefix: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{_where(path, f'{prefix}.{key}')}: must be a string, got {json.dumps(value)}")
    return value


def _object(value: Any, path: str, field_name: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{_where(path, field_name)}: must be a JSON object, got {json.dumps(value)}")
    return value


def _http_get(obj: Mapping[str, Any], path: str) -> HttpGetAction:
    scheme = _string(obj, "scheme", path, "httpGet").upper() or "HTTP"
    if scheme not in ("HTTP", "HTTPS"):
        raise ConfigError(f"{_where(path, 'httpGet.scheme')}: must be HTTP or HTTPS, got {json.dumps(obj['scheme'])}")
    raw_headers = obj.get("httpHeaders") or []
    if not isinstance(raw_headers, list):
        raise ConfigError(f"{_where(path, 'httpGet.httpHeaders')}: must be a list of {{name, value}} objects")
    headers: list[tuple[str, str]] = []
    for index, header in enumerate(raw_headers):
        where = f"httpGet.httpHeaders[{index}]"
        header = _object(header, path, where)
        name, value = header.get("name"), header.get("value", "")
        if not isinstance(name, str) or not name or any(c in name for c in " :\r\n\t"):
            raise ConfigError(f"{_where(path, where + '.name')}: must be a header name, got {json.dumps(name)}")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ConfigError(f"{_where(path, where + '.value')}: must be a one-line string, got {json.dumps(value)}")
        headers.append((name, value))
    probe_path = _string(obj, "path", path, "httpGet")
    if any(c in probe_path for c in " \r\n\t"):
        raise ConfigError(f"{_where(path, 'httpGet.path')}: must be a URL path, got {json.dumps(probe_path)}")
    return HttpGetAction(
        port=_port(obj.get("port"), path, "httpGet.port"),
        path=probe_path if probe_path.startswith("/") else "/" + probe_path,
        scheme=scheme,
        host=_string(obj, "host", path, "httpGet"),
        headers=tuple(headers),
    )


def _parse_probe(path: str, raw: Any) -> AppProbe:
    if not APP_PROBER_PATH.match(path):
        raise ConfigError(f"{_where(path)}: invalid path, must match {APP_PROBER_PATH.pattern}")
    obj = _object(raw, path, "")
    kinds = [k for k in ("httpGet", "tcpSocket", "grpc") if obj.get(k) is not None]
    if len(kinds) != 1:
        found = ", ".join(kinds) if kinds else "none"
        raise ConfigError(f"{_where(path)}: must have exactly one of httpGet, tcpSocket or grpc (found {found})")
    kind = kinds[0]
    body = _object(obj[kind], path, kind)
    action: Action
    if kind == "httpGet":
        action = _http_get(body, path)
    elif kind == "tcpSocket":
        action = TcpSocketAction(port=_port(body.get("port"), path, "tcpSocket.port"),
                                 host=_string(body, "host", path, "tcpSocket"))
    else:
        action = GrpcAction(port=_port(body.get("port"), path, "grpc.port"),
                            service=_string(body, "service", path, "grpc"))
    timeout = obj.get("timeoutSeconds", 0)
    if timeout is None:
        timeout = 0
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise ConfigError(f"{_where(path, 'timeoutSeconds')}: must be a non-negative integer, "
                          f"got {json.dumps(timeout)}")
    return AppProbe(path=path, action=action, timeout=float(timeout) if timeout else DEFAULT_TIMEOUT_SECONDS)


def parse_app_probers(text: str) -> dict[str, AppProbe]:
    """`ISTIO_KUBE_APP_PROBERS` → probes by path; ConfigError naming the path and field on bad input."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{ENV_NAME}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{ENV_NAME}: must be a JSON object mapping probe paths to probes")
    return {path: _parse_probe(path, value) for path, value in raw.items()}


@dataclass(frozen=True)
class ProbeOptions:
    """What the app prober needs: the probes, where the app is (the pod IP), and the status port (Host rewrite)."""

    probers: Mapping[str, AppProbe] = field(default_factory=dict)
    pod_ip: str = "127.0.0.1"
    status_port: int = 15020
    max_body_bytes: int = MAX_BODY_BYTES
    bind_probe_source: bool = True  # bind 127.0.0.6 / ::6 like upstream, so capture rules let probes through
    keepalive: bool = False  # ENABLE_PROBE_KEEPALIVE_CONNECTIONS: reuse HTTP connections between probes
    http2: bool = True  # ISTIO_ENABLE_HTTP2_PROBING: HTTPS probes offer h2 (ALPN), as Kubernetes' prober does


# ---- requests -------------------------------------------------------------------------------------------


def target_host(action: HttpGetAction | TcpSocketAction, pod_ip: str) -> str:
    """Where the probe goes: its own `host` when set (kubelet semantics), else the pod IP."""
    return action.host or pod_ip


def probe_url(action: HttpGetAction, pod_ip: str) -> str:
    scheme = "https" if action.scheme == "HTTPS" else "http"
    return f"{scheme}://{join_host_port(target_host(action, pod_ip), action.port)}{action.path}"


def source_address(destination: str, pod_ip: str) -> str | None:
    """The local address to bind for a probe connection: upstream's 127.0.0.6 (or ::6) for the pod itself.

    Only for destinations on this pod (its IP or loopback): a loopback source
    cannot reach another host, so a probe `host` elsewhere keeps the default.
    """
    try:
        addr = ipaddress.ip_address(destination.strip("[]"))
    except ValueError:
        return None
    if destination.strip("[]") != pod_ip and not addr.is_loopback:
        return None
    return PROBE_SOURCE_V6 if addr.version == 6 else PROBE_SOURCE_V4


def rewrite_host(incoming_host: str | None, status_port: int, app_port: int) -> str | None:
    """The kubelet's Host (`podIP:15020`) sent on with the app's port, as upstream does; other Hosts unchanged."""
    if not incoming_host:
        return None
    host, sep, port = incoming_host.rpartition(":")
    if sep and port.isdigit() and int(port) == status_port and (not host.count(":") or host.endswith("]")):
        return f"{host}:{app_port}"
    return incoming_host


def request_headers(
    action: HttpGetAction,
    incoming: Iterable[tuple[str, str]],
    incoming_host: str | None,
    status_port: int,
) -> tuple[list[tuple[str, str]], str | None]:
    """Headers for the app request and the Host to send (None: the URL's).

    The kubelet's headers are passed on (minus hop-by-hop ones; its User-Agent
    too, as upstream relays it), then the probe's own `httpHeaders` replace any
    of the same name; a request with no User-Agent from either gets
    `istio-probe/1.0` (the client's own, as Go's adds its own); a `Host` among
    the probe's headers wins over the rewritten incoming Host.
    """
    own = {name.lower() for name, _ in action.headers}
    headers = [(n, v) for n, v in incoming if n.lower() not in _NOT_FORWARDED and n.lower() not in own]
    host = rewrite_host(incoming_host, status_port, action.port)
    for name, value in action.headers:
        if name.lower() == "host":
            host = value
        else:
            headers.append((name, value))
    if not any(name.lower() == "user-agent" for name, _ in headers):
        headers.append(("User-Agent", PROBE_USER_AGENT))
    return headers, host


# ---- responses and redirects ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """Answer the probe with `status`; `pass_body` when the app's body (capped) goes back too."""

    status: int
    pass_body: bool = True


@dataclass(frozen=True)
class Follow:
    """Request `url` next (a same-host redirect); `host` is the Host header to keep (relative redirects only)."""

    url: str
    host: str | None


@dataclass(frozen=True)
class Fail:
    """The probe failed before an answer (500), with the reason for the log."""

    reason: str


def _hostname(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def next_step(
    status: int,
    location: str | None,
    current_url: str,
    first_url: str,
    requests_made: int,
    host_header: str | None,
) -> Answer | Follow | Fail:
    """What to do with one app response, by the kubelet's rules.

    Redirects (301/302/303/307/308 with a Location) are followed when they stay on
    the probed host; one to another host is answered as success without
    following it; after `MAX_REQUESTS` requests a redirect is a failure (a loop).
    Any other 3xx is answered 200 (a 3xx has no meaningful body to pass back);
    everything else is passed through with its body.
    """
    if status in FOLLOWED_REDIRECTS and location:
        try:
            target = urljoin(current_url, location.strip())
            split = urlsplit(target)
            _ = split.port  # raises ValueError on a bad port
        except ValueError as exc:
            return Fail(f"bad redirect location {location!r}: {exc}")
        if split.scheme not in ("http", "https"):
            return Fail(f"redirect to unsupported scheme {split.scheme!r}")
        if _hostname(target) != _hostname(first_url):
            return Answer(200, pass_body=False)
        if requests_made >= MAX_REQUESTS:
            return Fail(f"stopped after {MAX_REQUESTS} redirects")
        keep_host = host_header if not urlsplit(location.strip()).netloc else None
        return Follow(target, keep_host)
    if 300 <= status < 400:
        return Answer(200, pass_body=False)
    return Answer(status)
