"""What a VirtualService's HTTP routes do with a request, as Envoy's route table from istiod does (pure).

`up --check` uses this to derive its expectations: for each route of a
VirtualService, a request that takes it (`request_for`), checked against
the routes before it (`first_route`: a request an earlier route takes
never reaches this one), and what the route does (`HttpRoute`: its
destinations with their weights, its fault, its timeout).

Evaluated in a match: `uri`, `method`, `headers` and `queryParams` as
`exact` or `prefix`, `withoutHeaders`, `port`, `sourceLabels`,
`sourceNamespace`, `ignoreUriCase`, `name`; a `regex`, `authority`,
`scheme` or `gateways` in a match makes the route not derivable (None).
Fault `abort.httpStatus` and `delay.fixedDelay` with their percentages,
and `timeout`, are read; the route's other fields (retries, rewrite,
redirect, mirror, headers, CORS, ...) are named by `HttpRoute.unchecked`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from istiod_local.mesh.istiopolicy import exported_to, fqdn
from istiod_local.mesh.model import IstioResource, Mesh

MESH_GATEWAY = "mesh"
_ROUTE_FIELDS = {"name", "match", "route", "fault", "timeout"}
_MATCH_FIELDS = {"uri", "method", "headers", "queryParams", "withoutHeaders", "port", "sourceLabels",
                 "sourceNamespace", "ignoreUriCase", "name"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")


def seconds(text: Any) -> float | None:
    """A protobuf duration as Istio writes it (`0.5s`, `100ms`, `2m`); None when it is not one."""
    found = _DURATION.match(str(text).strip())
    if found is None:
        return None
    return float(found.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[found.group(2)]


def _percent(fault: Mapping[str, Any]) -> float:
    percentage = fault.get("percentage")
    if isinstance(percentage, Mapping):
        return float(percentage.get("value", 0) or 0)
    if "percent" in fault:  # the deprecated integer form
        return float(fault["percent"] or 0)
    return 100.0


@dataclass(frozen=True)
class Destination:
    host: str  # FQDN
    subset: str = ""
    port: int = 0
    weight: int = 100


@dataclass(frozen=True)
class HttpRoute:
    """One `http` route of a VirtualService, as far as the check reads it."""

    resource: IstioResource
    index: int
    matches: tuple[Mapping[str, Any], ...]
    destinations: tuple[Destination, ...]
    abort_status: int = 0
    abort_percent: float = 0.0
    delay_s: float = 0.0
    delay_percent: float = 0.0
    timeout_s: float = 0.0
    unchecked: tuple[str, ...] = ()  # fields the check does not evaluate

    @property
    def label(self) -> str:
        return f"{self.resource.key} http[{self.index}]"


def http_routes(resource: IstioResource) -> list[HttpRoute]:
    out = []
    for index, raw in enumerate(resource.spec.get("http") or []):
        if not isinstance(raw, Mapping):
            continue
        destinations = []
        given = [d for d in raw.get("route") or [] if isinstance(d, Mapping)]
        for entry in given:
            dest = entry.get("destination") or {}
            port = (dest.get("port") or {}).get("number", 0) if isinstance(dest.get("port"), Mapping) else 0
            weight = int(entry.get("weight", 100 if len(given) == 1 else 0) or 0)
            destinations.append(Destination(fqdn(str(dest.get("host", "")), resource.namespace),
                                            str(dest.get("subset", "") or ""), int(port or 0), weight))
        fault = raw.get("fault") or {}
        abort = fault.get("abort") or {} if isinstance(fault, Mapping) else {}
        delay = fault.get("delay") or {} if isinstance(fault, Mapping) else {}
        unchecked = [k for k in raw if k not in _ROUTE_FIELDS]
        if abort and "httpStatus" not in abort:
            unchecked.append("fault.abort (not an HTTP status)")
        delay_s = seconds(delay.get("fixedDelay")) if delay else 0.0
        if delay and delay_s is None:
            unchecked.append("fault.delay (not a fixedDelay)")
        timeout = seconds(raw.get("timeout")) if raw.get("timeout") else 0.0
        out.append(HttpRoute(resource, index, tuple(m for m in raw.get("match") or [] if isinstance(m, Mapping)),
                             tuple(destinations), int(abort.get("httpStatus", 0) or 0),
                             _percent(abort) if abort else 0.0, delay_s or 0.0, _percent(delay) if delay else 0.0,
                             timeout or 0.0, tuple(unchecked)))
    return out


def gateways_of(resource: IstioResource) -> list[str]:
    """The gateways a VirtualService binds to (`mesh` when none are named), as `namespace/name` or `mesh`."""
    names = resource.spec.get("gateways") or [MESH_GATEWAY]
    out = []
    for name in names:
        name = str(name)
        out.append(name if name == MESH_GATEWAY or "/" in name else f"{resource.namespace}/{name}")
    return out


def hosts_of(resource: IstioResource) -> list[str]:
    return [fqdn(str(h), resource.namespace) for h in resource.spec.get("hosts") or []]


def mesh_virtual_service(mesh: Mesh, host: str, client_namespace: str) -> tuple[IstioResource | None, str]:
    """The VirtualService sidecars in `client_namespace` use for an FQDN: (it or None, "") or (None, why the
    check cannot tell: a wildcard host, two of them)."""
    found = []
    for vs in mesh.resources("VirtualService"):
        if MESH_GATEWAY not in gateways_of(vs) or not exported_to(vs, client_namespace):
            continue
        hosts = hosts_of(vs)
        if any("*" in h for h in hosts):
            return None, f"{vs.key} has a wildcard host"
        if host in hosts:
            found.append(vs)
    if len(found) > 1:
        return None, f"{' and '.join(v.key for v in found)} both route {host}"
    return (found[0] if found else None), ""


@dataclass(frozen=True)
class RequestShape:
    """A request the check can send: method, path (with a query), headers, and who may send it."""

    method: str = "GET"
    path: str = "/"
    headers: Mapping[str, str] = field(default_factory=dict)
    port: int = 0  # the service port it must go to (0: any)
    source_labels: Mapping[str, str] = field(default_factory=dict)
    source_namespace: str = ""

    def show(self) -> str:
        extra = " ".join(f"{k}: {v}" for k, v in sorted(self.headers.items()))
        return f"{self.method} {self.path}" + (f" {extra}" if extra else "")


def _string_value(match: Any) -> str | None:
    """A value a StringMatch accepts (exact: itself; prefix: it and more); None for a regex."""
    if not isinstance(match, Mapping):
        return None
    if "exact" in match:
        return str(match["exact"])
    if "prefix" in match:
        return str(match["prefix"]) + "x"
    return None


def request_for(match: Mapping[str, Any] | None) -> RequestShape | None:
    """A request this match block takes (None: none the check can make)."""
    if match is None:
        return RequestShape()
    if set(match) - _MATCH_FIELDS:
        return None
    method, path, headers = "GET", "/", {}
    if "uri" in match:
        uri = match["uri"]
        if isinstance(uri, Mapping) and "prefix" in uri:
            path = str(uri["prefix"]) or "/"
        else:
            value = _string_value(uri)
            if value is None:
                return None
            path = value
        if not path.startswith("/"):
            return None
    if "method" in match:
        method_match = match["method"]
        if not isinstance(method_match, Mapping) or "exact" not in method_match:
            return None
        method = str(method_match["exact"]).upper()
    for name, value_match in (match.get("headers") or {}).items():
        value = _string_value(value_match)
        if value is None or str(name).startswith(":"):
            return None
        headers[str(name).lower()] = value
    if any(str(name).lower() in headers for name in match.get("withoutHeaders") or {}):
        return None
    query = []
    for name, value_match in (match.get("queryParams") or {}).items():
        value = _string_value(value_match)
        if value is None:
            return None
        query.append(f"{name}={value}")
    if query:
        path += ("&" if "?" in path else "?") + "&".join(query)
    return RequestShape(method, path, headers, int(match.get("port", 0) or 0),
                        dict(match.get("sourceLabels") or {}), str(match.get("sourceNamespace", "") or ""))


def _string_matches(match: Any, value: str | None, fold: bool = False) -> bool | None:
    if not isinstance(match, Mapping):
        return None
    if value is None:
        return False
    if fold:
        value = value.lower()
    if "exact" in match:
        return value == (str(match["exact"]).lower() if fold else str(match["exact"]))
    if "prefix" in match:
        return value.startswith(str(match["prefix"]).lower() if fold else str(match["prefix"]))
    return None


def matches(match: Mapping[str, Any], request: RequestShape, port: int, client_namespace: str,
            client_labels: Mapping[str, str]) -> bool | None:
    """Whether one match block takes the request sent to `port` by that client (None: not derivable)."""
    if set(match) - _MATCH_FIELDS:
        return None
    path, _, query = request.path.partition("?")
    params = dict(p.partition("=")[::2] for p in query.split("&") if p)
    checks: list[bool | None] = []
    if "uri" in match:
        checks.append(_string_matches(match["uri"], path, bool(match.get("ignoreUriCase"))))
    if "method" in match:
        checks.append(_string_matches(match["method"], request.method))
    for name, value_match in (match.get("headers") or {}).items():
        checks.append(_string_matches(value_match, request.headers.get(str(name).lower())))
    for name in match.get("withoutHeaders") or {}:
        checks.append(str(name).lower() not in request.headers)
    for name, value_match in (match.get("queryParams") or {}).items():
        checks.append(_string_matches(value_match, params.get(str(name))))
    if match.get("port"):
        checks.append(int(match["port"]) == port)
    if match.get("sourceNamespace"):
        checks.append(match["sourceNamespace"] == client_namespace)
    for key, value in (match.get("sourceLabels") or {}).items():
        checks.append(client_labels.get(key) == value)
    if any(c is None for c in checks):
        return None
    return all(checks)


def first_route(routes: list[HttpRoute], request: RequestShape, port: int, client_namespace: str,
                client_labels: Mapping[str, str]) -> HttpRoute | bool | None:
    """The route that takes the request: a route, False when none does (istiod's default route then),
    None when an earlier match is not derivable."""
    for route in routes:
        if not route.matches:
            return route
        results = [matches(m, request, port, client_namespace, client_labels) for m in route.matches]
        if any(r is True for r in results):
            return route
        if any(r is None for r in results):
            return None
    return False
