"""WasmPlugins in a mesh file's Istio config: one YAML for both control planes.

For istiod-local: what of a spec it serves, the registry entry it becomes (valid as the registry parses it),
refusals by name and at the resource's file, line and `spec.` field. For the real istiod: the
TrafficExtension its cluster translation makes (its file source makes none), the registry's plugins
translated, a user's plugin replacing the registry's. And the node's module server: a plugin naming it must
name a module the mesh serves. The default example carries one, and its check is the same with it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from istiod_local.controlplane.xds.registry import parse_registry
from istiod_local.controlplane.xds.yamlfields import RegistryError
from istiod_local.mesh import configcheck, expect
from istiod_local.mesh.istioconfig import parse_resources, refusal
from istiod_local.mesh.istiofiles import read_istio_config
from istiod_local.mesh.model import IstioResource
from istiod_local.mesh.parser import parse_mesh
from istiod_local.mesh.planner import plan_mesh, registry_document
from istiod_local.mesh.runner import MeshFileError, load_mesh
from istiod_local.mesh.wasmfiles import base_url
from istiod_local.mesh.wasmplugins import check_embedded, embedded_problem, registry_entries, selected, unserved
from istiod_local.node.istiod_config import as_istiod_reads, istio_config, traffic_extension, untranslated
from istiod_local.node.plan import PodPlan, plan_node, plan_pod

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mesh.yaml"
PLUGIN = """\
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: add-header, namespace: secure}
spec:
  selector: {matchLabels: {app: ratings}}
  url: http://10.244.0.1:15080/add-header.wasm
  sha256: 2b9d3e1d7c0e5ab5d1c6c0e8a7d7f1f4f9cd0f1a4ab4a2d1e0fa9b8c7d6e5f40
  imagePullPolicy: Always
  pluginConfig: {greeting: hello, count: 2}
  phase: STATS
  priority: 5
  failStrategy: FAIL_OPEN
  match: [{mode: SERVER}]
