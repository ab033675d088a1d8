"""SIGTERM under load with EXIT_ON_ZERO_ACTIVE_CONNECTIONS: no request fails, Envoy waits for the last one.

Inbound traffic needs its original destination, which only capture rules give,
so this test builds a pod network namespace with `istio-iptables` capture and
a client namespace joined to it by a veth pair. istiod-local, the HTTP app on
the workload's targetPort 8080, and the agent with its Envoy run in the pod;
the load generator runs in the client and calls `<pod IP>:8080`, which the
rules send through Envoy's `virtualInbound`.

terminationDrainDuration is 1s and two in-flight requests are held by the app
until well after that (and until the other clients are done): only the
connection-counting drain keeps Envoy alive long enough for them to succeed.
The lifecycle endpoints are also checked from the client namespace: not from
localhost, so refused.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures import AgentStarter
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment, echo_registry
from sidecar_harness import Netns, netns_prefix
from support import LineCollector, poll, stop_process

WORKERS = 4
SLOW = 2
AFTER_TERM = 10
# How long after SIGTERM the held requests stay unanswered: past terminationDrainDuration (1s)
# and MINIMUM_DRAIN_DURATION (1s), so an agent that ignored the connections would have stopped Envoy.
HOLD_AFTER_SIGTERM = 2.5


@dataclass
class Pod:
    netns: Netns
    agent: PilotAgent
    app: subprocess.Popen[str]


@pytest.fixture
def registry(tmp_path: Path) -> RegistryFile:
    """echo-1 at the pod's address."""
    return RegistryFile(tmp_path / "mesh.yaml", echo_registry(workload_ip=Netns.POD_IP))


@pytest.fixture
def pod_netns() -> Iterator[Netns]:
    Netns.check_prerequisites()
    netns = Netns()
    try:
        netns.create()
        yield netns
    finally:
        netns.destroy()


@pytest.fixture
def pod(tmp_path: Path, registry: RegistryFile, pod_netns: Netns, start_agent: AgentStarter) -> Iterator[Pod]:
    netns = pod_netns
    with IstiodLocal(tmp_path / "state", registry=registry, prefix=netns_prefix(netns.pod)) as istiod:
        pod_dir = istiod.pod_files(tmp_path / "pod", pod="echo-1")
        app = netns.exec_python(netns.pod, "app", "8080", stdin=subprocess.PIPE)
        try:
            assert app.stdout is not None and app.stdout.readline().strip() == "READY"
            agent = start_agent(pod_dir, agent_environment(
                discovery=istiod.secure_address, instance_ip=Netns.POD_IP,
                proxy_config={"terminationDrainDuration": "1s"},
                EXIT_ON_ZERO_ACTIVE_CONNECTIONS="true", MINIMUM_DRAIN_DURATION="1s"), prefix=netns_prefix(netns.pod))
            poll(lambda: netns.http(netns.pod, "http://127.0.0.1:15021/healthz/ready")[0] == 200,
                 "the agent in the pod to be ready", 30, agent.output)
            yield Pod(netns, agent, app)
        finally:  # the agent goes with `start_agent`, before the namespaces
            stop_process(app, grace=2)
            for stream in (app.stdin, app.stdout, app.stderr):
                if stream is not None:
                    stream.close()


def test_lifecycle_endpoints_refuse_other_hosts(pod: Pod) -> None:
    netns = pod.netns
    for path in ("/quitquitquit", "/drain"):
        status, _ = netns.http(netns.client, f"http://{Netns.POD_IP}:15020{path}", method="POST")
        assert status == 403, path
    assert netns.http(netns.client, f"http://{Netns.POD_IP}:15020/healthz/ready")[0] == 200
    assert pod.agent.alive()


def test_sigterm_under_load_fails_no_request_and_exits_zero(pod: Pod) -> None:
    netns, agent = pod.netns, pod.agent
    load = netns.exec_python(
        netns.client, "loadgen", f"{Netns.POD_IP}:8080", "--workers", str(WORKERS), "--slow", str(SLOW),
        "--after-term", str(AFTER_TERM), stdin=subprocess.PIPE)
    assert load.stdin is not None and load.stdout is not None
    out = LineCollector(load.stdout)
    try:
        poll(lambda: "READY\n" in out.lines, "the load to flow", 20, lambda: out.text() + agent.output())
        load.stdin.write("slow\n")
        load.stdin.flush()
        poll(lambda: "SLOW-SENT\n" in out.lines, "the slow requests to be sent", 10, out.text)

        agent.signal(signal.SIGTERM)
        terminated = time.monotonic()
        load.stdin.write("term\n")
        load.stdin.close()
        poll(lambda: "FAST-DONE\n" in out.lines, "the other clients to finish", 30, out.text)
        time.sleep(max(0.0, terminated + HOLD_AFTER_SIGTERM - time.monotonic()))
        assert agent.alive(), f"the agent did not wait for the held requests:\n{agent.output()}"
        assert pod.app.stdin is not None
        pod.app.stdin.write("release\n")
        pod.app.stdin.flush()
        load.wait(30)
        out.join(10)  # every line it wrote has been read
        summary = json.loads(out.lines[-1])
        assert summary["failed"] == 0, summary
        assert summary["not_proxied"] == 0, "requests bypassed the sidecar"
        assert summary["slow_ok"] == SLOW, summary
        assert summary["ok_after_term"] >= WORKERS * AFTER_TERM, summary

        assert agent.wait_exit(20) == 0, agent.output()
        assert "no active downstream connections" in agent.output()
    finally:
        stop_process(load, grace=2)
