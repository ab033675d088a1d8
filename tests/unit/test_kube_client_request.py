"""The builtins-only client's one request of any method, with a body, over a connection the caller opens
(`connect`): what goes on the wire and what comes back, over a socket pair (the peer answers as an API server)."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from istio_agent.kube import client as kube

CFG = kube.KubeConfig("http", "10.0.0.1", 6443, token="abc")


def answer_once(peer: socket.socket, response: bytes, seen: list[bytes]) -> threading.Thread:
    """Read one request (head and Content-Length body), answer it, close."""

    def serve() -> None:
        with peer:
            data = b""
            while b"\r\n\r\n" not in data:
                data += peer.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += peer.recv(65536)
            seen.append(head + b"\r\n\r\n" + body)
            peer.sendall(response)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_a_patch_with_a_body_over_the_callers_connection() -> None:
    ours, peer = socket.socketpair()
    seen: list[bytes] = []
    reply = json.dumps({"kind": "Pod", "metadata": {"name": "p"}}).encode()
    server = answer_once(peer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(reply)).encode() + b"\r\n\r\n" + reply, seen)
    asked: list[tuple[str, int, float]] = []

    def connect(host: str, port: int, timeout: float) -> socket.socket:
        asked.append((host, port, timeout))
        return ours

    body = json.dumps({"status": {"phase": "Running"}}).encode()
    status, payload = kube.request(CFG, "PATCH", kube.pod_path(CFG, "default", "p") + "/status", body,
                                   "application/strategic-merge-patch+json", timeout=3.0, connect=connect,
                                   user_agent="kubelet")
    server.join(5)
    assert asked == [("10.0.0.1", 6443, 3.0)]
    assert (status, json.loads(payload)) == (200, {"kind": "Pod", "metadata": {"name": "p"}})
    head, _, sent_body = seen[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "PATCH /api/v1/namespaces/default/pods/p/status HTTP/1.1"
    assert {"Host: 10.0.0.1:6443", "User-Agent: kubelet", "Connection: close", "Authorization: Bearer abc",
            "Content-Type: application/strategic-merge-patch+json", f"Content-Length: {len(body)}"} <= set(lines)
    assert sent_body == body


def test_a_get_sends_no_body_and_reads_a_chunked_answer_to_the_end() -> None:
    ours, peer = socket.socketpair()
    seen: list[bytes] = []
    server = answer_once(peer, b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n", seen)
    status, payload = kube.request(CFG, "GET", "/version", connect=lambda host, port, timeout: ours)
    server.join(5)
    assert (status, payload) == (404, b'{"a":1}')
    assert seen[0].startswith(b"GET /version HTTP/1.1\r\n") and seen[0].endswith(b"\r\n\r\n")
    assert b"Content-Length" not in seen[0] and b"Content-Type" not in seen[0]


def test_a_connection_that_cannot_be_made_is_an_api_error_naming_the_server() -> None:
    def refuse(host: str, port: int, timeout: float) -> socket.socket:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(kube.ApiError, match=r"cannot connect to the API server http://10.0.0.1:6443: "
                                            r"Connection refused") as caught:
        kube.request(CFG, "GET", "/version", connect=refuse)
    assert caught.value.status == 0
