"""The repair controller against a real `istiod-local serve --kube-api-addr`: label and delete modes, pods that
must stay untouched, upstream's metric, a token rotation, and an istiod-local restart under a running watch.

The test process is the "kubelet": it PATCHes `pods/{name}/status` with the admin identity as a node reports an
init container's restart, and reads the result back through the same API. The controller runs in this event
loop with the CNI's identity (`istio-system/istio-cni`), as install-cni runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from launchers import IstiodLocal, RegistryFile, istiod_local_cli
from support import eventually, free_port

from istio_agent.cni.repair.controller import run_repair
from istio_agent.cni.repair.options import RepairOptions
from istio_agent.cni.repair.rules import RepairOptionsError
from istio_agent.kube.access import KubeAccess
from istio_agent.metrics import CollectorRegistry

LABEL = "cni.istio.io/uninitialized"
METRIC = "istio_cni_repair_pods_repaired_total"

REGISTRY = """\
services:
- name: echo
  namespace: default
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]
workloads:
- {name: broken-n1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 10.244.1.10, nodeName: n1}
- {name: passed-n1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 10.244.1.11, nodeName: n1}
- {name: plain-n1, namespace: default, serviceAccount: echo, labels: {app: plain}, ip: 10.244.1.12, nodeName: n1,
   sidecar: none}
