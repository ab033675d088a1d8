"""install-cni's pure parts: options, Go's JSON text, the CNI config rules, the kubeconfig, plugin log lines,
which inotify events matter, the reinstall throttle."""

from __future__ import annotations

import base64
import json
import logging
import struct

import pytest
import yaml

from istio_agent.cni.install import cniconfig
from istio_agent.cni.install.kubeconfig import KubeconfigInputs, render_kubeconfig, yaml_scalar
from istio_agent.cni.install.options import (
    FLAGS,
    OptionsError,
    env_name,
    parse_go_int,
    plugin_log_level,
    resolve_install_options,
)
from istio_agent.cni.install.pluginlog import PluginLogError, parse_body, parse_rfc3339
from istio_agent.cni.install.watcher import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    ReinstallThrottle,
    parse_events,
    relevant,
)
from istio_agent.gojson import dumps as go_marshal_indent
from istio_agent.gojson import go_number, go_string

# ---- options


def test_defaults_are_upstreams() -> None:
    options = resolve_install_options({}, {}, "node-a")
    assert options.mounted_cni_net_dir == "/host/etc/cni/net.d"
    assert options.cni_agent_run_dir == "/var/run/istio-cni"
    assert options.chained_cni_plugin is True
    assert options.kubeconfig_mode == 0o600
    assert options.monitoring_port == 15014
    assert options.log_uds_socket == "/var/run/istio-cni/log.sock"
    assert options.cni_bin_dir == "/host/opt/cni/bin"
    assert options.service_account_dir == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert options.readiness_port == 8000
    assert options.istio_owned_cni_config_filename == ""
    assert options.plugin_log_level == "info"
    assert options.k8s_node_name == "node-a"  # KUBERNETES_NODE_NAME unset: the host name, as upstream
    assert options.repair.enabled is True and options.repair.node_name == ""
    assert options.cni_conf_mode == 0o600


def test_every_flag_has_upstreams_variable_name() -> None:
    names = {flag.name for flag in FLAGS}
    for flag in ("mounted-cni-net-dir", "cni-conf-name", "chained-cni-plugin", "cni-network-config",
                 "cni-network-config-file", "istio-owned-cni-config", "istio-owned-cni-config-filename",
                 "log-level", "kubeconfig-mode", "cni-conf-group-read", "kube-ca-file", "skip-tls-verify",
                 "monitoring-port", "log-uds-socket", "cni-agent-run-dir", "exclude-namespaces", "pod-namespace",
                 "ambient-enabled", "native-nftables", "repair-enabled", "repair-delete-pods", "repair-label-pods",
                 "repair-repair-pods", "repair-broken-pod-label-key", "repair-broken-pod-label-value",
                 "repair-node-name", "repair-sidecar-annotation", "repair-init-container-name",
                 "repair-init-container-termination-message", "repair-init-container-exit-code",
                 "repair-label-selectors", "repair-field-selectors"):
        assert flag in names, flag
    assert env_name("mounted-cni-net-dir") == "MOUNTED_CNI_NET_DIR"
    assert env_name("repair-broken-pod-label-key") == "REPAIR_BROKEN_POD_LABEL_KEY"


def test_values_are_parsed_as_go_reads_them() -> None:
    options = resolve_install_options(
        {"kubeconfig-mode": "0640", "chained-cni-plugin": "F", "monitoring-port": "0x3a9e",
         "istio-owned-cni-config": "true", "cni-agent-run-dir": "/run/x", "repair-init-container-exit-code": "3",
         "repair-delete-pods": "1", "repair-node-name": "n1", "cni-conf-group-read": "True"},
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_NODE_NAME": "n1"},
        "ignored")
    assert options.kubeconfig_mode == 0o640
    assert options.chained_cni_plugin is False
    assert options.monitoring_port == 0x3A9E
    assert options.istio_owned_cni_config_filename == "02-istio-cni.conflist"  # the default once enabled
    assert options.log_uds_socket == "/run/x/log.sock"
    assert options.repair.init_container_exit_code == 3 and options.repair.delete_pods is True
    assert options.repair.node_name == "n1" and options.k8s_node_name == "n1"
    assert options.k8s_service_host == "10.0.0.1" and options.k8s_service_port == "443"
    assert options.cni_conf_mode == 0o640


