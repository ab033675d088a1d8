"""The local node's plan: names, addresses, commands, agent environment (pure; no root needed)."""

from __future__ import annotations

import json

import pytest

from istiod_local.controlplane.xds.registry import parse_registry
from istiod_local.node.plan import (
    PlanError,
    PodSpec,
    agent_argv,
    agent_environment,
    capture_args,
    downward_api_text,
    in_netns,
    node_setup_commands,
    parse_netns_list,
    plan_node,
    plan_pod,
    pod_setup_commands,
    registry_workloads,
    stale_namespaces,
)


def test_node_is_named_after_its_owner_and_takes_the_first_address_as_gateway() -> None:
    node = plan_node(4242, 3, "10.250.0.0/24")
    assert node.netns == "ia-4242-3-node"
    assert node.prefix == "ia-4242-3-"
    assert node.gateway == "10.250.0.1"
    assert node.istiod_tls_addr == "10.250.0.1:15012"
    assert node.istiod_plaintext_addr == "10.250.0.1:15010"


@pytest.mark.parametrize("cidr", ["10.244.0.1/24", "not-a-cidr", "10.0.0.0/31", "fd00::/64"])
def test_bad_pod_cidrs_are_refused(cidr: str) -> None:
    with pytest.raises(PlanError, match="pod CIDR"):
        plan_node(1, 0, cidr)


def test_pods_get_the_next_free_addresses_and_pinned_ones_are_honoured() -> None:
    node = plan_node(1)
    first = plan_pod(node, PodSpec("a"), [])
    pinned = plan_pod(node, PodSpec("b", ip="10.244.0.9"), [first])
    third = plan_pod(node, PodSpec("c"), [first, pinned])
    assert (first.ip, pinned.ip, third.ip) == ("10.244.0.2", "10.244.0.9", "10.244.0.3")
    assert first.netns == "ia-1-0-a" and first.gateway == "10.244.0.1" and first.prefix_len == 24
    assert (first.node_veth, pinned.node_veth) == ("veth2", "veth9")  # unique within the node namespace
    assert all(len(p.node_veth) <= 15 for p in (first, pinned, third))


@pytest.mark.parametrize(("spec", "message"), [
    (PodSpec("Bad_Name"), "pod name"),
    (PodSpec("x" * 43), "pod name"),
    (PodSpec("a"), "already exists"),
    (PodSpec("b", ip="10.244.0.2"), "already in use"),
    (PodSpec("b", ip="10.244.0.1"), "already in use"),
    (PodSpec("b", ip="10.245.0.2"), "not a host address"),
    (PodSpec("b", ip="10.244.0.255"), "not a host address"),
    (PodSpec("b", ip="banana"), "not an IPv4 address"),
])
def test_bad_pods_are_refused_with_the_reason(spec: PodSpec, message: str) -> None:
    node = plan_node(1)
    existing = plan_pod(node, PodSpec("a"), [])
    with pytest.raises(PlanError, match=message):
        plan_pod(node, spec, [existing])


def test_a_full_cidr_is_reported() -> None:
    node = plan_node(1, 0, "10.244.0.0/30")  # gateway .1, one pod .2
    only = plan_pod(node, PodSpec("a"), [])
    with pytest.raises(PlanError, match="full"):
        plan_pod(node, PodSpec("b"), [only])


def test_setup_commands_never_touch_the_host_namespace() -> None:
    """Every link/addr/route command names a namespace; only `ip netns add` runs without one."""
    node = plan_node(7)
    pod = plan_pod(node, PodSpec("echo-1"), [])
    commands = node_setup_commands(node) + pod_setup_commands(node, pod)
    for argv in commands:
        assert argv[0] == "ip"
        assert argv[1:3] == ["netns", "add"] or argv[1] == "-n", argv
    veth = next(a for a in commands if "veth" in a)
    assert veth[:3] == ["ip", "-n", node.netns] and veth[-2:] == ["netns", pod.netns]
    assert ["ip", "-n", pod.netns, "route", "add", "default", "via", "10.244.0.1"] in commands
    assert ["ip", "-n", pod.netns, "addr", "add", "10.244.0.2/24", "dev", "eth0"] in commands
    assert ["ip", "-n", node.netns, "addr", "add", "10.244.0.1/24", "dev", "br0"] in commands


