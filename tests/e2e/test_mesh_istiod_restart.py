"""istiod-local restarted under running pods: traffic keeps flowing, and later config still arrives (root).

Envoy keeps its listeners, clusters and certificates while the control plane
is away; the agents' XDS proxies pass the upstream failure down, Envoy
reconnects through them, and istiod-local (same state directory, so the same
root) serves the new streams. A service added to the registry afterwards must
then reach the client's Envoy and carry traffic.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml
from launchers import RegistryFile, local_node
from needs import need_root, need_tool
from support import poll

from istiod_local.node.demo import CLIENT_SPIFFE, ECHO_SERVICE, ECHO_URL, registry_yaml
from istiod_local.node.local_node import LocalNode, Pod
from istiod_local.node.plan import PodSpec

PY = sys.executable
EXTRA_VIP = "10.96.0.30"
EXTRA_SERVICE: dict[str, Any] = {
    "name": "extra", "namespace": "default", "selector": {"app": "echo"}, "clusterIP": EXTRA_VIP,
    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}],
}
EXTRA_CLUSTER = "outbound|80||extra.default.svc.cluster.local"


def _get(node: LocalNode, pod: Pod, url: str) -> dict[str, Any]:
    done = node.exec(pod, [PY, "-m", "istiod_local.node.echo_app", "get", url, "--timeout", "5"])
    answer: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr}
    return answer


def _served_with_identity(answer: dict[str, Any]) -> bool:
    body = answer.get("body")
    return (answer.get("status") == 200 and isinstance(body, dict)
            and f"URI={CLIENT_SPIFFE}" in body["headers"].get("x-forwarded-client-cert", ""))


def test_traffic_survives_an_istiod_restart_and_a_later_registry_change_reaches_envoy() -> None:
    need_root()
    for tool in ("ip", "setpriv", "iptables"):
        need_tool(tool)
    with local_node("ia-restart-", ready_timeout=60) as node:
        plans = node.plan_pods([
            PodSpec("client-1", service_account="sleep", labels={"app": "sleep"}),
            PodSpec("echo-1", service_account="echo", labels={"app": "echo"},
                    app=[PY, "-m", "istiod_local.node.echo_app", "serve", "--port", "8080"]),
        ])
        registry = RegistryFile(node.registry, registry_yaml(plans, [ECHO_SERVICE]))
        node.start_istiod()
        client, echo = (node.add_pod(plan) for plan in plans)
        node.wait_ready([client, echo], {"echo-1": 8080})
        poll(lambda: _served_with_identity(_get(node, client, ECHO_URL)), "the first request", timeout=45)

        node.stop_istiod()
        for _ in range(3):  # the control plane is gone; the data plane is not
            answer = _get(node, client, ECHO_URL)
            assert _served_with_identity(answer), answer
        node.start_istiod()
        for _ in range(3):
            answer = _get(node, client, ECHO_URL)
            assert _served_with_identity(answer), answer

        # Only after the restart: a new service, pushed over the reconnected streams.
        assert EXTRA_CLUSTER not in node.envoy_admin(client, "config_dump?resource=dynamic_active_clusters")
        content = yaml.safe_load(registry_yaml(plans, [ECHO_SERVICE]))
        content["services"].append(EXTRA_SERVICE)
        registry.write(content)
        poll(lambda: EXTRA_CLUSTER in node.envoy_admin(client, "config_dump?resource=dynamic_active_clusters"),
             f"{EXTRA_CLUSTER} in the client's config_dump", timeout=45)
        answer = poll(lambda: (a := _get(node, client, f"http://{EXTRA_VIP}/")).get("status") == 200 and a,
                      "the new service to answer", timeout=45)
        assert _served_with_identity(answer) and answer["body"]["pod"] == "echo-1", answer
