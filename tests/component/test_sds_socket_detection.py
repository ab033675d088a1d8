"""Start-up detection of other SDS servers' sockets (upstream's checkSocket), against real listeners."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_options
from istio_agent.agent.options import AgentFlags
from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.security.socket_check import check_socket

POD = {"POD_NAME": "app-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "app", "INSTANCE_IP": "10.1.1.5"}


@pytest.fixture
def pod() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pod", dir="/tmp") as directory:
        yield Path(directory)


def listen(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    return server


def test_a_listening_socket_is_healthy_and_a_dead_one_is_removed(pod: Path) -> None:
    live, dead = pod / "live", pod / "dead"
    server = listen(live)
    try:
        assert check_socket(live) and live.exists()
    finally:
        server.close()
    listen(dead).close()  # the file stays, nobody listens
    assert not check_socket(dead) and not dead.exists(), "a stale socket is removed, as upstream"
    assert not check_socket(pod / "absent")
    (pod / "dir").mkdir()
    assert not check_socket(pod / "dir") and (pod / "dir").is_dir()


def test_a_long_socket_path_is_checked_through_its_directory(pod: Path) -> None:
    deep = pod / ("d" * 100) / "socket"
    deep.parent.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(deep.parent, os.O_RDONLY)
    try:
        server.bind(f"/proc/self/fd/{fd}/socket")
        server.listen(1)
        assert len(str(deep)) > 108 and check_socket(deep)
    finally:
        server.close()
        os.close(fd)


def test_start_up_finds_the_other_servers(pod: Path) -> None:
    workload = listen(pod / "var/run/secrets/workload-spiffe-uds/spire.sock")
    credential = listen(pod / "var/run/secrets/credential-uds/socket")
    try:
        options = load_agent_options(AgentFlags(), env.Environment(
            {**POD, "WORKLOAD_IDENTITY_SOCKET_FILE": "spire.sock"}), pod)
    finally:
        workload.close()
        credential.close()
    assert options.security.serve_only_files
    assert options.metadata["credential"] == "true" and options.metadata["file-credential"] == "true"
    with pytest.raises(ConfigError, match=r"spire\.sock"):
        load_agent_options(AgentFlags(), env.Environment({**POD, "WORKLOAD_IDENTITY_SOCKET_FILE": "spire.sock"}), pod)


def test_mounted_workload_credentials_need_no_root_for_a_ca(pod: Path) -> None:
    """Upstream makes no CA client when ./var/run/secrets/workload-spiffe-credentials holds a chain, a key and a
    root, so PILOT_CERT_PROVIDER=none needs no CA root then (its xDS root is ./etc/certs/root-cert.pem here)."""
    creds = pod / "var/run/secrets/workload-spiffe-credentials"
    creds.mkdir(parents=True)
    for name in ("cert-chain.pem", "key.pem", "root-cert.pem"):
        (creds / name).write_text("x")
    (pod / "etc/certs").mkdir(parents=True)
    (pod / "etc/certs/root-cert.pem").write_text("x")
    environment = env.Environment({"PILOT_CERT_PROVIDER": "none", "CLOUD_PLATFORM": "none"})
    assert load_agent_options(AgentFlags(), environment, pod).security.ca_root_ca == ""
    (creds / "key.pem").unlink()
    with pytest.raises(ConfigError, match="CA_ROOT_CA"):
        load_agent_options(AgentFlags(), environment, pod)
