"""The API server's TLS certificate, kubeconfigs and service-account directories, from istiod-local's state.

The serving certificate is signed by istiod-local's root (the `ca.crt` every
client is given) and names what clients dial: the listen address,
`127.0.0.1`, `localhost` and the `kubernetes.default.svc...` names an
in-cluster client uses. It is kept in the state directory next to istiod's
own and re-issued when it does not cover the listen address, is near its
end, or was signed by another root.

Tokens for the API carry the API server's audience
(`https://kubernetes.default.svc.cluster.local`, what a cluster's projected
service-account tokens carry by default); tokens for the CA (`istio-ca`)
are not accepted here, as a real apiserver would not accept them either.

A service-account directory is written as the kubelet writes a projected
volume: the files live in a timestamped directory, `..data` points at it and
`token`, `ca.crt` and `namespace` point through `..data`, so a rotation is one
atomic rename and a watcher of the directory sees it.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from istio_agent.pki.certs import cert_to_pem, issue_server_cert, load_pem_chain, not_after, public_key_matches
from istio_agent.pki.keys import PrivateKey, generate_key, key_from_pem, key_to_pem
from istiod_local.controlplane.state import ControlPlaneState, write_file_atomic
from istiod_local.controlplane.tokens import DEFAULT_ISSUER, TokenIdentity, issue_token

KUBE_API_AUDIENCE = DEFAULT_ISSUER
SERVING_CERT = "kube-apiserver-cert.pem"
SERVING_KEY = "kube-apiserver-key.pem"
SERVING_TTL = 365 * 24 * 3600.0
RENEW_BEFORE = 30 * 24 * 3600.0
KUBE_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local")
KUBE_IPS = ("127.0.0.1",)
CLUSTER_NAME = "istiod-local"


def serving_names(host: str) -> tuple[list[str], list[str]]:
    """The DNS and IP SANs a certificate for `host` carries."""
    dns, ips = list(KUBE_DNS_NAMES), list(KUBE_IPS)
    try:
        ip = str(ipaddress.ip_address(host.strip("[]")))
        if ip not in ips:
            ips.append(ip)
    except ValueError:
        if host and host not in dns:
            dns.append(host)
    return dns, ips


def _covers(cert: x509.Certificate, dns: list[str], ips: list[str]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(san.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(dns) <= have_dns and set(ips) <= have_ips


def load_or_issue_serving_cert(state: ControlPlaneState, host: str, now: float) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for the API server listening on `host`; issued or re-issued as needed."""
    directory = state.directory
    key_path, cert_path = directory / SERVING_KEY, directory / SERVING_CERT
    dns, ips = serving_names(host)
    key: PrivateKey | None = None
    if key_path.exists():
        try:
            key = key_from_pem(key_path.read_bytes())
        except (ValueError, TypeError):
            key = None
    if key is not None and cert_path.exists():
        try:
            cert = load_pem_chain(cert_path.read_bytes())[0]
            cert.verify_directly_issued_by(state.ca.cert)
            usable = (public_key_matches(cert, key) and _covers(cert, dns, ips)
                      and not_after(cert) - now > RENEW_BEFORE)
        except Exception:
            usable = False
        if usable:
            return cert_path.read_bytes(), key_to_pem(key)
    if key is None:
        key = generate_key("ECDSA")
        write_file_atomic(key_path, key_to_pem(key), 0o600)
    cert = issue_server_cert(state.ca, key, dns, ips, now, SERVING_TTL)
    pem = cert_to_pem(cert).encode()
    write_file_atomic(cert_path, pem, 0o644)
    return pem, key_to_pem(key)


def parse_identity(text: str) -> TokenIdentity:
    """`namespace/serviceaccount` (or the full `system:serviceaccount:ns:sa`)."""
    value = text.removeprefix("system:serviceaccount:").replace(":", "/", 1)
    namespace, _, account = value.partition("/")
    if not namespace or not account or "/" in account:
        raise ValueError(f"identity must be namespace/serviceaccount, got {text!r}")
    return TokenIdentity(namespace, account)


def api_token(state: ControlPlaneState, identity: TokenIdentity, now: float, ttl_seconds: float) -> str:
    return issue_token(state.token_key, identity, now, ttl_seconds, (KUBE_API_AUDIENCE,))


def kubeconfig(server: str, root_pem: str, token: str, identity: TokenIdentity) -> dict[str, Any]:
    user = f"{identity.namespace}-{identity.service_account}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(root_pem.encode()).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
        "preferences": {},
    }


def write_kubeconfig(path: Path | str, document: dict[str, Any]) -> Path:
    """0600, as it holds a bearer token."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(out, yaml.safe_dump(document, sort_keys=False).encode(), 0o600)
    return out


def write_service_account_dir(directory: Path | str, token: str, root_pem: str, namespace: str,
                              now: float) -> Path:
    """`token`, `ca.crt`, `namespace` in the kubelet's atomic-writer layout (files 0644, directory 0755)."""
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    fresh = base / f"{stamp}{os.getpid()}"
    fresh.mkdir(mode=0o755)
    for name, content in (("token", token), ("ca.crt", root_pem), ("namespace", namespace)):
        target = fresh / name
        target.write_text(content)
        os.chmod(target, 0o644)
    os.chmod(fresh, 0o755)
    link = base / "..data"
    previous = os.readlink(link) if link.is_symlink() else None
    tmp = base / "..data_tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(fresh.name, tmp)
    os.replace(tmp, link)
    for name in ("token", "ca.crt", "namespace"):
        entry = base / name
        if not entry.is_symlink():
            if entry.exists():
                entry.unlink()
            os.symlink(f"..data/{name}", entry)
    if previous and previous != fresh.name:
        shutil.rmtree(base / previous, ignore_errors=True)
    return base
