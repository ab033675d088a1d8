"""Plumbing the tests and the benchmarks share: where the venv's programs are, free ports, polling with a
deadline, child processes (stopping them, collecting their output, their children, istiod-local's serving
line), plain HTTP requests, a stats-only Envoy config, RSS.

Tests import it as `from support import ...` (pytest puts `tests/` on sys.path for
the rootdir conftest); benchmarks add `tests/` to sys.path first. It imports no
pytest, so a benchmark run needs nothing but the project's own dependencies.
`launchers.py` beside it starts istiod-local and pilot-agent on top of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import inspect
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
# ISTIO_AGENT_CONFORMANCE_DIR points the conformance tier at another copy of the kit (same layout),
# e.g. one built from more of upstream's cases; by default it is ../shared/conformance.
CONFORMANCE = Path(os.environ.get("ISTIO_AGENT_CONFORMANCE_DIR") or SHARED / "conformance")


def conformance_cases(kit: str) -> list[dict[str, Any]]:
    """The scored `cases` of `<conformance>/<kit>/cases.json`, or none when the kit is absent (the tests then say so
    through `needs.need_conformance`)."""
    path = CONFORMANCE / kit / "cases.json"
    if not path.exists():
        return []
    return scored_cases(json.loads(path.read_text())["cases"])


def scored_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cases that count: the kit's README says a case with `"score": false` is reference material only and
    must not affect the result, so it is never run (it may lack a pod, a golden or anything else)."""
    return [case for case in cases if case.get("score", True) is not False]
VENV_BIN = ROOT / ".venv" / "bin"
ISTIOD_LOCAL = VENV_BIN / "istiod-local"
PILOT_AGENT = VENV_BIN / "pilot-agent"
ENVOY = VENV_BIN / "envoy"

# istiod-local's start-up line on stderr: the plaintext and TLS addresses it bound.
SERVING_LINE = re.compile(r"serving: plaintext (\S+), TLS (\S+)")
# What a check reading an HTTP endpoint of a process still starting may raise before it answers.
HTTP_NOT_YET: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, http.client.HTTPException)


# Below the kernel's ephemeral range (32768-60999 by default): a port handed out here is not also
# picked as the source port of some outgoing connection before the server under test binds it.
FREE_PORT_RANGE = (20000, 32000)


_HANDED_OUT: set[int] = set()


def compile_sources() -> None:
    """Bring the bytecode caches of `src/` up to date, as an installed agent has them (pip compiles what it
    installs). With PYTHONDONTWRITEBYTECODE set, a module edited since its cache was written is compiled
    again in every process that imports it: more start-up time and ~0.6 MB more memory in an agent, which
    the benchmarks would count as the agent's."""
    import compileall

    compileall.compile_dir(str(ROOT / "src"), quiet=2)


def free_port() -> int:
    """A TCP port that was free on every address a moment ago, chosen at random below the ephemeral range,
    never one this process was given before (two ports asked for one server, e.g. install-cni's readiness and
    monitoring ports, must differ: a repeat put both on one port and answered /metrics with 404)."""
    for _ in range(500):
        port = random.randint(*FREE_PORT_RANGE)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise AssertionError(f"no free TCP port in {FREE_PORT_RANGE}")


def free_udp_tcp_port(attempts: int = 50) -> int:
    """A port free for both UDP and TCP on 127.0.0.1 right now (a DNS server binds both)."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no port free for both UDP and TCP")


def port_accepts(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """True when a TCP connection to `host:port` is accepted right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


def poll(
    check: Callable[[], T | Literal[False] | None],
    what: str,
    timeout: float = 30.0,
    on_timeout: Callable[[], str] = str,
    *,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns something truthy and return that; AssertionError after `timeout` seconds.

    An exception of a `retry_on` type counts as "not yet" (it is shown as the last state);
    any other propagates at once. `on_timeout` adds context (a log) to the failure.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except retry_on as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}\n{on_timeout()}")
        time.sleep(interval)


