"""istio-cni's pod rules: which pods are skipped, and the capture settings an injected pod gets (sans-IO)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from istio_agent.capture.config import CaptureConfig
from istio_agent.cni.plugin.netconf import parse_plugin_config
from istio_agent.cni.plugin.podinfo import PodError, capture_config, extract_pod_info, skip_reason
from istio_agent.cni.plugin.protocol import CniError

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "labels": {}, "annotations": {"sidecar.istio.io/status": "{}"}},
    "spec": {
        "initContainers": [{"name": "istio-validation"}],
        "containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"], "env": [],
                                         "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}],
    },
}


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        env: dict[str, str] | None = None, **proxy: Any) -> dict[str, Any]:
    out = copy.deepcopy(POD)
    out["metadata"]["annotations"].update(annotations or {})
    out["metadata"]["labels"].update(labels or {})
    container = out["spec"]["containers"][1]
    container["env"] = [{"name": k, "value": v} for k, v in (env or {}).items()]
    container.update(proxy)
    return out


def config(p: dict[str, Any], env: dict[str, str] | None = None, warnings: list[str] | None = None) -> CaptureConfig:
    return capture_config(extract_pod_info(p), "/var/run/netns/x", dry_run=False, native_nftables=False,
                          env=env or {}, warn=(warnings if warnings is not None else []).append)


def test_injected_pod_gets_upstream_defaults() -> None:
    info = extract_pod_info(POD)
    assert skip_reason(info) is None
    cfg = config(POD)
    assert (cfg.proxy_port, cfg.proxy_uid, cfg.proxy_gid, cfg.inbound_interception_mode) == ("15001", "1337", "1337",
                                                                                            "REDIRECT")
    assert (cfg.inbound_ports_include, cfg.inbound_ports_exclude) == ("*", "15020,15021,15090")
    assert (cfg.outbound_ports_exclude, cfg.outbound_ip_ranges_include, cfg.outbound_ip_ranges_exclude) == (
        "15020", "*", "")
    assert cfg.cni_mode and cfg.network_namespace == "/var/run/netns/x" and cfg.owner_groups_include == "*"


@pytest.mark.parametrize(("p", "reason"), [
    (pod(), None),
    ({**POD, "spec": {"initContainers": [{"name": "istio-init"}], "containers": POD["spec"]["containers"]}},
     "istio-init"),
    (pod(env={"DISABLE_ENVOY": "true"}), "DISABLE_ENVOY"),
    (pod(env={"DISABLE_ENVOY": "nonsense"}), None),
    ({**POD, "spec": {"containers": [{"name": "app"}]}}, "does not have istio-proxy"),
    (pod(args=["proxy", "router"]), "proxy type router"),
    (pod(annotations={"sidecar.istio.io/inject": "false"}), "inject-disabled"),
    (pod(labels={"sidecar.istio.io/inject": "false"}), "inject-disabled"),
    # The label is the newer API and wins over the annotation.
    (pod(annotations={"sidecar.istio.io/inject": "false"}, labels={"sidecar.istio.io/inject": "true"}), None),
    (pod(annotations={"sidecar.istio.io/inject": "maybe"}), None),
    ({**POD, "metadata": {"name": "p", "namespace": "ns"}}, "sidecar annotation"),
])  # fmt: skip
def test_skip_rules(p: dict[str, Any], reason: str | None) -> None:
    found = skip_reason(extract_pod_info(p))
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


def test_annotations_become_settings() -> None:
    cfg = config(pod({
        "sidecar.istio.io/interceptionMode": "TPROXY",
        "traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8,fd00::/8",
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.1.0.0/16",
        "traffic.sidecar.istio.io/includeInboundPorts": "80, 443",
        "traffic.sidecar.istio.io/excludeInboundPorts": "15021,9000",
        "traffic.sidecar.istio.io/includeOutboundPorts": "3306",
        "traffic.sidecar.istio.io/excludeOutboundPorts": "5432",
        "traffic.sidecar.istio.io/excludeInterfaces": "eth1",
        "traffic.sidecar.istio.io/kubevirtInterfaces": "old0",
        "istio.io/reroute-virtual-interfaces": "net1",
    }))
    assert cfg.inbound_interception_mode == "TPROXY"
    assert (cfg.outbound_ip_ranges_include, cfg.outbound_ip_ranges_exclude) == ("10.0.0.0/8,fd00::/8", "10.1.0.0/16")
    assert (cfg.inbound_ports_include, cfg.inbound_ports_exclude) == ("80,443", "15021,9000,15020,15090")
    assert (cfg.outbound_ports_include, cfg.outbound_ports_exclude) == ("3306", "5432")
    assert (cfg.exclude_interfaces, cfg.reroute_virtual_interfaces) == ("eth1", "net1")
    assert config(pod({"traffic.sidecar.istio.io/kubevirtInterfaces": "old0"})).reroute_virtual_interfaces == "old0"


def test_proxy_env_and_security_context() -> None:
    cfg = config(pod(env={"ISTIO_META_DNS_CAPTURE": "true", "INVALID_DROP": "1", "ISTIO_DUAL_STACK": "T"},
                     securityContext={"runAsUser": 2000, "runAsGroup": 0}))
    assert cfg.redirect_dns and cfg.capture_all_dns and cfg.drop_invalid and cfg.dual_stack
    assert (cfg.proxy_uid, cfg.proxy_gid) == ("2000", "1337")  # 0 counts as unset
    warnings: list[str] = []
    cfg = config(pod(env={"ISTIO_META_DNS_CAPTURE": "yes"}), warnings=warnings)
    assert not cfg.redirect_dns and "ISTIO_META_DNS_CAPTURE" in warnings[0]


def test_plugin_environment_settings_are_read() -> None:
    env = {"ISTIO_OUTBOUND_OWNER_GROUPS": "100,200", "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.0/8"}
    cfg = config(POD, env=env)
    assert (cfg.owner_groups_include, cfg.host_ipv4_loopback_cidr) == ("100,200", "127.0.0.0/8")
    with pytest.raises(PodError, match="ISTIO_OUTBOUND_OWNER_GROUPS"):
        config(POD, env={"ISTIO_OUTBOUND_OWNER_GROUPS": "a b"})


@pytest.mark.parametrize(("annotation", "value"), [
    ("traffic.sidecar.istio.io/excludeInterfaces", "eth0 -j ACCEPT"),
    ("traffic.sidecar.istio.io/excludeInterfaces", "eth0,-j"),
    ("istio.io/reroute-virtual-interfaces", "net1 ! -i"),
    ("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.0/8 -j DROP"),
    ("traffic.sidecar.istio.io/excludeOutboundIPRanges", "*"),
    ("traffic.sidecar.istio.io/includeInboundPorts", "80;reboot"),
    ("traffic.sidecar.istio.io/excludeInboundPorts", "70000"),
    ("traffic.sidecar.istio.io/excludeInboundPorts", " 80, $(id)"),
    ("traffic.sidecar.istio.io/excludeOutboundPorts", "1 --dport 2"),
    ("traffic.sidecar.istio.io/includeOutboundPorts", "-1"),
    ("sidecar.istio.io/interceptionMode", "NONE"),
])  # fmt: skip
def test_injection_attempts_fail_naming_the_annotation_and_value(annotation: str, value: str) -> None:
    with pytest.raises(PodError) as info:
        config(pod({annotation: value}))
    assert annotation in str(info.value)
    assert repr(value) in str(info.value)  # as written: not trimmed, not merged with the always-excluded ports


@pytest.mark.parametrize(("annotation", "value"), [
    ("traffic.sidecar.istio.io/excludeInboundPorts", "8080,443,"),  # an empty item
    ("traffic.sidecar.istio.io/includeOutboundPorts", "29546,"),
    ("traffic.sidecar.istio.io/includeInboundPorts", " * "),  # `*` only as the whole text
    ("traffic.sidecar.istio.io/includeOutboundIPRanges", "10.0.0.0/8,"),
    ("traffic.sidecar.istio.io/excludeOutboundIPRanges", " 10.0.0.0/8"),  # CIDR items are not trimmed
    ("traffic.sidecar.istio.io/excludeInterfaces", "veth+"),  # upstream's names: no iptables wildcard
    ("traffic.sidecar.istio.io/kubevirtInterfaces", "net1,,net2"),
    ("istio.io/reroute-virtual-interfaces", "1eth"),
    ("traffic.sidecar.istio.io/includeInboundPorts", " "),  # upstream takes it, and writes `--dport  ` rules
    ("traffic.sidecar.istio.io/excludeOutboundPorts", "  "),
])  # fmt: skip
def test_what_upstreams_validators_refuse_is_refused(annotation: str, value: str) -> None:
    """Values the capture code could use but upstream's NewRedirect refuses (or turns into rules iptables-restore
    refuses): ADD fails as upstream's does."""
    with pytest.raises(PodError) as info:
        config(pod({annotation: value}))
    assert annotation in str(info.value) and repr(value) in str(info.value)


