"""The agent's memory: idle, during and after a 5,000-cluster push, proxyless, each beside the Python floor.

One network namespace (so the sidecar's fixed ports are free), istiod-local in
it (15010 plaintext, 15012 TLS), and in turn:

- **sidecar**: `pilot-agent proxy sidecar` with the real Envoy and the DNS
  proxy on (ISTIO_META_DNS_CAPTURE=true), as in the issue's demo (TLS + token
  to 15012). Idle RSS/RssAnon once Envoy has its first config and the agent
  has had `IDLE_SECONDS` to settle; then the registry goes from 1 service to
  1,000 services x 5 ports (5,000 clusters, the push of `bench_xds.py`, whose
  machinery this reuses) and the agent's VmRSS is sampled every 50 ms until
  Envoy has all of them active and nothing warms (the peak), then again
  `STEADY_SECONDS` (30) after that (steady);
- **proxyless**: the sidecar agent stopped, `pilot-agent proxy sidecar` with
  the grpc-agent template's environment (DISABLE_ENVOY, ISTIO_META_GENERATOR=
  grpc, OUTPUT_CERTS), idle once its status port is ready.

Every figure is the `pilot-agent` Python process alone (/proc/PID/status:
VmRSS and RssAnon; Envoy is another process), printed beside the floor: a
fresh interpreter that imports only asyncio, grpc (with grpc.aio),
cryptography's x509 and EC, and the protobuf runtime (`any_pb2`). File-backed
pages (RssFile: shared libraries, mostly) are shared by every agent of a node
running one image; anonymous pages are what each pod costs.

Then the import budget: one fresh interpreter importing the floor's groups and
then the agent's modules group by group in the order the agent loads them,
RSS and RssAnon after each; and the top `python -X importtime` entries of
`istio_agent.cli.pilot_agent` (what `pilot-agent` loads before it parses
flags) and of everything the sidecar agent loads.

**Upstream's Go agent** is the second arm in the same namespace, istiod-local
and registry (`upstream_arm.py`): the same sidecar run (idle, peak, steady
around the same push) and the same proxyless run, after ours. Both agents
run the same Envoy binary. `*_vs_upstream` is ours / the Go agent's.
Per-pod USS and PSS with 20 agents of each at once on one node are
`bench_memory_node.py`'s.

Needs root (network namespaces). `BENCH_SERVICES` (1000), `BENCH_STEADY_SECONDS`
(30), `BENCH_IDLE_SECONDS` (5) and `BENCH_AGENT_ENV` (JSON: extra environment for
both agents, e.g. allocator settings to try) change the run. Prints figures and,
last, one JSON object: `{"rss_idle_mb", "anon_idle_mb", "rss_steady_5k_mb",
"anon_steady_5k_mb", "rss_peak_5k_mb", "rss_proxyless_mb", "anon_proxyless_mb",
"python_floor_mb", "idle_over_floor_mb", "upstream_rss_idle_mb", ..., "rss_idle_vs_upstream",
"anon_idle_vs_upstream", "rss_steady_5k_vs_upstream", "rss_peak_5k_vs_upstream", "rss_proxyless_vs_upstream",
...}` (`"upstream": "<why>"` in place of the upstream figures when its commands are missing).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_xds: its arm, registries and push
from bench_xds import PORTS, SERVICES, Arm, RssSampler, push_once, small_registry
from launchers import PilotAgent, pod_files
from support import HTTP_NOT_YET, compile_sources, poll, rss_mb
from upstream_arm import GO, OURS, missing, ratio, say_missing, sidecar_environment, start_agent

STEADY_SECONDS = float(os.environ.get("BENCH_STEADY_SECONDS", "30"))
IDLE_SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "5"))
PY = sys.executable
COMPONENT_LINE = re.compile(r"start(?:ing|ed (\S+)): VmRSS ([\d.]+) MB, RssAnon ([\d.]+) MB")

# The floor: what any agent of this design (asyncio, gRPC, X.509/EC, protobuf) holds before its own code.
FLOOR_GROUPS: list[tuple[str, str]] = [
    ("interpreter", "pass"),
    ("asyncio", "import asyncio"),
    ("grpc", "import grpc, grpc.aio"),
    ("cryptography x509+EC", "from cryptography import x509\nfrom cryptography.hazmat.primitives.asymmetric import ec"),
    ("protobuf", "from google.protobuf import any_pb2"),
]
# The agent's own modules, in the order a sidecar agent loads them (cli, options, stage 1, stage 2).
AGENT_GROUPS: list[tuple[str, str]] = [
    ("cli (click, logging)", "import istio_agent.cli.pilot_agent"),
    ("options", "import istio_agent.agent.run"),
    ("metrics (istio_agent.metrics)", "import istio_agent.metrics, istio_agent.status.agent_metrics"),
    ("identity + SDS", "import istio_agent.security.ca_client, istio_agent.security.identity,"
                       " istio_agent.security.sds"),
    ("assembly + trimmer", "import istio_agent.agent.assembly, istio_agent.memory"),
    ("DNS proxy", "import istio_agent.dns.proxy"),
    ("XDS proxy", "import istio_agent.xds.proxy"),
    ("Envoy admin + supervisor", "import istio_agent.envoy.admin, istio_agent.envoy.supervisor"),
    ("status server", "import istio_agent.status.server, istio_agent.status.probes.prober,"
                      " istio_agent.status.merged_metrics.handler, istio_agent.status.ndsz,"
                      " istio_agent.status.secrets_debug"),
    ("gRPC bootstrap (proxyless)", "import istio_agent.grpcxds"),
]
STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile")
PROBE = (  # noqa: UP031 - the braces of the code inside stay literal
    "import gc, json, sys\n"
    "def status():\n"
    "    gc.collect()\n"
    "    out = {}\n"
    "    for line in open('/proc/self/status'):\n"
    "        key, _, value = line.partition(':')\n"
    "        if key in %r:\n"
    "            out[key] = int(value.split()[0]) / 1024\n"
    "    return out\n"
    "for name, code in json.loads(sys.argv[1]):\n"
    "    exec(code)\n"
    "    print(json.dumps([name, status()]), flush=True)\n"
) % (STATUS_FIELDS,)


def group_figures(groups: list[tuple[str, str]]) -> list[tuple[str, dict[str, float]]]:
    """RSS/RssAnon/RssFile (MiB) of one fresh interpreter after each import group, in order."""
    done = subprocess.run([PY, "-c", PROBE, json.dumps(groups)], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"})
    if done.returncode != 0:
        raise RuntimeError(f"the import probe failed:\n{done.stderr[-3000:]}")
    return [(name, figures) for name, figures in map(json.loads, done.stdout.splitlines())]


def floor() -> dict[str, float]:
    """The floor process (median of three fresh interpreters, each importing only the floor's groups)."""
    runs = [group_figures(FLOOR_GROUPS)[-1][1] for _ in range(3)]
    return {field: statistics.median(run[field] for run in runs) for field in STATUS_FIELDS}


def import_budget() -> list[tuple[str, dict[str, float]]]:
    return group_figures(FLOOR_GROUPS + AGENT_GROUPS)


def importtime_entries(code: str) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) of each import `python -X importtime -c code` reports."""
    done = subprocess.run([PY, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"importtime failed:\n{done.stderr[-3000:]}")
    entries = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        entries.append((int(self_us), int(cumulative_us), name.rstrip()))
    return entries


def importtime_top(code: str, top: int = 12) -> tuple[float, list[tuple[int, int, str]]]:
    """(total ms, the `top` entries by self time) of what `code` imports beyond the interpreter's own start
    (site, encodings: what `python -c pass` imports too)."""
    startup = {name.strip() for _, _, name in importtime_entries("pass")}
    entries = [e for e in importtime_entries(code) if e[2].strip() not in startup]
    total = sum(e[0] for e in entries) / 1000
    return total, sorted(entries, reverse=True)[:top]


# ---- the agents -----------------------------------------------------------------------------------


def extra_env() -> dict[str, str]:
    extra: dict[str, str] = json.loads(os.environ.get("BENCH_AGENT_ENV", "{}"))
    return extra


def start_sidecar(arm: Arm, pod: Path, implementation: str = OURS) -> PilotAgent:
    environment = sidecar_environment(base={**os.environ, **extra_env()}, ISTIO_META_DNS_CAPTURE="true")
    # agent:debug: our agent logs its RSS before its first component and after each start (the budget).
    args = ["proxy", "sidecar", "--log_output_level=default:info" + (",agent:debug" if implementation == OURS else "")]
    arm.agent = start_agent(implementation, pod, environment, args=args, prefix=arm.prefix(),
                            log_file=arm.dir / f"agent-{implementation}.log")
    return arm.agent


def component_budget(log_text: str) -> list[tuple[str, float, float]]:
    """(component, VmRSS, RssAnon) from the agent's `starting:`/`started <name>:` debug lines, in order."""
    out = []
    for match in COMPONENT_LINE.finditer(log_text):
        out.append((match.group(1) or "(before the first)", float(match.group(2)), float(match.group(3))))
    return out