async def eventually(
    check: Callable[[], Any],
    what: str = "condition",
    timeout: float = 20.0,
    on_timeout: Callable[[], str] = str,
    *,
    interval: float = 0.02,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """The asyncio `poll`: `check` may return an awaitable, which is awaited; the loop keeps running meanwhile."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = result
        except retry_on as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}\n{on_timeout()}")
        await asyncio.sleep(interval)


def envoy_stats_bootstrap(admin_port: int, stats_port: int, clusters: int) -> dict[str, Any]:
    """A real Envoy's config: admin on loopback, Istio's `prometheus_stats` listener shape (/stats/prometheus
    → admin) on `stats_port`, and `clusters` outbound clusters for a realistic number of series."""
    def static_cluster(name: str, port: int) -> dict[str, Any]:
        return {"name": name, "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
            "cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}

    router = {"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                    ".HttpConnectionManager",
           "stat_prefix": "stats", "http_filters": [router],
           "route_config": {"virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [
               {"match": {"prefix": "/stats/prometheus"}, "route": {"cluster": "prometheus_stats"}}]}]}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "clusters": [static_cluster("prometheus_stats", admin_port)] + [
                static_cluster(f"outbound|80||svc-{i}.default.svc.cluster.local", 9) for i in range(clusters)],
            "listeners": [{"name": "prometheus", "address": {"socket_address": {
                "address": "127.0.0.1", "port_value": stats_port}}, "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}],
        },
    }


@contextlib.contextmanager
def open_workdir(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp that every uid can enter (Envoy runs as 1337 in a pod; pytest's
    tmp_path sits under a 0700 directory), removed with everything in it afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A size field of /proc/<pid>/status (resident memory by default) in MiB; 0 when the field is absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def stop_process(proc: subprocess.Popen[Any] | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; the child is always reaped."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class LineCollector:
    """A child's output lines, read on a thread so the pipe never fills and a test can search them.

    Each line's arrival time (`time.monotonic()`) is kept too, for benchmarks that time from a log line.
    """

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None, "the child's output must be a pipe"
        self.lines: list[str] = []
        self.times: list[float] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.times.append(time.monotonic())  # before the line: a reader never sees a line without its time
            self.lines.append(line)

    def stamped(self) -> list[tuple[float, str]]:
        """(arrival time, line) for every line read so far."""
        return list(zip(self.times, list(self.lines), strict=False))

    def text(self) -> str:
        return "".join(self.lines)

    def join(self, timeout: float) -> None:
        """Wait for the stream's end (the child exited), so that `lines` holds all it wrote."""
        self._thread.join(timeout)

    def tail(self, count: int = 40) -> str:
        return "".join(self.lines[-count:])


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (all its threads'), [] once it is gone."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def http_request(host: str, port: int, path: str, method: str = "GET", timeout: float = 3.0,
                 body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One plain HTTP/1.1 request: (status, body). Connection errors propagate (see `HTTP_NOT_YET`)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def scrape_metrics(port: int, accept: str, host: str = "127.0.0.1") -> tuple[str, bytes]:
    """GET /stats/prometheus with `accept`: (content type, body); anything but 200 fails the test."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/stats/prometheus", headers={"Accept": accept})
        response = conn.getresponse()
        assert response.status == 200, f"/stats/prometheus answered {response.status}"
        return response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def serving_addresses(proc: subprocess.Popen[str], log: LineCollector, timeout: float = 20.0) -> tuple[str, str]:
    """istiod-local's (plaintext, TLS) addresses once it logs them; AssertionError when it exits or stays silent."""

    def serving() -> re.Match[str] | None:
        if proc.poll() is not None:
            raise AssertionError(f"istiod-local exited with {proc.returncode}:\n{log.text()}")
        return next((m for m in map(SERVING_LINE.search, list(log.lines)) if m), None)

    match = poll(serving, "istiod-local to serve", timeout, log.text)
    return match.group(1), match.group(2)


def loaded_after(code: str) -> set[str]:
    """Modules loaded by `code` in a fresh interpreter, beyond what the interpreter loads by itself."""
    probe = f"import sys\nbefore = set(sys.modules)\n{code}\nprint(' '.join(sorted(set(sys.modules) - before)))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@contextlib.contextmanager
def loopback_netns(prefix: str) -> Iterator[str]:
    """A fresh named network namespace `<prefix><random>` with only its loopback up, deleted afterwards."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def netns_names() -> set[str]:
    """The named network namespaces (`ip netns list`), to check that a test left none of its own behind."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def host_links() -> set[str]:
    """The links of this (the host's) network namespace, to check that a test created or left none there."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}
