"""xDS push end to end: istiod-local → the agent's XDS proxy → Envoy, against Envoy straight on istiod-local.

Two network namespaces, one per arm, so both sidecars can use the fixed ports
and stay up for the whole run:

- **agent**: istiod-local (15010 plaintext, 15012 TLS) and `pilot-agent proxy
  sidecar` as in the issue's demo (TLS + token to 15012); Envoy gets ADS
  through the agent's `etc/istio/proxy/XDS` pipe;
- **direct**: another istiod-local and an Envoy started with the agent's own
  argv and rendered bootstrap, except that the `xds-grpc` cluster points at
  istiod-local's plaintext 15010. Its SDS cluster still uses the agent's SDS
  socket (the generated clusters need `default`/`ROOTCA`);
- **upstream**: a third namespace, istiod-local, and upstream's Go agent with
  its Envoy (the same binary, `upstream_arm.py`), Envoy's ADS through the Go
  agent's relay. Skipped, saying why, when upstream's commands are missing.

Each round rewrites one arm's registry from 1 service to `SERVICES` services x
5 ports (5,000 `outbound|…` clusters, each with an endpoint) and times how long
until Envoy's `cluster_manager.active_clusters` has all of them (CDS, then EDS
for each cluster, warmed). The clock starts when istiod-local logs that it
pushes the new mesh version (its file polling and parsing are the same for
both arms and excluded; the figure from the file write is printed too). Then
the registry goes back to 1 service and the arm settles. Arms alternate, the
order flips every round, and medians are compared. The agent's RSS (VmRSS of
the `pilot-agent` Python process alone) is sampled every 50 ms throughout.

Needs root (network namespaces). Prints figures and, last, one JSON object:
`{"push_ratio", "agent_rss_mb_steady", "agent_rss_mb_peak", ...}`.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import IstiodLocal, PilotAgent, RegistryFile, pod_files
from support import HTTP_NOT_YET, compile_sources, poll, rss_mb, stop_process
from upstream_arm import GO, OURS, missing, ratio, say_missing, sidecar_environment
from upstream_arm import start_agent as start_implementation

from istio_agent.capture import netns as capture_netns

SERVICES = int(os.environ.get("BENCH_SERVICES", "1000"))
PORTS = [("http", 80, "HTTP"), ("http2", 8081, "HTTP2"), ("grpc", 9090, "GRPC"), ("mysql", 3306, "TCP"),
         ("redis", 6379, "TCP")]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
PUSH_LINE = re.compile(r"mesh version (\d+):")


# ---- registry ------------------------------------------------------------------------------------


def small_registry() -> str:
    return (
        "services:\n"
        "- {name: echo, namespace: default, selector: {app: echo},"
        " ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]}\n"
        "workloads:\n"
        "- {name: echo-1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 127.0.0.1}\n"
    )


def big_registry(services: int) -> str:
    """`services` services with 5 ports each, one workload behind each, spread over 10 namespaces."""
    ports = ", ".join(f"{{name: {n}, port: {p}, targetPort: {p}, protocol: {proto}}}" for n, p, proto in PORTS)
    lines = [small_registry().split("workloads:\n")[0]]
    for i in range(services):
        lines.append(f"- {{name: svc-{i}, namespace: ns-{i % 10}, selector: {{app: svc-{i}}}, ports: [{ports}]}}\n")
    lines.append("workloads:\n")
    lines.append("- {name: echo-1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 127.0.0.1}\n")
    for i in range(services):
        lines.append(f"- {{name: svc-{i}-0, namespace: ns-{i % 10}, serviceAccount: svc-{i}, labels: {{app: svc-{i}}},"
                     f" ip: 10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}}}\n")
    return "".join(lines)


# ---- processes and namespaces --------------------------------------------------------------------


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


def enter_netns(name: str) -> None:
    """Move the calling thread (setns moves only the caller) into network namespace `name`."""
    capture_netns.enter_netns(f"/run/netns/{name}")


class Arm:
    """One side of the comparison: a namespace with its istiod-local and the Envoy under test."""

    def __init__(self, name: str, base: Path, state: Path) -> None:
        self.name = name
        self.netns = f"bx-{name}-{uuid.uuid4().hex[:6]}"
        self.dir = base / name
        self.dir.mkdir()
        self.registry = RegistryFile(self.dir / "mesh.yaml")
        self.state = state
        self.procs: list[subprocess.Popen[str]] = []
        self.istiod: IstiodLocal | None = None
        self.agent: PilotAgent | None = None
        # Admin calls run on a thread that lives in the arm's namespace.
        self.admin_thread = concurrent.futures.ThreadPoolExecutor(1, initializer=enter_netns, initargs=(self.netns,))
        self.baseline = 0
        self.pids: dict[str, int] = {}
        self.cpu: dict[str, list[float]] = {}

    def create(self) -> None:
        sh("ip", "netns", "add", self.netns)
        sh("ip", "-n", self.netns, "link", "set", "lo", "up")

    def spawn(self, argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
              stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*self.prefix(), *argv], cwd=cwd, env=env, text=True,
                                stdout=stdout, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_istiod(self) -> None:
        self.registry.write(small_registry())
        self.istiod = IstiodLocal(self.state, registry=self.registry, grpc_addr="127.0.0.1:15010",
                                  secure_addr="127.0.0.1:15012", prefix=self.prefix()).start(timeout=20)
        assert self.istiod.proc is not None
        self.pids["istiod"] = self.istiod.proc.pid

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def pushes(self) -> list[float]:
        """When istiod-local logged each push of a new mesh version (monotonic clock)."""
        assert self.istiod is not None
        return [t for t, line in self.istiod.log.stamped() if PUSH_LINE.search(line)]

    def admin(self, path: str) -> bytes:
        def call() -> bytes:
            conn = http.client.HTTPConnection("127.0.0.1", 15000, timeout=5)
            try:
                conn.request("GET", path)
                return conn.getresponse().read()
            finally:
                conn.close()

        return self.admin_thread.submit(call).result()

    def cluster_stats(self) -> dict[str, int]:
        body = self.admin("/stats?filter=" + "%5Ecluster_manager%5C.(active_clusters%7Cwarming_clusters%7Ccds%5C."
                                             "update_success)%24")
        out = {}
        for line in body.decode().splitlines():
            name, _, value = line.partition(": ")
            out[name] = int(value)
        return out

    def active_clusters(self) -> int:
        return self.cluster_stats().get("cluster_manager.active_clusters", 0)

    def settled(self, want: int | None = None) -> int | None:
        """The active cluster count once nothing warms (and it equals `want` when given)."""
        stats = self.cluster_stats()
        active = stats.get("cluster_manager.active_clusters", 0)
        if stats.get("cluster_manager.warming_clusters", 1) != 0 or stats.get("cluster_manager.cds.update_success",
                                                                              0) < 1:
            return None
        return active if want is None or active == want else None

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)
        if self.agent is not None:
            self.agent.kill()
        if self.istiod is not None:
            self.istiod.stop()
        self.admin_thread.shutdown()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """VmRSS of one process every 50 ms, with a label for the phase it was taken in."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[str, float]] = []
        self.phase = "idle"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss_mb(self, field: str = "VmRSS") -> float:
        return rss_mb(self.pid, field)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.samples.append((self.phase, self.rss_mb()))
            except OSError:
                return

    def values(self, phase: str) -> list[float]:
        return [value for p, value in self.samples if p == phase]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---- the two arms ---------------------------------------------------------------------------------


