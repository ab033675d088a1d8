"""`make image-check`: this project's images run as Kubernetes would run injected pods, against istiod-local.

Run as root after `make image` (image-check.sh runs it with the project's venv). It:

1. makes a podman network (internal: no route off the host) and its bridge with the gateway address, and
   starts istiod-local on the host on that address (xDS, CA and its Kubernetes API);
2. reads two injected pods from istiod-local's Kubernetes API with kubectl (`get pod -o yaml`): a
   client (`sleep`) and an `echo` server, both rendered as Istio's injector writes them, with istio-init;
3. resolves what podman kube play lacks, as the kubelet would (kubeplay.py; printed), swaps the images for
   ours and runs each pod with `podman kube play` at the IP the API server reports;
4. checks: istio-init programmed the capture, the sidecars (pilot-agent and Envoy, uid 1337) are ready on
   :15021/healthz/ready, and a request from the client's app to the echo service's VIP crosses both
   sidecars over mTLS (the echo app sees the client's SPIFFE id in x-forwarded-client-cert, and Envoy's
   TLS handshake counters moved), and what `istioctl bug-report` runs in the istio-proxy container (`netstat
   -natpw`, `find`, `cat`) works there;
5. runs the install-cni image as the CNI DaemonSet would (node directories mounted), and then the
   istio-cni it installed, from a root with no Python at all (the bare base image): VERSION, and an
   ADD in dry-run mode that reads the pod from the API and records its capture;
6. removes everything it made (pods, containers, network, bridge, istiod-local, files), also on failure or
   Ctrl-C, and prints a summary; exit status 0 only when every check held.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

if "kubeplay" not in sys.modules:  # run as a script; the unit tests load it themselves
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubeplay  # this directory's module (not a package)

HERE = Path(__file__).resolve().parent
VENV_PYTHON = "/usr/local/lib/istio-agent/bin/python"  # in the proxy image
# The demo echo app (stdlib only) is the local environment's, which the images do not carry: it is bind-mounted
# into the app containers and run as a script by the image's Python.
ECHO_APP = HERE.parents[1] / "istiod-local" / "src" / "istiod_local" / "node" / "echo_app.py"
ECHO_APP_IN_POD = "/opt/istio-agent-check/echo_app.py"
NAMESPACE = "default"
TRUST_DOMAIN = "cluster.local"
ECHO_PORT = 8080


class CheckError(Exception):
    """A step failed; the message says which and why."""


class Runner:
    """Runs commands, remembers what to undo, and keeps the check's results."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.undo: list[tuple[str, Callable[[], object]]] = []
        self.results: list[tuple[str, bool, str]] = []
        self.env = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", str(HERE / "containers.conf")))

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 120, stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        if self.verbose:
            print("  $ " + " ".join(argv), flush=True)
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=stdin,
                              env=env or self.env)
        if check and done.returncode != 0:
            raise CheckError(f"{' '.join(argv[:4])}... exited {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

    def on_exit(self, what: str, action: Callable[[], object]) -> None:
        """Undo `what` at the end, last registered first."""
        self.undo.append((what, action))

    def on_exit_run(self, what: str, argv: Sequence[str], timeout: float = 120) -> None:
        """Run `argv` at the end (its failure ignored: the thing may already be gone)."""
        self.on_exit(what, lambda: self.run(argv, check=False, timeout=timeout))

    def result(self, name: str, ok: bool, detail: str) -> bool:
        self.results.append((name, ok, detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    def cleanup(self) -> list[str]:
        left: list[str] = []
        for what, action in reversed(self.undo):
            try:
                action()
            except Exception as exc:  # keep going: every other resource must still go
                left.append(f"{what}: {exc}")
        self.undo.clear()
        return left


def wait_for(what: str, probe: Callable[[], bool], timeout: float, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def registry(client_ip: str, echo_ip: str, cni_pod_ip: str, vip: str) -> dict[str, Any]:
    """istiod-local's registry: the echo service (its VIP in the pod subnet, so the internal network routes it to
    the pod's own capture) and the two workloads, injected with istio-init; STRICT mTLS. Istio's default stats
    leave TLS counters out: `proxy.istio.io/config` keeps the handshake counter, as a user would."""
    stats = {"proxy.istio.io/config": json.dumps({"proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]}},
                                                 separators=(",", ":"))}
    return {
        "services": [{"name": "echo", "namespace": NAMESPACE, "selector": {"app": "echo"}, "clusterIP": vip,
                      "ports": [{"name": "http", "port": 80, "targetPort": ECHO_PORT, "protocol": "HTTP"}]}],
        "workloads": [
            {"name": "sleep-1", "namespace": NAMESPACE, "serviceAccount": "sleep", "labels": {"app": "sleep"},
             "ip": client_ip, "sidecar": "envoy", "captureInit": "init", "annotations": stats},
            {"name": "echo-1", "namespace": NAMESPACE, "serviceAccount": "echo", "labels": {"app": "echo"},
             "ip": echo_ip, "sidecar": "envoy", "captureInit": "init", "annotations": stats},
            # Only read by istio-cni's ADD (injected for the CNI: istio-validation, no istio-init); not played.
            {"name": "echo-cni-1", "namespace": NAMESPACE, "serviceAccount": "echo", "labels": {"app": "echo-cni"},
             "ip": cni_pod_ip, "sidecar": "envoy", "captureInit": "cni"},
        ],
        "peerAuthentication": {"default": "STRICT"},
    }


class Check:
    def __init__(self, args: argparse.Namespace, runner: Runner) -> None:
        self.args = args
        self.r = runner
        self.tag = args.tag
        self.proxy_image = f"localhost/istio-agent/proxyv2:{self.tag}"
        self.cni_image = f"localhost/istio-agent/install-cni:{self.tag}"
        self.base_image = "localhost/istio-agent/base:bookworm"
        prefix = args.subnet.rsplit(".", 1)[0]
        self.gateway, self.client_ip, self.echo_ip, self.cni_ip, self.cni_pod_ip, self.vip = (
            f"{prefix}.1", f"{prefix}.11", f"{prefix}.12", f"{prefix}.13", f"{prefix}.14", f"{prefix}.250")
        self.network = f"istio-agent-check-{os.getpid()}"
        self.bin = Path(sys.executable).parent
        self.work = Path(tempfile.mkdtemp(prefix="istio-agent-image-check.", dir="/run"))
        os.chmod(self.work, 0o755)
        self.r.on_exit(f"directory {self.work}", lambda: shutil.rmtree(self.work))
        self.state = self.work / "istiod"
        self.kubeconfig = self.work / "kubeconfig"

    def istiod_local(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.r.run([str(self.bin / "istiod-local"), *argv])

    # 1. network and istiod-local
    def network_up(self) -> None:
        for image in (self.proxy_image, self.cni_image, self.base_image):
            if self.r.run(["podman", "image", "exists", image], check=False).returncode != 0:
                raise CheckError(f"{image} is missing: run `make image` first")
        routes = self.r.run(["ip", "-4", "route", "show", "match", self.gateway]).stdout
        if any(line and not line.startswith("default") for line in routes.splitlines()):
            raise CheckError(f"{self.args.subnet} is already routed on this host ({routes.strip()}); use --subnet")
        self.r.run(["podman", "network", "create", "--internal", "--subnet", self.args.subnet,
                    "--gateway", self.gateway, self.network])
        self.r.on_exit_run(f"network {self.network}", ["podman", "network", "rm", "-f", self.network])
        bridge = self.r.run(["podman", "network", "inspect", self.network, "--format",
                             "{{.NetworkInterface}}"]).stdout.strip()
        # The bridge exists before any pod, so istiod-local can listen on the gateway address; netavark uses it.
        self.r.run(["ip", "link", "add", bridge, "type", "bridge"])
        self.r.on_exit_run(f"bridge {bridge}", ["ip", "link", "del", bridge])
        self.r.run(["ip", "addr", "add", f"{self.gateway}/24", "dev", bridge])
        self.r.run(["ip", "link", "set", bridge, "up"])
        print(f"network {self.network}: {self.args.subnet} (internal), bridge {bridge} {self.gateway}")

    def istiod_up(self) -> None:
        mesh = self.work / "mesh.yaml"
        mesh.write_text(yaml.safe_dump(registry(self.client_ip, self.echo_ip, self.cni_pod_ip, self.vip),
                                       sort_keys=False))
        log = (self.work / "istiod.log").open("w")
        proc = subprocess.Popen(
            [str(self.bin / "istiod-local"), "serve", "--state-dir", str(self.state), "--registry", str(mesh),
             "--grpc-addr", f"{self.gateway}:15010", "--secure-grpc-addr", f"{self.gateway}:15012",
             "--kube-api-addr", f"{self.gateway}:6443", "--kube-node-name", "node-1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def stop() -> None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        self.r.on_exit("istiod-local", stop)

        def up() -> bool:
            if proc.poll() is not None:
                raise CheckError(f"istiod-local exited {proc.returncode}: {(self.work / 'istiod.log').read_text()}")
            return all(listening(self.gateway, port) for port in (15010, 15012, 6443))
        wait_for("istiod-local", up, 30)
        self.istiod_local("kubeconfig", "--state-dir", str(self.state), "--out", str(self.kubeconfig),
                          "--server", f"https://{self.gateway}:6443")
        print(f"istiod-local: xDS/CA {self.gateway}:15012 (TLS), :15010; Kubernetes API https://{self.gateway}:6443")

    # 2.-3. injected pods from the API, resolved, played
    def get_pod(self, name: str) -> dict[str, Any]:
        text = self.r.run(["kubectl", "--kubeconfig", str(self.kubeconfig), "get", "pod", name, "-n", NAMESPACE,
                           "-o", "yaml"]).stdout
        pod: dict[str, Any] = yaml.safe_load(text)
        return pod

    def tokens(self, name: str, service_account: str) -> dict[str, str]:
        files = self.work / "tokens" / name
        self.istiod_local("pod-files", "--state-dir", str(self.state), "--namespace", NAMESPACE,
                          "--service-account", service_account, "--pod", name, "--token-ttl", "12h",
                          "--out", str(files))
        api = files / "api"
        self.istiod_local("kubeconfig", "--state-dir", str(self.state), "--out", str(files / "kubeconfig"),
                          "--identity", f"{NAMESPACE}/{service_account}", "--service-account-dir", str(api))
        return {"istio-ca": (files / "var/run/secrets/tokens/istio-token").read_text(),
                "": (api / "token").read_text()}

    def play(self, name: str, ip: str, app_command: Sequence[str]) -> dict[str, Any]:
        pod = self.get_pod(name)
        proxy = next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")
        init = [c["name"] for c in pod["spec"].get("initContainers", [])]
        print(f"\npod {name} from the API: istio-proxy image {proxy['image']}, args {' '.join(proxy['args'])}; "
              f"init {init}; status.podIP {pod['status'].get('podIP')}")
        tokens = self.tokens(name, pod["spec"]["serviceAccountName"])
        root_pem = (self.work / "tokens" / name / "var/run/secrets/istio/root-cert.pem").read_text()
        inputs = kubeplay.Inputs(
            pod_ip=ip, host_dir=str(self.work / "pods" / name), proxy_image=self.proxy_image,
            app_image=self.proxy_image, app_command=app_command, tokens=tokens,
            config_maps={"istio-ca-root-cert": {"root-cert.pem": root_pem}, "kube-root-ca.crt": {"ca.crt": root_pem}},
            host_aliases={"istiod.istio-system.svc": self.gateway}, app_files={ECHO_APP_IN_POD: str(ECHO_APP)})
        plan = kubeplay.for_podman(pod, inputs)
        for path, mode in plan.dirs.items():
            Path(path).mkdir(parents=True, exist_ok=True)
            os.chmod(path, mode)
        for path, (content, mode) in plan.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
            os.chmod(path, mode)
        print(f"resolved for podman kube play, as the kubelet would ({len(plan.resolved)}):")
        for line in plan.resolved:
            print(f"  {line}")
        print("replaced (not the kubelet's work):")
        for line in plan.replaced:
            print(f"  {line}")
        spec = self.work / f"{name}.yaml"
        spec.write_text(yaml.safe_dump_all([*plan.documents, plan.pod], sort_keys=False))
        self.r.on_exit_run(f"pod {name}", ["podman", "kube", "down", str(spec)])
        self.r.run(["podman", "kube", "play", "--network", self.network, "--ip", ip, str(spec)], timeout=180)
        return pod

    def exec(self, container: str, argv: Sequence[str], check: bool = False,
             timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return self.r.run(["podman", "exec", container, *argv], check=check, timeout=timeout)

    def inspect(self, container: str, fmt: str) -> str:
        return self.r.run(["podman", "inspect", container, "--format", fmt], check=False).stdout.strip()

    def check_init(self, name: str) -> bool:
        container = f"{name}-istio-init"
        wait_for(f"{container} to finish", lambda: self.inspect(container, "{{.State.Status}}") == "exited"
                 or self.inspect(container, "{{.State.Status}}") == "", 60)
        code = self.inspect(container, "{{.State.ExitCode}}")
        logs = self.r.run(["podman", "logs", container], check=False)
        # Read back from the host in the pod's network namespace (no container of the pod keeps NET_ADMIN).
        pid = self.inspect(f"{name}-app", "{{.State.Pid}}")
        rules = self.r.run(["nsenter", "-t", pid, "-n", "iptables-save", "-t", "nat"], check=False)
        redirect = [line for line in rules.stdout.splitlines() if "ISTIO_REDIRECT" in line and "15001" in line]
        ok = code in ("0", "") and bool(redirect)
        if not ok:
            print((logs.stdout + logs.stderr)[-3000:])
        shown = redirect[0].strip() if redirect else "no ISTIO_REDIRECT"
        return self.r.result(f"{name}: istio-init", ok, f"exit {code or '?'}; nat table: {shown}")

    def ready(self, name: str) -> bool:
        probe = [VENV_PYTHON, "-c", "import urllib.request as u; print(u.urlopen("
                 "'http://127.0.0.1:15021/healthz/ready', timeout=2).status)"]
        started = time.monotonic()
        try:
            wait_for(f"{name} ready", lambda: self.exec(f"{name}-app", probe).stdout.strip() == "200", 120, 1)
        except CheckError as exc:
            logs = self.r.run(["podman", "logs", "--tail", "40", f"{name}-istio-proxy"], check=False)
            print(logs.stdout[-4000:] + logs.stderr[-4000:])
            return self.r.result(f"{name}: readiness", False, str(exc))
        users = self.r.run(["podman", "top", f"{name}-istio-proxy", "user", "comm"], check=False).stdout.split("\n")
        procs = sorted({" ".join(line.split()) for line in users[1:] if line.strip()})
        uid_ok = all(p.split()[0] in ("1337", "istio-proxy") for p in procs) and any("envoy" in p for p in procs)
        bootstrap = self.work / "pods" / name / "istio-envoy" / "envoy-rev.json"
        rendered = f"{bootstrap.stat().st_size} bytes" if bootstrap.exists() else "missing"
        return self.r.result(f"{name}: sidecar ready", uid_ok and bootstrap.exists(),
                             f":15021/healthz/ready 200 after {time.monotonic() - started:.1f} s; "
                             f"istio-proxy processes (user command): {', '.join(procs)}; "
                             f"/etc/istio/proxy/envoy-rev.json {rendered}")

    def traffic(self) -> bool:
        url = f"http://{self.vip}/"
        get = [VENV_PYTHON, ECHO_APP_IN_POD, "get", url]
        answer: dict[str, Any] = {}

        def answered() -> bool:
            nonlocal answer
            done = self.exec("sleep-1-app", get)
            with contextlib.suppress(ValueError):
                answer = json.loads(done.stdout)
            return answer.get("status") == 200
        try:
            wait_for(f"an answer from {url}", answered, 60, 1)
        except CheckError as exc:
            return self.r.result("mTLS request sleep-1 -> echo", False, f"{exc}; last answer {answer}")
        headers = answer.get("body", {}).get("headers", {})
        xfcc = headers.get("x-forwarded-client-cert", "")
        print(f"\nGET {url} from sleep-1's app container -> {answer['status']}; the echo app saw:")
        for key in sorted(headers):
            print(f"  {key}: {headers[key]}")
        client_id = f"spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/sleep"
        server_id = f"spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/echo"
        stats = {}
        for pod, needle in (("sleep-1", "cluster.outbound|80||echo"), ("echo-1", "listener.")):
            text = self.exec(f"{pod}-istio-proxy",
                             ["pilot-agent", "request", "GET", "stats?filter=ssl.handshake"]).stdout
            stats[pod] = sum(int(v) for n, _, v in (line.partition(": ") for line in text.splitlines())
                             if needle in n and v.strip().isdigit())
        print(f"Envoy ssl.handshake: sleep-1 outbound to echo {stats['sleep-1']}, echo-1 inbound {stats['echo-1']}")
        ok = f"URI={client_id}" in xfcc and f"By={server_id}" in xfcc and stats["sleep-1"] > 0 and stats["echo-1"] > 0
        return self.r.result("mTLS request sleep-1 -> echo", ok,
                             f"echo saw x-forwarded-client-cert URI={client_id} (By={server_id}); "
                             f"TLS handshakes {stats['sleep-1']} out / {stats['echo-1']} in" if ok
                             else f"x-forwarded-client-cert {xfcc!r}, handshakes {stats}")

    def bug_report_tools(self, name: str) -> bool:
        """What `istioctl bug-report` runs in a pod's istio-proxy container works there: `netstat -natpw` (it
        should list Envoy's listeners), and `find` and `cat` for core dumps and files."""
        container = f"{name}-istio-proxy"
        netstat = self.exec(container, ["netstat", "-natpw"])
        found = self.exec(container, ["find", "/var/lib/istio/data", "-name", "core.*"])
        read = self.exec(container, ["cat", "/etc/istio/proxy/envoy-rev.json"])
        listeners = [line.split()[3] for line in netstat.stdout.splitlines()
                     if line.startswith("tcp") and "LISTEN" in line and line.split()[3].endswith((":15001", ":15006"))]
        ok = netstat.returncode == 0 and len(listeners) >= 2 and found.returncode == 0 and read.returncode == 0
        failed = (f"netstat exit {netstat.returncode}: {(netstat.stderr or netstat.stdout)[-500:]}; "
                  f"find exit {found.returncode}; cat exit {read.returncode}")
        return self.r.result(f"{name}: istioctl bug-report's tools in istio-proxy", ok,
                             f"netstat -natpw lists Envoy's {', '.join(sorted(set(listeners)))}; find and cat work"
                             if ok else failed)

    # 5. install-cni and the plugin on a root without Python
    def cni(self) -> bool:
        node = self.work / "cni-node"
        bin_dir, net_dir, run_dir = node / "opt/cni/bin", node / "etc/cni/net.d", node / "var/run/istio-cni"
        for path in (bin_dir, net_dir, run_dir):
            path.mkdir(parents=True)
        (net_dir / "10-bridge.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "podnet",
            "plugins": [{"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.85.0.0/24"}},
                        {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=2) + "\n")
        sa = self.work / "cni-sa"
        self.istiod_local("kubeconfig", "--state-dir", str(self.state), "--out", str(self.work / "cni-kubeconfig"),
                          "--server", f"https://{self.gateway}:6443", "--identity", "istio-system/istio-cni",
                          "--service-account-dir", str(sa))
        # A pod's network namespace as the node's runtime makes it, under the node's /var/run/netns.
        netns = f"istio-agent-check-{os.getpid()}"
        self.r.run(["ip", "netns", "add", netns])
        self.r.on_exit_run(f"netns {netns}", ["ip", "netns", "del", netns])
        for argv in (["link", "set", "lo", "up"], ["link", "add", "eth0", "type", "veth", "peer", "name", "peer0"],
                     ["addr", "add", f"{self.cni_pod_ip}/24", "dev", "eth0"], ["link", "set", "eth0", "up"]):
            self.r.run(["ip", "-n", netns, *argv])  # the pod's eth0 with its IP (both veth ends stay inside)
        name = f"istio-agent-check-cni-{os.getpid()}"
        self.r.on_exit_run(f"container {name}", ["podman", "rm", "-f", "-t", "10", name])
        self.r.run(["podman", "run", "-d", "--name", name, "--network", self.network, "--ip", self.cni_ip,
                    "--cap-drop", "ALL", "--cap-add", "NET_ADMIN,NET_RAW,SYS_ADMIN,DAC_OVERRIDE",
                    "-v", f"{bin_dir}:/host/opt/cni/bin", "-v", f"{net_dir}:/host/etc/cni/net.d",
                    "-v", f"{run_dir}:/var/run/istio-cni",
                    "-v", f"{sa}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
                    # The fast path enters the runtime's CNI_NETNS: the node's netns directory at the same path
                    # (deploy/README.md: the chart mounts it only for ambient, at another path).
                    "-v", "/var/run/netns:/var/run/netns:rslave",
                    "-e", f"KUBERNETES_SERVICE_HOST={self.gateway}", "-e", "KUBERNETES_SERVICE_PORT=6443",
                    "-e", "POD_NAMESPACE=istio-system", "-e", "POD_NAME=istio-cni-node-check",
                    "-e", "NODE_NAME=node-1",
                    "-e", "CNI_NET_DIR=/etc/cni/net.d", "-e", "CHAINED_CNI_PLUGIN=true", "-e", "REPAIR_ENABLED=false",
                    self.cni_image, "install-cni"])

        def installed() -> bool:
            if self.inspect(name, "{{.State.Status}}") not in ("running", "created", "configured"):
                logs = self.r.run(["podman", "logs", name], check=False)
                raise CheckError(f"install-cni stopped: {(logs.stdout + logs.stderr)[-3000:]}")
            text = (net_dir / "10-bridge.conflist").read_text()
            return '"istio-cni"' in text and (bin_dir / "istio-cni").exists()
        try:
            wait_for("install-cni to install the plugin", installed, 60)
        except CheckError as exc:
            return self.r.result("install-cni", False, str(exc))
        launcher = (bin_dir / "istio-cni").read_text().splitlines()[0]
        runtime = bin_dir / "istio-cni.d"
        size = self.r.run(["du", "-sh", str(runtime)]).stdout.split()[0]
        self.r.result("install-cni", True, f"entry in 10-bridge.conflist; istio-cni launcher `{launcher}`; "
                      f"runtime {runtime.relative_to(node)} ({size}) copied to the node")
        conflist = json.loads((net_dir / "10-bridge.conflist").read_text())
        entry = next(p for p in conflist["plugins"] if p["type"] == "istio-cni")
        print(f"istio-cni entry: {json.dumps(entry, sort_keys=True)}")
        # The node side: a root with no Python (the bare base image), the node's CNI dirs at their real paths.
        has_python = self.r.run(["podman", "run", "--rm", "--network", "none", self.base_image, "sh", "-c",
                                 "command -v python3 || ls /usr/bin/python3* 2>/dev/null || echo none"],
                                check=False).stdout.strip()
        mounts = ["-v", f"{bin_dir}:/opt/cni/bin:ro", "-v", f"{net_dir}:/etc/cni/net.d:ro",
                  "-v", f"{run_dir}:/var/run/istio-cni"]
        version = self.r.run(["podman", "run", "--rm", "--network", "none", *mounts, "-e", "CNI_COMMAND=VERSION",
                              self.base_image, "/opt/cni/bin/istio-cni"], check=False)
        ok_version = '"cniVersion"' in version.stdout
        self.r.result("istio-cni on a node without Python: VERSION", ok_version,
                      f"python on that root: {has_python}; answer {version.stdout.strip() or version.stderr.strip()}")
        stdin = json.dumps({"cniVersion": conflist["cniVersion"], "name": conflist["name"], **entry,
                            "prevResult": {"cniVersion": conflist["cniVersion"],
                                           "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/check"}],
                                           "ips": [{"address": f"{self.cni_pod_ip}/24", "interface": 0}]}})
        record = "/var/run/istio-cni/dry-run.txt"
        add = self.r.run(["podman", "run", "--rm", "--network", self.network, *mounts,
                          "-e", "CNI_COMMAND=ADD", "-e", "CNI_CONTAINERID=0123456789abcdef",
                          "-e", "CNI_NETNS=/var/run/netns/check", "-e", "CNI_IFNAME=eth0",
                          "-e", "CNI_PATH=/opt/cni/bin",
                          "-e", f"CNI_ARGS=K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME=echo-cni-1;IgnoreUnknown=1",
                          "-e", f"DRY_RUN_FILE_PATH={record}", "-i", self.base_image, "/opt/cni/bin/istio-cni"],
                         check=False, stdin=stdin)
        recorded = (run_dir / "dry-run.txt").read_text() if (run_dir / "dry-run.txt").exists() else ""
        ok_add = add.returncode == 0 and "ISTIO_REDIRECT" in recorded
        lines = [line for line in recorded.splitlines() if "ISTIO_REDIRECT" in line and "15001" in line]
        self.r.result("istio-cni on a node without Python: ADD (dry run, in-process)", ok_add and ok_version,
                      f"exit {add.returncode}; pod echo-cni-1 read from the API; recorded "
                      f"{len(recorded.splitlines())} lines, e.g. `{lines[0] if lines else ''}`" if ok_add
                      else f"exit {add.returncode}: {(add.stderr or add.stdout)[-1500:]}")
        # A real ADD: the launcher hands it to install-cni's fast path, which programs the pod's netns.
        stdin = stdin.replace("/var/run/netns/check", f"/var/run/netns/{netns}")
        real = self.r.run(["podman", "run", "--rm", "--network", "none", *mounts,
                           "-v", "/var/run/netns:/var/run/netns:rslave",
                           "-e", "CNI_COMMAND=ADD", "-e", "CNI_CONTAINERID=fedcba9876543210",
                           "-e", f"CNI_NETNS=/var/run/netns/{netns}", "-e", "CNI_IFNAME=eth0",
                           "-e", "CNI_PATH=/opt/cni/bin",
                           "-e", f"CNI_ARGS=K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME=echo-cni-1;IgnoreUnknown=1",
                           "-i", self.base_image, "/opt/cni/bin/istio-cni"], check=False, stdin=stdin)
        rules = self.r.run(["ip", "netns", "exec", netns, "iptables-save", "-t", "nat"], check=False).stdout
        logs = self.r.run(["podman", "logs", name], check=False)
        answered = [line for line in (logs.stdout + logs.stderr).splitlines()
                    if "fast path: ADD for container fedcba9876543210" in line]
        redirect = [line for line in rules.splitlines() if "ISTIO_REDIRECT" in line and "15001" in line]
        ok_real = real.returncode == 0 and bool(redirect) and bool(answered)
        return self.r.result("istio-cni on a node without Python: ADD through install-cni's fast path", ok_real,
                             f"exit 0; install-cni: {answered[0].split('fast path: ', 1)[-1].strip()}; "
                             f"netns {netns}: `{redirect[0]}`" if ok_real
                             else f"exit {real.returncode}: {(real.stderr or real.stdout)[-1500:]}; "
                                  f"install-cni: {answered}; rules: {redirect}")

    def layout(self) -> bool:
        """The proxy image has what Istio's injection template and upstream's image promise."""
        script = ("id -u istio-proxy; id -g istio-proxy; "
                  "stat -c '%u:%g %a %n' /var/lib/istio /var/lib/istio/envoy /var/lib/istio/data /etc/istio/proxy "
                  "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json; "
                  "test -x /usr/local/bin/envoy && test -x /usr/local/bin/pilot-agent && echo binaries; "
                  "command -v iptables-restore >/dev/null && command -v ip >/dev/null && echo netfilter; "
                  "head -1 /usr/local/bin/istio-iptables | grep -q -- ' -IS$' && echo lean-iptables; "
                  f"test ! -e /usr/local/bin/istiod-local && {VENV_PYTHON} -c 'import importlib.util as u, sys; "
                  "sys.exit(any(u.find_spec(m) for m in (\"istiod_local\", \"aiohttp\", \"rich\", \"jwt\")))' "
                  "&& echo product-only; "
                  "/usr/local/bin/envoy --version | grep -o 'version: [^ ]*'")
        done = self.r.run(["podman", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", self.proxy_image,
                           "-c", script], check=False)
        entry = self.inspect(self.proxy_image, "{{json .Config.Entrypoint}}")
        lines = done.stdout.split("\n")
        owned = [line for line in lines
                 if line.startswith("1337:1337") and ("/var/lib/istio" in line or "/etc/istio/proxy" in line)]
        # The template is upstream's file, in the image only when the build found an Istio checkout (build.sh);
        # without it the agent renders the same bootstrap itself, so either is a good image.
        template = ("bootstrap template present" if " /var/lib/istio/envoy/envoy_bootstrap_tmpl.json" in done.stdout
                    else "no bootstrap template (the agent's built-in rendering)")
        ok = (lines[:2] == ["1337", "1337"] and len(owned) >= 4 and "binaries" in lines and "netfilter" in lines
              and "lean-iptables" in lines and "product-only" in lines and entry == '["/usr/local/bin/pilot-agent"]')
        envoy = next((line for line in lines if line.startswith("version:")), "?")
        return self.r.result("proxy image layout", ok,
                             f"entrypoint {entry}; istio-proxy 1337:1337 owns /var/lib/istio{{,/envoy,/data}} and "
                             f"/etc/istio/proxy; {template}; Envoy {envoy}; iptables and ip; "
                             f"istio-iptables the lean launcher; the product only (no istiod-local, aiohttp, rich "
                             f"or PyJWT)" if ok else done.stdout + done.stderr)

    def run(self) -> None:
        self.layout()
        self.network_up()
        self.istiod_up()
        self.play("echo-1", self.echo_ip,
                  [VENV_PYTHON, ECHO_APP_IN_POD, "serve", "--port", str(ECHO_PORT)])
        self.play("sleep-1", self.client_ip, ["sleep", "infinity"])
        for name in ("echo-1", "sleep-1"):
            self.check_init(name)
        ready = [self.ready(name) for name in ("echo-1", "sleep-1")]
        if all(ready):
            self.traffic()
            self.bug_report_tools("echo-1")
        self.cni()


def images_summary(runner: Runner, tag: str) -> None:
    out = runner.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}"], check=False).stdout
    wanted = ("localhost/istio-agent/base:bookworm", f"localhost/istio-agent/proxyv2:{tag}",
              f"localhost/istio-agent/install-cni:{tag}")
    for line in out.splitlines():
        if line.split(" ")[0] in wanted:
            print(f"  {line}")


def leftovers(runner: Runner, network: str) -> list[str]:
    """What of this run podman still has (nothing, after a clean exit)."""
    found = []
    pods = runner.run(["podman", "pod", "ps", "-q", "--filter", "name=sleep-1", "--filter", "name=echo-1"],
                      check=False).stdout.split()
    if pods:
        found.append(f"pods {pods}")
    if runner.run(["podman", "network", "exists", network], check=False).returncode == 0:
        found.append(f"network {network}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    version = tomllib.loads((HERE.parent.parent / "pyproject.toml").read_text())["project"]["version"]
    parser.add_argument("--tag", default=os.environ.get("IMAGE_TAG", version),
                        help="the images' tag (default: IMAGE_TAG, else the project's version, as make image tags)")
    parser.add_argument("--subnet", default="10.89.77.0/24", help="the podman network's /24 (default %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every command")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("image-check: run as root (podman kube play, a bridge, istio-init's iptables)", file=sys.stderr)
        return 2
    runner = Runner(args.verbose)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt
    # SIGINT too: Python leaves it ignored when the check starts with it ignored (a background job of a shell).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    started = time.monotonic()
    check: Check | None = None
    error = ""
    try:
        check = Check(args, runner)
        check.run()
    except CheckError as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted"
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        left = runner.cleanup()
        if check is not None:
            left += leftovers(runner, check.network)
    print("\n== image-check summary")
    print("images:")
    images_summary(runner, args.tag)
    for name, ok, detail in runner.results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if error:
        print(f"  FAIL  stopped: {error}")
    removed = "everything removed (pods, containers, network, bridge, istiod-local, files)"
    print(f"cleanup: {left if left else removed}")
    passed = not error and not left and bool(runner.results) and all(ok for _, ok, _ in runner.results)
    print(f"result: {'all checks held' if passed else 'FAILED'} ({time.monotonic() - started:.0f} s)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
