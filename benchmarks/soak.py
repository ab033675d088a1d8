"""One hour of rotations and pushes: does either agent's memory grow? (`make soak`; needs root; not in `make test`
or `make bench`.)

One sidecar agent of each implementation, ours and upstream's Go one (`upstream_arm.py`), each in its own
network namespace with its istiod-local and its Envoy (the same binary), DNS proxy on, side by side for
`BENCH_SOAK_SECONDS` (3600):

- **rotations**: SECRET_TTL `BENCH_SOAK_TTL` (6 min), so each agent rotates its workload certificate every
  ~3 minutes (half the lifetime) and pushes it to Envoy over SDS;
- **pushes**: every `BENCH_SOAK_PUSH_SECONDS` (30) both registries flip between one service and
  `BENCH_SOAK_SERVICES` (1,000) services x 5 ports (`bench_xds`'s 5,000-cluster push), so every 30 s each
  agent relays a push (xDS to Envoy, NDS into its DNS proxy), one large, the next small;
- **samples**: each minute, each agent's VmRSS and RssAnon (the agent process alone) and the serial of the
  certificate its Envoy holds (admin /certs), printed as a line per minute.

At the end both curves, and per agent the growth (median of the last 10 minutes' samples minus the median of
the first 10 minutes' after the first 5), the least-squares slope in MB per hour over the samples after the
first 5 minutes, and how many rotations and pushes it went through. Last line, one JSON object: `{"minutes",
"rss_mb": [...], "upstream_rss_mb": [...], "anon_mb": [...], "upstream_anon_mb": [...], "rss_growth_mb",
"upstream_rss_growth_mb", "rss_slope_mb_per_h", "upstream_rss_slope_mb_per_h", "rotations",
"upstream_rotations", "pushes"}` (`"upstream": "<why>"` in place of upstream's when its commands are missing).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_xds import Arm, big_registry, small_registry
from launchers import pod_files
from support import HTTP_NOT_YET, compile_sources, poll, rss_mb
from upstream_arm import GO, OURS, missing, say_missing, sidecar_environment, start_agent

SECONDS = float(os.environ.get("BENCH_SOAK_SECONDS", "3600"))
TTL = os.environ.get("BENCH_SOAK_TTL", "6m")
PUSH_SECONDS = float(os.environ.get("BENCH_SOAK_PUSH_SECONDS", "30"))
SERVICES = int(os.environ.get("BENCH_SOAK_SERVICES", "1000"))
SAMPLE_SECONDS = 60.0
WARM_UP_SAMPLES = 5
WINDOW = 10


def envoy_serial(arm: Arm) -> str:
    """The serial of the workload certificate the arm's Envoy holds ("" before it has one)."""
    try:
        certs = json.loads(arm.admin("/certs"))
    except HTTP_NOT_YET:  # a JSONDecodeError is a ValueError
        return ""
    for entry in certs.get("certificates", []):
        for cert in entry.get("cert_chain", []):
            if cert.get("serial_number"):
                return str(cert["serial_number"])
    return ""


def slope_per_hour(values: list[float]) -> float:
    """Least-squares slope of one-a-minute samples, in units per hour."""
    if len(values) < 2:
        return 0.0
    xs = range(len(values))
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(values)
    var = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, values, strict=True)) / var * 60 if var else 0.0