def start_agent(arm: Arm, pod: Path, implementation: str = OURS) -> PilotAgent:
    extra = json.loads(os.environ.get("BENCH_AGENT_ENV", "{}"))  # e.g. allocator settings to try
    environment = sidecar_environment(base={**os.environ, **extra})
    arm.agent = start_implementation(implementation, pod, environment, prefix=arm.prefix(),
                                     log_file=arm.dir / "agent.log")
    return arm.agent


def direct_bootstrap(agent_bootstrap: Path, out: Path) -> None:
    """The agent's bootstrap with `xds-grpc` on istiod-local's plaintext TCP port instead of the agent's pipe."""
    bootstrap = json.loads(agent_bootstrap.read_text())
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["name"] == "xds-grpc":
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            endpoint["address"] = {"socket_address": {"address": "127.0.0.1", "port_value": 15010}}
    out.write_text(json.dumps(bootstrap))


def push_once(arm: Arm, target: int) -> tuple[float, float]:
    """Push the big registry; (seconds from istiod's push to all clusters active, seconds from the file write).

    Also adds the CPU seconds each of the arm's processes spent to `arm.cpu`.
    """
    before = len(arm.pushes())
    cpu_before = {name: cpu_seconds(pid) for name, pid in arm.pids.items()}
    written = time.monotonic()
    arm.registry.write(big_registry(SERVICES))
    poll(lambda: arm.active_clusters() >= target, f"{arm.name}: {target} active clusters", 120, interval=0.01,
         retry_on=HTTP_NOT_YET)
    done = time.monotonic()
    for name, pid in arm.pids.items():
        arm.cpu.setdefault(name, []).append(cpu_seconds(pid) - cpu_before[name])
    pushes = arm.pushes()
    if len(pushes) <= before:
        log = arm.istiod.log.tail(30) if arm.istiod else ""
        raise RuntimeError(f"{arm.name}: istiod-local logged no push:\n{log}")
    return done - pushes[before], done - written


