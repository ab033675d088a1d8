"""Which Kubernetes client library the repair controller lists and watches pods with: measured, in one run.

Against a real `istiod-local serve --kube-api-addr` (its Kubernetes API: HTTPS, bearer tokens, list, watch with
resourceVersion and bookmarks, 410 Expired), with a registry of `PODS` pods on node n1 and as many on n2, each
candidate runs in a fresh `python -c` and reports:

- import time and the RSS its import adds (VmRSS from /proc/self/status, over a baseline process that has already
  imported asyncio, ssl and json, as any asyncio node agent has);
- the RSS added once it has listed the node's pods (`fieldSelector=spec.nodeName=n1`, every namespace) and
  received a watch event for a status PATCH made by a "kubelet" (this process, with the admin identity);
- whether its watch survives a 410: the candidate stops watching, the kubelet makes more changes than the
  API's watch log keeps (so the old resourceVersion is expired), the candidate watches again from the old
  version and must then deliver an event made after that (by re-listing when the library reports the 410, or by
  recovering itself). A library that neither reports nor recovers within `RESUME_TIMEOUT` fails the check.

Candidates: the official `kubernetes` client (sync, urllib3; the reference of the ratios), `kubernetes_asyncio`
(aiohttp), `lightkube` (httpx2; through `istio_agent.kube.pod_api.PodApi`, the controller's own adapter) and
`kr8s` (httpx). A candidate not importable here is reported as skipped; `BENCH_KUBE_CLIENT_PATHS` may name
`lib=dir` pairs (comma-separated) put first on that candidate's `sys.path`, so candidates not installed in the
project's venv can be measured from `pip install --target dir lib`.

Each library runs `BENCH_ROUNDS` times (default 3, alternating) and the medians are reported.
Last line: one JSON object; `<lib>_rss_ratio` is that library's RSS after list+watch over the official client's.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # helpers shared with the tests

PODS = int(os.environ.get("BENCH_PODS", "50"))
HISTORY = 1000  # istiod-local's watch log (KubeApiOptions.history): more changes than this expire a version
RESUME_TIMEOUT = 15.0
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
MEDIANS = ("import_ms", "import_mb", "listwatch_mb")
LIBRARIES = ("kubernetes", "kubernetes_asyncio", "lightkube", "kr8s")
FIELD_SELECTOR = "spec.nodeName=n1"


# ---- the children: one library each, in a fresh interpreter --------------------------------------------------

CHILD_PRELUDE = """
import asyncio, json, re, ssl, sys, time
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
def say(*words):
    print(*words, flush=True)
def wait_for(word):
    line = sys.stdin.readline().strip()
    assert line == word, f"expected {word!r} from the parent, got {line!r}"
BASE = rss()
"""


def child_code(lib: str) -> str:
    """The child's program: prelude, the library's steps, the report."""
    return CHILD_PRELUDE + CHILDREN[lib]


KUBERNETES = """
T0 = time.perf_counter()
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
IMPORT_MS, IMPORT_MB = (time.perf_counter() - T0) * 1000, rss() - BASE
server, sa = sys.argv[1], sys.argv[2]
cfg = client.Configuration()
cfg.host, cfg.ssl_ca_cert = server, sa + "/ca.crt"
cfg.api_key_prefix = {"authorization": "Bearer"}
cfg.api_key = {"authorization": ""}
cfg.refresh_api_key_hook = lambda c: c.api_key.update(authorization=open(sa + "/token").read().strip())
api = client.CoreV1Api(client.ApiClient(cfg))
def listed():
    pods = api.list_pod_for_all_namespaces(field_selector=FS)
    return pods.metadata.resource_version, len(pods.items)
def until(rv, name, text):
    for event in watch.Watch().stream(api.list_pod_for_all_namespaces, field_selector=FS, resource_version=rv,
                                      allow_watch_bookmarks=True, timeout_seconds=30):
        pod = event["object"]
        if event["type"] == "MODIFIED" and pod.metadata.name == name and pod.status.message == text:
            return pod.metadata.resource_version
    raise SystemExit("watch ended without the event")
