"""`up --check`'s I/O: running the probes in the pods (and on the host) and reading their answers.

What to probe and what each probe must give is decided without I/O
(`expect.py` pairwise, `configcheck.py` and `gatewaycheck.py` from Istio
config); this runs them: the probes of one pod in one `python -m
istiod_local.mesh.apps probe` inside its network namespace (the pod's own
traffic, through its sidecar), the client Envoys' `ssl.handshake` counters
read before and after, and the gateway probes from the host, each run in a
mount namespace of its own whose /etc/hosts gives the gateway's host names
127.0.0.1 (`unshare --mount` and a bind mount: the host's /etc/hosts is
never touched). A probe that did not hold is run again, twice, 2 s apart (a
push may still be on its way).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from istiod_local.mesh import configcheck, expect, gatewaycheck
from istiod_local.mesh.configcheck import ConfigProbe
from istiod_local.mesh.planner import APPS_MODULE, MeshPlan
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.processes import NodeError

CHECK_ATTEMPTS = 3
RETRY_AFTER = 2.0
RUN_TIMEOUT = 180.0


@dataclass(frozen=True)
class ConfigRow:
    """A probe derived from Istio config, with what it observed."""

    probe: ConfigProbe
    observed: str
    ok: bool


@dataclass
class CheckResult:
    rows: list[expect.Row | ConfigRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # expectations the check could not derive: not checked

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.rows)


def probe_environment() -> dict[str, str]:
    """The probes' environment: this one's, less any HTTP proxy (every call is to this machine)."""
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def hosts_file(names: Sequence[str]) -> str:
    """An /etc/hosts giving `names` the loopback address (and localhost its usual lines)."""
    return "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + \
        "".join(f"127.0.0.1\t{name}\n" for name in names)


def with_hosts(argv: Sequence[str], hosts: Path) -> list[str]:
    """`argv` in a private mount namespace where `hosts` is /etc/hosts."""
    inner = f"mount --bind {shlex.quote(str(hosts))} /etc/hosts && exec {shlex.join(argv)}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]


class MeshCheck:
    """The probes of one check of a running mesh."""

    def __init__(self, node: LocalNode, pods: Mapping[str, Pod], plan: MeshPlan, python: str) -> None:
        self.node = node
        self.pods = pods
        self.plan = plan
        self.python = python

    def _tls_handshakes(self, pod: Pod) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            text = self.node.envoy_admin(pod, "stats?filter=ssl.handshake")
        except NodeError:
            return out
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

    def _probe_argv(self, probes: Sequence[Any]) -> list[str]:
        return [self.python, "-m", APPS_MODULE, "probe", json.dumps([p.as_json() for p in probes]),
                "--control-port", str(expect.control_port())]

    def _answers(self, running: Mapping[str, tuple[subprocess.Popen[str], int]]) -> dict[str, list[dict[str, Any]]]:
        answers: dict[str, list[dict[str, Any]]] = {}
        for name, (proc, count) in running.items():
            try:
                out, _ = proc.communicate(timeout=RUN_TIMEOUT)
                answers[name] = json.loads(out)
            except (subprocess.TimeoutExpired, ValueError) as exc:
                proc.kill()
                proc.communicate()
                answers[name] = [{"answered": False, "error": f"probe run failed: {exc}"}] * count
        return answers

    def _start(self, pod: str, probes: Sequence[Any]) -> subprocess.Popen[str]:
        return subprocess.Popen(self.node.in_pod(self.pods[pod], self._probe_argv(probes)), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=probe_environment())

    def run_pairwise(self, probes: list[expect.Probe]) -> list[expect.Row]:
        by_pod: dict[str, list[expect.Probe]] = {}
        for probe in probes:
            by_pod.setdefault(probe.pod, []).append(probe)
        sidecars = {name: self.pods[name] for name in by_pod
                    if self.pods[name].agent is not None and not self.pods[name].proxyless}
        before = {name: self._tls_handshakes(pod) for name, pod in sidecars.items()}
        running = {name: (self._start(name, group), len(group)) for name, group in by_pod.items()}
        answers = self._answers(running)
        after = {name: self._tls_handshakes(pod) for name, pod in sidecars.items()}
        rows = []
        for name, group in by_pod.items():
            for probe, raw in zip(group, answers[name], strict=False):
                handshakes = None
                if name in sidecars and probe.cluster:
                    handshakes = sum(v - before[name].get(k, 0) for k, v in after[name].items()
                                     if probe.cluster in k)
                rows.append(expect.Row(probe, expect.expect(self.plan, probe),
                                       expect.observe(probe, raw, handshakes)))
        return rows

    def run_config(self, probes: list[ConfigProbe]) -> list[ConfigRow]:
        by_pod: dict[str, list[ConfigProbe]] = {}
        for probe in probes:
            by_pod.setdefault(probe.pod, []).append(probe)
        with tempfile.TemporaryDirectory(prefix="ia-check-") as scratch:
            running = {}
            for name, group in by_pod.items():
                if name:
                    running[name] = (self._start(name, group), len(group))
                    continue
                hosts = Path(scratch) / "hosts"
                hosts.write_text(hosts_file(sorted({h for p in group for h in p.hosts})))
                hosts.chmod(0o644)
                running[name] = (subprocess.Popen(with_hosts(self._probe_argv(group), hosts), stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                                  env=probe_environment()), len(group))
            answers = self._answers(running)
        rows = []
        for name, group in by_pod.items():
            for probe, raw in zip(group, answers[name], strict=False):
                observed, ok = configcheck.judge(probe, raw)
                rows.append(ConfigRow(probe, observed, ok))
        return rows

    def run(self) -> CheckResult:
        """Every probe, those that did not hold run again (twice, `RETRY_AFTER` apart)."""
        ips = {name: pod.ip for name, pod in self.pods.items()}
        result = CheckResult()
        pairwise = []
        for probe in expect.probes(self.plan, ips):
            wanted = expect.expect(self.plan, probe)
            if wanted.kind == expect.UNKNOWN:
                result.notes.append(f"{probe.pod} -> {probe.target} ({probe.via}): {wanted.detail}")
            else:
                pairwise.append(probe)
        derived = configcheck.derive(self.plan)
        gatewaycheck.gateway_probes(self.plan, derived)
        result.notes += derived.notes
        rows: dict[Any, expect.Row | ConfigRow] = {row.probe: row for row in self.run_pairwise(pairwise)}
        rows.update({row.probe: row for row in self.run_config(derived.probes)})
        for _ in range(CHECK_ATTEMPTS - 1):
            failing = [probe for probe, row in rows.items() if not row.ok]
            if not failing:
                break
            time.sleep(RETRY_AFTER)
            rows.update({row.probe: row for row in self.run_pairwise(
                [p for p in failing if isinstance(p, expect.Probe)])})
            rows.update({row.probe: row for row in self.run_config(
                [p for p in failing if isinstance(p, ConfigProbe)])})
        result.rows = [rows[p] for p in [*pairwise, *derived.probes]]
        return result