def test_upstreams_validators_take_trimmed_ports_and_interfaces() -> None:
    cfg = config(pod({"traffic.sidecar.istio.io/includeInboundPorts": " 80, 443 ",
                      "traffic.sidecar.istio.io/excludeInterfaces": " eth1 ,net-2.x",
                      "traffic.sidecar.istio.io/kubevirtInterfaces": "veth+",  # not read: the newer key is set
                      "istio.io/reroute-virtual-interfaces": "net1"}))
    assert (cfg.inbound_ports_include, cfg.exclude_interfaces) == ("80,443", "eth1,net-2.x")
    assert cfg.reroute_virtual_interfaces == "net1"


def test_security_context_of_the_wrong_type_is_named() -> None:
    with pytest.raises(PodError, match="runAsUser"):
        extract_pod_info(pod(securityContext={"runAsUser": "0; reboot"}))


def test_plugin_config_fields() -> None:
    conf = parse_plugin_config({"type": "istio-cni", "exclude_namespaces": None, "cni_agent_run_dir": "/run/x",
                                "native_nftables": True, "pod_namespace": "istio-system", "ambient_enabled": False})
    assert conf.exclude_namespaces == [] and conf.cni_agent_run_dir == "/run/x" and conf.native_nftables
    for field, value in (("exclude_namespaces", "kube-system"), ("native_nftables", "true"),
                         ("cni_agent_run_dir", 1), ("enablement_selectors", [1])):
        with pytest.raises(CniError) as info:
            parse_plugin_config({field: value})
        assert info.value.code == 7 and field in info.value.msg