rv, count = listed()
say("listed", count)
until(rv, "p-n1-0", "first")
LISTWATCH_MB = rss() - BASE
say("measured")
wait_for("go")
how = "no 410"
try:
    until(rv, "p-n1-0", "second")
except ApiException as exc:
    assert exc.status == 410, exc
    how = "reports 410 (ApiException), relisted"
    rv, count = listed()
    say("relisted")
    until(rv, "p-n1-0", "second")
"""

KUBERNETES_ASYNCIO = """
T0 = time.perf_counter()
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException
IMPORT_MS, IMPORT_MB = (time.perf_counter() - T0) * 1000, rss() - BASE
server, sa = sys.argv[1], sys.argv[2]
async def main():
    global LISTWATCH_MB, how
    cfg = client.Configuration(host=server)
    cfg.ssl_ca_cert = sa + "/ca.crt"
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    cfg.api_key = {"BearerToken": ""}
    cfg.refresh_api_key_hook = lambda c: c.api_key.update(BearerToken=open(sa + "/token").read().strip())
    async with client.ApiClient(cfg) as http:
        api = client.CoreV1Api(http)
        async def listed():
            pods = await api.list_pod_for_all_namespaces(field_selector=FS)
            return pods.metadata.resource_version, len(pods.items)
        async def until(rv, name, text):
            async with watch.Watch() as w:
                async for event in w.stream(api.list_pod_for_all_namespaces, field_selector=FS, resource_version=rv,
                                            allow_watch_bookmarks=True, timeout_seconds=30):
                    pod = event["object"]
                    if event["type"] == "MODIFIED" and pod.metadata.name == name and pod.status.message == text:
                        return
            raise SystemExit("watch ended without the event")
        rv, count = await listed()
        say("listed", count)
        await until(rv, "p-n1-0", "first")
        LISTWATCH_MB = rss() - BASE
        say("measured")
        await asyncio.to_thread(wait_for, "go")
        how = "no 410"
        try:
            await asyncio.wait_for(until(rv, "p-n1-0", "second"), RESUME_TIMEOUT)
        except ApiException as exc:
            assert exc.status == 410, exc
            how = "reports 410 (ApiException), relisted"
            rv, count = await listed()
            say("relisted")
            await until(rv, "p-n1-0", "second")
asyncio.run(main())
"""

LIGHTKUBE = """
T0 = time.perf_counter()
from istio_agent.kube.access import KubeAccess
from istio_agent.kube.pod_api import KubeApiError, PodApi
IMPORT_MS, IMPORT_MB = (time.perf_counter() - T0) * 1000, rss() - BASE
server, sa = sys.argv[1], sys.argv[2]
async def main():
    global LISTWATCH_MB, how
    api = PodApi(KubeAccess(server, sa + "/ca.crt", sa + "/token"), field_selector=FS)
    async def until(rv, name, text):
        async for kind, pod in api.watch(rv, 30):
            if kind == "MODIFIED" and pod["metadata"]["name"] == name and pod["status"].get("message") == text:
                return
    listing = await api.list()
    say("listed", len(listing.items))
    await until(listing.resource_version, "p-n1-0", "first")
    LISTWATCH_MB = rss() - BASE
    say("measured")
    await asyncio.to_thread(wait_for, "go")
    how = "no 410"
    try:
        await asyncio.wait_for(until(listing.resource_version, "p-n1-0", "second"), RESUME_TIMEOUT)
    except KubeApiError as exc:
        assert exc.expired, exc
        how = "reports 410 (ApiError), relisted"
        listing = await api.list()
        say("relisted")
        await until(listing.resource_version, "p-n1-0", "second")
    await api.close()
