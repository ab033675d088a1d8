"""`make run`: a local mesh on this machine, no Kubernetes (needs root).

It builds a local node (network namespaces; see `istio_agent.node`) with
istiod-local on the node's gateway address and two pods:

- `client-1` (service account `sleep`): a sidecar and no app;
- `echo-1` (service account `echo`, label app=echo): an HTTP echo app on 8080
  behind the `echo` service, clusterIP 10.96.0.20 port 80.

Each pod is built as a Kubernetes node with the Istio CNI builds it
(`--capture cni`, the default): istiod-local also serves its Kubernetes API
on the gateway (:6443), `install-cni` runs on the node and appends the
`istio-cni` plugin to the node's conflist, and every pod's network comes
from the CNI chain (loopback, bridge + host-local, istio-cni), whose plugin
reads the pod through the API and programs its capture; the
`istio-validation` init container checks it before the app starts, and
install-cni's repair watches for pods where it failed. With `--capture init`
capture rules come from `istio-iptables` (as root, as istio-init) instead.
Each pod then runs `pilot-agent proxy sidecar` as uid 1337, the istio-proxy container's
user, whose Envoy (the same user) takes its config from istiod-local through
the agent. The run directory may be anywhere (a checkout in a 0700 home
included): the pod directories and the Envoy that uid 1337 runs live in the
node's runtime directory under /run/istio-agent-node, removed on exit.
Once both are ready, a request goes from the client pod to
`http://10.96.0.20:80/`: the client's Envoy captures it, opens mTLS to the
echo pod, whose Envoy checks the client certificate (the `default` namespace is
STRICT) and passes the request to the app with `x-forwarded-client-cert`
naming the client's SPIFFE id. The app echoes its headers back, and this
prints them. Then it keeps running (Ctrl-C stops everything and removes every
namespace, process and socket it made), or exits with `--once`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from istio_agent.node.local_node import LocalNode, NodeOptions, Pod
from istio_agent.node.plan import PodPlan, PodSpec, registry_workloads
from istio_agent.node.processes import NodeError

ECHO_VIP = "10.96.0.20"
ECHO_URL = f"http://{ECHO_VIP}:80/"
CLIENT_SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"
ECHO_SPIFFE = "spiffe://cluster.local/ns/default/sa/echo"
ECHO_SERVICE: dict[str, Any] = {
    "name": "echo", "namespace": "default", "selector": {"app": "echo"}, "clusterIP": ECHO_VIP,
    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}],
}

# Istio's default stats inclusion list leaves out TLS counters; keep the one that shows the handshakes.
DEMO_PROXY_CONFIG: dict[str, Any] = {"proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]}}


def pod_specs(python: str) -> list[PodSpec]:
    """The two pods of the demo: a client with only a sidecar, and the echo app with its sidecar."""
    return [
        PodSpec("client-1", service_account="sleep", labels={"app": "sleep"}),
        PodSpec("echo-1", service_account="echo", labels={"app": "echo"},
                app=[python, "-m", "istio_agent.node.echo_app", "serve", "--port", "8080"]),
    ]


def registry_yaml(pods: list[PodPlan], services: list[dict[str, Any]], mtls: str = "STRICT") -> str:
    """istiod-local's registry for these pods (their planned IPs) and services."""
    return yaml.safe_dump({"services": services, "workloads": registry_workloads(pods),
                           "peerAuthentication": {"default": mtls}}, sort_keys=False)


def request(node: LocalNode, client: Pod, url: str, deadline: float) -> dict[str, Any]:
    """GET `url` from the client pod, retrying until a 200 or the deadline; the echo app's JSON answer."""
    last: Any = None
    while True:
        done = node.exec(client, [node.options.python, "-m", "istio_agent.node.echo_app", "get", url])
        try:
            answer: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            answer = {"error": done.stdout.strip() or done.stderr.strip()}
        if answer.get("status") == 200 and isinstance(answer.get("body"), dict):
            return answer
        last = answer
        if time.monotonic() > deadline:
            raise NodeError(f"no answer from {url}: last attempt gave {last}")
        time.sleep(0.2)


def ssl_handshakes(node: LocalNode, pod: Pod, needle: str) -> int:
    """Sum of Envoy's `ssl.handshake` counters whose name contains `needle`."""
    total = 0
    for line in node.envoy_admin(pod, "stats?filter=ssl.handshake").splitlines():
        name, _, value = line.partition(": ")
        if needle in name and value.strip().isdigit():
            total += int(value)
    return total


