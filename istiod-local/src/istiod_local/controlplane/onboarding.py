"""The onboarding files of a VM, as `istioctl x workload entry configure` writes them; rendering only, no I/O.

The VM guide copies five files onto the machine: `cluster.env` (the agent's
environment), `mesh.yaml` (`defaultConfig:`, the ProxyConfig with the group's
probe as `readinessProbe`), `root-cert.pem`, `istio-token` (a service-account
token for the group's service account, audience `istio-ca`) and `hosts`
(istiod's name → the address the VM reaches it at). The keys and their
values follow upstream's `istioctl/pkg/workload/workload.go`:

* proxyMetadata (mesh.yaml, and cluster.env too) carries CANONICAL_SERVICE /
  CANONICAL_REVISION (from the labels, else the group's name and `latest`),
  POD_NAMESPACE, SERVICE_ACCOUNT, TRUST_DOMAIN, ISTIO_META_CLUSTER_ID,
  ISTIO_META_MESH_ID, ISTIO_META_NETWORK, ISTIO_META_POD_PORTS (with ports),
  ISTIO_META_WORKLOAD_NAME, ISTIO_METAJSON_LABELS, ISTIO_META_DNS_CAPTURE
  (with DNS capture), ISTIO_META_AUTO_REGISTER_GROUP (with --autoregister);
* cluster.env adds ISTIO_INBOUND_PORTS, ISTIO_NAMESPACE, ISTIO_SERVICE,
  ISTIO_SERVICE_CIDR, ISTIO_LOCAL_EXCLUDE_PORTS, SERVICE_ACCOUNT, and
  ISTIO_SVC_IP / CA_ADDR when they apply; one `KEY=value` per line, sorted,
  each value quoted by upstream's shellescape (whose character class, written
  with a doubled backslash, leaves almost nothing unquoted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from istiod_local.controlplane.xds.workloadgroups import WorkloadGroup

PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
CANONICAL_NAME = "service.istio.io/canonical-name"
CANONICAL_REVISION = "service.istio.io/canonical-revision"
_NAME_LABELS = (CANONICAL_NAME, "app.kubernetes.io/name", "app")
_REVISION_LABELS = (CANONICAL_REVISION, "app.kubernetes.io/version", "version")
# Upstream's regexp is `[^\\w@%+=:,./-]` in a Go raw string: a backslash and a literal `w`, not `\w`.
_SHELL_SAFE = frozenset("\\w@%+=:,./-")
FILE_NAMES = ("cluster.env", "mesh.yaml", "root-cert.pem", "istio-token", "hosts")
FILE_MODE = 0o744  # upstream's filePerms


@dataclass(frozen=True)
class OnboardingOptions:
    """`configure`'s flags that shape the files (everything but where they go)."""

    istio_namespace: str = "istio-system"
    revision: str = ""
    cluster_id: str = "Kubernetes"
    trust_domain: str = "cluster.local"
    discovery_port: int = 15012
    ingress_ip: str = ""  # what `hosts` maps istiod's name to; empty: no line (upstream warns)
    internal_ip: str = ""
    external_ip: str = ""
    autoregister: bool = False
    capture_dns: bool = True
    # defaultConfig from the mesh config (`proxy.istio.io/config` annotations of the group merge over it).
    default_config: Mapping[str, Any] = field(default_factory=dict)
    object_annotations: Mapping[str, str] = field(default_factory=dict)  # the WorkloadGroup object's own


def shell_quote(value: str) -> str:
    if not value:
        return "''"
    if any(ch not in _SHELL_SAFE for ch in value):
        return "'" + value.replace("'", "'\"'\"'") + "'"
    return value


