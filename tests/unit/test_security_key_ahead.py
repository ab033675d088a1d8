"""The first workload key made ahead (`security/key_ahead.py`, `cli/first_key.py`): used once, only if it is the
kind the options ask for, and the cache's CSRs after the first make their own keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from fakes import FakeSigner
from test_security_cache import HOUR, in_virtual_time, options

from istio_agent.cli.first_key import first_key_spec, start_first_key
from istio_agent.clock import VirtualClock
from istio_agent.pki import certs, keys
from istio_agent.security.cache import SecretCache
from istio_agent.security.core.secrets import SecretItem
from istio_agent.security.key_ahead import KeyAhead, KeySpec

SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_der(item: SecretItem) -> bytes:
    return certs.load_pem_chain(item.cert_chain)[0].public_key().public_bytes(*SPKI)


def key_der(key: keys.PrivateKey) -> bytes:
    return key.public_key().public_bytes(*SPKI)


def made(spec: KeySpec) -> tuple[KeyAhead, bytes]:
    """A key made ahead (the thread's body run on the test's thread) and its public key."""
    generated: list[keys.PrivateKey] = []

    def generate(wanted: KeySpec) -> keys.PrivateKey:
        generated.append(wanted.generate())
        return generated[-1]

    ahead = KeyAhead(spec, generate)
    ahead.run()
    return ahead, key_der(generated[0])


def test_the_key_is_handed_out_once() -> None:
    ahead, _ = made(KeySpec.ecdsa("p256"))
    key = ahead.take(KeySpec.ecdsa("P256"))
    assert isinstance(key, keys.ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert ahead.claimed
    assert ahead.take(KeySpec.ecdsa("P256")) is None


def test_a_key_of_another_kind_is_discarded_not_kept_for_later() -> None:
    ahead, _ = made(KeySpec.ecdsa("P256"))
    assert ahead.take(KeySpec.ecdsa("P384")) is None
    assert ahead.take(KeySpec.ecdsa("P256")) is None, "the first take claims it, even on a mismatch"


def test_a_failed_generation_leaves_no_key() -> None:
    def broken(spec: KeySpec) -> keys.PrivateKey:
        raise ValueError("no entropy today")

    ahead = KeyAhead(KeySpec.rsa(2048), broken)
    ahead.run()
    assert ahead.take(KeySpec.rsa(2048)) is None


def test_the_spec_of_the_options_matches_what_the_environment_guessed(tmp_path: Path) -> None:
    assert KeySpec.of(options(tmp_path, key_algorithm="ECDSA", ecc_curve="P384")) == KeySpec.ecdsa("P384")
    assert KeySpec.of(options(tmp_path, key_algorithm="RSA", rsa_key_size=3072)) == KeySpec.rsa(3072)
    # RSA ignores the curve and ECDSA the size, as the key maker does.
    assert KeySpec.of(options(tmp_path, key_algorithm="RSA", ecc_curve="P384")) == KeySpec.rsa(2048)
    assert first_key_spec({}, tmp_path) == KeySpec.rsa(2048)
    assert first_key_spec({"ECC_SIGNATURE_ALGORITHM": " ecdsa "}, tmp_path) == KeySpec.ecdsa("P256")
    assert first_key_spec({"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "p384"}, tmp_path) == KeySpec.ecdsa("P384")
    assert first_key_spec({"WORKLOAD_RSA_KEY_SIZE": "4096"}, tmp_path) == KeySpec.rsa(4096)


def test_no_key_is_made_when_there_will_be_no_csr_or_the_settings_are_invalid(tmp_path: Path) -> None:
    assert first_key_spec({"FILE_MOUNTED_CERTS": "true"}, tmp_path) is None
    for bad in ({"ECC_SIGNATURE_ALGORITHM": "ED25519"}, {"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "P521"},
                {"WORKLOAD_RSA_KEY_SIZE": "1024"}, {"WORKLOAD_RSA_KEY_SIZE": "lots"}):
        assert first_key_spec(bad, tmp_path) is None, bad
    (tmp_path / "etc/certs").mkdir(parents=True)
    (tmp_path / "etc/certs/key.pem").write_text("mounted")
    assert first_key_spec({}, tmp_path) is None


def test_the_first_csr_uses_the_key_made_ahead_and_rotation_makes_new_ones(tmp_path: Path) -> None:
    ahead, expected = made(KeySpec.ecdsa("P256"))

    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        cache = SecretCache(options(tmp_path, secret_ttl=HOUR), signer, clock=clock, first_key=ahead)
        await cache.start()
        first = await cache.get("default")
        assert public_der(first) == expected
        assert key_der(keys.key_from_pem(first.private_key)) == expected
        await clock.sleep(HOUR + 1)
        rotated = cache.current_workload()
        await cache.stop()
        assert len(signer.calls) == 3
        assert rotated is not None and public_der(rotated) != expected

    in_virtual_time(scenario)


def test_a_key_made_ahead_for_other_options_is_not_used(tmp_path: Path) -> None:
    ahead, unwanted = made(KeySpec.ecdsa("P384"))

    async def scenario(clock: VirtualClock) -> None:
        cache = SecretCache(options(tmp_path), FakeSigner(clock.now), clock=clock, first_key=ahead)
        item = await cache.get("default")
        await cache.stop()
        assert public_der(item) != unwanted
        assert isinstance(keys.key_from_pem(item.private_key), keys.ec.EllipticCurvePrivateKey)

    in_virtual_time(scenario)
    assert ahead.claimed


def test_a_retry_after_a_failed_first_request_makes_a_new_key(tmp_path: Path) -> None:
    ahead, first_key = made(KeySpec.ecdsa("P256"))

    async def scenario(clock: VirtualClock) -> None:
        signer = FakeSigner(clock.now)
        signer.down = True
        cache = SecretCache(options(tmp_path), signer, clock=clock, first_key=ahead)
        await cache.start()
        await clock.sleep(0.05)
        assert signer.failures
        signer.down = False
        item = await asyncio.wait_for(cache.wait_for_workload(), 60)
        await cache.stop()
        assert public_der(item) != first_key, "the key of a CSR that failed is not reused"

    in_virtual_time(scenario)


def test_the_cli_starts_the_key_it_guessed(tmp_path: Path) -> None:
    ahead = start_first_key({"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "P384"}, tmp_path)
    assert ahead is not None
    key = ahead.take(KeySpec.ecdsa("P384"))  # waits for the thread
    assert isinstance(key, keys.ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert start_first_key({"FILE_MOUNTED_CERTS": "true"}, tmp_path) is None
