"""Counter, Sum, Gauge and Histogram, with or without labels, registered on a `CollectorRegistry`.

They render as prometheus_client's do: a counter's family is named without
`_total` and exports `<name>_total` and `<name>_created`; a histogram exports
cumulative `_bucket{le=...}` series (its bounds sorted, `+Inf` added), `_count`,
`_sum` (unless a bound is negative) and `_created`; children appear in the
order their label values were first used. `_created` is the registry's clock at
the child's creation, and is left out when `PROMETHEUS_DISABLE_CREATED_SERIES`
is true (the variable prometheus_client reads).

One lock per instrument: the DNS proxy observes from its own threads while the
agent's loop scrapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from istio_agent.metrics.core import (
    INF,
    CollectorRegistry,
    Metric,
    check_label_names,
    family_name,
    go_float,
)

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, INF)
# Whether counters and histograms carry their `_created` series (prometheus_client's default). Process-wide,
# as prometheus_client's: the agent sets it once from PROMETHEUS_DISABLE_CREATED_SERIES (its options) before it
# makes its metrics.
USE_CREATED = True


def set_created_series(enabled: bool) -> None:
    """Turn the `_created` series of every counter and histogram of this process on or off."""
    global USE_CREATED
    USE_CREATED = enabled

# (suffix, extra labels, value) of one child's series
ChildSample = tuple[str, tuple[tuple[str, str], ...], float]


class _CounterChild:
    __slots__ = ("_lock", "created", "value")

    def __init__(self, lock: threading.Lock, created: float) -> None:
        self._lock, self.created, self.value = lock, created, 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self.value += amount

    def samples(self) -> list[ChildSample]:
        out: list[ChildSample] = [("_total", (), self.value)]
        if USE_CREATED:
            out.append(("_created", (), self.created))
        return out


class _SumChild:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock, created: float) -> None:
        self._lock, self.value = lock, 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self.value += amount

    def samples(self) -> list[ChildSample]:
        return [("", (), self.value)]


class _GaugeChild:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock, created: float) -> None:
        self._lock, self.value = lock, 0.0

    def inc(self, amount: float = 1) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1) -> None:
        with self._lock:
            self.value -= amount

    def set(self, value: float) -> None:
        with self._lock:
            self.value = float(value)

    def samples(self) -> list[ChildSample]:
        return [("", (), self.value)]


class _HistogramChild:
    __slots__ = ("_bounds", "_counts", "_lock", "created", "sum")

    def __init__(self, lock: threading.Lock, created: float, bounds: Sequence[float]) -> None:
        self._lock, self.created, self._bounds = lock, created, bounds
        self._counts = [0.0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        with self._lock:
            self.sum += amount
            for index, bound in enumerate(self._bounds):
                if amount <= bound:
                    self._counts[index] += 1
                    break

    def samples(self) -> list[ChildSample]:
        with self._lock:
            counts, total_sum = list(self._counts), self.sum
        out: list[ChildSample] = []
        cumulative = 0.0
        for bound, count in zip(self._bounds, counts, strict=True):
            cumulative += count
            out.append(("_bucket", (("le", go_float(bound)),), cumulative))
        out.append(("_count", (), cumulative))
        if self._bounds[0] >= 0:
            out.append(("_sum", (), total_sum))
        if USE_CREATED:
            out.append(("_created", (), self.created))
        return out


Child = TypeVar("Child", _CounterChild, _SumChild, _GaugeChild, _HistogramChild)


class _Instrument(Generic[Child]):
    """One family: a single child without label names, else one child per label values."""

    _type = ""
    _suffixed = True
    _reserved: tuple[str, ...] = ()

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *, unit: str = "",
                 registry: CollectorRegistry | None = None) -> None:
        if self._type == "counter" and self._suffixed and name.endswith("_total"):
            name = name[:-6]
        self.name = family_name(name, unit)
        self.documentation = documentation
        self.unit = unit
        self.labelnames = check_label_names(labelnames, self._reserved)
        self._clock: Callable[[], float] = registry.clock if registry is not None else time.time
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], Child] = {}
        self._single: Child | None = None if self.labelnames else self._new_child()
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> Child:
        raise NotImplementedError

    def labels(self, *values: object, **by_name: object) -> Child:
        """The child for these label values (made at first use), positional or by name, as strings."""
        if not self.labelnames:
            raise ValueError(f"{self.name} has no label names")
        if values and by_name:
            raise ValueError("label values either by position or by name, not both")
        if by_name:
            if sorted(by_name) != sorted(self.labelnames):
                raise ValueError("Incorrect label names")
            key = tuple(str(by_name[name]) for name in self.labelnames)
        else:
            if len(values) != len(self.labelnames):
                raise ValueError("Incorrect label count")
            key = tuple(str(value) for value in values)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
        return child

    def _unlabelled(self) -> Child:
        if self._single is None:
            raise ValueError(f"{self._type} metric {self.name} is missing label values")
        return self._single

    def _family(self) -> Metric:
        metric = Metric(self.name, self.documentation, self._type, self.unit)
        metric.suffixed = self._suffixed
        return metric

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        metric = self._family()
        if self._single is not None:
            children: list[tuple[tuple[str, ...], Child]] = [((), self._single)]
        else:
            with self._lock:
                children = list(self._children.items())
        for key, child in children:
            base = list(zip(self.labelnames, key, strict=True))
            for suffix, extra, value in child.samples():
                metric.add_sample(self.name + suffix, dict(base + list(extra)), value)
        return [metric]


class Counter(_Instrument[_CounterChild]):
    """A monotonic count; `inc()` it directly, or `labels(...).inc()` with label names."""

    _type = "counter"

    def _new_child(self) -> _CounterChild:
        return _CounterChild(self._lock, self._clock())

    def inc(self, amount: float = 1) -> None:
        self._unlabelled().inc(amount)


class Sum(_Instrument[_SumChild]):
    """A monotonic count written as upstream's agent writes its sums: under its own name (`x 3`, no
    `_total` added, no `_created`), typed `counter` in text 0.0.4 (`core.SumMetricFamily` says why)."""

    _type = "counter"
    _suffixed = False

    def _new_child(self) -> _SumChild:
        return _SumChild(self._lock, 0.0)

    def inc(self, amount: float = 1) -> None:
        self._unlabelled().inc(amount)


class Gauge(_Instrument[_GaugeChild]):
    """A value that goes up and down."""

    _type = "gauge"

    def _new_child(self) -> _GaugeChild:
        return _GaugeChild(self._lock, 0.0)

    def inc(self, amount: float = 1) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._unlabelled().dec(amount)

    def set(self, value: float) -> None:
        self._unlabelled().set(value)


class Histogram(_Instrument[_HistogramChild]):
    """Observations counted in cumulative buckets (`buckets` sorted; `+Inf` is added when missing)."""

    _type = "histogram"
    _reserved = ("le",)

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *, unit: str = "",
                 registry: CollectorRegistry | None = None, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        bounds = [float(bound) for bound in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds and bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        self._bounds = tuple(bounds)
        super().__init__(name, documentation, labelnames, unit=unit, registry=registry)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self._lock, self._clock(), self._bounds)

    def observe(self, amount: float) -> None:
        self._unlabelled().observe(amount)
