"""The stats part of the bootstrap: tag extraction, the inclusion matcher, histograms, intervals, compression.

Istio keeps Envoy's stats small: only names matching the inclusion list are
created. The list is always `reporter=` first, then the user's prefixes
(annotation, else ProxyConfig `proxyStatsMatcher`), then the ones readiness and
draining need, and `component`/`istio` last. The pod's annotations also set
extra tags, histogram buckets and the flush and eviction intervals; ProxyConfig
`statsCompression` (default on) puts the three compressors on the :15090
listener. Every function here is pure: it takes the pod's annotations, the
ProxyConfig (protojson shape) and the pod IPs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from istio_agent.config.durations import parse_duration
from istio_agent.config.protojson import format_duration_json

log = logging.getLogger(__name__)

EXTRA_STAT_TAGS_ANNOTATION = "sidecar.istio.io/extraStatTags"
INCLUSION_PREFIXES_ANNOTATION = "sidecar.istio.io/statsInclusionPrefixes"
INCLUSION_SUFFIXES_ANNOTATION = "sidecar.istio.io/statsInclusionSuffixes"
INCLUSION_REGEXPS_ANNOTATION = "sidecar.istio.io/statsInclusionRegexps"
HISTOGRAM_BUCKETS_ANNOTATION = "sidecar.istio.io/statsHistogramBuckets"
FLUSH_INTERVAL_ANNOTATION = "sidecar.istio.io/statsFlushInterval"
EVICTION_INTERVAL_ANNOTATION = "sidecar.istio.io/statsEvictionInterval"

# Needed by the agent's readiness check (cluster/listener manager, server state, xDS).
REQUIRED_PREFIXES = ("cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm")
RBAC_SUFFIXES = ("rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied")
# With EXIT_ON_ZERO_ACTIVE_CONNECTIONS the agent polls this stat while draining.
DRAIN_SUFFIX = "downstream_cx_active"
# Metrics named by a VirtualService route's stat_prefix.
REQUIRED_REGEXPS = (r"vhost\..*\.route\..*",)
DEFAULT_FLUSH_INTERVAL = 5.0  # Envoy's, against which an eviction interval is checked when none is annotated
COMPRESSORS = ("brotli", "zstd", "gzip")
COMPRESSION_TYPE_PREFIX = "type.googleapis.com/envoy.extensions.compression"
COMPRESSED_CONTENT_TYPES = (
    "text/plain", "application/vnd.google.protobuf", "application/openmetrics-text", "application/openmetrics-protobuf",
)

# Tag extraction rules, in Envoy's order of application. Extra tags go between the
# fixed leading rules and the trailing ones.
_LEADING_TAGS: tuple[tuple[str, str], ...] = (
    ("cluster_name", r"^cluster(\.(.+);)"),
    ("http_conn_manager_prefix", r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)"),
    ("thread_name", r"^server(\.(.+))\.watchdog"),
    ("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
    ("response_code", r"_rq(_(\d{3}))$"),
    ("response_code_class", r"_rq(_(\dxx))$"),
    ("http_conn_manager_listener_prefix",
     r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)"),
    ("listener_address", r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)"),
    ("mongo_prefix", r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$"),
)
_TRAILING_TAGS: tuple[tuple[str, str], ...] = (
    ("cache", r"(cache\.(.+?)\.)"),
    ("component", r"(component\.(.+?)\.)"),
    ("tag", r"(tag\.(.+?);\.)"),
    ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
    ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
    ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
    ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
)


@dataclass(frozen=True)
class StatsOptions:
    """What the pod asked for in its annotations and ProxyConfig, resolved to lists."""

    prefixes: tuple[str, ...]
    suffixes: tuple[str, ...]
    regexps: tuple[str, ...]
    extra_tags: tuple[str, ...]
    histogram_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()
    flush_interval: float | None = None  # seconds, when annotated
    eviction_interval: int | None = None  # whole seconds, when annotated and a multiple of the flush interval


def _substitute_pod_ip(patterns: Sequence[str], ips: Sequence[str]) -> list[str]:
    """`http.{pod_ip}_` becomes one pattern per pod IP (inbound listener stats are named by IP)."""
    out: list[str] = []
    for pattern in patterns:
        if "{pod_ip}" in pattern:
            out.extend(pattern.replace("{pod_ip}", ip) for ip in ips)
        else:
            out.append(pattern)
    return out


def _inclusion(
    annotation: str, required: Sequence[str], from_config: Sequence[str] | None, ips: Sequence[str]
) -> list[str]:
    """Annotation wins over ProxyConfig (never merged, as upstream); the required ones follow."""
    chosen = annotation.split(",") if annotation else list(from_config or [])
    return _substitute_pod_ip([*chosen, *required], ips)


def _dedupe(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _histogram_buckets(text: str) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """`{"prefix": [bounds...]}`, sorted by prefix; anything else ignores the whole annotation, as upstream."""
    try:
        parsed = json.loads(text)
        if parsed is None:
            return ()
        if not isinstance(parsed, dict):
            raise ValueError("expected an object of prefix -> bucket list")
        buckets: dict[str, tuple[float, ...]] = {}
        for prefix, values in parsed.items():
            if values is not None and not isinstance(values, list):
                raise ValueError(f"buckets of {prefix!r} are not a list")
            buckets[str(prefix)] = tuple(_number(v) for v in values or ())
    except (ValueError, TypeError) as exc:
        log.warning("annotation %s=%r ignored: %s", HISTOGRAM_BUCKETS_ANNOTATION, text, exc)
        return ()
    return tuple(sorted(buckets.items()))


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"bucket {value!r} is not a number")
    return value


def _interval(annotation: str, text: str) -> float | None:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        log.warning("annotation %s=%r ignored: %s", annotation, text, exc)
        return None
    return seconds


def stats_options(
    annotations: Mapping[str, str],
    proxy_config: Mapping[str, Any],
    ips: Sequence[str],
    exit_on_zero_active_connections: bool = False,
) -> StatsOptions:
    """Resolve the inclusion lists, extra tags, buckets, compression and intervals for one pod."""
    matcher = proxy_config.get("proxyStatsMatcher") or {}
    suffixes = (*RBAC_SUFFIXES, DRAIN_SUFFIX) if exit_on_zero_active_connections else RBAC_SUFFIXES
    annotated_tags = annotations.get(EXTRA_STAT_TAGS_ANNOTATION, "").split(",")
    tags = _dedupe([*(proxy_config.get("extraStatTags") or []), *annotated_tags])
    buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()
    if HISTOGRAM_BUCKETS_ANNOTATION in annotations:
        buckets = _histogram_buckets(annotations[HISTOGRAM_BUCKETS_ANNOTATION])
    flush = None
    if FLUSH_INTERVAL_ANNOTATION in annotations:
        flush = _interval(FLUSH_INTERVAL_ANNOTATION, annotations[FLUSH_INTERVAL_ANNOTATION])
    eviction = None
    if EVICTION_INTERVAL_ANNOTATION in annotations:
        seconds = _interval(EVICTION_INTERVAL_ANNOTATION, annotations[EVICTION_INTERVAL_ANNOTATION])
        # Envoy requires eviction to be a whole number of flush intervals (compared in nanoseconds).
        base = round((flush if flush is not None else DEFAULT_FLUSH_INTERVAL) * 1e9)
        if seconds is not None and (base == 0 or round(seconds * 1e9) % base != 0):
            log.warning("annotation %s must be a multiple of the stats flush interval; ignored",
                        EVICTION_INTERVAL_ANNOTATION)
        elif seconds is not None:
            eviction = int(seconds)  # upstream keeps whole seconds only
    return StatsOptions(
        prefixes=tuple(_inclusion(annotations.get(INCLUSION_PREFIXES_ANNOTATION, ""), REQUIRED_PREFIXES,
                                  matcher.get("inclusionPrefixes"), ips)),
        suffixes=tuple(_inclusion(annotations.get(INCLUSION_SUFFIXES_ANNOTATION, ""), suffixes,
                                  matcher.get("inclusionSuffixes"), ips)),
        regexps=tuple(_inclusion(annotations.get(INCLUSION_REGEXPS_ANNOTATION, ""), REQUIRED_REGEXPS,
                                 matcher.get("inclusionRegexps"), ips)),
        extra_tags=tuple(tags),
        histogram_buckets=buckets,
        flush_interval=flush,
        eviction_interval=eviction,
    )


def stats_tags(extra_tags: Sequence[str]) -> list[dict[str, str]]:
    """Envoy tag extraction rules, with one `tag=.=value;.;` rule per extra tag."""
    leading = [{"tag_name": name, "regex": regex} for name, regex in _LEADING_TAGS]
    extra = [{"regex": f"({tag}=\\.=(.*?);\\.;)", "tag_name": tag} for tag in extra_tags]
    trailing = [{"tag_name": name, "regex": regex} for name, regex in _TRAILING_TAGS]
    return [*leading, *extra, *trailing]


def stats_matcher(options: StatsOptions, metadata_discovery: bool = False) -> dict[str, Any]:
    """The inclusion list, in upstream's order: reporter=, (workload_discovery), prefixes, suffixes, regexps, tail."""
    patterns: list[dict[str, Any]] = [{"prefix": "reporter="}]
    if metadata_discovery:
        patterns.append({"prefix": "workload_discovery"})
    patterns += [{"prefix": p} for p in options.prefixes]
    patterns += [{"suffix": s} for s in options.suffixes]
    patterns += [{"safe_regex": {"regex": r}} for r in options.regexps]
    patterns += [{"prefix": "component"}, {"prefix": "istio"}]
    return {"inclusion_list": {"patterns": patterns}}


