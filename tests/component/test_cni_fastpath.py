"""The istio-cni fast path (not upstream): the launcher install-cni installs answers through install-cni exactly
as the in-process plugin answers, refuses nobody silently, and runs in-process when install-cni is away.

A real install-cni (root: the fast path serves uid 0 only) against a real HTTPS pod API (`cni_peers`); each
case runs the installed launcher and the console script (always in-process) on the same environment and
stdin and compares stdout and exit status byte for byte, and install-cni's log says the fast path answered.
Nothing here enters a pod namespace (the netns named does not exist; the cases stop before it matters);
`tests/node/test_cni_fastpath_netns.py` applies rules for real.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cni_fastpath_peers import CONSOLE_SCRIPT, GONE_NETNS, FastPathAgent, cni_env, run_plugin
from cni_peers import PodApi, closed_port
from needs import need_root

from istio_agent.cni.install import fastwire
from istio_agent.cni.install.launcher import import_paths, interpreter_of, render

NOBODY = 65534


def pod(name: str, annotations: dict[str, str] | None = None, containers: tuple[str, ...] = ("app", "istio-proxy"),
        namespace: str = "shop") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {},
                         "annotations": {"sidecar.istio.io/status": "{}", **(annotations or {})}},
            "spec": {"containers": [{"name": c, **({"args": ["proxy", "sidecar"]} if c == "istio-proxy" else {})}
                                    for c in containers]}}


@pytest.fixture(scope="module")
def api() -> Iterator[PodApi]:
    folder = Path(tempfile.mkdtemp(prefix="iacni-api-"))
    server = PodApi(folder)
    server.add_pod(pod("app-1", containers=("app",)))  # no sidecar: skipped
    server.add_pod(pod("evil", annotations={"traffic.sidecar.istio.io/excludeInterfaces": "eth0 -j ACCEPT"}))
    yield server
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def agent(api: PodApi) -> Iterator[FastPathAgent]:
    need_root()
    instance = FastPathAgent(api)
    try:
        yield instance.start()
    finally:
        instance.stop()


def both(agent: FastPathAgent, env: dict[str, str],
         stdin: bytes | dict[str, Any]) -> subprocess.CompletedProcess[bytes]:
    """The launcher's answer, checked identical to the in-process plugin's and counted on the fast path."""
    before = agent.fast_path_answers()
    fast = run_plugin(agent.launcher, env, stdin)
    slow = run_plugin(CONSOLE_SCRIPT, env, stdin)
    assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), (fast, slow)
    assert agent.answers_reach(before + 1) == before + 1, agent.output()[-3000:]
    return fast


def test_a_pod_without_sidecar_is_let_through_identically(agent: FastPathAgent, api: PodApi) -> None:
    done = both(agent, cni_env(pod_name="app-1"), agent.config())
    assert done.returncode == 0 and json.loads(done.stdout) == agent.config()["prevResult"]
    assert b"does not have istio-proxy container" in done.stderr, done  # the plugin's log lines, from the agent
    assert "/api/v1/namespaces/shop/pods/app-1" in " ".join(api.pod_requests())


def test_the_injection_annotation_fails_identically_naming_it(agent: FastPathAgent) -> None:
    done = both(agent, cni_env(pod_name="evil"), agent.config())
    body = json.loads(done.stdout)
    assert done.returncode == 1 and "traffic.sidecar.istio.io/excludeInterfaces" in body["msg"]
    assert "eth0 -j ACCEPT" in body["msg"]
    # The plugin's log lines reach install-cni's log under the plugin's scope, as the log socket would.
    assert "\terror\tcni-plugin\t" in agent.output() and "excludeInterfaces" in agent.output()


def test_a_pod_the_api_cannot_give_is_try_again_later_with_the_callers_retries(agent: FastPathAgent) -> None:
    done = both(agent, cni_env(pod_name="missing", ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES="3"), agent.config())
    body = json.loads(done.stdout)
    assert done.returncode == 1 and body["code"] == 11 and "after 3 attempts" in body["msg"], body
    assert 'pods "missing" not found' in body["msg"]
    bad = both(agent, cni_env(pod_name="missing", ISTIO_CNI_POD_RETRIEVAL_INTERVAL="soon"), agent.config())
    assert json.loads(bad.stdout)["code"] == 4 and "ISTIO_CNI_POD_RETRIEVAL_INTERVAL" in json.loads(bad.stdout)["msg"]


def test_malformed_stdin_version_and_other_commands(agent: FastPathAgent) -> None:
    malformed = both(agent, cni_env(), b'{"cniVersion": "1.0.0", "name": ')
    assert json.loads(malformed.stdout)["code"] == 6
    version = both(agent, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "0.4.0"}')
    assert version.returncode == 0 and json.loads(version.stdout)["cniVersion"] == "0.4.0"
    for command in ("DEL", "CHECK"):
        assert both(agent, cni_env(command, pod_name="gone"), agent.config()).returncode == 0
    assert json.loads(both(agent, cni_env(CNI_NETNS=""), agent.config()).stdout)["code"] == 4
    about = both(agent, {}, b"")
    assert b"CNI protocol versions supported" in about.stderr  # stderr comes back from the agent
    deep = both(agent, cni_env(), b"[" * 100_000)  # answered as in-process: code 6 naming the nesting limit
    assert deep.returncode == 1 and json.loads(deep.stdout)["code"] == 6 and b"Traceback" not in deep.stderr


def test_the_launcher_imports_only_builtins(agent: FastPathAgent) -> None:
    """`-X importtime` of the launcher on the fast path: beyond the interpreter's own start-up, only its client
    module and `_socket`; no json, ssl, re, enum, not even os or the istio_agent package."""
    def imported(*argv: str) -> set[str]:
        result = subprocess.run([interpreter_of(CONSOLE_SCRIPT), "-IS", "-X", "importtime", *argv],
                                input=json.dumps(agent.config()).encode(), env=cni_env(pod_name="app-1"),
                                capture_output=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        return {line.rsplit("|", 1)[1].strip() for line in result.stderr.decode().splitlines()
                if line.startswith("import time:") and "|" in line} - {"package"}

    extra = imported(str(agent.launcher)) - imported("-c", "pass")
    assert extra == {"_socket", "fastclient"}, extra


def exchange_as(uid: int, path: Path, request: bytes) -> bytes:
    """Send `request` on the unix socket from a forked child running as `uid`; what came back."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        status = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(10)
                sock.connect(str(path))
                sock.sendall(request)
                while chunk := sock.recv(65536):
                    os.write(write_end, chunk)
        except BaseException:
            status = 1
        os._exit(status)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data


