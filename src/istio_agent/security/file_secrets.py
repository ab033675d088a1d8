"""Secrets read from disk: a trust bundle (`file-root:`, mounted `ROOTCA`) or a key + chain (`file-cert:`, `default`).

Each loader reads through `filereads.read_secret_file` (regular files only,
size-capped, the caller's own rights when there is a caller), validates what it
read, and returns the item together with the digest of every file it read: the
file watcher takes those as its baseline, so a watch starts only for a file that
loaded, and from exactly the content that was served. The loaders block (file
reads, PEM parsing); the cache runs them on a daemon thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from istio_agent.pki import certs, keys
from istio_agent.security.core.secrets import SecretError, SecretItem, pem_certificates
from istio_agent.security.filereads import FileReadError, FileRefused, read_secret_file
from istio_agent.security.peercred import PeerCredentials


class SecretRefused(SecretError):
    """The caller may not have this secret (it could not read the file itself)."""


@dataclass(frozen=True)
class LoadedSecret:
    """A secret read from files, and the digest of each file as read (for the watcher's baseline)."""

    item: SecretItem
    digests: dict[Path, str] = field(default_factory=dict)


def _read(name: str, what: str, path: Path, caller: PeerCredentials | None) -> tuple[bytes, str]:
    try:
        content = read_secret_file(path, caller)
    except FileRefused as exc:
        raise SecretRefused(f"{name}: refused {what} {exc}") from None
    except FileReadError as exc:
        raise SecretError(f"{name}: cannot read {what} {exc}") from None
    return content.data, content.digest


def load_root(name: str, path: Path, now: float, caller: PeerCredentials | None = None) -> LoadedSecret:
    """A trust bundle of every certificate in `path`; SecretError when it holds none."""
    data, digest = _read(name, "root certificate", path, caller)
    roots = pem_certificates(data)
    if not roots:
        raise SecretError(f"{name}: no valid certificate in {path}")
    bundle = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in roots)
    expires = min(certs.not_after(c) for c in roots)
    item = SecretItem(name, root_cert=bundle, created=now, expires=expires, source=f"file:{path}")
    return LoadedSecret(item, {path: digest})


def load_key_cert(name: str, cert_path: Path, key_path: Path, now: float,
                  caller: PeerCredentials | None = None) -> LoadedSecret:
    """A certificate chain and its private key; SecretError when unreadable or when they do not match."""
    chain_pem, chain_digest = _read(name, "certificate chain", cert_path, caller)
    key_pem, key_digest = _read(name, "private key", key_path, caller)
    try:
        leaf = certs.load_pem_chain(chain_pem)[0]
        key = keys.key_from_pem(key_pem)
    except (ValueError, TypeError, IndexError) as exc:
        raise SecretError(f"{name}: invalid certificate or key in {cert_path}, {key_path}: {exc}") from None
    if not certs.public_key_matches(leaf, key):
        raise SecretError(f"{name}: the key in {key_path} does not match the certificate in {cert_path}")
    item = SecretItem(name, cert_chain=chain_pem, private_key=key_pem, created=now, expires=certs.not_after(leaf),
                      source=f"file:{cert_path}")
    return LoadedSecret(item, {cert_path: chain_digest, key_path: key_digest})
