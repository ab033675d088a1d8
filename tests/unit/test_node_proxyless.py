"""Proxyless pods as data: the grpc-agent template's environment, argv, volumes and container wrapper."""

from __future__ import annotations

import json
from typing import Any

import pytest

from istiod_local.node import proxyless
from istiod_local.node.plan import NodePlan, PodPlan, PodSpec, bridge_mac, plan_node, plan_pod


def _pod(**fields: Any) -> tuple[NodePlan, PodPlan]:
    node = plan_node(4242, 0)
    return node, plan_pod(node, PodSpec("greeter-1", service_account="greeter", proxyless=True, **fields), [])


def test_agent_environment_is_the_grpc_agent_templates() -> None:
    node, pod = _pod(app=["app"], agent_env={"SECRET_TTL": "20s"})
    env = proxyless.agent_environment(node, pod, {"PATH": "/bin", "ISTIO_META_X": "leak"})
    assert env["ISTIO_META_GENERATOR"] == "grpc" and env["DISABLE_ENVOY"] == "true"
    assert env["OUTPUT_CERTS"] == "/var/lib/istio/data"
    assert env["PILOT_CERT_PROVIDER"] == "istiod"
    assert env["CA_ADDR"] == "10.244.0.1:15012" and env["ISTIOD_SAN"] == "istiod.istio-system.svc"
    assert json.loads(env["PROXY_CONFIG"]) == {"discoveryAddress": "10.244.0.1:15012"}
    assert env["ISTIO_META_CLUSTER_ID"] == "Kubernetes" and env["TRUST_DOMAIN"] == "cluster.local"
    assert (env["POD_NAME"], env["POD_NAMESPACE"], env["SERVICE_ACCOUNT"], env["INSTANCE_IP"]) == (
        "greeter-1", "default", "greeter", "10.244.0.2")
    assert env["ISTIO_META_DNS_CAPTURE"] == "false"
    assert env["SECRET_TTL"] == "20s"  # the pod's own additions win
    assert "ISTIO_META_X" not in env and env["PATH"] == "/bin"  # nothing of the caller's mesh settings leaks in


def test_agent_args_and_post_start_hook() -> None:
    _, pod = _pod()
    assert proxyless.agent_argv(pod, "pilot-agent") == [
        "pilot-agent", "proxy", "sidecar", "--domain", "default.svc.cluster.local", "--proxyLogLevel=warning",
        "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"]
    hook = proxyless.post_start_argv("pilot-agent", 30)
    assert hook[:3] == ["pilot-agent", "wait", "--url=http://localhost:15020/healthz/ready"]


def test_app_gets_the_bootstrap_path() -> None:
    _, pod = _pod(app_env={"X": "1"})
    env = proxyless.app_environment(pod, {"PATH": "/bin"})
    assert env["GRPC_XDS_BOOTSTRAP"] == "/etc/istio/proxy/grpc-bootstrap.json"
    assert env["GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT"] == "true" and env["X"] == "1"


def test_volumes_share_istio_xds_and_istio_data() -> None:
    assert set(proxyless.APP_VOLUMES) <= set(proxyless.AGENT_VOLUMES)
    mounts = proxyless.volume_mounts("/pods/p1/", proxyless.APP_VOLUMES)
    assert ("/pods/p1/etc/istio/proxy", "/etc/istio/proxy") in mounts
    assert ("/pods/p1/var/lib/istio/data", "/var/lib/istio/data") in mounts
    assert "/var/run/secrets/tokens" in proxyless.mount_targets()


@pytest.mark.parametrize(("cidr", "mac"), [("10.244.0.0/24", "02:00:0a:f4:00:01"),
                                          ("10.250.3.0/24", "02:00:0a:fa:03:01")])
def test_bridge_mac_is_fixed_per_gateway(cidr: str, mac: str) -> None:
    assert bridge_mac(plan_node(1, 0, cidr)) == mac
