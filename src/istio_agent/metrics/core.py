"""Metric families, samples and the registry: the data model both expositions render.

The shapes follow prometheus_client's (a family has `name`, `documentation`,
`type`, `unit` and `samples`; a counter family is named without `_total`, its
samples with it; a collector is anything with `collect()`), so that a collector
written for one reads the same in the other and the parity tests can build the
same metrics in both. Names are checked strictly when a family or an instrument
is made: `[a-zA-Z_][a-zA-Z0-9_]*` (Prometheus reserves `:` for recording rules,
and labels starting `__` for itself), so the expositions never need to rewrite
a name.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

METRIC_TYPES = frozenset(("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info",
                          "stateset"))
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Series names a family of each type owns besides its own (what two collectors must not both export).
_TYPE_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


INF = float("inf")


def go_float(value: float) -> str:
    """A sample value or bucket bound as prometheus_client writes it (and Go's clients read it).

    Python's shortest repr, except infinities and NaN in Prometheus' spelling and a
    positive number with more than six digits before the point in exponent form
    (`1234567.0` -> `1.234567e+06`; Go switches to exponents sooner than Python).
    """
    value = float(value)
    if value != value:
        return "NaN"
    if value in (INF, -INF):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    point = text.find(".")
    if value > 0 and point > 6:
        digits = (text[:point] + text[point + 1:]).rstrip("0")
        mantissa = (digits[0] + "." + digits[1:]).rstrip(".")
        return f"{mantissa}e+{point - 1:02d}"
    return text


def family_name(name: str, unit: str = "") -> str:
    """`name` with `_<unit>` appended unless it ends so already, checked (what families and instruments are named)."""
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    return check_metric_name(name)


def check_metric_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid metric name {name!r} (want [a-zA-Z_][a-zA-Z0-9_]*)")
    return name


def check_label_names(names: Iterable[str], reserved: Sequence[str] = ()) -> tuple[str, ...]:
    out = tuple(names)
    for name in out:
        if not _NAME.fullmatch(name) or name.startswith("__"):
            raise ValueError(f"invalid label name {name!r}")
        if name in reserved:
            raise ValueError(f"reserved label name {name!r}")
    return out


class Sample(NamedTuple):
    """One series' value; `timestamp` in seconds since the epoch (no exemplars: the agent has none)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


class Metric:
    """One metric family: its name (without `_total` for a counter), help, type, unit and samples.

    `suffixed` is False for a sum written as upstream's Go agent writes it (`SumMetricFamily`, `Sum`): a
    counter whose series carry the family's own name, with no `_total` added and no `_created`.
    """

    suffixed = True

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        self.name = family_name(name, unit)
        self.documentation = documentation
        self.unit = unit
        typ = "unknown" if typ == "untyped" else typ
        if typ not in METRIC_TYPES:
            raise ValueError(f"invalid metric type {typ!r}")
        self.type = typ
        self.samples: list[Sample] = []

    def add_sample(self, name: str, labels: dict[str, str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(Sample(name, labels, value, timestamp))

    def __repr__(self) -> str:
        return f"Metric({self.name!r}, {self.type!r}, {len(self.samples)} samples)"


class _Family(Metric):
    def __init__(self, name: str, documentation: str, typ: str, value: float | None,
                 labels: Sequence[str] | None, unit: str) -> None:
        super().__init__(name, documentation, typ, unit)
        if labels is not None and value is not None:
            raise ValueError("a family takes either a value or label names, not both")
        self._labelnames = check_label_names(labels or ())

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        return dict(zip(self._labelnames, values, strict=False))


class CounterMetricFamily(_Family):
    """A counter from a custom collector; `name` may end in `_total` (it is taken off the family's name)."""

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None, created: float | None = None, unit: str = "") -> None:
        super().__init__(name[:-6] if name.endswith("_total") else name, documentation, "counter", value, labels,
                         unit)
        if value is not None:
            self.add_metric((), value, created)

    def add_metric(self, labels: Sequence[str], value: float, created: float | None = None,
                   timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name + "_total", self._labels(labels), value, timestamp))
        if created is not None:
            self.samples.append(Sample(self.name + "_created", self._labels(labels), created, timestamp))


class SumMetricFamily(_Family):
    """A counter written under its own name, as upstream's agent exports its sums (Go's OpenTelemetry exporter,
    set `WithoutCounterSuffixes`): `x 3` under `# TYPE x counter`, not `x_total`, and no `_created`.

    Dashboards and alerts query upstream's series by those names (`istio_agent_xds_proxy_requests`), so a
    family upstream writes so is written so here; a name that ends in `_total` keeps it (upstream's
    `istio_agent_num_file_secret_failures_total`). OpenMetrics wants a counter's series to end in `_total`:
    there the family has no TYPE line (`exposition` says why), and its series keep their names.
    """

    suffixed = False

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None) -> None:
        super().__init__(name, documentation, "counter", value, labels, "")
        if value is not None:
            self.add_metric((), value)

    def add_metric(self, labels: Sequence[str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name, self._labels(labels), value, timestamp))


class GaugeMetricFamily(_Family):
    """A gauge from a custom collector."""

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None, unit: str = "") -> None:
        super().__init__(name, documentation, "gauge", value, labels, unit)
        if value is not None:
            self.add_metric((), value)

    def add_metric(self, labels: Sequence[str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name, self._labels(labels), value, timestamp))


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class DuplicateTimeseries(ValueError):
    def __init__(self, duplicates: set[str]) -> None:
        super().__init__(f"Duplicated timeseries in CollectorRegistry: {duplicates}")
        self.duplicates = duplicates


class CollectorRegistry:
    """The collectors of one agent, in registration order (never a process-wide one: agents may share a process).

    `register` refuses a collector whose series clash with a registered one's, as
    far as it can tell: from its `describe()`, else (with `auto_describe`) from
    one `collect()`. `clock` (seconds since the epoch) stamps the `_created`
    series of the instruments registered here.
    """

    def __init__(self, auto_describe: bool = False, clock: Callable[[], float] | None = None) -> None:
        self.clock: Callable[[], float] = clock or time.time
        self._auto_describe = auto_describe
        self._lock = threading.Lock()
        self._collectors: dict[Collector, list[str]] = {}
        self._names: dict[str, Collector] = {}

    def _series_names(self, collector: Collector) -> list[str]:
        describe: Callable[[], Iterable[Metric]] | None = getattr(collector, "describe", None)
        if describe is None and self._auto_describe:
            describe = collector.collect
        if describe is None:
            return []
        names: list[str] = []
        for metric in describe():
            names.append(metric.name)
            names.extend(metric.name + suffix for suffix in _TYPE_SUFFIXES.get(metric.type, ()))
        return names

    def register(self, collector: Collector) -> None:
        with self._lock:
            names = self._series_names(collector)
            duplicates = set(self._names).intersection(names)
            if duplicates:
                raise DuplicateTimeseries(duplicates)
            for name in names:
                self._names[name] = collector
            self._collectors[collector] = names

    def unregister(self, collector: Collector) -> None:
        with self._lock:
            for name in self._collectors.pop(collector):
                del self._names[name]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of series `name{labels}`, or None (for tests: it collects everything)."""
        want = labels or {}
        for metric in self.collect():
            for sample in metric.samples:
                if sample.name == name and sample.labels == want:
                    return sample.value
        return None
