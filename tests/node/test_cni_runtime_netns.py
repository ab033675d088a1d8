"""The CNI runtime with Debian's real plugins (root): bridge + host-local, and loopback on its own, run inside a
test "node" namespace for three pod namespaces; the kernel and host-local's files are what is checked.

host-local's `dataDir` is the test's own directory, never /var/lib/cni; every namespace is `iacni-<pid>-...`
and goes at the end, and nothing may be left in the host's namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from needs import need, need_root, need_tool
from support import host_links, netns_names

from istiod_local.node.cni_runtime import (
    CniRuntime,
    NetworkList,
    PluginError,
    RuntimeConf,
    loopback_network,
    parse_network,
)

CNI_BIN = Path("/usr/lib/cni")
SUBNET = "10.251.0.0/24"


@dataclass
class Node:
    netns: str
    pods: list[str]
    runtime: CniRuntime
    network: NetworkList
    ipam: Path


def _ip(*argv: str) -> str:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=True).stdout






def _conflist(ipam: Path) -> str:
    return json.dumps({"cniVersion": "1.0.0", "name": "iacni-test", "plugins": [{
        "type": "bridge", "bridge": "iacni0", "isGateway": True, "ipMasq": False, "capabilities": {"ips": True},
        "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": str(ipam)}}]})


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    need_root()
    need_tool("ip")
    for plugin in ("bridge", "host-local", "loopback"):
        need((CNI_BIN / plugin).is_file(), f"needs containernetworking-plugins' {plugin} in {CNI_BIN}")
    prefix = f"iacni-{os.getpid()}-"
    links_before = host_links()
    names = [f"{prefix}node"] + [f"{prefix}p{i}" for i in range(3)]
    try:
        for name in names:
            _ip("netns", "add", name)
        ipam = tmp_path / "ipam"
        network = parse_network(_conflist(ipam), "iacni-test.conflist")
        runtime = CniRuntime([CNI_BIN], tmp_path / "cache", f"/var/run/netns/{names[0]}",
                             {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        yield Node(names[0], names[1:], runtime, network, ipam)
    finally:
        for name in reversed(names):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    assert not {n for n in netns_names() if n.startswith(prefix)}
    assert host_links() == links_before


def _rt(node: Node, index: int, *args: tuple[str, str], **capabilities: object) -> RuntimeConf:
    pod = node.pods[index]
    return RuntimeConf(f"ctr{index}", f"/var/run/netns/{pod}", "eth0",
                       (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", f"p{index}"),
                        *args), capabilities)


def _addresses(netns: str, dev: str) -> list[str]:
    out = _ip("-n", netns, "-o", "-4", "addr", "show", "dev", dev)
    return [line.split()[3] for line in out.splitlines()]


def test_bridge_and_host_local_add_check_and_del_for_three_pods(node: Node) -> None:
    pinned_by_arg, pinned_by_capability = "10.251.0.77", "10.251.0.88"
    attachments = [_rt(node, 0), _rt(node, 1, ("IP", pinned_by_arg)), _rt(node, 2, ips=[f"{pinned_by_capability}/24"])]
    loopback = loopback_network()
    addresses = []
    for rt in attachments:
        lo = RuntimeConf(rt.container_id, rt.netns, "lo")
        assert node.runtime.add(loopback, lo)["ips"][0]["address"] == "127.0.0.1/8"
        result = node.runtime.add(node.network, rt)
        address = result["ips"][0]["address"]
        assert result["ips"][0]["gateway"] == "10.251.0.1"
        addresses.append(address)
        pod = rt.netns.rsplit("/", 1)[1]
        assert _addresses(pod, "eth0") == [address]
        assert "127.0.0.1/8" in _addresses(pod, "lo")
    assert addresses[1] == f"{pinned_by_arg}/24" and addresses[2] == f"{pinned_by_capability}/24"
    assert len(set(addresses)) == 3
    held = {p.name: p.read_text().splitlines()[0] for p in (node.ipam / "iacni-test").iterdir() if p.name[0].isdigit()}
    assert held == {a.split("/")[0]: rt.container_id for a, rt in zip(addresses, attachments, strict=True)}
    assert "10.251.0.1/24" in _addresses(node.netns, "iacni0")  # isGateway: the bridge holds the gateway
    node_links = _ip("-n", node.netns, "-o", "link", "show")
    assert node_links.count("master iacni0") == 3
    cached = sorted(p.name for p in (node.runtime.cache_dir / "results").iterdir())
    expected = [f"iacni-test-ctr{i}-eth0" for i in range(3)] + [f"cni-loopback-ctr{i}-lo" for i in range(3)]
    assert cached == sorted(expected)

    for rt in attachments:
        node.runtime.check(node.network, rt)
    # CHECK sees what the kernel has: an address gone from the pod fails it, naming bridge.
    victim = attachments[0]
    pod0 = victim.netns.rsplit("/", 1)[1]
    _ip("-n", pod0, "addr", "del", addresses[0], "dev", "eth0")
    with pytest.raises(PluginError, match="bridge"):
        node.runtime.check(node.network, victim)

    for rt in reversed(attachments):
        node.runtime.delete(node.network, rt)
        node.runtime.delete(loopback, RuntimeConf(rt.container_id, rt.netns, "lo"))
    assert [p.name for p in (node.ipam / "iacni-test").iterdir() if p.name[0].isdigit()] == []
    assert "master iacni0" not in _ip("-n", node.netns, "-o", "link", "show")
    for pod in node.pods:
        assert _ip("-n", pod, "-o", "link", "show").count(": eth0") == 0
    assert list((node.runtime.cache_dir / "results").iterdir()) == []
    node.runtime.delete(node.network, attachments[0])  # a second DEL, nothing cached: still succeeds


def test_a_failing_ipam_stops_the_chain_with_the_plugins_error(node: Node) -> None:
    taken = _rt(node, 0, ("IP", "10.251.0.50"))
    node.runtime.add(node.network, taken)
    clash = _rt(node, 1, ("IP", "10.251.0.50"))
    with pytest.raises(PluginError) as caught:
        node.runtime.add(node.network, clash)
    assert caught.value.plugin == "bridge" and caught.value.code is not None
    assert "10.251.0.50" in caught.value.msg
    assert not node.runtime.cache_path(node.network, clash).exists()
    node.runtime.delete(node.network, clash)  # what a runtime does after a failed ADD
    node.runtime.delete(node.network, taken)
    assert [p.name for p in (node.ipam / "iacni-test").iterdir() if p.name[0].isdigit()] == []
