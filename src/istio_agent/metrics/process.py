"""The standard process metrics (`<namespace>_process_*`), read from /proc at every scrape.

The same series, help texts, order and sources as prometheus_client's
ProcessCollector, which upstream's agent also exports (Go's process collector):
`/proc/<pid>/stat` for virtual memory, resident memory (pages x page size),
start time (clock ticks since boot + `btime` of `/proc/stat`) and CPU seconds
(utime + stime); `/proc/<pid>/fd` and `/proc/<pid>/limits` for open and
maximum file descriptors. Nothing when /proc cannot be read.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from istio_agent.metrics.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric


def _sysconf(name: str, default: int) -> int:
    try:
        return os.sysconf(name)
    except (ValueError, OSError):
        return default


class ProcessCollector:
    """Registers itself on `registry`; `pid` names the process (`self` by default), `proc` the procfs root."""

    def __init__(self, namespace: str = "", pid: Callable[[], int | str] = lambda: "self", proc: str = "/proc",
                 registry: CollectorRegistry | None = None) -> None:
        self._prefix = f"{namespace}_process_" if namespace else "process_"
        self._pid, self._proc = pid, proc
        self._ticks = float(_sysconf("SC_CLK_TCK", 100))
        self._pagesize = _sysconf("SC_PAGE_SIZE", 4096)
        try:
            self._btime = self._boot_time()
        except OSError:
            self._btime = 0.0
        if registry is not None:
            registry.register(self)

    def _boot_time(self) -> float:
        with open(os.path.join(self._proc, "stat"), "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
        return 0.0

    def collect(self) -> list[Metric]:
        if not self._btime:
            return []
        pid_dir = os.path.join(self._proc, str(self._pid()).strip())
        prefix, out = self._prefix, list[Metric]()
        try:
            with open(os.path.join(pid_dir, "stat"), "rb") as stat:
                fields = stat.read().split(b")")[-1].split()  # after the command name, which may hold spaces
            out.append(GaugeMetricFamily(prefix + "virtual_memory_bytes", "Virtual memory size in bytes.",
                                         value=float(fields[20])))
            out.append(GaugeMetricFamily(prefix + "resident_memory_bytes", "Resident memory size in bytes.",
                                         value=float(fields[21]) * self._pagesize))
            out.append(GaugeMetricFamily(prefix + "start_time_seconds",
                                         "Start time of the process since unix epoch in seconds.",
                                         value=float(fields[19]) / self._ticks + self._btime))
            out.append(CounterMetricFamily(prefix + "cpu_seconds_total",
                                           "Total user and system CPU time spent in seconds.",
                                           value=float(fields[11]) / self._ticks + float(fields[12]) / self._ticks))
        except OSError:
            pass
        try:
            max_fds = None
            with open(os.path.join(pid_dir, "limits"), "rb") as limits:
                for line in limits:
                    if line.startswith(b"Max open file"):
                        max_fds = float(line.split()[3])
                        break
            open_fds = len(os.listdir(os.path.join(pid_dir, "fd")))
            out.append(GaugeMetricFamily(prefix + "open_fds", "Number of open file descriptors.", value=open_fds))
            if max_fds is not None:
                out.append(GaugeMetricFamily(prefix + "max_fds", "Maximum number of open file descriptors.",
                                             value=max_fds))
        except OSError:
            pass
        return out
