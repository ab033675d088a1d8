"""The two renderings of a registry: Prometheus text 0.0.4 and OpenMetrics 1.0.0, byte for byte as prometheus_client.

Text 0.0.4 (`generate_latest`): a counter family `x` is written as `x_total`
(HELP and TYPE), info as `x_info` gauge, stateset as gauge, gaugehistogram as
histogram, unknown as untyped; the OpenMetrics-only series (`_created`, `_gsum`,
`_gcount`) leave their family and follow it as gauges of their own, in suffix
order, with the family's help; HELP escapes `\\` and newlines; timestamps are
milliseconds.

A sum (`core.SumMetricFamily`: a counter written under its own name, as upstream's
agent writes its sums) is `# TYPE x counter`, then `x 3`, in text 0.0.4; in
OpenMetrics it has no TYPE line (read as "unknown"), the rule the merged page applies
to any counter without `_total` (`status/merged_metrics/filter.py`): its series keep
their names, strict OpenMetrics parsers accept it, and so do text parsers such as
promtool's, where `unknown` would break them and `counter` would break the former.

OpenMetrics (`generate_openmetrics`): families as they are, `# UNIT` when the
family has one, HELP escapes `"` too, timestamps in seconds, and `# EOF` last.

Both: label pairs sorted by name, values escaped (`\\`, newline, `"`), numbers
with `go_float`. Names need no escaping: `core` accepts only plain ones.
"""

from __future__ import annotations

from istio_agent.metrics.core import Collector, Metric, Sample, go_float

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TEXT_RENAMES = {"counter": ("_total", "counter"), "info": ("_info", "gauge"), "stateset": ("", "gauge"),
                 "gaugehistogram": ("", "histogram"), "unknown": ("", "untyped")}
_SPLIT_OFF = ("_created", "_gsum", "_gcount")  # OpenMetrics-only series: gauges of their own in text


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(sample: Sample) -> str:
    if not sample.labels:
        return ""
    return "{" + ",".join(f'{key}="{_label_value(value)}"' for key, value in sorted(sample.labels.items())) + "}"


def _text_sample(sample: Sample) -> str:
    stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
    return f"{sample.name}{_labels(sample)} {go_float(sample.value)}{stamp}\n"


def _text_family(metric: Metric, out: list[str]) -> None:
    suffix, typ = ("", "counter") if not metric.suffixed else _TEXT_RENAMES.get(metric.type, ("", metric.type))
    help_text = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {metric.name}{suffix} {help_text}\n# TYPE {metric.name}{suffix} {typ}\n")
    split_off: dict[str, list[str]] = {}
    for sample in metric.samples:
        for extra in _SPLIT_OFF:
            if sample.name == metric.name + extra:
                split_off.setdefault(extra, []).append(_text_sample(sample))
                break
        else:
            out.append(_text_sample(sample))
    for extra, lines in sorted(split_off.items()):
        out.append(f"# HELP {metric.name}{extra} {help_text}\n# TYPE {metric.name}{extra} gauge\n")
        out.extend(lines)


def generate_latest(registry: Collector) -> bytes:
    """`registry` (anything with `collect()`) in Prometheus text format 0.0.4."""
    out: list[str] = []
    for metric in registry.collect():
        _text_family(metric, out)
    return "".join(out).encode("utf-8")


def _openmetrics_family(metric: Metric, out: list[str]) -> None:
    help_text = _label_value(metric.documentation)
    out.append(f"# HELP {metric.name} {help_text}\n")
    if metric.suffixed:  # a sum's series lack `_total`: no TYPE, which OpenMetrics reads as "unknown"
        out.append(f"# TYPE {metric.name} {metric.type}\n")
    if metric.unit:
        out.append(f"# UNIT {metric.name} {metric.unit}\n")
    for sample in metric.samples:
        stamp = "" if sample.timestamp is None else f" {sample.timestamp}"
        value = "" if sample.value is None else go_float(sample.value)
        out.append(f"{sample.name}{_labels(sample)} {value}{stamp}\n")


def generate_openmetrics(registry: Collector, eof: bool = True) -> bytes:
    """`registry` in OpenMetrics 1.0.0; `eof=False` leaves out the closing `# EOF` (for a merge that adds it)."""
    out: list[str] = []
    for metric in registry.collect():
        _openmetrics_family(metric, out)
    if eof:
        out.append("# EOF\n")
    return "".join(out).encode("utf-8")
