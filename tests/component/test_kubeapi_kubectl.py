"""kubectl against istiod-local's Kubernetes API: discovery, tables, -o json, -w, label, delete; bookmarks on a
raw watch; the kubeconfig and service-account files `istiod-local kubeconfig` writes."""

from __future__ import annotations

import base64
import http.client
import json
import os
import queue
import socket
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from launchers import IstiodLocal, RegistryFile, istiod_local_cli
from needs import need_tool
from support import poll, stop_process

MESH = {
    "workloads": [
        {"name": "echo-1", "namespace": "default", "labels": {"app": "echo"}, "ip": "10.244.0.5",
         "nodeName": "iacni-node"},
        {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}, "ip": "10.244.0.6", "nodeName": "iacni-node"},
    ],
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[IstiodLocal, Path, Path]]:
    base = tmp_path_factory.mktemp("kubectl")
    registry = RegistryFile(base / "mesh.yaml", MESH)
    with IstiodLocal(base / "state", registry=registry, kube_api_addr="127.0.0.1:0",
                     args=["--kube-bookmark-interval", "200ms"]) as istiod:
        yield istiod, istiod.kubeconfig(base / "admin.kubeconfig"), base


def _kubectl(api: tuple[IstiodLocal, Path, Path], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    kubectl = need_tool("kubectl")
    _, kubeconfig, base = api
    done = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "--cache-dir", str(base / "cache"), *args],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "HOME": str(base)})
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done


def test_kubectl_get_pods_namespaces_and_one_pod_as_json(api: tuple[IstiodLocal, Path, Path]) -> None:
    table = _kubectl(api, "get", "pods", "-A").stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    rows = {tuple(line.split()[:4]) for line in table[1:]}
    assert rows == {("default", "echo-1", "2/2", "Running"), ("shop", "web-1", "2/2", "Running")}
    wide = _kubectl(api, "get", "pods", "-n", "shop", "-o", "wide").stdout.splitlines()
    assert wide[1].split()[5:7] == ["10.244.0.6", "iacni-node"]
    namespaces = {line.split()[0] for line in _kubectl(api, "get", "ns").stdout.splitlines()[1:]}
    assert namespaces == {"default", "istio-system", "kube-system", "shop"}
    pod = json.loads(_kubectl(api, "get", "pod", "web-1", "-n", "shop", "-o", "json").stdout)
    assert pod["kind"] == "Pod" and pod["metadata"]["namespace"] == "shop"
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "istio-proxy"]
    listed = json.loads(_kubectl(api, "get", "pods", "-A", "-o", "json").stdout)
    assert {p["metadata"]["name"] for p in listed["items"]} == {"echo-1", "web-1"}
    described = _kubectl(api, "describe", "pod", "web-1", "-n", "shop").stdout
    assert "iacni-node/127.0.0.1" in described and "istio-validation:" in described
    missing = _kubectl(api, "get", "pod", "nope", check=False)
    assert missing.returncode != 0 and 'pods "nope" not found' in missing.stderr


