"""The check's expectations from Istio config (bookinfo's classic tasks), how answers are judged, and the
pairwise probes' verdicts under AuthorizationPolicy and PeerAuthentication."""

from __future__ import annotations

from pathlib import Path

import pytest

from istiod_local.mesh import configcheck, expect, gatewaycheck
from istiod_local.mesh.configcheck import ConfigProbe, Want
from istiod_local.mesh.expect import DENIED, PLAINTEXT, REFUSED, UNKNOWN, Outcome
from istiod_local.mesh.planner import MeshPlan, plan_mesh
from istiod_local.mesh.runner import load_mesh

ROOT = Path(__file__).resolve().parents[2]
BOOKINFO = ROOT / "examples" / "bookinfo.yaml"


@pytest.fixture(scope="module")
def plan() -> MeshPlan:
    return plan_mesh(load_mesh(BOOKINFO, control_plane="istiod"), python="py")


def _derived(plan: MeshPlan) -> configcheck.Derived:
    derived = configcheck.derive(plan)
    gatewaycheck.gateway_probes(plan, derived)
    return derived


def _one(probes: list[ConfigProbe], *parts: str) -> ConfigProbe:
    found = [p for p in probes if all(x in f"{p.pod} {p.url} {p.via} {p.want.text} {p.source}" for x in parts)]
    assert len(found) == 1, (parts, found)
    return found[0]


def test_every_classic_task_becomes_probes(plan: MeshPlan) -> None:
    derived = _derived(plan)
    probes = derived.probes
    jason = _one(probes, "end-user: jason", "reviews v2", "reviews http[0]")
    assert jason.pod == "productpage-v1-1" and ("end-user", "jason") in jason.headers
    assert ("x-echo-next", "skip") in jason.headers and jason.count == 20
    assert jason.want.backends == (("reviews v2", frozenset({"reviews-v2-1"}), 1.0),)
    shift = _one(probes, "reviews v1 50%, reviews v3 50%")
    assert shift.count == 200 and [share for _, _, share in shift.want.backends] == [0.5, 0.5]
    timeout = _one(probes, "HTTP 504 (timeout 0.5 s)")
    assert ("x-echo-sleep", "1.5") in timeout.headers and timeout.want.status == 504
    abort = _one(probes, "HTTP 500 (fault abort)")
    assert abort.pod == "reviews-v2-1" and abort.want.status == 500  # ratings' caller
    delay = _one(probes, "details v1", "jason")
    assert delay.want.min_elapsed == 2.0 and delay.timeout >= 7.0
    assert _one(probes, "productpage v1", "productpage http[0]").pod == "sleep-1"
    allowed = _one(probes, "GET /ratings/x", "reviews-v2-1")
    assert allowed.want.status == 200 and allowed.url.endswith(":9080/ratings/x")
    assert _one(probes, "GET /ratings/x", "productpage-v1-1").want.status == 403
    assert _one(probes, "POST /", "sleep-1").want == Want("denied (403 RBAC)", 403)
    gateway = _one(probes, "from the host")
    assert (gateway.pod, gateway.url, gateway.hosts) == ("", "http://bookinfo.example.com:31380/productpage",
                                                          ("bookinfo.example.com",))
    assert gateway.want.backends == (("productpage", frozenset({"productpage-v1-1"}), 1.0),)
    assert any("DestinationRule default/details" in n and "connectionPool, outlierDetection" in n
               for n in derived.notes)
    assert any("istio-system/istio-ingressgateway" in n and "from the host" in n for n in derived.notes)


def test_the_pairwise_probes_follow_authorization_and_peer_authentication(plan: MeshPlan) -> None:
    probes = expect.probes(plan, {spec.name: f"10.244.0.{i + 2}" for i, spec in enumerate(plan.pods)})
    verdicts = {(p.pod, p.target.split(".")[0], p.via): expect.expect(plan, p) for p in probes}
    assert verdicts["sleep-1", "details", "DNS"].kind == DENIED
    assert verdicts["sleep-1", "productpage", "DNS"].identity.endswith("/sa/sleep")
    assert verdicts["reviews-v3-1", "ratings", "clusterIP"].identity.endswith("/sa/bookinfo-reviews")
    assert verdicts["productpage-v1-1", "ratings", "clusterIP"].kind == DENIED
    assert verdicts["legacy-1", "productpage-v1-1:8080", "pod IP"].kind == PLAINTEXT  # its own PERMISSIVE
    assert verdicts["legacy-1", "details-v1-1:8080", "pod IP"].kind == REFUSED  # the namespace's STRICT
    assert not [p for p in probes if "ingressgateway" in p.target]  # gateways are checked from the host


def test_an_unknown_outcome_never_holds_and_a_403_of_rbac_is_denied() -> None:
    assert not expect.holds(Outcome(UNKNOWN), Outcome(UNKNOWN))
    probe = expect.Probe("default/a", "a-1", "http", "http://x/", "x:80", "clusterIP")
    assert expect.observe(probe, {"answered": True, "status": 403, "text": "RBAC: access denied"}, None).kind == DENIED
    assert expect.observe(probe, {"answered": True, "status": 403, "text": "forbidden"}, None).kind == REFUSED


def _probe(want: Want) -> ConfigProbe:
    return ConfigProbe("VirtualService default/r http[0]", "default/c", "c-1", "http://r/", "r:80", "GET /", "GET",
                       (), 10, want)


def test_answers_are_judged_against_shares_statuses_and_delays() -> None:
    halves = Want("v1 50%, v3 50%", backends=(("v1", frozenset({"r-v1-1"}), 0.5), ("v3", frozenset({"r-v3-1"}), 0.5)))
    answers = [[200, "r-v1-1", 0.01, ""]] * 56 + [[200, "r-v3-1", 0.01, ""]] * 44
    observed, ok = configcheck.judge(_probe(halves), {"answered": True, "results": answers})
    assert ok and observed == "HTTP 200 x100: v1 56%, v3 44%"
    skewed = [[200, "r-v1-1", 0.01, ""]] * 70 + [[200, "r-v3-1", 0.01, ""]] * 30
    assert not configcheck.judge(_probe(halves), {"answered": True, "results": skewed})[1]
    stray = [*answers[:-1], [200, "r-v2-1", 0.01, ""]]
    observed, ok = configcheck.judge(_probe(halves), {"answered": True, "results": stray})
    assert not ok and "others r-v2-1" in observed
    denied = Want("denied", 403)
    assert configcheck.judge(_probe(denied), {"answered": True, "results": [[403, "", 0.0, "RBAC: access denied"]]})[1]
    observed, ok = configcheck.judge(_probe(denied), {"answered": True, "results": [[403, "", 0.0, "nope"]]})
    assert not ok and "not RBAC's" in observed
    slow = Want("≥ 2 s", min_elapsed=2.0)
    assert configcheck.judge(_probe(slow), {"answered": True, "results": [[200, "r-1", 2.004, ""]] * 2})[1]
    assert not configcheck.judge(_probe(slow), {"answered": True, "results": [[200, "r-1", 1.9, ""]] * 2})[1]
    some = Want("HTTP 500 25%", 500, 0.25)
    mixed = [[500, "", 0.0, "fault filter abort"]] * 27 + [[200, "r-1", 0.0, ""]] * 73
    assert configcheck.judge(_probe(some), {"answered": True, "results": mixed})[1]
    assert configcheck.judge(_probe(some), {"answered": False, "error": "boom"}) == ("no answer: boom", False)