def start_proxyless(arm: Arm, pod: Path, implementation: str = OURS) -> PilotAgent:
    """The grpc-agent template's agent (as tests/component/test_proxyless_agent.py starts it). Its OUTPUT_CERTS
    directory exists, as the template's volume does (upstream's agent does not make it)."""
    (pod / "var/lib/istio/data").mkdir(parents=True, exist_ok=True)
    environment = sidecar_environment(
        pod="sleep-1", service_account="sleep",
        proxy_config={"configPath": str(pod / "etc/istio/proxy")}, base={**os.environ, **extra_env()},
        ISTIO_META_GENERATOR="grpc", DISABLE_ENVOY="true", OUTPUT_CERTS=str(pod / "var/lib/istio/data"),
        PILOT_CERT_PROVIDER="istiod", ISTIO_META_CLUSTER_ID="Kubernetes", TRUST_DOMAIN="cluster.local")
    args = ["proxy", "sidecar", "--domain", "default.svc.cluster.local", "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info,agent:debug"]
    return start_agent(implementation, pod, environment, args=args, prefix=arm.prefix(),
                       log_file=arm.dir / f"proxyless-{implementation}.log")


def status_ready(arm: Arm, port: int = 15020) -> bool:
    def call() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/healthz/ready")
            return conn.getresponse().status
        finally:
            conn.close()

    return arm.admin_thread.submit(call).result() == 200


