"""A kube-apiserver that drips its answer (the headers at once, then a byte every half second, for ever): every
pod GET ends at its whole-request deadline, the in-process plugin answers code 11 within it, and install-cni's
fast path keeps answering other pods while every one of its call slots is stuck on that server.

Each read from the dripping server comes well within any per-read timeout, so only a deadline on the whole
request ends the wait (issue 23, item 5). Nothing here asserts timing: a call that never ends fails its
liveness bound (a thread join, a subprocess timeout); `benchmarks/bench_cni_attack.py` measures the times.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cni_fastpath_peers import CONSOLE_SCRIPT, FastPathAgent, cni_env, run_plugin
from cni_peers import DripApi, PodApi, write_kubeconfig
from needs import need_root
from support import poll

from istio_agent.kube import client as kube
from istio_agent.kube.keepalive import KeepAliveClient

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "app-1", "namespace": "shop", "labels": {}, "annotations": {}},
       "spec": {"containers": [{"name": "app"}]}}  # no sidecar: let through once it is fetched


@pytest.fixture
def drip(tmp_path: Path) -> Iterator[DripApi]:
    server = DripApi(tmp_path)
    yield server
    server.close()


def outcome_within(function: Callable[[], object], liveness: float = 30.0) -> object:
    """What `function` returned or raised, on a thread that must have ended within `liveness` seconds."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(liveness)
    assert not thread.is_alive(), "the GET was still waiting on the dripping server"
    return outcome[0]


def test_both_clients_end_a_dripping_get_at_its_whole_request_deadline(drip: DripApi, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path, drip.url, drip.ca_pem)
    cfg = kube.load_kubeconfig(str(kubeconfig))
    kept_alive = KeepAliveClient(timeout=1.0)
    try:
        for get in (lambda: kube.get_pod(cfg, "shop", "app-1", timeout=1.0),
                    lambda: kept_alive.get_pod(str(kubeconfig), "shop", "app-1")):
            failure = outcome_within(get)
            assert isinstance(failure, kube.ApiError), failure
            assert f"the API server 127.0.0.1:{drip.port} did not answer within 1 s" in str(failure)
        assert drip.served == 2  # one connection each: a slow answer is not a stale kept-alive connection
    finally:
        kept_alive.close()


def test_the_in_process_plugin_answers_code_11_within_its_deadline(drip: DripApi, tmp_path: Path) -> None:
    write_kubeconfig(tmp_path, drip.url, drip.ca_pem)
    config = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni", "cni_agent_run_dir": str(tmp_path),
              "prevResult": {"cniVersion": "1.0.0", "ips": []}}
    done = run_plugin(CONSOLE_SCRIPT, cni_env(ISTIO_CNI_POD_RETRIEVAL_MAX_RETRIES="1"), config)  # 60 s liveness
    body = json.loads(done.stdout)
    assert done.returncode == 1 and body["code"] == 11, done
    assert "did not answer within 5 s" in body["msg"] and "after 1 attempts" in body["msg"], body


@pytest.fixture
def api() -> Iterator[PodApi]:
    folder = Path(tempfile.mkdtemp(prefix="iacni-sa-"))
    server = PodApi(folder)
    server.add_pod(POD)
    yield server
    server.close()
    shutil.rmtree(folder, ignore_errors=True)


def test_the_fast_path_serves_a_pod_while_every_slot_is_stuck_on_a_dripping_api(api: PodApi, drip: DripApi) -> None:
    """16 calls (every slot) wait on the dripping server; a pod whose API answers is served meanwhile (refused by
    the busy fast path, so its launcher runs the plugin in-process), the 16 end with code 11 naming the deadline,
    and the fast path serves calls again."""
    need_root()
    agent = FastPathAgent(api)
    drip_dir = Path(tempfile.mkdtemp(prefix="iacni-dr-"))
    stuck: list[subprocess.Popen[bytes]] = []
    try:
        agent.start()
        write_kubeconfig(drip_dir, drip.url, drip.ca_pem)
        slow_config = drip_dir / "stdin.json"
        slow_config.write_text(json.dumps(agent.config(cni_agent_run_dir=str(drip_dir))))
        for i in range(16):
            with slow_config.open("rb") as stdin_file:
                stuck.append(subprocess.Popen([str(agent.launcher)], env=cni_env(pod_name=f"slow-{i}"),
                                              stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        poll(lambda: drip.open_now == 16, "16 fast-path calls waiting on the dripping API", 30, agent.output)

        env, stdin = cni_env(pod_name="app-1"), agent.config()
        fast, slow = run_plugin(agent.launcher, env, stdin), run_plugin(CONSOLE_SCRIPT, env, stdin)
        assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout) and fast.returncode == 0, (fast, slow)
        assert "all 16 call slots stayed busy" in agent.output()

        for caller in stuck:
            out, _ = caller.communicate(timeout=60)
            body = json.loads(out)
            assert caller.returncode == 1 and body["code"] == 11, body
            assert "did not answer within 5 s" in body["msg"], body
        before = agent.answers_reach(len(stuck))  # each stuck call is logged just after its caller has the answer
        again = run_plugin(agent.launcher, env, stdin)
        assert (again.returncode, again.stdout) == (slow.returncode, slow.stdout)
        assert agent.answers_reach(before + 1) == before + 1  # on the fast path again: the slots are free
    finally:
        for caller in stuck:
            if caller.poll() is None:
                caller.kill()
                caller.wait()
        agent.stop()
        shutil.rmtree(drip_dir, ignore_errors=True)
