"""What Istio's security and routing config means for one request, as the check derives it: PeerAuthentication
precedence, AuthorizationPolicy decisions, DestinationRule subsets, VirtualService routes and matches."""

from __future__ import annotations

import dataclasses

import pytest

from istiod_local.mesh import istiopolicy, istioroutes
from istiod_local.mesh.istioconfig import parse_resources
from istiod_local.mesh.istiopolicy import Request, authorize, namespace_mode, principal_of, workload_mode
from istiod_local.mesh.istioroutes import RequestShape, first_route, http_routes, request_for
from istiod_local.mesh.model import Mesh
from istiod_local.mesh.parser import parse_mesh

BASE = "namespaces: [{name: default}, {name: secure, peerAuthentication: PERMISSIVE}, {name: other}]\n"
PRODUCTPAGE = principal_of("default", "productpage")


def _mesh(config: str, base: str = BASE) -> Mesh:
    mesh = parse_mesh(base)
    resources = parse_resources(config, "cfg.yaml", [n.name for n in mesh.namespaces])
    return dataclasses.replace(mesh, istio_config=tuple(resources))


def _pa(namespace: str, mode: str, selector: str = "", name: str = "default") -> str:
    select = f"  selector: {{matchLabels: {{{selector}}}}}\n" if selector else ""
    return (f"---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\n"
            f"metadata: {{name: {name}, namespace: {namespace}}}\nspec:\n{select}  mtls: {{mode: {mode}}}\n")


def test_peer_authentication_the_most_specific_wins() -> None:
    mesh = _mesh(_pa("istio-system", "STRICT") + _pa("other", "DISABLE") +
                 _pa("default", "PERMISSIVE", "app: web", "web") + _pa("other", "UNSET", "app: db", "db"))
    # mesh-wide STRICT for a namespace the file leaves alone; the file's own namespace mode beats it
    assert namespace_mode(mesh, "default") == "STRICT"
    assert namespace_mode(mesh, "secure") == "PERMISSIVE"
    assert namespace_mode(mesh, "other") == "DISABLE"
    assert workload_mode(mesh, "default", {"app": "web"}) == "PERMISSIVE"
    assert workload_mode(mesh, "default", {"app": "api"}) == "STRICT"
    assert workload_mode(mesh, "other", {"app": "db"}) == "DISABLE"  # UNSET inherits
    assert namespace_mode(_mesh(""), "default") == "PERMISSIVE"
    port_level = _pa("default", "STRICT").replace("  mtls:", "  portLevelMtls: {8080: {mode: DISABLE}}\n  mtls:")
    assert workload_mode(_mesh(port_level), "default", {}) is None


AUTHZ = """\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-nothing}
spec: {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-viewer}
spec:
  selector: {matchLabels: {app: reviews}}
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/productpage]}}]
    to: [{operation: {methods: [GET], paths: ["/", "/reviews/*"]}}]
  - from: [{source: {namespaces: [secure]}}]
    when: [{key: "request.headers[x-canary]", values: ["1"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: istio-system}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
"""


@pytest.mark.parametrize(("request_", "allowed"), [
    (Request(principal=PRODUCTPAGE), True),
    (Request(principal=PRODUCTPAGE, path="/reviews/1?x=2"), True),
    (Request(principal=PRODUCTPAGE, method="POST"), False),
    (Request(principal=PRODUCTPAGE, path="/other"), False),
    (Request(principal=principal_of("default", "sleep")), False),
    (Request(), False),  # plaintext: no principal matches
    (Request(principal=principal_of("secure", "x"), headers={"x-canary": "1"}), True),
    (Request(principal=principal_of("secure", "x")), False),
    (Request(principal=PRODUCTPAGE, path="/admin/users"), False),  # the mesh-wide DENY comes first
])
def test_authorization_deny_first_then_an_allow_must_match(request_: Request, allowed: bool) -> None:
    decision = authorize(_mesh(AUTHZ), "default", {"app": "reviews"}, request_)
    assert decision.allowed is allowed, decision


