"""istiod-local's Kubernetes API against hostile clients (issue 23, items 1-4), on real TLS sockets.

Most cases run the API in this process with short deadlines and small caps (the
defaults are the apiserver's scale: 10 s, 1,024 connections, 4 MiB per watcher);
the memory cases run the real `istiod-local serve` and read its resident size.
Each case failed on the aiohttp edge: a JSON patch of copies grew the pod
without bound, a body over 3 MiB was a 500, NaN was stored and served, unknown
fields were stored, deep JSON was a 500, slow-drip connections were never
closed, and watchers that stopped reading held megabytes each.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from launchers import IstiodLocal, RegistryFile
from needs import need_tool
from support import rss_mb

from istiod_local.controlplane.kubeapi.credentials import api_token, parse_identity
from istiod_local.controlplane.kubeapi.server import KubeApiOptions, KubeApiServer
from istiod_local.controlplane.state import load_or_create_state
from istiod_local.controlplane.xds.registry import parse_registry

MESH = {
    "services": [{"name": "echo", "namespace": "default", "selector": {"app": "echo"},
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}],
    "workloads": [{"name": f"echo-{i}", "namespace": "default", "serviceAccount": "echo", "labels": {"app": "echo"},
                   "ip": f"10.244.0.{10 + i}"} for i in range(1, 4)],
}
CNI = "istio-system/istio-cni"  # the identity the CNI plugin and install-cni use


class Api:
    """A client of the API at `address` with its root certificate and a CNI token (and the server, when it runs
    in this process)."""

    def __init__(self, address: str, root_pem: str, token: str, server: KubeApiServer | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.root_pem, self.token = root_pem, token
        self._server = server

    @property
    def server(self) -> KubeApiServer:
        assert self._server is not None
        return self._server

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.root_pem)

    async def connect(self, host: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, ssl=self.context(), server_hostname="127.0.0.1",
                                             local_addr=(host, 0))

    async def request(self, method: str, path: str, body: bytes | None = None, *, token: str | None = "cni",
                      content_type: str = "application/merge-patch+json",
                      host: str = "127.0.0.1") -> tuple[int, dict[str, str], Any]:
        reader, writer = await self.connect(host)
        try:
            headers = [f"{method} {path} HTTP/1.1", "Host: kube", "Connection: close", f"Content-Type: {content_type}"]
            if token is not None:
                headers.append(f"Authorization: Bearer {self.token if token == 'cni' else token}")
            if body is not None:
                headers.append(f"Content-Length: {len(body)}")
            writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + (body or b""))
            raw = await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
        head, _, payload = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields.setdefault(name.strip().lower(), "")
            fields[name.strip().lower()] += ("\n" if fields[name.strip().lower()] else "") + value.strip()
        if fields.get("transfer-encoding") == "chunked":
            payload = _unchunk(payload)
        return int(lines[0].split()[1]), fields, json.loads(payload) if payload.strip() else None


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2:]
    return out


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    now = time.time()
    state = load_or_create_state(tmp_path / "state", "cluster.local", now)
    options = KubeApiOptions("127.0.0.1:0", "node-a", request_timeout=1.0, write_timeout=1.0, max_connections=400,
                             max_per_source=300, watch_buffer_bytes=2 * 1024 * 1024)
    server = KubeApiServer(options, state)
    server.update_registry(parse_registry(json.dumps(MESH)))
    await server.start()
    try:
        yield Api(server.address, state.root_cert_pem, api_token(state, parse_identity(CNI), now, 3600), server)
    finally:
        await server.stop()


POD = "/api/v1/namespaces/default/pods/echo-1"


# ---- item 1: patches are bounded before they are applied ---------------------------------------------------


async def test_twenty_copies_of_the_pod_are_refused_naming_the_limit_and_nothing_is_stored(api: Api) -> None:
    before = api.server.store.get("pods", "default", "echo-1")
    copies = json.dumps([{"op": "copy", "from": "", "path": f"/x{n}"} for n in range(20)]).encode()
    assert len(copies) < 1000  # the 870-byte body
    status, _, body = await api.request("PATCH", POD, copies, content_type="application/json-patch+json")
    assert status == 422 and body["reason"] == "Invalid"
    assert "accumulated size increase of copy" in body["message"] and "exceeding the limit 3145728" in body["message"]
    assert api.server.store.get("pods", "default", "echo-1") is before
    many = json.dumps([{"op": "test", "path": "/kind", "value": "Pod"}] * 10_001).encode()
    status, _, body = await api.request("PATCH", POD, many, content_type="application/json-patch+json")
    assert (status, body["reason"]) == (413, "RequestEntityTooLarge")
    assert body["message"] == ("Request entity too large: The allowed maximum operations in a JSON patch is 10000, "
                               "got 10001")


async def test_an_object_over_the_stored_size_limit_and_a_body_over_3_mib_are_413(api: Api) -> None:
    big_status = json.dumps({"status": {"message": "x" * 1_600_000}}).encode()
    status, _, body = await api.request("PATCH", POD + "/status", big_status)
    assert status == 413 and "limit is 1572864" in body["message"]
    too_big = json.dumps({"status": {"message": "x" * (3 * 1024 * 1024)}}).encode()
    status, _, body = await api.request("PATCH", POD + "/status", too_big)
    assert (status, body["message"]) == (413, "Request entity too large: limit is 3145728")
    status, _, body = await api.request("PATCH", POD + "/status", b"{" + b" " * 100_000 + b"}", token=None)
    assert status == 413, "without a token the body is not read past 64 KiB"


# ---- item 4: what is stored is what a Pod holds --------------------------------------------------------------


async def test_nan_infinity_and_deep_json_are_400_and_the_pod_stays_readable(api: Api) -> None:
    for text in (b'{"status":{"x":NaN}}', b'{"status":{"phase":Infinity}}', b'{"status":{"phase":-Infinity}}'):
        status, _, body = await api.request("PATCH", POD + "/status", text)
        assert (status, body["reason"]) == (400, "BadRequest") and "invalid character" in body["message"]
    deep = b'{"status":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001
    status, _, body = await api.request("PATCH", POD + "/status", deep)
    assert status == 400 and "exceeded max depth" in body["message"]
    status, _, pod = await api.request("GET", POD)
    assert status == 200 and json.dumps(pod, allow_nan=False)


async def test_unknown_fields_are_dropped_with_warnings_or_refused_when_strict(api: Api) -> None:
    patch = json.dumps({"foo": 1, "metadata": {"bar": {"x": 1}, "labels": {"kept": "yes"}},
                        "status": {"x": 1, "phase": "Running"}}).encode()
    status, headers, pod = await api.request("PATCH", POD + "/status", patch)
    assert status == 200
    warned = headers["warning"].splitlines()
    assert sorted(warned) == ['299 - "unknown field \\"foo\\""', '299 - "unknown field \\"metadata.bar\\""',
                              '299 - "unknown field \\"status.x\\""']
    assert "foo" not in pod and "bar" not in pod["metadata"] and "x" not in pod["status"]
    assert pod["metadata"]["labels"]["kept"] == "yes"
    status, _, body = await api.request("PATCH", POD + "/status?fieldValidation=Strict", patch)
    assert status == 422 and "patch: strict decoding error: unknown field" in body["message"]
    assert 'unknown field "foo"' in body["message"] and 'unknown field "metadata.bar"' in body["message"]
    status, headers, _ = await api.request("PATCH", POD + "/status?fieldValidation=Ignore", patch)
    assert status == 200 and "warning" not in headers
    status, _, body = await api.request("PATCH", POD + "/status", b'{"status":{"phase":{"a":1}}}')
    assert status == 422 and "status.phase" in body["message"]
    status, _, body = await api.request("PATCH", POD + "?fieldValidation=Sometimes", b"{}")
    assert status == 422 and "fieldValidation: Unsupported value" in body["message"]
    for timeout in ("nan", "inf", "-1"):
        status, _, body = await api.request("GET", f"/api/v1/pods?watch=1&timeoutSeconds={timeout}")
        assert (status, body["message"]) == (400, "timeoutSeconds must be a number")


# ---- item 2: connections that never complete a request ------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_slow_drip_connections_are_all_closed_at_the_read_deadline(api: Api) -> None:
    fds = _open_fds()
    connections = []
    for _ in range(150):
        reader, writer = await api.connect()
        writer.write(b"GET /api/v1/pods HTTP/1.1\r\n")
        connections.append((reader, writer))
    answers = [asyncio.create_task(reader.read()) for reader, _ in connections]  # each ends when the server closes
    try:
        for _ in range(100):  # a byte every 0.2 s, as long as the server listens
            await asyncio.sleep(0.2)
            for (_, writer), answer in zip(connections, answers, strict=True):
                if not answer.done():
                    writer.write(b"X")
            if all(answer.done() for answer in answers):
                break
        still_open = sum(not answer.done() for answer in answers)
        assert still_open == 0, f"{still_open} dripping connections still open"
        assert all(answer.result().startswith(b"HTTP/1.1 408 ") for answer in answers)
        assert api.server.connections == 0
    finally:
        for answer in answers:
            answer.cancel()
        for _, writer in connections:
            writer.close()
    await asyncio.sleep(0.2)
    assert _open_fds() <= fds + 20


async def test_one_source_holds_its_share_of_connections_and_another_is_still_served(api: Api) -> None:
    api.server._server.slots.max_per_source = 20  # type: ignore[union-attr]
    idle = [await asyncio.open_connection(api.host, api.port) for _ in range(60)]  # TCP only, never a ClientHello
    try:
        await asyncio.sleep(0.2)
        assert api.server.connections <= 20
        status, _, pod = await api.request("GET", POD, host="127.0.0.2")
        assert status == 200 and pod["metadata"]["name"] == "echo-1"
    finally:
        for _, writer in idle:
            writer.close()


# ---- item 3: watchers that cannot keep up -------------------------------------------------------------------


async def _watch(api: Api, read: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await api.connect()
    writer.write(f"GET /api/v1/namespaces/default/pods?watch=true HTTP/1.1\r\nHost: kube\r\n"
                 f"Authorization: Bearer {api.token}\r\n\r\n".encode())
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    if not read:
        writer.transport.pause_reading()  # type: ignore[attr-defined]
    return reader, writer


async def test_watchers_that_stop_reading_are_cut_and_patches_stay_answered(api: Api) -> None:
    stalled = [await _watch(api, read=False) for _ in range(20)]
    reading, reading_writer = await _watch(api, read=True)
    seen = bytearray()

    async def read_all() -> None:
        while chunk := await reading.read(65536):
            seen.extend(chunk)

    reader_task = asyncio.create_task(read_all())
    try:
        for n in range(20):  # 6 MB in all: more than the stalled sockets' kernel buffers and their 2 MiB budget
            patch = json.dumps({"status": {"message": ("last" if n == 19 else f"{n % 10}") * 300_000}}).encode()
            status, _, _ = await api.request("PATCH", POD + "/status", patch)
            assert status == 200
        for _ in range(100):
            if len(api.server._watches) <= 1 and b'"message":"lastlast' in seen:
                break
            await asyncio.sleep(0.1)
        assert len(api.server._watches) == 1, "every watcher that stopped reading was cut; the reader was not"
        assert b'"message":"lastlast' in seen, "the watcher that reads saw every change"
    finally:
        reader_task.cancel()
        reading_writer.close()
        for _, writer in stalled:
            writer.close()


# ---- the memory cases, on the real istiod-local ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IstiodLocal, Api]]:
    base = tmp_path_factory.mktemp("kubeapi-memory")
    with IstiodLocal(base / "state", registry=RegistryFile(base / "mesh.yaml", MESH),
                     kube_api_addr="127.0.0.1:0") as istiod:
        istiod.kubeconfig(base / "k", identity=CNI, service_account_dir=base / "sa")
        yield istiod, Api(istiod.kube_api, istiod.root_pem().decode(), (base / "sa" / "token").read_text())


async def test_non_reading_watchers_and_large_patches_keep_istiod_local_small(
        served: tuple[IstiodLocal, Api]) -> None:
    istiod, api = served
    assert istiod.proc is not None
    pid = istiod.proc.pid
    start = rss_mb(pid)
    watchers = []
    for n in range(200):  # from four addresses: one holds at most 256 connections
        reader, writer = await api.connect(f"127.0.0.{2 + n % 4}")
        writer.write(f"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: kube\r\nAuthorization: Bearer {api.token}\r\n"
                     "\r\n".encode())
        watchers.append((reader, writer))
    for reader, writer in watchers:
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.transport.pause_reading()  # type: ignore[attr-defined]
    peak = start
    try:
        for n in range(20):
            status, _, _ = await api.request("PATCH", POD + "/status",
                                             json.dumps({"status": {"message": f"{n % 10}" * 1_000_000}}).encode())
            assert status == 200
            peak = max(peak, rss_mb(pid))
    finally:
        for _, writer in watchers:
            writer.transport.abort()
    assert peak - start < 150, f"istiod-local grew from {start:.0f} to {peak:.0f} MB"
    settled = start
    for _ in range(50):
        await asyncio.sleep(0.2)
        settled = rss_mb(pid)
        if settled - start < 40:
            break
    assert settled - start < 40, f"istiod-local kept {settled - start:.0f} MB after the watchers closed"


async def test_kubectl_reads_the_pod_after_nan_was_refused(served: tuple[IstiodLocal, Api], tmp_path: Path) -> None:
    istiod, api = served
    status, _, _ = await api.request("PATCH", POD + "/status", b'{"status":{"x":NaN,"phase":NaN}}')
    assert status == 400
    kubeconfig = istiod.kubeconfig(tmp_path / "admin.kubeconfig")
    done = subprocess.run([need_tool("kubectl"), "--kubeconfig", str(kubeconfig), "--cache-dir",
                           str(tmp_path / "cache"), "get", "pod", "echo-1", "-o", "json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["metadata"]["name"] == "echo-1"
