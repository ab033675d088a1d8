"""A deployment's `agent:` (ours or upstream's Go pilot-agent): the file, the mixed example, the plan, the check's
table and the refusal when upstream's agent is not installed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from istiod_local.controlplane.xds.yamlfields import RegistryError
from istiod_local.mesh import expect
from istiod_local.mesh.expect import MTLS, Outcome, Row
from istiod_local.mesh.istiofiles import read_istio_config
from istiod_local.mesh.parser import parse_mesh
from istiod_local.mesh.planner import plan_mesh
from istiod_local.mesh.runner import MeshFileError, load_mesh
from istiod_local.node.upstream import TEMPLATE_NAME, UpstreamCommands

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEFAULT = EXAMPLES / "mesh.yaml"
MIXED = EXAMPLES / "mesh-mixed.yaml"


def test_agent_defaults_to_ours_and_names_upstreams() -> None:
    mesh = parse_mesh("deployments:\n- name: a\n- name: b\n  agent: upstream\n- name: c\n  agent: istio-agent\n")
    assert [d.agent for d in mesh.deployments] == ["istio-agent", "upstream", "istio-agent"]
    specs = plan_mesh(mesh, python="py").pods
    assert [s.agent_implementation for s in specs] == ["istio-agent", "upstream", "istio-agent"]


@pytest.mark.parametrize(("text", "words"), [
    ("deployments:\n- name: a\n  agent: go\n", "must be one of istio-agent, upstream, got 'go'"),
    ("deployments:\n- name: a\n  mode: none\n  agent: upstream\n", "outside the mesh (mode: none) runs no agent"),
])
def test_a_bad_agent_names_its_line_and_field(text: str, words: str) -> None:
    with pytest.raises(RegistryError) as caught:
        parse_mesh(text, "mesh.yaml")
    assert (caught.value.line, caught.value.field) == (3 if "go" in text else 4, "deployments[0].agent")
    assert words in str(caught.value)


def test_the_mixed_example_is_the_default_mesh_with_half_its_meshed_deployments_on_upstreams_agent() -> None:
    default, mixed = parse_mesh(DEFAULT.read_text()), parse_mesh(MIXED.read_text())
    ours = dataclasses.replace(mixed, deployments=tuple(dataclasses.replace(d, agent="istio-agent")
                                                        for d in mixed.deployments))
    assert ours == default
    meshed = [d for d in mixed.deployments if d.mode != "none"]
    upstream = [d for d in meshed if d.agent == "upstream"]
    assert len(upstream) * 2 == len(meshed)
    # every kind of hop crosses: sidecar and proxyless servers of each implementation
    assert {(d.mode, d.agent) for d in meshed} == {("sidecar", "istio-agent"), ("sidecar", "upstream"),
                                                  ("proxyless", "istio-agent"), ("proxyless", "upstream")}


def test_the_check_table_says_whose_agents_each_probe_went_between_only_when_the_mesh_mixes_them() -> None:
    mixed = plan_mesh(parse_mesh(MIXED.read_text()), python="py")
    ips = {spec.name: f"10.244.0.{i + 2}" for i, spec in enumerate(mixed.pods)}
    probes = expect.probes(mixed, ips)
    by_target = {(p.pod, p.target, p.via): p for p in probes}
    assert expect.agents(mixed, by_target["sleep-1", "frontend.default.svc.cluster.local:80", "DNS"]) == \
        "istio-agent→upstream"
    assert expect.agents(mixed, by_target["frontend-1", "reviews.default.svc.cluster.local:9080", "DNS"]) == \
        "upstream→istio-agent+upstream"
    assert expect.agents(mixed, by_target["legacy-1", "tcp-echo-1:9000", "pod IP"]) == "none→upstream"
    assert expect.agents(mixed, by_target["sleep-1", "legacy.example.internal:80", "DNS"]) == "istio-agent→none"
    row = Row(probes[0], Outcome(MTLS), Outcome(MTLS))
    assert expect.table([row], mixed).splitlines()[0].split() == \
        ["client", "target", "via", "agents", "expected", "observed", "ok"]
    default = plan_mesh(parse_mesh(DEFAULT.read_text()), python="py")
    assert expect.table([row], default).splitlines()[0].split() == \
        ["client", "target", "via", "expected", "observed", "ok"]


def test_up_refuses_upstreams_agent_when_it_is_not_installed_naming_the_deployments(tmp_path: Path) -> None:
    missing = UpstreamCommands(tmp_path / "bin")
    with pytest.raises(MeshFileError) as caught:
        load_mesh(MIXED, missing)
    text = str(caught.value)
    assert "frontend, reviews-v2, tcp-echo, greeter ask for agent: upstream" in text, text
    assert "pilot-agent" in text and "make upstream" in text and "ISTIO_UPSTREAM_BIN" in text, text
    assert load_mesh(DEFAULT, missing).deployments  # a mesh of ours alone needs nothing of upstream's
    # installed: the binary and the template beside it
    (tmp_path / "bin").mkdir()
    agent = tmp_path / "bin" / "pilot-agent"
    agent.write_text("")
    agent.chmod(0o755)
    with pytest.raises(MeshFileError, match=TEMPLATE_NAME):
        load_mesh(MIXED, missing)
    (tmp_path / "share").mkdir()
    (tmp_path / "share" / TEMPLATE_NAME).write_text("{}")
    assert load_mesh(MIXED, missing) == read_istio_config(MIXED, parse_mesh(MIXED.read_text(), str(MIXED)))
