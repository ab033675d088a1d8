"""The SDS server over its Unix socket, driven by a real gRPC client, with certificates from istiod-local."""

from __future__ import annotations

import asyncio
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from launchers import IstiodLocal
from security_harness import NODE_ID, SECRET_TYPE, SdsClient, leaf_of, pod_options, secrets_of, sleep_pod
from support import eventually

from istio_agent.pki import certs, keys
from istio_agent.security.identity import WorkloadIdentity

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


@pytest.fixture
async def identity(tmp_path: Path, istiod: IstiodLocal) -> AsyncIterator[WorkloadIdentity]:
    pod = tmp_path / "pod"
    sleep_pod(istiod, pod)
    component = WorkloadIdentity(pod_options(pod, istiod, secret_ttl=300.0))
    await component.start()
    yield component
    await component.stop()


@pytest.fixture
async def clients(identity: WorkloadIdentity) -> AsyncIterator[list[SdsClient]]:
    opened: list[SdsClient] = []
    yield opened
    for client in opened:
        await client.close()


def open_client(identity: WorkloadIdentity, clients: list[SdsClient]) -> SdsClient:
    client = SdsClient(identity.options.sds_socket_path)
    clients.append(client)
    return client


def serial_in(secret_chain: bytes) -> str:
    return certs.serial_hex(leaf_of(secret_chain))


async def test_socket_modes(identity: WorkloadIdentity) -> None:
    path = identity.options.sds_socket_path
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert path.stat().st_mode & 0o777 == 0o666
    assert path.parent.stat().st_mode & 0o777 == 0o750


async def test_default_and_rootca_responses(identity: WorkloadIdentity, istiod: IstiodLocal,
                                            clients: list[SdsClient]) -> None:
    client = open_client(identity, clients)
    await client.request(["default"])
    first = await client.read()
    assert first.type_url == SECRET_TYPE and first.nonce and first.version_info
    default = secrets_of(first)["default"]
    chain = default.tls_certificate.certificate_chain.inline_bytes
    leaf = leaf_of(chain)
    assert certs.uri_sans(leaf) == [SPIFFE]
    assert certs.public_key_matches(leaf, keys.key_from_pem(default.tls_certificate.private_key.inline_bytes))

    # ACK, then a request that adds ROOTCA: the next message carries ROOTCA only, so the ACK got no answer.
    await client.request(["default"], nonce=first.nonce)
    await client.request(["default", "ROOTCA"], nonce=first.nonce)
    second = await client.read()
    secrets = secrets_of(second)
    assert list(secrets) == ["ROOTCA"]
    assert secrets["ROOTCA"].validation_context.trusted_ca.inline_bytes == istiod.root_pem()

    # A NACK and a stale nonce get nothing; a new name after them is answered alone.
    await client.request(["default", "ROOTCA"], nonce=second.nonce, error="rejected")
    await client.request(["default", "ROOTCA", "file-root:system"], nonce=first.nonce)
    await client.request(["default", "ROOTCA", "file-root:system"], nonce=second.nonce)
    third = await client.read()
    assert list(secrets_of(third)) == ["file-root:system"]


async def test_pushes_reach_only_streams_watching_the_name(identity: WorkloadIdentity,
                                                          clients: list[SdsClient]) -> None:
    default_stream = open_client(identity, clients)
    root_stream = open_client(identity, clients)
    await default_stream.request(["default"])
    first = await default_stream.read()
    await root_stream.request(["ROOTCA"])
    await root_stream.read()
    await eventually(lambda: identity.sds is not None and identity.sds.stream_count == 2, what="two streams")

    # A certificate change: only the `default` stream hears about it.
    assert identity.sds is not None
    identity.sds.push("default")
    pushed = await default_stream.read()
    assert list(secrets_of(pushed)) == ["default"]
    assert pushed.nonce != first.nonce

    # A trust-bundle change: the ROOTCA stream's next message is that, not the default push.
    other = certs.new_root_ca(keys.generate_key("ECDSA"), "other.example", time.time(), 3600)
    identity.cache.set_extra_roots("test", [other.cert_pem])
    bundle = secrets_of(await root_stream.read())["ROOTCA"].validation_context.trusted_ca.inline_bytes
    assert other.cert_pem in bundle