def test_a_non_root_caller_is_refused(agent: FastPathAgent) -> None:
    info = agent.socket.stat()
    assert info.st_mode & 0o777 == 0o600 and info.st_uid == 0
    agent.socket.chmod(0o666)  # opened up by mistake: SO_PEERCRED still refuses uid 65534, running nothing
    try:
        request = fastwire.encode_request(cni_env(pod_name="app-1"), json.dumps(agent.config()).encode())
        before = agent.fast_path_answers()
        assert fastwire.decode_reply(exchange_as(NOBODY, agent.socket, request)) is None  # a refusal
        assert "refused a call from pid" in agent.output() and f"uid {NOBODY}" in agent.output()
        assert agent.fast_path_answers() == before
        answer = fastwire.decode_reply(exchange_as(0, agent.socket, request))  # root, the same bytes: answered
        assert answer is not None and answer[0] == 0
    finally:
        agent.socket.chmod(0o600)


def test_a_netns_install_cni_cannot_see_is_left_to_the_plugin_on_the_node(agent: FastPathAgent) -> None:
    """install-cni in a container without the node's netns directory declines; the launcher runs in-process."""
    env, stdin = cni_env(pod_name="app-1", netns=GONE_NETNS), agent.config()
    before = agent.fast_path_answers()
    fast, slow = run_plugin(agent.launcher, env, stdin), run_plugin(CONSOLE_SCRIPT, env, stdin)
    assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), (fast, slow)
    assert f"CNI_NETNS {GONE_NETNS} is not visible to install-cni" in agent.output()
    assert agent.fast_path_answers() == before


