"""The CNI chain on the local node: pod ADD latency with istio-cni against the same chain without it, and
install-cni's reinstall latency after another writer drops our entry.

A real local node in CNI mode (istiod-local with its Kubernetes API, install-cni as the node agent, Debian's
loopback/bridge/host-local) plans `PODS` sidecar pods per arm, all listed in the registry so the plugin
finds them through the API and programs their capture. For each pod the container runtime's work is timed:
ADD of loopback on `lo`, then of the primary network on `eth0` (`CniRuntime.add`, plugins exec'd in the
node namespace). The two arms alternate pod by pod in the same run: "with" uses the conflist as
install-cni left it (bridge + host-local, then istio-cni: the pod lookup over HTTPS and iptables-restore
in the pod), "without" the same list with the istio-cni entry taken out. Every pod is deleted through the
chain (DEL) and its namespace removed before the next one, so the node never holds more than one.

Reinstall: `WRITES` times, the primary conflist is replaced (atomically, as a CNI daemon writes it) by a
version without our entry, and the time until install-cni has merged the entry back into the file is
measured (the file polled every millisecond); 0.3 s pass between writes.

Figures: median and p99 (nearest rank) of each arm in ms, the with/without ratio of the medians (aim
<= 2), reinstall p99 (aim <= 1000 ms). Needs root. Last line: JSON with `add_ratio_with_istio_cni`,
`add_ms_p50`, `add_ms_p99` (the chain with istio-cni), `reinstall_ms_p99`, and the other figures.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
import yaml
from launchers import RegistryFile, local_node

from istio_agent.node.cni_plan import container_id, loopback_attachment, pod_attachment
from istio_agent.node.cni_runtime import NetworkList, loopback_network
from istio_agent.node.plan import PodPlan, PodSpec, registry_workloads

PODS = int(os.environ.get("BENCH_PODS", "60"))
WRITES = int(os.environ.get("BENCH_WRITES", "25"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def time_add(node: object, network: NetworkList, plan: PodPlan, generation: int) -> float:
    """One pod's sandbox through the chain, timed from the first ADD to the last result; then torn down."""
    from istio_agent.node.local_node import LocalNode

    assert isinstance(node, LocalNode) and node.cni is not None
    runtime = node.cni.runtime
    sandbox = container_id(plan, generation)
    lo, eth0 = loopback_attachment(plan, sandbox), pod_attachment(plan, sandbox)
    subprocess.run(["ip", "netns", "add", plan.netns], check=True)
    try:
        start = time.perf_counter()
        runtime.add(loopback_network(), lo)
        runtime.add(network, eth0)
        elapsed = time.perf_counter() - start
        runtime.delete(network, eth0)
        runtime.delete(loopback_network(), lo)
    finally:
        subprocess.run(["ip", "netns", "delete", plan.netns], check=True)
    return elapsed * 1000


def without_istio_cni(network: NetworkList) -> NetworkList:
    plugins = tuple(p for p in network.plugins if p.type != "istio-cni")
    assert len(plugins) == len(network.plugins) - 1, "install-cni's entry is not in the conflist"
    return replace(network, plugins=plugins)


def reinstall_latencies(conflist: Path, original: str) -> list[float]:
    """Replace the conflist by one without our entry; ms until install-cni has put the entry back."""
    samples = []
    for i in range(WRITES):
        partial = conflist.with_name(f".bench-{i}.partial")
        partial.write_text(original)
        start = time.perf_counter()
        partial.replace(conflist)
        deadline = start + 10
        while True:
            try:
                if '"istio-cni"' in conflist.read_text():
                    break
            except OSError:
                pass
            if time.perf_counter() > deadline:
                raise SystemExit(f"install-cni did not reinstall within 10 s (write {i})")
            time.sleep(0.001)
        samples.append((time.perf_counter() - start) * 1000)
        time.sleep(0.3)
    return samples


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, the CNI plugins)")
    with local_node("bench-cni-", ready_timeout=60, capture="cni", cni_repair="off") as node:
        assert node.cni is not None
        plans = node.plan_pods([PodSpec(f"b-{i}", agent=False) for i in range(2 * PODS)])
        RegistryFile(node.registry, yaml.safe_dump({"workloads": registry_workloads(plans)}))
        node.start_istiod()
        with_cni = node.cni.primary_network()
        plain = without_istio_cni(with_cni)
        original = json.dumps(json.loads(node.cni.paths.conflist.read_text()) | {
            "plugins": [dict(p.config) for p in plain.plugins]}, indent=2)
        for plan in plans[:2]:  # warm-up: page cache, the plugin's first imports
            time_add(node, with_cni, plan, 0)
        samples: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(PODS):
            arms = [("with", with_cni, plans[2 * i]), ("without", plain, plans[2 * i + 1])]
            for arm, network, plan in arms if i % 2 == 0 else arms[::-1]:
                samples[arm].append(time_add(node, network, plan, i + 1))
        reinstall = reinstall_latencies(node.cni.paths.conflist, original)
    figures = {arm: (statistics.median(v), percentile(v, 0.99)) for arm, v in samples.items()}
    ratio = figures["with"][0] / figures["without"][0]
    summary = {
        "add_ratio_with_istio_cni": round(ratio, 2),
        "add_ms_p50": round(figures["with"][0], 1),
        "add_ms_p99": round(figures["with"][1], 1),
        "reinstall_ms_p99": round(percentile(reinstall, 0.99), 1),
        "add_ms_p50_without": round(figures["without"][0], 1),
        "add_ms_p99_without": round(figures["without"][1], 1),
        "reinstall_ms_p50": round(statistics.median(reinstall), 1),
        "pods_per_arm": PODS,
        "writes": WRITES,
    }
    print(f"pod ADD through loopback + bridge/host-local + istio-cni: p50 {summary['add_ms_p50']} ms, "
          f"p99 {summary['add_ms_p99']} ms; without istio-cni: p50 {summary['add_ms_p50_without']} ms, "
          f"p99 {summary['add_ms_p99_without']} ms ({PODS} pods each)", flush=True)
    print(f"with/without istio-cni (medians): {ratio:.2f}x (aim <= 2x); p99 ratio "
          f"{figures['with'][1] / figures['without'][1]:.2f}x", flush=True)
    print(f"install-cni reinstall after a conflicting write: p50 {summary['reinstall_ms_p50']} ms, p99 "
          f"{summary['reinstall_ms_p99']} ms over {WRITES} writes ({summary['reinstall_ms_p99'] / 1000:.2f} of the "
          f"1 s aim)", flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
