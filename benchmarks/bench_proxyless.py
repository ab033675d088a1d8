"""Proxyless gRPC against the same RPCs through two Envoy sidecars, on one local node (needs root).

One node (`istiod_local.node`), istiod-local on its gateway, the `default`
namespace STRICT, so both arms speak mTLS between the pods:

- **proxyless**: `pl-server` runs the greeter with `grpc.server(..., xds=True)`
  beside a proxyless agent (Istio's grpc-agent template); `pl-client` is a
  proxyless pod whose app container runs the load generator against
  `xds:///greeter.default.svc.cluster.local:7070` (grpcio's own xDS client and
  mTLS from the agent's certificates);
- **sidecar**: `sc-server` runs the same greeter as a plain gRPC server behind
  an Envoy sidecar (capture by istio-iptables); `sc-client` runs the same load
  generator in plain mode against the service VIP `10.96.0.40:7072`, captured
  by its own Envoy, which opens mTLS to the server's Envoy.

Each run of the load generator (`grpc_apps bench`) warms up, then measures
sequential unary RPC latency (p50, p99) for `SECONDS`, then throughput with
`CONCURRENCY` RPCs in flight for `SECONDS`. The two arms alternate for `ROUNDS`
rounds (order flipped every round) and medians are compared. The Python gRPC
client and server are the same in both arms; what differs is the two Envoys
(and their extra hops) versus grpc-core's own xDS and TLS. Both Envoys run one
worker (the node's default `--concurrency 1`).

Afterwards: the RSS (VmRSS) of the proxyless agents (the `pilot-agent` Python
process; the Go agent uses about 25 MiB) and, for context, of the sidecar
agents (without their Envoy).

Prints figures and, last, one JSON object:
`{"proxyless_p50_ratio_vs_sidecar", "proxyless_rps_ratio_vs_sidecar", "agent_rss_mb_proxyless", ...}`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from istiod_local.node import proxyless
from istiod_local.node.demo import registry_yaml, ssl_handshakes
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import RegistryFile, local_node
from support import poll, rss_mb

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
PY = sys.executable
APPS = [PY, "-m", "istiod_local.node.grpc_apps"]
PROXYLESS_TARGET = "xds:///greeter.default.svc.cluster.local:7070"
SIDECAR_VIP = "10.96.0.40"
SIDECAR_TARGET = f"{SIDECAR_VIP}:7072"
SERVICES: list[dict[str, Any]] = [
    {"name": "greeter", "namespace": "default", "selector": {"app": "greeter"}, "clusterIP": "10.96.0.30",
     "ports": [{"name": "grpc", "port": 7070, "targetPort": 50051, "protocol": "GRPC"}]},
    {"name": "greeter-sc", "namespace": "default", "selector": {"app": "greeter-sc"}, "clusterIP": SIDECAR_VIP,
     "ports": [{"name": "grpc", "port": 7072, "targetPort": 50052, "protocol": "GRPC"}]},
]
STATS = {"proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]}}


def pod_specs() -> list[PodSpec]:
    return [
        PodSpec("pl-server", service_account="greeter", labels={"app": "greeter"}, proxyless=True,
                app=[*APPS, "serve", "--port", "50051"]),
        PodSpec("pl-client", service_account="sleep", labels={"app": "sleep"}, proxyless=True),
        PodSpec("sc-server", service_account="greeter", labels={"app": "greeter-sc"},
                app=[*APPS, "serve", "--plain", "--port", "50052"]),
        PodSpec("sc-client", service_account="sleep", labels={"app": "sleep-sc"}),
    ]


def app_container(node: LocalNode, pod: Pod, argv: list[str]) -> list[str]:
    """`kubectl exec -c app` for a proxyless pod: a new process in an app container (volumes, GRPC_XDS_BOOTSTRAP)."""
    mounts = proxyless.volume_mounts(str(pod.dir), proxyless.APP_VOLUMES)
    return proxyless.in_container(pod.netns, mounts, argv)


def run_json(argv: list[str], env: dict[str, str] | None, timeout: float) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"{argv[-8:]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


class Arms:
    def __init__(self, node: LocalNode, pods: dict[str, Pod]) -> None:
        self.node, self.pods = node, pods
        client = pods["pl-client"]
        self.proxyless_env = proxyless.app_environment(client.plan, os.environ)

    def proxyless(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        argv = app_container(self.node, self.pods["pl-client"], [*APPS, *args])
        return run_json(argv, self.proxyless_env, timeout)

    def sidecar(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
        return run_json(self.node.in_pod(self.pods["sc-client"], [*APPS, *args]), env, timeout)

    def bench(self, arm: str) -> dict[str, Any]:
        common = ["--seconds", str(SECONDS), "--concurrency", str(CONCURRENCY)]
        if arm == "proxyless":
            return self.proxyless("bench", "--target", PROXYLESS_TARGET, *common)
        return self.sidecar("bench", "--plain", "--target", SIDECAR_TARGET, *common)


def check_mtls(arms: Arms) -> None:
    """Both arms really are mTLS between the pods, with the client's identity, before anything is timed."""
    seen = arms.proxyless("call", "--target", PROXYLESS_TARGET, "--timeout", "30")
    assert seen.get("ok") and seen["reply"]["transport_security_type"] == ["tls"], seen
    assert seen["reply"]["identities"] == ["spiffe://cluster.local/ns/default/sa/sleep"], seen
    answer = poll(lambda: (a := arms.sidecar("call", "--plain", "--target", SIDECAR_TARGET, "--timeout", "5"))
                  .get("ok") and a, "the sidecar arm to answer", 60, interval=0.5)
    assert answer["reply"]["transport_security_type"] != ["tls"], answer  # the server app sees its Envoy
    outbound = ssl_handshakes(arms.node, arms.pods["sc-client"], "outbound|7072||greeter-sc.default.svc.cluster.local")
    assert outbound >= 1, "the sidecar arm did not go through mTLS between the Envoys"
    print(f"mTLS checked: proxyless peer {seen['reply']['identities'][0]}; "
          f"sidecar client Envoy TLS handshakes to greeter-sc: {outbound}")


