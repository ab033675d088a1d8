"""Private keys for workloads and for istiod-local's CA."""

from __future__ import annotations

from typing import Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
KeyAlgorithm = Literal["RSA", "ECDSA"]

_CURVES: dict[str, type[ec.EllipticCurve]] = {"P256": ec.SECP256R1, "P384": ec.SECP384R1}


def generate_key(algorithm: KeyAlgorithm = "RSA", rsa_bits: int = 2048, curve: str = "P256") -> PrivateKey:
    """A new key: RSA of `rsa_bits`, or ECDSA on `curve` (P256 or P384, as ECC_CURVE names them)."""
    if algorithm == "ECDSA":
        curve_type = _CURVES.get(curve.upper())
        if curve_type is None:
            raise ValueError(f"unsupported ECC curve {curve!r}: expected one of {', '.join(_CURVES)}")
        return ec.generate_private_key(curve_type())
    if algorithm != "RSA":
        raise ValueError(f"unsupported key algorithm {algorithm!r}: expected RSA or ECDSA")
    if rsa_bits < 2048:
        raise ValueError(f"RSA key size {rsa_bits} is too small: at least 2048 bits")
    return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)


def key_to_pem(key: PrivateKey, pkcs8: bool = True) -> bytes:
    """PEM: PKCS#8, or with `pkcs8=False` PKCS#1 for RSA and SEC1 for EC (upstream's default for workload keys).

    Envoy and gRPC read all three.
    """
    form = serialization.PrivateFormat.PKCS8 if pkcs8 else serialization.PrivateFormat.TraditionalOpenSSL
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def key_from_pem(data: bytes) -> PrivateKey:
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError(f"unsupported private key type {type(key).__name__}")
    return key


def signing_hash(key: PrivateKey) -> object:
    """The digest istiod uses with this key type (SHA-256; SHA-384 for P-384)."""
    from cryptography.hazmat.primitives import hashes

    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size >= 384:
        return hashes.SHA384()
    return hashes.SHA256()
