"""SecretCache policy with an in-process CA (real signing via pki, no gRPC).

The signer here is the same signing code istiod-local uses, called directly, so
these tests check the cache's rules (sharing, rotation, expiry, pushes, files)
quickly; the gRPC path is covered by the component tests.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc
import pytest
from support import eventually

from istio_agent.pki import certs, keys
from istio_agent.security.ca_client import CaError
from istio_agent.security.cache import SecretCache
from istio_agent.security.options import SecurityOptions
from istio_agent.security.secrets import SecretError, SecretItem, pem_certificates

SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"


class LocalSigner:
    """Signs CSRs with a real root; can be switched off to play an unreachable CA."""

    def __init__(self) -> None:
        self.ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", time.time(), 3600)
        self.calls = 0
        self.failures = 0
        self.down = False

    def new_root(self) -> None:
        self.ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", time.time(), 3600)

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        self.calls += 1
        await asyncio.sleep(0.02)
        if self.down:
            self.failures += 1
            raise CaError("CA is down", grpc.StatusCode.UNAVAILABLE)
        csr = certs.load_csr(csr_pem)
        assert certs.csr_sans(csr) == [SPIFFE]
        leaf = certs.sign_workload_csr(self.ca, csr, SPIFFE, time.time(), ttl_seconds)
        return [certs.cert_to_pem(leaf), self.ca.cert_pem.decode()]

    async def close(self) -> None:
        return None


def options(tmp_path: Path, **overrides: object) -> SecurityOptions:
    base: dict[str, object] = dict(
        workdir=tmp_path, namespace="default", service_account="sleep", key_algorithm="ECDSA",
        retry_initial=0.05, retry_max=0.2, file_poll_interval=0.05, grace_period_ratio_jitter=0.0,
    )
    base.update(overrides)
    return SecurityOptions(**base)  # type: ignore[arg-type]


def serial(item: SecretItem) -> str:
    return certs.serial_hex(certs.load_pem_chain(item.cert_chain)[0])


async def test_concurrent_requests_share_one_csr(tmp_path: Path) -> None:
    signer = LocalSigner()
    cache = SecretCache(options(tmp_path), signer)
    items = await asyncio.gather(*(cache.get("default") for _ in range(10)), cache.get("ROOTCA"))
    assert signer.calls == 1
    assert len({serial(i) for i in items[:10]}) == 1
    assert items[10].root_cert == signer.ca.cert_pem
    leaf = certs.load_pem_chain(items[0].cert_chain)[0]
    assert certs.uri_sans(leaf) == [SPIFFE]
    assert certs.verify_signed_by(leaf, signer.ca.cert)
    await cache.stop()


async def test_prewarm_rotation_pushes_default_and_writes_output(tmp_path: Path) -> None:
    signer = LocalSigner()
    cache = SecretCache(options(tmp_path, secret_ttl=3.0, output_certs="out"), signer)
    pushed: list[str] = []
    cache.on_update(pushed.append)
    await cache.start()
    try:
        await eventually(lambda: cache.current_workload() is not None)
        first = await cache.get("default")
        out = tmp_path / "out"
        assert (out / "cert-chain.pem").read_bytes() == first.cert_chain
        assert (out / "key.pem").stat().st_mode & 0o777 == 0o600
        await eventually(lambda: "default" in pushed)
        second = await cache.get("default")
        assert serial(second) != serial(first)
        assert time.time() < first.expires, "rotated before the first certificate expired"
        assert (out / "cert-chain.pem").read_bytes() == second.cert_chain
        assert "ROOTCA" not in pushed, "same root: no ROOTCA push"
    finally:
        await cache.stop()


async def test_unreachable_ca_keeps_serving_until_expiry_then_never(tmp_path: Path) -> None:
    signer = LocalSigner()
    cache = SecretCache(options(tmp_path, secret_ttl=4.0, grace_period_ratio=0.75), signer)
    await cache.start()
    try:
        await eventually(lambda: cache.current_workload() is not None)
        first = await cache.get("default")
        signer.down = True
        await eventually(lambda: signer.failures >= 2)
        if time.time() < first.expires - 0.5:
            assert serial(await cache.get("default")) == serial(first)
        await eventually(lambda: time.time() > first.expires + 0.1)
        assert cache.current_workload() is None
        with pytest.raises(SecretError, match="CA is down"):
            await cache.get("default")
        assert all(item.expires > time.time() for item in cache.snapshot())
        signer.down = False
        await eventually(lambda: cache.current_workload() is not None)
        assert serial(await cache.get("default")) != serial(first)
    finally:
        await cache.stop()


async def test_new_root_pushes_rootca(tmp_path: Path) -> None:
    signer = LocalSigner()
    cache = SecretCache(options(tmp_path, secret_ttl=2.0), signer)
    pushed: list[str] = []
    cache.on_update(pushed.append)
    await cache.start()
    try:
        await eventually(lambda: cache.current_workload() is not None)
        old_root = (await cache.get("ROOTCA")).root_cert
        signer.new_root()
        await eventually(lambda: "ROOTCA" in pushed)
        assert (await cache.get("ROOTCA")).root_cert == signer.ca.cert_pem != old_root
    finally:
        await cache.stop()


async def test_extra_roots_are_merged_into_rootca(tmp_path: Path) -> None:
    signer = LocalSigner()
    other = certs.new_root_ca(keys.generate_key("ECDSA"), "other.domain", time.time(), 3600)
    cache = SecretCache(options(tmp_path, output_certs="out"), signer)
    pushed: list[str] = []
    cache.on_update(pushed.append)
    await cache.get("default")
    cache.set_extra_roots("pcds", [other.cert_pem, signer.ca.cert_pem])
    assert pushed == ["ROOTCA"]
    bundle = (await cache.get("ROOTCA")).root_cert
    assert [c.subject for c in certs.load_pem_chain(bundle)] == [signer.ca.cert.subject, other.cert.subject]
    assert (tmp_path / "out/root-cert.pem").read_bytes() == bundle
    cache.set_extra_roots("pcds", [other.cert_pem])
    assert pushed == ["ROOTCA"], "same merged bundle: no push"
    cache.set_extra_roots("pcds", [])
    assert (await cache.get("ROOTCA")).root_cert == signer.ca.cert_pem
    await cache.stop()


def write_pair(directory: Path, ca: certs.CertificateAuthority) -> str:
    key = keys.generate_key("ECDSA")
    csr = certs.load_csr(certs.build_csr(key, [SPIFFE]))
    leaf = certs.sign_workload_csr(ca, csr, SPIFFE, time.time(), 3600)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key.pem").write_bytes(keys.key_to_pem(key))
    (directory / "cert-chain.pem").write_text(certs.cert_to_pem(leaf))
    (directory / "root-cert.pem").write_bytes(ca.cert_pem)
    return certs.serial_hex(leaf)


async def test_mounted_certs_are_served_without_the_ca(tmp_path: Path) -> None:
    signer = LocalSigner()
    first_serial = write_pair(tmp_path / "etc/certs", signer.ca)
    cache = SecretCache(options(tmp_path), signer)
    assert not cache.uses_ca
    await cache.start()
    try:
        assert serial(await cache.get("default")) == first_serial
        assert (await cache.get("ROOTCA")).root_cert == signer.ca.cert_pem
        assert signer.calls == 0
        pushed: list[str] = []
        cache.on_update(pushed.append)
        new_serial = write_pair(tmp_path / "etc/certs", signer.ca)
        await eventually(lambda: "default" in pushed)
        assert serial(await cache.get("default")) == new_serial
    finally:
        await cache.stop()


def kubernetes_volume(volume: Path, stamp: str, ca: certs.CertificateAuthority) -> str:
    """Lay out a secret volume as the kubelet does: files -> ..data/<file>, ..data -> ..<stamp>."""
    serial_hex = write_pair(volume / stamp, ca)
    tmp_link = volume / "..data_tmp"
    os.symlink(stamp, tmp_link)
    os.replace(tmp_link, volume / "..data")
    for name in ("key.pem", "cert-chain.pem", "root-cert.pem"):
        if not (volume / name).is_symlink():
            os.symlink(f"..data/{name}", volume / name)
    return serial_hex


async def test_kubernetes_data_symlink_swap_is_caught(tmp_path: Path) -> None:
    signer = LocalSigner()
    volume = tmp_path / "certs"
    first = kubernetes_volume(volume, "..2024_01", signer.ca)
    cache = SecretCache(options(tmp_path), None)
    pushed: list[str] = []
    cache.on_update(pushed.append)
    await cache.start()
    name = f"file-cert:{volume}/cert-chain.pem~{volume}/key.pem"
    try:
        assert serial(await cache.get(name)) == first
        root = await cache.get("file-root:certs/root-cert.pem")
        assert root.is_root and root.root_cert == signer.ca.cert_pem
        second = kubernetes_volume(volume, "..2024_02", signer.ca)
        await eventually(lambda: name in pushed)
        assert serial(await cache.get(name)) == second
        assert [s.resource_name for s in cache.snapshot()] == sorted([name, "file-root:certs/root-cert.pem"])
    finally:
        await cache.stop()


async def test_file_secret_errors_name_the_problem(tmp_path: Path) -> None:
    signer = LocalSigner()
    write_pair(tmp_path / "a", signer.ca)
    write_pair(tmp_path / "b", signer.ca)
    cache = SecretCache(options(tmp_path), None)
    with pytest.raises(SecretError, match="does not match"):
        await cache.get("file-cert:a/cert-chain.pem~b/key.pem")
    with pytest.raises(SecretError, match="cannot read"):
        await cache.get("file-root:missing.pem")
    with pytest.raises(SecretError, match="no CA client"):
        await cache.get("default")
    system = await cache.get("file-root:system")
    assert system.is_root and len(pem_certificates(system.root_cert)) > 10