def main() -> int:
    if os.geteuid() != 0:
        print("bench_proxyless needs root (network namespaces)", file=sys.stderr)
        return 2
    with local_node("ia-bench-proxyless-", ready_timeout=60, proxy_config=STATS) as node:
        plans = node.plan_pods(pod_specs())
        RegistryFile(node.registry).write(registry_yaml(plans, SERVICES, "STRICT"))
        node.start_istiod()
        pods = {pod.name: pod for pod in node.add_pods(plans)}
        node.wait_ready(pods.values(), {"pl-server": 50051, "sc-server": 50052})
        arms = Arms(node, pods)
        check_mtls(arms)
        results: dict[str, list[dict[str, Any]]] = {"proxyless": [], "sidecar": []}
        for round_ in range(ROUNDS):
            order = ["proxyless", "sidecar"] if round_ % 2 == 0 else ["sidecar", "proxyless"]
            for arm in order:
                result = arms.bench(arm)
                results[arm].append(result)
                print(f"round {round_ + 1} {arm:9s}: p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, "
                      f"{result['rps']:.0f} RPC/s at {CONCURRENCY} in flight, errors {result['errors']}", flush=True)
        agents = {name: rss_mb(pod.agent.pid) for name, pod in pods.items() if pod.agent is not None}

    def median(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in results[arm])

    summary = {arm: {key: median(arm, key) for key in ("p50_ms", "p99_ms", "rps")} for arm in results}
    for arm, figures in summary.items():
        print(f"{arm:9s} median: p50 {figures['p50_ms']:.3f} ms, p99 {figures['p99_ms']:.3f} ms, "
              f"{figures['rps']:.0f} RPC/s")
    print("agent RSS (MiB): " + ", ".join(f"{name} {mb:.1f}" for name, mb in sorted(agents.items()))
          + " (sidecar agents without their Envoy; the Go agent in proxyless mode: about 25 MiB)")
    proxyless_rss = max(agents["pl-server"], agents["pl-client"])
    print(json.dumps({
        "proxyless_p50_ratio_vs_sidecar": round(summary["proxyless"]["p50_ms"] / summary["sidecar"]["p50_ms"], 3),
        "proxyless_rps_ratio_vs_sidecar": round(summary["proxyless"]["rps"] / summary["sidecar"]["rps"], 3),
        "agent_rss_mb_proxyless": round(proxyless_rss, 1),
        "proxyless_p50_ms": round(summary["proxyless"]["p50_ms"], 3),
        "proxyless_p99_ms": round(summary["proxyless"]["p99_ms"], 3),
        "sidecar_p50_ms": round(summary["sidecar"]["p50_ms"], 3),
        "sidecar_p99_ms": round(summary["sidecar"]["p99_ms"], 3),
        "proxyless_rps": round(summary["proxyless"]["rps"]),
        "sidecar_rps": round(summary["sidecar"]["rps"]),
        "agent_rss_mb_sidecar": round(max(agents["sc-server"], agents["sc-client"]), 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
