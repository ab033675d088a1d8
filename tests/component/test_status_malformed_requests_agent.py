"""Malformed requests to a real agent's status port: each answered 400, counted, and logged in one line at most.

Before, every one logged an ERROR with a nine-line traceback, so any client that
could reach :15020 could flood the agent's log.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

from fixtures import AgentStarter
from launchers import agent_environment, http_request
from support import free_port

MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  # a TLS ClientHello
    b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
]
ROUNDS = 40


def send(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        return conn.recv(64)


def test_malformed_requests_are_answered_400_counted_and_logged_once(tmp_path: Path,
                                                                      start_agent: AgentStarter) -> None:
    port = free_port()
    environment = agent_environment(proxy_config={"statusPort": port, "discoveryAddress": "127.0.0.1:1"},
                                    DISABLE_ENVOY="true")
    agent = start_agent(tmp_path, environment)
    agent.wait_answering(port, "/stats/prometheus")
    answers = [send(port, payload) for _ in range(ROUNDS) for payload in MALFORMED]
    assert all(re.match(rb"HTTP/1\.[01] 4\d\d ", answer) for answer in answers), {a[:20] for a in answers}

    status, body = http_request("127.0.0.1", port, "/stats/prometheus", timeout=5)
    assert status == 200, "the server keeps serving"
    counted = re.search(rb"^istio_agent_status_malformed_requests_total (\S+)$", body, re.M)
    assert counted is not None and float(counted.group(1)) == len(answers), counted
    log = agent.output(lines=400)
    assert "Traceback" not in log and "Error handling request" not in log, log
    assert log.count("malformed request(s) answered 400") == 1, log
