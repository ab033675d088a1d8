"""Hostile `file-root:` names against a running `pilot-agent`: refused with a clear error, the agent unharmed.

A FIFO nobody writes to would block a reader forever, `/dev/zero` never ends,
a 100 MB file would be read into memory: each is refused by the SDS server with
a reason, while the status server on the same event loop keeps answering
/healthz/ready (asked while the request is outstanding), the agent's memory
does not grow by the file's size, and `default` is still served afterwards.
CPU and RSS figures over many such requests are in benchmarks/bench_sds_hostile.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fixtures import AgentStarter
from launchers import IstiodLocal, PilotAgent, agent_environment
from security_harness import SdsClient, secrets_of, sleep_pod
from support import free_port, http_request, poll, rss_mb

HUNDRED_MB = 100 * 1024 * 1024


@pytest.fixture
def hostile_files(tmp_path: Path) -> Iterator[dict[str, Path]]:
    files = tmp_path / "hostile"
    files.mkdir()
    fifo = files / "fifo.pem"
    os.mkfifo(fifo)
    big = files / "big.pem"
    with big.open("wb") as handle:
        handle.truncate(HUNDRED_MB)  # sparse: no disk used, but 100 MB to read
    yield {"a FIFO": fifo, "a character device": Path("/dev/zero"), "larger than the 4 MiB limit": big}


def start_sidecar(tmp_path: Path, istiod: IstiodLocal, start_agent: AgentStarter) -> tuple[PilotAgent, Path, int]:
    pod = sleep_pod(istiod, tmp_path / "pod")
    status_port = free_port()
    agent = start_agent(pod, agent_environment(
        pod="sleep-1", service_account="sleep", discovery=istiod.secure_address,
        proxy_config={"statusPort": status_port}))
    agent.wait_answering(status_port, timeout=60)
    socket = pod / "var/run/secrets/workload-spiffe-uds/socket"
    poll(socket.exists, "the SDS socket", 30, agent.output)
    return agent, socket, status_port


async def refused_while_ready_answers(socket: Path, name: str, status_port: int) -> tuple[str, int]:
    """Ask for `name`; while that request is outstanding ask for readiness; (the refusal, readiness's status)."""
    client = SdsClient(socket)
    try:
        await client.request([name])
        status, _ = await asyncio.to_thread(http_request, "127.0.0.1", status_port, "/healthz/ready", timeout=5.0)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.read()
        return error.value.details() or "", status
    finally:
        await client.close()


async def test_fifo_device_and_huge_file_are_refused_while_the_agent_keeps_answering(
        tmp_path: Path, istiod: IstiodLocal, start_agent: AgentStarter, hostile_files: dict[str, Path]) -> None:
    agent, socket, status_port = start_sidecar(tmp_path, istiod, start_agent)
    rss_before = rss_mb(agent.pid)
    for _ in range(5):
        for reason, path in hostile_files.items():
            details, status = await refused_while_ready_answers(socket, f"file-root:{path}", status_port)
            assert f"failed to generate secret for file-root:{path}" in details
            assert reason in details, details
            assert status in (200, 503), "the status server answered while the SDS request was outstanding"
    assert agent.alive(), agent.output()
    grown = rss_mb(agent.pid) - rss_before
    assert grown < 50, f"the agent grew by {grown:.0f} MiB: a refused file was read anyway"

    client = SdsClient(socket)
    try:
        await client.request(["default"])
        assert "default" in secrets_of(await client.read())
    finally:
        await client.close()