def test_in_netns_switches_user_after_entering_and_keeps_the_death_signal() -> None:
    argv = in_netns("ns1", ["prog", "--flag"], uid=1337, gid=1337)
    assert argv[:4] == ["ip", "netns", "exec", "ns1"]
    assert argv[4:7] == ["setpriv", "--pdeathsig", "SIGTERM"]
    assert argv[7:9] == ["--reuid", "1337"] and argv[9:12] == ["--regid", "1337", "--clear-groups"]
    assert argv[12:15] == ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]  # the container's limits
    assert argv[-3:] == ["--", "prog", "--flag"]
    assert "--reuid" not in in_netns("ns1", ["prog"], gid=1337)
    assert "--no-new-privs" not in in_netns("ns1", ["prog"], uid=0)  # root (the node's own steps) stays root


def test_stale_namespaces_are_those_of_dead_owners_only() -> None:
    names = ["ia-100-0-node", "ia-100-0-echo-1", "ia-200-0-node", "ia-300-1-client", "cap1", "ia-x-node", "other"]
    alive = {200}
    stale = stale_namespaces(names, lambda pid: pid in alive, own_pid=300)
    assert stale == ["ia-100-0-echo-1", "ia-100-0-node"]  # pods before the node


def test_parse_netns_list() -> None:
    assert parse_netns_list("ia-1-0-a (id: 3)\nia-1-0-node (id: 2)\ncap1\n\n") == ["ia-1-0-a", "ia-1-0-node", "cap1"]


def test_capture_args_are_the_injectors_in_the_pod_namespace() -> None:
    node = plan_node(5)
    pod = plan_pod(node, PodSpec("echo-1"), [])
    args = capture_args(pod)
    assert args[:2] == ["--network-namespace", "/var/run/netns/ia-5-0-echo-1"]
    flags = dict(zip(args[2::2], args[3::2], strict=True))
    assert flags == {"-p": "15001", "-z": "15006", "-u": "1337", "-g": "1337", "-m": "REDIRECT", "-i": "*",
                     "-x": "", "-b": "*", "-d": "15090,15021,15020"}
    dns = plan_pod(node, PodSpec("dns-1", dns_capture=True), [pod])
    assert capture_args(dns)[-1] == "--redirect-dns"


def test_agent_environment_points_at_istiod_on_the_gateway() -> None:
    node = plan_node(5)
    pod = plan_pod(node, PodSpec("client-1", service_account="sleep", proxy_config={"concurrency": 2},
                                 agent_env={"EXTRA": "1"}), [])
    env = agent_environment(node, pod, {"PATH": "/bin", "SECRET": "x"}, {"binaryPath": "/opt/envoy",
                                                                        "terminationDrainDuration": "3s"})
    assert env["PATH"] == "/bin" and "SECRET" not in env  # only harmless host variables pass
    assert (env["POD_NAME"], env["POD_NAMESPACE"], env["SERVICE_ACCOUNT"]) == ("client-1", "default", "sleep")
    assert env["INSTANCE_IP"] == "10.244.0.2"
    assert env["CA_ADDR"] == "10.244.0.1:15012"
    assert env["ISTIOD_SAN"] == "istiod.istio-system.svc"
    assert "ISTIO_AGENT_ENVOY_UID" not in env  # the agent runs as 1337 itself: Envoy inherits its user
    assert env["EXTRA"] == "1"
    assert "ISTIO_META_DNS_CAPTURE" not in env
    assert json.loads(env["PROXY_CONFIG"]) == {"discoveryAddress": "10.244.0.1:15012", "binaryPath": "/opt/envoy",
                                               "terminationDrainDuration": "3s", "concurrency": 2}
    argv = agent_argv(pod, "/venv/bin/pilot-agent")
    assert argv[:3] == ["/venv/bin/pilot-agent", "proxy", "sidecar"]
    assert argv[argv.index("--domain") + 1] == "default.svc.cluster.local"


def test_downward_api_text_quotes_values_like_kubernetes() -> None:
    assert downward_api_text({"version": "v1", "app": 'e"cho'}) == 'app="e\\"cho"\nversion="v1"\n'


def test_registry_workloads_are_accepted_by_istiod_locals_registry() -> None:
    node = plan_node(5)
    echo = plan_pod(node, PodSpec("echo-1", service_account="echo", labels={"app": "echo"}), [])
    text = json.dumps({"services": [{"name": "echo", "selector": {"app": "echo"},
                                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}],
                       "workloads": registry_workloads([echo])})
    registry = parse_registry(text)
    [workload] = registry.workloads
    assert (workload.name, workload.ip, workload.service_account) == ("echo-1", "10.244.0.2", "echo")