- {name: broken-n2, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 10.244.2.10, nodeName: n2}
- {name: later-n1, namespace: default, serviceAccount: echo, labels: {app: echo}, ip: 10.244.1.13, nodeName: n1}
"""


def validation_status(exit_code: int, *, restarted: bool = True) -> dict[str, Any]:
    """What a kubelet reports for `istio-validation`: restarted after exiting `exit_code` (CrashLoopBackOff), or
    (restarted=False) its first termination only."""
    terminated = {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                  "startedAt": "2026-12-01T12:00:00Z", "finishedAt": "2026-12-01T12:00:01Z",
                  "containerID": "containerd://iacni-validation"}
    status: dict[str, Any] = {"name": "istio-validation", "ready": False, "restartCount": 1 if restarted else 0,
                              "image": "docker.io/istio/proxyv2", "imageID": "", "started": False}
    if restarted:
        status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}}
        status["lastState"] = {"terminated": terminated}
    else:
        status["state"] = {"terminated": terminated}
    return {"status": {"phase": "Pending", "initContainerStatuses": [status]}}


@dataclass
class Kube:
    istiod: IstiodLocal
    server: str
    admin_token: str
    cni: KubeAccess
    context: ssl.SSLContext
    session: aiohttp.ClientSession

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        if body is not None:
            headers["Content-Type"] = content_type
        async with self.session.request(method, self.server + path, json=body, headers=headers,
                                        ssl=self.context) as response:
            return response.status, await response.json(content_type=None)

    async def kubelet_reports(self, name: str, exit_code: int, *, restarted: bool = True) -> None:
        code, body = await self.request("PATCH", f"/api/v1/namespaces/default/pods/{name}/status",
                                        validation_status(exit_code, restarted=restarted))
        assert code == 200, body

    async def pod(self, name: str) -> tuple[int, Any]:
        return await self.request("GET", f"/api/v1/namespaces/default/pods/{name}")

    async def labels(self, name: str) -> dict[str, str]:
        code, body = await self.pod(name)
        assert code == 200, body
        return dict(body["metadata"].get("labels", {}))


@pytest.fixture
def istiod_kube(tmp_path: Path) -> Iterator[tuple[IstiodLocal, str, Path, Path]]:
    registry = RegistryFile(tmp_path / "registry.yaml", REGISTRY)
    port = free_port()
    istiod = IstiodLocal(tmp_path / "state", registry=registry, kube_api_addr=f"127.0.0.1:{port}",
                         args=["--kube-bookmark-interval", "1s"])
    with istiod:
        admin, cni = tmp_path / "admin-sa", tmp_path / "cni-sa"
        istiod_local_cli("kubeconfig", "--out", str(tmp_path / "admin.kubeconfig"), "--service-account-dir",
                         str(admin), state_dir=istiod.state_dir)
        istiod_local_cli("kubeconfig", "--out", str(tmp_path / "cni.kubeconfig"), "--identity",
                         "istio-system/istio-cni", "--service-account-dir", str(cni), state_dir=istiod.state_dir)
        yield istiod, f"https://127.0.0.1:{port}", admin, cni


@pytest.fixture
async def kube(istiod_kube: tuple[IstiodLocal, str, Path, Path]) -> AsyncIterator[Kube]:
    istiod, server, admin, cni = istiod_kube
    context = ssl.create_default_context(cafile=str(admin / "ca.crt"))
    async with aiohttp.ClientSession() as session:
        yield Kube(istiod, server, (admin / "token").read_text().strip(),
                   KubeAccess(server, str(cni / "ca.crt"), str(cni / "token")), context, session)


@contextlib.asynccontextmanager
async def controller(options: RepairOptions, access: KubeAccess, registry: CollectorRegistry,
                     **extra: Any) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(run_repair(options, access, registry, **extra))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def count(registry: CollectorRegistry, kind: str, result: str) -> float:
    return registry.get_sample_value(METRIC, {"type": kind, "result": result}) or 0.0


async def test_label_mode_labels_only_the_broken_pod_on_its_node(kube: Kube) -> None:
    registry = CollectorRegistry()
    async with controller(RepairOptions(node_name="n1", label_pods=True), kube.cni, registry):
        # Untouched: validation passed, no sidecar, another node, and a first failure not yet restarted.
        await kube.kubelet_reports("passed-n1", 0)
        await kube.kubelet_reports("plain-n1", 126)
        await kube.kubelet_reports("broken-n2", 126)
        await kube.kubelet_reports("later-n1", 126, restarted=False)
        await kube.kubelet_reports("broken-n1", 126)
        await eventually(lambda: _has_label(kube, "broken-n1"), "broken-n1 labelled", 15)
        assert (await kube.labels("broken-n1"))[LABEL] == "true"
        for name in ("passed-n1", "plain-n1", "broken-n2", "later-n1"):
            assert LABEL not in await kube.labels(name), name
        assert count(registry, "label", "success") == 1
        # The label is itself a change: upstream sees the pod again, finds the label and counts a skip.
        await eventually(lambda: count(registry, "label", "skip") >= 1, "the relabel skipped", 10)
        # later-n1's validation container restarts after the failure: now it is broken.
        await kube.kubelet_reports("later-n1", 126)
        await eventually(lambda: _has_label(kube, "later-n1"), "later-n1 labelled", 15)
        assert count(registry, "label", "success") == 2
        assert count(registry, "label", "fail") == 0
        # Upstream's event on each labelled pod (istiod-local logs the events it is given).
        await eventually(lambda: "event default/later-n1." in kube.istiod.log_text(), "the event on later-n1", 10)
        assert "event default/broken-n1." in kube.istiod.log_text()
        assert "LabelBrokenPod" in kube.istiod.log_text()


async def _has_label(kube: Kube, name: str) -> bool:
    return LABEL in await kube.labels(name)


async def test_delete_mode_deletes_the_broken_pod_with_preconditions(kube: Kube) -> None:
    registry = CollectorRegistry()
    async with controller(RepairOptions(node_name="n1", delete_pods=True), kube.cni, registry):
        await kube.kubelet_reports("passed-n1", 0)
        await kube.kubelet_reports("broken-n2", 126)
        await kube.kubelet_reports("broken-n1", 126)
        await eventually(lambda: _gone(kube, "broken-n1"), "broken-n1 deleted", 15)
        code, body = await kube.pod("broken-n1")
        assert code == 404 and body["reason"] == "NotFound"
        for name in ("passed-n1", "plain-n1", "broken-n2", "later-n1"):
            assert (await kube.pod(name))[0] == 200, name
        assert count(registry, "delete", "success") == 1
        assert count(registry, "delete", "fail") == 0
        await eventually(lambda: "DeleteBrokenPod" in kube.istiod.log_text(), "the event on broken-n1", 10)


async def _gone(kube: Kube, name: str) -> bool:
    return (await kube.pod(name))[0] == 404


async def test_an_exit_code_or_message_filter_that_does_not_match_leaves_pods_alone(kube: Kube) -> None:
    registry = CollectorRegistry()
    options = RepairOptions(node_name="n1", label_pods=True, init_container_exit_code=1)
    async with controller(options, kube.cni, registry) as task:
        await kube.kubelet_reports("broken-n1", 126)
        # A pod the controller does act on afterwards proves it saw the earlier event: it works in order.
        await kube.kubelet_reports("later-n1", 1)
        await eventually(lambda: _has_label(kube, "later-n1"), "later-n1 (exit 1) labelled", 15)
        assert LABEL not in await kube.labels("broken-n1")
        assert not task.done()


async def test_a_rotated_token_is_read_from_the_file(kube: Kube, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The controller starts with a token that expires in 3 s; the file then gets a fresh one, as the kubelet
    rotates it. Once the old token is refused (401) the file is read again and the pod is labelled."""
    caplog.set_level(logging.INFO, logger="istio_agent.cni.repair")
    short = tmp_path / "short-sa"
    istiod_local_cli("kubeconfig", "--out", str(tmp_path / "short.kubeconfig"), "--identity", "istio-system/istio-cni",
                     "--token-ttl", "3s", "--service-account-dir", str(short), state_dir=kube.istiod.state_dir)
    token_file = tmp_path / "rotating-token"
    token_file.write_text((short / "token").read_text())
    issued = asyncio.get_running_loop().time()
    registry = CollectorRegistry()
    access = KubeAccess(kube.server, kube.cni.ca_file, str(token_file))
    async with controller(RepairOptions(node_name="n1", label_pods=True), access, registry) as task:
        await eventually(lambda: "repair controller watching" in caplog.text, "the controller's first list", 10)
        token_file.write_text(Path(kube.cni.token_file).read_text())  # rotated: a fresh 24 h token
        await asyncio.sleep(max(0.0, issued + 3.5 - asyncio.get_running_loop().time()))  # the first one expired
        await kube.kubelet_reports("broken-n1", 126)
        await eventually(lambda: _has_label(kube, "broken-n1"), "broken-n1 labelled with the rotated token", 20)
        assert count(registry, "label", "fail") == 0
        assert not task.done()