@pytest.mark.parametrize(("values", "named"), [
    ({"chained-cni-plugin": "yes"}, "--chained-cni-plugin ($CHAINED_CNI_PLUGIN): 'yes'"),
    ({"kubeconfig-mode": "rw"}, "--kubeconfig-mode ($KUBECONFIG_MODE): 'rw'"),
    ({"kubeconfig-mode": "0o17777"}, "--kubeconfig-mode"),
    ({"monitoring-port": "70000"}, "--monitoring-port"),
    ({"readiness-port": "-1"}, "--readiness-port"),
    ({"mounted-cni-net-dir": ""}, "--mounted-cni-net-dir"),
    ({"cni-conf-name": "../x.conflist"}, "--cni-conf-name"),
    ({"no-such-flag": "1"}, "no-such-flag"),
])
def test_bad_values_name_the_flag_variable_and_value(values: dict[str, str], named: str) -> None:
    with pytest.raises(OptionsError) as caught:
        resolve_install_options(values, {}, "h")
    assert named in str(caught.value)


@pytest.mark.parametrize(("text", "value"), [("0600", 0o600), ("384", 384), ("0x1f", 31), ("0o17", 15),
                                             ("0b11", 3), ("-5", -5), ("0", 0), ("0x_1f", 31)])
def test_go_integers(text: str, value: int) -> None:
    assert parse_go_int(text) == value


@pytest.mark.parametrize("text", ["", "08", "1_000", "abc", "1.5"])
def test_go_integers_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_int(text)


@pytest.mark.parametrize(("output_level", "expected"), [
    ("default:info", "info"),
    ("cni-plugin:debug", "debug"),
    ("default:error,all:warn", "warn"),
    ("debug", "info"),  # a bare level is the default scope's, not the plugin's
    ("", "info"),
])
def test_plugin_log_level(output_level: str, expected: str) -> None:
    assert plugin_log_level(output_level) == expected


@pytest.mark.parametrize("log_level", ["error", "debug", "loud"])
def test_log_level_is_accepted_and_not_used(log_level: str) -> None:
    """Upstream declares --log-level/LOG_LEVEL as the plugin's fallback level and never reads it."""
    options = resolve_install_options({"log-level": log_level}, {}, "h")
    assert options.plugin_log_level == "info"
    assert resolve_install_options({"log-level": log_level}, {}, "h", "cni-plugin:debug").plugin_log_level == "debug"


# ---- Go's JSON


def test_go_strings_escape_as_go() -> None:
    assert go_string("a<b>&c") == '"a\\u003cb\\u003e\\u0026c"'
    assert go_string("tab\tnl\n\x01\x7f") == '"tab\\tnl\\n\\u0001\x7f"'
    assert go_string("é\u2028") == '"é\\u2028"'
    assert go_string('q"\\') == '"q\\"\\\\"'


@pytest.mark.parametrize(("value", "text"), [
    (1, "1"), (1.0, "1"), (1.5, "1.5"), (0.000001, "0.000001"), (1e-7, "1e-7"), (1e20, "100000000000000000000"),
    (1e21, "1e+21"), (-2.5e-9, "-2.5e-9"), (2**60, "1152921504606847000"), (0.1, "0.1"), (0, "0"),
])
def test_go_numbers_as_float64(value: float, text: str) -> None:
    assert go_number(value) == text


def test_marshal_indent_layout() -> None:
    value = {"b": [1, {"z": None, "a": True}], "a": {}, "c": []}
    assert go_marshal_indent(value, sort_keys=True) == (
        '{\n  "a": {},\n  "b": [\n    1,\n    {\n      "a": true,\n      "z": null\n    }\n  ],\n  "c": []\n}')
    assert go_marshal_indent({"b": 1, "a": 2}, sort_keys=False) == '{\n  "b": 1,\n  "a": 2\n}'
    # Equal to Python's json for plain data, as the kit's README says.
    plain = {"plugins": [{"type": "bridge", "ipam": {"ranges": [[{"subnet": "10.0.0.0/8"}]]}}], "name": "x"}
    assert go_marshal_indent(plain, sort_keys=True) == json.dumps(plain, indent=2, sort_keys=True)


