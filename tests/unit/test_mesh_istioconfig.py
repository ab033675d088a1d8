"""Istio config files named by a mesh file: read as Istio resources, refused with file and line, and refused by
name on the embedded control plane (pointing at the real istiod)."""

from __future__ import annotations

from pathlib import Path

import pytest

from istiod_local.controlplane.xds.yamlfields import RegistryError
from istiod_local.mesh import expect
from istiod_local.mesh.istioconfig import check_unique, parse_resources, refusal, unsupported
from istiod_local.mesh.istiofiles import IstioFilesError, config_files, files_signature, read_istio_config
from istiod_local.mesh.parser import parse_mesh
from istiod_local.mesh.planner import plan_mesh, registry_document
from istiod_local.mesh.runner import MeshFileError, load_mesh

ROOT = Path(__file__).resolve().parents[2]
BOOKINFO = ROOT / "examples" / "bookinfo.yaml"
VS = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews}
spec:
  hosts: [reviews]
  http: [{route: [{destination: {host: reviews, subset: v1}}]}]
"""


def test_documents_become_resources_with_their_place_and_namespace() -> None:
    text = VS + "---\n---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\n" \
        "metadata: {name: default, namespace: secure}\nspec: {mtls: {mode: STRICT}}\n"
    vs, pa = parse_resources(text, "istio/a.yaml", ["default", "secure"])
    assert (vs.kind, vs.namespace, vs.name, vs.source) == ("VirtualService", "default", "reviews", "istio/a.yaml:1")
    assert vs.document["metadata"]["namespace"] == "default"  # as kubectl apply puts it
    assert vs.spec["hosts"] == ["reviews"] and vs.key == "VirtualService default/reviews"
    assert (pa.namespace, pa.source, pa.spec["mtls"]["mode"]) == ("secure", "istio/a.yaml:9", "STRICT")
    # the root namespace is always there
    assert parse_resources(VS.replace("{name: reviews}", "{name: r, namespace: istio-system}"), "a", [])


@pytest.mark.parametrize(("change", "problem"), [
    (("kind: VirtualService", "kind: VirtualServce"), "a:2: kind: not an Istio kind istiod reads from files"),
    (("networking.istio.io/v1", "networking.istio.io/v2"),
     "a:1: apiVersion: VirtualService is networking.istio.io/v1 or networking.istio.io/v1beta1 or"),
    (("{name: reviews}", "{namespace: default}"), "a:3: metadata.name: a VirtualService needs a name"),
    (("{name: reviews}", "{name: reviews, namespace: prod}"),
     "a:3: metadata.namespace: namespace 'prod' is not declared in the mesh file"),
    (("spec:\n", "spec: 3\nx:\n"), "a:4: spec: must be a mapping"),
])
def test_a_refused_document_names_its_file_line_and_field(change: tuple[str, str], problem: str) -> None:
    with pytest.raises(RegistryError) as caught:
        parse_resources(VS.replace(*change), "a", ["default"])
    assert str(caught.value).startswith(problem), caught.value


def test_a_prometheus_telemetry_is_refused_and_duplicates_name_both_places() -> None:
    telemetry = ("apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: m}\n"
                 "spec: {metrics: [{providers: [{name: prometheus}]}]}\n")
    with pytest.raises(RegistryError, match="a stock Envoy NACKs"):
        parse_resources(telemetry, "t.yaml", ["default"])
    assert parse_resources(telemetry.replace("prometheus", "envoy"), "t.yaml", ["default"])
    twice = parse_resources(VS, "a.yaml", ["default"]) + parse_resources(VS, "b.yaml", ["default"])
    with pytest.raises(RegistryError, match=r"b.yaml:1: .*VirtualService default/reviews is already defined at a"):
        check_unique(twice)


def test_the_embedded_control_plane_refuses_every_kind_it_does_not_apply_by_name() -> None:
    resources = read_istio_config(BOOKINFO, parse_mesh(BOOKINFO.read_text(), str(BOOKINFO))).istio_config
    found = unsupported(resources)
    assert set(found) == {"VirtualService", "DestinationRule", "Gateway", "AuthorizationPolicy",
                          "PeerAuthentication with a selector or portLevelMtls"}
    assert any("reviews (" in where and "routing.yaml:" in where for where in found["VirtualService"])
    # a namespace-wide PeerAuthentication is the one kind it applies
    assert "PeerAuthentication default/default" not in str(found)
    message = refusal(resources)
    assert message.startswith("the embedded control plane (istiod-local) does not apply ")
    assert message.endswith("Run `istiod-local up --control-plane istiod` to have the real istiod apply them")
    with pytest.raises(MeshFileError) as caught:
        load_mesh(BOOKINFO)
    for named in ("VirtualService:", "DestinationRule:", "Gateway:", "AuthorizationPolicy:",
                  "gateway deployments (istio-ingressgateway)", "--control-plane istiod"):
        assert named in str(caught.value), caught.value
    mesh = load_mesh(BOOKINFO, control_plane="istiod")
    assert len(mesh.istio_config) == 17 and mesh.istio_config_paths == ("istio/",)


def test_files_and_directories_relative_to_the_mesh_file(tmp_path: Path) -> None:
    (tmp_path / "cfg" / "sub").mkdir(parents=True)
    (tmp_path / "cfg" / "b.yaml").write_text(VS)
    (tmp_path / "cfg" / "sub" / "a.yml").write_text(VS.replace("name: reviews}", "name: other}"))
    (tmp_path / "cfg" / "notes.txt").write_text("not config")
    (tmp_path / "one.yaml").write_text(VS.replace("name: reviews}", "name: third}"))
    mesh_file = tmp_path / "mesh.yaml"
    mesh_file.write_text("istioConfig: [cfg, one.yaml]\n")
    assert [p.name for p in config_files(mesh_file, ("cfg", "one.yaml"))] == ["b.yaml", "a.yml", "one.yaml"]
    mesh = read_istio_config(mesh_file, parse_mesh(mesh_file.read_text()))
    assert [r.name for r in mesh.istio_config] == ["reviews", "other", "third"]
    before = files_signature(mesh_file, mesh.istio_config_paths)
    (tmp_path / "cfg" / "sub" / "new.yaml").write_text(VS.replace("name: reviews}", "name: fourth}"))
    assert files_signature(mesh_file, mesh.istio_config_paths) != before  # a new file is an edit
    mesh_file.write_text("istioConfig: [missing/]\n")
    with pytest.raises(IstioFilesError, match="istioConfig: 'missing/': no such file or directory"):
        read_istio_config(mesh_file, parse_mesh(mesh_file.read_text()))
    (tmp_path / "cfg" / "b.yaml").write_text(VS + "---\n- a list\n")
    mesh_file.write_text("istioConfig: [cfg]\n")
    with pytest.raises(IstioFilesError, match=r"b.yaml:8: an Istio resource must be a mapping"):
        read_istio_config(mesh_file, parse_mesh(mesh_file.read_text()))


def test_the_embedded_control_plane_applies_namespace_wide_peer_authentication(tmp_path: Path) -> None:
    (tmp_path / "pa.yaml").write_text("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\n"
                                      "metadata: {name: default, namespace: istio-system}\n"
                                      "spec: {mtls: {mode: STRICT}}\n")
    mesh_file = tmp_path / "mesh.yaml"
    mesh_file.write_text("istioConfig: [pa.yaml]\nnamespaces: [{name: open, peerAuthentication: PERMISSIVE}]\n"
                         "services:\n- {name: web, ports: [{port: 80, targetPort: 8080, protocol: HTTP}]}\n"
                         "deployments:\n- {name: web, app: {kind: http-echo, port: 8080}}\n- {name: out, mode: none}\n")
    mesh = load_mesh(mesh_file)  # the default control plane: accepted
    plan = plan_mesh(mesh, python="py")
    # mesh-wide STRICT for the namespaces the file leaves alone, the file's own mode where it says one
    assert registry_document(plan, [])["peerAuthentication"] == {"open": "PERMISSIVE", "default": "STRICT"}
    (probe,) = [p for p in expect.probes(plan, {"web-1": "10.244.0.2", "out-1": "10.244.0.3"}) if p.pod == "out-1"]
    assert expect.expect(plan, probe).kind == "refused"
