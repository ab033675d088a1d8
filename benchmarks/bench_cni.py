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

Per plugin: each plugin exec of the timed ADDs is timed too (median ms per plugin type and arm), so a
missed aim says where the time goes.

The plugin's own start-up (issue 13): `START_RUNS` times, the installed `istio-cni` (install-cni's
launcher, answered on its fast path) is exec'd alone for a sidecar pod, from exec to its answer, which
comes after the rules are applied in the pod's netns; then the rules it left there (`iptables-save`,
turned back into the plugin's own restore input: `-N` chains and `-A` rules, no base-chain policies)
are loaded by a bare `iptables-restore --noflush` into a fresh namespace. Both are spawned the same way, from a
thread that entered the namespace (the node's for the plugin, the fresh one for the restore). The
ratio of the medians is `plugin_start_ratio_vs_iptables_restore` (aim <= 5). Of the plugin's time,
install-cni's own share (from reading the request to writing the answer, as its log line says) is
`plugin_start_agent_ms_p50`; the rest is the launcher's interpreter start-up and the socket. For scale,
before each ADD the launcher's interpreter is spawned the same way doing nothing (`-IS`, start-up then
`posix._exit`, as the launcher exits): `interpreter_floor_ms_p50` and its ratio to the restore, the part
of the plugin's figure no code of ours runs in.

Upstream's Go CNI (`upstream_arm.py`): a second node, the same chain and pods, with upstream's Go
install-cni as the node agent (which installs upstream's Go istio-cni: `--cni upstream`), measured the
same way after ours: its ADD with and without its plugin, its plugin alone, its reinstall.
`add_vs_upstream` is the chain with our istio-cni over the chain with upstream's (medians; aim <= 1.2),
`add_overhead_vs_upstream` the same for each chain over its own node's chain without the plugin (the
two nodes run one after the other; this one is immune to a change of load between them),
`plugin_start_vs_upstream` and `reinstall_p99_vs_upstream` ours / upstream's. Skipped, saying why,
without upstream's commands.

Figures: median and p99 (nearest rank) of each arm in ms, the with/without ratio of the medians (aim
<= 2), reinstall p99 (aim <= 1000 ms). Needs root. Last line: JSON with `add_ratio_with_istio_cni`,
`add_ms_p50`, `add_ms_p99` (the chain with istio-cni), `reinstall_ms_p99`,
`plugin_start_ratio_vs_iptables_restore`, and the other figures.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
import yaml
from launchers import RegistryFile, local_node
from upstream_arm import missing, say_missing
from upstream_arm import ratio as ratio_of

from istiod_local.node.cni_plan import container_id, loopback_attachment, pod_attachment
from istiod_local.node.cni_runtime import NetworkList, loopback_network
from istiod_local.node.plan import PodPlan, PodSpec, registry_workloads

PODS = int(os.environ.get("BENCH_PODS", "60"))
WRITES = int(os.environ.get("BENCH_WRITES", "25"))
START_RUNS = int(os.environ.get("BENCH_START_RUNS", "25"))
PLUGIN_TIMES: dict[str, list[float]] = {}  # "arm:plugin type" -> ms per exec, filled while an arm is timed
_ARM = [""]


def time_plugin_execs(runtime: object) -> None:
    """Record each plugin exec's wall time (the runtime's `_exec`, wrapped) under the current arm."""
    original = runtime._exec  # type: ignore[attr-defined]

    def timed(path: str, stdin: bytes, environment: dict[str, str]) -> tuple[int, bytes, bytes]:
        start = time.perf_counter()
        try:
            return original(path, stdin, environment)  # type: ignore[no-any-return]
        finally:
            if _ARM[0]:
                key = f"{_ARM[0]}:{os.path.basename(path)}"
                PLUGIN_TIMES.setdefault(key, []).append((time.perf_counter() - start) * 1000)

    runtime._exec = timed  # type: ignore[attr-defined]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def time_add(node: object, network: NetworkList, plan: PodPlan, generation: int) -> float:
    """One pod's sandbox through the chain, timed from the first ADD to the last result; then torn down."""
    from istiod_local.node.local_node import LocalNode

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