def _first(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    return next((labels[k] for k in keys if k in labels), None)


def canonical_service(labels: Mapping[str, str], workload: str) -> tuple[str, str]:
    return _first(labels, _NAME_LABELS) or workload, _first(labels, _REVISION_LABELS) or "latest"


def is_revisioned(revision: str) -> bool:
    return revision not in ("", "default")


def istiod_host(namespace: str, revision: str) -> str:
    name = f"istiod-{revision}" if is_revisioned(revision) else "istiod"
    return f"{name}.{namespace}.svc"


def _go_yaml_key(key: str) -> list[tuple[int, Any]]:
    """go-yaml's key order: letters compare as runes and sort after non-letters; digit runs by value."""
    out: list[tuple[int, Any]] = []
    i = 0
    while i < len(key):
        ch = key[i]
        if ch.isdigit():
            j = i
            while j < len(key) and key[j].isdigit():
                j += 1
            out.append((0, int(key[i:j])))
            i = j
            continue
        out.append((1 if ch.isalpha() else 0, ord(ch)))
        i += 1
    return out


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _sorted(value[k]) for k in sorted(value, key=_go_yaml_key)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _proxy_config(group: WorkloadGroup, options: OnboardingOptions) -> dict[str, Any]:
    """defaultConfig: the mesh's, the group's `proxy.istio.io/config` annotations over it, proxyMetadata merged."""
    config: dict[str, Any] = {**options.default_config}
    metadata: dict[str, str] = dict(config.get("proxyMetadata") or {})
    for annotated in (options.object_annotations, group.annotations):
        text = annotated.get(PROXY_CONFIG_ANNOTATION)
        if not text:
            continue
        overlay = yaml.safe_load(text) or {}
        if not isinstance(overlay, dict):
            raise ValueError(f"annotation {PROXY_CONFIG_ANNOTATION}: must be a ProxyConfig mapping")
        config.update(overlay)
        metadata.update({str(k): str(v) for k, v in (overlay.get("proxyMetadata") or {}).items()})
    config["proxyMetadata"] = metadata
    config.setdefault("discoveryAddress", f"{istiod_host(options.istio_namespace, options.revision)}:"
                                          f"{options.discovery_port}")
    if group.probe is not None:
        config["readinessProbe"] = dict(group.probe)
    else:
        config.pop("readinessProbe", None)
    return config


def proxy_metadata(group: WorkloadGroup, options: OnboardingOptions, config: Mapping[str, Any]) -> dict[str, str]:
    template = group.template
    labels = {**group.labels, **template.labels}  # the template's labels override the metadata's, as upstream
    md = dict(config.get("proxyMetadata") or {})
    md["CANONICAL_SERVICE"], md["CANONICAL_REVISION"] = canonical_service(labels, group.name)
    md["POD_NAMESPACE"] = group.namespace
    md["SERVICE_ACCOUNT"] = template.service_account
    md["TRUST_DOMAIN"] = options.trust_domain
    md["ISTIO_META_CLUSTER_ID"] = options.cluster_id
    md["ISTIO_META_MESH_ID"] = str(config.get("meshId") or "")
    md["ISTIO_META_NETWORK"] = template.network
    if template.ports:
        ports = [{"name": name, "containerPort": template.ports[name], "protocol": ""}
                 for name in sorted(template.ports)]
        md["ISTIO_META_POD_PORTS"] = json.dumps(ports, separators=(",", ":"))
    md["ISTIO_META_WORKLOAD_NAME"] = group.name
    labels[CANONICAL_NAME], labels[CANONICAL_REVISION] = md["CANONICAL_SERVICE"], md["CANONICAL_REVISION"]
    md["ISTIO_METAJSON_LABELS"] = json.dumps(labels, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    if options.capture_dns:
        md["ISTIO_META_DNS_CAPTURE"] = "true"
    if options.autoregister:
        md["ISTIO_META_AUTO_REGISTER_GROUP"] = group.name
    return md


def cluster_env(group: WorkloadGroup, options: OnboardingOptions, config: Mapping[str, Any]) -> str:
    ports = [str(group.template.ports[name]) for name in sorted(group.template.ports)]
    status_port = int(config.get("statusPort") or 0)
    exclude = "22,15090,15021"
    if status_port not in (15090, 15021):
        exclude += f",{status_port or 15020}"
    overrides = {
        "ISTIO_INBOUND_PORTS": ",".join(ports) if ports else "*",
        "ISTIO_NAMESPACE": group.namespace,
        "ISTIO_SERVICE": f"{group.name}.{group.namespace}",
        "ISTIO_SERVICE_CIDR": "*",
        "ISTIO_LOCAL_EXCLUDE_PORTS": exclude,
        "SERVICE_ACCOUNT": group.template.service_account,
    }
    if is_revisioned(options.revision):
        overrides["CA_ADDR"] = f"{istiod_host(options.istio_namespace, options.revision)}:{options.discovery_port}"
    if options.internal_ip:
        overrides["ISTIO_SVC_IP"] = options.internal_ip
    elif options.external_ip:
        overrides["ISTIO_SVC_IP"] = options.external_ip
        overrides["REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION"] = "true"
    env = {**dict(config.get("proxyMetadata") or {}), **overrides}
    return "".join(sorted(f"{k}={shell_quote(v)}\n" for k, v in env.items()))


class _GoYamlDumper(yaml.SafeDumper):
    """Strings a reader would take for something else (true, 1, empty) double-quoted, as go-yaml writes them."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if dumper.resolve(yaml.ScalarNode, value, (True, False)) != "tag:yaml.org,2002:str":
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


_GoYamlDumper.add_representer(str, _represent_str)


def render_onboarding(group: WorkloadGroup, options: OnboardingOptions, root_cert_pem: str,
                      token: str) -> dict[str, bytes]:
    """The five files by name, as upstream writes them for this group."""
    config = _proxy_config(group, options)
    config["proxyMetadata"] = proxy_metadata(group, options, config)
    mesh = yaml.dump({"defaultConfig": _sorted(config)}, Dumper=_GoYamlDumper, sort_keys=False,
                     default_flow_style=False, width=1 << 20)
    host = istiod_host(options.istio_namespace, options.revision)
    hosts = f"{options.ingress_ip} {host}\n" if options.ingress_ip else ""
    return {
        "cluster.env": cluster_env(group, options, config).encode(),
        "mesh.yaml": mesh.encode(),
        "root-cert.pem": root_cert_pem.encode(),
        "istio-token": token.encode(),
        "hosts": hosts.encode(),
    }