asyncio.run(main())
"""

KR8S = """
T0 = time.perf_counter()
import kr8s
import kr8s.asyncio
IMPORT_MS, IMPORT_MB = (time.perf_counter() - T0) * 1000, rss() - BASE
server, sa = sys.argv[1], sys.argv[2]
async def main():
    global LISTWATCH_MB, how
    # kr8s reads a service account only in-cluster (KUBERNETES_SERVICE_HOST/PORT), not with a URL given.
    import os
    host, _, port = server.removeprefix("https://").rpartition(":")
    os.environ.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
    api = await kr8s.asyncio.api(serviceaccount=sa)
    async def listed():
        # kr8s returns the items only, not the list's resourceVersion: the newest item's stands in for it.
        pods = [p async for p in api.async_get("pods", namespace=kr8s.ALL, field_selector=FS)]
        return str(max(int(p.metadata.resourceVersion) for p in pods)), len(pods)
    async def until(rv, name, text):
        async for kind, pod in api.async_watch("pods", namespace=kr8s.ALL, field_selector=FS, since=rv):
            if kind == "MODIFIED" and pod.name == name and pod.raw["status"].get("message") == text:
                return
    rv, count = await listed()
    say("listed", count)
    await until(rv, "p-n1-0", "first")
    LISTWATCH_MB = rss() - BASE
    say("measured")
    await asyncio.to_thread(wait_for, "go")
    how = "restarts its watch at the expired version after a 410 (neither reports nor recovers)"
    try:
        await asyncio.wait_for(until(rv, "p-n1-0", "second"), RESUME_TIMEOUT)
        how = "recovers by itself"
    except asyncio.TimeoutError:
        say("report", json.dumps(report(False)))
        raise SystemExit(0)
asyncio.run(main())
"""

CHILD_REPORT = """
def report(survived):
    return {"import_ms": round(IMPORT_MS, 1), "import_mb": round(IMPORT_MB, 1),
            "listwatch_mb": round(LISTWATCH_MB, 1), "survives_410": survived, "how_410": how}
