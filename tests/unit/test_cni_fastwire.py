"""The fast path's pure parts: the framing (install-cni's side and the launcher's `fastclient`), the forwarded
environment, where a kept-alive HTTP answer ends, and the launcher's text."""

from __future__ import annotations

import pytest

from istio_agent.cni.install import fastclient, fastwire
from istio_agent.cni.install.launcher import LauncherError, render
from istio_agent.kube.client import ApiError
from istio_agent.kube.keepalive import response_length


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


def test_install_cni_knows_when_a_request_is_whole() -> None:
    """`request_size` from every prefix: more than the prefix until it is all there; a bad frame at once."""
    request = fastwire.encode_request({"CNI_COMMAND": "ADD", "CNI_ARGS": "K8S_POD_NAME=a"}, b'{"x": 1}')
    for cut in range(len(request)):
        assert fastwire.request_size(request[:cut]) > cut
    assert fastwire.request_size(request) == fastwire.request_size(request + b"more") == len(request)
    with pytest.raises(fastwire.FrameError, match="bad magic"):
        fastwire.request_size(b"GET / HTTP/1.1")
    with pytest.raises(fastwire.FrameError, match="exceeds"):
        fastwire.request_size(fastwire.MAGIC + (fastwire.MAX_ENV + 1).to_bytes(4, "big"))
    with pytest.raises(fastwire.FrameError, match="exceeds"):
        fastwire.request_size(fastwire.MAGIC + (0).to_bytes(4, "big") + (fastwire.MAX_STDIN + 1).to_bytes(4, "big"))


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


def test_the_launchers_request_is_the_agents() -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_ARGS": "K8S_POD_NAME=a", "ENVOY_USER": "istio-proxy", "PATH": "/bin",
           "DRY_RUN_FILE_PATH": "/tmp/x", "ISTIO_META_X": "y"}
    raw = {k.encode(): v.encode() for k, v in env.items()}
    assert fastclient.request(raw, b"{}") == fastwire.encode_request(env, b"{}")


@pytest.mark.parametrize("reply", [
    fastwire.encode_answer(0, b'{"cniVersion": "1.0.0"}\n', b"log line\n"),
    fastwire.encode_answer(11, b"", b""),
    fastwire.encode_answer(1, b"x" * 70000, b"y" * 3),
    fastwire.encode_refusal(),
])
def test_the_launcher_knows_when_a_reply_is_whole(reply: bytes) -> None:
    """`reply_size` from every prefix: more than the prefix until it is all there, then exactly its length."""
    for cut in range(len(reply)):
        assert fastclient.reply_size(reply[:cut]) > cut
    assert fastclient.reply_size(reply) == len(reply)
    decoded = fastwire.decode_reply(reply)
    assert fastclient.parse_reply(reply) == decoded


def test_the_launcher_names_what_is_wrong_with_a_reply() -> None:
    answer = fastwire.encode_answer(0, b"out", b"err")
    assert fastclient.parse_reply(b"") == "it closed the connection without an answer"
    assert fastclient.parse_reply(fastwire.MAGIC + b"A\0\0") == "it closed the connection without an answer"
    assert fastclient.parse_reply(answer[:-1]) == "its answer was truncated"
    assert fastclient.parse_reply(answer + b"x") == "its answer was truncated"
    assert fastclient.reply_size(b"HTTP/1.1 200 OK\r\n") == len(b"HTTP/1.1 200 OK\r\n")  # not ours: stop reading


def test_the_launcher_is_deterministic_and_imports_only_its_client() -> None:
    one = render("/opt/py/bin/python3", "/var/run/istio-cni/sidecar-add.sock", ["/opt/app/src"])
    assert one == render("/opt/py/bin/python3", "/var/run/istio-cni/sidecar-add.sock", ["/opt/app/src"])
    text = one.decode()
    assert text.startswith("#!/opt/py/bin/python3 -IS\n")
    imports = sorted(line for line in text.splitlines() if line.startswith(("import ", "from ")))
    assert imports == ["from fastclient import launch", "import sys"]
    assert "sys.path.append('/opt/app/src/istio_agent/cni/install')" in text
    assert "sys.path[-1:] = ['/opt/app/src']" in text and "launch('/var/run/istio-cni/sidecar-add.sock')" in text
    compile(text, "istio-cni", "exec")
    for bad in ("python3", "/opt/my py/python3"):
        with pytest.raises(LauncherError, match="absolute path"):
            render(bad, "/x.sock", ["/opt/app/src"])
    with pytest.raises(LauncherError, match="no import path"):
        render("/opt/py/bin/python3", "/x.sock", [])


def test_the_launchers_client_imports_only_builtins() -> None:
    """`fastclient` is imported by the launcher under `-IS`: nothing but builtin modules, no `__future__`."""
    import ast
    import sys
    from pathlib import Path

    tree = ast.parse(Path(fastclient.__file__).read_text())
    top = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top == {"_socket", "posix"}, top
    assert all(name in sys.builtin_module_names or name == "_socket" for name in top)