def memory(pid: int) -> dict[str, float]:
    return {field: rss_mb(pid, field) for field in STATUS_FIELDS}


def settle_and_measure(pid: int, seconds: float) -> dict[str, float]:
    """Median of one sample a second over the last half of `seconds` (after it has had the first half to settle)."""
    time.sleep(seconds / 2)
    samples = []
    for _ in range(max(1, int(seconds / 2))):
        samples.append(memory(pid))
        time.sleep(1.0)
    return {field: statistics.median(s[field] for s in samples) for field in STATUS_FIELDS}


def beside(name: str, figures: dict[str, float], base: dict[str, float]) -> str:
    return (f"{name:28s} RSS {figures['VmRSS']:6.1f} MB ({figures['VmRSS'] / base['VmRSS']:.2f}x floor, "
            f"+{figures['VmRSS'] - base['VmRSS']:5.1f}), anonymous {figures['RssAnon']:5.1f} MB "
            f"({figures['RssAnon'] / base['RssAnon']:.2f}x, +{figures['RssAnon'] - base['RssAnon']:5.1f}), "
            f"file-backed {figures['RssFile']:5.1f} MB")


def run_sidecar(arm: Arm, pod: Path, implementation: str = OURS) -> dict[str, Any]:
    agent = start_sidecar(arm, pod, implementation)
    started = time.monotonic()
    poll(arm.settled, "the agent's Envoy", 60, agent.output, retry_on=HTTP_NOT_YET)
    print(f"sidecar agent ({implementation}): Envoy has its first config {time.monotonic() - started:.1f} s after "
          "the start", flush=True)
    arm.baseline = poll(arm.settled, "Envoy's first config", 30, retry_on=HTTP_NOT_YET)
    idle = settle_and_measure(agent.pid, IDLE_SECONDS)
    components = component_budget(agent.output(lines=100_000))
    target = arm.baseline + SERVICES * len(PORTS)
    sampler = RssSampler(agent.pid)
    try:
        sampler.phase = "push"
        from_push, _ = push_once(arm, target)
        poll(lambda: arm.settled(target), "Envoy to settle on the big config", 120, retry_on=HTTP_NOT_YET)
        settled_at = time.monotonic()
        sampler.phase = "after"
        curve = []  # how soon freed memory goes back (the trimmer: 1 s after a burst, every 15 s)
        for at in (1.0, 3.0, 10.0):
            if at < STEADY_SECONDS:
                time.sleep(max(0.0, settled_at + at - time.monotonic()))
                curve.append((at, memory(agent.pid)["VmRSS"]))
        time.sleep(max(0.0, settled_at + STEADY_SECONDS - time.monotonic()))
        steady = memory(agent.pid)
        sampler.phase = "done"
    finally:
        sampler.stop()
    peak = max(sampler.values("push") + sampler.values("after"))
    return {"idle": idle, "steady": steady, "components": components, "curve": curve, "peak": peak,
            "hwm": rss_mb(agent.pid, "VmHWM"), "push_s": from_push, "settled_s": settled_at - started,
            "clusters": target}