def test_the_launcher_runs_in_process_without_install_cni(api: PodApi, tmp_path: Path) -> None:
    """No socket, or a socket file nobody listens on: the launcher's answer is the plugin's, in-process."""
    run_dir = Path(tempfile.mkdtemp(prefix="iacni-fb-"))
    try:
        launcher = tmp_path / "istio-cni"
        launcher.write_bytes(render(interpreter_of(CONSOLE_SCRIPT), str(run_dir / fastwire.SOCKET_NAME),
                                    import_paths()))
        launcher.chmod(0o755)
        from cni_peers import write_kubeconfig

        write_kubeconfig(run_dir, api.url, api.ca_pem)
        config = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
                  "cni_agent_run_dir": str(run_dir), "prevResult": {"cniVersion": "1.0.0", "ips": []}}
        stale = socket.socket(socket.AF_UNIX)
        for attempt in ("absent", "stale"):
            if attempt == "stale":
                stale.bind(str(run_dir / fastwire.SOCKET_NAME))  # bound, never listening: connection refused
            for env, stdin in ((cni_env(pod_name="app-1"), config), (cni_env(pod_name="evil"), config),
                               ({"CNI_COMMAND": "VERSION"}, b"{}"), (cni_env(), b"not json")):
                fast = run_plugin(launcher, env, stdin)
                slow = run_plugin(CONSOLE_SCRIPT, env, stdin)
                assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), (attempt, fast, slow)
        stale.close()
        record = run_dir / "dry-run.txt"
        dry = run_plugin(launcher, cni_env(pod_name="app-1", DRY_RUN_FILE_PATH=str(record)), config)
        assert dry.returncode == 0, dry.stderr
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_api_down_is_code_11_on_the_fast_path_too() -> None:
    need_root()
    agent = FastPathAgent(None, api_port=closed_port())
    try:
        agent.start()
        done = both(agent, cni_env(pod_name="app-1"), agent.config())
        body = json.loads(done.stdout)
        assert done.returncode == 1 and body["code"] == 11 and "after 2 attempts" in body["msg"], body
        assert "cannot connect to the API server" in body["msg"]
    finally:
        agent.stop()


def test_the_launcher_is_the_same_bytes_for_the_same_installation(agent: FastPathAgent) -> None:
    text = agent.launcher.read_bytes()
    assert text == render(interpreter_of(CONSOLE_SCRIPT), str(agent.socket), import_paths())
    assert text.startswith(interpreter_of(CONSOLE_SCRIPT).join([b"#!".decode(), " -IS\n"]).encode())
    assert str(agent.bin_dir).encode() not in text  # self-contained: nothing else of the bin dir
    assert os.stat(agent.launcher).st_mode & 0o777 == 0o755


class ScriptedAgent:
    """A unix socket standing in for install-cni that reads one request and answers `reply` (b"": just closes)."""

    def __init__(self, path: Path, reply: bytes) -> None:
        import threading

        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.reply = reply
        self.calls = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.calls += 1
                data = b""
                while not data.endswith(b"}") and (chunk := conn.recv(65536)):  # the request ends with the JSON
                    data += chunk
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted_dir(api: PodApi) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    run_dir = Path(tempfile.mkdtemp(prefix="iacni-sc-"))
    from cni_peers import write_kubeconfig

    write_kubeconfig(run_dir, api.url, api.ca_pem)
    launcher = run_dir / "istio-cni"
    launcher.write_bytes(render(interpreter_of(CONSOLE_SCRIPT), str(run_dir / fastwire.SOCKET_NAME), import_paths()))
    launcher.chmod(0o755)
    config = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni", "cni_agent_run_dir": str(run_dir),
              "prevResult": {"cniVersion": "1.0.0", "ips": []}}
    yield run_dir, launcher, config
    shutil.rmtree(run_dir, ignore_errors=True)