def stats_config(options: StatsOptions, metadata_discovery: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {"use_all_default_tags": False, "stats_tags": stats_tags(options.extra_tags)}
    if options.histogram_buckets:
        config["histogram_bucket_settings"] = [
            {"match": {"prefix": prefix}, "buckets": list(values)} for prefix, values in options.histogram_buckets
        ]
    config["stats_matcher"] = stats_matcher(options, metadata_discovery)
    return config


def interval_fields(options: StatsOptions) -> dict[str, str]:
    """Top-level `stats_flush_interval` / `stats_eviction_interval`, only when annotated."""
    out: dict[str, str] = {}
    if options.flush_interval is not None:
        out["stats_flush_interval"] = format_duration_json(options.flush_interval)
    if options.eviction_interval is not None:
        out["stats_eviction_interval"] = f"{options.eviction_interval}s"
    return out


def stats_compression(proxy_config: Mapping[str, Any]) -> bool:
    """ProxyConfig `statsCompression` (a BoolValue): on unless set to false."""
    value = proxy_config.get("statsCompression")
    return True if value is None else bool(value)


def compression_filters(enabled: bool) -> list[dict[str, Any]]:
    """The brotli, zstd and gzip compressors on the :15090 stats listener, Envoy picking by Accept-Encoding."""
    if not enabled:
        return []
    return [
        {
            "name": f"envoy.filters.http.compressor.{lib}",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
                "compressor_library": {
                    "name": f"stats_{lib}",
                    "typed_config": {
                        "@type": f"{COMPRESSION_TYPE_PREFIX}.{lib}.compressor.v3.{lib.capitalize()}",
                    },
                },
                "response_direction_config": {"common_config": {"content_type": list(COMPRESSED_CONTENT_TYPES)}},
            },
        }
        for lib in COMPRESSORS
    ]