def spawn_in(netns: str | None, argv: list[str], stdin: bytes, env: dict[str, str] | None = None) -> tuple[
        float, subprocess.CompletedProcess[bytes]]:
    """Exec `argv` in `netns` (None: this one) and wait for it: (ms, result), timed from spawn to exit.

    The child is spawned from a thread that entered the namespace first (setns moves only that thread,
    and the child inherits it), so neither exec pays for a Python `preexec_fn` fork of this process.
    """
    from istio_agent.capture.netns import enter_netns

    out: list[tuple[float, subprocess.CompletedProcess[bytes]]] = []

    def run() -> None:
        if netns is not None:
            enter_netns(netns)
        start = time.perf_counter()
        done = subprocess.run(argv, input=stdin, capture_output=True, env=env, check=False)
        out.append(((time.perf_counter() - start) * 1000, done))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def restore_input(saved: bytes) -> bytes:
    """`iptables-save` output as the plugin feeds `iptables-restore --noflush`: `-N` for our chains, the rules.

    The built-in chains' policy lines (`:PREROUTING ACCEPT [0:0]`) are dropped: restoring them makes
    iptables-nft create and set every base chain, several times the cost of loading the rules.
    """
    lines = []
    for line in saved.decode().splitlines():
        if line.startswith(":"):
            name, policy = line[1:].split()[:2]
            if policy == "-":
                lines.append(f"-N {name}")
        elif line.startswith(("*", "-A ", "COMMIT")):
            lines.append(line)
    return ("\n".join(lines) + "\n").encode()


def agent_side_ms(log: Path, containers: list[str]) -> list[float]:
    """install-cni's own time for each of these ADDs, from its log line ("... answered with status 0 in X ms")."""
    wanted = set(containers)
    found = []
    for match in re.finditer(r"fast path: ADD for container ([0-9a-f]+) answered with status \d+ in ([0-9.]+) ms",
                             log.read_text(errors="replace")):
        if match.group(1) in wanted:
            found.append(float(match.group(2)))
    return found