def test_kubectl_watch_label_and_delete(api: tuple[IstiodLocal, Path, Path]) -> None:
    kubectl = need_tool("kubectl")
    _, kubeconfig, base = api
    watch = subprocess.Popen([kubectl, "--kubeconfig", str(kubeconfig), "--cache-dir", str(base / "cache"), "get",
                              "pods", "-w", "-n", "default", "--output-watch-events"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HOME": str(base)})
    lines: queue.Queue[str] = queue.Queue()
    assert watch.stdout is not None
    def pump() -> None:
        for text in watch.stdout or ():
            lines.put(text)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    def line() -> list[str]:
        try:
            return lines.get(timeout=15).split()
        except queue.Empty:
            raise AssertionError(f"kubectl get -w printed nothing more (exit status {watch.poll()})") from None

    try:
        assert line()[:3] == ["EVENT", "NAME", "READY"]
        assert line()[:2] == ["ADDED", "echo-1"]
        assert "labeled" in _kubectl(api, "label", "pod", "echo-1", "repair=done").stdout
        assert line()[:2] == ["MODIFIED", "echo-1"]
        pod = json.loads(_kubectl(api, "get", "pod", "echo-1", "-o", "json").stdout)
        assert pod["metadata"]["labels"]["repair"] == "done"
        assert 'pod "echo-1" deleted' in _kubectl(api, "delete", "pod", "echo-1").stdout
        assert line()[:2] == ["DELETED", "echo-1"]
    finally:
        stop_process(watch, 5)
        reader.join(5)
        if watch.stdout is not None:
            watch.stdout.close()
        if watch.stderr is not None:
            watch.stderr.close()
    assert "echo-1" not in _kubectl(api, "get", "pods", "-A").stdout


def test_kubectl_watch_namespaces_sees_one_the_registry_adds(tmp_path: Path) -> None:
    """`kubectl get ns -w`: an ADDED event per namespace there is, then one for a namespace the registry gains."""
    kubectl = need_tool("kubectl")
    registry = RegistryFile(tmp_path / "mesh.yaml", MESH)
    with IstiodLocal(tmp_path / "state", registry=registry, kube_api_addr="127.0.0.1:0") as istiod:
        kubeconfig = istiod.kubeconfig(tmp_path / "admin.kubeconfig")
        watch = subprocess.Popen([kubectl, "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                                  "get", "ns", "-w", "--output-watch-events"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "HOME": str(tmp_path)})
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for text in watch.stdout or ():
                lines.put(text)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()

        def line() -> list[str]:
            try:
                return lines.get(timeout=15).split()
            except queue.Empty:
                raise AssertionError(f"kubectl get ns -w printed nothing more (exit status {watch.poll()})") from None

        try:
            assert line()[:3] == ["EVENT", "NAME", "STATUS"]
            first = {tuple(line()[:3]) for _ in range(4)}
            assert first == {("ADDED", ns, "Active") for ns in ("default", "istio-system", "kube-system", "shop")}
            registry.write({"workloads": [*MESH["workloads"], {"name": "late-1", "namespace": "late",
                                                               "ip": "10.244.0.9", "nodeName": "iacni-node"}]})
            assert line()[:3] == ["ADDED", "late", "Active"]
        finally:
            stop_process(watch, 5)
            reader.join(5)
            for stream in (watch.stdout, watch.stderr):
                if stream is not None:
                    stream.close()


def test_kubectl_shows_a_bad_field_selector_as_against_an_apiserver(api: tuple[IstiodLocal, Path, Path]) -> None:
    """The server says only `field label not supported: ...`, as the apiserver does: the `Unable to find ...`
    around it is kubectl's own (cli-runtime's list helper decorates a 400 of a selected list)."""
    done = _kubectl(api, "get", "pods", "--field-selector", "spec.foo=bar", check=False)
    assert done.returncode != 0
    # Older kubectl prints the resource as {"" "v1" "pods"}, newer as "/v1, Resource=pods".
    assert done.stderr.startswith("Error from server (BadRequest): Unable to find ")
    assert done.stderr.rstrip().endswith(' that match label selector "", field selector "spec.foo=bar": field label '
                                         "not supported: spec.foo")
    assert done.stderr.count("Unable to find") == 1


def _watch_lines(istiod: IstiodLocal, sa: Path, query: str) -> list[dict[str, Any]]:
    host, port = istiod.kube_api.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), timeout=10,
                                       context=ssl.create_default_context(cafile=str(sa / "ca.crt")))
    try:
        conn.request("GET", f"/api/v1/pods?watch=true&{query}",
                     headers={"Authorization": f"Bearer {(sa / 'token').read_text()}"})
        response = conn.getresponse()
        assert response.status == 200
        return [json.loads(line) for line in response.read().splitlines() if line.strip()]
    finally:
        conn.close()


def test_bookmarks_on_a_watch_that_asks(api: tuple[IstiodLocal, Path, Path], tmp_path: Path) -> None:
    istiod = api[0]
    sa = tmp_path / "sa"
    istiod.kubeconfig(tmp_path / "k", identity="istio-system/istio-cni", service_account_dir=sa)
    events = _watch_lines(istiod, sa, "allowWatchBookmarks=true&timeoutSeconds=2"
                                      "&fieldSelector=spec.nodeName%3Diacni-node")
    assert events[0]["type"] == "ADDED"
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, events
    assert bookmarks[0]["object"]["kind"] == "Pod" and int(bookmarks[0]["object"]["metadata"]["resourceVersion"])
    # client-go's WatchList: the initial state, then a bookmark marking its end, even from a resourceVersion.
    listed = _watch_lines(istiod, sa, "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersion=999999"
                                      "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1")
    first_bookmark = next(i for i, e in enumerate(listed) if e["type"] == "BOOKMARK")
    assert first_bookmark > 0 and all(e["type"] == "ADDED" for e in listed[:first_bookmark])
    assert listed[first_bookmark]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_kubeconfig_and_service_account_files(api: tuple[IstiodLocal, Path, Path], tmp_path: Path) -> None:
    istiod = api[0]
    sa = tmp_path / "serviceaccount"
    out = istiod.kubeconfig(tmp_path / "cni.kubeconfig", identity="istio-system/istio-cni", token_ttl="1h",
                            service_account_dir=sa)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    document = yaml.safe_load(out.read_text())
    cluster = document["clusters"][0]["cluster"]
    assert cluster["server"] == istiod.kube_api_url
    assert base64.b64decode(cluster["certificate-authority-data"]) == istiod.root_pem()
    assert document["current-context"] == document["contexts"][0]["name"]
    token = document["users"][0]["user"]["token"]
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert payload["sub"] == "system:serviceaccount:istio-system:istio-cni"
    assert payload["aud"] == ["https://kubernetes.default.svc.cluster.local"]
    assert payload["exp"] - payload["iat"] == 3600
    assert (sa / "..data").is_symlink() and (sa / "token").is_symlink()
    assert (sa / "namespace").read_text() == "istio-system"
    assert (sa / "ca.crt").read_bytes() == istiod.root_pem()
    assert stat.S_IMODE((sa / "token").stat().st_mode) == 0o644
    first = os.readlink(sa / "..data")
    istiod.kubeconfig(tmp_path / "again", identity="istio-system/istio-cni", service_account_dir=sa)
    assert os.readlink(sa / "..data") != first and not (sa / first).exists()  # rotated by one rename
    bad = istiod_local_cli("kubeconfig", "--out", str(tmp_path / "x"), "--identity", "nobody",
                           state_dir=istiod.state_dir, check=False)
    assert bad.returncode == 2 and "--identity" in bad.stderr and "namespace/serviceaccount" in bad.stderr


def test_serving_certificate_names_and_reissue(api: tuple[IstiodLocal, Path, Path], tmp_path: Path) -> None:
    istiod = api[0]
    cert = x509.load_pem_x509_certificate((istiod.state_dir / "kube-apiserver-cert.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local"} <= set(san.get_values_for_type(x509.DNSName))
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    # Another listen address the certificate does not cover: re-issued for it, same root.
    registry_less = IstiodLocal(istiod.state_dir, kube_api_addr="127.0.0.2:0")
    with registry_less:
        reissued = x509.load_pem_x509_certificate((istiod.state_dir / "kube-apiserver-cert.pem").read_bytes())
        ips = {str(ip) for ip in reissued.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)}
        assert ips == {"127.0.0.1", "127.0.0.2"}
        poll(lambda: registry_less.kube_api.startswith("127.0.0.2:"), "the second API to listen", 5)


def test_serve_refuses_a_bad_or_taken_api_address(tmp_path: Path) -> None:
    bad = istiod_local_cli("serve", "--kube-api-addr", "nope", state_dir=tmp_path / "s", check=False)
    assert bad.returncode == 2 and "--kube-api-addr" in bad.stderr and "'nope'" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = istiod_local_cli("serve", "--grpc-addr", "127.0.0.1:0", "--secure-grpc-addr", "127.0.0.1:0",
                                "--kube-api-addr", f"127.0.0.1:{port}", state_dir=tmp_path / "s", check=False)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} (--kube-api-addr; off disables it)" in done.stderr
