"""ProxyConfig's readinessProbe as the health checker reads it: upstream's defaults, the default host, and a
clear refusal (naming the field) of what upstream would only fail on at run time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import AgentFlags, HostFacts, resolve_agent_options
from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.health.options import ExecAction, HealthCheckOptions, parse_readiness_probe
from istio_agent.status.probes.rules import GrpcAction, HttpGetAction, TcpSocketAction

POD = {"POD_NAME": "vm-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "vm", "INSTANCE_IP": "10.1.1.5"}


def health(tmp_path: Path, probe: Any = None, **environ: str) -> HealthCheckOptions | None:
    if probe is not None:
        environ["PROXY_CONFIG"] = json.dumps({"readinessProbe": probe})
    config = load_agent_config(env.Environment({**POD, **environ}), tmp_path)
    return resolve_agent_options(config, AgentFlags(), HostFacts()).health


def test_no_readiness_probe_no_checker(tmp_path: Path) -> None:
    assert health(tmp_path) is None


def test_zero_values_take_upstreams_defaults_and_probes_go_to_the_proxy_ip(tmp_path: Path) -> None:
    options = health(tmp_path, {"httpGet": {"port": 8080}})
    assert options == HealthCheckOptions(
        action=HttpGetAction(port=8080, path="/", scheme="HTTP"), initial_delay=0.0, timeout=1.0, period=10.0,
        success_threshold=1, failure_threshold=1, default_host="10.1.1.5", ipv6=False)


def test_every_field_read(tmp_path: Path) -> None:
    probe = {"initialDelaySeconds": 3, "timeoutSeconds": 2, "periodSeconds": 4, "successThreshold": 2,
             "failureThreshold": 5,
             "httpGet": {"path": "ready", "port": 8443, "host": "127.0.0.9", "scheme": "https",
                         "httpHeaders": [{"name": "Host", "value": "app.local"}, {"name": "X-A", "value": "b"}]}}
    options = health(tmp_path, probe)
    assert options is not None
    assert (options.initial_delay, options.timeout, options.period) == (3.0, 2.0, 4.0)
    assert (options.success_threshold, options.failure_threshold) == (2, 5)
    assert options.action == HttpGetAction(port=8443, path="/ready", scheme="HTTPS", host="127.0.0.9",
                                           headers=(("Host", "app.local"), ("X-A", "b")))


def test_tcp_exec_and_grpc(tmp_path: Path) -> None:
    assert parse_readiness_probe({"tcpSocket": {"port": 9000}}) is not None
    tcp = parse_readiness_probe({"tcpSocket": {"port": 9000, "host": "10.0.0.2"}})
    assert tcp is not None and tcp.action == TcpSocketAction(port=9000, host="10.0.0.2")
    run = parse_readiness_probe({"exec": {"command": ["/bin/check", "-q"]}})
    assert run is not None and run.action == ExecAction(("/bin/check", "-q"))
    grpc = health(tmp_path, {"grpc": {"port": 7070, "service": "echo"}})
    assert grpc is not None and grpc.action == GrpcAction(port=7070, service="echo")


def test_default_host_legacy_localhost_and_ipv6(tmp_path: Path) -> None:
    legacy = health(tmp_path, {"tcpSocket": {"port": 1}}, REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION="true")
    assert legacy is not None and legacy.default_host == "localhost"
    v6 = parse_readiness_probe({"tcpSocket": {"port": 1}}, ("fd00::5", "fd00::6"))
    assert v6 is not None and v6.default_host == "fd00::5" and v6.ipv6
    dual = parse_readiness_probe({"tcpSocket": {"port": 1}}, ("fd00::5", "10.0.0.5"))
    assert dual is not None and not dual.ipv6
    assert parse_readiness_probe({"tcpSocket": {"port": 1}}).default_host == "localhost"  # type: ignore[union-attr]


@pytest.mark.parametrize(("probe", "field"), [
    ({"periodSeconds": 5}, "readinessProbe: must set one of httpGet, tcpSocket, exec, grpc"),
    ({"exec": {"command": []}}, "readinessProbe.exec.command"),
    ({"exec": {}}, "readinessProbe.exec.command"),
    ({"httpGet": {"path": "/"}}, "readinessProbe.httpGet.port: must be a port 1-65535, got 0"),
    ({"tcpSocket": {"port": 70000}}, "readinessProbe.tcpSocket.port"),
    ({"httpGet": {"port": 80, "scheme": "ftp"}}, "readinessProbe.httpGet.scheme: must be HTTP or HTTPS, got 'ftp'"),
    ({"httpGet": {"port": 80, "httpHeaders": [{"name": "a b", "value": "x"}]}},
     "readinessProbe.httpGet.httpHeaders[0].name"),
    ({"grpc": {"port": 1}, "periodSeconds": -1}, "readinessProbe.periodSeconds: must not be negative, got -1"),
    ({"grpc": {"port": 1}, "failureThreshold": -2}, "readinessProbe.failureThreshold"),
])
def test_bad_probes_are_refused_naming_the_field(tmp_path: Path, probe: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        health(tmp_path, probe)


def test_a_wrong_type_is_refused_by_the_proxyconfig_reader(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readinessProbe"):
        health(tmp_path, {"periodSeconds": "often", "tcpSocket": {"port": 1}})
