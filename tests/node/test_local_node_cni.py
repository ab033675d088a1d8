"""The local node in CNI mode (root): pods built through the real chain (loopback, bridge + host-local,
istio-cni appended by a running install-cni), capture from the plugin reading the pod through
istiod-local's Kubernetes API, istio-validation, DEL, repair, and nothing left afterwards.

One node serves the module. Sidecar pods here run small listeners on Envoy's ports instead of an agent
(`PodSpec(agent=False)`), as root in the pod namespace: what is checked is where the kernel delivers a
connection (which port accepted it, its `SO_ORIGINAL_DST`, its local address), `iptables-save` in each
pod's namespace, host-local's lease files and the API's view of the pods. The agent itself through this
chain is what tests/e2e/test_mesh_* run (CNI mode is the node's default).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchers import RegistryFile, local_node
from needs import need, need_root, need_tool
from support import netns_names, poll

from istiod_local.node.cni_plan import NETWORK_NAME
from istiod_local.node.local_node import LocalNode, Pod, PodInitError
from istiod_local.node.plan import PodSpec, registry_workloads
from istiod_local.node.processes import NodeError, pid_alive

PY = sys.executable
SLEEPER = [PY, "-c", "import time; time.sleep(3600)"]
LISTENER = """
import json, select, socket, struct, sys
ports, transparent = [int(p) for p in sys.argv[1].split(",")], sys.argv[2] == "1"
listeners = {}
for port in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if transparent:
        s.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT, as Envoy's TPROXY inbound listener
    s.bind(("0.0.0.0", port))
    s.listen(64)
    listeners[s] = port
print(json.dumps({"ready": ports}), flush=True)
while True:
    for s in select.select(list(listeners), [], [])[0]:
        conn, peer = s.accept()
        try:
            raw = conn.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
            orig = "%s:%d" % (socket.inet_ntoa(raw[4:8]), struct.unpack_from("!H", raw, 2)[0])
        except OSError:
            orig = None
        local = "%s:%d" % conn.getsockname()
        print(json.dumps({"port": listeners[s], "local": local, "orig": orig, "peer": peer[0]}), flush=True)
        conn.close()
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except OSError as exc:
    print("failed", exc)
