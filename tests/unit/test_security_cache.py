"""SecretCache policy in virtual time, with a CA that signs for real (pki, no gRPC).

Every scenario runs on a `VirtualClock`: hours of rotation schedule take
milliseconds, and the CA goes down and comes back at exact virtual times. The
gRPC path is covered by the component tests.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fakes import SPIFFE, FakeSigner
from support import eventually

from istio_agent.clock import VirtualClock
from istio_agent.pki import certs, keys
from istio_agent.security.cache import SecretCache
from istio_agent.security.core.rotation import rotation_time
from istio_agent.security.core.secrets import SecretError, SecretItem, pem_certificates
from istio_agent.security.options import SecurityOptions

T = TypeVar("T")
HOUR = 3600.0
MINUTE = 60.0


def options(tmp_path: Path, **overrides: object) -> SecurityOptions:
    base: dict[str, object] = dict(
        workdir=tmp_path, namespace="default", service_account="sleep", key_algorithm="ECDSA",
        file_poll_interval=0.05, grace_period_ratio_jitter=0.0,
    )
    base.update(overrides)
    return SecurityOptions(**base)  # type: ignore[arg-type]


def in_virtual_time(scenario: Callable[[VirtualClock], Coroutine[Any, Any, T]]) -> T:
    clock = VirtualClock()
    return clock.run(scenario(clock))


def serial(item: SecretItem) -> str:
    return certs.serial_hex(certs.load_pem_chain(item.cert_chain)[0])


class Timeline:
    """What the cache pushed and served, stamped with virtual seconds since the scenario began."""

    def __init__(self, clock: VirtualClock, cache: SecretCache) -> None:
        self.clock = clock
        self.cache = cache
        self.pushes: list[tuple[float, str]] = []
        self.served: list[tuple[float, str | None]] = []
        cache.on_update(lambda name: self.pushes.append((clock.elapsed(), name)))

    def sample_every(self, period: float, until: float) -> None:
        """Record the served certificate's serial (None when nothing is served) every `period` seconds."""
        def sample() -> None:
            item = self.cache.current_workload()
            self.served.append((self.clock.elapsed(), serial(item) if item is not None else None))
            if self.clock.elapsed() + period <= until:
                self.clock.call_at(self.clock.now() + period, sample)

        self.clock.call_at(self.clock.now() + period, sample)

    def first_push_after(self, t: float, name: str = "default") -> float:
        return next(at for at, pushed in self.pushes if pushed == name and at >= t)


