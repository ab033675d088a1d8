"""What the mesh's security config means for one request, as istiod and Envoy decide it (pure).

Used by `up --check` to derive its expectations and by the planner for the
namespaces' modes; every function returns None where the answer cannot be
derived from what is written (a field this module does not evaluate), so
the check lists that case as "not checked" instead of guessing.

PeerAuthentication (`workload_mode`): a policy applies to a workload when it
is in the workload's namespace or the root namespace (istio-system) and its
`selector.matchLabels` (if any) matches the workload's labels. The most
specific wins: a selector's, then the namespace's, then the mesh's (root
namespace, no selector); `UNSET` inherits from the next level. The mesh
file's own `peerAuthentication:` of a namespace is a namespace-wide policy,
which a namespace-wide PeerAuthentication of the Istio config replaces.
Without any: PERMISSIVE. `portLevelMtls` is not evaluated (None).

AuthorizationPolicy (`authorize`): the policies applying to a workload (same
rule of namespaces and selectors); a DENY policy that matches denies, then,
if any ALLOW policy applies, one must match, else the request is denied. A
policy matches when one of its rules does; an ALLOW policy without rules
matches nothing (deny by default), a rule `{}` everything. Within a rule,
`from`, `to` and `when` must all match, any element of a list, every field
of an element, any value of a field (`not*` fields: none of them). Values
take Istio's forms: exact, `prefix*`, `*suffix`, `*`. The source principal
is `<trust domain>/ns/<namespace>/sa/<account>` over mTLS and nothing in
plaintext, which no `principals` or `namespaces` value matches. Evaluated:
principals, namespaces, requestPrincipals (no probe carries a JWT), hosts,
ports, methods, paths and `when` on request headers, source principal and
namespace and destination port; ipBlocks, CUSTOM policies and
`targetRef(s)` are not (None), AUDIT policies decide nothing.

DestinationRule (`destination_rule`): the rule for a host as a client in
some namespace sees it: one in the client's namespace, else the host's,
else the root namespace (each exported to the client). Its `tls.mode` and
subsets are read; a rule with a `workloadSelector` is not evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from istiod_local.mesh.istioconfig import ROOT_NAMESPACE
from istiod_local.mesh.model import IstioResource, Mesh

DOMAIN = "svc.cluster.local"
TRUST_DOMAIN = "cluster.local"


def _applies(resource: IstioResource, namespace: str, labels: Mapping[str, str]) -> bool:
    if resource.namespace not in (namespace, ROOT_NAMESPACE):
        return False
    selector = resource.spec.get("selector") or {}
    wanted = selector.get("matchLabels") or {} if isinstance(selector, Mapping) else {}
    return all(labels.get(k) == v for k, v in wanted.items())


def _has_selector(resource: IstioResource) -> bool:
    selector = resource.spec.get("selector")
    return isinstance(selector, Mapping) and bool(selector.get("matchLabels"))


def _pa_mode(resource: IstioResource) -> str:
    mtls = resource.spec.get("mtls") or {}
    mode = mtls.get("mode", "UNSET") if isinstance(mtls, Mapping) else "UNSET"
    return str(mode or "UNSET")


def namespace_mode(mesh: Mesh, namespace: str) -> str:
    """A namespace's mode: its namespace-wide PeerAuthentication, else the mesh file's, else the mesh-wide one."""
    policies = mesh.resources("PeerAuthentication")
    own = [p for p in policies if p.namespace == namespace and not _has_selector(p) and _pa_mode(p) != "UNSET"]
    if own and namespace != ROOT_NAMESPACE:
        return _pa_mode(own[0])
    declared = mesh.namespace(namespace)
    if declared.mode_given:
        return declared.peer_authentication
    root = [p for p in policies if p.namespace == ROOT_NAMESPACE and not _has_selector(p) and _pa_mode(p) != "UNSET"]
    return _pa_mode(root[0]) if root else declared.peer_authentication


def workload_mode(mesh: Mesh, namespace: str, labels: Mapping[str, str]) -> str | None:
    """A workload's mode (selector policies first); None where `portLevelMtls` may change it per port."""
    policies = [p for p in mesh.resources("PeerAuthentication") if _applies(p, namespace, labels)]
    if any(p.spec.get("portLevelMtls") for p in policies):
        return None
    selected = [p for p in policies if _has_selector(p) and _pa_mode(p) != "UNSET"]
    return _pa_mode(selected[0]) if selected else namespace_mode(mesh, namespace)


