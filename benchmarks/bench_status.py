"""Merged-metrics scrape latency against fetching the sources directly, in the same run.

Processes: a real Envoy whose loopback listener serves `/stats/prometheus` from its admin
API (Istio's 15090 shape) with enough static clusters for ~16,000 series; an app process
serving ~16,000 series with prometheus_client's own HTTP server; one "agent" process
running the merged handler (with the agent's registry, on the status server's
h11 server) on two ports, one merging Envoy
only, one merging Envoy and the app; and this process as the scraper (aiohttp, no gzip,
reading the whole body).

Rounds alternate, and medians are compared:
- `merge_latency_ratio`: merged Envoy + app page / both sources fetched directly and
  concurrently (the issue's figure, aim <= 1.2);
- `envoy_only_ratio`: merged Envoy-only page / Envoy's page fetched directly;
- the same two in OpenMetrics (Prometheus' own Accept: the app answers OpenMetrics and
  Envoy's text is converted), and with gzip as Prometheus asks for it (extra figures).
The agent process's RSS is read before and after 20 merged scrapes of the big page
(`merge_rss_growth_mb`, aim <= 10) and its peak (VmHWM).

**Whole agents** (root; `status_agent_arms.py`): our `pilot-agent` and
upstream's Go one, each in its namespace with istiod-local, its Envoy (the same
binary, `BENCH_STATUS_SERVICES` (100) services x 5 ports pushed to it) and an
app serving `BENCH_SERIES` series named by ISTIO_PROMETHEUS_ANNOTATIONS, are
scraped on :15020/stats/prometheus in alternating rounds:
`merged_ms_vs_upstream` (median latency, aim <= 1.0), and each agent's RSS
growth over the rounds and peak (`merge_rss_growth_mb_vs_upstream`).

Last line: one JSON object with those figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from support import HTTP_NOT_YET, envoy_stats_bootstrap, free_port, poll, rss_mb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_agent_arms import whole_agents

ROOT = Path(__file__).resolve().parent.parent
ENVOY = ROOT / ".venv" / "bin" / "envoy"
SERIES = int(os.environ.get("BENCH_SERIES", "16000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "20"))
TEXT_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def wait_port_file(path: Path, process: subprocess.Popen[bytes], what: str) -> list[int]:
    """The ports a child writes to `path` once it listens."""
    def written() -> str:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode} before it listened")
        return path.read_text().strip() if path.exists() else ""

    return [int(p) for p in poll(written, f"{what} to listen", 60).split()]


# --- child processes ----------------------------------------------------------------------------------------


def serve_app(series: int, port_file: Path, port: int = 0) -> None:
    """prometheus_client's HTTP server with `series` gauge series (on `port`, else a free one)."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    registry = CollectorRegistry()
    gauge = Gauge("bench_app_queue_depth", "Items waiting per queue.", ["queue", "shard"], registry=registry)
    for i in range(series):
        gauge.labels(f"queue-{i}", str(i % 16)).set(i)
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    port_file.write_text(str(server.server_port))
    while True:
        time.sleep(3600)


def serve_merged(envoy_port: int, app_port: int, port_file: Path) -> None:
    """The agent side: the merged handler on two ports (Envoy only; Envoy + app), on the status server's HTTP."""
    from istio_agent.httpio.routing import Router
    from istio_agent.httpio.server import HttpServer
    from istio_agent.metrics import CollectorRegistry
    from istio_agent.status.agent_metrics import AgentMetrics
    from istio_agent.status.merged_metrics.handler import MetricsOptions, add_metrics_routes
    from istio_agent.status.merged_metrics.merge import ScrapeTarget

    async def main() -> None:
        ports = []
        for targets in ((), (ScrapeTarget(app_port),)):
            registry = CollectorRegistry(auto_describe=True)
            AgentMetrics(registry)
            router = Router()
            add_metrics_routes(router, MetricsOptions(envoy_port=envoy_port, app_targets=targets), registry)
            ports.append(await HttpServer(router).start("127.0.0.1", 0))
        port_file.write_text(" ".join(map(str, ports)))
        await asyncio.Event().wait()

    from istio_agent.eventloop import run

    run(main())


# --- the scraper --------------------------------------------------------------------------------------------


async def fetch(session: Any, port: int, accept: str, gzip: bool = False) -> int:
    headers = {"Accept": accept, "Accept-Encoding": "gzip" if gzip else "identity"}
    async with session.get(f"http://127.0.0.1:{port}/stats/prometheus", headers=headers) as response:
        body = await response.read()
        assert response.status == 200
        return len(body)


async def fetch_app(session: Any, port: int, accept: str) -> int:
    headers = {"Accept": accept, "Accept-Encoding": "identity"}
    async with session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as response:
        return len(await response.read())


async def timed(coro: Any) -> float:
    started = time.perf_counter()
    await coro
    return (time.perf_counter() - started) * 1000