# ---- CNI config rules

BRIDGE_CONF = json.dumps({"cniVersion": "0.3.1", "name": "br", "type": "bridge"})
LIST = json.dumps({"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "bridge"}, {"type": "portmap"}]})
ENTRY = cniconfig.plugin_entry(cniconfig.PluginSettings())


def test_entry_order_and_fields() -> None:
    entry = cniconfig.plugin_entry(cniconfig.PluginSettings(exclude_namespaces=" kube-system, ,istio-system"))
    assert list(entry) == ["cniVersion", "name", "type", "ipam", "dns", "plugin_log_level", "cni_agent_run_dir",
                           "ambient_enabled", "enablement_selectors", "exclude_namespaces", "pod_namespace",
                           "native_nftables", "enable_ambient_detection_retry"]
    assert entry["exclude_namespaces"] == ["kube-system", "istio-system"]
    assert ENTRY["exclude_namespaces"] is None and ENTRY["enablement_selectors"] == []


def test_enablement_selectors_as_go_marshals_them() -> None:
    text = "- podSelector:\n    matchLabels: {b: '2', a: '1'}\n- namespaceSelector:\n    matchExpressions:\n" \
           "    - {key: k, operator: In, values: [x]}\n"
    assert cniconfig.parse_enablement_selectors(text) == (
        {"podSelector": {"matchLabels": {"a": "1", "b": "2"}}, "namespaceSelector": {}},
        {"podSelector": {}, "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In",
                                                                        "values": ["x"]}]}})
    assert cniconfig.parse_enablement_selectors("") == ()
    with pytest.raises(cniconfig.CniConfigError, match="ambient-enablement-selector"):
        cniconfig.parse_enablement_selectors("podSelector: {}")


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("a.conflist", LIST, None),
    ("a.conf", BRIDGE_CONF, None),
    ("a.conf", LIST, "no 'type'"),
    ("a.conflist", json.dumps({"name": "x", "plugins": []}), "no plugins"),
    ("a.conflist", json.dumps({"plugins": [{"type": "x"}]}), "no name"),
    ("a.conflist", json.dumps({"name": "x", "plugins": [{"name": "y"}]}), "missing 'type'"),
    ("a.conflist", json.dumps({"name": "x", "plugins": [{"type": 3}]}), "'type' must be a string"),
    ("a.conflist", "{not json", "JSON"),
    ("a.conflist", "[]", "expected an object"),
])
def test_network_file_validity(name: str, text: str, problem: str | None) -> None:
    reason = cniconfig.validate_network_file(name, text)
    assert (reason is None) if problem is None else (problem in (reason or "")), reason


def test_primary_is_the_first_valid_file() -> None:
    listing = cniconfig.Listing({"00-broken.conflist": "{", "05-list.conf": LIST, "10-b.conf": BRIDGE_CONF,
                                 "20-a.conflist": LIST, "README": "x"})
    assert cniconfig.resolve_primary(cniconfig.ConfigSettings(), listing) == "10-b.conf"
    waiting = cniconfig.resolve_primary(cniconfig.ConfigSettings(), cniconfig.Listing({"00-broken.conflist": "{"}))
    assert isinstance(waiting, cniconfig.Waiting) and "00-broken.conflist" in waiting.reason


