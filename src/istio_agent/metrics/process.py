"""The standard process metrics (`<namespace>_process_*`), read from /proc at every scrape.

The same series, help texts, order and sources as prometheus_client's
ProcessCollector, which upstream's agent also exports (Go's process collector):
`/proc/<pid>/stat` for virtual memory, resident memory (pages x page size),
start time (clock ticks since boot + `btime` of `/proc/stat`) and CPU seconds
(utime + stime); `/proc/<pid>/fd` and `/proc/<pid>/limits` for open and
maximum file descriptors. Nothing when /proc cannot be read.

With `go_extras`, also the three families Go's process collector adds on Linux,
which upstream's agent exports: `network_receive_bytes_total` and
`network_transmit_bytes_total` (every interface of `/proc/<pid>/net/dev`, the
process's network namespace) and `virtual_memory_max_bytes` (`Max address space`
of `/proc/<pid>/limits`; unlimited is 2^64-1, as Go writes it).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from istio_agent.metrics.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric

UNLIMITED = float(2**64 - 1)  # what Go's collector reports for an unlimited address space


def _sysconf(name: str, default: int) -> int:
    try:
        return os.sysconf(name)
    except (ValueError, OSError):
        return default


def process_start_time(proc: str = "/proc", pid: int | str = "self") -> float | None:
    """When the process started, in seconds since the epoch (what `process_start_time_seconds` reports);
    None when /proc cannot tell."""
    collector = ProcessCollector(pid=lambda: pid, proc=proc)
    for family in collector.collect():
        if family.name.endswith("_start_time_seconds"):
            return family.samples[0].value
    return None


class ProcessCollector:
    """Registers itself on `registry`; `pid` names the process (`self` by default), `proc` the procfs root."""

    def __init__(self, namespace: str = "", pid: Callable[[], int | str] = lambda: "self", proc: str = "/proc",
                 registry: CollectorRegistry | None = None, go_extras: bool = False) -> None:
        self._prefix = f"{namespace}_process_" if namespace else "process_"
        self._go_extras = go_extras
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
        if self._go_extras:
            out.extend(self._network(pid_dir))
            out.extend(self._address_space(pid_dir))
        return out

    def _network(self, pid_dir: str) -> list[Metric]:
        try:
            with open(os.path.join(pid_dir, "net", "dev"), "rb") as dev:
                lines = dev.read().splitlines()[2:]  # two header lines
        except OSError:
            return []
        received = sent = 0.0
        for line in lines:
            fields = line.partition(b":")[2].split()
            if len(fields) >= 9:
                received += float(fields[0])
                sent += float(fields[8])
        prefix = self._prefix
        return [CounterMetricFamily(prefix + "network_receive_bytes_total",
                                    "Number of bytes received by the process over the network.", value=received),
                CounterMetricFamily(prefix + "network_transmit_bytes_total",
                                    "Number of bytes sent by the process over the network.", value=sent)]

    def _address_space(self, pid_dir: str) -> list[Metric]:
        try:
            with open(os.path.join(pid_dir, "limits"), "rb") as limits:
                line = next((line for line in limits if line.startswith(b"Max address space")), None)
        except OSError:
            return []
        if line is None:
            return []
        soft = line.split()[3]
        value = UNLIMITED if soft == b"unlimited" else float(soft)
        return [GaugeMetricFamily(self._prefix + "virtual_memory_max_bytes",
                                  "Maximum amount of virtual memory available in bytes.", value=value)]
