"""The two-pod demo's names, for tests and benchmarks that build a small node of their own.

A client (`sleep`) and an echo app behind the `echo` service at 10.96.0.20:80,
istiod-local's registry for a list of planned pods, a GET from a pod with
retries, and Envoy's TLS handshake counters. `istiod-local up` (`mesh/`) is
what brings a whole mesh file up; this module only names the small demo.
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodPlan, registry_workloads
from istiod_local.node.processes import NodeError

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
        done = node.exec(client, [node.options.python, "-m", "istiod_local.node.echo_app", "get", url])
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
