"""Whole agents as `bench_status.py`'s arms: the merged scrape of our `pilot-agent` and of upstream's Go one.

One network namespace per implementation (both use the fixed ports), each
with istiod-local (15010/15012), the sidecar agent with its Envoy (the same
binary), `SERVICES` services x 5 ports pushed to that Envoy so that its stats
page is not trivial, and an app (`bench_status.py --serve-app`: prometheus_client
with `BENCH_SERIES` series) that ISTIO_PROMETHEUS_ANNOTATIONS names, as the
injector writes it for an annotated pod. The scraper is this process: a
thread in each namespace fetches :15020/stats/prometheus (Prometheus' Accept,
no gzip, the whole body read); and, for context, Envoy's :15090 and the app
fetched directly and concurrently. Rounds alternate between the arms; medians
are compared. Each agent's VmRSS is read before and after the rounds, and its
VmHWM after.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_xds import Arm, big_registry, enter_netns
from launchers import PilotAgent, pod_files
from support import HTTP_NOT_YET, poll, rss_mb, stop_process
from upstream_arm import GO, OURS, missing, ratio, say_missing, sidecar_environment, start_agent

SERVICES = int(os.environ.get("BENCH_STATUS_SERVICES", "100"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "20"))
APP_PORT = 9102
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def fetch(port: int, path: str) -> int:
    """GET 127.0.0.1:`port``path` in the calling thread's namespace; the body's length (200 only)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Accept": ACCEPT, "Accept-Encoding": "identity"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise http.client.HTTPException(f"{path} on {port}: {response.status}")
        return len(body)
    finally:
        conn.close()


class StatusArm:
    def __init__(self, implementation: str, base: Path, bench_file: Path) -> None:
        self.implementation = implementation
        self.arm = Arm(f"status-{implementation}", base, base / "state")
        self.bench_file = bench_file
        self.app: subprocess.Popen[bytes] | None = None
        self.agent: PilotAgent | None = None
        self.pool = concurrent.futures.ThreadPoolExecutor(2, initializer=enter_netns, initargs=(self.arm.netns,))

    def start(self) -> None:
        self.arm.create()
        pod = pod_files(self.arm.state, self.arm.dir / "pod", pod="echo-1")
        self.app = subprocess.Popen([*self.arm.prefix(), sys.executable, str(self.bench_file), "--serve-app",
                                     os.environ.get("BENCH_SERIES", "16000"), str(self.arm.dir / "app.port"),
                                     str(APP_PORT)])
        self.arm.start_istiod()
        annotations = json.dumps({"scrape": "true", "port": str(APP_PORT), "path": "/metrics"})
        self.agent = start_agent(self.implementation, pod, sidecar_environment(
            ISTIO_PROMETHEUS_ANNOTATIONS=annotations), prefix=self.arm.prefix(), log_file=self.arm.dir / "agent.log")
        agent = self.agent
        baseline = poll(self.arm.settled, f"{self.implementation}'s Envoy", 60, agent.output, retry_on=HTTP_NOT_YET)
        self.arm.registry.write(big_registry(SERVICES))
        target = baseline + SERVICES * 5
        poll(lambda: self.arm.settled(target), f"{self.implementation}'s Envoy to take {target} clusters", 120,
             agent.output, retry_on=HTTP_NOT_YET)
        poll(lambda: self.get(15020, "/stats/prometheus") > 0, f"{self.implementation}'s merged metrics", 30,
             agent.output, retry_on=HTTP_NOT_YET)

    def get(self, port: int, path: str) -> int:
        return self.pool.submit(fetch, port, path).result()

    def timed(self, port: int, path: str) -> float:
        started = time.perf_counter()
        self.get(port, path)
        return (time.perf_counter() - started) * 1000

    def timed_direct(self) -> float:
        started = time.perf_counter()
        both = [self.pool.submit(fetch, 15090, "/stats/prometheus"), self.pool.submit(fetch, APP_PORT, "/metrics")]
        for future in both:
            future.result()
        return (time.perf_counter() - started) * 1000

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.kill()
        stop_process(self.app)
        self.pool.shutdown()
        self.arm.stop()


def whole_agents(work: Path, bench_file: Path) -> dict[str, Any]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("whole agents not measured: they need root and iproute2 (a network namespace each)", flush=True)
        return {"agents": "needs root"}
    why_not = missing("pilot-agent")
    if why_not:
        say_missing("bench_status", why_not)
    base = work / "agents"
    base.mkdir()
    pod_files(base / "state", base / "state-pod")  # the shared CA before any istiod
    arms = [StatusArm(name, base, bench_file) for name in ([OURS] if why_not else [OURS, GO])]
    merged: dict[str, list[float]] = {arm.implementation: [] for arm in arms}
    direct: dict[str, list[float]] = {arm.implementation: [] for arm in arms}
    memory: dict[str, dict[str, float]] = {}
    sizes: dict[str, tuple[int, int, int]] = {}
    try:
        for arm in arms:
            arm.start()
        for arm in arms:
            assert arm.agent is not None
            sizes[arm.implementation] = (arm.get(15020, "/stats/prometheus"), arm.get(15090, "/stats/prometheus"),
                                         arm.get(APP_PORT, "/metrics"))
            memory[arm.implementation] = {"before": rss_mb(arm.agent.pid)}
        for round_no in range(ROUNDS):
            for arm in arms if round_no % 2 == 0 else arms[::-1]:
                merged[arm.implementation].append(arm.timed(15020, "/stats/prometheus"))
                direct[arm.implementation].append(arm.timed_direct())
        for arm in arms:
            assert arm.agent is not None
            memory[arm.implementation].update(after=rss_mb(arm.agent.pid), peak=rss_mb(arm.agent.pid, "VmHWM"))
    finally:
        for arm in arms:
            arm.stop()
    out: dict[str, Any] = {}
    for name in merged:
        ms, direct_ms = statistics.median(merged[name]), statistics.median(direct[name])
        growth = memory[name]["after"] - memory[name]["before"]
        merged_bytes, envoy_bytes, app_bytes = sizes[name]
        print(f"{'whole agent (ours)' if name == OURS else 'Go agent':18s} merged scrape {ms:6.1f} ms "
              f"({merged_bytes} bytes; Envoy {envoy_bytes} + app {app_bytes} fetched directly {direct_ms:.1f} ms); "
              f"agent RSS {memory[name]['before']:.1f} -> {memory[name]['after']:.1f} MB over {ROUNDS} scrapes, "
              f"peak {memory[name]['peak']:.1f} MB", flush=True)
        prefix = "sidecar_" if name == OURS else "upstream_"
        out.update({f"{prefix}merged_ms": round(ms, 1), f"{prefix}direct_ms": round(direct_ms, 1),
                    f"{prefix}merged_bytes": merged_bytes, f"{prefix}merge_rss_growth_mb": round(growth, 1),
                    f"{prefix}rss_peak_mb": round(memory[name]["peak"], 1)})
    if why_not:
        out["upstream"] = why_not
    else:
        out["merged_ms_vs_upstream"] = ratio(out["sidecar_merged_ms"], out["upstream_merged_ms"])
        out["rss_peak_vs_upstream"] = ratio(out["sidecar_rss_peak_mb"], out["upstream_rss_peak_mb"])
        out["merge_rss_growth_mb_vs_upstream"] = ratio(out["sidecar_merge_rss_growth_mb"],
                                                       out["upstream_merge_rss_growth_mb"])
        print(f"whole agents' merged scrape, ours / upstream's: {out['merged_ms_vs_upstream']} (peak RSS "
              f"{out['rss_peak_vs_upstream']})", flush=True)
    return out
