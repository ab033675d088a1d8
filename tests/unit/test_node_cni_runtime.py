"""The CNI runtime's pure part: loading lists, each plugin's stdin and environment, answers, the cache record."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from istiod_local.node.cni_runtime import (
    CACHE_KIND,
    CniConfigError,
    CniExecError,
    PluginError,
    RuntimeConf,
    cache_file,
    cache_record,
    cached_config,
    cni_args_text,
    find_plugin,
    loopback_network,
    parse_cni_args,
    parse_network,
    plugin_environment,
    plugin_stdin,
    read_cache_record,
    read_plugin_output,
    validate_runtime,
    version_at_least,
)

BRIDGE = {"type": "bridge", "bridge": "cni0", "capabilities": {"ips": True, "portMappings": False},
          "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}
LIST: dict[str, Any] = {"cniVersion": "1.0.0", "name": "k8s-pod-network",
                        "plugins": [BRIDGE, {"type": "istio-cni", "kubernetes": {}}]}
RT = RuntimeConf("abc123", "/var/run/netns/p1", "eth0", (("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p1")),
                 {"ips": ["10.1.0.9/24"], "portMappings": [{"hostPort": 80}], "bandwidth": {}})


def test_a_conflist_is_parsed_with_each_plugins_type_and_declared_capabilities() -> None:
    network = parse_network(json.dumps(LIST), "10-k8s.conflist")
    assert (network.name, network.cni_version) == ("k8s-pod-network", "1.0.0")
    assert [p.type for p in network.plugins] == ["bridge", "istio-cni"]
    assert network.plugins[0].capabilities == frozenset({"ips"})  # portMappings: false is not declared
    assert json.loads(network.raw) == LIST


def test_a_single_conf_becomes_a_one_plugin_list() -> None:
    conf = {"cniVersion": "0.3.1", "name": "net", "type": "bridge", "bridge": "b0"}
    network = parse_network(json.dumps(conf), "10-net.conf", single=True)
    assert network.name == "net" and network.cni_version == "0.3.1"
    assert [dict(p.config) for p in network.plugins] == [conf]
    assert json.loads(network.raw)["plugins"] == [conf]
    assert parse_network(json.dumps(conf)).plugins[0].type == "bridge"  # no `plugins` key: a .conf


@pytest.mark.parametrize(("config", "names"), [
    ("{", "not JSON"),
    ("[]", "JSON object"),
    ({"cniVersion": "1.0.0", "plugins": [{"type": "x"}]}, "name"),
    ({"name": "a/b", "cniVersion": "1.0.0", "plugins": [{"type": "x"}]}, "'a/b'"),
    ({"name": "n", "plugins": [{"type": "x"}]}, "cniVersion"),
    ({"name": "n", "cniVersion": "9.9.9", "plugins": [{"type": "x"}]}, "'9.9.9' is not supported"),
    ({"name": "n", "cniVersion": "1.0", "plugins": [{"type": "x"}]}, "'1.0' is not a version"),
    ({"name": "n", "cniVersion": "1.0.0", "plugins": []}, "no plugins"),
    ({"name": "n", "cniVersion": "1.0.0", "plugins": {"type": "x"}}, "plugins must be a list"),
    ({"name": "n", "cniVersion": "1.0.0", "plugins": [{"bridge": "b"}]}, "plugins[0]: missing 'type'"),
    ({"name": "n", "cniVersion": "1.0.0", "plugins": [{"type": "x"}, "y"]}, "plugins[1] must be an object"),
    ({"name": "n", "cniVersion": "1.0.0", "plugins": [{"type": "../sbin/x"}]}, "not a path"),
    ({"name": "n", "cniVersion": "1.0.0", "plugins": [{"type": "x", "capabilities": {"ips": 1}}]}, "capabilities"),
    ({"name": "n", "cniVersion": "1.0.0", "disableCheck": "maybe", "plugins": [{"type": "x"}]}, "disableCheck"),
])
def test_a_bad_list_is_refused_naming_the_field(config: object, names: str) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(CniConfigError, match=r"conf\.d/x\.conflist") as caught:
        parse_network(text, "conf.d/x.conflist")
    assert names in str(caught.value)


def test_loopback_is_a_list_of_its_own() -> None:
    network = loopback_network("0.4.0")
    assert network.name == "cni-loopback" and [p.type for p in network.plugins] == ["loopback"]
    assert network.cni_version == "0.4.0"


def test_each_plugin_gets_the_lists_name_and_version_the_previous_result_and_only_its_capabilities() -> None:
    network = parse_network(json.dumps({**LIST, "plugins": [{**BRIDGE, "name": "other", "cniVersion": "0.3.1"},
                                                           LIST["plugins"][1]]}))
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.9/24"}]}
    first = json.loads(plugin_stdin(network, network.plugins[0], None, RT))
    assert first["name"] == "k8s-pod-network" and first["cniVersion"] == "1.0.0"  # the list's, not the entry's
    assert "prevResult" not in first
    assert first["runtimeConfig"] == {"ips": ["10.1.0.9/24"]}  # declared and offered; portMappings is not declared
    assert first["ipam"] == BRIDGE["ipam"]
    second = json.loads(plugin_stdin(network, network.plugins[1], prev, RT))
    assert second["prevResult"] == prev
    assert "runtimeConfig" not in second  # it declares no capability
    assert "runtimeConfig" not in json.loads(plugin_stdin(network, network.plugins[0], None, None))


def test_the_environment_carries_the_cni_set_and_drops_the_callers_cni_variables() -> None:
    env = plugin_environment("ADD", RT, ["/opt/cni/bin", "/usr/lib/cni"],
                             {"PATH": "/usr/bin", "CNI_NETNS": "/stale", "CNI_IFNAME": "old"})
    assert env == {"PATH": "/usr/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123",
                   "CNI_NETNS": "/var/run/netns/p1", "CNI_IFNAME": "eth0",
                   "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=p1", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni"}
    assert plugin_environment("STATUS", None, ["/b"], {"CNI_NETNS": "/x"}) == {"CNI_COMMAND": "STATUS",
                                                                              "CNI_PATH": "/b"}


def test_cni_args_round_trip_and_bad_entries_are_refused() -> None:
    pairs = (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "default"), ("IP", "10.1.0.5"))
    assert parse_cni_args(cni_args_text(pairs)) == pairs
    assert parse_cni_args("") == ()
    with pytest.raises(CniConfigError, match="'IP'"):
        parse_cni_args("IgnoreUnknown=1;IP")


@pytest.mark.parametrize(("runtime", "names"), [
    (RuntimeConf("", "/n", "eth0"), "container id"),
    (RuntimeConf("-x", "/n", "eth0"), "container id '-x'"),
    (RuntimeConf("c", "/n", "a-very-long-ifname0"), "interface name"),
    (RuntimeConf("c", "/n", "eth 0"), "interface name"),
    (RuntimeConf("c", "/n", "eth/0"), "interface name"),
    (RuntimeConf("c", "", "eth0"), "netns"),
    (RuntimeConf("c", "/n", "eth0", (("K8S_POD_NAME", "a;IP=1.2.3.4"),)), "CNI_ARGS"),
])
def test_runtime_arguments_are_checked_before_any_plugin_runs(runtime: RuntimeConf, names: str) -> None:
    with pytest.raises(CniConfigError) as caught:
        validate_runtime(runtime)
    assert names in str(caught.value)
    validate_runtime(RT)


def test_plugins_are_found_along_cni_path_in_order() -> None:
    present = {"/b/bridge", "/a/loopback", "/c/bridge"}
    assert find_plugin("bridge", ["/a", "/b", "/c"], present.__contains__) == "/b/bridge"
    with pytest.raises(CniExecError, match="'istio-cni' in path \\['/a', '/b'\\]"):
        find_plugin("istio-cni", ["/a", "/b"], present.__contains__)


def test_an_error_object_is_raised_with_the_plugin_code_and_msg() -> None:
    error = b'{"cniVersion":"1.0.0","code":7,"msg":"invalid network config","details":"ipam: no subnet"}'
    with pytest.raises(PluginError) as caught:
        read_plugin_output("net", "bridge", "ADD", 1, error, b"")
    assert (caught.value.plugin, caught.value.code, caught.value.msg) == ("bridge", 7, "invalid network config")
    assert str(caught.value) == ("plugin bridge (network net) failed (ADD): code 7: invalid network config "
                                 "(ipam: no subnet)")
    with pytest.raises(PluginError, match="code 11"):  # an error object is an error even with exit status 0
        read_plugin_output("net", "istio-cni", "ADD", 0, b'{"code":11,"msg":"try again later"}', b"")
    with pytest.raises(PluginError, match="exit status 2: boom") as caught:
        read_plugin_output("net", "bridge", "DEL", 2, b"", b"boom\n")
    assert caught.value.code is None


def test_add_needs_a_result_and_the_other_commands_need_none() -> None:
    result = {"cniVersion": "1.0.0", "ips": []}
    assert read_plugin_output("n", "bridge", "ADD", 0, json.dumps(result).encode(), b"") == result
    assert read_plugin_output("n", "bridge", "DEL", 0, b"", b"") is None
    assert read_plugin_output("n", "bridge", "CHECK", 0, b"whatever", b"") is None
    with pytest.raises(CniExecError, match="returned no result for ADD"):
        read_plugin_output("n", "bridge", "ADD", 0, b"", b"")


def test_the_cache_record_is_libcnis_and_reads_back() -> None:
    network = parse_network(json.dumps(LIST))
    result = {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.9/24"}]}
    assert cache_file("/var/lib/cni", network.name, RT) == "/var/lib/cni/results/k8s-pod-network-abc123-eth0"
    data = cache_record(network, RT, result)
    record = json.loads(data)
    assert record["kind"] == CACHE_KIND and record["containerId"] == "abc123" and record["ifName"] == "eth0"
    assert record["networkName"] == "k8s-pod-network" and record["netns"] == "/var/run/netns/p1"
    assert record["cniArgs"] == [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "p1"]]
    assert base64.b64decode(record["config"]) == network.raw
    assert read_cache_record(data, network.name)["result"] == result
    assert cached_config(read_cache_record(data, network.name)) == network.raw
    with pytest.raises(CniExecError, match="kind 'other'"):
        read_cache_record(b'{"kind":"other","result":{}}', "n")
    with pytest.raises(CniExecError, match="not JSON"):
        read_cache_record(b"{", "n")


def test_versions_compare_numerically() -> None:
    assert version_at_least("0.4.0", "0.4.0") and version_at_least("1.0.0", "0.4.0")
    assert not version_at_least("0.3.1", "0.4.0") and version_at_least("0.10.0", "0.4.0")