# ---- AuthorizationPolicy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request as a server's RBAC filter sees it."""

    method: str = "GET"
    path: str = "/"
    host: str = ""
    port: int = 0  # the port the server's workload receives it on (a service's targetPort)
    principal: str = ""  # the client's SPIFFE id without `spiffe://`; "" in plaintext
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def source_namespace(self) -> str:
        parts = self.principal.split("/")
        return parts[2] if len(parts) >= 5 and parts[1] == "ns" else ""


@dataclass(frozen=True)
class Decision:
    allowed: bool | None  # None: not derivable
    reason: str


def principal_of(namespace: str, service_account: str) -> str:
    return f"{TRUST_DOMAIN}/ns/{namespace}/sa/{service_account}"


def value_matches(pattern: str, value: str) -> bool:
    if pattern == "*":
        return bool(value)
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return value.endswith(pattern[1:])
    return pattern == value


def _any(patterns: Any, value: str, fold: bool = False) -> bool:
    values = patterns if isinstance(patterns, list) else []
    if fold:
        return any(value_matches(str(p).lower(), value.lower()) for p in values)
    return any(value_matches(str(p), value) for p in values)


# ipBlocks are not evaluated: a rule naming them is "not derivable".
_SOURCE = {"principals", "notPrincipals", "namespaces", "notNamespaces", "requestPrincipals", "notRequestPrincipals"}
_OPERATION = {"hosts", "notHosts", "ports", "notPorts", "methods", "notMethods", "paths", "notPaths"}
_WHEN = {"source.principal", "source.namespace", "destination.port"}


def _field_matches(name: str, patterns: Any, request: Request) -> bool:
    value = {"principals": request.principal, "namespaces": request.source_namespace,
             "requestPrincipals": "", "hosts": request.host, "ports": str(request.port),
             "methods": request.method, "paths": request.path.split("?", 1)[0]}
    base = name[3].lower() + name[4:] if name.startswith("not") else name
    if base == "hosts":
        hit = _any(patterns, request.host, fold=True) or _any(patterns, request.host.rsplit(":", 1)[0], fold=True)
    else:
        hit = _any(patterns, value[base])
    return not hit if name.startswith("not") else hit


def _condition(condition: Mapping[str, Any], request: Request) -> bool | None:
    key = str(condition.get("key", ""))
    if key.startswith("request.headers[") and key.endswith("]"):
        actual = request.headers.get(key[len("request.headers["):-1].lower(), "")
    elif key in _WHEN:
        actual = {"source.principal": request.principal, "source.namespace": request.source_namespace,
                  "destination.port": str(request.port)}[key]
    else:
        return None
    values, not_values = condition.get("values"), condition.get("notValues")
    return (not values or _any(values, actual)) and not (not_values and _any(not_values, actual))


def _rule_matches(rule: Mapping[str, Any], request: Request) -> bool | None:
    if not isinstance(rule, Mapping) or set(rule) - {"from", "to", "when"}:
        return None
    for key, inner, known in (("from", "source", _SOURCE), ("to", "operation", _OPERATION)):
        elements = rule.get(key)
        if not elements:
            continue
        hit = False
        for element in elements:
            part = element.get(inner) if isinstance(element, Mapping) else None
            if not isinstance(part, Mapping) or set(part) - known:
                return None
            if all(_field_matches(name, patterns, request) for name, patterns in part.items()):
                hit = True
        if not hit:
            return False
    for condition in rule.get("when") or []:
        result = _condition(condition, request) if isinstance(condition, Mapping) else None
        if result is None or not result:
            return result
    return True


