"""Secret values and resource names, shared by the cache and the SDS server.

Resource names follow upstream: `default` is the workload key and chain,
`ROOTCA` its trust bundle, and `file-cert:<cert>~<key>` / `file-root:<ca>` /
`file-root:system` name certificates on disk (used by DestinationRules and
Gateways).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

WORKLOAD_RESOURCE = "default"
ROOT_RESOURCE = "ROOTCA"
FILE_CERT_PREFIX = "file-cert:"
FILE_ROOT_PREFIX = "file-root:"
FILE_ROOT_SYSTEM = "file-root:system"
RESOURCE_SEPARATOR = "~"

# Where distributions keep the OS trust bundle (first existing one wins).
SYSTEM_BUNDLE_PATHS = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
)


class SecretError(Exception):
    """A secret could not be produced; the message says which and why."""


@dataclass(frozen=True)
class SecretItem:
    """One secret as served: either a key + chain, or a trust bundle (`root_cert` only)."""

    resource_name: str
    cert_chain: bytes = b""
    private_key: bytes = b""
    root_cert: bytes = b""
    created: float = 0.0
    expires: float = 0.0
    source: str = "ca"

    @property
    def is_root(self) -> bool:
        return not self.cert_chain


@dataclass(frozen=True)
class FileResource:
    """A `file-cert:` or `file-root:` resource name, parsed."""

    cert: str = ""
    key: str = ""
    ca: str = ""

    @property
    def is_root(self) -> bool:
        return bool(self.ca)


def parse_file_resource(name: str) -> FileResource | None:
    """Parse `file-cert:<cert>~<key>` or `file-root:<ca>`; None for any other (or malformed) name."""
    if name.startswith(FILE_CERT_PREFIX):
        parts = name[len(FILE_CERT_PREFIX):].split(RESOURCE_SEPARATOR)
        if len(parts) != 2 or not all(parts):
            return None
        return FileResource(cert=parts[0], key=parts[1])
    if name.startswith(FILE_ROOT_PREFIX):
        parts = name[len(FILE_ROOT_PREFIX):].split(RESOURCE_SEPARATOR)
        if len(parts) != 1 or not parts[0]:
            return None
        return FileResource(ca=parts[0])
    return None


def system_bundle_path() -> Path | None:
    for candidate in SYSTEM_BUNDLE_PATHS:
        path = Path(candidate)
        if path.is_file():
            return path
    return None


def pem_certificates(data: bytes) -> list[x509.Certificate]:
    """Every parseable certificate in a PEM bundle; malformed blocks are skipped (as upstream tolerates)."""
    out: list[x509.Certificate] = []
    marker = b"-----BEGIN CERTIFICATE-----"
    for chunk in data.split(marker)[1:]:
        block = marker + chunk
        end = block.find(b"-----END CERTIFICATE-----")
        if end < 0:
            continue
        try:
            with warnings.catch_warnings():
                # OS bundles hold a few legacy roots with non-positive serials; they are still roots.
                warnings.simplefilter("ignore")
                out.append(x509.load_pem_x509_certificate(block[: end + len(b"-----END CERTIFICATE-----")] + b"\n"))
        except ValueError:
            continue
    return out


def merge_roots(primary: bytes, extra: list[bytes]) -> bytes:
    """`primary` followed by every certificate of `extra` it does not already hold (by DER)."""
    seen = {cert.public_bytes(serialization.Encoding.DER) for cert in pem_certificates(primary)}
    out = primary if not primary or primary.endswith(b"\n") else primary + b"\n"
    for bundle in extra:
        for cert in pem_certificates(bundle):
            der = cert.public_bytes(serialization.Encoding.DER)
            if der in seen:
                continue
            seen.add(der)
            out += cert.public_bytes(serialization.Encoding.PEM)
    return out
