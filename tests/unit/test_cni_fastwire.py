"""The fast path's pure parts: the framing, the forwarded environment, where a kept-alive HTTP answer ends,
and the launcher's text."""

from __future__ import annotations

import pytest

from istio_agent.cni.install import fastwire
from istio_agent.cni.install.launcher import LauncherError, render
from istio_agent.cni.plugin.kubeclient import ApiError
from istio_agent.cni.plugin.kubepool import response_length


def test_a_request_round_trips_with_only_the_names_the_plugin_reads() -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_ARGS": "K8S_POD_NAME=a;x=é", "ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES": "3",
           "ENVOY_USER": "istio-proxy", "PATH": "/bin", "DRY_RUN_FILE_PATH": "/tmp/x", "HOME": "/root"}
    decoded_env, stdin = fastwire.decode_request(fastwire.encode_request(env, b'{"a": 1}'))
    assert stdin == b'{"a": 1}'
    assert decoded_env == {k: v for k, v in env.items() if k not in ("PATH", "DRY_RUN_FILE_PATH", "HOME")}


def test_the_agent_filters_again_whatever_a_caller_sends() -> None:
    block = b"CNI_COMMAND=ADD\0LD_PRELOAD=/evil.so\0DRY_RUN_FILE_PATH=/x"
    data = fastwire.MAGIC + len(block).to_bytes(4, "big") + block + (0).to_bytes(4, "big")
    assert fastwire.decode_request(data) == ({"CNI_COMMAND": "ADD"}, b"")


@pytest.mark.parametrize("data, what", [
    (b"HTTP/1.1 200 OK\r\n", "bad magic"),
    (fastwire.MAGIC + (5).to_bytes(4, "big") + b"CNI_C", "truncated"),
    (fastwire.encode_request({"CNI_COMMAND": "ADD"}, b"{}") + b"x", "truncated or oversized"),
    (fastwire.MAGIC + (fastwire.MAX_ENV + 1).to_bytes(4, "big"), "exceeds"),
    (fastwire.MAGIC + (3).to_bytes(4, "big") + b"CNI" + (0).to_bytes(4, "big"), "not KEY=VALUE"),
])
def test_a_malformed_request_is_refused_naming_why(data: bytes, what: str) -> None:
    with pytest.raises(fastwire.FrameError, match=what):
        fastwire.decode_request(data)


def test_answers_and_refusals() -> None:
    assert fastwire.decode_reply(fastwire.encode_answer(11, b'{"code": 11}\n', b"log\n")) == (
        11, b'{"code": 11}\n', b"log\n")
    assert fastwire.decode_reply(fastwire.encode_refusal()) is None
    with pytest.raises(fastwire.FrameError):
        fastwire.decode_reply(fastwire.encode_answer(0, b"out", b"err")[:-1])


def test_where_a_kept_alive_answer_ends() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert response_length(head + b"abc") is None
    assert response_length(head + b"abcdeHTTP/1.1") == len(head) + 5
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    assert response_length(chunked) == len(chunked)
    assert response_length(chunked[:-2]) is None
    assert response_length(b"HTTP/1.1 200 OK\r\n\r\nbody") == -1  # to the end of the connection
    assert response_length(b"HTTP/1.1 200 OK\r\nContent-") is None
    with pytest.raises(ApiError, match="Content-Length"):
        response_length(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")


def test_the_launcher_is_deterministic_and_imports_only_builtins() -> None:
    one = render("/opt/py/bin/python3", "/var/run/istio-cni/sidecar-add.sock", ["/opt/app/src"])
    assert one == render("/opt/py/bin/python3", "/var/run/istio-cni/sidecar-add.sock", ["/opt/app/src"])
    text = one.decode()
    assert text.startswith("#!/opt/py/bin/python3 -IS\n")
    imports = sorted(line for line in text.splitlines() if line.startswith(("import ", "from ")))
    assert imports == ["import _socket", "import posix", "import sys"]
    assert "SOCKET = '/var/run/istio-cni/sidecar-add.sock'" in text and "PATHS = ['/opt/app/src']" in text
    compile(text, "istio-cni", "exec")
    for bad in ("python3", "/opt/my py/python3"):
        with pytest.raises(LauncherError, match="absolute path"):
            render(bad, "/x.sock", [])
