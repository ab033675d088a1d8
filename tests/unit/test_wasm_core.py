"""The Wasm cache's sans-IO rules: cache keys and pull policies, the SSRF guard, image references and
layouts, pull secrets, and modules out of archives (nothing written, every expansion capped)."""

from __future__ import annotations

import base64
import gzip
import io
import ipaddress
import json
import tarfile

import pytest

from istio_agent.wasm.core import oci
from istio_agent.wasm.core.cache_state import (
    ALWAYS,
    IF_NOT_PRESENT,
    UNSPECIFIED,
    CacheKey,
    CacheState,
    ignores_resource_version,
    module_file,
    module_name,
)
from istio_agent.wasm.core.ssrf import blocked_reason, parse_cidrs, realm_problem
from istio_agent.wasm.core.unbox import LayerError, ModuleTooLarge, is_wasm, plugin_from_tar_gz, unbox

MODULE = b"\x00asm\x01\x00\x00\x00" + b"\x00" * 32
A, B = "a" * 64, "b" * 64


def tar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --- keys and pull policies ----------------------------------------------------------------------------
def test_module_name_is_the_url_or_the_images_repository() -> None:
    assert module_name("https://example.com/p.wasm") == "https://example.com/p.wasm"
    assert module_name("oci://ghcr.io/org/plugin:1.0") == "oci://ghcr.io/org/plugin"
    assert module_name("oci://ghcr.io/org/plugin@sha256:" + A) == "oci://ghcr.io/org/plugin"
    assert module_name("oci://plugin") == "oci://index.docker.io/library/plugin"


@pytest.mark.parametrize(("policy", "url", "ignored"), [
    (ALWAYS, "https://x/p.wasm", False),
    (IF_NOT_PRESENT, "oci://r.io/p:latest", True),
    (UNSPECIFIED, "oci://r.io/p:latest", False),  # the default rule: latest is always pulled
    (UNSPECIFIED, "oci://r.io/p:1.0", True),
    (UNSPECIFIED, "https://x/p:latest", True),
])
def test_pull_policy_decides_whether_the_resource_version_matters(policy: str, url: str, ignored: bool) -> None:
    assert ignores_resource_version(policy, url) is ignored


def test_module_files_are_named_by_digests_only() -> None:
    path = module_file("oci://r.io/../../etc", A)
    assert ".." not in path and path.endswith(f"/{A}.wasm") and len(path.split("/")) == 2
    with pytest.raises(ValueError):
        module_file("x", "../../etc/passwd")


def test_a_url_without_checksum_is_served_by_its_last_module_unless_always_and_a_new_version() -> None:
    state = CacheState()
    key = CacheKey("https://x/p.wasm", "", "ns.plugin", "1")
    assert state.lookup(key, UNSPECIFIED, 0) == (None, "")
    state.add(key, A, 10, now=0)
    entry, checksum = state.lookup(key, IF_NOT_PRESENT, 1)
    assert entry is not None and checksum == A
    newer = CacheKey("https://x/p.wasm", "", "ns.plugin", "2")
    assert state.lookup(newer, ALWAYS, 2) == (None, "")  # a new resource version with Always: fetch again
    assert state.lookup(newer, ALWAYS, 3)[0] is entry  # the same version again: served
    assert state.lookup(CacheKey("https://x/p.wasm", B, "ns.plugin", "2"), IF_NOT_PRESENT, 4) == (None, B)


def test_a_digest_in_an_oci_url_is_its_checksum() -> None:
    state = CacheState()
    pinned = CacheKey("oci://r.io/p@sha256:" + A)
    state.add(pinned, A, 10, now=0)
    assert state.lookup(pinned, UNSPECIFIED, 1)[0] is not None
    assert pinned.url not in state.checksums  # a pinned URL never moves


def test_expiry_and_the_size_budget() -> None:
    state = CacheState()
    state.add(CacheKey("https://x/a"), A, 600, now=0)
    state.add(CacheKey("https://x/b"), B, 600, now=50)
    assert state.expired(now=100, expiry=60) == [("https://x/a", A)]
    assert state.over_budget(1000, keep=("https://x/a", A)) == [("https://x/b", B)]
    state.remove("https://x/a", A)
    assert "https://x/a" not in state.checksums and len(state) == 1


def test_saved_state_keeps_only_modules_whose_file_is_there() -> None:
    state = CacheState()
    entry = state.add(CacheKey("https://x/a", "", "r", "1"), A, 600, now=5)
    state.add(CacheKey("https://x/b"), B, 600, now=5)
    saved = json.loads(json.dumps(state.to_json()))
    again = CacheState.from_json(saved, {entry.path: 600})
    assert list(again.modules) == [("https://x/a", A)]
    assert again.lookup(CacheKey("https://x/a", "", "r", "1"), IF_NOT_PRESENT, 9)[0] is not None
    assert "https://x/b" not in again.checksums
    assert len(CacheState.from_json({"version": 99}, {})) == 0


# --- SSRF -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("address", ["169.254.169.254", "fe80::1", "100.100.100.200", "fd00:ec2::254",
                                     "::ffff:169.254.169.254", "224.0.0.5", "ff02::1"])
def test_link_local_and_metadata_addresses_are_always_blocked(address: str) -> None:
    reason = blocked_reason(ipaddress.ip_address(address))
    assert reason is not None and "connection blocked" in reason


