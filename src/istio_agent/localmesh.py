"""`make run` and `python -m istio_agent.localmesh`: `istiod-local up` with the default mesh (needs root).

`python -m istio_agent.localmesh [MESH.yaml] [--check] [--once] [--dir DIR]
[--capture cni|init] [--scale N] [--timeout S] [--pod-cidr CIDR]` is
`istiod-local up` (see `istio_agent.mesh` and docs/MESH.md): the mesh in
examples/mesh.yaml (an HTTP chain of three services, one in two versions, a
TCP service, proxyless gRPC, a pod outside the mesh, a STRICT namespace, a
service entry reached by name through the DNS proxy) on a local node whose
pods are built through the CNI chain, kept running with its live view until
Ctrl-C, which removes every namespace, process, mount and file it made.

The names below are the two-pod demo this module used to run, kept for the
tests and benchmarks that build their own small node with them: a client
(`sleep`) and an echo app behind the `echo` service at 10.96.0.20:80.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from istio_agent.node.local_node import LocalNode, Pod
from istio_agent.node.plan import PodPlan, registry_workloads
from istio_agent.node.processes import NodeError

ECHO_VIP = "10.96.0.20"
ECHO_URL = f"http://{ECHO_VIP}:80/"
CLIENT_SPIFFE = "spiffe://cluster.local/ns/default/sa/sleep"
ECHO_SPIFFE = "spiffe://cluster.local/ns/default/sa/echo"
ECHO_SERVICE: dict[str, Any] = {
    "name": "echo", "namespace": "default", "selector": {"app": "echo"}, "clusterIP": ECHO_VIP,
    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}],
}

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


def main(argv: list[str] | None = None) -> int:
    """`istiod-local up` with this module's historical flags (`--exit-after-ready` is `--once`)."""
    from istio_agent.mesh.up import UpOptions, default_mesh, interrupt_on_signals, run_up

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mesh_file", nargs="?", default=None, help="the mesh file (default examples/mesh.yaml)")
    parser.add_argument("--dir", default="run", help="istiod state, registry and logs go here (default ./run)")
    parser.add_argument("--once", "--exit-after-ready", dest="once", action="store_true",
                        help="exit once every pod is ready")
    parser.add_argument("--check", action="store_true",
                        help="probe every pair of workloads against the mesh file's policies; exit 0 if all held")
    parser.add_argument("--scale", type=int, default=1, help="multiply every deployment's replicas")
    parser.add_argument("--pod-cidr", default="10.244.0.0/24", help="the node's pod network")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each step")
    parser.add_argument("--capture", choices=("cni", "init"), default="cni",
                        help="who programs the pods' capture: the Istio CNI (default) or istio-init")
    parser.add_argument("--live", dest="live", action="store_true", default=None, help="force the live view")
    parser.add_argument("--plain", dest="live", action="store_false", help="the plain event log, not the live view")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("make run builds network namespaces and iptables rules: run it as root", file=sys.stderr)
        return 1
    if args.scale < 1:
        parser.error("--scale must be at least 1")
    interrupt_on_signals()
    mesh_file = Path(args.mesh_file) if args.mesh_file else default_mesh()
    options = UpOptions(mesh_file=mesh_file.resolve(), directory=Path(args.dir), capture=args.capture,
                        scale=args.scale, timeout=args.timeout, pod_cidr=args.pod_cidr)
    return run_up(options, args.check, args.once, args.live)


if __name__ == "__main__":
    sys.exit(main())
