"""WasmPlugins of a mesh file's Istio config, as the embedded control plane serves them (pure).

One way to write a plugin for both control planes: Istio's own WasmPlugin
YAML (`extensions.istio.io/v1alpha1`) in a file `istioConfig:` names. The
real istiod is given it as it is (`node.istiod_config` says how its config
directory takes it); for istiod-local it becomes an entry of the registry's
`wasmPlugins` (`controlplane/xds/wasmplugins.py`), which istiod-local serves
as upstream's istiod does: an HTTP filter waiting for ECDS, whose extension
config carries the module's URL as a remote source for the agent to fetch.

What istiod-local serves of a WasmPlugin's spec: `selector.matchLabels`,
`url`, `sha256`, `imagePullPolicy`, `imagePullSecret`, `pluginConfig`,
`pluginName`, `phase`, `priority`, `failStrategy`, `match[].mode` and `type:
HTTP`. Anything else (`targetRefs`, `vmConfig`, `verificationKey`, `match`
ports, a NETWORK plugin) is refused by name on the embedded control plane
(`embedded_problem`), as other kinds are, pointing at `--control-plane
istiod`; a value the registry refuses is reported at the resource's file and
line with its `spec.` field (`check_embedded`).

`unserved` names the plugins whose URL points at the node's module server
(`mesh.wasmfiles`) but at no module the mesh file serves, so that a typo is
refused with its file and line instead of becoming a fail-closed plugin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import yaml

from istiod_local.controlplane.xds.wasmplugins import ROOT_NAMESPACE, parse_wasm_plugins
from istiod_local.controlplane.xds.yamlfields import Fields, RegistryError, compose
from istiod_local.mesh.model import Deployment, IstioResource, Mesh

KIND = "WasmPlugin"
SERVED_SPEC = frozenset({"selector", "url", "sha256", "imagePullPolicy", "imagePullSecret", "pluginConfig",
                         "pluginName", "phase", "priority", "failStrategy", "match", "type"})
_REGISTRY_TOP = frozenset({"wasmPlugins"})


def embedded_problem(resource: IstioResource) -> str:
    """What of this WasmPlugin istiod-local does not serve ("": all of it)."""
    spec = resource.spec
    extra = sorted(set(spec) - SERVED_SPEC)
    if extra:
        return f"WasmPlugin with {', '.join(extra)}"
    selector = spec.get("selector")
    if isinstance(selector, Mapping) and set(selector) - {"matchLabels"}:
        return "WasmPlugin with a selector beyond matchLabels"
    for match in spec.get("match") or []:
        if isinstance(match, Mapping) and match.get("ports"):
            return "WasmPlugin with match ports"
    if spec.get("type", "HTTP") != "HTTP":
        return "WasmPlugin of a type other than HTTP"
    return ""


def registry_entry(resource: IstioResource) -> dict[str, Any]:
    """The registry's flattened entry for a WasmPlugin: name, namespace and its spec's served fields."""
    spec = dict(resource.spec)
    entry: dict[str, Any] = {"name": resource.name, "namespace": resource.namespace}
    selector = spec.pop("selector", None)
    if isinstance(selector, Mapping) and "matchLabels" in selector:
        entry["selector"] = selector["matchLabels"]
    entry.update({k: v for k, v in spec.items() if k in SERVED_SPEC})
    return entry


def _spec_field(field: str) -> str:
    """A registry entry's field (`wasmPlugins[0].match[0].mode`) as the WasmPlugin names it (`spec.match[0].mode`)."""
    _, _, rest = field.partition("].")
    if not rest:
        return "spec"
    if rest in ("name", "namespace"):
        return f"metadata.{rest}"
    return "spec.selector.matchLabels" + rest[len("selector"):] if rest.startswith("selector") else f"spec.{rest}"


def check_embedded(resources: Iterable[IstioResource]) -> None:
    """Each WasmPlugin istiod-local serves parses as its registry would take it; RegistryError at the resource's
    file and line, naming its `spec.` field."""
    for resource in resources:
        if resource.kind != KIND or embedded_problem(resource):
            continue
        text = yaml.safe_dump({"wasmPlugins": [registry_entry(resource)]}, sort_keys=False)
        try:
            root = compose(text, resource.source)
            assert root is not None
            parse_wasm_plugins(Fields(root, "", resource.source, _REGISTRY_TOP))
        except RegistryError as exc:
            source, _, line = resource.source.rpartition(":")
            raise RegistryError(source or resource.source, int(line) if line.isdigit() else 0, _spec_field(exc.field),
                                f"{resource.key}: {exc.problem}") from None


def registry_entries(resources: Iterable[IstioResource]) -> list[dict[str, Any]]:
    """The registry's `wasmPlugins` for the WasmPlugins istiod-local serves (the others are refused when the
    mesh is loaded for it, and left to the real istiod otherwise)."""
    out = []
    for resource in resources:
        if resource.kind != KIND or embedded_problem(resource):
            continue
        try:
            check_embedded([resource])
        except RegistryError:
            continue
        out.append(registry_entry(resource))
    return out


def selected(mesh: Mesh, resource: IstioResource) -> list[Deployment]:
    """The meshed deployments a WasmPlugin applies to (its namespace's, or every namespace's from the root's)."""
    selector = resource.spec.get("selector")
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    return [d for d in mesh.deployments
            if d.mode in ("sidecar", "gateway") and resource.namespace in (d.namespace, ROOT_NAMESPACE)
            and all(d.labels.get(k) == v for k, v in (labels or {}).items())]


def unserved(resources: Iterable[IstioResource], base_url: str, served: Sequence[str]) -> list[str]:
    """Where a WasmPlugin's URL names the node's module server (`base_url`, `http://host:port/`) but no module
    it serves: `file:line: WasmPlugin ns/name: spec.url: ...` each."""
    base = urlsplit(base_url)
    out = []
    for resource in resources:
        if resource.kind != KIND:
            continue
        url = str(resource.spec.get("url", ""))
        parts = urlsplit(url)
        if (parts.scheme, parts.netloc) != (base.scheme, base.netloc):
            continue
        name = parts.path.lstrip("/")
        if name not in served:
            known = ", ".join(served) or "none: the mesh file has no wasmModules"
            out.append(f"{resource.source}: {resource.key}: spec.url: {url} names no module the node serves "
                       f"(it serves {known})")
    return out