def shrink(arm: Arm) -> None:
    arm.registry.write(small_registry())
    poll(lambda: arm.settled(arm.baseline), f"{arm.name}: back to {arm.baseline} clusters", 60,
         retry_on=HTTP_NOT_YET)


def main() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("bench_xds needs root and iproute2 (network namespaces)", file=sys.stderr)
        sys.exit(2)
    compile_sources()
    base = Path(tempfile.mkdtemp(prefix="bench-xds-"))
    state = base / "state"
    why_not = missing("pilot-agent")
    agent_arm, direct_arm = Arm("agent", base, state), Arm("direct", base, state)
    go_arm = None if why_not else Arm(GO, base, state)
    arms = [arm for arm in (agent_arm, direct_arm, go_arm) if arm is not None]
    sampler: RssSampler | None = None
    try:
        pod = agent_arm.dir / "pod"
        pod.mkdir()
        for arm in arms:
            arm.create()
        # pod-files creates the shared state (root CA, token key) before any istiod starts.
        pod_files(state, pod, pod="echo-1")
        if go_arm is not None:
            pod_files(state, go_arm.dir / "pod", pod="echo-1")
        for arm in arms:
            arm.start_istiod()
        agent = start_agent(agent_arm, pod)
        poll(agent_arm.settled, "the agent's Envoy", 30, agent.output, retry_on=HTTP_NOT_YET)
        agent_envoy = poll(agent.envoy_pid, "the agent's Envoy process", 20)
        agent_arm.pids.update(agent=agent.pid, envoy=agent_envoy)
        argv = Path(f"/proc/{agent_envoy}/cmdline").read_bytes().decode().split("\0")[:-1]
        bootstrap = direct_arm.dir / "envoy-direct.json"
        direct_bootstrap(pod / "etc/istio/proxy/envoy-rev.json", bootstrap)
        argv[argv.index("-c") + 1] = str(bootstrap)
        # cwd = the pod dir, so the relative SDS pipe path is the agent's SDS socket.
        direct_arm.pids["envoy"] = direct_arm.spawn(argv, cwd=pod, stdout=(direct_arm.dir / "envoy.log").open("w")).pid
        if go_arm is not None:
            go = start_agent(go_arm, go_arm.dir / "pod", GO)
            poll(go_arm.settled, "the Go agent's Envoy", 30, go.output, retry_on=HTTP_NOT_YET)
            go_arm.pids.update(agent=go.pid, envoy=poll(go.envoy_pid, "the Go agent's Envoy process", 20))
        for arm in arms:
            arm.baseline = poll(arm.settled, f"{arm.name}: Envoy's first config", 30, retry_on=HTTP_NOT_YET)
        print("baseline clusters: " + ", ".join(f"{arm.name} {arm.baseline}" for arm in arms)
              + f"; pushing {SERVICES} services x {len(PORTS)} ports = {SERVICES * len(PORTS)} clusters")
        sampler = RssSampler(agent.pid)
        idle_mb = sampler.rss_mb()

        results: dict[str, list[tuple[float, float]]] = {arm.name: [] for arm in arms}
        for round_no in range(ROUNDS + 1):
            order = arms[round_no % len(arms):] + arms[:round_no % len(arms)]
            line = []
            for arm in order:
                sampler.phase = "push" if arm is agent_arm else "other"
                from_push, from_write = push_once(arm, arm.baseline + SERVICES * len(PORTS))
                sampler.phase = "other"
                shrink(arm)
                if round_no > 0:  # round 0 warms up every side
                    results[arm.name].append((from_push, from_write))
                line.append(f"{arm.name} {from_push * 1000:7.0f} ms (from write {from_write * 1000:6.0f})")
            line.append(f"agent RSS {sampler.rss_mb():.1f} MB")
            print(f"round {round_no}{' (warm-up)' if round_no == 0 else ''}: " + ";  ".join(line), flush=True)

        # Steady state: the big config in place through the agent, nothing in flight.
        target = agent_arm.baseline + SERVICES * len(PORTS)
        sampler.phase = "push"
        push_once(agent_arm, target)
        sampler.phase = "settle"
        poll(lambda: agent_arm.settled(target), "the agent's Envoy to settle", 60, retry_on=HTTP_NOT_YET)
        time.sleep(2.0)
        sampler.phase = "steady"
        time.sleep(2.0)
        sampler.phase = "done"
        steady_mb = statistics.median(sampler.values("steady"))
        peak_mb = max(sampler.values("push") or [0.0])
        hwm_mb = sampler.rss_mb("VmHWM")
        anon_mb, file_mb = sampler.rss_mb("RssAnon"), sampler.rss_mb("RssFile")

        ms = {name: statistics.median(r[0] for r in runs) * 1000 for name, runs in results.items()}
        write_ms = {name: statistics.median(r[1] for r in runs) * 1000 for name, runs in results.items()}
        # Mean over the measured rounds: a push's CPU is a few clock ticks (10 ms each), too coarse for a median.
        cpu = {arm.name: {name: statistics.fmean(values[1:]) for name, values in arm.cpu.items()} for arm in arms}
        agent_ms, direct_ms = ms["agent"], ms["direct"]
        ratio_direct = agent_ms / direct_ms
        best_ratio = min(r[0] for r in results["agent"]) / min(r[0] for r in results["direct"])
        print(f"median push of {SERVICES * len(PORTS)} clusters until all active: through the agent {agent_ms:.0f} ms, "
              f"direct {direct_ms:.0f} ms, ratio {ratio_direct:.3f} (best rounds: {best_ratio:.3f})")
        print(f"  from the registry write: agent {write_ms['agent']:.0f} ms, direct {write_ms['direct']:.0f} ms, "
              f"ratio {write_ms['agent'] / write_ms['direct']:.3f}")
        for arm in arms:
            print(f"  CPU seconds per push ({arm.name}, mean): "
                  + ", ".join(f"{name} {value:.2f}" for name, value in cpu[arm.name].items()))
        print(f"agent RSS: idle {idle_mb:.1f} MB, peak during pushes {peak_mb:.1f} MB (VmHWM {hwm_mb:.1f} MB), "
              f"steady after the push {steady_mb:.1f} MB (now: anonymous {anon_mb:.1f} MB, "
              f"file-backed {file_mb:.1f} MB, the latter mostly shared libraries)")
        upstream_figures: dict[str, Any] = {"upstream": why_not}
        if go_arm is not None:
            added, go_added = agent_ms - direct_ms, ms[GO] - direct_ms
            upstream_figures = {
                "upstream_push_ms": round(ms[GO]),
                "relay_added_ms": round(added),
                "upstream_relay_added_ms": round(go_added),
                "relay_added_ms_vs_upstream": ratio(max(added, 0.0), go_added),
                "push_vs_upstream": ratio(agent_ms, ms[GO]),
                "agent_cpu_per_push_s": round(cpu["agent"]["agent"], 3),
                "upstream_agent_cpu_per_push_s": round(cpu[GO]["agent"], 3),
                "agent_cpu_per_push_vs_upstream": ratio(cpu["agent"]["agent"], cpu[GO]["agent"]),
            }
            print(f"upstream's Go agent: push {ms[GO]:.0f} ms (from write {write_ms[GO]:.0f}); added over direct: "
                  f"ours {added:.0f} ms, Go's {go_added:.0f} ms -> {upstream_figures['relay_added_ms_vs_upstream']}; "
                  f"whole push ours / Go's {upstream_figures['push_vs_upstream']}; agent CPU per push "
                  f"ours {cpu['agent']['agent']:.3f} s, Go's {cpu[GO]['agent']:.3f} s -> "
                  f"{upstream_figures['agent_cpu_per_push_vs_upstream']}")
        else:
            say_missing("bench_xds", why_not)
        print(json.dumps({
            "push_ratio": round(ratio_direct, 3),
            "agent_rss_mb_steady": round(steady_mb, 1),
            "agent_rss_mb_peak": round(peak_mb, 1),
            "agent_push_ms": round(agent_ms),
            "direct_push_ms": round(direct_ms),
            "push_ratio_best": round(best_ratio, 3),
            "push_ratio_from_write": round(write_ms["agent"] / write_ms["direct"], 3),
            "agent_rss_mb_idle": round(idle_mb, 1),
            "clusters": SERVICES * len(PORTS),
            "rounds": ROUNDS,
            **upstream_figures,
        }))
    finally:
        if sampler is not None:
            sampler.stop()
        for arm in reversed(arms):
            arm.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
