"""`istiod-local`: the single-node control plane's command line (serve, pod-files, token, kubeconfig, workload-entry).

Every command's flags are declared in the program's table (`flags.py`) and
built into click options here, with what only click checks (paths, ranges).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click

from istio_agent.config import clickflags
from istio_agent.config.settings import EnvVar
from istio_agent.netaddr import AddressError, split_host_port
from istiod_local.cli import flags
from istiod_local.cli.flags import AUTOREGISTRATION, GRACE_PERIOD, HEALTHCHECKS, VALIDATE_IDENTITY
from istiod_local.cli.up import up
from istiod_local.controlplane.assembly import ServeOptions, run_serve
from istiod_local.controlplane.podfiles import pod_token, write_pod_files
from istiod_local.controlplane.server import ControlPlaneOptions
from istiod_local.controlplane.state import ControlPlaneState, StateError, load_or_create_state
from istiod_local.controlplane.xds.autoregistration import WorkloadEntryOptions

log = logging.getLogger("istiod_local.controlplane")


def _workload_entry_options(grace: float | None) -> WorkloadEntryOptions:
    """istiod's variables for WorkloadEntries, read as it reads them (Go durations and booleans)."""
    def env_value(var: EnvVar[Any]) -> Any:
        text = os.environ.get(var.name, "")
        try:
            return var.parse(text) if text else var.default
        except ValueError as exc:
            raise click.UsageError(f"{var.name}: {exc}") from None

    if grace is None:
        grace = env_value(GRACE_PERIOD)
    return WorkloadEntryOptions(grace, env_value(AUTOREGISTRATION), env_value(HEALTHCHECKS),
                                env_value(VALIDATE_IDENTITY))


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


@click.group(help=flags.ISTIOD_LOCAL.commands[0].summary)
def main() -> None:
    pass


_SERVE_EXTRA: dict[str, dict[str, Any]] = {
    "state-dir": {"type": click.Path(file_okay=False)},
    "log-level": {"case_sensitive": False},
    "registry": {"type": click.Path(dir_okay=False)},
    "kube-watch-history": {"type": click.IntRange(min=1)},
}


@main.command(help=f"{flags.SERVE.summary}\n\nThe flags resolve to `ServeOptions`; what runs is "
                   "`controlplane/assembly.py`'s.")
@clickflags.options(flags.SERVE.flags, _SERVE_EXTRA, show_default=True)
def serve(state_dir: str, grpc_addr: str, secure_grpc_addr: str, max_cert_ttl: float, trust_domain: str,
          log_level: str, registry: str | None, kube_api_addr: str, kube_node_name: str | None,
          kube_bookmark_interval: float, kube_watch_history: int, monitoring_addr: str,
          workload_entry_grace_period: float | None) -> None:
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


_PATHS: dict[str, dict[str, Any]] = {"state-dir": {"type": click.Path(file_okay=False)}}


@main.command("pod-files", help=flags.POD_FILES.summary)
@clickflags.options(flags.POD_FILES.flags, {**_PATHS, "out": {"type": click.Path(file_okay=False)}}, show_default=True)
def pod_files(state_dir: str, namespace: str, service_account: str, pod: str, token_ttl: float, out: str,
              trust_domain: str) -> None:
    state = _open_state(state_dir, trust_domain)
    files = write_pod_files(state, out, namespace, service_account, pod, token_ttl, time.time())
    click.echo(f"wrote {files.root_cert}")
    click.echo(f"wrote {files.token}")


@main.command(help=flags.TOKEN.summary)
@clickflags.options(flags.TOKEN.flags, _PATHS, show_default=True)
def token(state_dir: str, namespace: str, service_account: str, pod: str, token_ttl: float, trust_domain: str) -> None:
    state = _open_state(state_dir, trust_domain)
    click.echo(pod_token(state, namespace, service_account, pod, token_ttl, time.time()))


@main.command(help=flags.KUBECONFIG.summary)
@clickflags.options(flags.KUBECONFIG.flags, {**_PATHS, "out": {"type": click.Path(dir_okay=False)},
                                             "service-account-dir": {"type": click.Path(file_okay=False)}},
                    show_default=True)
def kubeconfig(state_dir: str, out: str, server: str, identity: str, token_ttl: float,
               service_account_dir: str | None, trust_domain: str) -> None:
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


@main.group("workload-entry", help=flags.WORKLOAD_ENTRY.summary)
def workload_entry() -> None:
    pass


@workload_entry.command("configure", help=flags.WORKLOAD_ENTRY_CONFIGURE.summary)
@clickflags.options(flags.WORKLOAD_ENTRY_CONFIGURE.flags, {
    **_PATHS, "file": {"type": click.Path(dir_okay=False, exists=True)},
    "registry": {"type": click.Path(dir_okay=False, exists=True)}, "output": {"type": click.Path(file_okay=False)},
    "tokenDuration": {"type": click.IntRange(min=1)}}, show_default=True)
def workload_entry_configure(state_dir: str, name: str, namespace: str, filename: str | None, registry: str | None,
                             output: str, autoregister: bool, capture_dns: bool, cluster_id: str, external_ip: str,
                             internal_ip: str, ingress_ip: str, ingress_service: str, token_duration: int,
                             revision: str, istio_namespace: str, discovery_address: str, trust_domain: str) -> None:
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
