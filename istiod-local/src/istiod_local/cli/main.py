"""`istiod-local`: the single-node control plane's command line (serve, pod-files, token, kubeconfig)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import sys
import time
from pathlib import Path

import click

from istio_agent.config.durations import parse_duration
from istio_agent.config.gobool import parse_bool
from istio_agent.netaddr import AddressError, split_host_port
from istiod_local.cli.up import up
from istiod_local.controlplane.assembly import ServeOptions, run_serve
from istiod_local.controlplane.monitoring import DEFAULT_MONITORING_ADDR
from istiod_local.controlplane.podfiles import pod_token, write_pod_files
from istiod_local.controlplane.server import (
    DEFAULT_GRPC_ADDR,
    DEFAULT_SECURE_GRPC_ADDR,
    DEFAULT_TRUST_DOMAIN,
    ControlPlaneOptions,
)
from istiod_local.controlplane.state import ControlPlaneState, StateError, load_or_create_state
from istiod_local.controlplane.xds.autoregistration import DEFAULT_GRACE_PERIOD, WorkloadEntryOptions

log = logging.getLogger("istiod_local.controlplane")


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds <= 0:
        raise click.BadParameter(f"must be positive, got {value!r}")
    return seconds


def _grace_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds < 0:
        raise click.BadParameter(f"must not be negative, got {value!r}")
    return seconds


def _workload_entry_options(grace: float | None) -> WorkloadEntryOptions:
    """istiod's variables for WorkloadEntries, read as it reads them (Go durations and booleans)."""
    def env_bool(name: str) -> bool:
        text = os.environ.get(name, "")
        try:
            return parse_bool(text) if text else True
        except ValueError as exc:
            raise click.UsageError(f"{name}: {exc}") from None

    if grace is None:
        text = os.environ.get("PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", "")
        try:
            grace = parse_duration(text) if text else DEFAULT_GRACE_PERIOD
        except ValueError as exc:
            raise click.UsageError(f"PILOT_WORKLOAD_ENTRY_GRACE_PERIOD: {exc}") from None
        if grace < 0:
            raise click.UsageError(f"PILOT_WORKLOAD_ENTRY_GRACE_PERIOD: must not be negative, got {text!r}")
    return WorkloadEntryOptions(grace, env_bool("PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION"),
                                env_bool("PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS"),
                                env_bool("ISTIO_WORKLOAD_ENTRY_VALIDATE_IDENTITY"))


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _open_state(state_dir: str, trust_domain: str) -> ControlPlaneState:
    try:
        return load_or_create_state(state_dir, trust_domain, time.time())
    except StateError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def main() -> None:
    """A local stand-in for istiod: a CA (IstioCertificateService) and a service-account token issuer."""


state_dir_option = click.option(
    "--state-dir", required=True, type=click.Path(file_okay=False),
    help="Directory holding the root CA, serving certificate and token-signing key (created on first use).",
)
trust_domain_option = click.option("--trust-domain", default=DEFAULT_TRUST_DOMAIN, show_default=True,
                                   help="SPIFFE trust domain of issued identities.")


@main.command()
@state_dir_option
@click.option("--grpc-addr", default=DEFAULT_GRPC_ADDR, show_default=True,
              help="Plaintext gRPC address (empty to disable; port 0 picks one).")
@click.option("--secure-grpc-addr", default=DEFAULT_SECURE_GRPC_ADDR, show_default=True,
              help="TLS gRPC address (empty to disable; port 0 picks one).")
@click.option("--max-cert-ttl", default="24h", show_default=True, callback=_duration,
              help="Longest workload certificate lifetime; longer requests are capped.")
@trust_domain_option
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
@click.option("--registry", default=None, type=click.Path(dir_okay=False),
              help="Mesh registry YAML (services, workloads, peerAuthentication, serviceEntries): serve ADS from it "
                   "on the same ports, reloading it when it changes.")
@click.option("--kube-api-addr", default="127.0.0.1:6443", show_default=True,
              help="HTTPS address of the Kubernetes API (pods and namespaces from the registry); 'off' disables it, "
                   "port 0 picks one.")
