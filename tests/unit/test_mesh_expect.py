"""The check's logic: probes for every pair, the policies' expectations, and reading the answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from istiod_local.mesh import expect
from istiod_local.mesh.expect import MTLS, PLAINTEXT, REFUSED, Outcome, Probe, Row
from istiod_local.mesh.parser import parse_mesh
from istiod_local.mesh.planner import MeshPlan, plan_mesh

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "mesh.yaml").read_text()
SLEEP = "spiffe://cluster.local/ns/default/sa/sleep"
REVIEWS = "spiffe://cluster.local/ns/default/sa/reviews"
WASM_HEADER = (("x-wasm-plugin", "add-header"),)


def _plan(text: str = EXAMPLE) -> MeshPlan:
    return plan_mesh(parse_mesh(text), python="py")


def _ips(plan: MeshPlan) -> dict[str, str]:
    return {spec.name: f"10.244.0.{i + 2}" for i, spec in enumerate(plan.pods)}


def _find(probes: list[Probe], pod: str, target: str, via: str) -> Probe:
    return next(p for p in probes if p.pod == pod and p.target.startswith(target) and p.via == via)


def test_probes_cover_every_pair_each_way_a_client_can_reach_it() -> None:
    plan = _plan()
    probes = expect.probes(plan, _ips(plan))
    sleep = [p for p in probes if p.pod == "sleep-1"]
    # 6 service ports by clusterIP and by name, and the service entry by name
    assert len(sleep) == 13 and {p.via for p in sleep} == {"clusterIP", "DNS"}
    # without DNS capture: clusterIPs only, no service entry
    assert {p.via for p in probes if p.pod == "reviews-v2-1"} == {"clusterIP"}
    # the proxyless client calls the gRPC service over xDS; the proxyless server is no client
    assert [(p.kind, p.address) for p in probes if p.pod == "greeter-client-1"] == \
        [("grpc-xds", "xds:///greeter.default.svc.cluster.local:7070")]
    assert not [p for p in probes if p.pod == "greeter-1"]
    # outside the mesh: each service's first pod, directly on its target port
    outside = {p.target: p.address for p in probes if p.pod == "legacy-1"}
    assert outside["ratings-1:8080"].startswith("http://10.244.0.") and "tcp-echo-1:9000" in outside
    # a service whose pod has no sidecar: auto mTLS sends plaintext
    legacy = expect.expect(plan, _find(probes, "sleep-1", "legacy.default", "clusterIP"))
    assert legacy.kind == "plaintext"
    assert _find(probes, "sleep-1", "tcp-echo", "DNS").cluster == "outbound|9000||tcp-echo.secure.svc.cluster.local"


def test_expectations_follow_the_namespaces_policies() -> None:
    plan = _plan()
    probes = expect.probes(plan, _ips(plan))

    def expected(pod: str, target: str, via: str) -> Outcome:
        return expect.expect(plan, _find(probes, pod, target, via))

    # the example's WasmPlugin header, declared for sleep's calls to ratings, joins the policies' verdict
    assert expected("sleep-1", "ratings", "DNS") == Outcome(MTLS, SLEEP, "STRICT namespace", WASM_HEADER)
    assert expected("reviews-v1-1", "ratings", "clusterIP") == Outcome(MTLS, REVIEWS, "STRICT namespace")
    assert expected("sleep-1", "legacy.example.internal", "DNS").kind == PLAINTEXT
    assert expected("greeter-client-1", "greeter", "xDS").identity.endswith("/sa/greeter-client")
    assert expected("legacy-1", "ratings-1", "pod IP").kind == REFUSED  # STRICT
    assert expected("legacy-1", "frontend-1", "pod IP").kind == PLAINTEXT  # PERMISSIVE
    assert expected("legacy-1", "greeter-1", "pod IP").kind == REFUSED  # proxyless under PERMISSIVE: mTLS only


@pytest.mark.parametrize(("mode", "outside", "inside"), [
    ("STRICT", REFUSED, MTLS), ("PERMISSIVE", PLAINTEXT, MTLS), ("DISABLE", PLAINTEXT, PLAINTEXT)])
def test_each_peer_authentication_mode(mode: str, outside: str, inside: str) -> None:
    plan = _plan(f"namespaces: [{{name: default, peerAuthentication: {mode}}}]\n"
                 "services: [{name: web, ports: [{port: 80, targetPort: 8080, protocol: HTTP}]}]\n"
                 "deployments:\n- {name: web, app: {kind: http-echo, port: 8080}}\n"
                 "- {name: out, mode: none}\n- {name: in, app: client}\n")
    probes = expect.probes(plan, _ips(plan))
    assert expect.expect(plan, _find(probes, "out-1", "web-1", "pod IP")).kind == outside
    assert expect.expect(plan, _find(probes, "in-1", "web", "clusterIP")).kind == inside


def test_a_service_without_endpoints_refuses() -> None:
    plan = _plan("services: [{name: web, ports: [{port: 80, protocol: HTTP}]}]\n"
                 "deployments:\n- {name: web, replicas: 0, app: {kind: http-echo, port: 80}}\n- {name: c}\n")
    (probe,) = expect.probes(plan, _ips(plan))
    assert expect.expect(plan, probe).kind == REFUSED


def _probe(kind: str) -> Probe:
    return Probe("default/sleep", "sleep-1", kind, "x", "t", "clusterIP", service="default/web")


def test_observations_read_xfcc_peer_identities_and_tls_counters() -> None:
    xfcc = f'By=spiffe://cluster.local/ns/default/sa/web;Hash=ab;Subject="";URI={SLEEP}'
    assert expect.observe(_probe("http"), {"answered": True, "status": 200, "xfcc": xfcc}, 1) == Outcome(MTLS, SLEEP)
    assert expect.observe(_probe("http"), {"answered": True, "status": 200, "xfcc": ""}, 0).kind == PLAINTEXT
    assert expect.observe(_probe("http"), {"answered": True, "status": 503}, 0) == Outcome(REFUSED, detail="HTTP 503")
    assert expect.observe(_probe("http"), {"answered": False, "error": "reset"}, None) == \
        Outcome(REFUSED, detail="reset")
    assert expect.observe(_probe("grpc-xds"), {"answered": True, "identities": [SLEEP]}, None) == Outcome(MTLS, SLEEP)
    assert expect.observe(_probe("tcp"), {"answered": True}, 2).kind == MTLS
    assert expect.observe(_probe("tcp"), {"answered": True}, 0).kind == PLAINTEXT
    assert expect.observe(_probe("tcp"), {"answered": True}, None).kind == PLAINTEXT


def test_an_expectation_holds_only_with_the_same_outcome_and_identity() -> None:
    assert expect.holds(Outcome(MTLS, SLEEP), Outcome(MTLS, SLEEP))
    assert expect.holds(Outcome(MTLS, SLEEP), Outcome(MTLS))  # TCP: the identity is not observable
    assert not expect.holds(Outcome(MTLS, SLEEP), Outcome(MTLS, "spiffe://cluster.local/ns/default/sa/other"))
    assert not expect.holds(Outcome(REFUSED), Outcome(PLAINTEXT))
    assert not expect.holds(Outcome(MTLS, SLEEP), Outcome(PLAINTEXT))


def test_the_table_marks_each_row_and_counts() -> None:
    rows = [Row(_probe("http"), Outcome(MTLS, SLEEP), Outcome(MTLS, SLEEP)),
            Row(_probe("tcp"), Outcome(REFUSED), Outcome(PLAINTEXT))]
    text = expect.table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["client", "target", "via", "expected", "observed", "ok"]
    assert lines[1].endswith(" ok") and lines[2].endswith(" FAIL")
    assert lines[-1] == "1/2 expectations held"


STRICT_WEB = ("namespaces: [{name: default, peerAuthentication: STRICT}]\n"
              "services: [{name: web, ports: [{port: 80, targetPort: 8080, protocol: HTTP}]}]\n"
              "deployments:\n- {name: web, app: {kind: http-echo, port: 8080}}\n- {name: out, mode: none}\n")


def test_a_declared_expectation_replaces_the_policies_verdict() -> None:
    plan = _plan(STRICT_WEB + "expectations:\n- {from: out, to: web, outcome: plaintext}\n")
    (probe,) = [p for p in expect.probes(plan, _ips(plan)) if p.pod == "out-1"]
    assert expect.expect(plan, probe) == Outcome(PLAINTEXT, detail="declared in the mesh file")
    # a port that does not match leaves the policies' verdict
    plan = _plan(STRICT_WEB.replace("port: 80,", "port: 80, name: http},{port: 81,") +
                 "expectations:\n- {from: out, to: web, port: 81, outcome: plaintext}\n")
    verdicts = {p.port: expect.expect(plan, p).kind for p in expect.probes(plan, _ips(plan)) if p.pod == "out-1"}
    assert verdicts == {80: REFUSED, 81: PLAINTEXT}


def test_a_declared_expectation_must_name_what_exists() -> None:
    from istiod_local.controlplane.xds.yamlfields import RegistryError

    for bad, field in (("{from: nobody, to: web}", "expectations[0].from"), ("{from: out, to: nothing}",
                                                                             "expectations[0].to"),
                       ("{from: out, to: web, port: 99}", "expectations[0].port"),
                       ("{from: out, to: web, outcome: maybe}", "expectations[0].outcome")):
        with pytest.raises(RegistryError) as caught:
            parse_mesh(STRICT_WEB + f"expectations:\n- {bad}\n")
        assert caught.value.field == field and caught.value.line == 7


def test_declared_headers_join_the_policies_verdict_and_hold_only_when_the_answer_carries_them() -> None:
    plan = _plan("namespaces: [{name: default, peerAuthentication: STRICT}]\n"
                 "services: [{name: web, ports: [{name: http, port: 80, targetPort: 8080},\n"
                 "                               {name: tcp, port: 81, targetPort: 8081}]}]\n"
                 "deployments:\n- {name: web, app: {kind: http-echo, port: 8080}}\n- {name: out, mode: none}\n"
                 "- {name: in, app: client}\n"
                 "expectations:\n- {from: in, to: web, headers: {X-Wasm: 'on'}}\n"
                 "- {from: out, to: web, headers: {x-wasm: 'on'}}\n")
    probes = expect.probes(plan, _ips(plan))
    http = _find(probes, "in-1", "web", "clusterIP")
    wanted = expect.expect(plan, http)
    assert (wanted.kind, wanted.identity, wanted.headers) == (MTLS, "spiffe://cluster.local/ns/default/sa/in",
                                                              (("x-wasm", "on"),))
    tcp = next(p for p in probes if p.pod == "in-1" and p.kind == "tcp")
    assert expect.expect(plan, tcp).headers == (), "only HTTP answers carry headers"
    refused = expect.expect(plan, _find(probes, "out-1", "web-1", "pod IP"))
    assert (refused.kind, refused.headers) == (REFUSED, ()), "a refused call has no headers to check"
    xfcc = f"URI={wanted.identity}"
    carried = expect.observe(http, {"answered": True, "status": 200, "xfcc": xfcc,
                                    "headers": {"x-wasm": "on", "server": "envoy"}}, 1)
    missing = expect.observe(http, {"answered": True, "status": 200, "xfcc": xfcc, "headers": {}}, 1)
    other = expect.observe(http, {"answered": True, "status": 200, "xfcc": xfcc, "headers": {"x-wasm": "off"}}, 1)
    assert expect.holds(wanted, carried) and not expect.holds(wanted, missing) and not expect.holds(wanted, other)
    table = expect.table([Row(http, wanted, carried), Row(http, wanted, missing)])
    assert "x-wasm: on  mtls spiffe://cluster.local/ns/default/sa/in, x-wasm: on  ok" in table
    assert "no x-wasm   FAIL" in table and "server" not in table, table


def test_a_header_expectation_needs_an_http_port_and_header_names() -> None:
    from istiod_local.controlplane.xds.yamlfields import RegistryError

    tcp = STRICT_WEB.replace("protocol: HTTP", "protocol: TCP")
    for text, words in ((tcp + "expectations:\n- {from: out, to: web, headers: {x-a: b}}\n", "no HTTP port"),
                        (STRICT_WEB + "expectations:\n- {from: out, to: web, headers: {}}\n", "at least one"),
                        (STRICT_WEB + "expectations:\n- {from: out, to: web, headers: {'a b': c}}\n",
                         "not an HTTP header name")):
        with pytest.raises(RegistryError) as caught:
            parse_mesh(text)
        assert caught.value.field == "expectations[0].headers" and words in str(caught.value)
    (declared,) = parse_mesh(STRICT_WEB + "expectations:\n- {from: out, to: web, headers: {x-a: b}, "
                             "outcome: plaintext}\n").expectations
    assert (declared.outcome, declared.headers) == ("plaintext", (("x-a", "b"),))