def run_proxyless(arm: Arm, pod: Path, implementation: str = OURS
                  ) -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """The proxyless agent's idle figures and its per-component budget (ours only: the Go agent logs none)."""
    agent = start_proxyless(arm, pod, implementation)
    try:
        poll(lambda: agent.alive() and status_ready(arm), "the proxyless agent's readiness", 60, agent.output,
             retry_on=HTTP_NOT_YET)
        if not (pod / "etc/istio/proxy/grpc-bootstrap.json").exists():
            raise RuntimeError(f"the proxyless agent wrote no gRPC bootstrap:\n{agent.output()}")
        return settle_and_measure(agent.pid, IDLE_SECONDS), component_budget(agent.output(lines=100_000))
    finally:
        agent.kill()


def back_to_small(arm: Arm) -> None:
    """The registry back to its one service, and istiod-local's push of it done."""
    before = len(arm.pushes())
    arm.registry.write(small_registry())
    poll(lambda: len(arm.pushes()) > before, "istiod-local to push the small registry", 60)


def print_budget(title: str, components: list[tuple[str, float, float]], idle: dict[str, float]) -> None:
    print(f"{title}, RSS after each component (+ over the previous; anonymous in brackets):")
    previous_rss, previous_anon = None, None
    for name, rss, anon in components:
        delta = "" if previous_rss is None else f"  +{rss - previous_rss:5.1f} (+{anon - (previous_anon or 0):5.1f})"
        print(f"  {name:28s} RSS {rss:6.1f}  anonymous {anon:5.1f}{delta}")
        previous_rss, previous_anon = rss, anon
    print(f"  {'idle':28s} RSS {idle['VmRSS']:6.1f}  anonymous {idle['RssAnon']:5.1f}")


