"""packaging/images/: the Containerfiles give what Istio's injection template expects of the proxy image, and
kubeplay.py turns an injected Pod into one podman kube play runs (static checks: nothing is built here)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from istio_agent.cni.install.options import InstallOptions
from istio_agent.config.proxyconfig import DEFAULTS
from istio_agent.envoy.bootstrap.render import DEFAULT_TEMPLATE_PATH
from istiod_local.controlplane.kubeapi.pods import PodMeta, render_pod
from istiod_local.controlplane.xds.registry import parse_registry

IMAGES = Path(__file__).resolve().parents[2] / "packaging" / "images"
PROXY = (IMAGES / "Containerfile.proxyv2").read_text()
CNI = (IMAGES / "Containerfile.install-cni").read_text()
META = PodMeta("11111111-2222-3333-4444-555555555555", "2026-12-01T12:00:00Z", "node-1", "10.89.77.1")


def _module(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, IMAGES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kubeplay = _module("kubeplay")
image_check = _module("image_check")


def _pods() -> dict[str, dict[str, Any]]:
    mesh = image_check.registry("10.89.77.11", "10.89.77.12", "10.89.77.14", "10.89.77.250")
    registry = parse_registry(json.dumps(mesh))
    return {w.name: render_pod(registry, w, META) for w in registry.workloads}


def _container(pod: dict[str, Any], name: str, kind: str = "containers") -> dict[str, Any]:
    return next(c for c in pod["spec"][kind] if c["name"] == name)


def test_proxy_image_has_the_entrypoint_user_and_paths_the_injected_pod_relies_on() -> None:
    pod = _pods()["echo-1"]
    proxy, init = _container(pod, "istio-proxy"), _container(pod, "istio-init", "initContainers")
    # The template gives args only: the image's entrypoint must be pilot-agent, for both containers.
    assert "command" not in proxy and proxy["args"][:2] == ["proxy", "sidecar"]
    assert "command" not in init and init["args"][0] == "istio-iptables"
    assert 'ENTRYPOINT ["/usr/local/bin/pilot-agent"]' in PROXY
    uid = proxy["securityContext"]["runAsUser"]
    assert uid == 1337 and proxy["securityContext"]["runAsGroup"] == 1337
    assert f"groupadd --gid {uid} istio-proxy" in PROXY and f"useradd --uid {uid} --gid {uid}" in PROXY
    owned = re.search(r"install -d -o 1337 -g 1337 -m 0755 ([^&]+)&&", PROXY)
    assert owned is not None
    dirs = owned.group(1).replace("\\", " ").split()
    mounts = {m["mountPath"] for m in proxy["volumeMounts"]}
    for path in ("/etc/istio/proxy", "/var/lib/istio/data"):
        assert path in mounts and path in dirs
    assert "/var/lib/istio/envoy" in dirs
    template = "/" + DEFAULT_TEMPLATE_PATH.removeprefix("./")
    assert template == "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
    assert f"/bootstrap/envoy_bootstrap.json {template}" in PROXY
    assert DEFAULTS["binaryPath"] == "/usr/local/bin/envoy"
    assert 'mv "$site/envoy/_bin/envoy" /usr/local/bin/envoy' in PROXY
    assert "iptables iproute2" in PROXY  # istio-init's istio-iptables
    for tool in ("pilot-agent", "istio-iptables"):
        assert tool in re.search(r"for tool in ([^;]+);", PROXY).group(1).split()  # type: ignore[union-attr]


def test_install_cni_image_installs_where_install_cni_copies_from_and_to() -> None:
    assert 'CMD ["/usr/local/bin/install-cni"]' in CNI
    assert "COPY packaging/images/install-cni-entry.sh /usr/local/bin/install-cni" in CNI
    entry = (IMAGES / "install-cni-entry.sh").read_text()
    # The runtime is copied into the bin dir install-cni writes the launcher to.
    assert "${ISTIO_CNI_RUNTIME_MOUNT:-/host/opt/cni/bin}" in entry
    assert InstallOptions().cni_bin_dir == "/host/opt/cni/bin"
    assert 'exec "$runtime/venv/bin/install-cni" "$@"' in entry
    portable = (IMAGES / "portable-python.sh").read_text()
    assert "patchelf --set-interpreter" in portable and "--force-rpath --set-rpath" in portable


def test_for_podman_resolves_what_podman_lacks_and_keeps_the_rest() -> None:
    pod = _pods()["echo-1"]
    before = json.dumps(pod, sort_keys=True)
    inputs = kubeplay.Inputs(
        pod_ip="10.89.77.12", host_dir="/run/check/echo-1", proxy_image="localhost/istio-agent/proxyv2:9",
        app_image="localhost/istio-agent/proxyv2:9", app_command=["sleep", "infinity"],
        tokens={"istio-ca": "ISTIO-TOKEN", "": "API-TOKEN"},
        config_maps={"istio-ca-root-cert": {"root-cert.pem": "ROOT"}, "kube-root-ca.crt": {"ca.crt": "ROOT"}},
        host_aliases={"istiod.istio-system.svc": "10.89.77.1"})
    plan = kubeplay.for_podman(pod, inputs)
    assert json.dumps(pod, sort_keys=True) == before  # the API's object is untouched
    spec = plan.pod["spec"]
    for container in spec["containers"] + spec["initContainers"]:
        assert container["image"] == "localhost/istio-agent/proxyv2:9"
        assert "ports" not in container
        for var in container.get("env", []):
            ref = (var.get("valueFrom") or {}).get("fieldRef")
            assert ref is None or kubeplay.podman_knows(ref["fieldPath"]), var
    env = {e["name"]: e.get("value") for e in _container(plan.pod, "istio-proxy")["env"]}
    assert env["INSTANCE_IP"] == "10.89.77.12" and env["POD_NAMESPACE"] == "default"
    assert env["SERVICE_ACCOUNT"] == "echo" and env["HOST_IP"] == "10.89.77.1"
    assert env["ISTIO_META_NODE_NAME"] == "node-1"
    kinds = {k for v in spec["volumes"] for k in v if k != "name"}
    assert kinds <= {"hostPath", "configMap"}, kinds
    assert _container(plan.pod, "app")["command"] == ["sleep", "infinity"]
    files = {path.removeprefix("/run/check/echo-1/"): content for path, (content, _) in plan.files.items()}
    assert files["istio-token/istio-token"] == "ISTIO-TOKEN"
    api = next(v["name"] for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
    assert files[f"{api}/token"] == "API-TOKEN" and files[f"{api}/namespace"] == "default"
    assert files[f"{api}/ca.crt"] == "ROOT"
    assert 'app="echo"' in files["istio-podinfo/labels"].splitlines()
    status = pod["metadata"]["annotations"]["sidecar.istio.io/status"]
    assert f"sidecar.istio.io/status={json.dumps(status)}" in files["istio-podinfo/annotations"].splitlines()
    assert "sidecar.istio.io/status" not in plan.pod["metadata"]["annotations"]  # over podman's 63 characters
    assert plan.dirs["/run/check/echo-1/istio-envoy"] == 0o777  # the kubelet's emptyDir mode
    assert spec["restartPolicy"] == "OnFailure"
    assert spec["hostAliases"] == [{"ip": "10.89.77.1", "hostnames": ["istiod.istio-system.svc"]}]
    assert [d["metadata"]["name"] for d in plan.documents] == ["istio-ca-root-cert"]
    assert "status" not in plan.pod
    assert any("status.podIP -> '10.89.77.12'" in line for line in plan.resolved)


def test_field_values_follow_the_kubelet_and_unknown_paths_are_refused() -> None:
    pod = _pods()["sleep-1"]
    assert kubeplay.field_value(pod, "status.podIP", "10.1.1.1") == "10.1.1.1"
    assert kubeplay.field_value(pod, "metadata.labels['app']", "") == "sleep"
    assert kubeplay.downward_text({"b": 'say "hi"', "a": "1"}) == 'a="1"\nb="say \\"hi\\""'
    assert kubeplay.podman_knows("metadata.name") and not kubeplay.podman_knows("status.podIP")
    with pytest.raises(ValueError, match=r"spec\.hostname"):
        kubeplay.field_value(pod, "spec.hostname", "")


def test_check_registry_gives_init_captured_pods_and_one_for_the_cni() -> None:
    pods = _pods()
    assert [c["name"] for c in pods["sleep-1"]["spec"]["initContainers"]] == ["istio-init"]
    assert [c["name"] for c in pods["echo-cni-1"]["spec"]["initContainers"]] == ["istio-validation"]
    assert pods["echo-1"]["status"]["podIP"] == "10.89.77.12"



def test_the_demo_app_is_bind_mounted_into_the_app_container_only() -> None:
    """The images carry the product only, so image_check gives the pods' app containers the echo app (stdlib
    only) as a read-only file from the host and runs it as a script."""
    pod = _pods()["echo-1"]
    inputs = kubeplay.Inputs(
        pod_ip="10.89.77.12", host_dir="/run/check/echo-1", proxy_image="localhost/istio-agent/proxyv2:9",
        app_image="localhost/istio-agent/proxyv2:9",
        app_command=[image_check.VENV_PYTHON, image_check.ECHO_APP_IN_POD, "serve"],
        tokens={"istio-ca": "ISTIO-TOKEN", "": "API-TOKEN"},
        config_maps={"istio-ca-root-cert": {"root-cert.pem": "ROOT"}, "kube-root-ca.crt": {"ca.crt": "ROOT"}},
        app_files={image_check.ECHO_APP_IN_POD: str(image_check.ECHO_APP)})
    plan = kubeplay.for_podman(pod, inputs)
    volume = next(v for v in plan.pod["spec"]["volumes"] if v["name"] == "app-file-0")
    assert volume["hostPath"] == {"path": str(image_check.ECHO_APP), "type": "File"}
    tree = ast.parse(image_check.ECHO_APP.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported  # runs on the image's Python alone
    assert {"name": "app-file-0", "mountPath": image_check.ECHO_APP_IN_POD, "readOnly": True} in \
        _container(plan.pod, "app")["volumeMounts"]
    for name in ("istio-proxy",):
        assert all(m["name"] != "app-file-0" for m in _container(plan.pod, name).get("volumeMounts", []))
    assert "istiod_local" not in " ".join(_container(plan.pod, "app")["command"])

def test_the_product_wheel_carries_the_product_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What build.sh puts in the images: the root project's wheel holds no `istiod_local`, names no console
    script of it, and requires none of the local environment's dependencies (aiohttp, rich, PyJWT).
    Built in-process by setuptools' PEP 517 backend from a copy of the product's sources."""
    from setuptools import build_meta

    root = IMAGES.parents[1]
    tree = tmp_path / "tree"
    shutil.copytree(root / "src" / "istio_agent", tree / "src" / "istio_agent",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(root / "pyproject.toml", tree / "pyproject.toml")
    monkeypatch.chdir(tree)
    wheel_name = build_meta.build_wheel(str(tmp_path / "dist"))
    with zipfile.ZipFile(tmp_path / "dist" / wheel_name) as wheel:
        names = wheel.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(f"{info}/METADATA").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert wheel_name.startswith("istio_agent-")
    assert {n.split("/")[0] for n in names} == {"istio_agent", info}
    assert "istio_agent/cni/install/assembly.py" in names and "istio_agent/kube/client.py" in names
    required = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    names_required = {re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower().replace("_", "-") for r in required}
    assert "lightkube" in names_required and "h11" in names_required
    assert not names_required & {"aiohttp", "rich", "pyjwt", "istiod-local", "prometheus-client"}, names_required
    scripts = [line for line in entry_points.splitlines() if "=" in line]
    assert {line.split("=")[0].strip() for line in scripts} == {
        "pilot-agent", "istio-iptables", "istio-cni", "install-cni"}
    assert all(line.split("=")[1].strip().startswith("istio_agent.") for line in scripts)