def test_concurrent_requests_share_one_csr(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        cache = SecretCache(options(tmp_path), signer, clock=clock)
        items = await asyncio.gather(*(cache.get("default") for _ in range(10)), cache.get("ROOTCA"))
        assert len(signer.calls) == 1
        assert len({serial(i) for i in items[:10]}) == 1
        assert items[10].root_cert == signer.ca.cert_pem
        leaf = certs.load_pem_chain(items[0].cert_chain)[0]
        assert certs.uri_sans(leaf) == [SPIFFE]
        assert certs.verify_signed_by(leaf, signer.ca.cert)
        await cache.stop()

    in_virtual_time(scenario)


def test_rotation_at_the_grace_ratio_pushes_default_and_writes_output(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        cache = SecretCache(options(tmp_path, secret_ttl=HOUR, output_certs="out"), signer, clock=clock)
        timeline = Timeline(clock, cache)
        await cache.start()
        first = await cache.get("default")
        out = tmp_path / "out"
        assert (out / "cert-chain.pem").read_bytes() == first.cert_chain
        assert (out / "key.pem").stat().st_mode & 0o777 == 0o600
        await clock.sleep(HOUR + 1)
        await cache.stop()
        # Rotations at 30 min and 60 min: the second certificate rotated while the first was still valid.
        assert [round(at) for at, name in timeline.pushes] == [1800, 3600]
        assert {name for _, name in timeline.pushes} == {"default"}, "same root: no ROOTCA push"
        assert signer.calls == [clock.epoch, clock.epoch + 1800, clock.epoch + 3600]
        latest = cache.current_workload()
        assert latest is not None and serial(latest) != serial(first)
        assert (out / "cert-chain.pem").read_bytes() == latest.cert_chain

    in_virtual_time(scenario)


def test_ca_down_at_40_back_at_70_minutes_with_a_1h_certificate(tmp_path: Path) -> None:
    """The issue's scenario, literally: the 30-minute rotation succeeds (the CA is still up), the next one
    (due at 60 min, with the CA down) is retried with backoff while the certificate in hand stays served,
    and a new certificate is pushed as soon as the CA is back."""
    rand = random.Random(7).random
    jitter = 0.01

    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        opts = options(tmp_path, secret_ttl=HOUR, grace_period_ratio_jitter=jitter, retry_max=10.0)
        cache = SecretCache(opts, signer, clock=clock, rand=rand)
        timeline = Timeline(clock, cache)
        clock.call_at(clock.now() + 40 * MINUTE, lambda: setattr(signer, "down", True))
        clock.call_at(clock.now() + 70 * MINUTE, lambda: setattr(signer, "down", False))
        timeline.sample_every(10.0, 80 * MINUTE)
        await cache.start()
        await clock.sleep(80 * MINUTE)
        await cache.stop()

        attempts = [at - clock.epoch for at in signer.calls]
        assert 30 * MINUTE - jitter * HOUR <= attempts[1] <= 30 * MINUTE + jitter * HOUR
        second_rotation = next(at for at in attempts if at > 40 * MINUTE)
        # The second certificate (issued at ~30 min) rotates half its lifetime later, ± jitter.
        assert 30 * MINUTE - jitter * HOUR <= second_rotation - attempts[1] <= 30 * MINUTE + jitter * HOUR
        failures = [at - clock.epoch for at in signer.failures]
        assert failures[0] == second_rotation
        assert_backoff(failures, maximum=10.0)
        back = timeline.first_push_after(70 * MINUTE)
        assert 70 * MINUTE <= back <= 70 * MINUTE + 10.0 * 1.1
        assert all(served is not None for _, served in timeline.served), "a valid certificate was always served"

    in_virtual_time(scenario)


def test_outage_past_expiry_serves_the_old_certificate_until_expiry_never_after(tmp_path: Path) -> None:
    """The CA is down from 25 to 70 min: the 30-minute rotation fails and is retried with backoff; the
    first certificate is served until its expiry at 60 min and not a moment later; the CA's return at
    70 min is followed at once by a new certificate, pushed."""
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        cache = SecretCache(options(tmp_path, secret_ttl=HOUR, retry_max=10.0), signer, clock=clock)
        timeline = Timeline(clock, cache)
        clock.call_at(clock.now() + 25 * MINUTE, lambda: setattr(signer, "down", True))
        clock.call_at(clock.now() + 70 * MINUTE, lambda: setattr(signer, "down", False))
        timeline.sample_every(10.0, 80 * MINUTE)
        await cache.start()
        first = await cache.get("default")
        assert first.expires == clock.epoch + HOUR
        await clock.sleep(HOUR - 1)
        assert serial(await cache.get("default")) == serial(first), "still valid one second before expiry"
        await clock.sleep(2)
        with pytest.raises(SecretError, match="CA is down"):
            await cache.get("default")
        assert cache.snapshot() == []
        await clock.sleep(20 * MINUTE)
        await cache.stop()

        failures = [at - clock.epoch for at in signer.failures]
        assert failures[0] == rotation_time(0, HOUR, 0.5, 0.0, 0.5, 0) == 30 * MINUTE
        assert_backoff([at for at in failures if at < HOUR], maximum=10.0)
        back = timeline.first_push_after(70 * MINUTE)
        assert 70 * MINUTE <= back <= 70 * MINUTE + 10.0 * 1.1
        for at, served in timeline.served:
            if at < HOUR:
                assert served == serial(first), f"at {at}s"
            elif at < back:
                assert served is None, f"an expired certificate was served at {at}s"
            else:
                assert served not in (None, serial(first)), f"at {at}s"

    in_virtual_time(scenario)


def assert_backoff(failures: list[float], maximum: float) -> None:
    """Gaps between failed attempts grow exponentially from ~0.1 s and settle at `maximum` (±10 % jitter)."""
    gaps = [b - a for a, b in itertools.pairwise(failures)]
    assert len(gaps) >= 10
    assert gaps[0] < 0.5
    assert all(later >= earlier * 0.8 for earlier, later in itertools.pairwise(gaps) if later < maximum * 0.9)
    assert all(gap <= maximum * 1.1 + 0.01 for gap in gaps)
    assert max(gaps) >= maximum * 0.9


def test_new_root_pushes_rootca(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        cache = SecretCache(options(tmp_path, secret_ttl=HOUR), signer, clock=clock)
        timeline = Timeline(clock, cache)
        await cache.start()
        old_root = (await cache.get("ROOTCA")).root_cert
        signer.new_root()
        await clock.sleep(HOUR / 2 + 1)
        await cache.stop()
        assert [name for _, name in timeline.pushes] == ["default", "ROOTCA"]
        assert (await cache.get("ROOTCA")).root_cert == signer.ca.cert_pem != old_root

    in_virtual_time(scenario)


def test_extra_roots_are_merged_into_rootca(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        other = certs.new_root_ca(keys.generate_key("ECDSA"), "other.domain", clock.now(), 3600)
        cache = SecretCache(options(tmp_path, output_certs="out"), signer, clock=clock)
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

    in_virtual_time(scenario)


def write_pair(directory: Path, ca: certs.CertificateAuthority, now: float) -> str:
    key = keys.generate_key("ECDSA")
    csr = certs.load_csr(certs.build_csr(key, [SPIFFE]))
    leaf = certs.sign_workload_csr(ca, csr, SPIFFE, now, 3600)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key.pem").write_bytes(keys.key_to_pem(key))
    (directory / "cert-chain.pem").write_text(certs.cert_to_pem(leaf))
    (directory / "root-cert.pem").write_bytes(ca.cert_pem)
    return certs.serial_hex(leaf)


def test_mounted_certs_are_served_without_the_ca(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        first_serial = write_pair(tmp_path / "etc/certs", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), signer, clock=clock)
        assert not cache.uses_ca
        await cache.start()
        try:
            assert serial(await cache.get("default")) == first_serial
            assert (await cache.get("ROOTCA")).root_cert == signer.ca.cert_pem
            assert signer.calls == []
            pushed: list[str] = []
            cache.on_update(pushed.append)
            new_serial = write_pair(tmp_path / "etc/certs", signer.ca, clock.now())
            await eventually(lambda: "default" in pushed)
            assert serial(await cache.get("default")) == new_serial
        finally:
            await cache.stop()

    in_virtual_time(scenario)


def kubernetes_volume(volume: Path, stamp: str, ca: certs.CertificateAuthority, now: float) -> str:
    """Lay out a secret volume as the kubelet does: files -> ..data/<file>, ..data -> ..<stamp>."""
    serial_hex = write_pair(volume / stamp, ca, now)
    tmp_link = volume / "..data_tmp"
    os.symlink(stamp, tmp_link)
    os.replace(tmp_link, volume / "..data")
    for name in ("key.pem", "cert-chain.pem", "root-cert.pem"):
        if not (volume / name).is_symlink():
            os.symlink(f"..data/{name}", volume / name)
    return serial_hex


def test_kubernetes_data_symlink_swap_is_caught(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        volume = tmp_path / "certs"
        first = kubernetes_volume(volume, "..2024_01", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        pushed: list[str] = []
        cache.on_update(pushed.append)
        await cache.start()
        name = f"file-cert:{volume}/cert-chain.pem~{volume}/key.pem"
        for subscribed in (name, "file-root:certs/root-cert.pem"):
            cache.retain(subscribed)  # as the SDS server does for a stream's names: watched while subscribed
        try:
            assert serial(await cache.get(name)) == first
            root = await cache.get("file-root:certs/root-cert.pem")
            assert root.is_root and root.root_cert == signer.ca.cert_pem
            second = kubernetes_volume(volume, "..2024_02", signer.ca, clock.now())
            await eventually(lambda: name in pushed)
            assert serial(await cache.get(name)) == second
            assert [s.resource_name for s in cache.snapshot()] == sorted([name, "file-root:certs/root-cert.pem"])
        finally:
            await cache.stop()

    in_virtual_time(scenario)


def test_file_secret_errors_name_the_problem(tmp_path: Path) -> None:
    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        write_pair(tmp_path / "a", signer.ca, clock.now())
        write_pair(tmp_path / "b", signer.ca, clock.now())
        cache = SecretCache(options(tmp_path), None, clock=clock)
        with pytest.raises(SecretError, match="does not match"):
            await cache.get("file-cert:a/cert-chain.pem~b/key.pem")
        with pytest.raises(SecretError, match="cannot read"):
            await cache.get("file-root:missing.pem")
        with pytest.raises(SecretError, match="no CA client"):
            await cache.get("default")
        system = await cache.get("file-root:system")
        assert system.is_root and len(pem_certificates(system.root_cert)) > 10

    in_virtual_time(scenario)