def test_authorization_defaults_and_what_is_not_evaluated() -> None:
    mesh = _mesh(AUTHZ)
    assert authorize(mesh, "default", {"app": "details"}, Request(principal=PRODUCTPAGE)).allowed is False
    assert authorize(mesh, "secure", {"app": "x"}, Request()).reason == "no ALLOW policy"  # only the DENY applies
    assert authorize(_mesh(""), "default", {}, Request()).allowed is True
    ip_blocks = AUTHZ.replace("namespaces: [secure]", "ipBlocks: [10.0.0.0/8]")
    assert authorize(_mesh(ip_blocks), "default", {"app": "reviews"}, Request(principal="x/ns/a/sa/b")).allowed \
        is None
    custom = AUTHZ.replace("action: DENY", "action: CUSTOM\n  provider: {name: ext}")
    assert authorize(_mesh(custom), "default", {"app": "reviews"}, Request()).allowed is None
    not_principals = "\n".join(AUTHZ.splitlines()[:4]).replace("spec: {}", "spec:\n  action: DENY\n  rules: "
                                                                         "[{from: [{source: {notPrincipals: ['*']}}]}]")
    assert authorize(_mesh(not_principals), "default", {}, Request()).allowed is False  # plaintext denied
    assert authorize(_mesh(not_principals), "default", {}, Request(principal=PRODUCTPAGE)).allowed is True


ROUTES = """\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews}
spec:
  host: reviews
  trafficPolicy: {tls: {mode: DISABLE}}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}, {uri: {prefix: /beta}}]
    fault: {abort: {httpStatus: 503, percentage: {value: 25}}}
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{uri: {regex: "/v[0-9]+"}}]
    route: [{destination: {host: reviews, subset: v1}}]
  - match: [{sourceLabels: {app: canary}, method: {exact: POST}}]
    retries: {attempts: 3}
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 80}
    - {destination: {host: reviews, subset: v2}, weight: 20}
    timeout: 500ms
"""


def test_routes_are_read_with_their_faults_weights_and_what_is_not_checked() -> None:
    mesh = _mesh(ROUTES)
    vs, problem = istioroutes.mesh_virtual_service(mesh, "reviews.default.svc.cluster.local", "default")
    assert vs is not None and not problem
    routes = http_routes(vs)
    assert (routes[0].abort_status, routes[0].abort_percent) == (503, 25.0)
    assert routes[2].unchecked == ("retries",) and routes[2].destinations[0].host == "reviews.default.svc.cluster.local"
    assert [(d.subset, d.weight) for d in routes[3].destinations] == [("v1", 80), ("v2", 20)]
    assert routes[3].timeout_s == 0.5 and istioroutes.seconds("2m") == 120.0 and istioroutes.seconds("x") is None
    rule = istiopolicy.destination_rule(mesh, "reviews.default.svc.cluster.local", "default")
    assert rule is not None and rule.tls_mode == "DISABLE" and rule.subsets["v2"] == {"version": "v2"}
    # another namespace's clients see it (exportTo defaults to every namespace), not with exportTo '.'
    assert istioroutes.mesh_virtual_service(mesh, "reviews.default.svc.cluster.local", "other") == (vs, "")
    hidden = _mesh(ROUTES.replace("  hosts: [reviews]", "  hosts: [reviews]\n  exportTo: ['.']"))
    assert istioroutes.mesh_virtual_service(hidden, "reviews.default.svc.cluster.local", "other") == (None, "")


def test_a_request_is_made_for_a_match_and_checked_against_the_routes_before_it() -> None:
    routes = http_routes(_mesh(ROUTES).resources("VirtualService")[0])
    jason = request_for(routes[0].matches[0])
    assert jason == RequestShape(headers={"end-user": "jason"})
    assert request_for(routes[0].matches[1]) == RequestShape(path="/beta")
    assert request_for(routes[1].matches[0]) is None  # a regex: no request the check can make
    canary = request_for(routes[2].matches[0])
    assert canary is not None and canary.method == "POST" and canary.source_labels == {"app": "canary"}
    assert first_route(routes, jason, 9080, "default", {}) == routes[0]
    # a plain request meets the regex route first: the check cannot tell whether it takes it
    assert first_route(routes, RequestShape(), 9080, "default", {}) is None
    without_regex = [routes[0], routes[2], routes[3]]
    assert first_route(without_regex, RequestShape(method="POST"), 9080, "default", {"app": "canary"}) == routes[2]
    assert first_route(without_regex, RequestShape(method="POST"), 9080, "default", {"app": "x"}) == routes[3]
    assert first_route(without_regex[:2], RequestShape(), 9080, "default", {}) is False