def show_answer(node: LocalNode, client: Pod, echo: Pod, answer: dict[str, Any]) -> bool:
    """Print what crossed the mesh; True when it proves the client's identity reached the app over mTLS."""
    body = answer["body"]
    headers: dict[str, str] = body.get("headers", {})
    xfcc = headers.get("x-forwarded-client-cert", "")
    print(f"\nGET {ECHO_URL} from {client.name} ({client.ip}) -> {answer['status']}, served by {body.get('pod')}")
    for key in sorted(headers):
        print(f"  {key}: {headers[key]}")
    outbound = ssl_handshakes(node, client, "outbound|80||echo.default.svc.cluster.local")
    inbound = ssl_handshakes(node, echo, "listener.")
    print(f"\nclient Envoy: TLS handshakes on outbound|80||echo.default.svc.cluster.local: {outbound}")
    print(f"echo Envoy:   TLS handshakes on its inbound listener: {inbound}")
    ok = f"URI={CLIENT_SPIFFE}" in xfcc and f"By={ECHO_SPIFFE}" in xfcc and outbound > 0 and inbound > 0
    if ok:
        print(f"\nmTLS between the sidecars: the echo app saw the client's identity {CLIENT_SPIFFE}")
    else:
        print("\nthe answer does not show mTLS with the client's identity", file=sys.stderr)
    return ok


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    base = Path(args.dir).resolve()
    python = sys.executable
    node = LocalNode(NodeOptions(workdir=base / "node", istiod_state=base / "istiod",
                                 registry=base / "mesh.yaml", pod_cidr=args.pod_cidr,
                                 ready_timeout=args.timeout, proxy_config=DEMO_PROXY_CONFIG, capture=args.capture))
    try:
        node.create()
        print(f"node: namespace {node.plan.netns}, bridge {node.plan.bridge} {node.plan.gateway}/"
              f"{node.plan.network.prefixlen}; logs in {node.logs}")
        client_plan, echo_plan = node.plan_pods(pod_specs(python))
        node.registry.write_text(registry_yaml([client_plan, echo_plan], [ECHO_SERVICE]))
        node.start_istiod()
        print(f"istiod-local: {node.plan.istiod_tls_addr} (TLS) and {node.plan.istiod_plaintext_addr}, "
              f"state in {node.istiod_state}, registry {node.registry}")
        if node.cni is not None:
            print(f"Kubernetes API on {node.plan.gateway}:6443; install-cni ready, chain in {node.cni.paths.conflist}")
        client, echo = node.add_pod(client_plan), node.add_pod(echo_plan)
        for pod in (client, echo):
            print(f"pod {pod.name}: {pod.ip} in namespace {pod.netns}, directory {pod.dir}")
        print(f"pilot-agent and Envoy run as uid 1337; Envoy: {node.proxy_config['binaryPath']} "
              f"({node.envoy_install or 'as configured'})")
        node.wait_ready([client, echo], {echo.name: 8080})
        print("both sidecars ready (:15021/healthz/ready)")
        answer = request(node, client, ECHO_URL, time.monotonic() + args.timeout)
        ok = show_answer(node, client, echo, answer)
        if args.once or not ok:
            return 0 if ok else 1
        print(f"\nrunning; try: ip netns exec {client.netns} {python} -m istio_agent.node.echo_app get {ECHO_URL}")
        print("Ctrl-C stops everything")
        while True:
            for proc in [*client.processes(), *echo.processes(), *([node.istiod] if node.istiod else [])]:
                if not proc.running():
                    print(proc.describe_exit(), file=sys.stderr)
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping")
        return 0
    except NodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            node.close()
        except NodeError as exc:
            print(f"cleanup: {exc}", file=sys.stderr)
        print("removed the node's namespaces, processes and pod directories")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="run", help="istiod state, registry and logs go here (default ./run)")
    parser.add_argument("--once", "--exit-after-ready", dest="once", action="store_true",
                        help="exit after the request (0 when it proved mTLS with the client's identity)")
    parser.add_argument("--pod-cidr", default="10.244.0.0/24", help="the node's pod network")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each step")
    parser.add_argument("--capture", choices=("cni", "init"), default="cni",
                        help="who programs the pods' capture: the Istio CNI (default) or istio-init")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("make run builds network namespaces and iptables rules: run it as root", file=sys.stderr)
        return 1
    # SIGINT too: Python leaves it ignored when it started ignored (a background job of a non-interactive
    # shell, nohup), and Ctrl-C or a caller's SIGINT must still stop and clean up.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
