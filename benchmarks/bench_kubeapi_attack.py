"""istiod-local's Kubernetes API under attack: a plain pod GET and istiod-local's memory, idle and under load.

A real `istiod-local serve` with its Kubernetes API (default limits: 10 s request
deadline, 1,024 connection slots, at most 256 per address, 4 MiB per watcher,
1.5 MiB per object). The GET client (this process, its own address 127.0.0.2,
one kept-alive HTTPS connection re-opened when the server drops it) times a
`GET /api/v1/namespaces/default/pods/echo-1` every 20 ms; the attackers run in
a child process from eight other loopback addresses (127.0.0.10-17), CPU-bound
where they could be. istiod-local's resident size is sampled every 50 ms.

Phases, in one run against the same server:
1. idle: the GET's p50/p99, and an xDS request's time (a sidecar's first CDS
   answer on the plaintext port);
2. a JSON patch of twenty `copy` operations of the whole pod (870 bytes, the CNI's
   token): its answer's time and status, RSS before/after, an xDS request sent
   at the same moment;
3. 1,000 slow-drip TLS connections (the request line, then a byte every 5 s):
   the GET under them, how long until the server had closed them all, RSS peak,
   and RSS and open file descriptors once they are gone;
4. 500 watchers that never read, then twenty 1 MB status patches: each patch's
   time, the GET under them, RSS peak, and RSS once the watchers are gone;
5. repeated 1 MB patches (30, back to back, nobody watching): the GET under them;
6. idle again: the same GET (the baseline the ratios divide by is the better of
   the two idle phases).

Usage: python benchmarks/bench_kubeapi_attack.py
Last line: one JSON object: `get_p99_ratio_under_slowdrip`, `get_p99_ratio_under_watchers`,
`rss_growth_mb_max`, `rss_left_mb`, and the figures above.
"""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import IstiodLocal, RegistryFile
from support import open_workdir, rss_mb, stop_process

MESH = {
    "services": [{"name": "echo", "namespace": "default", "selector": {"app": "echo"},
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}],
    "workloads": [{"name": f"echo-{i}", "namespace": "default", "serviceAccount": "echo", "labels": {"app": "echo"},
                   "ip": f"10.244.0.{10 + i}"} for i in range(1, 6)],
}
POD = "/api/v1/namespaces/default/pods/echo-1"
CLIENT_ADDRESS = "127.0.0.2"
ATTACK_ADDRESSES = [f"127.0.0.{10 + i}" for i in range(8)]
SLOW_DRIP = 1000
WATCHERS = 500
FDS = 8192


def _raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FDS:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(FDS, hard), hard))


# ---- the attackers (a child process) -----------------------------------------------------------------


def _tls_socket(host: str, port: int, context: ssl.SSLContext, source: str) -> ssl.SSLSocket:
    raw = socket.create_connection((host, port), timeout=30, source_address=(source, 0))
    return context.wrap_socket(raw, server_hostname=host)


def _attack_main(kind: str, host: str, port: int, root: str, token: str, count: int) -> None:
    """Open `count` attacking connections, say so on stdout, keep them until stdin closes."""
    _raise_fd_limit()
    context = ssl.create_default_context(cadata=root)
    context.check_hostname = False
    sockets: list[ssl.SSLSocket] = []
    for n in range(count):
        conn = _tls_socket(host, port, context, ATTACK_ADDRESSES[n % len(ATTACK_ADDRESSES)])
        if kind == "drip":
            conn.sendall(b"GET /api/v1/pods HTTP/1.1\r\n")
        else:
            conn.sendall(f"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: kube\r\nAuthorization: Bearer {token}\r\n\r\n"
                         .encode())
            conn.recv(64)  # the response has started: from now on nothing is read
        sockets.append(conn)
    started = time.monotonic()
    print(f"open {len(sockets)}", flush=True)
    if kind == "watch":
        sys.stdin.read()
        return
    selector = selectors.DefaultSelector()
    for conn in sockets:
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
    open_ = set(sockets)
    next_drip = time.monotonic() + 5.0
    while open_:
        for key, _ in selector.select(timeout=max(0.0, next_drip - time.monotonic())):
            dripping: ssl.SSLSocket = key.fileobj  # type: ignore[assignment]
            try:
                data = dripping.recv(65536)
            except ssl.SSLWantReadError:
                continue
            except OSError:
                data = b""
            if not data or b"HTTP/1.1 408" in data:
                selector.unregister(dripping)
                open_.discard(dripping)
                dripping.close()
        if time.monotonic() >= next_drip:
            for dripping in list(open_):
                try:
                    dripping.send(b"X")
                except OSError:
                    pass
            next_drip += 5.0
    print(f"closed {time.monotonic() - started:.2f}", flush=True)
    sys.stdin.read()


class Attack:
    def __init__(self, kind: str, api: tuple[str, int], root: str, token: str, count: int) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--attack", kind, api[0], str(api[1]), str(count)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "BENCH_ROOT": root, "BENCH_TOKEN": token})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("open "):
            stop_process(self.proc)
            raise RuntimeError(f"the {kind} attacker did not start: {line!r}")
        self.opened = time.monotonic()

    def wait_closed(self, timeout: float) -> float | None:
        """Seconds from the last connection opened until the server had closed them all (slow drip)."""
        assert self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        return float(result[0].split()[1]) if result and result[0].startswith("closed") else None

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        stop_process(self.proc, grace=5)