def test_a_file_too_large_to_read_that_may_be_the_runtimes_choice_makes_install_wait() -> None:
    """Oversized and sorting before every valid file: the runtime may load it, so no merge into another file;
    sorting after the first valid one it changes nothing. A configured name that is oversized is an error naming
    the file and the limit."""
    too_large = "300000 bytes, over install-cni's limit of 262144 bytes for a CNI config file"
    listing = cniconfig.Listing({"05-big.conflist": None, "10-b.conf": BRIDGE_CONF},
                                {"05-big.conflist": too_large}, frozenset({"05-big.conflist"}))
    waiting = cniconfig.resolve_primary(cniconfig.ConfigSettings(), listing)
    assert isinstance(waiting, cniconfig.Waiting) and f"05-big.conflist: {too_large}" in waiting.reason
    merged = cniconfig.marshal_config(cniconfig.insert_plugin_entry(ENTRY, BRIDGE_CONF))
    appeared = cniconfig.Listing({"05-big.conflist": None, "10-b.conflist": merged},
                                 {"05-big.conflist": too_large}, frozenset({"05-big.conflist"}))
    assert cniconfig.check_installed(cniconfig.ConfigSettings(), appeared, "10-b.conflist") == waiting.reason
    later = cniconfig.Listing({"10-b.conf": BRIDGE_CONF, "20-big.conflist": None},
                              {"20-big.conflist": too_large}, frozenset({"20-big.conflist"}))
    assert cniconfig.resolve_primary(cniconfig.ConfigSettings(), later) == "10-b.conf"
    named = cniconfig.Listing({"05-big.conflist": None}, {"05-big.conflist": too_large},
                              frozenset({"05-big.conflist"}))
    with pytest.raises(cniconfig.CniConfigError, match=r"05-big\.conflist: 300000 bytes, over install-cni.s limit"):
        cniconfig.plan_config_write(cniconfig.ConfigSettings(cni_conf_name="05-big.conflist"), named, ENTRY)


def test_a_config_nested_past_the_limit_is_a_json_error_not_a_crash() -> None:
    nested = "[" * 100_000
    assert "nested deeper than 128 levels" in (cniconfig.validate_network_file("00-x.conflist", nested) or "")
    assert cniconfig.plugin_types(nested) is None and not cniconfig.has_plugin_entry(nested)
    waiting = cniconfig.resolve_primary(cniconfig.ConfigSettings(), cniconfig.Listing({"00-x.conflist": nested}))
    assert isinstance(waiting, cniconfig.Waiting) and "nested deeper than 128 levels" in waiting.reason
    with pytest.raises(cniconfig.CniConfigError, match="nested deeper than 128 levels"):
        cniconfig.remove_plugin_entry(nested, "00-x.conflist")
    deep_but_allowed = json.loads(LIST)
    deep_but_allowed["plugins"][0]["args"] = json.loads("[" * 120 + "]" * 120)
    merged = cniconfig.marshal_config(cniconfig.insert_plugin_entry(ENTRY, json.dumps(deep_but_allowed)))
    assert cniconfig.has_plugin_entry(merged)


def test_named_primary_with_the_other_extension() -> None:
    listing = cniconfig.Listing({"net.conf": BRIDGE_CONF})
    assert cniconfig.resolve_primary(cniconfig.ConfigSettings(cni_conf_name="net.conflist"), listing) == "net.conf"
    listing = cniconfig.Listing({"net.conflist": LIST})
    assert cniconfig.resolve_primary(cniconfig.ConfigSettings(cni_conf_name="net.conf"), listing) == "net.conflist"
    missing = cniconfig.resolve_primary(cniconfig.ConfigSettings(cni_conf_name="other.conf"), listing)
    assert isinstance(missing, cniconfig.Waiting)


def test_merge_plan_renames_a_conf_and_keeps_its_mode() -> None:
    plan = cniconfig.plan_config_write(cniconfig.ConfigSettings(), cniconfig.Listing({"10-b.conf": BRIDGE_CONF}),
                                       ENTRY)
    assert isinstance(plan, cniconfig.ConfigWrite)
    assert (plan.target, plan.rename_to, plan.keep_source_mode, plan.source_had_entry) == (
        "10-b.conf", "10-b.conflist", True, False)
    merged = json.loads(plan.text)
    assert merged["name"] == "k8s-pod-network" and [p["type"] for p in merged["plugins"]] == ["bridge", "istio-cni"]
    assert "cniVersion" not in merged["plugins"][0] and "cniVersion" not in merged["plugins"][1]
    assert plan.text.endswith("}\n")


