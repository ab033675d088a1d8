"""istio-cni's protocol core: skel's environment, stdin and version rules; results and error objects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from istio_agent.cni.plugin.protocol import (
    SUPPORTED_VERSIONS,
    CniError,
    add_result,
    error_result,
    parse_cni_args,
    parse_request,
    version_result,
)

BASE = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin"}


def conf(**fields: Any) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "k8s-pod-network", **fields}).encode()


def error_of(env: dict[str, str], stdin: bytes) -> CniError:
    with pytest.raises(CniError) as info:
        parse_request(env, stdin)
    return info.value


def test_malformed_stdin_is_a_decoding_failure_naming_stdin() -> None:
    err = error_of(BASE, b"{not json")
    assert err.code == 6
    assert "network configuration on stdin" in err.msg and "JSON" in err.msg
    assert error_of(BASE, b"[1, 2]").code == 6


def test_unsupported_version_names_it_and_lists_the_supported_ones() -> None:
    err = error_of(BASE, conf(cniVersion="9.9.9"))
    assert err.code == 1
    assert "9.9.9" in err.msg
    assert all(v in err.msg for v in SUPPORTED_VERSIONS)
    assert error_of(BASE, json.dumps({"name": "n"}).encode()).code == 1  # no cniVersion means 0.1.0
    assert error_of(BASE, conf(cniVersion=1)).code == 6


def test_add_without_netns_names_the_variable() -> None:
    err = error_of({k: v for k, v in BASE.items() if k != "CNI_NETNS"}, conf())
    assert err.code == 4
    assert "CNI_NETNS" in err.msg
    both = error_of({"CNI_COMMAND": "ADD", "CNI_PATH": "/x"}, conf())
    assert "CNI_CONTAINERID" in both.msg and "CNI_NETNS" in both.msg and "CNI_IFNAME" in both.msg


def test_del_tolerates_a_missing_netns_and_check_does_not() -> None:
    without = {k: v for k, v in BASE.items() if k != "CNI_NETNS"}
    request = parse_request({**without, "CNI_COMMAND": "DEL"}, conf())
    assert request is not None and request.command == "DEL" and request.netns == ""
    assert "CNI_NETNS" in error_of({**without, "CNI_COMMAND": "CHECK"}, conf()).msg


def test_network_name_and_environment_values_are_checked() -> None:
    assert error_of(BASE, json.dumps({"cniVersion": "1.0.0"}).encode()).code == 7
    assert "name" in error_of(BASE, conf(name="bad name")).msg
    assert error_of({**BASE, "CNI_CONTAINERID": "bad id"}, conf()).code == 4
    assert "CNI_IFNAME" in error_of({**BASE, "CNI_IFNAME": "a/b"}, conf()).msg
    assert "CNI_IFNAME" in error_of({**BASE, "CNI_IFNAME": "x" * 16}, conf()).msg
    assert "unknown CNI_COMMAND" in error_of({**BASE, "CNI_COMMAND": "FOO"}, conf()).msg


def test_version_gates_per_command() -> None:
    check = {**BASE, "CNI_COMMAND": "CHECK"}
    assert error_of(check, conf(cniVersion="0.3.1")).code == 1
    assert parse_request(check, conf(cniVersion="0.4.0")) is not None
    for command in ("STATUS", "GC"):
        env = {"CNI_COMMAND": command, "CNI_PATH": "/x"}
        assert command in error_of(env, conf(cniVersion="1.0.0")).msg
        assert parse_request(env, conf(cniVersion="1.1.0")) is not None


def test_no_command_means_about_and_version_ignores_the_rest() -> None:
    assert parse_request({}, b"") is None
    request = parse_request({"CNI_COMMAND": "VERSION"}, b"garbage")
    assert request is not None and request.command == "VERSION"


def test_version_output() -> None:
    assert json.loads(version_result(b"")) == {"cniVersion": "1.1.0", "supportedVersions": list(SUPPORTED_VERSIONS)}
    assert json.loads(version_result(b'{"cniVersion": "0.4.0"}'))["cniVersion"] == "0.4.0"
    assert json.loads(version_result(b'{"cniVersion": "7.0.0"}'))["cniVersion"] == "1.1.0"


PREV: dict[str, dict[str, Any]] = {
    "0.3.0": {"cniVersion": "0.3.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
              "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}]},
    "0.3.1": {"ips": [{"version": "4", "address": "10.0.0.2/24"}], "dns": {"nameservers": ["10.0.0.10"]}},
    "0.4.0": {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}], "routes": []},
    "1.0.0": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24", "interface": 0}],
              "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff"}], "extra": {"kept": True}},
    "1.1.0": {"cniVersion": "1.1.0", "ips": [{"address": "fd00::2/64"}], "dns": {}},
}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_prev_result_is_passed_through_in_the_config_version(version: str) -> None:
    prev = PREV[version]
    out = json.loads(add_result({"cniVersion": version, "prevResult": prev}, version))
    assert out == {**prev, "cniVersion": version}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_without_prev_result_an_empty_result_of_that_version(version: str) -> None:
    """Upstream's: the 0.x layout has an empty `dns` object, the 1.x one leaves it out."""
    empty = {"cniVersion": version, "dns": {}} if version.startswith("0.") else {"cniVersion": version}
    assert json.loads(add_result({"cniVersion": version}, version)) == empty


def test_prev_result_must_be_an_object_and_odd_version_keys_are_relabelled() -> None:
    with pytest.raises(CniError) as info:
        add_result({"prevResult": [1]}, "1.0.0")
    assert info.value.code == 7 and "prevResult" in info.value.msg
    out = json.loads(add_result({"prevResult": {"cniversion": "1.0.0", "ips": []}}, "1.0.0"))
    assert out == {"cniVersion": "1.0.0", "ips": []}


def test_error_object() -> None:
    body = json.loads(error_result(CniError(11, "try later", "because"), "0.4.0"))
    assert body == {"cniVersion": "0.4.0", "code": 11, "msg": "try later", "details": "because"}
    assert json.loads(error_result(CniError(4, "x"), "bogus"))["cniVersion"] == "1.1.0"
    assert "details" not in json.loads(error_result(CniError(4, "x")))


def test_cni_args() -> None:
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID=u;FOO=bar"
    assert parse_cni_args(args) == {"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "p",
                                    "K8S_POD_INFRA_CONTAINER_ID": "c", "K8S_POD_UID": "u"}
    assert parse_cni_args("") == {}
    with pytest.raises(CniError, match="unknown args"):
        parse_cni_args("K8S_POD_NAME=p;FOO=bar")
    with pytest.raises(CniError, match="invalid pair"):
        parse_cni_args("K8S_POD_NAME")
    with pytest.raises(CniError, match="IgnoreUnknown"):
        parse_cni_args("IgnoreUnknown=maybe")
