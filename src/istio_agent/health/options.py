"""What the workload health checker runs, resolved once at agent start from ProxyConfig's `readinessProbe`.

Light on purpose (the options resolver imports it before anything runs): the
probe actions are the app prober's own (`status.probes`), plus `ExecAction`,
which only this checker has (the kubelet runs exec probes itself, so the status
server never sees one). `parse_readiness_probe` reads the protojson-shaped
`istio.networking.v1alpha3.ReadinessProbe` and fills in upstream's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from istio_agent.config.errors import ConfigError
from istio_agent.status.probes.rules import GrpcAction, HttpGetAction, TcpSocketAction

FIELD = "readinessProbe"  # named in errors: the ProxyConfig field
# Upstream's defaults for a zero (unset) value: thresholds 1, timeout 1 s, period 10 s; the delay stays 0.
DEFAULT_THRESHOLD = 1
DEFAULT_TIMEOUT_SECONDS = 1
DEFAULT_PERIOD_SECONDS = 10
METHODS = ("httpGet", "tcpSocket", "exec", "grpc")


@dataclass(frozen=True)
class ExecAction:
    """Run `command` (argv, no shell) as the agent's user; exit status 0 is healthy."""

    command: tuple[str, ...]


HealthAction = HttpGetAction | TcpSocketAction | ExecAction | GrpcAction


@dataclass(frozen=True)
class HealthCheckOptions:
    """One workload health check: what to probe, how often, and how results become state changes.

    `default_host` is where a probe without its own `host` goes (the proxy's first
    IP, or `localhost`, as upstream); `ipv6` says the proxy's addresses are all IPv6
    (HTTP probes then bind `::6` instead of `127.0.0.6`).
    """

    action: HealthAction
    initial_delay: float = 0.0
    timeout: float = float(DEFAULT_TIMEOUT_SECONDS)
    period: float = float(DEFAULT_PERIOD_SECONDS)
    success_threshold: int = DEFAULT_THRESHOLD
    failure_threshold: int = DEFAULT_THRESHOLD
    default_host: str = "localhost"
    ipv6: bool = False


def _where(name: str) -> str:
    return f"ProxyConfig field {FIELD}.{name}"


def _count(probe: Mapping[str, Any], name: str, default: int) -> int:
    value = probe.get(name, 0) or 0
    if value < 0:
        raise ConfigError(f"{_where(name)}: must not be negative, got {value}")
    return int(value) or default


def _port(body: Mapping[str, Any], method: str) -> int:
    port = body.get("port", 0) or 0
    if not 1 <= port <= 65535:
        raise ConfigError(f"{_where(method + '.port')}: must be a port 1-65535, got {port}")
    return int(port)


def _http_get(body: Mapping[str, Any]) -> HttpGetAction:
    scheme = str(body.get("scheme") or "http").lower()
    if scheme not in ("http", "https"):
        raise ConfigError(f"{_where('httpGet.scheme')}: must be HTTP or HTTPS, got {body.get('scheme')!r}")
    headers: list[tuple[str, str]] = []
    for index, header in enumerate(body.get("httpHeaders") or []):
        name, value = str(header.get("name") or ""), str(header.get("value") or "")
        if not name or any(c in name for c in " :\r\n\t"):
            raise ConfigError(f"{_where(f'httpGet.httpHeaders[{index}].name')}: must be a header name, got {name!r}")
        if "\r" in value or "\n" in value:
            raise ConfigError(f"{_where(f'httpGet.httpHeaders[{index}].value')}: must be one line, got {value!r}")
        headers.append((name, value))
    path = str(body.get("path") or "/")
    if any(c in path for c in " \r\n\t"):
        raise ConfigError(f"{_where('httpGet.path')}: must be a URL path, got {path!r}")
    return HttpGetAction(port=_port(body, "httpGet"), path=path if path.startswith("/") else "/" + path,
                         scheme=scheme.upper(), host=str(body.get("host") or ""), headers=tuple(headers))


def _action(probe: Mapping[str, Any]) -> HealthAction:
    present = [name for name in METHODS if probe.get(name) is not None]
    if not present:
        # Upstream starts with no prober at all and fails on the first probe; a clear refusal at start instead.
        raise ConfigError(f"ProxyConfig field {FIELD}: must set one of {', '.join(METHODS)}")
    method, body = present[0], probe[present[0]]  # protojson already refused two members of the oneof
    if method == "httpGet":
        return _http_get(body)
    if method == "tcpSocket":
        return TcpSocketAction(port=_port(body, "tcpSocket"), host=str(body.get("host") or ""))
    if method == "grpc":
        return GrpcAction(port=_port(body, "grpc"), service=str(body.get("service") or ""))
    command = tuple(str(arg) for arg in body.get("command") or ())
    if not command or not command[0]:
        raise ConfigError(f"{_where('exec.command')}: must name a command to run, got {list(command)}")
    return ExecAction(command)


def parse_readiness_probe(probe: Mapping[str, Any] | None, proxy_ips: tuple[str, ...] = (),
                          legacy_localhost: bool = False) -> HealthCheckOptions | None:
    """The health check ProxyConfig's `readinessProbe` asks for (protojson shape), or None when it is unset.

    Zero values take upstream's defaults; the default host is the proxy's first IP
    (`localhost` with REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION or without IPs).
    ConfigError names the field and the value.
    """
    if probe is None:
        return None
    if not isinstance(probe, Mapping):
        raise ConfigError(f"ProxyConfig field {FIELD}: must be an object, got {probe!r}")
    return HealthCheckOptions(
        action=_action(probe),
        initial_delay=float(_count(probe, "initialDelaySeconds", 0)),
        timeout=float(_count(probe, "timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)),
        period=float(_count(probe, "periodSeconds", DEFAULT_PERIOD_SECONDS)),
        success_threshold=_count(probe, "successThreshold", DEFAULT_THRESHOLD),
        failure_threshold=_count(probe, "failureThreshold", DEFAULT_THRESHOLD),
        default_host="localhost" if legacy_localhost or not proxy_ips else proxy_ips[0],
        ipv6=bool(proxy_ips) and all(":" in ip for ip in proxy_ips),
    )
