"""The merged-metrics rules of the status server, without any I/O.

`/stats/prometheus` (and `/metrics`) on :15020 answers with the agent's own
registry, then Envoy's page, then the application's pages, as one exposition.
Upstream concatenates bytes; that is only correct when every source speaks the
same format and none of them is broken, so this module also makes the merge
*safe*:

- **Format negotiation.** The answer is OpenMetrics when the scraper accepts
  it and at least one source answered in it (upstream: the app's format wins),
  else Prometheus text 0.0.4. A source in the other format is converted line by
  line (text counter `x_total` becomes OpenMetrics family `x`, an untyped family
  loses its TYPE line, OpenMetrics exemplars and `# UNIT` are dropped going to
  text, ...). `# EOF` is stripped from every source; the caller writes it once,
  last.
- **Validation.** Each source is checked line by line (a regular expression
  over whole blocks, so a 4 MB Envoy page costs a few milliseconds): an HTML
  error page, JSON, or binary junk stops that source at the first bad line and
  nothing of the bad block is emitted, because Prometheus rejects the *whole*
  scrape on one bad line, and one broken source must not take the others down.
- **Family boundaries.** A source is emitted in blocks that end where a metric
  family starts, so a source cut short (size cap, deadline, garbage) never
  leaves half a family in the body. At most one family (or 1 MiB) is held.
- **Caps.** Each source is limited to 10 MiB, as upstream.

Scrape targets come from `ISTIO_PROMETHEUS_ANNOTATIONS`; Istio's own ports are
refused there (upstream's list), as is the status port itself (a scrape loop).
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_exposition
from prometheus_client.openmetrics import exposition as om_exposition

from istio_agent.config.errors import ConfigError

MAX_SOURCE_BYTES = 10 * 1024 * 1024  # upstream's per-target cap
DEFAULT_SCRAPE_TIMEOUT = 10.0  # Prometheus' default scrape_timeout, used when the header is absent
TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
VALIDATION_WINDOW = 64 * 1024
HOLD_LIMIT = 1024 * 1024  # beyond this much held data, emit at a line boundary instead of a family boundary

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

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
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
        body = om_exposition.generate_latest(registry)
        return body[: -len(EOF_LINE)] if body.endswith(EOF_LINE) else body
    return text_exposition.generate_latest(registry)


# --- per-source validation and conversion ----------------------------------------------------------------------


class SourceError(Exception):
    """This source cannot be merged (any further); the reason goes to the log, never to the body."""


class SourceTooLarge(SourceError):
    pass


class MalformedSource(SourceError):
    pass


_NAME = rb"[a-zA-Z_:][a-zA-Z0-9_:]*"
# Labels are checked loosely (braces on one line): a full label grammar costs 2-3x more on
# Envoy's pages (and `.*` is sre's fastest loop), while what breaks scrapes in practice (HTML
# error pages, JSON, plain error text, binary) fails on the name, the value or UTF-8.
_LABELS = rb"(?:\{.*\})?"
_VALUE = rb"[-+]?(?:[0-9.][0-9.eE+-]*|[Ii]nf(?:inity)?|NaN|nan)"
_TEXT_LINE = rb"(?:" + _NAME + _LABELS + rb"[ \t]+" + _VALUE + rb"(?:[ \t]+-?[0-9]+)?[ \t]*|#.*|[ \t]*)\n"
_OM_LINE = rb"(?:" + _NAME + _LABELS + rb" " + _VALUE + rb"(?: -?[0-9]+(?:\.[0-9]+)?)?(?: # \{.*)?|#.*)\n"
_VALID = {
    Format.TEXT: re.compile(rb"(?:" + _TEXT_LINE + rb")*"),
    Format.OPENMETRICS: re.compile(rb"(?:" + _OM_LINE + rb")*"),
}
_LINE = {Format.TEXT: re.compile(_TEXT_LINE), Format.OPENMETRICS: re.compile(_OM_LINE)}
_BLANK_LINE = re.compile(rb"\n[ \t]*\n")
_OM_SAMPLE = re.compile(
    rb"(" + _NAME + rb"(?:\{(?:[^\"\n}]|\"(?:[^\"\\\n]|\\.)*\")*\})?) (" + _VALUE + rb")(?: (-?[0-9]+(?:\.[0-9]+)?))?"
    rb"(?: # \{[^\n]*)?\n?"
)


def _valid(pattern: re.Pattern[bytes], block: bytes) -> bool:
    """`pattern.fullmatch` over line-aligned windows: sre slows down 2.5x on multi-megabyte subjects."""
    size, pos = len(block), 0
    while pos < size:
        end = block.find(b"\n", min(pos + VALIDATION_WINDOW, size) - 1) + 1 or size
        if pattern.fullmatch(block, pos, end) is None:
            return False
        pos = end
    return True


def _first_bad_line(block: bytes, fmt: Format) -> str:
    line_re = _LINE[fmt]
    for number, line in enumerate(block.splitlines(keepends=True), 1):
        if not line_re.fullmatch(line if line.endswith(b"\n") else line + b"\n"):
            return f"line {number}: {line[:80]!r}"
    return "invalid block"


def _comment_lines(block: bytes) -> list[tuple[int, int]]:
    """(start, end) of every line starting with '#' (end includes the newline), found with `find`."""
    spans: list[tuple[int, int]] = []
    if block.startswith(b"#"):
        pos = 0
    else:
        found = block.find(b"\n#")
        pos = found + 1 if found >= 0 else -1
    while pos >= 0:
        end = block.find(b"\n", pos) + 1 or len(block)
        spans.append((pos, end))
        found = block.find(b"\n#", end - 1)
        pos = found + 1 if found >= 0 else -1
    return spans


def _meta(line: bytes) -> tuple[bytes, bytes, bytes]:
    """`# HELP name rest` → (b"HELP", name, rest); anything else → (b"", b"", b"")."""
    parts = line.rstrip(b"\n").split(b" ", 3)
    if len(parts) >= 3 and parts[0] == b"#" and parts[1] in (b"HELP", b"TYPE", b"UNIT"):
        return parts[1], parts[2], parts[3] if len(parts) > 3 else b""
    return b"", b"", b""


def _types(block: bytes, spans: list[tuple[int, int]]) -> dict[bytes, bytes]:
    types: dict[bytes, bytes] = {}
    for start, end in spans:
        kind, name, rest = _meta(block[start:end])
        if kind == b"TYPE":
            types[name] = rest.strip()
    return types


def _rewrite_comments(block: bytes, spans: list[tuple[int, int]], rewrite: dict[int, bytes]) -> bytes:
    if not rewrite:
        return block
    out: list[bytes] = []
    last = 0
    for start, end in spans:
        if start in rewrite:
            out.append(block[last:start])
            out.append(rewrite[start])
            last = end
    out.append(block[last:])
    return b"".join(out)


def _created_of(name: bytes, types: dict[bytes, bytes]) -> bool:
    """Whether gauge `name` is the `_created` series prometheus_client's text format splits off a family."""
    if not name.endswith(b"_created"):
        return False
    base = name[:-8]
    return types.get(base + b"_total") == b"counter" or types.get(base) in (b"histogram", b"summary")