"""

CHILD_END = """
say("report", json.dumps(report(True)))
"""

CHILDREN = {lib: f"FS = {FIELD_SELECTOR!r}\nRESUME_TIMEOUT = {RESUME_TIMEOUT}\n{CHILD_REPORT}{code}{CHILD_END}"
            for lib, code in (("kubernetes", KUBERNETES), ("kubernetes_asyncio", KUBERNETES_ASYNCIO),
                              ("lightkube", LIGHTKUBE), ("kr8s", KR8S))}


# ---- the parent: istiod-local, the kubelet, the children ------------------------------------------------------


class Kubelet:
    """PATCHes pods/{name}/status with the admin identity over one kept-alive HTTPS connection."""

    def __init__(self, server: str, service_account: Path) -> None:
        host, _, port = server.removeprefix("https://").rpartition(":")
        context = ssl.create_default_context(cafile=str(service_account / "ca.crt"))
        self.connection = http.client.HTTPSConnection(host.strip("[]"), int(port), context=context, timeout=10)
        self.token = (service_account / "token").read_text().strip()

    def patch_status(self, name: str, message: str, namespace: str = "default") -> None:
        body = json.dumps({"status": {"message": message}})
        self.connection.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", body,
                                {"Authorization": f"Bearer {self.token}",
                                 "Content-Type": "application/merge-patch+json"})
        response = self.connection.getresponse()
        text = response.read()
        if response.status != 200:
            raise SystemExit(f"kubelet PATCH {name}: {response.status} {text[:300]!r}")


def registry_yaml(pods: int) -> str:
    workloads = "".join(
        f"- {{name: p-{node}-{i}, namespace: default, serviceAccount: echo, labels: {{app: echo}}, "
        f"ip: 10.244.{1 if node == 'n1' else 2}.{i + 10}, nodeName: {node}}}\n"
        for node in ("n1", "n2") for i in range(pods))
    return ("services:\n- name: echo\n  namespace: default\n  selector: {app: echo}\n"
            "  ports: [{name: http, port: 80, targetPort: 8080, protocol: HTTP}]\n"
            f"workloads:\n{workloads}")


def importable(lib: str, paths: dict[str, str]) -> bool:
    env = dict(os.environ, PYTHONPATH=paths.get(lib, ""))
    return subprocess.run([sys.executable, "-c", f"import {lib}"], env=env, capture_output=True).returncode == 0


def run_child(lib: str, paths: dict[str, str], server: str, service_account: Path, kubelet: Kubelet,
              round_no: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (paths.get(lib, ""), str(ROOT / "src")) if p))
    child = subprocess.Popen([sys.executable, "-c", child_code(lib), server, str(service_account)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in child.stdout or ():
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()

    def expect(word: str, timeout: float = 60.0) -> str:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        if not line.startswith(word):
            child.kill()
            _, err = child.communicate(timeout=30)
            raise SystemExit(f"{lib}: expected {word!r}, got {line!r}\n{err[-3000:]}")
        return line[len(word):].strip()

    try:
        listed = int(expect("listed"))
        assert listed == PODS, f"{lib} listed {listed} pods on n1, not {PODS}"
        kubelet.patch_status("p-n1-0", "first")
        expect("measured")
        # More changes than the watch log keeps: the version the child listed at is now expired.
        for i in range(HISTORY + 1):
            kubelet.patch_status(f"p-n2-{i % PODS}", f"churn {round_no} {i}")
        child.stdin.write("go\n")
        child.stdin.flush()
        started = time.monotonic()
        try:  # a library that reports the 410 re-lists first; one that does not is given a few seconds
            early = lines.get(timeout=5.0)
        except queue.Empty:
            early = ""
        kubelet.patch_status("p-n1-0", "second")
        line = early if early.startswith("report") else ""
        report = json.loads(line.removeprefix("report") if line else expect("report", RESUME_TIMEOUT + 30))
        report["resume_s"] = round(time.monotonic() - started, 2)
        child.wait(30)
        return report
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def main() -> None:
    from launchers import IstiodLocal, RegistryFile, istiod_local_cli
    from support import free_port

    paths = dict(pair.split("=", 1) for pair in os.environ.get("BENCH_KUBE_CLIENT_PATHS", "").split(",") if pair)
    with tempfile.TemporaryDirectory(prefix="iacni-bench-kube-") as tmp:
        work = Path(tmp)
        registry = RegistryFile(work / "registry.yaml", registry_yaml(PODS))
        kube_port = free_port()
        with IstiodLocal(work / "state", registry=registry, kube_api_addr=f"127.0.0.1:{kube_port}"):
            admin = work / "admin-sa"
            istiod_local_cli("kubeconfig", "--out", str(work / "admin.kubeconfig"), "--service-account-dir",
                             str(admin), state_dir=work / "state")
            cni = work / "cni-sa"
            istiod_local_cli("kubeconfig", "--out", str(work / "cni.kubeconfig"), "--identity",
                             "istio-system/istio-cni", "--service-account-dir", str(cni), state_dir=work / "state")
            server = f"https://127.0.0.1:{kube_port}"
            kubelet = Kubelet(server, admin)
            results: dict[str, dict[str, Any]] = {}
            available = [lib for lib in LIBRARIES if importable(lib, paths)]
            for lib in LIBRARIES:
                if lib not in available:
                    print(f"{lib}: not importable here, skipped")
            runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in available}
            for n in range(ROUNDS):  # rounds alternate between the libraries
                for lib in available:
                    runs[lib].append(run_child(lib, paths, server, cni, kubelet, n))
            for lib in available:
                results[lib] = {**runs[lib][-1],
                                **{k: statistics.median(r[k] for r in runs[lib]) for k in MEDIANS},
                                "survives_410": all(r["survives_410"] for r in runs[lib])}
                r = results[lib]
                print(f"{lib:20} import {r['import_ms']:7.1f} ms {r['import_mb']:6.1f} MB; after list+watch "
                      f"{r['listwatch_mb']:6.1f} MB; 410: {'survives' if r['survives_410'] else 'FAILS'} "
                      f"({r['how_410']})")
    figures: dict[str, Any] = {"pods_listed": PODS, "rounds": ROUNDS}
    reference = results.get("kubernetes", {}).get("listwatch_mb")
    for lib, r in results.items():
        figures[f"{lib}_import_ms"] = r["import_ms"]
        figures[f"{lib}_listwatch_mb"] = r["listwatch_mb"]
        figures[f"{lib}_survives_410"] = r["survives_410"]
        if reference:
            figures[f"{lib}_rss_ratio"] = round(r["listwatch_mb"] / reference, 3)
    fit = [lib for lib in ("kubernetes_asyncio", "lightkube", "kr8s") if results.get(lib, {}).get("survives_410")]
    figures["chosen"] = min(fit, key=lambda lib: results[lib]["listwatch_mb"]) if fit else None
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
