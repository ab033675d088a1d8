"""A mesh of 50 sidecar pods on this machine: time to all ready and memory per pod (needs root).

`istiod-local up MESH --scale N --check --plain` with a benchmark mesh whose
five pods per scale step are all sidecar pods (agent + Envoy each), in a
STRICT namespace: one `client` (it calls `echo` every few seconds through its
sidecar), one `echo` (an HTTP echo app behind the `echo` service) and three
`idle` pods with no app. `--scale 10` gives 50 sidecar pods (`BENCH_MESH_PODS`
chooses another multiple of 5). `up` builds the node, istiod-local,
install-cni and every pod through the CNI chain, waits until every pod is
ready, then `--check` probes client → echo over mTLS with the client's SPIFFE
identity; its last line is the figure this benchmark reports:
`{"pods", "ready_s", "rss_per_pod_mb", "check_passed"}`, with `ready_s`
counted from the start of the run (node creation) and `rss_per_pod_mb` the
mean VmRSS of each pod's agent process tree (agent + Envoy).

While `up` checks, this benchmark reads every pod's processes itself (found
through the run's network namespaces): VmRSS of the agent and of its Envoy,
RssAnon (what the pod costs that no other pod shares) and Pss (its
proportional share of the pages shared with the others: the Python code,
Envoy's binary), per pod.

Real peers measured in the same run:
- **pods without a sidecar**: the same number of pods, the same CNI chain and
  node, `mode: none` (no agent, no Envoy, no capture; `echo` keeps its app),
  brought up with `--once`: the ratio `ready_ratio_vs_no_sidecar` is what the
  mesh adds to starting pods;
- **each pod's own Envoy**: `pod_rss_ratio_vs_its_envoy` is the pod's agent +
  Envoy VmRSS over its Envoy's alone (the Go agent, for context, runs in
  about 25-40 MiB: a Go pod is about 1.4-1.6 times its Envoy).

**Upstream's Go agent** (`upstream_arm.py`): the same mesh with `agent:
upstream` on every deployment (same node, CNI chain, istiod-local and Envoy),
brought up the same way after ours: `ready_vs_upstream` (ours / its time to
all ready; aim <= 1.1) and per pod `agent_rss_vs_upstream`,
`pss_per_pod_vs_upstream` (agent + Envoy), `rss_anon_per_pod_vs_upstream`.
Skipped, saying why, without upstream's commands.

Last line, one JSON object: `{"pods", "ready_s", "rss_per_pod_mb",
"check_passed", ...}` (the ratios and the split follow).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream_arm import missing, ratio, say_missing

BIN = Path(sys.executable).parent
PODS = int(os.environ.get("BENCH_MESH_PODS", "50"))
PODS_PER_SCALE = 5
TIMEOUT = float(os.environ.get("BENCH_MESH_TIMEOUT", "180"))

SIDECAR_MESH = """\
apiVersion: istio-agent.local/v1
kind: Mesh
namespaces:
- name: default
  peerAuthentication: STRICT
services:
- name: echo
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
deployments:
- name: client
  app: {kind: client, calls: [echo:80], interval: 5}
- name: echo
  app: {kind: http-echo, port: 8080}
- name: idle
  replicas: 3
  app: none
"""

NO_SIDECAR_MESH = """\
apiVersion: istio-agent.local/v1
kind: Mesh
services:
- name: echo
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
deployments:
- name: echo
  replicas: 2
  mode: none
  app: {kind: http-echo, port: 8080}
- name: idle
  replicas: 3
  mode: none
  app: none
"""


def upstream_mesh(mesh: str) -> str:
    """The mesh with every deployment's pods on upstream's Go agent."""
    head, _, deployments = mesh.partition("deployments:\n")
    return f"{head}deployments:\n" + re.sub(r"^(- name: \S+\n)", "\\1  agent: upstream\n", deployments,
                                            flags=re.MULTILINE)


PHASES = {"node": " node ia-", "istiod": " istiod-local on ", "ready": " mesh ready: "}  # `up`'s event lines


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _netns_pids(name: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=10)
    return [int(word) for word in done.stdout.split() if word.isdigit()]


def _role(pid: int) -> str:
    """envoy, agent (`pilot-agent proxy`) or app, from the process's executable and command line."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    if exe == "envoy":
        return "envoy"
    if any(arg.endswith(b"pilot-agent") for arg in argv) and b"proxy" in argv:
        return "agent"
    return "app"


