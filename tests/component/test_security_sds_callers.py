"""The SDS socket serves a `file-cert:`/`file-root:` file only to a caller that could read it itself.

The agent runs here as root (it can read anything); each caller is a real SDS
client in a child process that drops to another uid (1337, Envoy's in a pod)
before it connects (`sds_caller.py`), so the agent sees it through SO_PEERCRED
as that user. `default` and `ROOTCA` are served to any caller, as upstream does.
The tests run on asyncio's loop, the agent's; the last one repeats the essentials on
uvloop's (its transports are not asyncio's classes), which an embedding may choose.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import uvloop
from needs import need_root
from security_harness import SdsClient, secrets_of
from support import eventually, open_workdir

from istio_agent.pki import certs, keys
from istio_agent.security.core.sds_state import MAX_NAMES_PER_REQUEST
from istio_agent.security.identity import WorkloadIdentity
from istio_agent.security.options import SecurityOptions

CALLER = Path(__file__).resolve().parent / "sds_caller.py"
SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"
ENVOY_UID = 1337


def write_pair(directory: Path, ca: certs.CertificateAuthority) -> tuple[Path, Path]:
    """A leaf certificate and its key in `directory` (cert.pem, key.pem)."""
    key = keys.generate_key("ECDSA")
    leaf = certs.sign_workload_csr(ca, certs.load_csr(certs.build_csr(key, [SPIFFE])), SPIFFE, time.time(), 3600)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_text(certs.cert_to_pem(leaf))
    key_path.write_bytes(keys.key_to_pem(key))
    return cert_path, key_path


def owned(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)
    return path


def directory(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    path.mkdir()
    return owned(path, mode, uid, gid)


@dataclass
class Pod:
    workdir: Path
    ca: certs.CertificateAuthority
    identity: WorkloadIdentity

    @property
    def socket(self) -> Path:
        return self.identity.options.sds_socket_path


@pytest.fixture
def workdir() -> Iterator[Path]:
    need_root()
    with open_workdir("sds-callers") as path:
        yield path


@pytest.fixture
async def pod(workdir: Path) -> AsyncIterator[Pod]:
    async with running_pod(workdir) as running:
        yield running


@contextlib.asynccontextmanager
async def running_pod(workdir: Path) -> AsyncIterator[Pod]:
    ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", time.time(), 86400)
    mounted = workdir / "etc/certs"
    cert, _ = write_pair(mounted, ca)
    cert.rename(mounted / "cert-chain.pem")
    (mounted / "root-cert.pem").write_bytes(ca.cert_pem)
    identity = WorkloadIdentity(SecurityOptions(workdir=workdir, file_mounted_certs=True, file_poll_interval=0.1,
                                                key_algorithm="ECDSA"))
    await identity.start()
    # In a pod the socket's directory (0750) belongs to the proxy's uid; here the agent is root and the
    # callers are other uids, so let every uid reach the socket, which is 0666 as upstream.
    os.chmod(identity.options.sds_socket_path.parent, 0o755)
    try:
        yield Pod(workdir, ca, identity)
    finally:
        await identity.stop()


async def ask_as(pod: Pod, names: list[str], uid: int = ENVOY_UID, gid: int = ENVOY_UID,
                 groups: tuple[int, ...] = ()) -> dict[str, object]:
    """One StreamSecrets request from a process running as `uid`; its answer (secrets, or code and details)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CALLER), str(uid), str(gid), ",".join(map(str, groups)) or "-", str(pod.socket), *names,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"the caller failed:\n{err.decode()}"
    answer = json.loads(out.decode().strip().splitlines()[-1])
    assert isinstance(answer, dict)
    return answer


def served(answer: dict[str, object]) -> dict[str, dict[str, str]]:
    assert "secrets" in answer, f"refused: {answer}"
    secrets = answer["secrets"]
    assert isinstance(secrets, dict)
    return secrets


def refusal(answer: dict[str, object]) -> str:
    assert answer.get("code") == "PERMISSION_DENIED", f"not refused: {answer}"
    return str(answer["details"])