def test_blocked_cidrs_add_ranges_and_skip_what_does_not_parse() -> None:
    ranges, problems = parse_cidrs(" 10.0.0.0/8, nonsense ,,192.168.1.0/24")
    assert [str(r) for r in ranges] == ["10.0.0.0/8", "192.168.1.0/24"] and len(problems) == 1
    assert "blocked CIDR range 10.0.0.0/8" in str(blocked_reason(ipaddress.ip_address("10.1.2.3"), ranges))
    assert blocked_reason(ipaddress.ip_address("127.0.0.1"), ranges) is None


@pytest.mark.parametrize(("realm", "ok"), [
    ("https://auth.example.com/token", True), ("ftp://auth.example.com/token", False), ("https://", False),
    ("https://localhost/token", False), ("http://10.0.0.1/token", False), ("https://169.254.169.254/", False),
    ("http://metadata.google.internal/x", False),
])
def test_bearer_realms_must_be_public_http(realm: str, ok: bool) -> None:
    assert (realm_problem(realm) is None) is ok


# --- images -----------------------------------------------------------------------------------------------
def test_image_references() -> None:
    assert oci.parse_reference("localhost:5000/wasm/header:v1") == oci.Reference("localhost:5000", "wasm/header", "v1")
    ref = oci.parse_reference("ghcr.io/org/p@sha256:" + A)
    assert (ref.registry, ref.repository, ref.identifier) == ("ghcr.io", "org/p", "sha256:" + A)
    assert oci.parse_reference("org/p").registry == oci.DOCKER_HUB
    for bad in ("r.io/p@sha256:xyz", "r.io/P:1", "r.io/p:bad tag"):
        with pytest.raises(oci.ImageError):
            oci.parse_reference(bad)


def layer(media: str, digest: str = "sha256:" + A) -> dict[str, object]:
    return {"mediaType": media, "digest": digest, "size": 10}


def test_module_layer_by_upstreams_three_layouts() -> None:
    docker = {"mediaType": oci.DOCKER_MANIFEST, "layers": [layer(oci.DOCKER_LAYER)]}
    assert oci.module_layer(docker).form == "archive"
    image = {"mediaType": oci.OCI_MANIFEST, "layers": [layer(oci.OCI_LAYER)]}
    assert oci.module_layer(image).form == "archive"
    artifact = {"mediaType": oci.OCI_MANIFEST, "layers": [layer("application/vnd.module.wasm.config.v1+json"),
                                                          layer(oci.WASM_LAYER, "sha256:" + B)]}
    assert oci.module_layer(artifact) == oci.Layer("sha256:" + B, oci.WASM_LAYER, 10, "raw")
    with pytest.raises(oci.ImageError, match="expect"):
        oci.module_layer({"mediaType": oci.DOCKER_MANIFEST, "layers": [layer(oci.OCI_LAYER)]})
    with pytest.raises(oci.ImageError, match="greater than zero"):
        oci.module_layer({"layers": []})
    index = {"mediaType": oci.OCI_INDEX, "manifests": [
        {"digest": "sha256:" + A, "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": "sha256:" + B, "platform": {"os": "linux", "architecture": "amd64"}}]}
    assert oci.is_index(index) and oci.platform_manifest(index) == "sha256:" + B


def test_pull_secret_credentials() -> None:
    auth = base64.b64encode(b"user:secret").decode()
    secret = json.dumps({"auths": {"r.io:5000": {"auth": auth}, "https://index.docker.io/v1/": {
        "username": "hub", "password": "pw"}}}).encode()
    assert oci.pull_secret_credentials(secret, "r.io:5000") == oci.Credentials("user", "secret")
    assert oci.pull_secret_credentials(secret, oci.DOCKER_HUB) == oci.Credentials("hub", "pw")
    assert oci.pull_secret_credentials(secret, "other.io") is None
    with pytest.raises(oci.ImageError):
        oci.pull_secret_credentials(b"null", "r.io")
    challenge = oci.parse_challenge('Bearer realm="https://auth.io/token",service="registry",scope="repository:p:pull"')
    assert challenge.scheme == "bearer" and challenge.params["service"] == "registry"


# --- archives ---------------------------------------------------------------------------------------------
def test_unbox_takes_gzip_and_tar_off_and_leaves_the_rest() -> None:
    assert unbox(gzip.compress(tar({"any.wasm": MODULE})), 1024) == MODULE
    assert unbox(b"not a module at all", 1024) == b"not a module at all"
    assert is_wasm(MODULE) and not is_wasm(MODULE[:7])


def test_plugin_wasm_is_found_by_base_name_and_paths_are_never_used() -> None:
    layer_bytes = gzip.compress(tar({"../../etc/cron.d/x": b"evil", "../../plugin.wasm": MODULE}))
    assert plugin_from_tar_gz(layer_bytes, 1024) == MODULE
    with pytest.raises(LayerError, match="not found"):
        plugin_from_tar_gz(gzip.compress(tar({"other.wasm": MODULE})), 1024)


def test_expansion_is_capped() -> None:
    bomb = gzip.compress(b"\x00" * 1_000_000)
    with pytest.raises(ModuleTooLarge):
        plugin_from_tar_gz(bomb, 1000)
    with pytest.raises(ModuleTooLarge):
        unbox(tar({"plugin.wasm": MODULE * 100}), 1000)