def test_merge_replaces_an_old_entry_and_reports_it() -> None:
    old = json.dumps({"name": "n", "plugins": [{"type": "istio-cni", "old": True}, {"type": "bridge"}]})
    plan = cniconfig.plan_config_write(cniconfig.ConfigSettings(), cniconfig.Listing({"a.conflist": old}), ENTRY)
    assert isinstance(plan, cniconfig.ConfigWrite) and plan.source_had_entry
    assert [p.get("old") for p in json.loads(plan.text)["plugins"]] == [None, None]


def test_check_installed() -> None:
    settings = cniconfig.ConfigSettings()
    merged = cniconfig.marshal_config(cniconfig.insert_plugin_entry(ENTRY, LIST))
    assert cniconfig.check_installed(settings, cniconfig.Listing({"10.conflist": merged}), None) is not None
    assert cniconfig.check_installed(settings, cniconfig.Listing({"10.conflist": merged}), "10.conflist") is None
    assert "not found" in (cniconfig.check_installed(settings, cniconfig.Listing({"10.conflist": LIST}),
                                                     "10.conflist") or "")
    assert "removed" in (cniconfig.check_installed(settings, cniconfig.Listing({}), "10.conflist") or "")
    preempted = cniconfig.Listing({"05.conflist": LIST, "10.conflist": merged})
    assert "preempted by 05.conflist" in (cniconfig.check_installed(settings, preempted, "10.conflist") or "")
    # A configured name is kept even when another file sorts first (upstream's rule).
    named = cniconfig.ConfigSettings(cni_conf_name="10.conflist")
    assert cniconfig.check_installed(named, preempted, "10.conflist") is None
    standalone = cniconfig.ConfigSettings(chained_cni_plugin=False)
    assert cniconfig.check_installed(standalone, cniconfig.Listing({"x.conf": BRIDGE_CONF}), "x.conf") is not None


def test_istio_owned_file_must_come_first_and_hold_the_primarys_plugins() -> None:
    settings = cniconfig.ConfigSettings(ambient_enabled=True, istio_owned_cni_config=True,
                                        istio_owned_cni_config_filename="02-istio.conflist")
    owned = cniconfig.marshal_config(cniconfig.insert_plugin_entry(ENTRY, LIST))
    listing = cniconfig.Listing({"02-istio.conflist": owned, "10.conflist": LIST})
    assert cniconfig.resolve_primary(settings, listing) == "10.conflist"
    assert cniconfig.check_installed(settings, listing, "02-istio.conflist") is None
    grown = json.dumps({"name": "net", "plugins": [{"type": "bridge"}, {"type": "portmap"}, {"type": "tuning"}]})
    listing = cniconfig.Listing({"02-istio.conflist": owned, "10.conflist": grown})
    assert "tuning" in (cniconfig.check_installed(settings, listing, "02-istio.conflist") or "")
    listing = cniconfig.Listing({"01-first.conflist": LIST, "02-istio.conflist": owned, "10.conflist": LIST})
    assert "highest priority" in (cniconfig.check_installed(settings, listing, "02-istio.conflist") or "")


def test_cleanup_deletes_only_a_file_of_our_own() -> None:
    assert cniconfig.cleanup_deletes_file(cniconfig.ConfigSettings(chained_cni_plugin=False), "x.conf")
    owned = cniconfig.ConfigSettings(istio_owned_cni_config=True, istio_owned_cni_config_filename="02.conflist")
    assert cniconfig.cleanup_deletes_file(owned, "02.conflist")
    # istio-owned set without ambient: the merge went into the primary, which must not be deleted.
    assert not cniconfig.cleanup_deletes_file(owned, "10-calico.conflist")
    assert not cniconfig.cleanup_deletes_file(cniconfig.ConfigSettings(), "10-calico.conflist")


def test_remove_plugin_entry() -> None:
    merged = cniconfig.insert_plugin_entry(ENTRY, LIST)
    removed = cniconfig.remove_plugin_entry(cniconfig.marshal_config(merged))
    assert [p["type"] for p in removed["plugins"]] == ["bridge", "portmap"]
    with pytest.raises(cniconfig.CniConfigError):
        cniconfig.remove_plugin_entry("{}")


# ---- kubeconfig