def _om_family(name: bytes, text_type: bytes, seen: dict[bytes, bytes]) -> bytes | None:
    """The OpenMetrics TYPE line for text family `name` (b"" to drop it), or None to keep it as is.

    `seen` holds the TYPEs declared before this one (in order), and this one is added.
    """
    try:
        if text_type == b"gauge" and _created_of(name, seen):
            return b""  # its samples join family x, where OpenMetrics wants them
        if text_type == b"counter" and name.endswith(b"_total") and name[:-6] not in seen:
            return b"# TYPE " + name[:-6] + b" counter\n"
        if text_type in (b"counter", b"untyped"):
            return b""  # no TYPE: OpenMetrics' "unknown"; text parsers (promtool's) agree
        return None
    finally:
        seen[name] = text_type


def text_to_openmetrics(block: bytes, types_seen: dict[bytes, bytes] | None = None) -> bytes:
    """Complete, valid text-format lines → OpenMetrics lines (samples are left as they are).

    A counter `x_total` becomes family `x` (its samples already carry the `_total`), unless a
    family `x` came before it (Envoy has both `upstream_rq` and `upstream_rq_total`). Such a
    counter, a counter without the suffix and an `untyped` family lose their TYPE line:
    OpenMetrics reads that as "unknown" and the sample names stay what dashboards expect,
    where writing `unknown` would break text parsers such as promtool's and `counter` would
    break strict OpenMetrics parsers. A gauge `x_created` after counter `x_total` (or
    histogram/summary `x`) loses HELP and TYPE too, so that its samples join family `x`.
    Blank lines and free comments are dropped (OpenMetrics has neither); `"` in HELP is
    escaped. `types_seen` carries the TYPEs of earlier blocks of the same source.
    """
    if block[:1] in (b"\n", b" ", b"\t") or _BLANK_LINE.search(block):
        block = b"".join(line for line in block.splitlines(keepends=True) if line.strip())
    spans = _comment_lines(block)
    if not spans:
        return block
    seen = types_seen if types_seen is not None else {}
    decided: dict[bytes, bytes | None] = {}  # TYPE name → its OpenMetrics TYPE line (see _om_family)
    for start, end in spans:
        kind, name, rest = _meta(block[start:end])
        if kind == b"TYPE":
            decided[name] = _om_family(name, rest.strip(), seen)
    rewrite: dict[int, bytes] = {}
    for start, end in spans:
        line = block[start:end]
        kind, name, rest = _meta(line)
        if kind == b"TYPE":
            new = decided.get(name)
            if new is None:
                continue
        elif kind == b"HELP":
            new_type = decided.get(name)
            if new_type == b"" and seen.get(name) == b"gauge":
                new = b""  # a dropped _created gauge: its HELP goes too
            else:
                family = new_type.split(b" ")[2] if new_type else name
                help_text = rest.replace(b'"', b'\\"') if b'"' in rest else rest
                new = b"# HELP " + family + b" " + help_text + b"\n"
            if new == line:
                continue
        else:
            new = b""  # free comments (and text-format UNIT lookalikes) are not OpenMetrics
        rewrite[start] = new
    return _rewrite_comments(block, spans, rewrite)


