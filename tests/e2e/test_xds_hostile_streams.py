"""Issue 16 item 4: a real agent under rounds of hostile streams on its XDS socket gives its memory back.

`pilot-agent proxy sidecar` runs with istiod-local and the real Envoy; five
rounds of 200 concurrent hostile clients (`tests/xds_hostile.py`: non-HTTP/2
junk, messages that are not DiscoveryRequests, 5 MB and truncated messages, each
round in a child process so that all its connections are closed when it ends)
hit `etc/istio/proxy/XDS`. After the last round the agent's RSS (its Python
process alone) must come back within 10 MB of what it was before the first;
the figures of every round are in the failure message. Envoy must keep its own
ADS stream throughout (none of these streams sends a valid request, so none
replaces it), the agent must not dial istiod for them (nor istiod-local see
one of their streams), and the agent must hold no more file descriptors than
before.

Timing is `benchmarks/bench_xds_hostile_streams.py`'s business; this test only
waits, with deadlines, for memory and connections to settle.
"""

from __future__ import annotations

import os
from pathlib import Path

from fixtures import AgentStarter
from launchers import IstiodLocal, PilotAgent, agent_environment, pod_files
from sidecar_harness import stats
from support import http_request, poll, rss_mb
from xds_hostile import hostile_round_in_child

ROUNDS = 5
STREAMS = 200
BOUND_MB = 10.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _ads_streams(istiod: IstiodLocal) -> int:
    """ADS streams istiod-local accepted (one line each, once the first request names a node)."""
    return sum("ADS: new" in line for line in istiod.lines)


def _upstream_dials(agent: PilotAgent) -> int:
    """Upstream streams the agent opened: it logs one line for each."""
    assert agent.log is not None
    return sum(") connected to " in line for line in agent.log.lines)


def _envoy_xds(name: str) -> int:
    """A stat of Envoy's `xds-grpc` cluster (Istio's bootstrap writes it `cluster.xds-grpc;.<name>`)."""
    found = {key.replace(";", ""): value for key, value in stats().items() if "xds-grpc" in key}
    return found[f"cluster.xds-grpc.{name}"]


def _settled_rss(pid: int) -> float:
    """RSS once it stops moving: three readings half a second apart within 1 MB."""
    readings: list[float] = []

    def steady() -> float | None:
        readings.append(rss_mb(pid))
        last = readings[-3:]
        return last[-1] if len(last) == 3 and max(last) - min(last) < 1.0 else None

    return poll(steady, "the agent's RSS to settle", 30, lambda: f"readings: {readings}", interval=0.5)


def test_hostile_streams_leave_memory_envoy_and_istiod_alone(tmp_path: Path, istiod: IstiodLocal,
                                                               start_agent: AgentStarter) -> None:
    pod = pod_files(istiod.state_dir, tmp_path / "pod", pod="echo-1")
    agent = start_agent(pod, agent_environment(discovery=istiod.secure_address))
    agent.wait_ready()
    socket = pod / "etc/istio/proxy/XDS"
    pid = agent.pid
    # One garbage stream first: every stream's end makes the agent trim its heap a second later, so the
    # baseline is a trimmed heap, as every figure after a round is.
    hostile_round_in_child(socket, 1, seed=99)
    before = _settled_rss(pid)
    fds_before, ads_before, dials_before = _fds(pid), _ads_streams(istiod), _upstream_dials(agent)
    envoy_connections = _envoy_xds("upstream_cx_total")

    after: list[float] = []
    for n in range(ROUNDS):
        outcomes = hostile_round_in_child(socket, STREAMS, seed=n)
        # What each kind got: refusals by size and by parse, never a stream served upstream.
        assert set(outcomes["huge_sotw"]) == {"status RESOURCE_EXHAUSTED"}, outcomes
        assert set(outcomes["huge_delta"]) == {"status RESOURCE_EXHAUSTED"}, outcomes
        assert set(outcomes["bad_proto"]) == {"status INVALID_ARGUMENT"}, outcomes
        assert set(outcomes["truncated_eos"]) == {"trailers"}, outcomes
        after.append(_settled_rss(pid))

    figures = f"RSS before {before:.1f} MB, after each round {[round(v, 1) for v in after]}"
    poll(lambda: rss_mb(pid) <= before + BOUND_MB, f"the agent's RSS within {BOUND_MB:g} MB of before", 30,
         lambda: f"{figures}, now {rss_mb(pid):.1f}\n{agent.output()}")
    poll(lambda: _fds(pid) <= fds_before, "the agent's file descriptors back to before", 30,
         lambda: f"{fds_before} before, {_fds(pid)} now")
    assert agent.alive(), agent.output()
    assert _envoy_xds("upstream_cx_total") == envoy_connections, "Envoy's ADS stream was replaced"
    assert _envoy_xds("upstream_cx_active") == 1
    assert http_request("127.0.0.1", 15021, "/healthz/ready")[0] == 200
    assert _upstream_dials(agent) == dials_before, "the agent dialled istiod for a hostile stream"
    assert _ads_streams(istiod) == ads_before, "a hostile stream reached istiod"