@click.option("--kube-node-name", default=None,
              help="spec.nodeName of pods whose workload names no nodeName (default: this host's name).")
@click.option("--kube-bookmark-interval", default="60s", show_default=True, callback=_duration,
              help="How often a watch asking for bookmarks gets one.")
@click.option("--kube-watch-history", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Changes kept for watches to resume from; an older resourceVersion is 410 Expired.")
@click.option("--monitoring-addr", default=DEFAULT_MONITORING_ADDR, show_default=True,
              help="HTTP address of istiod's monitoring port: /metrics, /debug/connections, /debug/syncz; 'off' "
                   "disables it, port 0 picks one.")
@click.option("--workload-entry-grace-period", default=None, callback=_grace_duration,
              help="How long an auto-registered WorkloadEntry outlives its proxy's last stream "
                   "[default: $PILOT_WORKLOAD_ENTRY_GRACE_PERIOD, else 10s].")
def serve(state_dir: str, grpc_addr: str, secure_grpc_addr: str, max_cert_ttl: float, trust_domain: str,
          log_level: str, registry: str | None, kube_api_addr: str, kube_node_name: str | None,
          kube_bookmark_interval: float, kube_watch_history: int, monitoring_addr: str,
          workload_entry_grace_period: float | None) -> None:
    """Serve the CA (and, with --registry, xDS), and the Kubernetes API, until SIGTERM or SIGINT.

    The flags resolve to `ServeOptions`; what runs is `controlplane/assembly.py`'s."""
    _setup_logging(log_level)
    if monitoring_addr != "off":
        try:
            split_host_port(monitoring_addr)
        except AddressError as exc:
            raise click.BadParameter(str(exc), param_hint="--monitoring-addr") from None
    options = ControlPlaneOptions(state_dir, grpc_addr, secure_grpc_addr, max_cert_ttl, trust_domain)
    kube = None
    if kube_api_addr != "off":
        try:
            split_host_port(kube_api_addr)
        except AddressError as exc:
            raise click.BadParameter(str(exc), param_hint="--kube-api-addr") from None
        from istiod_local.controlplane.kubeapi.server import KubeApiOptions

        kube = KubeApiOptions(kube_api_addr, kube_node_name or socket.gethostname().split(".")[0].lower(),
                              host_ip=_node_ip(kube_api_addr), bookmark_interval=kube_bookmark_interval,
                              history=kube_watch_history)
    entries = _workload_entry_options(workload_entry_grace_period)
    try:
        asyncio.run(run_serve(ServeOptions(options, registry, kube, entries,
                                       "" if monitoring_addr == "off" else monitoring_addr)))
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _node_ip(kube_api_addr: str) -> str:
    """Pods' status.hostIP: the API's listen address when it is one IP (the node's), else 127.0.0.1."""
    host, _ = split_host_port(kube_api_addr)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "127.0.0.1"
    return "127.0.0.1" if ip.is_unspecified else str(ip)


@main.command("pod-files")
@state_dir_option
@click.option("--namespace", required=True, help="The pod's namespace.")
@click.option("--service-account", required=True, help="The pod's service account.")
@click.option("--pod", default="", help="Pod name, bound into the token like a projected token's pod claim.")
@click.option("--token-ttl", default="1h", show_default=True, callback=_duration, help="Token lifetime.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Pod root: files go under OUT/var/run/secrets/.")
@trust_domain_option
def pod_files(state_dir: str, namespace: str, service_account: str, pod: str, token_ttl: float, out: str,
              trust_domain: str) -> None:
    """Write the root certificate and service-account token Kubernetes would mount into a pod."""
    state = _open_state(state_dir, trust_domain)
    files = write_pod_files(state, out, namespace, service_account, pod, token_ttl, time.time())
    click.echo(f"wrote {files.root_cert}")
    click.echo(f"wrote {files.token}")


@main.command()
@state_dir_option
@click.option("--namespace", required=True)
@click.option("--service-account", required=True)
@click.option("--pod", default="")
@click.option("--token-ttl", default="1h", show_default=True, callback=_duration)
@trust_domain_option
def token(state_dir: str, namespace: str, service_account: str, pod: str, token_ttl: float, trust_domain: str) -> None:
    """Print a service-account token istiod-local accepts."""
    state = _open_state(state_dir, trust_domain)
    click.echo(pod_token(state, namespace, service_account, pod, token_ttl, time.time()))


@main.command()
@state_dir_option
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The kubeconfig to write (0600).")
@click.option("--server", default="https://127.0.0.1:6443", show_default=True,
              help="The API server URL the kubeconfig names.")
@click.option("--identity", default="kube-system/istiod-local-admin", show_default=True,
              help="namespace/serviceaccount the token speaks for (istio-system/istio-cni for the CNI).")
@click.option("--token-ttl", default="24h", show_default=True, callback=_duration, help="Token lifetime.")
@click.option("--service-account-dir", default=None, type=click.Path(file_okay=False),
              help="Also write token, ca.crt and namespace here, as Kubernetes mounts a service account.")
@trust_domain_option
def kubeconfig(state_dir: str, out: str, server: str, identity: str, token_ttl: float,
               service_account_dir: str | None, trust_domain: str) -> None:
    """Write a kubeconfig (and optionally a service-account directory) for istiod-local's Kubernetes API."""
    from istiod_local.controlplane.kubeapi.credentials import (
        api_token,
        parse_identity,
        write_kubeconfig,
        write_service_account_dir,
    )
    from istiod_local.controlplane.kubeapi.credentials import (
        kubeconfig as kubeconfig_document,
    )

    if not server.startswith("https://"):
        raise click.BadParameter(f"must be an https:// URL, got {server!r}", param_hint="--server")
    try:
        who = parse_identity(identity)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--identity") from None
    state = _open_state(state_dir, trust_domain)
    now = time.time()
    token_text = api_token(state, who, now, token_ttl)
    path = write_kubeconfig(out, kubeconfig_document(server, state.root_cert_pem, token_text, who))
    click.echo(f"wrote {path}")
    if service_account_dir is not None:
        directory = write_service_account_dir(Path(service_account_dir), token_text, state.root_cert_pem,
                                              who.namespace, now)
        click.echo(f"wrote {directory}")


@main.group("workload-entry")
def workload_entry() -> None:
    """VMs and other machines outside Kubernetes (the role of `istioctl x workload entry`)."""


def _go_bool(ctx: click.Context, param: click.Parameter, value: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise click.BadParameter(f"not a boolean: {value!r}") from None


@workload_entry.command("configure")
@state_dir_option
@click.option("--name", default="", help="The WorkloadGroup's name.")
@click.option("-n", "--namespace", default="", help="The namespace the workload instances belong to.")
@click.option("-f", "--file", "filename", default=None, type=click.Path(dir_okay=False, exists=True),
              help="A WorkloadGroup object (YAML), when the registry defines no such group.")
@click.option("--registry", default=None, type=click.Path(dir_okay=False, exists=True),
              help="istiod-local's registry: the group is taken from it when it defines one.")
@click.option("-o", "--output", "--out", "output", required=True, type=click.Path(file_okay=False),
              help="Output directory for the generated files.")
@click.option("--autoregister", is_flag=True, help="Create a WorkloadEntry when the VM's proxy connects.")
@click.option("--capture-dns", default="true", is_flag=False, flag_value="true", callback=_go_bool,
              help="Capture the VM's outgoing DNS (port 53) for the agent  [default: true].")
@click.option("--clusterID", "cluster_id", default="Kubernetes", show_default=True,
              help="The ID of the cluster (ISTIO_META_CLUSTER_ID).")
@click.option("--externalIP", "external_ip", default="", help="External IP address of the workload.")
@click.option("--internalIP", "internal_ip", default="", help="Internal IP address of the workload.")
@click.option("--ingressIP", "ingress_ip", default="",
              help="The address `hosts` maps istiod's name to (default: the host of --discovery-address).")
@click.option("--ingressService", "ingress_service", default="istio-eastwestgateway", show_default=True,
              help="Accepted for istioctl's sake; istiod-local has no ingress gateway to look up.")
@click.option("--tokenDuration", "token_duration", default=3600, show_default=True, type=click.IntRange(min=1),
              help="The token's lifetime in seconds.")
@click.option("-r", "--revision", default="", help="Control plane revision (istiod-<revision> names).")
@click.option("--istio-namespace", "istio_namespace", default="istio-system", show_default=True,
              help="istiod's namespace (its name in mesh.yaml and hosts).")
@click.option("--discovery-address", default=DEFAULT_SECURE_GRPC_ADDR, show_default=True,
              help="host:port where the VM reaches istiod-local's TLS port: its port goes into mesh.yaml's "
                   "discoveryAddress, its host (an IP) into hosts.")
@trust_domain_option
def workload_entry_configure(state_dir: str, name: str, namespace: str, filename: str | None, registry: str | None,
                             output: str, autoregister: bool, capture_dns: bool, cluster_id: str, external_ip: str,
                             internal_ip: str, ingress_ip: str, ingress_service: str, token_duration: int,
                             revision: str, istio_namespace: str, discovery_address: str, trust_domain: str) -> None:
    """Write cluster.env, mesh.yaml, root-cert.pem, istio-token and hosts for a WorkloadGroup's VMs."""
    from istiod_local.controlplane.onboarding import FILE_MODE, OnboardingOptions, istiod_host, render_onboarding
    from istiod_local.controlplane.tokens import TokenIdentity, issue_token
    from istiod_local.controlplane.xds.registry import decode_registry, parse_registry
    from istiod_local.controlplane.xds.workloadgroups import parse_workload_group_object
    from istiod_local.controlplane.xds.yamlfields import RegistryError

    del ingress_service
    if not filename and not (name and namespace):
        raise click.UsageError("expecting a WorkloadGroup artifact file or the name and namespace of an existing "
                               "WorkloadGroup")
    if internal_ip and external_ip:
        raise click.UsageError("the flags --internalIP and --externalIP are mutually exclusive")
    try:
        host, port_text = split_host_port(discovery_address)
        port = int(port_text)
    except (AddressError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--discovery-address") from None
    group = None
    object_annotations: dict[str, str] = {}
    try:
        if registry is not None:
            parsed = parse_registry(decode_registry(Path(registry).read_bytes(), registry), registry)
            trust_domain = parsed.trust_domain
            group = parsed.workload_group(namespace or "default", name) if name else None
        if group is None and filename:
            group, object_annotations = parse_workload_group_object(Path(filename).read_text(), filename, namespace)
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    if group is None:
        raise click.ClickException(f"workloadgroup {name} not found in namespace {namespace}"
                                   + (f" of {registry}" if registry else ""))
    try:
        ingress_ip = str(ipaddress.ip_address(ingress_ip or host))
    except ValueError:  # as upstream when neither the flag nor the gateway gives an address: no hosts line
        ingress_ip = ""
        click.echo(f"Warning: could not tell the address of {istiod_host(istio_namespace, revision)}; use "
                   "--ingressIP to give the address the VM reaches istiod at (hosts is left empty)", err=True)
    state = _open_state(state_dir, trust_domain)
    now = time.time()
    token_text = issue_token(state.token_key, TokenIdentity(group.namespace, group.template.service_account), now,
                             token_duration)
    options = OnboardingOptions(istio_namespace, revision, cluster_id, trust_domain, port, ingress_ip, internal_ip,
                                external_ip, autoregister, capture_dns, object_annotations=object_annotations)
    try:
        files = render_onboarding(group, options, state.root_cert_pem, token_text)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    out = Path(output)
    out.mkdir(mode=FILE_MODE, parents=True, exist_ok=True)
    for file_name, data in files.items():
        path = out / file_name
        path.write_bytes(data)
        path.chmod(FILE_MODE)
    click.echo(f"Warning: a security token for namespace {group.namespace!r} and service account "
               f"{group.template.service_account!r} has been generated and stored at {str(out / 'istio-token')!r}",
               err=True)
    click.echo(f"Configuration generation into directory {output} was successful")


main.add_command(up)
