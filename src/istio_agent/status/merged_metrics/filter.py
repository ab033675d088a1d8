"""One source of the merged metrics page: validated, converted, emitted in whole families. No I/O.

- **Validation.** Each block is checked line by line (a regular expression over
  64 KiB windows, ~3 ms per MB): an HTML error page, JSON, plain error text or
  binary junk stops that source at the first bad line, and nothing of the bad
  block is emitted, because Prometheus rejects the *whole* scrape on one bad line
  and one broken source must not take the others down.
- **Conversion** to the answer's format when the source spoke the other one
  (`text_to_openmetrics`, `openmetrics_to_text`); `# EOF` is stripped (the
  handler writes it once, last).
- **Family boundaries.** Blocks end where a metric family starts, so a source cut
  short (size cap, deadline, garbage) never leaves half a family in the body. At
  most one family (or `HOLD_LIMIT`) is held back.
- **Cap.** 10 MiB per source, as upstream.
"""

from __future__ import annotations

import re

from istio_agent.status.merged_metrics.merge import MAX_SOURCE_BYTES, Format, OutputFormat

VALIDATION_WINDOW = 64 * 1024
HOLD_LIMIT = 1024 * 1024  # beyond this much held data, emit at a line boundary instead of a family boundary


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
