"""One real `pilot-agent proxy sidecar` outside any namespace, with istiod-local and the real Envoy.

This is the issue's hand demo as tests: the agent becomes ready through Envoy's
15021 listener, Envoy holds istiod-local's sidecar config and the agent's SDS
secrets, and the lifecycle endpoints and signals behave as upstream's:
SIGTERM drains and exits 0, `/quitquitquit` (POST only) stops, `/drain` (POST
only) drains the inbound listener, Envoy dying takes the agent down with a
non-zero code, readiness is 503 before config and while draining, and an
istiod-local restart is ridden out (a later registry change still arrives).

The agent uses the fixed sidecar ports on the host, so these tests run one
agent at a time; istiod-local listens on free loopback ports.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from fixtures import AgentStarter
from launchers import (
    IstiodLocal,
    PilotAgent,
    RegistryFile,
    agent_environment,
    echo_registry,
    pilot_agent_cli,
    pod_files,
)
from sidecar_harness import (
    SPIFFE_ECHO,
    active_listener_names,
    active_secret,
    config_dump,
    dump_section,
    inline_bytes,
    stats,
)
from support import HTTP_NOT_YET, free_port, http_request, pid_alive, poll, port_accepts

# How long the agent gets beyond its configured drain before a test calls it stuck.
EXIT_MARGIN = 15.0

SidecarStarter = Callable[..., PilotAgent]


@pytest.fixture
def sidecar(tmp_path: Path, start_agent: AgentStarter) -> SidecarStarter:
    """Start `echo-1`'s sidecar in a fresh pod directory, pod files made from istiod-local's `state`."""
    def start(state: Path, discovery: str, proxy_config: dict[str, Any] | None = None) -> PilotAgent:
        pod_dir = pod_files(state, tmp_path / "pod", pod="echo-1")
        return start_agent(pod_dir, agent_environment(discovery=discovery, proxy_config=proxy_config))

    return start


def test_demo_ready_with_config_and_secrets_then_sigterm_exits_zero(istiod: IstiodLocal,
                                                                    sidecar: SidecarStarter) -> None:
    agent = sidecar(istiod.state_dir, istiod.secure_address, proxy_config={"terminationDrainDuration": "1s"})
    agent.wait_ready()
    assert http_request("127.0.0.1", 15020, "/healthz/ready")[0] == 200

    dump = config_dump()
    assert {"virtualOutbound", "virtualInbound"} <= active_listener_names(dump)
    default = active_secret(dump, "default")
    assert default is not None, "no ACTIVE `default` secret in Envoy"
    chain = inline_bytes(default["tls_certificate"]["certificate_chain"])
    leaf = x509.load_pem_x509_certificates(chain)[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [SPIFFE_ECHO]
    root = active_secret(dump, "ROOTCA")
    assert root is not None, "no ACTIVE `ROOTCA` secret in Envoy"
    trusted = inline_bytes(root["validation_context"]["trusted_ca"]).decode()
    pod_root = (agent.pod_dir / "var/run/secrets/istio/root-cert.pem").read_text().strip()
    assert pod_root in trusted

    # The injector's hooks talk to Envoy's admin through `pilot-agent request`.
    info = pilot_agent_cli("request", "GET", "server_info", timeout=30)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["state"] == "LIVE"
    refused = pilot_agent_cli("request", "GET", "server_info", "--debug-port", "15001", timeout=30)
    assert refused.returncode != 0 and "15001" in refused.stderr

    envoy = agent.envoy_pid()
    assert envoy is not None
    agent.signal(signal.SIGTERM)
    assert agent.wait_exit(1 + EXIT_MARGIN) == 0, agent.output()
    assert not pid_alive(envoy), "Envoy outlived the agent"
    assert "termination drain duration elapsed" in agent.output()


def test_quitquitquit_takes_post_only_and_stops_the_agent(istiod: IstiodLocal, sidecar: SidecarStarter) -> None:
    agent = sidecar(istiod.state_dir, istiod.secure_address, proxy_config={"terminationDrainDuration": "1s"})
    agent.wait_ready()
    envoy = agent.envoy_pid()
    assert envoy is not None

    assert http_request("127.0.0.1", 15020, "/quitquitquit")[0] == 405
    assert agent.alive() and pid_alive(envoy)
    assert http_request("127.0.0.1", 15020, "/quitquitquit", method="POST")[0] == 200
    assert agent.wait_exit(1 + EXIT_MARGIN) == 0, agent.output()
    assert not pid_alive(envoy)


def test_drain_endpoint_drains_the_inbound_listener_only(istiod: IstiodLocal, sidecar: SidecarStarter) -> None:
    # drainDuration is Envoy's --drain-time-s: after it, drained listeners close their sockets.
    agent = sidecar(istiod.state_dir, istiod.secure_address, proxy_config={"drainDuration": "1s"})
    agent.wait_ready()
    assert port_accepts(15006) and port_accepts(15001)
    stopped_before = stats().get("listener_manager.listener_stopped", 0)

    assert http_request("127.0.0.1", 15020, "/drain")[0] == 405
    assert http_request("127.0.0.1", 15020, "/drain", method="POST")[0] == 200
    poll(lambda: stats().get("listener_manager.listener_stopped", 0) > stopped_before,
         "Envoy to stop the drained listener", 15, agent.output, retry_on=HTTP_NOT_YET)
    poll(lambda: not port_accepts(15006), "virtualInbound (15006) to stop accepting", 10, agent.output)
    assert port_accepts(15001), "outbound listener drained although the sidecar drains inbound only"
    assert agent.alive(), "/drain must not stop the agent"


def test_envoy_killed_takes_the_agent_down_non_zero(istiod: IstiodLocal, sidecar: SidecarStarter) -> None:
    agent = sidecar(istiod.state_dir, istiod.secure_address)
    agent.wait_ready()
    envoy = agent.envoy_pid()
    assert envoy is not None
    os.kill(envoy, signal.SIGKILL)
    code = agent.wait_exit(EXIT_MARGIN)
    assert code == 255, agent.output()  # upstream exits -1 when Envoy fails
    assert "Envoy exited" in agent.output()


def test_readiness_503_before_config_and_while_draining(tmp_path: Path, registry: RegistryFile,
                                                         sidecar: SidecarStarter) -> None:
    state = tmp_path / "state"
    port = free_port()
    # No istiod yet: pod files create the state (root, token key) istiod-local will serve from later.
    agent = sidecar(state, f"localhost:{port}", proxy_config={"terminationDrainDuration": "3s"})

    # Envoy's own 15021 listener only opens once Envoy has initialized (after its first config),
    # so before config it is the status server that answers, with the reason.
    def not_ready_for_config() -> bool:
        assert agent.alive(), agent.output()
        status, body = http_request("127.0.0.1", 15020, "/healthz/ready", timeout=1)
        assert status != 200, "ready without any istiod"
        return b"config not received" in body

    poll(not_ready_for_config, "the status server to report 503: no config yet", 20, agent.output,
         retry_on=HTTP_NOT_YET)
    assert http_request("127.0.0.1", 15020, "/healthz/ready")[0] == 503

    with IstiodLocal(state, registry=registry, secure_addr=f"127.0.0.1:{port}"):
        agent.wait_ready(timeout=30)
        agent.signal(signal.SIGTERM)
        seen: list[tuple[int, bytes]] = []

        def unready_while_draining() -> bool:
            if not agent.alive():
                raise AssertionError(f"agent exited before readiness went 503; saw {seen}")
            seen.append(http_request("127.0.0.1", 15020, "/healthz/ready", timeout=1))
            return seen[-1][0] == 503

        poll(unready_while_draining, "readiness to go 503 while draining", 10, agent.output, retry_on=HTTP_NOT_YET)
        assert b"DRAINING" in seen[-1][1]
        assert agent.alive()
        assert agent.wait_exit(3 + EXIT_MARGIN) == 0, agent.output()


def active_cluster_names() -> set[str]:
    clusters = dump_section(config_dump(), "ClustersConfigDump").get("dynamic_active_clusters", [])
    return {item["cluster"]["name"] for item in clusters}


def test_istiod_restart_then_registry_change_reaches_envoy(istiod: IstiodLocal, registry: RegistryFile,
                                                           sidecar: SidecarStarter) -> None:
    agent = sidecar(istiod.state_dir, istiod.secure_address)
    agent.wait_ready()
    envoy = agent.envoy_pid()
    istiod.stop()
    # Envoy keeps its config and the agent stays ready (latched) while istiod is away.
    assert http_request("127.0.0.1", 15021, "/healthz/ready")[0] == 200
    istiod.start()  # the same state and ports
    poll(lambda: "ADS: new" in istiod.log_text(), "Envoy's stream to come back through the agent", 30,
         agent.output)

    extra = "outbound|9000||extra.default.svc.cluster.local"
    assert extra not in active_cluster_names()
    registry.write(echo_registry(extra_services=(
        "- {name: extra, namespace: default, selector: {app: extra},"
        " ports: [{name: tcp, port: 9000, targetPort: 9000, protocol: TCP}]}\n")))
    poll(lambda: extra in active_cluster_names(), "the registry change to reach Envoy", 30, agent.output,
         retry_on=HTTP_NOT_YET)
    assert agent.alive() and agent.envoy_pid() == envoy, "the agent or Envoy restarted"
