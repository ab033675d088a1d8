"""The DNS proxy fed through the real path: istiod-local → XDS proxy (NDS) → DNS proxy, queried with dig.

One real `pilot-agent proxy sidecar` (with Envoy, whose first LDS request makes the
agent subscribe to NDS) and DNS capture on; `dig` asks the agent's DNS proxy on a
private loopback port. Service hosts answer with their clusterIP in every name form,
a ServiceEntry host with its address, and, with ISTIO_META_DNS_AUTO_ALLOCATE, a host
without addresses with a VIP from 240.240.0.0/16. `/debug/ndsz` shows the same table.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterator

import pytest
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment, echo_registry, host_sidecar_ports
from needs import need_sidecar_binaries, need_tool
from support import free_port, http_request

SERVICE_ENTRIES = (
    "serviceEntries:\n"
    "- {name: payments, namespace: default, hosts: [payments.example.test], addresses: [192.0.2.10],"
    " ports: [{name: https, number: 443, protocol: TCP}], resolution: DNS}\n"
    "- {name: auto, namespace: default, hosts: [auto.example.test],"
    " ports: [{name: https, number: 443, protocol: TCP}], resolution: DNS}\n"
)
CLUSTER_IP = "10.96.0.20"


def dig(port: int, name: str, qtype: str = "A") -> tuple[str, list[str]]:
    """(status, answer records) from `dig` against the agent's DNS proxy."""
    out = subprocess.run(
        ["dig", "@127.0.0.1", "-p", str(port), "+tries=1", "+time=2", "+noall", "+comments", "+answer", name, qtype],
        capture_output=True, text=True, timeout=10).stdout
    status = next((line.split("status: ")[1].split(",")[0] for line in out.splitlines() if "status: " in line), "")
    answers = [line for line in out.splitlines() if line and not line.startswith(";")]
    return status, answers


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PilotAgent, int]]:
    need_sidecar_binaries()
    need_tool("dig")
    base = tmp_path_factory.mktemp("dns-agent")
    text = echo_registry().replace("  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]\n",
                                   "  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]\n"
                                   f"  clusterIP: {CLUSTER_IP}\n")
    registry = RegistryFile(base / "mesh.yaml", text + SERVICE_ENTRIES)
    dns_port = free_port()
    with host_sidecar_ports(), IstiodLocal(base / "state", registry=registry) as istiod:
        sidecar = PilotAgent(istiod.pod_files(base / "pod", pod="echo-1"), agent_environment(
            discovery=istiod.secure_address, ISTIO_META_DNS_CAPTURE="true", ISTIO_META_DNS_AUTO_ALLOCATE="true",
            DNS_PROXY_ADDR=f"127.0.0.1:{dns_port}"))
        try:
            sidecar.start().wait_ready(timeout=30)
            yield sidecar, dns_port
        finally:
            sidecar.kill()


@pytest.mark.parametrize("name", [
    "echo.default.svc.cluster.local", "echo.default.svc", "echo.default", "echo", "ECHO.Default.SVC.cluster.local",
])
def test_service_name_forms_answer_with_the_cluster_ip(agent: tuple[PilotAgent, int], name: str) -> None:
    _, port = agent
    status, answers = dig(port, name)
    assert status == "NOERROR", answers
    assert [a.split()[-1] for a in answers] == [CLUSTER_IP]
    assert all(a.split()[1] == "30" for a in answers), answers  # TTL 30


def test_aaaa_for_ipv4_only_host_is_empty_noerror(agent: tuple[PilotAgent, int]) -> None:
    status, answers = dig(agent[1], "echo.default.svc.cluster.local", "AAAA")
    assert (status, answers) == ("NOERROR", [])


def test_service_entry_hosts(agent: tuple[PilotAgent, int]) -> None:
    status, answers = dig(agent[1], "payments.example.test")
    assert status == "NOERROR"
    assert [a.split()[-1] for a in answers] == ["192.0.2.10"]
    status, answers = dig(agent[1], "auto.example.test")
    assert status == "NOERROR"
    vip = ipaddress.ip_address(answers[0].split()[-1])
    assert vip in ipaddress.ip_network("240.240.0.0/16")


def test_ndsz_shows_the_table_the_proxy_serves(agent: tuple[PilotAgent, int]) -> None:
    status, body = http_request("127.0.0.1", 15020, "/debug/ndsz")
    assert status == 200
    table = json.loads(body)["table"]
    assert table["echo.default.svc.cluster.local"]["ips"] == [CLUSTER_IP]
    assert "payments.example.test" in table


def test_readiness_and_metrics_count_local_answers(agent: tuple[PilotAgent, int]) -> None:
    dig(agent[1], "echo")
    status, body = http_request("127.0.0.1", 15020, "/stats/prometheus")
    assert status == 200
    lines = [line for line in body.decode().splitlines() if line.startswith("istio_agent_dns_queries_total")]
    assert any('outcome="local"' in line and not line.endswith(" 0.0") for line in lines), lines


def test_the_forwarder_starts_no_libuv_thread_pool(agent: tuple[PilotAgent, int]) -> None:
    """Its upstream sockets are connected by the proxy itself: uvloop's remote_addr= would resolve the numeric
    address on libuv's thread pool, whose four threads would then stay for the agent's life."""
    from pathlib import Path

    sidecar, _ = agent
    names = [(task / "comm").read_text().strip() for task in Path(f"/proc/{sidecar.pid}/task").iterdir()]
    assert [n for n in names if n.startswith("libuv")] == [], names