async def test_the_controller_keeps_going_across_an_istiod_local_restart(kube: Kube,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    caplog.set_level(logging.INFO, logger="istio_agent.cni.repair")
    async with controller(RepairOptions(node_name="n1", label_pods=True), kube.cni, registry) as task:
        await kube.kubelet_reports("broken-n1", 126)
        await eventually(lambda: _has_label(kube, "broken-n1"), "broken-n1 labelled", 15)
        await asyncio.to_thread(kube.istiod.stop)  # the watch breaks, the API is down
        await eventually(lambda: "failed" in caplog.text, "the controller to notice", 10)
        await asyncio.sleep(1.0)  # a few failed attempts while it is down
        assert not task.done()
        await asyncio.to_thread(kube.istiod.start)  # back on the same port, same state
        await kube.kubelet_reports("later-n1", 126)
        await eventually(lambda: _has_label(kube, "later-n1"), "later-n1 labelled after the restart", 30)
        assert not task.done()


class HoldingProxy:
    """A TCP relay to the API that the test can cut: `hold()` closes every relayed connection and keeps new ones
    waiting (connected, nothing relayed) until `release()`, so a client's next watch starts late, not refused."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.open = asyncio.Event()
        self.open.set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.open.wait()
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}

    def hold(self) -> None:
        self.open.clear()
        for writer in list(self.writers):
            writer.transport.abort()

    def release(self) -> None:
        self.open.set()

    async def close(self) -> None:
        self.hold()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_a_watch_resumed_from_an_expired_version_lists_again(kube: Kube,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The watch is cut while more changes happen than the API's watch log keeps (1000): the resumed watch is
    answered 410 Expired, the controller lists again and acts on the pod that broke meanwhile."""
    caplog.set_level(logging.INFO, logger="istio_agent.cni.repair")
    proxy = HoldingProxy(int(kube.server.rpartition(":")[2]))
    port = await proxy.start()
    access = KubeAccess(f"https://127.0.0.1:{port}", kube.cni.ca_file, kube.cni.token_file)
    registry = CollectorRegistry()
    try:
        async with controller(RepairOptions(node_name="n1", label_pods=True), access, registry):
            await eventually(lambda: "repair controller watching" in caplog.text, "the controller's first list", 10)
            proxy.hold()
            await kube.kubelet_reports("broken-n1", 126)
            for i in range(1001):
                code, body = await kube.request("PATCH", "/api/v1/namespaces/default/pods/passed-n1/status",
                                                {"status": {"message": f"churn {i}"}})
                assert code == 200, body
            proxy.release()
            await eventually(lambda: _has_label(kube, "broken-n1"), "broken-n1 labelled after the re-list", 20)
            assert "expired" in caplog.text
            assert count(registry, "label", "success") == 1
    finally:
        await proxy.close()


async def test_in_place_mode_touches_nothing_through_the_api_and_retries_a_pod_it_cannot_reach(
        kube: Kube, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The pod's namespace is looked for in a proc directory where no process holds its IP: each attempt fails,
    # is counted and retried with backoff, as upstream's queue does; nothing is labelled or deleted, and the
    # controller asks the API for nothing but the watch. (Repairs that succeed: tests/node, as root.)
    (tmp_path / "proc" / "1").mkdir(parents=True)
    registry = CollectorRegistry()
    options = RepairOptions(node_name="n1", repair_pods=True, label_pods=True, delete_pods=True,
                            host_proc_dir=str(tmp_path / "proc"))
    caplog.set_level(logging.INFO, "istio_agent.cni.repair")
    async with controller(options, kube.cni, registry):
        await kube.kubelet_reports("passed-n1", 0)
        await kube.kubelet_reports("broken-n1", 126)
        await eventually(lambda: count(registry, "repair", "fail") >= 2, "two failed attempts", 15)
        assert "no network namespace holding 10.244.1.10" in caplog.text
        assert (await kube.pod("broken-n1"))[0] == 200 and LABEL not in await kube.labels("broken-n1")
        assert count(registry, "repair", "success") == 0 and count(registry, "label", "success") == 0


async def test_in_place_mode_leaves_a_pod_the_plugin_would_not_capture_and_counts_it_once(kube: Kube) -> None:
    registry = CollectorRegistry()
    async with controller(RepairOptions(node_name="n1", repair_pods=True), kube.cni, registry,
                          exclude_namespaces=["default"]):
        await kube.kubelet_reports("broken-n1", 126)
        await eventually(lambda: count(registry, "repair", "skip") == 1, "the excluded pod skipped", 15)
        # A later version of the same pod is not judged again (once per uid); the controller works in order, so
        # by the time later-n1 (reported after it) is counted, that version has been seen.
        code, _ = await kube.request("PATCH", "/api/v1/namespaces/default/pods/broken-n1/status",
                                     {"status": {"message": "still crash-looping"}})
        assert code == 200
        await kube.kubelet_reports("later-n1", 126)
        await eventually(lambda: count(registry, "repair", "skip") >= 2, "later-n1 skipped", 15)
        assert count(registry, "repair", "skip") == 2
        assert count(registry, "repair", "fail") == 0 and count(registry, "repair", "success") == 0


async def test_bad_options_fail_at_once_naming_the_flag(kube: Kube) -> None:
    with pytest.raises(RepairOptionsError, match="--repair-label-selectors"):
        await run_repair(RepairOptions(label_pods=True, label_selectors="app in x"), kube.cni,
                         CollectorRegistry())


async def test_disabled_returns_at_once(kube: Kube) -> None:
    await asyncio.wait_for(run_repair(RepairOptions(enabled=False), kube.cni, CollectorRegistry()),
                           5)