"""


def _plugin(text: str = PLUGIN, namespaces: tuple[str, ...] = ("default", "secure")) -> IstioResource:
    (resource,) = parse_resources(text, "wasm/p.yaml", namespaces)
    return resource


def test_a_wasm_plugin_becomes_the_registry_entry_istiod_local_serves() -> None:
    resource = _plugin()
    assert embedded_problem(resource) == "" and refusal([resource]) == ""
    (entry,) = registry_entries([resource])
    assert entry == {"name": "add-header", "namespace": "secure", "selector": {"app": "ratings"},
                     "url": "http://10.244.0.1:15080/add-header.wasm",
                     "sha256": "2b9d3e1d7c0e5ab5d1c6c0e8a7d7f1f4f9cd0f1a4ab4a2d1e0fa9b8c7d6e5f40",
                     "imagePullPolicy": "Always", "pluginConfig": {"greeting": "hello", "count": 2}, "phase": "STATS",
                     "priority": 5, "failStrategy": "FAIL_OPEN", "match": [{"mode": "SERVER"}]}
    (plugin,) = parse_registry(yaml.safe_dump({"wasmPlugins": [entry]})).wasm_plugins
    assert (plugin.selector, plugin.fail_strategy, plugin.modes, plugin.priority) == \
        ({"app": "ratings"}, "FAIL_OPEN", ("SERVER",), 5)


@pytest.mark.parametrize(("extra", "reason"), [
    ("  vmConfig: {env: [{name: A, value: b}]}\n", "WasmPlugin with vmConfig"),
    ("  targetRefs: [{kind: Service, name: ratings}]\n", "WasmPlugin with targetRefs"),
    ("  type: NETWORK\n", "WasmPlugin of a type other than HTTP"),
])
def test_what_istiod_local_does_not_serve_is_refused_by_name(extra: str, reason: str) -> None:
    resource = _plugin(PLUGIN + extra)
    assert embedded_problem(resource) == reason
    assert reason in refusal([resource]) and "--control-plane istiod" in refusal([resource])
    assert registry_entries([resource]) == []
    ports = _plugin(PLUGIN.replace("[{mode: SERVER}]", "[{mode: SERVER, ports: [{number: 8080}]}]"))
    assert embedded_problem(ports) == "WasmPlugin with match ports"


@pytest.mark.parametrize(("change", "field"), [
    (("phase: STATS", "phase: LATE"), "spec.phase"),
    (("sha256: 2b9d", "sha256: zz9d"), "spec.sha256"),
    (("{greeting: hello, count: 2}", "[a, b]"), "spec.pluginConfig"),
    (("{matchLabels: {app: ratings}}", "{matchLabels: [app]}"), "spec.selector.matchLabels"),
    (("  url: http://10.244.0.1:15080/add-header.wasm\n", ""), "spec.url"),
])
def test_a_value_the_registry_refuses_names_the_resources_file_line_and_field(change: tuple[str, str],
                                                                             field: str) -> None:
    resource = _plugin(PLUGIN.replace(*change))
    with pytest.raises(RegistryError) as caught:
        check_embedded([resource])
    assert (caught.value.source, caught.value.line, caught.value.field) == ("wasm/p.yaml", 1, field)
    assert "WasmPlugin secure/add-header" in str(caught.value)
    assert registry_entries([resource]) == []


def test_selected_deployments_follow_the_namespace_and_the_root_namespace() -> None:
    mesh = parse_mesh(EXAMPLE.read_text(), str(EXAMPLE))
    assert [d.name for d in selected(mesh, _plugin())] == ["ratings"]
    everywhere = _plugin(PLUGIN.replace("namespace: secure", "namespace: istio-system")
                         .replace("  selector: {matchLabels: {app: ratings}}\n", ""))
    assert {d.name for d in selected(mesh, everywhere)} == \
        {d.name for d in mesh.deployments if d.mode == "sidecar"}, "no proxyless pod, no pod outside the mesh"


def test_a_plugin_naming_the_node_server_must_name_a_served_module() -> None:
    base = base_url("10.244.0.1")
    assert base == "http://10.244.0.1:15080/"
    assert unserved([_plugin()], base, ["add-header.wasm"]) == []
    (problem,) = unserved([_plugin()], base, ["other.wasm"])
    assert problem.startswith("wasm/p.yaml:1: WasmPlugin secure/add-header: spec.url: ") and "other.wasm" in problem
    elsewhere = _plugin(PLUGIN.replace("http://10.244.0.1:15080/", "oci://registry.example/wasm/"))
    assert unserved([elsewhere], base, []) == [], "a module from elsewhere is not the node's to check"


def test_load_mesh_checks_plugins_against_the_served_modules_and_the_embedded_control_plane(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "mesh.yaml")
    shutil.copytree(ROOT / "examples" / "wasm", tmp_path / "wasm")
    mesh = load_mesh(tmp_path / "mesh.yaml", gateway="10.244.0.1")
    assert [r.key for r in mesh.istio_config] == ["WasmPlugin secure/add-header"]
    assert mesh.wasm_modules == ("wasm/add-header.wat",)
    assert load_mesh(tmp_path / "mesh.yaml", gateway="10.244.0.1", control_plane="istiod") == mesh
    # another pod CIDR: the URL names another address, which is not the node's server
    assert load_mesh(tmp_path / "mesh.yaml", gateway="10.245.0.1").istio_config
    plugin_file = tmp_path / "wasm" / "add-header.yaml"
    plugin_file.write_text(plugin_file.read_text().replace("add-header.wasm", "add-headr.wasm"))
    with pytest.raises(MeshFileError, match=r"wasm/add-header.yaml:\d+: WasmPlugin secure/add-header: spec.url"):
        load_mesh(tmp_path / "mesh.yaml", gateway="10.244.0.1")
    plugin_file.write_text(plugin_file.read_text().replace("add-headr.wasm", "add-header.wasm")
                           .replace("phase: STATS", "phase: LAST"))
    with pytest.raises(MeshFileError, match=r"spec\.phase"):
        load_mesh(tmp_path / "mesh.yaml")
    assert load_mesh(tmp_path / "mesh.yaml", control_plane="istiod").istio_config, "istiod validates it itself"


def test_the_default_example_serves_its_plugin_and_checks_its_header_as_without_it() -> None:
    bare = parse_mesh(EXAMPLE.read_text(), str(EXAMPLE))
    full = read_istio_config(EXAMPLE, bare)
    plan, plain = plan_mesh(full, python="py"), plan_mesh(bare, python="py")
    node, pods = plan_node(1), list[PodPlan]()
    for spec in plan.pods:
        pods.append(plan_pod(node, spec, pods))
    registry = parse_registry(yaml.safe_dump(registry_document(plan, pods)))
    (plugin,) = registry.wasm_plugins
    assert (plugin.namespace, plugin.name, plugin.selector, plugin.modes) == \
        ("secure", "add-header", {"app": "ratings"}, ("SERVER",))
    ips = {p.name: p.ip for p in pods}
    probes = expect.probes(plan, ips)
    for probe in probes:  # the plugin changes no verdict; only the declared header joins sleep's calls to ratings
        with_plugin, without = expect.expect(plan, probe), expect.expect(plain, probe)
        assert (with_plugin.kind, with_plugin.identity) == (without.kind, without.identity), probe
        header = probe.pod == "sleep-1" and probe.service == "secure/ratings"
        assert with_plugin.headers == ((("x-wasm-plugin", "add-header"),) if header else ()), probe
    assert sum(bool(expect.expect(plan, p).headers) for p in probes) == 2  # by clusterIP and by name
    derived = configcheck.derive(plan)
    assert derived.probes == [] and derived.notes == [], "the header expectation checks the plugin"
    unchecked = plan_mesh(read_istio_config(EXAMPLE, parse_mesh(EXAMPLE.read_text().split("\nexpectations:")[0]
                                                                 + "\nistioConfig: [wasm/add-header.yaml]\n",
                                                                 str(EXAMPLE))), python="py")
    assert configcheck.derive(unchecked).notes == \
        ["WasmPlugin secure/add-header (examples/wasm/add-header.yaml:11): applied, not checked"]


def _doc(resource: IstioResource) -> dict[str, Any]:
    return dict(resource.document)


def test_the_real_istiod_is_given_the_traffic_extension_its_cluster_translation_makes() -> None:
    extension = traffic_extension(_doc(_plugin(PLUGIN + "  targetRef: {kind: Service, name: ratings}\n")))
    assert extension["apiVersion"] == "extensions.istio.io/v1alpha1" and extension["kind"] == "TrafficExtension"
    assert extension["metadata"] == {"name": "add-header~istio-translated-wasmplugin", "namespace": "secure"}
    assert extension["spec"] == {
        "selector": {"matchLabels": {"app": "ratings"}}, "phase": "STATS", "priority": 5,
        "match": [{"mode": "SERVER"}], "targetRefs": [{"kind": "Service", "name": "ratings"}],
        "wasm": {"url": "http://10.244.0.1:15080/add-header.wasm",
                 "sha256": "2b9d3e1d7c0e5ab5d1c6c0e8a7d7f1f4f9cd0f1a4ab4a2d1e0fa9b8c7d6e5f40",
                 "imagePullPolicy": "Always", "pluginConfig": {"greeting": "hello", "count": 2},
                 "failStrategy": "FAIL_OPEN"}}
    unspecified = traffic_extension(_doc(_plugin(PLUGIN.replace("phase: STATS", "phase: UNSPECIFIED_PHASE"))))
    assert unspecified["spec"]["phase"] == "UNSPECIFIED"
    typo = traffic_extension(_doc(_plugin(PLUGIN + "  pluginConfg: {a: b}\n")))
    assert typo["spec"]["pluginConfg"] == {"a": "b"}, "kept where istiod's validation names it"
    vs = {"kind": "VirtualService", "metadata": {"name": "x"}}
    assert as_istiod_reads(vs) is vs and as_istiod_reads(_doc(_plugin()))["kind"] == "TrafficExtension"


def test_the_registrys_plugins_reach_the_real_istiod_unless_the_user_gives_the_same() -> None:
    registry = parse_registry("wasmPlugins:\n"
                              "- {name: add-header, namespace: secure, selector: {app: ratings}, phase: STATS,\n"
                              "   url: 'http://10.244.0.1:15080/add-header.wasm', match: [{mode: SERVER}]}\n"
                              "- {name: global, namespace: istio-system, url: 'oci://registry.example/g:v1'}\n")
    assert untranslated(registry) == []
    extensions = [d for d in istio_config(registry) if d["kind"] == "TrafficExtension"]
    assert [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in extensions] == \
        [("secure", "add-header~istio-translated-wasmplugin"), ("istio-system", "global~istio-translated-wasmplugin")]
    assert extensions[0]["spec"] == {"selector": {"matchLabels": {"app": "ratings"}}, "phase": "STATS",
                                     "match": [{"mode": "SERVER"}],
                                     "wasm": {"url": "http://10.244.0.1:15080/add-header.wasm",
                                              "failStrategy": "FAIL_CLOSE"}}
    mine = traffic_extension(_doc(_plugin()))
    for user in (_doc(_plugin()), mine):  # as written, or as istiod reads it: the user's stands
        left = [d["metadata"]["name"] for d in istio_config(registry, [user]) if d["kind"] == "TrafficExtension"]
        assert left == ["global~istio-translated-wasmplugin"]
    secrets = parse_registry("wasmPullSecrets: [{name: creds, namespace: default, dockerconfigjson: '{}'}]\n")
    assert untranslated(secrets) == ["wasmPullSecrets (istiod reads pull secrets from the Kubernetes API)"]
