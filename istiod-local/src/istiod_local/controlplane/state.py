"""istiod-local's persistent state: its root CA, its serving certificate and its token-signing key.

The first start creates them in the state directory; every later start (and
`pod-files`) reuses them, so certificates and tokens handed out before a
restart keep verifying after it. Private keys are written 0600 and every file
is replaced atomically, so a crash mid-write never leaves half a key behind.
A lock file serialises creation, because `serve` and `pod-files` may well be
started at the same moment against a fresh directory.

The keys are ECDSA P-256: signing with them costs a fraction of what RSA
costs, which is what makes the CA fast enough to sign hundreds of CSRs a
second on one core; every TLS stack the mesh uses accepts an ECDSA root over
RSA leaves.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from istio_agent.pki.certs import (
    CertificateAuthority,
    cert_to_pem,
    issue_server_cert,
    load_pem_chain,
    new_root_ca,
    not_after,
    public_key_matches,
)
from istio_agent.pki.keys import PrivateKey, generate_key, key_from_pem, key_to_pem

ROOT_KEY = "root-key.pem"
ROOT_CERT = "root-cert.pem"
SERVING_KEY = "istiod-key.pem"
SERVING_CERT = "istiod-cert.pem"
TOKEN_KEY = "token-signing-key.pem"
LOCK = ".lock"

# The names istiod's own serving certificate answers to, as agents dial it. `serve` adds the address it
# listens on (`serving_ips`): an agent given `CA_ADDR` as an address verifies that address, not ISTIOD_SAN
# (upstream's pilot-agent applies ISTIOD_SAN only when CA_ADDR is unset), so the local node's gateway
# address (10.244.0.1) must be on the certificate for upstream's Go agent to get one.
SERVING_DNS_NAMES = ("istiod.istio-system.svc", "localhost")
SERVING_IPS = ("127.0.0.1",)

ROOT_TTL = 10 * 365 * 24 * 3600.0  # istiod's self-signed root lives ten years
SERVING_TTL = 365 * 24 * 3600.0
# A serving certificate closer than this to its expiry is re-issued at start (same root, so clients do not notice).
SERVING_RENEW_BEFORE = 30 * 24 * 3600.0


class StateError(RuntimeError):
    """The state directory cannot be used as it is; the message names the file and the problem."""


@dataclass(frozen=True)
class ControlPlaneState:
    """Everything istiod-local signs with, loaded once at start."""

    directory: Path
    ca: CertificateAuthority
    serving_key: PrivateKey
    serving_cert: x509.Certificate
    token_key: PrivateKey

    @property
    def root_cert_pem(self) -> str:
        return cert_to_pem(self.ca.cert)

    @property
    def serving_key_pem(self) -> bytes:
        return key_to_pem(self.serving_key)

    @property
    def serving_cert_pem(self) -> bytes:
        return cert_to_pem(self.serving_cert).encode()


def write_file_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write via a temporary file in the same directory and rename, so readers see all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed or (for 0644 files) kept bits we want
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with open(directory / LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_key(path: Path) -> PrivateKey:
    try:
        return key_from_pem(path.read_bytes())
    except (ValueError, TypeError) as exc:
        raise StateError(f"{path}: not a usable private key: {exc}") from None


def _read_cert(path: Path) -> x509.Certificate:
    try:
        return load_pem_chain(path.read_bytes())[0]
    except (ValueError, IndexError) as exc:
        raise StateError(f"{path}: not a usable certificate: {exc}") from None


def _load_or_create_root(directory: Path, trust_domain: str, now: float) -> CertificateAuthority:
    key_path, cert_path = directory / ROOT_KEY, directory / ROOT_CERT
    if key_path.exists() != cert_path.exists():
        present, missing = (key_path, cert_path) if key_path.exists() else (cert_path, key_path)
        raise StateError(f"{present} exists but {missing} does not; restore it or empty {directory} to start over")
    if key_path.exists():
        key, cert = _read_key(key_path), _read_cert(cert_path)
        if not public_key_matches(cert, key):
            raise StateError(f"{cert_path} does not belong to the key in {key_path}")
        if not_after(cert) <= now:
            raise StateError(f"root certificate {cert_path} expired; empty {directory} to create a new root")
        return CertificateAuthority(key, cert)
    key = generate_key("ECDSA")
    ca = new_root_ca(key, trust_domain, now, ROOT_TTL)
    write_file_atomic(key_path, key_to_pem(key), 0o600)
    write_file_atomic(cert_path, ca.cert_pem, 0o644)
    return ca


def _cert_ips(cert: x509.Certificate) -> set[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def _serving_cert_usable(ca: CertificateAuthority, key: PrivateKey, cert: x509.Certificate, now: float,
                         ips: tuple[str, ...]) -> bool:
    if not public_key_matches(cert, key) or cert.issuer != ca.cert.subject:
        return False
    if not set(ips) <= _cert_ips(cert):
        return False
    try:
        cert.verify_directly_issued_by(ca.cert)
    except Exception:
        return False
    return not_after(cert) - now > SERVING_RENEW_BEFORE


def _load_or_create_serving(directory: Path, ca: CertificateAuthority, now: float,
                            extra_ips: tuple[str, ...]) -> tuple[PrivateKey, x509.Certificate]:
    key_path, cert_path = directory / SERVING_KEY, directory / SERVING_CERT
    ips = tuple(dict.fromkeys((*SERVING_IPS, *extra_ips)))
    if key_path.exists() and cert_path.exists():
        key, cert = _read_key(key_path), _read_cert(cert_path)
        if _serving_cert_usable(ca, key, cert, now, ips):
            return key, cert
        ips = tuple(dict.fromkeys((*ips, *sorted(_cert_ips(cert)))))  # keep the addresses it named
    else:
        key = generate_key("ECDSA")
        write_file_atomic(key_path, key_to_pem(key), 0o600)
    cert = issue_server_cert(ca, key, SERVING_DNS_NAMES, ips, now, SERVING_TTL)
    write_file_atomic(cert_path, cert_to_pem(cert).encode(), 0o644)
    return key, cert


def _load_or_create_token_key(directory: Path) -> PrivateKey:
    path = directory / TOKEN_KEY
    if path.exists():
        return _read_key(path)
    key = generate_key("ECDSA")
    write_file_atomic(path, key_to_pem(key), 0o600)
    return key


def load_or_create_state(directory: Path | str, trust_domain: str, now: float,
                         serving_ips: tuple[str, ...] = ()) -> ControlPlaneState:
    """Open the state directory, creating whatever is missing; StateError when what is there is unusable.

    `serving_ips`: addresses the serving certificate must name besides SERVING_IPS (where `serve` listens);
    one that lacks any is re-issued with them (same key and root, the addresses it had kept)."""
    path = Path(directory)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot create state directory {path}: {exc}") from None
    if not path.is_dir():
        raise StateError(f"state directory {path} is not a directory")
    with _locked(path):
        ca = _load_or_create_root(path, trust_domain, now)
        serving_key, serving_cert = _load_or_create_serving(path, ca, now, serving_ips)
        token_key = _load_or_create_token_key(path)
    return ControlPlaneState(path, ca, serving_key, serving_cert, token_key)