def sample_pods(owner: int) -> list[dict[str, int]]:
    """Per sidecar pod of the run owned by `owner`: VmRSS of agent and Envoy, RssAnon and Pss of both (KiB)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout.split("\n")
    pods = []
    for line in names:
        name = line.split(" ")[0]
        if not re.match(rf"ia-{owner}-\d+-", name) or name.endswith("-node"):
            continue
        sample = {"agent_rss": 0, "envoy_rss": 0, "anon": 0, "pss": 0}
        for pid in _netns_pids(name):
            role = _role(pid)
            if role in ("agent", "envoy"):
                sample[f"{role}_rss"] += _status_kb(pid, "VmRSS")
                sample["anon"] += _status_kb(pid, "RssAnon")
                sample["pss"] += _pss_kb(pid)
        if sample["envoy_rss"]:
            pods.append(sample)
    return pods


class Up:
    """One `istiod-local up` run: its output, the time its last line came, its memory sampled once ready."""

    def __init__(self, mesh: str, scale: int, mode: str, workdir: Path, sample: bool) -> None:
        self.mesh_file = workdir / "mesh.yaml"
        self.mesh_file.write_text(mesh)
        self.argv = [str(BIN / "istiod-local"), "up", str(self.mesh_file), "--dir", str(workdir / "run"),
                     "--scale", str(scale), mode, "--plain", "--timeout", str(TIMEOUT)]
        self.sample = sample
        self.lines: list[str] = []
        self.samples: list[dict[str, int]] = []
        self.wall_s = 0.0
        self.phases: dict[str, float] = {}  # when `up` said so, seconds after it was started

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        sampler: threading.Thread | None = None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))
            for phase, needle in PHASES.items():
                if needle in line and phase not in self.phases:
                    self.phases[phase] = round(time.monotonic() - started, 1)
            if "mesh ready" in line or "expectations" in line or "error" in line:
                print(f"  | {line.rstrip()}", flush=True)
            if self.sample and sampler is None and "mesh ready:" in line:
                sampler = threading.Thread(target=lambda: self.samples.extend(sample_pods(proc.pid)))
                sampler.start()
        code = proc.wait()
        self.wall_s = time.monotonic() - started
        if sampler is not None:
            sampler.join()
        try:
            result: dict[str, Any] = json.loads(self.lines[-1])
        except (IndexError, ValueError):
            raise SystemExit(f"{' '.join(self.argv)} exited {code} without its JSON line:\n"
                             + "\n".join(self.lines[-40:])) from None
        if code not in (0, 1):
            raise SystemExit(f"{' '.join(self.argv)} exited {code}:\n" + "\n".join(self.lines[-40:]))
        return result


def _mean_mb(samples: list[dict[str, int]], *keys: str) -> float:
    return round(sum(s[k] for s in samples for k in keys) / len(samples) / 1024, 1) if samples else 0.0


def main() -> int:
    if os.geteuid() != 0:
        print("bench_mesh needs root (network namespaces)", file=sys.stderr)
        return 2
    if PODS % PODS_PER_SCALE:
        print(f"BENCH_MESH_PODS must be a multiple of {PODS_PER_SCALE}", file=sys.stderr)
        return 2
    scale = PODS // PODS_PER_SCALE
    base = Path(tempfile.mkdtemp(prefix="ia-bench-mesh-"))
    try:
        (base / "sidecar").mkdir()
        (base / "plain").mkdir()
        print(f"{PODS} sidecar pods: istiod-local up --scale {scale} --check (STRICT mTLS, CNI capture)", flush=True)
        mesh = Up(SIDECAR_MESH, scale, "--check", base / "sidecar", sample=True)
        result = mesh.run()
        print(f"{PODS} pods without a sidecar: istiod-local up --scale {scale} --once (same node, same CNI chain)",
              flush=True)
        plain = Up(NO_SIDECAR_MESH, scale, "--once", base / "plain", sample=False)
        plain_result = plain.run()
        why_not = missing("pilot-agent")
        go: Up | None = None
        go_result: dict[str, Any] = {}
        if why_not:
            say_missing("bench_mesh", why_not)
        else:
            (base / "upstream").mkdir()
            print(f"the same {PODS} sidecar pods on upstream's Go agent: istiod-local up --scale {scale} --check",
                  flush=True)
            go = Up(upstream_mesh(SIDECAR_MESH), scale, "--check", base / "upstream", sample=True)
            go_result = go.run()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    samples = mesh.samples
    agent, envoy = _mean_mb(samples, "agent_rss"), _mean_mb(samples, "envoy_rss")
    pss, anon = _mean_mb(samples, "pss"), _mean_mb(samples, "anon")
    ready, plain_ready = float(result["ready_s"]), float(plain_result["ready_s"])
    print(f"time to all {result['pods']} pods ready: {ready:.1f} s (from node creation; `up` exited after "
          f"{mesh.wall_s:.1f} s with the check and teardown); check passed: {result['check_passed']}")
    print(f"phases after `up` started: node {mesh.phases.get('node')} s, istiod-local and install-cni "
          f"{mesh.phases.get('istiod')} s, every pod ready {mesh.phases.get('ready')} s (without sidecars: "
          f"{plain.phases.get('node')}, {plain.phases.get('istiod')}, {plain.phases.get('ready')} s)")
    print(f"the same {plain_result['pods']} pods without a sidecar: {plain_ready:.1f} s -> {ready / plain_ready:.2f}x")
    print(f"memory per sidecar pod ({len(samples)} sampled once ready): VmRSS {agent + envoy:.1f} MiB "
          f"(agent {agent:.1f} + Envoy {envoy:.1f}; `up` says {result['rss_per_pod_mb']}), "
          f"RssAnon {anon:.1f} MiB, Pss {pss:.1f} MiB; {PODS} pods: {pss * PODS / 1024:.2f} GiB by Pss")
    if envoy:
        print(f"a pod is {(agent + envoy) / envoy:.2f}x its own Envoy's VmRSS (a Go agent's pod: about 1.4-1.6x)")
    upstream: dict[str, Any] = {"upstream": why_not}
    if go is not None:
        go_samples = go.samples
        go_agent, go_envoy = _mean_mb(go_samples, "agent_rss"), _mean_mb(go_samples, "envoy_rss")
        go_pss, go_anon = _mean_mb(go_samples, "pss"), _mean_mb(go_samples, "anon")
        go_ready = float(go_result["ready_s"])
        upstream = {
            "upstream_ready_s": go_result["ready_s"], "upstream_check_passed": go_result["check_passed"],
            "upstream_agent_rss_mb": go_agent, "upstream_envoy_rss_mb": go_envoy, "upstream_pss_per_pod_mb": go_pss,
            "upstream_rss_anon_per_pod_mb": go_anon, "ready_vs_upstream": ratio(ready, go_ready),
            "agent_rss_vs_upstream": ratio(agent, go_agent), "pss_per_pod_vs_upstream": ratio(pss, go_pss),
            "rss_anon_per_pod_vs_upstream": ratio(anon, go_anon),
        }
        print(f"on upstream's Go agent: all {go_result['pods']} pods ready in {go_ready:.1f} s (check passed: "
              f"{go_result['check_passed']}); per pod VmRSS agent {go_agent:.1f} + Envoy {go_envoy:.1f} MiB, RssAnon "
              f"{go_anon:.1f}, Pss {go_pss:.1f}")
        print(f"ours / upstream's: ready {upstream['ready_vs_upstream']} (aim <= 1.1), agent RSS "
              f"{upstream['agent_rss_vs_upstream']}, pod Pss {upstream['pss_per_pod_vs_upstream']}, pod RssAnon "
              f"{upstream['rss_anon_per_pod_vs_upstream']}")
    print(json.dumps({
        "pods": result["pods"], "ready_s": result["ready_s"], "rss_per_pod_mb": result["rss_per_pod_mb"],
        "check_passed": result["check_passed"],
        "ready_ratio_vs_no_sidecar": round(ready / plain_ready, 2) if plain_ready else None,
        "pod_rss_ratio_vs_its_envoy": round((agent + envoy) / envoy, 2) if envoy else None,
        "no_sidecar_ready_s": plain_result["ready_s"], "agent_rss_mb": agent, "envoy_rss_mb": envoy,
        "pss_per_pod_mb": pss, "rss_anon_per_pod_mb": anon, "sampled_pods": len(samples),
        "up_wall_s": round(mesh.wall_s, 1), "istiod_up_s": mesh.phases.get("istiod"),
        **upstream,
    }))
    return 0 if result["check_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