# ---- this process: the GET client, patches, xDS, the sampler ---------------------------------------------


class Client:
    """HTTPS to the API from CLIENT_ADDRESS, one kept-alive connection (re-opened when dropped)."""

    def __init__(self, api: tuple[str, int], root: str, token: str) -> None:
        self.api, self.token = api, token
        self.context = ssl.create_default_context(cadata=root)
        self.context.check_hostname = False
        self.conn: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str = "application/merge-patch+json") -> tuple[int, bytes]:
        for attempt in range(3):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(*self.api, context=self.context, timeout=30,
                                                        source_address=(CLIENT_ADDRESS, 0))
            try:
                self.conn.request(method, path, body=body, headers={"Authorization": f"Bearer {self.token}",
                                                                    "Content-Type": content_type})
                response = self.conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


class Getter(threading.Thread):
    """Times a GET of the pod every 20 ms until stopped."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client, self.times, self.failures = client, list[float](), 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            start = time.perf_counter()
            try:
                status, _ = self.client.request("GET", POD)
            except OSError:
                status = 0
            if status == 200:
                self.times.append((time.perf_counter() - start) * 1000)
            else:
                self.failures += 1
            self._stop_event.wait(0.02)

    def finish(self) -> dict[str, float]:
        self._stop_event.set()
        self.join()
        return summary(self.times) | {"failures": self.failures}


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times) or [float("nan")]
    return {"n": len(times), "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2)}


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak = pid, rss_mb(pid)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.05):
            self.peak = max(self.peak, rss_mb(self.pid))

    def finish(self) -> float:
        self._stop_event.set()
        self.join()
        return self.peak


def xds_ms(istiod: IstiodLocal) -> float:
    """A sidecar's first CDS answer on the plaintext port (a new channel and stream)."""
    import grpc
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

    from istio_agent.protos import typeurls

    start = time.perf_counter()
    with grpc.insecure_channel(istiod.plaintext) as channel:
        stream = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources(iter([
            discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="sidecar~10.244.0.11~echo-1.default~default.svc."
                                                                 "cluster.local"), type_url=typeurls.CLUSTER)]))
        next(stream)
        elapsed = (time.perf_counter() - start) * 1000
        stream.cancel()
    return round(elapsed, 2)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(pid: int, seconds: float = 3.0) -> float:
    time.sleep(seconds)  # the server's memory trim runs a second after the last connection closed
    return rss_mb(pid)


def measured(client: Client, seconds: float) -> dict[str, float]:
    getter = Getter(client)
    getter.start()
    time.sleep(seconds)
    return getter.finish()


def status_patch(client: Client, size: int, n: int) -> tuple[int, float]:
    body = json.dumps({"status": {"message": f"{n % 10}" * size}}).encode()
    start = time.perf_counter()
    status, _ = client.request("PATCH", POD + "/status", body)
    return status, round((time.perf_counter() - start) * 1000, 1)