def test_a_refusal_makes_the_launcher_answer_in_process(scripted_dir: tuple[Path, Path, dict[str, Any]]) -> None:
    run_dir, launcher, config = scripted_dir
    agent = ScriptedAgent(run_dir / fastwire.SOCKET_NAME, fastwire.encode_refusal())
    try:
        env = cni_env(pod_name="evil")
        fast = run_plugin(launcher, env, config)
        slow = run_plugin(CONSOLE_SCRIPT, env, config)
        assert agent.calls == 1
        assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), (fast, slow)
        assert b"excludeInterfaces" in fast.stdout
    finally:
        agent.close()


@pytest.mark.parametrize("reply", [b"", fastwire.MAGIC + b"A" + b"\0\0"], ids=["closed", "truncated"])
def test_an_agent_that_took_the_call_is_final_even_without_an_answer(
        scripted_dir: tuple[Path, Path, dict[str, Any]], api: PodApi, reply: bytes) -> None:
    """Code 11 from the launcher, and no second ADD in-process (the pod API is never asked)."""
    run_dir, launcher, config = scripted_dir
    agent = ScriptedAgent(run_dir / fastwire.SOCKET_NAME, reply)
    try:
        asked = len(api.pod_requests())
        done = run_plugin(launcher, cni_env(pod_name="app-1"), config)
        assert agent.calls == 1 and done.returncode == 1, done
        body = json.loads(done.stdout)
        assert body["code"] == 11 and "node agent's fast path failed" in body["msg"] and body["cniVersion"] == "1.0.0"
        assert len(api.pod_requests()) == asked
    finally:
        agent.close()


def test_pod_gets_reuse_one_kept_alive_connection(api: PodApi, tmp_path: Path) -> None:
    from cni_peers import write_kubeconfig

    from istio_agent.kube.keepalive import KeepAliveClient

    kubeconfig = write_kubeconfig(tmp_path, api.url, api.ca_pem)
    client = KeepAliveClient()
    try:
        for _ in range(3):
            got: Any = client.get_pod(str(kubeconfig), "shop", "app-1")
            assert got["metadata"]["name"] == "app-1"
        assert client.connections_opened == 1
        for conns in client._idle.values():  # dead while idle (as a server's idle timeout leaves it)
            for conn in conns:
                conn.shutdown(socket.SHUT_RDWR)
        with pytest.raises(Exception, match='pods "nope" not found'):  # replaced within the attempt
            client.get_pod(str(kubeconfig), "shop", "nope")
        assert client.connections_opened == 2
    finally:
        client.close()


def test_a_changed_kubeconfig_or_token_file_is_used_at_once(api: PodApi, tmp_path: Path) -> None:
    """The fast path parses an unchanged kubeconfig once, but reads it (and any tokenFile) on every attempt."""
    from cni_peers import TOKEN, write_kubeconfig

    from istio_agent.kube.keepalive import KeepAliveClient

    kubeconfig = write_kubeconfig(tmp_path, api.url, api.ca_pem, token="stale")
    client = KeepAliveClient()
    try:
        with pytest.raises(Exception, match="Unauthorized"):
            client.get_pod(str(kubeconfig), "shop", "app-1")
        write_kubeconfig(tmp_path, api.url, api.ca_pem)  # install-cni rewrote it with the current token
        assert client.get_pod(str(kubeconfig), "shop", "app-1")["metadata"]["name"] == "app-1"  # type: ignore[index]
        token_file = tmp_path / "token"
        token_file.write_text("stale\n")
        kubeconfig.write_text(kubeconfig.read_text().replace(f"token: {TOKEN}", f"tokenFile: {token_file}"))
        with pytest.raises(Exception, match="Unauthorized"):
            client.get_pod(str(kubeconfig), "shop", "app-1")
        token_file.write_text(TOKEN + "\n")  # the kubeconfig unchanged, its token file rotated
        assert client.get_pod(str(kubeconfig), "shop", "app-1")["metadata"]["name"] == "app-1"  # type: ignore[index]
        kubeconfig.unlink()
        with pytest.raises(FileNotFoundError):
            client.get_pod(str(kubeconfig), "shop", "app-1")
    finally:
        client.close()
