"""A pod's host port (`istiod_local.node.hostport`): a port on the host's loopback leading into another network
namespace, bytes both ways and the half-close, and a port already taken refused with the reason (root)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from needs import need_root, need_tool
from support import free_port, loopback_netns, poll

from istiod_local.node.hostport import start_forwarder
from istiod_local.node.processes import NodeError

pytestmark = pytest.mark.root

# Inside the namespace: answer each connection with everything it sent, once the client has finished sending.
ECHO = r"""
import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.sendall(b"echo:" + data)
    conn.close()
"""


@pytest.fixture
def netns() -> Iterator[str]:
    need_root()
    need_tool("ip")
    with loopback_netns("iahp-") as name:
        yield name


def test_a_host_port_leads_into_the_namespace(netns: str, tmp_path: Path) -> None:
    echo = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", ECHO, "8080"],
                            stdout=subprocess.PIPE, text=True)
    forwarder = None
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        port = free_port()
        forwarder = start_forwarder("test host port", sys.executable, f"127.0.0.1:{port}", f"/var/run/netns/{netns}",
                                    "127.0.0.1:8080", tmp_path / "hostport.log")
        # 127.0.0.1:8080 on the host is not the namespace's: only the forwarder leads there
        payload = b"x" * 200_000
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)  # the half-close reaches the server, which then answers
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer == b"echo:" + payload
        # the forwarder lives in the node's namespace: the node's teardown finds it there
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
        assert str(forwarder.pid) in pids
        with pytest.raises(NodeError, match="Address already in use"):
            start_forwarder("second", sys.executable, f"127.0.0.1:{port}", f"/var/run/netns/{netns}",
                            "127.0.0.1:8080", tmp_path / "second.log")
    finally:
        if forwarder is not None:
            forwarder.stop(5)
        echo.kill()
        echo.wait()
    poll(lambda: not subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.strip()
         or None, "the namespace's processes to end", 10)