async def measure(envoy_port: int, app_port: int, merged_envoy: int, merged_both: int, agent_pid: int,
                  ) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession(auto_decompress=True) as session:
        sizes = {
            "envoy_bytes": await fetch(session, envoy_port, TEXT_ACCEPT),
            "app_bytes": await fetch_app(session, app_port, TEXT_ACCEPT),
            "merged_bytes": await fetch(session, merged_both, TEXT_ACCEPT),
            "merged_om_bytes": await fetch(session, merged_both, PROMETHEUS_ACCEPT),
        }
        samples: dict[str, list[float]] = {k: [] for k in (
            "direct_envoy", "merged_envoy", "direct_both", "merged_both",
            "direct_both_om", "merged_both_om", "merged_envoy_om", "merged_both_gzip")}
        rss_before = rss_mb(agent_pid)
        for _ in range(ROUNDS):
            samples["direct_envoy"].append(await timed(fetch(session, envoy_port, TEXT_ACCEPT)))
            samples["merged_envoy"].append(await timed(fetch(session, merged_envoy, TEXT_ACCEPT)))
            samples["direct_both"].append(await timed(asyncio.gather(
                fetch(session, envoy_port, TEXT_ACCEPT), fetch_app(session, app_port, TEXT_ACCEPT))))
            samples["merged_both"].append(await timed(fetch(session, merged_both, TEXT_ACCEPT)))
            samples["direct_both_om"].append(await timed(asyncio.gather(
                fetch(session, envoy_port, PROMETHEUS_ACCEPT), fetch_app(session, app_port, PROMETHEUS_ACCEPT))))
            samples["merged_both_om"].append(await timed(fetch(session, merged_both, PROMETHEUS_ACCEPT)))
            samples["merged_envoy_om"].append(await timed(fetch(session, merged_envoy, PROMETHEUS_ACCEPT)))
            samples["merged_both_gzip"].append(await timed(fetch(session, merged_both, PROMETHEUS_ACCEPT, True)))
        rss_after = rss_mb(agent_pid)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"sizes": sizes, "medians_ms": medians, "rss_before_mb": rss_before, "rss_after_mb": rss_after,
            "rss_peak_mb": rss_mb(agent_pid, "VmHWM")}


def series_count(port: int) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats/prometheus", timeout=30) as r:
        return sum(1 for line in r.read().splitlines() if line and not line.startswith(b"#"))


def main() -> None:
    if not ENVOY.exists():
        raise SystemExit(f"needs the Envoy binary at {ENVOY}")
    children: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            admin_port, stats_port = free_port(), free_port()
            clusters = max(1, SERIES // 172)  # Envoy writes ~172 series per static cluster
            (work / "envoy.json").write_text(json.dumps(envoy_stats_bootstrap(admin_port, stats_port, clusters)))
            envoy = subprocess.Popen([str(ENVOY), "-c", str(work / "envoy.json"), "--disable-hot-restart",
                                      "-l", "error", "--base-id", str(stats_port), "--concurrency", "2"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            children.append(envoy)
            app = subprocess.Popen([sys.executable, __file__, "--serve-app", str(SERIES), str(work / "app.port")])
            children.append(app)
            [app_port] = wait_port_file(work / "app.port", app, "the app")

            def envoy_serving() -> int:
                if envoy.poll() is not None:
                    raise SystemExit(f"Envoy exited with {envoy.returncode}")
                return series_count(stats_port)

            envoy_series = poll(envoy_serving, "Envoy to serve its stats", 60, interval=0.1, retry_on=HTTP_NOT_YET)
            agent = subprocess.Popen([sys.executable, __file__, "--serve-merged", str(stats_port), str(app_port),
                                      str(work / "merged.port")])
            children.append(agent)
            merged_envoy, merged_both = wait_port_file(work / "merged.port", agent, "the merged handler")
            result = asyncio.run(measure(stats_port, app_port, merged_envoy, merged_both, agent.pid))
            for child in children:  # the whole agents have the cores to themselves
                child.terminate()
            agents = whole_agents(work, Path(__file__))
        finally:
            for child in children:
                child.terminate()
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    m = result["medians_ms"]
    print(f"Envoy series: {envoy_series} ({clusters} clusters), app series: {SERIES}; "
          f"bytes: Envoy {result['sizes']['envoy_bytes']}, app {result['sizes']['app_bytes']}, "
          f"merged {result['sizes']['merged_bytes']} (OpenMetrics {result['sizes']['merged_om_bytes']})")
    print(f"median of {ROUNDS} rounds, ms (text):         direct Envoy {m['direct_envoy']:.1f}, "
          f"merged Envoy-only {m['merged_envoy']:.1f}; direct both {m['direct_both']:.1f}, "
          f"merged both {m['merged_both']:.1f}")
    print(f"median of {ROUNDS} rounds, ms (OpenMetrics):  direct both {m['direct_both_om']:.1f}, "
          f"merged both {m['merged_both_om']:.1f}, merged Envoy-only {m['merged_envoy_om']:.1f}, "
          f"merged both + gzip {m['merged_both_gzip']:.1f}")
    growth = result["rss_after_mb"] - result["rss_before_mb"]
    print(f"agent RSS: {result['rss_before_mb']:.1f} MB before, {result['rss_after_mb']:.1f} MB after "
          f"{ROUNDS * 6} merged scrapes (peak {result['rss_peak_mb']:.1f} MB)")
    figures = {
        "merge_latency_ratio": round(m["merged_both"] / m["direct_both"], 3),
        "envoy_only_ratio": round(m["merged_envoy"] / m["direct_envoy"], 3),
        "merge_latency_ratio_openmetrics": round(m["merged_both_om"] / m["direct_both_om"], 3),
        "envoy_only_ratio_openmetrics": round(m["merged_envoy_om"] / m["direct_envoy"], 3),
        "merged_ms": round(m["merged_both"], 1),
        "direct_ms": round(m["direct_both"], 1),
        "merged_gzip_ms": round(m["merged_both_gzip"], 1),
        "merge_rss_growth_mb": round(growth, 1),
        "agent_rss_peak_mb": round(result["rss_peak_mb"], 1),
        "envoy_series": envoy_series,
        "app_series": SERIES,
        **agents,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-app":
        serve_app(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-merged":
        serve_merged(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