async def test_unsubscribe_gets_no_response_and_no_pushes(identity: WorkloadIdentity,
                                                         clients: list[SdsClient]) -> None:
    client = open_client(identity, clients)
    await client.request(["default"])
    first = await client.read()
    await client.request([], nonce=first.nonce)
    sds = identity.sds
    assert sds is not None
    await eventually(lambda: sds.subscriptions() == [(NODE_ID, frozenset())], what="unsubscribe processed")
    sds.push("default")
    await client.request(["ROOTCA"], nonce=first.nonce)
    assert list(secrets_of(await client.read())) == ["ROOTCA"]


async def test_generation_error_ends_the_stream(identity: WorkloadIdentity, clients: list[SdsClient]) -> None:
    client = open_client(identity, clients)
    await client.request(["file-root:does-not-exist.pem"])
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.read()
    assert error.value.code() == grpc.StatusCode.UNKNOWN
    assert "failed to generate secret for file-root:does-not-exist.pem" in (error.value.details() or "")


async def test_first_request_without_node_is_refused(identity: WorkloadIdentity, clients: list[SdsClient]) -> None:
    client = open_client(identity, clients)
    await client.request(["default"], node=False)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.read()
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_delta_and_fetch_are_unimplemented(identity: WorkloadIdentity, clients: list[SdsClient]) -> None:
    client = open_client(identity, clients)
    request = discovery_pb2.DiscoveryRequest(type_url=SECRET_TYPE, resource_names=["default"])
    request.node.id = NODE_ID
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.stub.FetchSecrets(request)
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    delta = client.stub.DeltaSecrets()
    await delta.write(discovery_pb2.DeltaDiscoveryRequest(type_url=SECRET_TYPE))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await delta.read()
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_another_server_on_the_socket_leaves_ours_serving_files_only(
        identity: WorkloadIdentity, istiod: IstiodLocal) -> None:
    """Upstream's ServeOnlyFiles: the running server keeps the workload socket; ours asks no CA and
    listens on the files socket."""
    second = WorkloadIdentity(replace(pod_options(identity.options.workdir, istiod), serve_only_files=True))
    await second.start()
    try:
        assert second.external_sds and second.signer is None, "the other server owns the workload certificate"
        assert second.sds is not None and second.sds.socket_path == second.options.sds_listen_path
        assert second.sds.socket_path.name == "files-socket" and second.sds.socket_path.exists()
    finally:
        await second.stop()
    assert identity.options.sds_socket_path.exists(), "the running server's socket is untouched"


async def test_stale_socket_file_is_replaced(tmp_path: Path, istiod: IstiodLocal) -> None:
    # A short path, so that the socket is bound directly (the long-path route is used everywhere else).
    pod = Path(tempfile.mkdtemp(prefix="sds", dir="/tmp"))
    try:
        sleep_pod(istiod, pod)
        options = pod_options(pod, istiod)
        options.sds_socket_path.parent.mkdir(parents=True)
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(options.sds_socket_path))
        dead.close()  # the file stays, nobody listens
        component = WorkloadIdentity(options)
        await component.start()
        try:
            assert component.sds is not None and not component.external_sds
            client = SdsClient(options.sds_socket_path)
            try:
                await client.request(["default"])
                assert "default" in secrets_of(await asyncio.wait_for(client.read(), 20))
            finally:
                await client.close()
        finally:
            await component.stop()
    finally:
        shutil.rmtree(pod)


def test_sds_server_and_xds_proxy_load_no_envoy_api_module() -> None:
    """Both speak Envoy's messages through heads of their own: Envoy's generated modules stay out of the agent."""
    from support import loaded_after

    loaded = loaded_after("import istio_agent.security.sds, istio_agent.xds.proxy")
    assert "istio_agent.security.sds" in loaded and "grpc" in loaded
    assert not {m for m in loaded if m.startswith(("envoy.", "udpa.", "xds.", "validate"))}