def main() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("bench_memory needs root and iproute2 (network namespaces)", file=sys.stderr)
        sys.exit(2)
    compile_sources()
    base_figures = floor()
    print(beside("floor process", base_figures, base_figures), flush=True)
    base = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    state = base / "state"
    arm = Arm("memory", base, state)
    why_not = missing("pilot-agent")
    implementations = [OURS] if why_not else [OURS, GO]
    sidecars: dict[str, dict[str, Any]] = {}
    proxyless_runs: dict[str, tuple[dict[str, float], list[tuple[str, float, float]]]] = {}
    try:
        arm.create()
        pods = {}
        for implementation in implementations:
            pod, proxyless_pod = arm.dir / f"pod-{implementation}", arm.dir / f"proxyless-pod-{implementation}"
            pod.mkdir()
            proxyless_pod.mkdir()
            pod_files(state, pod, pod="echo-1")
            pod_files(state, proxyless_pod, service_account="sleep", pod="sleep-1")
            pods[implementation] = (pod, proxyless_pod)
        arm.start_istiod()
        for implementation in implementations:
            if sidecars:  # the registry back to one service before the next agent starts
                back_to_small(arm)
            sidecars[implementation] = run_sidecar(arm, pods[implementation][0], implementation)
            assert arm.agent is not None
            arm.agent.kill()
            arm.agent = None
        for implementation in implementations:
            proxyless_runs[implementation] = run_proxyless(arm, pods[implementation][1], implementation)
    finally:
        arm.stop()
        shutil.rmtree(base, ignore_errors=True)
    if why_not:
        say_missing("bench_memory", why_not)
    sidecar = sidecars[OURS]
    proxyless, proxyless_components = proxyless_runs[OURS]

    print(f"push of {sidecar['clusters']} clusters: all active {sidecar['push_s']:.1f} s after istiod's push")
    print(beside("sidecar idle (DNS on)", sidecar["idle"], base_figures))
    print(f"{'sidecar peak during push':28s} RSS {sidecar['peak']:6.1f} MB "
          f"({sidecar['peak'] / base_figures['VmRSS']:.2f}x floor; VmHWM over the whole run {sidecar['hwm']:.1f})")
    print(f"{'sidecar after the push':28s} RSS " + ", ".join(f"{mb:.1f} MB at {at:g} s" for at, mb in sidecar["curve"]))
    print(beside(f"sidecar steady ({STEADY_SECONDS:g} s after)", sidecar["steady"], base_figures))
    print(beside("proxyless idle", proxyless, base_figures), flush=True)
    upstream_figures = {}
    if GO in sidecars:
        go, (go_proxyless, _) = sidecars[GO], proxyless_runs[GO]
        print(f"upstream's Go agent, same namespace, istiod-local, Envoy and push ({go['clusters']} clusters, all "
              f"active {go['push_s']:.1f} s after istiod's push):")
        print(beside("  Go sidecar idle (DNS on)", go["idle"], base_figures))
        print(f"{'  Go sidecar peak during push':28s} RSS {go['peak']:6.1f} MB (VmHWM {go['hwm']:.1f})")
        print(beside(f"  Go sidecar steady ({STEADY_SECONDS:g} s)", go["steady"], base_figures))
        print(beside("  Go proxyless idle", go_proxyless, base_figures))
        upstream_figures = {
            "upstream_rss_idle_mb": round(go["idle"]["VmRSS"], 1),
            "upstream_anon_idle_mb": round(go["idle"]["RssAnon"], 1),
            "upstream_rss_steady_5k_mb": round(go["steady"]["VmRSS"], 1),
            "upstream_anon_steady_5k_mb": round(go["steady"]["RssAnon"], 1),
            "upstream_rss_peak_5k_mb": round(go["peak"], 1),
            "upstream_rss_proxyless_mb": round(go_proxyless["VmRSS"], 1),
            "upstream_anon_proxyless_mb": round(go_proxyless["RssAnon"], 1),
            "rss_idle_vs_upstream": ratio(sidecar["idle"]["VmRSS"], go["idle"]["VmRSS"]),
            "anon_idle_vs_upstream": ratio(sidecar["idle"]["RssAnon"], go["idle"]["RssAnon"]),
            "rss_steady_5k_vs_upstream": ratio(sidecar["steady"]["VmRSS"], go["steady"]["VmRSS"]),
            "anon_steady_5k_vs_upstream": ratio(sidecar["steady"]["RssAnon"], go["steady"]["RssAnon"]),
            "rss_peak_5k_vs_upstream": ratio(sidecar["peak"], go["peak"]),
            "rss_proxyless_vs_upstream": ratio(proxyless["VmRSS"], go_proxyless["VmRSS"]),
            "anon_proxyless_vs_upstream": ratio(proxyless["RssAnon"], go_proxyless["RssAnon"]),
        }
        print("ours / upstream's: " + ", ".join(f"{k.removesuffix('_vs_upstream')} {v}"
                                                for k, v in upstream_figures.items() if k.endswith("_vs_upstream")),
              flush=True)

    print_budget("sidecar agent's start", sidecar["components"], sidecar["idle"])
    print_budget("proxyless agent's start", proxyless_components, proxyless)
    print("import budget (one fresh interpreter, MB after each group; + over the previous group):")
    previous: dict[str, float] | None = None
    for name, figures in import_budget():
        delta = "" if previous is None else (f"  +{figures['VmRSS'] - previous['VmRSS']:5.1f} RSS, "
                                             f"+{figures['RssAnon'] - previous['RssAnon']:5.1f} anonymous")
        print(f"  {name:28s} RSS {figures['VmRSS']:6.1f}  anonymous {figures['RssAnon']:5.1f}{delta}")
        previous = figures
    for title, code in [("istio_agent.cli.pilot_agent", "import istio_agent.cli.pilot_agent"),
                        ("the sidecar agent's modules", "\n".join(code for _, code in AGENT_GROUPS[:-1]))]:
        total, entries = importtime_top(code)
        print(f"python -X importtime of {title}: {total:.0f} ms of imports; top by self time (self ms, cumulative ms):")
        for self_us, cumulative_us, name in entries:
            print(f"  {self_us / 1000:7.1f} {cumulative_us / 1000:7.1f}  {name.strip()}")

    idle, steady = sidecar["idle"], sidecar["steady"]
    print(json.dumps({
        "rss_idle_mb": round(idle["VmRSS"], 1),
        "anon_idle_mb": round(idle["RssAnon"], 1),
        "rss_steady_5k_mb": round(steady["VmRSS"], 1),
        "anon_steady_5k_mb": round(steady["RssAnon"], 1),
        "rss_peak_5k_mb": round(sidecar["peak"], 1),
        "rss_proxyless_mb": round(proxyless["VmRSS"], 1),
        "anon_proxyless_mb": round(proxyless["RssAnon"], 1),
        "python_floor_mb": round(base_figures["VmRSS"], 1),
        "idle_over_floor_mb": round(idle["VmRSS"] - base_figures["VmRSS"], 1),
        "python_floor_anon_mb": round(base_figures["RssAnon"], 1),
        "anon_idle_over_floor_mb": round(idle["RssAnon"] - base_figures["RssAnon"], 1),
        "rss_proxyless_over_floor_mb": round(proxyless["VmRSS"] - base_figures["VmRSS"], 1),
        "clusters": sidecar["clusters"],
        "steady_seconds": STEADY_SECONDS,
        **(upstream_figures or {"upstream": why_not}),
    }))


if __name__ == "__main__":
    main()
