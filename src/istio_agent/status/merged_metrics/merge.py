"""The merged-metrics rules of the status server, without any I/O: targets and negotiation.

`/stats/prometheus` (and `/metrics`) on :15020 answers with the agent's own
registry, then Envoy's page, then the application's pages, as one exposition.
Upstream concatenates bytes; that is only correct when every source speaks the
same format and none of them is broken. This module decides *what* to merge and
in which format; `filter` makes each source safe to merge (validation,
conversion, whole families only, the 10 MiB cap).

- **Targets** come from `ISTIO_PROMETHEUS_ANNOTATIONS`; Istio's own ports are
  refused there (upstream's list), as is the status port itself (a scrape loop).
- **Format negotiation.** The answer is OpenMetrics when the scraper accepts it
  and at least one source answered in it (upstream: the app's format wins), else
  Prometheus text 0.0.4. Sources are only ever asked for those two (never
  protobuf), and a source in the other format is converted. `# EOF` ends an
  OpenMetrics answer exactly once.
- **Budget.** `X-Prometheus-Scrape-Timeout-Seconds` minus a margin.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

from istio_agent.config.errors import ConfigError
from istio_agent.metrics import TEXT_CONTENT_TYPE, CollectorRegistry, generate_latest, generate_openmetrics

MAX_SOURCE_BYTES = 10 * 1024 * 1024  # upstream's per-target cap
ENVOY_PROMETHEUS_PORT = 15090  # upstream's EnvoyPrometheusPort: the bootstrap's 15090 listener
DEFAULT_SCRAPE_TIMEOUT = 10.0  # Prometheus' default scrape_timeout, used when the header is absent
TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"

# Ports of the Istio data plane (upstream's `istioReservedPorts`): scraping one either hits a
# non-application surface or double-counts (15090 is already merged; 15020 is this very endpoint).
RESERVED_PORTS: dict[int, str] = {
    15000: "Envoy admin",
    15001: "outbound traffic capture",
    15004: "pilot debug",
    15006: "inbound traffic capture",
    15008: "HBONE tunnel",
    15020: "pilot-agent status / merged Prometheus",
    15021: "Envoy health",
    15053: "DNS proxy",
    15090: "Envoy Prometheus (already merged)",
}

OPENMETRICS_TYPE = "application/openmetrics-text"
PROTOBUF_TYPE = "application/vnd.google.protobuf"
EOF_LINE = b"# EOF\n"


class Format(enum.Enum):
    TEXT = "text"
    OPENMETRICS = "openmetrics"


@dataclass(frozen=True)
class OutputFormat:
    """What the merged answer is written in."""

    format: Format
    version: str = ""  # OpenMetrics version: "1.0.0" or "0.0.1"

    @property
    def content_type(self) -> str:
        if self.format is Format.OPENMETRICS:
            return f"{OPENMETRICS_TYPE}; version={self.version}; charset=utf-8"
        return TEXT_CONTENT_TYPE


TEXT_OUTPUT = OutputFormat(Format.TEXT)


# --- scrape targets ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeTarget:
    """One application metrics endpoint, scraped on localhost as upstream does."""

    port: int
    path: str = "/metrics"


def _port(value: object, field: str, status_port: int) -> int:
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else None
    if text is None or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ConfigError(f"ISTIO_PROMETHEUS_ANNOTATIONS: {field}: invalid port {value!r}")
    port = int(text)
    if port == status_port:
        raise ConfigError(
            f"ISTIO_PROMETHEUS_ANNOTATIONS: {field}: port {port} is the agent's status port, "
            "which would make the scrape recurse"
        )
    if port in RESERVED_PORTS:
        raise ConfigError(
            f"ISTIO_PROMETHEUS_ANNOTATIONS: {field}: port {port} is reserved for Istio "
            f"({RESERVED_PORTS[port]}) and cannot be scraped"
        )
    return port


def _path(value: object, field: str) -> str:
    if value in (None, ""):
        return "/metrics"
    if not isinstance(value, str) or any(c in value for c in " \t\r\n?#"):
        raise ConfigError(f"ISTIO_PROMETHEUS_ANNOTATIONS: {field}: invalid path {value!r}")
    return value if value.startswith("/") else "/" + value


@dataclass(frozen=True)
class MetricsOptions:
    """What the merged endpoint scrapes. `envoy_port=None` leaves Envoy's stats out.

    The options resolver decides it, as upstream: Envoy's stats are merged unless
    `PILOT_AGENT_MERGE_ENVOY_STATS=false` or there is no Envoy; app targets only for
    sidecars (15020 is exposed on gateways).
    """

    envoy_port: int | None = ENVOY_PROMETHEUS_PORT
    app_targets: tuple[ScrapeTarget, ...] = ()
    host: str = "localhost"  # upstream scrapes Envoy and the app on localhost
    body_cap: int = MAX_SOURCE_BYTES
    default_timeout: float = DEFAULT_SCRAPE_TIMEOUT
    localhost_only: bool = False  # METRICS_LOCALHOST_ACCESS_ONLY: other callers get 403
    created_series: bool = True  # not PROMETHEUS_DISABLE_CREATED_SERIES: counters and histograms say when they began


def parse_scrape_annotations(raw: str, status_port: int = 15020) -> tuple[ScrapeTarget, ...]:
    """`ISTIO_PROMETHEUS_ANNOTATIONS` → the app targets to merge (none when unset or `scrape: "false"`).

    Shape (upstream's `PrometheusScrapeConfiguration`): `{"scrape": "true", "path": "/metrics",
    "port": "80"}` or with `"targets": [{"port": ..., "path": ...}, ...]`. Path defaults to
    `/metrics`, port to 80. A bad value raises ConfigError naming the field.
    """
    if not raw.strip():
        return ()
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"ISTIO_PROMETHEUS_ANNOTATIONS: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError("ISTIO_PROMETHEUS_ANNOTATIONS: must be a JSON object")
    if str(config.get("scrape", "")).lower() == "false":
        return ()
    targets = config.get("targets")
    if targets in (None, []):
        port = _port(config.get("port") or "80", "port", status_port)
        return (ScrapeTarget(port, _path(config.get("path"), "path")),)
    if not isinstance(targets, list):
        raise ConfigError("ISTIO_PROMETHEUS_ANNOTATIONS: targets: must be a list of {port, path}")
    out: list[ScrapeTarget] = []
    for index, target in enumerate(targets):
        if not isinstance(target, dict):
            raise ConfigError(f"ISTIO_PROMETHEUS_ANNOTATIONS: targets[{index}]: must be an object with port and path")
        out.append(ScrapeTarget(
            _port(target.get("port"), f"targets[{index}].port", status_port),
            _path(target.get("path"), f"targets[{index}].path"),
        ))
    return tuple(out)


# --- negotiation ---------------------------------------------------------------------------------------------


def _media_ranges(header: str) -> Iterable[tuple[str, dict[str, str]]]:
    for item in header.split(","):
        parts = [p.strip() for p in item.split(";")]
        if not parts[0]:
            continue
        params: dict[str, str] = {}
        for param in parts[1:]:
            key, _, value = param.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        yield parts[0].lower(), params


def _quality(params: dict[str, str]) -> float:
    try:
        q = float(params.get("q", "1"))
    except ValueError:
        return 0.0
    return q if math.isfinite(q) else 0.0


def accepted_openmetrics(accept: str) -> str:
    """The OpenMetrics version the scraper accepts ("1.0.0" preferred, "0.0.1"), or "" for text only.

    Only an explicit `application/openmetrics-text` counts (as in prometheus_client and
    upstream's apps): `*/*` gets text.
    """
    versions: set[str] = set()
    for media, params in _media_ranges(accept):
        if media == OPENMETRICS_TYPE and _quality(params) > 0:
            versions.add(params.get("version", ""))
    if "1.0.0" in versions or "" in versions:
        return "1.0.0"
    return "0.0.1" if "0.0.1" in versions else ""


def source_accept_header(openmetrics_version: str) -> str:
    """The Accept sent to Envoy and the apps: only formats the merge can use (never protobuf)."""
    if openmetrics_version == "1.0.0":
        return (f"{OPENMETRICS_TYPE};version=1.0.0,{OPENMETRICS_TYPE};version=0.0.1;q=0.75,"
                "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    if openmetrics_version:
        return f"{OPENMETRICS_TYPE};version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    return "text/plain;version=0.0.4,*/*;q=0.1"


