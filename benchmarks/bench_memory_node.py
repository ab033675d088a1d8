"""Per-pod memory of a sidecar agent with 20 agents of each implementation at once on one node (needs root).

What an operator multiplies is not one agent's RSS: the file-backed pages of a
shared image (the interpreter and its extension modules, or the Go binary's
text) are paid once per node, the anonymous pages once per pod. So one node
(`istiod-local up MESH --plain`, CNI capture) runs `BENCH_NODE_PODS` (20)
sidecar pods on our agent and as many on upstream's Go agent, at once, all
with the DNS proxy on and no app (what each agent holds idle beside its Envoy,
after a `BENCH_NODE_SETTLE` (20) s settle once every pod is ready). Each
agent process is read from /proc/PID/smaps_rollup:

- **USS** (private clean + private dirty: what the pod alone holds, what
  goes away with it), the figure the aim is about (ours <= 1.3x upstream's);
- **PSS** (each shared page split between the processes sharing it: the
  node's total is the sum), RSS and anonymous pages, for context;
- the same for each pod's Envoy (the same binary in both arms).

Both arms run the same Envoy, istiod-local, node and CNI chain; only
the deployment's `agent:` differs. Without upstream's agent
(`upstream_arm.py`) only our pods run and the JSON line says why.

Last line, one JSON object: `{"pods_per_arm", "uss_per_pod_mb", "pss_per_pod_mb", "rss_per_pod_mb",
"anon_per_pod_mb", "upstream_uss_per_pod_mb", ..., "uss_per_pod_vs_upstream", "pss_per_pod_vs_upstream",
"rss_per_pod_vs_upstream", "envoy_uss_per_pod_mb", ...}`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mesh import _netns_pids, _role
from upstream_arm import GO, OURS, missing, ratio, say_missing, smaps

BIN = Path(sys.executable).parent
PODS = int(os.environ.get("BENCH_NODE_PODS", "20"))
SETTLE = float(os.environ.get("BENCH_NODE_SETTLE", "20"))
TIMEOUT = float(os.environ.get("BENCH_MESH_TIMEOUT", "300"))


def mesh_file(pods: int, with_upstream: bool) -> str:
    deployments = [("ours", "istio-agent")] + ([("go", "upstream")] if with_upstream else [])
    lines = ["apiVersion: istio-agent.local/v1", "kind: Mesh", "deployments:"]
    for name, agent in deployments:
        lines += [f"- name: {name}", f"  replicas: {pods}", "  dnsCapture: true", f"  agent: {agent}", "  app: none"]
    return "\n".join(lines) + "\n"


def implementation(pid: int) -> str:
    """Which agent a `pilot-agent proxy` process is: the Go binary, or our Python interpreter."""
    exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    return GO if exe == "pilot-agent" else OURS


def sample(owner: int) -> dict[str, list[dict[str, float]]]:
    """smaps figures of every agent and Envoy of `up`'s pods (pid `owner`), keyed `<implementation>` and
    `<implementation>-envoy`."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    out: dict[str, list[dict[str, float]]] = {}
    for line in names:
        name = line.split(" ")[0]
        if not re.match(rf"ia-{owner}-\d+-", name) or name.endswith("-node"):
            continue
        pids = _netns_pids(name)
        agents = [pid for pid in pids if _role(pid) == "agent"]
        envoys = [pid for pid in pids if _role(pid) == "envoy"]
        if len(agents) != 1:
            continue
        kind = implementation(agents[0])
        try:
            out.setdefault(kind, []).append(smaps(agents[0]))
            for envoy in envoys:
                out.setdefault(f"{kind}-envoy", []).append(smaps(envoy))
        except OSError:
            continue
    return out


def run_node(workdir: Path, mesh: str) -> tuple[dict[str, list[dict[str, float]]], float]:
    """`up` the mesh, sample once every pod is ready and has settled, stop it; (samples, seconds to ready)."""
    (workdir / "mesh.yaml").write_text(mesh)
    argv = [str(BIN / "istiod-local"), "up", str(workdir / "mesh.yaml"), "--dir", str(workdir / "run"), "--plain",
            "--timeout", str(TIMEOUT)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    lines: list[str] = []
    samples: dict[str, list[dict[str, float]]] = {}
    ready_s = 0.0
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if " error" in line or "failed" in line:
                print(f"  | {line.rstrip()}", flush=True)
            if "mesh ready:" in line:
                ready_s = time.monotonic() - started
                print(f"  | {line.rstrip()}", flush=True)
                time.sleep(SETTLE)
                samples = sample(proc.pid)
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    if not samples:
        raise SystemExit(f"{' '.join(argv)} never got ready:\n" + "\n".join(lines[-40:]))
    return samples, ready_s


def means(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.mean(s[key] for s in samples), 1) for key in ("uss", "pss", "rss", "anon")}


def main() -> int:
    if os.geteuid() != 0:
        print("bench_memory_node needs root (network namespaces)", file=sys.stderr)
        return 2
    why_not = missing("pilot-agent")
    if why_not:
        say_missing("bench_memory_node", why_not)
    base = Path(tempfile.mkdtemp(prefix="ia-bench-node-"))
    try:
        pods = PODS * (1 if why_not else 2)
        print(f"one node, {PODS} sidecar pods on our agent" + ("" if why_not else f" and {PODS} on upstream's Go agent")
              + f" at once (DNS proxy on, no app), sampled {SETTLE:g} s after all {pods} are ready", flush=True)
        samples, ready_s = run_node(base, mesh_file(PODS, not why_not))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures: dict[str, Any] = {"pods_per_arm": PODS, "ready_s": round(ready_s, 1)}
    for kind, prefix in ((OURS, ""), (GO, "upstream_")):
        if kind not in samples:
            continue
        agent, envoy = means(samples[kind]), means(samples.get(f"{kind}-envoy", []) or [{k: 0.0 for k in (
            "uss", "pss", "rss", "anon")}])
        print(f"{kind:9s} agent ({len(samples[kind])} sampled): USS {agent['uss']:5.1f} MiB, PSS {agent['pss']:5.1f}, "
              f"RSS {agent['rss']:5.1f}, anonymous {agent['anon']:5.1f}; its Envoy: USS {envoy['uss']:5.1f}, "
              f"PSS {envoy['pss']:5.1f}, RSS {envoy['rss']:5.1f}", flush=True)
        for key, value in agent.items():
            figures[f"{prefix}{key}_per_pod_mb"] = value
        for key, value in envoy.items():
            figures[f"{prefix}envoy_{key}_per_pod_mb"] = value
    if GO in samples:
        for key in ("uss", "pss", "rss", "anon"):
            figures[f"{key}_per_pod_vs_upstream"] = ratio(figures[f"{key}_per_pod_mb"],
                                                          figures[f"upstream_{key}_per_pod_mb"])
        print(f"ours / upstream's, per pod: USS {figures['uss_per_pod_vs_upstream']}, PSS "
              f"{figures['pss_per_pod_vs_upstream']}, RSS {figures['rss_per_pod_vs_upstream']} (aim: USS <= 1.3)")
    else:
        figures["upstream"] = why_not
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
