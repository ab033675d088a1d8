"""The Wasm cache's fetchers against real servers: a plain HTTP server on loopback and the distribution
registry in a network namespace (images pushed by skopeo, the Wasm artifact by oras).

HTTP: a module is fetched once and then served from disk; a checksum mismatch names both digests; a 5xx is
retried, a 404 is not; an oversized module, a link-local URL (directly or by redirect) and a blocked CIDR are
refused before anything is written. OCI: a Docker image, an OCI image and the Wasm artifact, anonymous; a
registry behind Basic auth refuses a plugin without its pull secret and serves one with it; the checksum is
the manifest digest; an unreachable registry is a manifest failure.
"""

from __future__ import annotations

import gzip
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wasm_modules import deny_module, header_module, sha256
from wasm_registry import ModuleServer, Registry, layer_tar_gz

from istio_agent.wasm.cache import WasmFetchError, WasmModuleCache
from istio_agent.wasm.core.cache_state import FetchRequest
from istio_agent.wasm.options import WasmOptions


def cache(tmp_path: Path, **options: Any) -> WasmModuleCache:
    fields: dict[str, Any] = {"cache_dir": tmp_path / "cache", "http_request_max_retries": 2}
    fields.update(options)
    return WasmModuleCache(WasmOptions(**fields))


def ask(url: str, checksum: str = "", policy: str = "IfNotPresent", secret: str | None = None,
        timeout: float = 20.0) -> FetchRequest:
    return FetchRequest(url, checksum, "default.plugin", "1", policy, secret.encode() if secret else None, timeout,
                        "plugin")


@pytest.fixture
def server() -> Iterator[ModuleServer]:
    with ModuleServer() as running:
        yield running


async def test_http_module_fetched_once_then_from_disk(tmp_path: Path, server: ModuleServer) -> None:
    module = header_module()
    server.files["/header.wasm"] = module
    server.files["/boxed.wasm.tgz"] = layer_tar_gz(module)
    wasm = cache(tmp_path)
    path = await wasm.get(ask(server.url("/header.wasm"), sha256(module)))
    assert Path(path).read_bytes() == module and Path(path).is_relative_to(tmp_path / "cache")
    assert await wasm.get(ask(server.url("/header.wasm"))) == path
    assert server.hits["/header.wasm"] == 1
    assert Path(await wasm.get(ask(server.url("/boxed.wasm.tgz")))).read_bytes() == module
    assert wasm.metrics.remote_fetches.get("success") == 2 and wasm.metrics.cache_lookups.get("true") == 1


async def test_http_failures_are_refused_with_their_reason(tmp_path: Path, server: ModuleServer) -> None:
    module = deny_module()
    server.files["/deny.wasm"] = module
    server.files["/big.wasm"] = module + b"\x00" * 4096
    server.files["/text"] = b"<html>not a module</html>"
    server.fail["/flaky.wasm"] = 503
    server.redirect["/sneaky.wasm"] = "http://169.254.169.254/latest/meta-data/"
    wasm = cache(tmp_path, max_module_size=2048)

    async def refused(request: FetchRequest) -> str:
        with pytest.raises(WasmFetchError) as caught:
            await wasm.get(request)
        return str(caught.value)

    wrong = "0" * 64
    message = await refused(ask(server.url("/deny.wasm"), wrong))
    assert wrong in message and sha256(module) in message
    assert "status code 503" in await refused(ask(server.url("/flaky.wasm")))
    assert server.hits["/flaky.wasm"] == 2, "a 5xx is retried up to WASM_HTTP_REQUEST_MAX_RETRIES attempts"
    assert "status code 404" in await refused(ask(server.url("/missing.wasm")))
    assert server.hits["/missing.wasm"] == 1, "a 404 is not retried"
    assert "larger than the limit of 2048 bytes" in await refused(ask(server.url("/big.wasm")))
    assert "invalid" in await refused(ask(server.url("/text")))
    assert "link-local" in await refused(ask("http://169.254.169.254/latest/meta-data/plugin.wasm"))
    assert "link-local" in await refused(ask(server.url("/sneaky.wasm")))
    metrics = wasm.metrics.remote_fetches
    assert metrics.get("checksum_mismatched") == 1 and metrics.get("download_failure") == 5
    assert metrics.get("fetch_failure") == 1
    assert not list((tmp_path / "cache").rglob("*.wasm")), "nothing refused is written"

    blocked = cache(tmp_path, blocked_cidrs=(ipaddress.ip_network("127.0.0.0/8"),))
    with pytest.raises(WasmFetchError, match=r"blocked CIDR range 127\.0\.0\.0/8"):
        await blocked.get(ask(server.url("/deny.wasm")))


async def test_gzip_bomb_is_capped(tmp_path: Path, server: ModuleServer) -> None:
    server.files["/bomb.wasm.gz"] = gzip.compress(b"\x00" * 10_000_000)
    with pytest.raises(WasmFetchError, match="larger than the limit"):
        await cache(tmp_path, max_module_size=100_000).get(ask(server.url("/bomb.wasm.gz")))


@pytest.fixture
def registry_peer(tmp_path: Path) -> Iterator[Registry]:
    with Registry(tmp_path) as running:
        yield running


async def test_oci_docker_image_oci_image_and_artifact(tmp_path: Path, registry_peer: Registry) -> None:
    reg = registry_peer
    header, deny = header_module(), deny_module()
    docker_digest = reg.push_image(header, "wasm/header", "docker", docker=True)
    oci_digest = reg.push_image(deny, "wasm/deny", "oci", docker=False)
    artifact_digest = reg.push_artifact(header_module("2"), "wasm/artifact", "v2")
    wasm = cache(tmp_path)
    path = await wasm.get(ask(f"oci://{reg.address}/wasm/header:docker", docker_digest))
    assert Path(path).read_bytes() == header
    assert Path(await wasm.get(ask(f"oci://{reg.address}/wasm/deny:oci"))).read_bytes() == deny
    pinned = f"oci://{reg.address}/wasm/artifact@sha256:{artifact_digest}"
    assert Path(await wasm.get(ask(pinned))).read_bytes() == header_module("2")
    assert oci_digest != docker_digest
    with pytest.raises(WasmFetchError, match=f"has checksum {oci_digest}, which does not match: {'1' * 64}"):
        await wasm.get(ask(f"oci://{reg.address}/wasm/deny:oci", "1" * 64, policy="Always"))
    assert wasm.metrics.remote_fetches.get("success") == 3


async def test_oci_pull_secret_and_unreachable_registry(tmp_path: Path) -> None:
    with Registry(tmp_path, user="puller", password="s3cret") as reg:
        reg.push_image(header_module(), "private/header", "v1", docker=True)
        wasm = cache(tmp_path)
        url = f"oci://{reg.address}/private/header:v1"
        with pytest.raises(WasmFetchError, match="asks for credentials"):
            await wasm.get(ask(url))
        wrong = reg.pull_secret().replace(reg.address, "elsewhere.example")
        with pytest.raises(WasmFetchError, match="asks for credentials"):
            await wasm.get(ask(url, secret=wrong))
        assert Path(await wasm.get(ask(url, secret=reg.pull_secret()))).read_bytes() == header_module()
        unreachable = f"oci://{reg.host_ip}:5999/wasm/header:v1"
        with pytest.raises(WasmFetchError, match="could not fetch Wasm OCI image"):
            await wasm.get(ask(unreachable, timeout=10))
        assert wasm.metrics.remote_fetches.get("manifest_failure") == 3
