"""Istio resources from files, as the mesh file's `istioConfig:` names them (pure: text in, resources out).

The files hold Istio's own YAML (`apiVersion: networking.istio.io/v1`,
`kind: VirtualService`, ...), one or more documents each, as `kubectl apply
-f` takes them. This module reads what the mesh needs to know of each
document (kind, name, namespace, spec) and refuses, naming the file and
line, what would never reach istiod as meant: a document that is not an
object, an unknown kind or an apiVersion that kind does not have, a missing
name, a namespace the mesh does not declare, the same resource twice. Whether
a spec is *valid* is istiod's to say: the real istiod validates every
resource it reads and its own message is reported (`node.istiod_userconfig`).

One thing is refused here because it would break every sidecar rather than
be rejected: a Telemetry naming the `prometheus` metrics provider makes
istiod add the `istio.stats` filter, which a stock Envoy does not have, so
every listener would be NACKed (docs/ISTIOD.md).

Which kinds each control plane takes (`unsupported`): the real istiod takes
every kind below; the embedded one (istiod-local) understands
PeerAuthentication for a whole namespace or the mesh (`mtls.mode`), which
it folds into the namespaces' modes, and WasmPlugins (`mesh.wasmplugins`:
what of their spec it serves); everything else is refused naming the kind
and where it is, pointing at `--control-plane istiod`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

from istiod_local.controlplane.xds.yamlfields import DNS_LABEL, RegistryError, describe, is_null, line_of
from istiod_local.mesh.model import IstioResource
from istiod_local.mesh.wasmplugins import KIND as WASM_PLUGIN
from istiod_local.mesh.wasmplugins import embedded_problem

ROOT_NAMESPACE = "istio-system"  # istiod's root namespace (meshConfig.rootNamespace's default)
NETWORKING = "networking.istio.io"
SECURITY = "security.istio.io"
# kind -> (API group, versions istiod serves it at)
KINDS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "VirtualService": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "DestinationRule": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "Gateway": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "ServiceEntry": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "WorkloadEntry": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "WorkloadGroup": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "Sidecar": (NETWORKING, ("v1", "v1beta1", "v1alpha3")),
    "EnvoyFilter": (NETWORKING, ("v1alpha3",)),
    "ProxyConfig": (NETWORKING, ("v1beta1",)),
    "AuthorizationPolicy": (SECURITY, ("v1", "v1beta1")),
    "PeerAuthentication": (SECURITY, ("v1", "v1beta1")),
    "RequestAuthentication": (SECURITY, ("v1", "v1beta1")),
    "Telemetry": ("telemetry.istio.io", ("v1", "v1alpha1")),
    "WasmPlugin": ("extensions.istio.io", ("v1alpha1",)),
}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _documents(text: str, source: str) -> list[tuple[int, Node]]:
    try:
        nodes = list(yaml.compose_all(text, Loader=_LOADER))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise RegistryError(source, mark.line + 1 if mark else 0, "", f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise RegistryError(source, 0, "", f"invalid YAML: {exc}") from None
    return [(line_of(node), node) for node in nodes if node is not None and not is_null(node)]


def _construct(node: Node) -> Any:
    """The plain data of a composed document (the safe loader's constructor)."""
    return _LOADER("").construct_document(node)


def parse_resources(text: str, source: str, namespaces: Iterable[str]) -> list[IstioResource]:
    """The Istio resources of one file; RegistryError naming the line of the first refused document.

    `namespaces` are those the mesh declares; a resource may also live in the root namespace
    (istio-system). A document without a namespace is in `default`, as `kubectl apply` puts it.
    """
    declared = {*namespaces, ROOT_NAMESPACE}
    out: list[IstioResource] = []
    for line, node in _documents(text, source):
        if not isinstance(node, MappingNode):
            raise RegistryError(source, line, "", f"an Istio resource must be a mapping, got {describe(node)}")
        document = _construct(node)
        if not document:
            continue
        out.append(_resource(document, f"{source}:{line}", source, _lines(node, line), declared))
    return out


def _lines(node: MappingNode, line: int) -> dict[str, int]:
    """The line of each top-level field and of metadata's (`metadata.name`), the document's for the rest."""
    out: dict[str, int] = {"": line}
    for key, value in node.value:
        name = str(getattr(key, "value", ""))
        out[name] = line_of(value)
        if name == "metadata" and isinstance(value, MappingNode):
            for inner, inner_value in value.value:
                out[f"metadata.{getattr(inner, 'value', '')}"] = line_of(inner_value)
    return out


def _resource(document: dict[str, Any], where: str, source: str, lines: Mapping[str, int],
              declared: set[str]) -> IstioResource:
    def at(*fields: str) -> int:
        return next((lines[f] for f in fields if f in lines), lines[""])

    kind = document.get("kind")
    api_version = document.get("apiVersion")
    if not isinstance(kind, str) or kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        raise RegistryError(source, at("kind"), "kind", f"not an Istio kind istiod reads from files: {kind!r} "
                                                  f"(one of {known})")
    group, versions = KINDS[kind]
    wanted = [f"{group}/{v}" for v in versions]
    if api_version not in wanted:
        raise RegistryError(source, at("apiVersion"), "apiVersion",
                            f"{kind} is {' or '.join(wanted)}, got {api_version!r}")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        raise RegistryError(source, at("metadata.name", "metadata"), "metadata.name", f"a {kind} needs a name")
    name = metadata["name"]
    namespace = metadata.get("namespace", "default")
    if not isinstance(namespace, str) or not DNS_LABEL.match(namespace):
        raise RegistryError(source, at("metadata.namespace"), "metadata.namespace",
                            f"must be a DNS label, got {namespace!r}")
    if namespace not in declared:
        raise RegistryError(source, at("metadata.namespace"), "metadata.namespace",
                            f"namespace {namespace!r} is not declared in the mesh file (nor the root namespace "
                            f"{ROOT_NAMESPACE})")
    spec = document.get("spec", {})
    if not isinstance(spec, dict):
        raise RegistryError(source, at("spec"), "spec", f"must be a mapping, got {type(spec).__name__}")
    if kind == "Telemetry" and _names_prometheus(spec):
        raise RegistryError(source, at("spec"), "spec.metrics", "the prometheus metrics provider makes istiod add "
                            "istio-proxy's istio.stats filter, which a stock Envoy NACKs on every listener")
    document = {**document, "metadata": {**metadata, "namespace": namespace}, "spec": spec}
    return IstioResource(kind, api_version, namespace, name, document, where)


def _names_prometheus(spec: Mapping[str, Any]) -> bool:
    for metric in spec.get("metrics") or []:
        if not isinstance(metric, dict):
            continue
        for provider in metric.get("providers") or []:
            if isinstance(provider, dict) and provider.get("name") == "prometheus":
                return True
    return False


def check_unique(resources: Iterable[IstioResource]) -> None:
    """The same kind, namespace and name twice (in one file or across files) is refused, naming both places."""
    seen: dict[str, str] = {}
    for resource in resources:
        if resource.key in seen:
            source, _, line = resource.source.rpartition(":")
            raise RegistryError(source, int(line) if line.isdigit() else 0, "metadata.name",
                                f"{resource.key} is already defined at {seen[resource.key]}")
        seen[resource.key] = resource.source


def embedded_support(resource: IstioResource) -> str:
    """Why istiod-local cannot apply `resource` ("": it can)."""
    if resource.kind == WASM_PLUGIN:
        return embedded_problem(resource)
    if resource.kind != "PeerAuthentication":
        return resource.kind
    spec = resource.spec
    if spec.get("selector") or spec.get("portLevelMtls"):
        return "PeerAuthentication with a selector or portLevelMtls"
    if set(spec) - {"mtls"} or set(spec.get("mtls") or {}) - {"mode"}:
        return "PeerAuthentication beyond mtls.mode"
    return ""


def unsupported(resources: Iterable[IstioResource]) -> dict[str, list[str]]:
    """What the embedded control plane would not apply: kind (or what of it) -> where each one is."""
    out: dict[str, list[str]] = {}
    for resource in resources:
        reason = embedded_support(resource)
        if reason:
            out.setdefault(reason, []).append(f"{resource.namespace}/{resource.name} ({resource.source})")
    return out


def refusal(resources: Iterable[IstioResource]) -> str:
    """The message refusing Istio config on the embedded control plane ("" when all of it is supported)."""
    found = unsupported(resources)
    if not found:
        return ""
    parts = [f"{kind}: {', '.join(where)}" for kind, where in found.items()]
    return ("the embedded control plane (istiod-local) does not apply " + "; ".join(parts) +
            ". Run `istiod-local up --control-plane istiod` to have the real istiod apply them")