def growth(values: list[float]) -> float:
    settled = values[WARM_UP_SAMPLES:]
    if len(settled) < 2 * WINDOW:
        settled = values
    window = max(1, min(WINDOW, len(settled) // 2))
    return statistics.median(settled[-window:]) - statistics.median(settled[:window])


def main() -> int:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("soak needs root and iproute2 (network namespaces)", file=sys.stderr)
        return 2
    compile_sources()
    why_not = missing("pilot-agent")
    if why_not:
        say_missing("soak", why_not)
    implementations = [OURS] if why_not else [OURS, GO]
    base = Path(tempfile.mkdtemp(prefix="soak-"))
    state = base / "state"
    arms = {name: Arm(f"soak-{name}", base, state) for name in implementations}
    curves: dict[str, dict[str, list[float]]] = {name: {"rss": [], "anon": []} for name in implementations}
    serials: dict[str, set[str]] = {name: set() for name in implementations}
    pushes = 0
    try:
        pods = {}
        for name, arm in arms.items():
            arm.create()
            pods[name] = pod_files(state, arm.dir / "pod", pod="echo-1")
        for name, arm in arms.items():
            arm.start_istiod()
            environment = sidecar_environment(ISTIO_META_DNS_CAPTURE="true", SECRET_TTL=TTL)
            arm.agent = start_agent(name, pods[name], environment, prefix=arm.prefix(), log_file=arm.dir / "agent.log")
        for name, arm in arms.items():
            agent = arm.agent
            assert agent is not None
            poll(arm.settled, f"{name}'s Envoy", 60, agent.output, retry_on=HTTP_NOT_YET)
        print(f"soak: {SECONDS / 60:g} min, SECRET_TTL {TTL}, a push every {PUSH_SECONDS:g} s (1 <-> {SERVICES} "
              f"services x 5 ports), RSS each minute; agents: {', '.join(implementations)}", flush=True)
        started = time.monotonic()
        next_push, next_sample, big = started + PUSH_SECONDS, started, False
        while time.monotonic() - started < SECONDS:
            now = time.monotonic()
            if now >= next_push:
                big = not big
                for arm in arms.values():
                    arm.registry.write(big_registry(SERVICES) if big else small_registry())
                pushes += 1
                next_push += PUSH_SECONDS
            if now >= next_sample:
                line = [f"{(now - started) / 60:5.1f} min"]
                for name, arm in arms.items():
                    agent = arm.agent
                    assert agent is not None
                    if not agent.alive():
                        raise SystemExit(f"{name}'s agent exited:\n{agent.output()}")
                    curves[name]["rss"].append(rss_mb(agent.pid))
                    curves[name]["anon"].append(rss_mb(agent.pid, "RssAnon"))
                    serial = envoy_serial(arm)
                    if serial:
                        serials[name].add(serial)
                    line.append(f"{name} RSS {curves[name]['rss'][-1]:6.1f} MB (anon {curves[name]['anon'][-1]:5.1f}),"
                                f" {len(serials[name])} certificates")
                print(";  ".join(line), flush=True)
                next_sample += SAMPLE_SECONDS
            time.sleep(max(0.0, min(next_push, next_sample) - time.monotonic()))
    finally:
        for arm in arms.values():
            if arm.agent is not None:
                arm.agent.kill()
            arm.stop()
        shutil.rmtree(base, ignore_errors=True)
    out: dict[str, Any] = {"minutes": len(curves[OURS]["rss"]), "pushes": pushes}
    for name in implementations:
        prefix = "" if name == OURS else "upstream_"
        rss, anon = curves[name]["rss"], curves[name]["anon"]
        out.update({
            f"{prefix}rss_mb": [round(v, 1) for v in rss], f"{prefix}anon_mb": [round(v, 1) for v in anon],
            f"{prefix}rss_growth_mb": round(growth(rss), 1), f"{prefix}anon_growth_mb": round(growth(anon), 1),
            f"{prefix}rss_slope_mb_per_h": round(slope_per_hour(rss[WARM_UP_SAMPLES:]), 2),
            f"{prefix}rotations": max(0, len(serials[name]) - 1),
        })
        print(f"{name}: RSS {' '.join(f'{v:.1f}' for v in rss)}")
        print(f"{name}: growth {out[f'{prefix}rss_growth_mb']} MB (anonymous {out[f'{prefix}anon_growth_mb']}), slope "
              f"{out[f'{prefix}rss_slope_mb_per_h']} MB/h after the first {WARM_UP_SAMPLES} min, "
              f"{out[f'{prefix}rotations']} rotations, {pushes} pushes", flush=True)
    if why_not:
        out["upstream"] = why_not
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