def test_kubeconfig_tls_shape() -> None:
    text = render_kubeconfig(KubeconfigInputs("https://10.96.0.1:443", b"service_account_token_string",
                                              b"-----BEGIN CERTIFICATE-----\n"))
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    assert text == (
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: " + ca + "\n"
        "    server: https://10.96.0.1:443\n  name: local\ncontexts:\n- context:\n    cluster: local\n"
        "    user: istio-cni\n  name: istio-cni-context\ncurrent-context: istio-cni-context\nkind: Config\n"
        "users:\n- name: istio-cni\n  user:\n    token: service_account_token_string\n")


def test_kubeconfig_skip_tls_and_odd_tokens_parse_back() -> None:
    text = render_kubeconfig(KubeconfigInputs("https://[fd00::1]:6443", b"tok: en\n", None, skip_tls_verify=True))
    loaded = yaml.safe_load(text)
    cluster = loaded["clusters"][0]["cluster"]
    assert cluster == {"insecure-skip-tls-verify": True, "server": "https://[fd00::1]:6443"}
    assert loaded["users"][0]["user"]["token"] == "tok: en\n"
    assert loaded["current-context"] == "istio-cni-context"


@pytest.mark.parametrize("text", ["true", "no", "123", "1.5", "null", "~", "a: b", "-x", "", " lead", "x:"])
def test_yaml_scalars_round_trip(text: str) -> None:
    assert yaml.safe_load("k: " + yaml_scalar(text))["k"] == text


# ---- plugin log lines

def test_plugin_log_body() -> None:
    entries = [json.dumps({"level": "info", "time": "2026-12-01T10:00:00.123456789Z", "msg": " hello ",
                           "pod": "default/a"}),
               json.dumps({"level": "fatal", "time": "2026-12-01T10:00:00Z", "msg": "dropped"}),
               json.dumps({"level": "info", "msg": "no time"}),
               "not json"]
    lines = parse_body(json.dumps(entries).encode())
    assert len(lines) == 1
    assert lines[0].level == logging.INFO and lines[0].msg == "hello"
    assert lines[0].text() == "hello\tpod=default/a"
    assert abs(lines[0].time - parse_rfc3339("2026-12-01T10:00:00.123456Z")) < 1e-6
    assert parse_rfc3339("2026-12-01T12:00:00+02:00") == parse_rfc3339("2026-12-01T10:00:00Z")
    with pytest.raises(PluginLogError):
        parse_body(b'{"level": "info"}')
    with pytest.raises(PluginLogError):
        parse_body(b"[1, 2]")


# ---- inotify events and the throttle

def test_which_events_matter() -> None:
    ours = frozenset({"istio-cni"})
    assert relevant(ours, IN_CLOSE_WRITE, "istio-cni")
    assert not relevant(ours, IN_CREATE, "bridge")
    assert relevant(ours, IN_IGNORED, "")  # the directory's watch is gone
    assert relevant(None, IN_MOVED_TO, "10-calico.conflist")
    assert not relevant(None, IN_MODIFY, "10-calico.conflist")  # half-written: wait for CLOSE_WRITE
    assert relevant(None, IN_Q_OVERFLOW, "")


def test_parse_events() -> None:
    data = struct.pack("iIII", 1, IN_CREATE, 0, 16) + b"a.conflist".ljust(16, b"\0") + struct.pack(
        "iIII", 2, IN_IGNORED, 0, 0)
    assert parse_events(data) == [(1, IN_CREATE, "a.conflist"), (2, IN_IGNORED, "")]


def test_throttle_spaces_reinstalls_and_warns_of_a_loop() -> None:
    throttle = ReinstallThrottle(min_interval=0.1, burst=3, window=5.0)
    assert throttle.delay(0.0) == 0.0
    warnings = [throttle.record(t) for t in (0.0, 0.2, 0.4, 0.6, 0.8)]
    assert warnings == [False, False, False, True, False]  # once per window
    assert throttle.delay(0.85) == pytest.approx(0.05)
    assert throttle.delay(2.0) == 0.0
    assert [throttle.record(t) for t in (5.7, 5.8, 5.9, 6.0)] == [False, False, False, True]  # still looping
    assert not ReinstallThrottle(burst=3).record(100.0)