async def test_a_root_only_key_is_refused_with_a_reason_and_logged(pod: Pod, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = write_pair(pod.workdir / "istiod", pod.ca)
    owned(cert, 0o644)
    owned(key, 0o600)  # istiod-local's CA key, say
    name = f"file-cert:{cert}~{key}"
    with caplog.at_level(logging.WARNING, logger="istio_agent.security.sds"):
        details = refusal(await ask_as(pod, [name]))
    assert str(key) in details and "uid 1337" in details and "may not read" in details
    assert any("refused" in r.getMessage() and str(key) in r.getMessage() for r in caplog.records)
    assert pod.identity.cache.watched_files() == {}, "nothing is watched for a refused name"

    # root reads anything, as the kernel lets it
    assert served(await ask_as(pod, [name], uid=0, gid=0))[name]["key"] == key.read_text()


async def test_files_the_caller_can_read_are_served_as_upstream(pod: Pod) -> None:
    mine = directory(pod.workdir / "mine", 0o700, ENVOY_UID, ENVOY_UID)
    cert, key = write_pair(mine, pod.ca)
    root = mine / "root.pem"
    root.write_bytes(pod.ca.cert_pem)
    for path in (cert, key, root):
        owned(path, 0o600, ENVOY_UID, ENVOY_UID)
    name, root_name = f"file-cert:{cert}~{key}", f"file-root:{root}"
    secrets = served(await ask_as(pod, [name, root_name]))
    assert secrets[name]["chain"] == cert.read_text() and secrets[name]["key"] == key.read_text()
    assert secrets[root_name]["root"] == pod.ca.cert_pem.decode()


async def test_default_rootca_and_the_system_bundle_go_to_any_caller(pod: Pod) -> None:
    secrets = served(await ask_as(pod, ["default", "ROOTCA", "file-root:system"]))
    assert secrets["default"]["key"] == (pod.workdir / "etc/certs/key.pem").read_text()
    assert secrets["ROOTCA"]["root"] == pod.ca.cert_pem.decode()
    assert secrets["file-root:system"]["root"].count("BEGIN CERTIFICATE") > 10


async def test_every_directory_on_the_way_must_be_searchable(pod: Pod) -> None:
    hidden = directory(pod.workdir / "hidden", 0o700)
    root = hidden / "root.pem"
    root.write_bytes(pod.ca.cert_pem)
    owned(root, 0o644)
    details = refusal(await ask_as(pod, [f"file-root:{root}"]))
    assert str(root) in details and f"may not search directory {hidden}" in details


async def test_a_symlink_is_judged_by_the_file_it_reaches(pod: Pod) -> None:
    root = pod.workdir / "root-only.pem"
    root.write_bytes(pod.ca.cert_pem)
    owned(root, 0o600)
    mine = directory(pod.workdir / "mine", 0o755, ENVOY_UID, ENVOY_UID)
    link = mine / "link.pem"
    link.symlink_to(root)
    details = refusal(await ask_as(pod, [f"file-root:{link}"]))
    assert str(link) in details and "may not read" in details


async def test_group_and_supplementary_group_rights_count(pod: Pod) -> None:
    root = pod.workdir / "group.pem"
    root.write_bytes(pod.ca.cert_pem)
    owned(root, 0o640, 0, ENVOY_UID)
    name = f"file-root:{root}"
    assert served(await ask_as(pod, [name], uid=ENVOY_UID, gid=ENVOY_UID))[name]["root"]
    assert served(await ask_as(pod, [name], uid=1338, gid=1338, groups=(ENVOY_UID,)))[name]["root"]
    assert "may not read" in refusal(await ask_as(pod, [name], uid=1338, gid=1338))


async def test_a_connection_to_the_private_grpc_socket_is_refused(pod: Pod) -> None:
    sds = pod.identity.sds
    assert sds is not None
    private = sds.private_socket_path
    assert private.parent.stat().st_mode & 0o777 == 0o700
    client = SdsClient(private)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            # The refusal may end the stream before the request is written: either call then raises it.
            await client.request(["default"])
            await client.read()
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "unknown SDS peer" in (error.value.details() or "")
    finally:
        await client.close()


async def test_watches_follow_the_subscribers_of_a_name(pod: Pod) -> None:
    root = pod.workdir / "watched.pem"
    root.write_bytes(pod.ca.cert_pem)
    name = f"file-root:{root}"
    cache = pod.identity.cache
    first, second = SdsClient(pod.socket), SdsClient(pod.socket)
    open_clients = [first, second]
    try:
        await first.request([name])
        assert name in secrets_of(await first.read())
        await second.request([name])
        assert name in secrets_of(await second.read())
        assert cache.watched_files() == {root: {name}}
        await first.close()
        open_clients.remove(first)
        await eventually(lambda: pod.identity.sds is not None and pod.identity.sds.stream_count == 1,
                         what="the first stream to be gone")
        assert cache.watched_files() == {root: {name}}, "the second stream still subscribes"
        await second.request([], nonce="")  # unsubscribes
        await eventually(lambda: cache.watched_files() == {}, what="the watch to be dropped")
        assert [item.resource_name for item in cache.snapshot()] == [], "no longer served"
    finally:
        for client in open_clients:
            await client.close()


async def test_a_file_that_does_not_load_is_not_watched(pod: Pod) -> None:
    junk = pod.workdir / "junk.pem"
    junk.write_text("not a certificate\n")
    client = SdsClient(pod.socket)
    try:
        await client.request([f"file-root:{junk}"])
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.read()
        assert "no valid certificate" in (error.value.details() or "")
    finally:
        await client.close()
    assert pod.identity.cache.watched_files() == {}


async def test_too_many_names_in_one_request_are_refused(pod: Pod) -> None:
    client = SdsClient(pod.socket)
    try:
        await client.request([f"file-root:/nonexistent/{i}.pem" for i in range(MAX_NAMES_PER_REQUEST + 1)])
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.read()
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"at most {MAX_NAMES_PER_REQUEST} resources" in (error.value.details() or "")
    finally:
        await client.close()
    assert pod.identity.cache.watched_files() == {}


def test_the_essentials_on_uvloop_too(workdir: Path) -> None:
    async def scenario() -> None:
        async with running_pod(workdir) as pod:
            cert, key = write_pair(pod.workdir / "istiod", pod.ca)
            owned(key, 0o600)
            name = f"file-cert:{cert}~{key}"
            assert str(key) in refusal(await ask_as(pod, [name]))
            assert served(await ask_as(pod, [name], uid=0, gid=0))[name]["key"] == key.read_text()
            assert served(await ask_as(pod, ["default"]))["default"]["chain"]
            await test_a_connection_to_the_private_grpc_socket_is_refused(pod)

    uvloop.run(scenario())