def run(base: Path) -> dict[str, Any]:
    with IstiodLocal(base / "state", registry=RegistryFile(base / "mesh.yaml", MESH),
                     kube_api_addr="127.0.0.1:0") as istiod:
        assert istiod.proc is not None
        pid = istiod.proc.pid
        istiod.kubeconfig(base / "k", identity="istio-system/istio-cni", service_account_dir=base / "sa")
        token, root = (base / "sa" / "token").read_text(), istiod.root_pem().decode()
        host, port = istiod.kube_api.rsplit(":", 1)
        api = (host, int(port))
        client = Client(api, root, token)
        out: dict[str, Any] = {}
        measured(client, 2.0)  # warm up
        start_rss = settle(pid, 1.0)
        out["rss_mb_start"] = round(start_rss, 1)
        out["idle"] = measured(client, 6.0)
        out["xds_ms_idle"] = statistics.median(xds_ms(istiod) for _ in range(5))
        print(f"idle: GET {out['idle']}, xDS {out['xds_ms_idle']} ms, RSS {start_rss:.0f} MB", flush=True)

        # 2. Twenty copies of the pod.
        copies = json.dumps([{"op": "copy", "from": "", "path": f"/x{n}"} for n in range(20)]).encode()
        before = rss_mb(pid)
        result: dict[str, Any] = {}
        patcher = threading.Thread(target=lambda: result.update(zip(("status", "ms"), _timed(
            client, "PATCH", POD, copies, "application/json-patch+json"), strict=True)))
        patcher.start()
        xds_during = xds_ms(istiod)
        patcher.join()
        out["copies"] = {"status": result["status"], "ms": result["ms"], "xds_ms_meanwhile": xds_during,
                         "rss_mb_change": round(rss_mb(pid) - before, 1), "bytes": len(copies)}
        print(f"20 copies: {out['copies']}", flush=True)

        # 3. Slow drip.
        sampler = Sampler(pid)
        sampler.start()
        fds_before, rss_before = fds(pid), rss_mb(pid)
        getter = Getter(client)
        getter.start()
        attack = Attack("drip", api, root, token, SLOW_DRIP)
        time.sleep(6.0)  # all of them open, dripping, within the server's 10 s request deadline
        out["slowdrip"] = getter.finish()
        closed_after = attack.wait_closed(60.0)
        attack.stop()
        peak = sampler.finish()
        rss_after = settle(pid)
        out["slowdrip"] |= {"all_closed_s": closed_after, "rss_mb_peak": round(peak, 1),
                            "rss_mb_after": round(rss_after, 1), "rss_mb_left": round(rss_after - rss_before, 1),
                            "fds_left": fds(pid) - fds_before}
        print(f"{SLOW_DRIP} slow-drip connections: {out['slowdrip']}", flush=True)

        # 4. Watchers that never read, and 1 MB status patches.
        rss_before = rss_mb(pid)
        sampler = Sampler(pid)
        sampler.start()
        attack = Attack("watch", api, root, token, WATCHERS)
        getter = Getter(Client(api, root, token))
        getter.start()
        patcher_client = Client(api, root, token)
        patches = [status_patch(patcher_client, 1_000_000, n) for n in range(20)]
        time.sleep(1.0)
        under_watchers = getter.finish()
        attack.stop()
        peak = sampler.finish()
        rss_after = settle(pid)
        out["watchers"] = under_watchers | {
            "patch_status": sorted({s for s, _ in patches}), "patch_ms_max": max(ms for _, ms in patches),
            "rss_mb_peak": round(peak, 1), "rss_mb_after": round(rss_after, 1),
            "rss_mb_left": round(rss_after - rss_before, 1)}
        print(f"{WATCHERS} watchers that never read + 20 patches of 1 MB: {out['watchers']}", flush=True)

        # 5. Repeated large patches, nobody watching.
        sampler = Sampler(pid)
        sampler.start()
        getter = Getter(client)
        getter.start()
        patches = [status_patch(patcher_client, 1_000_000, n) for n in range(30)]
        out["patches"] = getter.finish() | {"patch_ms_max": max(ms for _, ms in patches),
                                            "rss_mb_peak": round(sampler.finish(), 1)}
        print(f"30 patches of 1 MB: {out['patches']}", flush=True)

        # 6. Idle again, and what is left.
        out["idle_again"] = measured(client, 6.0)
        end_rss = settle(pid)
        out["rss_mb_end"] = round(end_rss, 1)
        print(f"idle again: GET {out['idle_again']}, RSS {end_rss:.0f} MB", flush=True)
        return out


def _timed(client: Client, method: str, path: str, body: bytes, content_type: str) -> tuple[int, float]:
    start = time.perf_counter()
    status, _ = client.request(method, path, body, content_type)
    return status, round((time.perf_counter() - start) * 1000, 1)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--attack":
        _, _, kind, host, port, count = sys.argv
        _attack_main(kind, host, int(port), os.environ["BENCH_ROOT"], os.environ["BENCH_TOKEN"], int(count))
        return
    _raise_fd_limit()
    with open_workdir("bench-kubeapi-") as base:
        out = run(base)
    idle_p99 = min(out["idle"]["p99_ms"], out["idle_again"]["p99_ms"])
    peaks = [out["slowdrip"]["rss_mb_peak"], out["watchers"]["rss_mb_peak"], out["patches"]["rss_mb_peak"]]
    figures = {
        "get_p99_ratio_under_slowdrip": round(out["slowdrip"]["p99_ms"] / idle_p99, 2),
        "get_p99_ratio_under_watchers": round(out["watchers"]["p99_ms"] / idle_p99, 2),
        "get_p99_ratio_under_patches": round(out["patches"]["p99_ms"] / idle_p99, 2),
        "rss_growth_mb_max": round(max(peaks) - out["rss_mb_start"], 1),
        "rss_left_mb": round(out["rss_mb_end"] - out["rss_mb_start"], 1),
        "get_p50_ms_idle": out["idle"]["p50_ms"], "get_p99_ms_idle": idle_p99,
        "copies_status": out["copies"]["status"], "copies_ms": out["copies"]["ms"],
        "copies_rss_mb_change": out["copies"]["rss_mb_change"], "xds_ms_idle": out["xds_ms_idle"],
        "xds_ms_during_copies": out["copies"]["xds_ms_meanwhile"],
        "slowdrip_all_closed_s": out["slowdrip"]["all_closed_s"],
        "slowdrip_rss_mb_left": out["slowdrip"]["rss_mb_left"], "slowdrip_fds_left": out["slowdrip"]["fds_left"],
        "watchers_rss_mb_peak": out["watchers"]["rss_mb_peak"], "watchers_rss_mb_left": out["watchers"]["rss_mb_left"],
        "watchers_patch_ms_max": out["watchers"]["patch_ms_max"],
        "get_failures": out["slowdrip"]["failures"] + out["watchers"]["failures"] + out["patches"]["failures"],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