_OM_TO_TEXT_TYPES = {
    b"counter": (b"_total", b"counter"),
    b"info": (b"_info", b"gauge"),
    b"stateset": (b"", b"gauge"),
    b"unknown": (b"", b"untyped"),
    b"gaugehistogram": (b"", b"untyped"),
}


def openmetrics_to_text(block: bytes) -> bytes:
    """Complete, valid OpenMetrics lines → text format 0.0.4 (an app that ignored our Accept).

    Rare, so plain per-line Python: `# UNIT` dropped; counters renamed `x` → `x_total` in HELP
    and TYPE, info → `x_info` gauge, stateset → gauge, unknown → untyped; exemplars dropped;
    timestamps converted from seconds to milliseconds.
    """
    spans = _comment_lines(block)
    types = _types(block, spans)
    out: list[bytes] = []
    for line in block.splitlines(keepends=True):
        if line.startswith(b"#"):
            kind, name, rest = _meta(line)
            if kind == b"UNIT" or not kind:
                continue
            suffix, text_type = _OM_TO_TEXT_TYPES.get(types.get(name, b""), (b"", b""))
            if kind == b"TYPE":
                out.append(b"# TYPE " + name + suffix + b" " + (text_type or rest.strip()) + b"\n")
            else:
                help_text = rest.replace(b'\\"', b'"')
                out.append(b"# HELP " + name + suffix + b" " + help_text + b"\n")
            continue
        if b" # " not in line and line.count(b" ") == 1:
            out.append(line)  # neither exemplar nor timestamp: as is
            continue
        match = _OM_SAMPLE.fullmatch(line)
        if match is None:
            out.append(line)
            continue
        sample = match.group(1) + b" " + match.group(2)
        if match.group(3):
            sample += b" " + str(int(float(match.group(3)) * 1000)).encode()
        out.append(sample + b"\n")
    return b"".join(out)


def _family_cut(buf: bytes) -> int:
    """Where the last family in `buf` starts (its first comment line), or -1 if none after 0."""
    type_at = buf.rfind(b"\n# TYPE ")
    help_at = buf.rfind(b"\n# HELP ")
    at = max(type_at, help_at)
    if at < 0:
        return -1
    cut = at + 1
    # Walk back over the comment run (HELP before TYPE, OpenMetrics UNIT) so it stays together.
    while cut > 0:
        prev = buf.rfind(b"\n", 0, cut - 1) + 1
        if not buf.startswith(b"#", prev):
            break
        cut = prev
    return cut


class SourceFilter:
    """One source's exposition in, validated and converted lines out, block by block.

    `feed(chunk)` returns what may be written now (whole families, or whole lines past
    `HOLD_LIMIT`); `finish()` returns the rest. Both raise SourceError once the source is
    unusable (too large, malformed); nothing of the offending block is returned, and the
    caller stops reading that source.
    """

    def __init__(self, source: Format, output: OutputFormat, cap: int = MAX_SOURCE_BYTES,
                 hold_limit: int = HOLD_LIMIT) -> None:
        self.source = source
        self.output = output.format
        self.cap = cap
        self.hold_limit = hold_limit
        self.received = 0
        self.ended = False  # OpenMetrics `# EOF` seen: the rest of the body is ignored
        self._held = b""
        self._types: dict[bytes, bytes] = {}  # TYPEs seen so far (text → OpenMetrics needs the history)

    def feed(self, data: bytes) -> bytes:
        if self.ended or not data:
            return b""
        self.received += len(data)
        if self.received > self.cap:
            raise SourceTooLarge(f"body exceeds {self.cap} bytes")
        buf = self._held + data if self._held else data
        cut = _family_cut(buf)
        if cut <= 0 and len(buf) > self.hold_limit:
            cut = buf.rfind(b"\n") + 1
        if cut <= 0:
            self._held = buf
            return b""
        self._held = buf[cut:]
        return self._process(buf[:cut])

    def finish(self) -> bytes:
        if self.ended:
            return b""
        block, self._held = self._held, b""
        if block and not block.endswith(b"\n"):
            block += b"\n"
        out = self._process(block)
        if self.source is Format.OPENMETRICS and not self.ended:
            raise MalformedSource("OpenMetrics body without # EOF (truncated)")
        return out

    def _process(self, block: bytes) -> bytes:
        if self.source is Format.OPENMETRICS:
            found = -1 if block.startswith(b"# EOF") else block.find(b"\n# EOF")
            if found >= 0 or block.startswith(b"# EOF"):
                block = block[: found + 1]
                self.ended = True
        if not block:
            return b""
        try:
            block.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedSource(f"not UTF-8 at byte {self.received - len(block) + exc.start}") from None
        if not _valid(_VALID[self.source], block):
            raise MalformedSource(_first_bad_line(block, self.source))
        if self.source is self.output:
            return block
        if self.output is Format.OPENMETRICS:
            return text_to_openmetrics(block, self._types)
        return openmetrics_to_text(block)