def source_format(content_type: str) -> Format | None:
    """A source's format from its Content-Type; None when it cannot be merged (protobuf).

    Anything else counts as text, as upstream does; validation then rejects what is not.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media == OPENMETRICS_TYPE:
        return Format.OPENMETRICS
    if media == PROTOBUF_TYPE:
        return None
    return Format.TEXT


def output_format(openmetrics_version: str, sources: Iterable[Format]) -> OutputFormat:
    """OpenMetrics when the scraper accepts it and any source answered in it; else text."""
    if openmetrics_version and Format.OPENMETRICS in set(sources):
        return OutputFormat(Format.OPENMETRICS, openmetrics_version)
    return TEXT_OUTPUT


def scrape_budget(header: str | None, default: float = DEFAULT_SCRAPE_TIMEOUT) -> float:
    """Seconds the merge may take: the scraper's timeout minus a margin to finish writing.

    The margin is a tenth of the timeout, at most 0.5 s, so that the answer (with whatever
    sources made it) reaches Prometheus before it gives up on the whole scrape.
    """
    timeout = default
    if header:
        try:
            value = float(header)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            timeout = value
    return max(timeout - min(0.5, timeout * 0.1), 0.01)


def accepts_gzip(accept_encoding: str) -> bool:
    return any(media in ("gzip", "x-gzip") and _quality(params) > 0 for media, params in _media_ranges(accept_encoding))


# --- the agent's own registry --------------------------------------------------------------------------------


def agent_exposition(registry: CollectorRegistry, output: OutputFormat) -> bytes:
    """The agent's registry in the output format, without a `# EOF` (the caller writes that last)."""
    if output.format is Format.OPENMETRICS:
        return generate_openmetrics(registry, eof=False)
    return generate_latest(registry)