def plugin_start_times(node: object, network: NetworkList, plans: list[PodPlan]) -> tuple[
        list[float], list[float], list[float], list[str]]:
    """(istio-cni exec to answer, bare iptables-restore of the same rules, the launcher's interpreter doing
    nothing) in ms, one pod netns each, and the container ids the ADDs were for."""
    from istiod_local.node.cni_runtime import plugin_environment, plugin_stdin
    from istiod_local.node.local_node import LocalNode

    assert isinstance(node, LocalNode) and node.cni is not None
    runtime = node.cni.runtime
    entry = next(p for p in network.plugins if p.type == "istio-cni")
    launcher = str(node.cni.paths.bin_dir / "istio-cni")
    with open(launcher, "rb") as handle:
        first = handle.readline()
    # Our launcher's interpreter (its #! line), start-up only, no finalization (as it); none for a binary.
    floor = [first[2:].decode().split()[0], "-IS", "-c", "import posix; posix._exit(0)"] if first[:2] == b"#!" else []
    plugin_ms, restore_ms, floor_ms, containers = [], [], [], []
    for i, plan in enumerate(plans):
        containers.append(container_id(plan, 1000 + i))
        attachment = pod_attachment(plan, containers[-1])
        prev = {"cniVersion": network.cni_version, "ips": [{"address": "10.99.0.2/24", "interface": 0}]}
        stdin = plugin_stdin(network, entry, prev, attachment)
        env = plugin_environment("ADD", attachment, runtime.cni_path, runtime.base_env)
        fresh = f"{plan.netns}-r"
        for name in (plan.netns, fresh):
            subprocess.run(["ip", "netns", "add", name], check=True)
            subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
            subprocess.run(["ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
                           check=True)
            subprocess.run(["ip", "-n", name, "addr", "add", "10.99.0.2/24", "dev", "eth0"], check=True)
            subprocess.run(["ip", "-n", name, "link", "set", "eth0", "up"], check=True)
        try:
            if floor:
                floor_ms.append(spawn_in(runtime.netns, floor, stdin, env)[0])
            elapsed, done = spawn_in(runtime.netns, [launcher], stdin, env)  # where the runtime execs plugins
            if done.returncode != 0:
                raise SystemExit(f"istio-cni ADD failed: {done.stdout!r} {done.stderr[-2000:]!r}")
            plugin_ms.append(elapsed)
            rules = subprocess.run(["ip", "netns", "exec", plan.netns, "iptables-save"], check=True,
                                   capture_output=True).stdout
            assert b"ISTIO_REDIRECT" in rules, "istio-cni applied no rules"
            elapsed, done = spawn_in(f"/var/run/netns/{fresh}", ["iptables-restore", "--noflush"],
                                     restore_input(rules))
            assert done.returncode == 0, done.stderr
            restore_ms.append(elapsed)
        finally:
            for name in (plan.netns, fresh):
                subprocess.run(["ip", "netns", "delete", name], check=True)
    return plugin_ms, restore_ms, floor_ms, containers


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


def measure_node(cni: str) -> dict[str, list[float]]:
    """One node whose CNI agent is `cni` (ours or upstream's): ADDs with and without the plugin, alternating pod
    by pod, the plugin alone, the reinstall; the samples (ms) by figure."""
    with local_node("bench-cni-", ready_timeout=60, capture="cni", cni_repair="off", cni=cni) as node:
        assert node.cni is not None
        plans = node.plan_pods([PodSpec(f"b-{i}", agent=False) for i in range(2 * PODS + START_RUNS)])
        RegistryFile(node.registry, yaml.safe_dump({"workloads": registry_workloads(plans)}))
        node.start_istiod()
        with_cni = node.cni.primary_network()
        plain = without_istio_cni(with_cni)
        original = json.dumps(json.loads(node.cni.paths.conflist.read_text()) | {
            "plugins": [dict(p.config) for p in plain.plugins]}, indent=2)
        time_plugin_execs(node.cni.runtime)
        for plan in plans[:2]:  # warm-up: page cache, the plugin's first imports
            time_add(node, with_cni, plan, 0)
        samples: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(PODS):
            arms = [("with", with_cni, plans[2 * i]), ("without", plain, plans[2 * i + 1])]
            for arm, network, plan in arms if i % 2 == 0 else arms[::-1]:
                _ARM[0] = f"{cni}/{arm}"
                samples[arm].append(time_add(node, network, plan, i + 1))
                _ARM[0] = ""
        plugin_ms, restore_ms, floor_ms, containers = plugin_start_times(node, with_cni, plans[2 * PODS:])
        samples.update(plugin=plugin_ms, restore=restore_ms, floor=floor_ms,
                       reinstall=reinstall_latencies(node.cni.paths.conflist, original),
                       agent=agent_side_ms(node.cni.logs / "install-cni.log", containers))
    return samples


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, the CNI plugins)")
    samples = measure_node("istio-agent")
    reinstall, plugin_ms, restore_ms, floor_ms, agent_ms = (samples[k] for k in (
        "reinstall", "plugin", "restore", "floor", "agent"))
    why_not = missing("install-cni", "istio-cni")
    go = {} if why_not else measure_node("upstream")
    figures = {arm: (statistics.median(samples[arm]), percentile(samples[arm], 0.99))
               for arm in ("with", "without")}
    floor_ratio = statistics.median(floor_ms) / statistics.median(restore_ms)
    ratio = figures["with"][0] / figures["without"][0]
    start_ratio = statistics.median(plugin_ms) / statistics.median(restore_ms)
    summary: dict[str, object] = {
        "add_ratio_with_istio_cni": round(ratio, 2),
        "add_ms_p50": round(figures["with"][0], 1),
        "add_ms_p99": round(figures["with"][1], 1),
        "reinstall_ms_p99": round(percentile(reinstall, 0.99), 1),
        "add_ms_p50_without": round(figures["without"][0], 1),
        "add_ms_p99_without": round(figures["without"][1], 1),
        "reinstall_ms_p50": round(statistics.median(reinstall), 1),
        "plugin_start_ratio_vs_iptables_restore": round(start_ratio, 2),
        "plugin_start_ms_p50": round(statistics.median(plugin_ms), 1),
        "iptables_restore_ms_p50": round(statistics.median(restore_ms), 1),
        "plugin_start_agent_ms_p50": round(statistics.median(agent_ms), 1) if agent_ms else None,
        "interpreter_floor_ms_p50": round(statistics.median(floor_ms), 1) if floor_ms else None,
        "interpreter_floor_ratio_vs_iptables_restore": round(floor_ratio, 2),
        "pods_per_arm": PODS,
        "writes": WRITES,
    }
    if go:
        go_with, go_without = statistics.median(go["with"]), statistics.median(go["without"])
        summary.update({
            "upstream_add_ms_p50": round(go_with, 1),
            "upstream_add_ms_p50_without": round(go_without, 1),
            "upstream_add_ratio_with_istio_cni": round(go_with / go_without, 2),
            "upstream_plugin_start_ms_p50": round(statistics.median(go["plugin"]), 1),
            "upstream_reinstall_ms_p99": round(percentile(go["reinstall"], 0.99), 1),
            "add_vs_upstream": ratio_of(figures["with"][0], go_with),
            "add_overhead_vs_upstream": ratio_of(ratio, go_with / go_without),
            "plugin_start_vs_upstream": ratio_of(statistics.median(plugin_ms), statistics.median(go["plugin"])),
            "reinstall_p99_vs_upstream": ratio_of(percentile(reinstall, 0.99), percentile(go["reinstall"], 0.99)),
        })
        print(f"upstream's Go CNI, same chain and pods on a second node: ADD with its istio-cni p50 {go_with:.1f} ms, "
              f"without {go_without:.1f} ms ({go_with / go_without:.2f}x); its plugin alone p50 "
              f"{summary['upstream_plugin_start_ms_p50']} ms; its reinstall p99 {summary['upstream_reinstall_ms_p99']} "
              f"ms", flush=True)
        print(f"ours / upstream's: ADD through the chain {summary['add_vs_upstream']} (aim <= 1.2), the chain's "
              f"overhead over no plugin {ratio:.2f}x vs {go_with / go_without:.2f}x -> "
              f"{summary['add_overhead_vs_upstream']}, plugin alone {summary['plugin_start_vs_upstream']}, reinstall "
              f"p99 {summary['reinstall_p99_vs_upstream']}", flush=True)
    else:
        say_missing("bench_cni", why_not)
        summary["upstream"] = why_not
    for key, values in sorted(PLUGIN_TIMES.items()):
        arm, plugin = key.split(":", 1)
        print(f"  {arm:>7} arm: {plugin:<10} p50 {statistics.median(values):6.1f} ms, p99 "
              f"{percentile(values, 0.99):6.1f} ms ({len(values)} execs)", flush=True)
    print(f"pod ADD through loopback + bridge/host-local + istio-cni: p50 {summary['add_ms_p50']} ms, "
          f"p99 {summary['add_ms_p99']} ms; without istio-cni: p50 {summary['add_ms_p50_without']} ms, "
          f"p99 {summary['add_ms_p99_without']} ms ({PODS} pods each)", flush=True)
    print(f"with/without istio-cni (medians): {ratio:.2f}x (aim <= 2x); p99 ratio "
          f"{figures['with'][1] / figures['without'][1]:.2f}x", flush=True)
    print(f"install-cni reinstall after a conflicting write: p50 {summary['reinstall_ms_p50']} ms, p99 "
          f"{summary['reinstall_ms_p99']} ms over {WRITES} writes ({percentile(reinstall, 0.99) / 1000:.2f} of the "
          f"1 s aim)", flush=True)
    print(f"istio-cni alone, exec to answer (rules applied): p50 {summary['plugin_start_ms_p50']} ms; bare "
          f"iptables-restore of the same rules: p50 {summary['iptables_restore_ms_p50']} ms; ratio "
          f"{start_ratio:.2f}x (aim <= 5x, {START_RUNS} runs)", flush=True)
    print(f"  of it, install-cni's own time (its log, request read to answer written): p50 "
          f"{summary['plugin_start_agent_ms_p50']} ms; the rest is the launcher (interpreter start-up, the socket)",
          flush=True)
    print(f"  the launcher's interpreter alone (-IS, start-up to _exit, spawned the same way): p50 "
          f"{summary['interpreter_floor_ms_p50']} ms, {summary['interpreter_floor_ratio_vs_iptables_restore']}x the "
          "restore", flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