def _policy_matches(policy: IstioResource, request: Request) -> bool | None:
    results = [_rule_matches(rule, request) for rule in policy.spec.get("rules") or []]
    if any(r is True for r in results):
        return True
    return None if any(r is None for r in results) else False


def authorization_policies(mesh: Mesh, namespace: str, labels: Mapping[str, str]) -> list[IstioResource]:
    return [p for p in mesh.resources("AuthorizationPolicy") if _applies(p, namespace, labels)]


def authorize(mesh: Mesh, namespace: str, labels: Mapping[str, str], request: Request) -> Decision:
    """Whether a workload's RBAC lets `request` through (HTTP)."""
    policies = authorization_policies(mesh, namespace, labels)
    if not policies:
        return Decision(True, "no AuthorizationPolicy")
    for policy in policies:
        spec = policy.spec
        if spec.get("targetRef") or spec.get("targetRefs") or spec.get("provider"):
            return Decision(None, f"{policy.key}: targetRefs and providers are not evaluated")
        if spec.get("action", "ALLOW") not in ("ALLOW", "DENY", "AUDIT"):
            return Decision(None, f"{policy.key}: action {spec.get('action')} is not evaluated")
    for policy in (p for p in policies if p.spec.get("action") == "DENY"):
        hit = _policy_matches(policy, request)
        if hit is None:
            return Decision(None, f"{policy.key}: a rule the check does not evaluate")
        if hit:
            return Decision(False, f"denied by {policy.key}")
    allows = [p for p in policies if p.spec.get("action", "ALLOW") == "ALLOW"]
    if not allows:
        return Decision(True, "no ALLOW policy")
    unknown = None
    for policy in allows:
        hit = _policy_matches(policy, request)
        if hit:
            return Decision(True, f"allowed by {policy.key}")
        if hit is None:
            unknown = policy
    if unknown is not None:
        return Decision(None, f"{unknown.key}: a rule the check does not evaluate")
    return Decision(False, "no ALLOW policy matches (" + ", ".join(p.key for p in allows) + ")")


# ---- DestinationRule -------------------------------------------------------------------------------


def fqdn(host: str, namespace: str) -> str:
    """A host as istiod resolves it in a resource of `namespace`: a name without a dot is a service there;
    anything else (`reviews.default` too) is taken as written."""
    host = host.lower()
    return f"{host}.{namespace}.{DOMAIN}" if "." not in host and host != "*" else host


def exported_to(resource: IstioResource, namespace: str) -> bool:
    export = resource.spec.get("exportTo")
    if not export:
        return True
    return any(e == "*" or e == namespace or (e == "." and resource.namespace == namespace) for e in export)


@dataclass(frozen=True)
class Rule:
    """The DestinationRule a client sees for a host (None fields: none, or not evaluated)."""

    resource: IstioResource | None
    subsets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    tls_mode: str = ""


def destination_rule(mesh: Mesh, host: str, client_namespace: str) -> Rule | None:
    """The rule for an FQDN as seen from `client_namespace`; Rule(None) when there is none, None when the
    one that applies is not evaluated (a workloadSelector)."""
    service_namespace = host.split(".")[1] if host.endswith(DOMAIN) else ""
    rules = [r for r in mesh.resources("DestinationRule")
             if fqdn(str(r.spec.get("host", "")), r.namespace) == host and exported_to(r, client_namespace)]
    for namespace in (client_namespace, service_namespace, ROOT_NAMESPACE):
        found = [r for r in rules if r.namespace == namespace]
        if not found:
            continue
        rule = found[0]
        if rule.spec.get("workloadSelector"):
            return None
        subsets = {str(s.get("name")): dict(s.get("labels") or {}) for s in rule.spec.get("subsets") or []
                   if isinstance(s, Mapping)}
        policy = rule.spec.get("trafficPolicy") or {}
        tls = policy.get("tls") or {} if isinstance(policy, Mapping) else {}
        return Rule(rule, subsets, str(tls.get("mode", "")) if isinstance(tls, Mapping) else "")
    return Rule(None)