"""
ENVOY_PORTS = "15001,15006"
EXCLUSIONS = {"traffic.sidecar.istio.io/excludeInboundPorts": "8081",
              "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.50/32",
              "traffic.sidecar.istio.io/excludeOutboundPorts": "5432"}
INJECTION = "eth0 -j ACCEPT"


def _listener(ports: str, transparent: bool = False) -> list[str]:
    return [PY, "-c", LISTENER, ports, "1" if transparent else "0"]


SPECS = [
    PodSpec("cap-1", agent=False, app=_listener(ENVOY_PORTS)),
    PodSpec("excl-1", agent=False, app=_listener(f"{ENVOY_PORTS},8081"), annotations=EXCLUSIONS),
    PodSpec("tproxy-1", agent=False, app=_listener(ENVOY_PORTS, transparent=True),
            annotations={"sidecar.istio.io/interceptionMode": "TPROXY"}),
    PodSpec("plain-1", sidecar=False, app=SLEEPER),
    PodSpec("sys-1", namespace="kube-system", agent=False),
    PodSpec("evil-1", agent=False, annotations={"traffic.sidecar.istio.io/excludeInterfaces": INJECTION}),
    PodSpec("gone-1", agent=False),
]


@pytest.fixture(scope="module")
def node() -> Iterator[LocalNode]:
    need_root()
    for tool in ("ip", "setpriv", "iptables-save"):
        need_tool(tool)
    for plugin in ("bridge", "host-local", "loopback"):
        need(Path(f"/usr/lib/cni/{plugin}").is_file(), f"needs containernetworking-plugins' {plugin}")
    with local_node("iacni-node-", ready_timeout=30, capture="cni", cni_repair="label") as local:
        plans = local.plan_pods(SPECS)
        RegistryFile(local.registry, yaml.safe_dump({"workloads": registry_workloads(plans)}))
        local.start_istiod()
        assert local.cni is not None and local.cni.agent is not None
        installer = local.cni.agent.pid
        yield local
        prefix, runtime = local.plan.prefix, local.runtime.path
    # What close() must leave: no namespace of the node, no runtime directory (net.d, bin, leases, cache),
    # install-cni stopped by SIGTERM and exiting cleanly (its cleanup ran).
    assert not [name for name in netns_names() if name.startswith(prefix)]
    assert not runtime.exists()
    assert not pid_alive(installer)
    assert local.cni is not None and local.cni.agent_exit == 0
    assert local.cni.conflist_at_stop == local.cni.conflist_written  # our entry removed, the rest byte-identical
    assert not local.cni.plugin_left_at_stop




def _rules(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "iptables-save"], capture_output=True, text=True,
                          check=True).stdout


def _pod(node: LocalNode, name: str) -> Pod:
    if name not in node.pods:
        plan = next(p for p in node.planned if p.name == name)
        node.add_pod(plan)
    return node.pods[name]


def _listening(node: LocalNode, pod: Pod) -> None:
    log = node.logs / f"{pod.name}-app.log"
    poll(lambda: log.exists() and '"ready"' in log.read_text(), f"{pod.name}'s listeners", 15)


def _accepted(node: LocalNode, pod: Pod) -> list[dict[str, Any]]:
    lines = (node.logs / f"{pod.name}-app.log").read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if "port" in entry]


def _connect(node: LocalNode, pod: Pod | str, host: str, port: int) -> str:
    return node.exec(pod, [PY, "-c", CONNECT, host, str(port)]).stdout.strip()


def _leases(node: LocalNode) -> set[str]:
    assert node.cni is not None
    folder = node.cni.paths.ipam_dir / NETWORK_NAME
    return {p.name for p in folder.iterdir() if p.name[0].isdigit()} if folder.exists() else set()


def test_the_chain_is_installed_and_a_sidecar_pods_connections_land_on_envoys_ports(node: LocalNode) -> None:
    assert node.cni is not None
    conflist = json.loads(node.cni.paths.conflist.read_text())
    assert [p["type"] for p in conflist["plugins"]] == ["bridge", "istio-cni"]  # install-cni appended its entry
    assert (node.cni.paths.bin_dir / "istio-cni").is_file()
    pod, client = _pod(node, "cap-1"), _pod(node, "plain-1")
    assert pod.validation == [0]  # istio-validation passed before the app started
    # The capture came from istio-cni, not from the node calling istio-iptables as istio-init would: the
    # plugin's own log line for this pod reached install-cni's log (through its log socket), no init log.
    agent_log = node.logs / "install-cni.log"
    poll(lambda: agent_log.exists() and "configuration for cap-1 =" in agent_log.read_text(errors="replace"),
         "istio-cni's log line for cap-1 in install-cni's log", 10)
    assert not (node.logs / "cap-1-init.log").exists()
    rules = _rules(pod.netns)
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
    _listening(node, pod)

    assert _connect(node, pod, "10.96.0.99", 80) == "open"  # outbound, nothing listens there: Envoy's 15001 did
    assert _connect(node, client, pod.ip, 8080) == "open"  # inbound from another pod: 15006
    accepted = _accepted(node, pod)
    assert {"port": 15001, "orig": "10.96.0.99:80"}.items() <= accepted[0].items()
    assert {"port": 15006, "orig": f"{pod.ip}:8080", "peer": client.ip}.items() <= accepted[1].items()

    api_pod = node.cni.api.get_pod("default", "cap-1") if node.cni.api else None
    assert api_pod is not None
    [validation] = api_pod["status"]["initContainerStatuses"]
    assert validation["name"] == "istio-validation" and validation["state"]["terminated"]["exitCode"] == 0
    assert api_pod["status"]["podIP"] == pod.ip
    assert node.cni.status_errors == []  # every status PATCH so far was accepted


def test_a_pod_without_a_sidecar_gets_no_rules(node: LocalNode) -> None:
    client = _pod(node, "plain-1")
    assert "ISTIO" not in _rules(client.netns)
    assert client.validation == []  # no istio-validation in a pod outside the mesh


def test_exclusion_annotations_hold(node: LocalNode) -> None:
    pod, client = _pod(node, "excl-1"), _pod(node, "plain-1")
    rules = _rules(pod.netns)
    assert "-A ISTIO_OUTPUT -d 10.96.0.50/32 -j RETURN" in rules
    assert "--dport 8081 -j RETURN" in rules and "--dport 5432 -j RETURN" in rules
    _listening(node, pod)
    assert _connect(node, client, pod.ip, 8081) == "open"  # excluded inbound port: the app's own listener
    assert _connect(node, pod, "10.96.0.50", 80).startswith("failed")  # excluded range: not to Envoy
    assert _connect(node, pod, "10.96.0.99", 5432).startswith("failed")  # excluded port: not to Envoy
    assert _connect(node, pod, "10.96.0.99", 80) == "open"  # everything else still is
    accepted = _accepted(node, pod)
    assert [(a["port"], a["local"]) for a in accepted] == [(8081, f"{pod.ip}:8081"), (15001, accepted[1]["local"])]
    assert accepted[1]["orig"] == "10.96.0.99:80"


def test_tproxy_mode_keeps_the_original_destination(node: LocalNode) -> None:
    pod, client = _pod(node, "tproxy-1"), _pod(node, "plain-1")
    rules = _rules(pod.netns)
    assert "TPROXY --on-port 15006" in rules
    _listening(node, pod)
    assert _connect(node, client, pod.ip, 8080) == "open"
    [inbound] = _accepted(node, pod)
    assert inbound["port"] == 15006 and inbound["local"] == f"{pod.ip}:8080"  # not NATed: the address is kept


def test_an_injection_attempt_fails_add_naming_the_annotation_with_nothing_applied(node: LocalNode) -> None:
    before = _leases(node)
    with pytest.raises(NodeError) as caught:
        _pod(node, "evil-1")
    message = str(caught.value)
    assert "excludeInterfaces" in message and INJECTION in message and "istio-cni" in message
    pod = node.pods["evil-1"]
    assert pod.attachment is None and pod.app is None
    assert "ISTIO" not in _rules(pod.netns)
    assert _leases(node) == before  # the failed ADD's address was released by its DEL
    node.remove_pod(pod)
    assert pod.netns not in netns_names()


def test_del_through_the_chain_releases_the_address_and_leaves_nothing_of_the_pod(node: LocalNode) -> None:
    pod = _pod(node, "gone-1")
    assert pod.ip in _leases(node)
    assert node.cni is not None
    attachment = pod.attachment
    assert attachment is not None and attachment.node_veth
    caches = [node.cni.runtime.cache_path(network, rt) for network, rt in attachment.networks]
    assert all(path.exists() for path in caches)
    node.cni.check(attachment)  # CHECK with the cached results passes through every plugin, istio-cni's too
    node.remove_pod(pod)
    assert pod.ip not in _leases(node)
    assert not any(path.exists() for path in caches)
    assert pod.netns not in netns_names()
    links = subprocess.run(["ip", "-n", node.plan.netns, "-o", "link", "show"], capture_output=True, text=True,
                           check=True).stdout
    assert attachment.node_veth not in links
    assert "gone-1" not in [p.name for p in node.planned]
    again = node.add_pod(pod.plan.spec)  # its name is free again: a replica removed, then scaled back up
    assert node.pods["gone-1"] is again and [p.name for p in node.planned].count("gone-1") == 1
    node.remove_pod(again)


def test_a_pod_whose_validation_failed_gets_no_rules_and_is_labelled_by_repair(node: LocalNode) -> None:
    # kube-system is excluded: istio-cni skips the pod, so its capture is missing and validation exits 126.
    with pytest.raises(PodInitError) as caught:
        _pod(node, "sys-1")
    assert caught.value.exit_codes == [126, 126]
    pod = caught.value.pod
    assert "ISTIO" not in _rules(pod.netns) and pod.app is None
    assert node.cni is not None and node.cni.api is not None
    api = node.cni.api

    def labelled() -> dict[str, Any] | None:
        found = api.get_pod("kube-system", "sys-1")
        labels = (found or {}).get("metadata", {}).get("labels", {})
        return found if labels.get("cni.istio.io/uninitialized") == "true" else None

    found = poll(labelled, "repair to label the broken pod", 20)
    status = found["status"]["initContainerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 126
    assert api.get_pod("default", "cap-1") is not None and not (
        api.get_pod("default", "cap-1") or {}).get("metadata", {}).get("labels", {}).get("cni.istio.io/uninitialized")


def test_in_delete_mode_repair_deletes_the_pod_whose_validation_failed(node: LocalNode) -> None:
    # The failing validation itself is the label test's (two 5 s probe timeouts); here the node reports it
    # as its kubelet would after two failed runs, for a pod it holds back.
    with local_node("iacni-repair-", ready_timeout=30, capture="cni", cni_repair="delete") as other:
        broken, healthy = other.plan_pods([PodSpec("sys-2", namespace="kube-system", agent=False),
                                           PodSpec("ok-2", agent=False)])
        RegistryFile(other.registry, yaml.safe_dump({"workloads": registry_workloads([broken, healthy])}))
        other.start_istiod()
        assert other.add_pod(healthy).validation == [0]
        assert other.cni is not None and other.cni.api is not None
        api = other.cni.api
        assert api.get_pod("kube-system", "sys-2") is not None
        other.cni.report(broken, broken.ip, [126, 126], [], ["app", "istio-proxy"])
        poll(lambda: api.get_pod("kube-system", "sys-2") is None, "repair to delete the broken pod", 20)
        assert api.get_pod("default", "ok-2") is not None  # a pod whose validation passed is left alone
