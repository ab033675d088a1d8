"""App probes: ISTIO_KUBE_APP_PROBERS parsing and validation, request construction, kubelet redirect rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import probe_options
from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.status.probes.rules import (
    MAX_REQUESTS,
    PROBE_USER_AGENT,
    Answer,
    AppProbe,
    Fail,
    Follow,
    GrpcAction,
    HttpGetAction,
    TcpSocketAction,
    next_step,
    parse_app_probers,
    probe_url,
    request_headers,
    rewrite_host,
    source_address,
)

LIVEZ = "/app-health/web/livez"


def parse_one(prober: Any, path: str = LIVEZ) -> AppProbe:
    return parse_app_probers(json.dumps({path: prober}))[path]


# ---- parsing ---------------------------------------------------------------------------------------------


def test_empty_variable_means_no_probes() -> None:
    assert parse_app_probers("") == {}
    assert parse_app_probers("  ") == {}


def test_http_get_with_everything() -> None:
    probe = parse_one({
        "httpGet": {"path": "healthz?full=1", "port": 8443, "scheme": "HTTPS", "host": "10.0.0.9",
                    "httpHeaders": [{"name": "X-Probe", "value": "a"}, {"name": "X-Probe", "value": "b"}]},
        "timeoutSeconds": 3,
    })
    assert probe == AppProbe(LIVEZ, HttpGetAction(port=8443, path="/healthz?full=1", scheme="HTTPS",
                                                  host="10.0.0.9", headers=(("X-Probe", "a"), ("X-Probe", "b"))),
                             timeout=3.0)


def test_defaults_match_kubernetes() -> None:
    probe = parse_one({"httpGet": {"port": 8080}})
    assert probe.action == HttpGetAction(port=8080, path="/", scheme="HTTP")
    assert probe.timeout == 1.0  # timeoutSeconds absent or 0: Kubernetes' default of one second
    assert parse_one({"httpGet": {"port": 8080}, "timeoutSeconds": 0}).timeout == 1.0
    assert parse_one({"httpGet": {"port": 8080, "scheme": "https"}}).action.scheme == "HTTPS"  # type: ignore[union-attr]


def test_tcp_and_grpc_and_lifecycle_paths() -> None:
    probers = parse_app_probers(json.dumps({
        "/app-health/db/readyz": {"tcpSocket": {"port": 5432}},
        "/app-health/api/startupz": {"grpc": {"port": 9090, "service": "api.v1"}, "timeoutSeconds": 2},
        "/app-health/api/livez": {"grpc": {"port": 9090, "service": None}},
        "/app-lifecycle/web/prestopz": {"httpGet": {"port": 80, "path": "/stop"}},
        "/app-lifecycle/web/poststartz": {"httpGet": {"port": 80, "path": "/start"}},
    }))
    assert probers["/app-health/db/readyz"].action == TcpSocketAction(port=5432)
    assert probers["/app-health/api/startupz"].action == GrpcAction(port=9090, service="api.v1")
    assert probers["/app-health/api/startupz"].timeout == 2.0
    assert probers["/app-health/api/livez"].action == GrpcAction(port=9090, service="")
    assert probers["/app-lifecycle/web/prestopz"].action == HttpGetAction(port=80, path="/stop")


def test_unknown_fields_are_ignored_like_upstream() -> None:
    probe = parse_one({"httpGet": {"port": 80, "future": 1}, "periodSeconds": 10})
    assert probe.action == HttpGetAction(port=80)


@pytest.mark.parametrize(("text", "expected"), [
    ("{not json", "ISTIO_KUBE_APP_PROBERS: not valid JSON"),
    ("[1]", "ISTIO_KUBE_APP_PROBERS: must be a JSON object"),
    (json.dumps({"/healthz": {"httpGet": {"port": 80}}}), '["/healthz"]: invalid path'),
    (json.dumps({"/app-health/a/b/livez": {"httpGet": {"port": 80}}}), '["/app-health/a/b/livez"]: invalid path'),
    (json.dumps({"/app-health/web/alivez": {"httpGet": {"port": 80}}}), "invalid path"),
    (json.dumps({LIVEZ: "x"}), f'["{LIVEZ}"]: must be a JSON object'),
    (json.dumps({LIVEZ: {}}), f'["{LIVEZ}"]: must have exactly one of httpGet, tcpSocket or grpc (found none)'),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80}, "tcpSocket": {"port": 80}}}), "(found httpGet, tcpSocket)"),
    (json.dumps({LIVEZ: {"httpGet": {"port": "http"}}}), f'["{LIVEZ}"].httpGet.port: must be an integer port'),
    (json.dumps({LIVEZ: {"httpGet": {"port": "8080"}}}), ".httpGet.port: must be an integer port"),
    (json.dumps({LIVEZ: {"httpGet": {}}}), ".httpGet.port: must be an integer port 1-65535"),
    (json.dumps({LIVEZ: {"httpGet": {"port": 70000}}}), ".httpGet.port: port 70000 is out of range"),
    (json.dumps({LIVEZ: {"httpGet": {"port": True}}}), ".httpGet.port: must be an integer"),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80, "scheme": "FTP"}}}), '.httpGet.scheme: must be HTTP or HTTPS'),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80, "path": 5}}}), ".httpGet.path: must be a string"),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80, "path": "/a b"}}}), ".httpGet.path: must be a URL path"),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80, "httpHeaders": {"a": "b"}}}}), ".httpGet.httpHeaders: must be a list"),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80, "httpHeaders": [{"value": "b"}]}}}),
     ".httpGet.httpHeaders[0].name: must be a header name"),
    (json.dumps({LIVEZ: {"httpGet": {"port": 80, "httpHeaders": [{"name": "X", "value": "a\r\nB: c"}]}}}),
     ".httpGet.httpHeaders[0].value: must be a one-line string"),
    (json.dumps({LIVEZ: {"tcpSocket": {"port": "db"}}}), ".tcpSocket.port: must be an integer port"),
    (json.dumps({LIVEZ: {"tcpSocket": {"port": 1, "host": 7}}}), ".tcpSocket.host: must be a string"),
    (json.dumps({LIVEZ: {"grpc": {"port": 0}}}), ".grpc.port: port 0 is out of range"),
    (json.dumps({LIVEZ: {"grpc": {"port": 9, "service": 1}}}), ".grpc.service: must be a string"),
    (json.dumps({LIVEZ: {"grpc": {"port": 9}, "timeoutSeconds": -1}}), ".timeoutSeconds: must be a non-negative"),
    (json.dumps({LIVEZ: {"grpc": {"port": 9}, "timeoutSeconds": 1.5}}), ".timeoutSeconds: must be a non-negative"),
    (json.dumps({LIVEZ: {"grpc": {"port": 9}, "timeoutSeconds": "1"}}), ".timeoutSeconds: must be a non-negative"),
])
def test_malformed_probers_name_the_path_and_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_app_probers(text)
    assert expected in str(caught.value)
    assert str(caught.value).startswith("ISTIO_KUBE_APP_PROBERS")


def test_options_from_agent_config(tmp_path: Path) -> None:
    probers = {LIVEZ: {"httpGet": {"port": 8080}}}
    environment = env.Environment({"INSTANCE_IP": "10.1.2.3", "POD_NAMESPACE": "default",
                                   "ISTIO_KUBE_APP_PROBERS": json.dumps(probers)})
    options = probe_options(load_agent_config(environment, tmp_path))
    assert options.pod_ip == "10.1.2.3"
    assert options.status_port == 15020
    assert options.probers[LIVEZ].action == HttpGetAction(port=8080)

    bad = env.Environment({"ISTIO_KUBE_APP_PROBERS": json.dumps({LIVEZ: {"httpGet": {"port": "x"}}})})
    with pytest.raises(ConfigError, match=r"httpGet\.port"):
        probe_options(load_agent_config(bad, tmp_path))


@pytest.mark.parametrize(("value", "http2"), [(None, True), ("true", True), ("1", True), ("false", False),
                                             ("0", False), ("False", False)])
def test_http2_probing_follows_istio_enable_http2_probing(tmp_path: Path, value: str | None, http2: bool) -> None:
    """Upstream's default is on; Go's boolean spellings turn it off."""
    environment = env.Environment({} if value is None else {"ISTIO_ENABLE_HTTP2_PROBING": value})
    options = probe_options(load_agent_config(environment, tmp_path))
    assert options.http2 is http2
    assert options.keepalive is False  # independent of ENABLE_PROBE_KEEPALIVE_CONNECTIONS


def test_a_malformed_istio_enable_http2_probing_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ISTIO_ENABLE_HTTP2_PROBING"):
        probe_options(load_agent_config(env.Environment({"ISTIO_ENABLE_HTTP2_PROBING": "sometimes"}), tmp_path))


# ---- requests --------------------------------------------------------------------------------------------


def test_probe_url_goes_to_the_pod_ip_unless_the_probe_names_a_host() -> None:
    assert probe_url(HttpGetAction(port=8080, path="/ready"), "10.0.0.5") == "http://10.0.0.5:8080/ready"
    assert probe_url(HttpGetAction(port=443, scheme="HTTPS", host="127.0.0.1"), "10.0.0.5") == "https://127.0.0.1:443/"
    assert probe_url(HttpGetAction(port=80, path="/x?y=1"), "fd00::5") == "http://[fd00::5]:80/x?y=1"


def test_source_address_only_for_the_pod_itself() -> None:
    assert source_address("10.0.0.5", "10.0.0.5") == "127.0.0.6"
    assert source_address("127.0.0.1", "10.0.0.5") == "127.0.0.6"
    assert source_address("fd00::5", "fd00::5") == "::6"
    assert source_address("10.9.9.9", "10.0.0.5") is None
    assert source_address("example.internal", "10.0.0.5") is None


def test_host_rewrite_swaps_the_status_port_for_the_app_port() -> None:
    assert rewrite_host("10.0.0.5:15020", 15020, 8080) == "10.0.0.5:8080"
    assert rewrite_host("[fd00::5]:15020", 15020, 8080) == "[fd00::5]:8080"
    assert rewrite_host("app.example:9999", 15020, 8080) == "app.example:9999"
    assert rewrite_host("app.example", 15020, 8080) == "app.example"
    assert rewrite_host(None, 15020, 8080) is None


def test_headers_forwarded_overridden_and_user_agent() -> None:
    incoming = [("Host", "10.0.0.5:15020"), ("User-Agent", "kube-probe/1.30"), ("Accept", "*/*"),
                ("Connection", "close"), ("X-Probe", "from-kubelet"), ("X-Other", "1")]
    action = HttpGetAction(port=8080, headers=(("X-Probe", "mine"), ("x-probe", "mine2")))
    headers, host = request_headers(action, incoming, "10.0.0.5:15020", 15020)
    assert headers == [("User-Agent", "kube-probe/1.30"), ("Accept", "*/*"), ("X-Other", "1"), ("X-Probe", "mine"),
                       ("x-probe", "mine2")], "the kubelet's User-Agent relayed, as upstream's"
    assert host == "10.0.0.5:8080"
    headers, _ = request_headers(action, [("Accept", "*/*")], None, 15020)
    assert headers[-1] == ("User-Agent", PROBE_USER_AGENT), "none from the kubelet nor the probe: the client's own"


def test_probe_headers_may_set_user_agent_and_host() -> None:
    action = HttpGetAction(port=8080, headers=(("user-agent", "custom/2"), ("Host", "web.example")))
    headers, host = request_headers(action, [("User-Agent", "kube-probe/1.30")], "10.0.0.5:15020", 15020)
    assert headers == [("user-agent", "custom/2")]
    assert host == "web.example"


# ---- redirects and answers -------------------------------------------------------------------------------

FIRST = "http://10.0.0.5:8080/healthz"


@pytest.mark.parametrize("status", [200, 204, 404, 418, 500, 503])
def test_non_redirect_statuses_pass_through_with_the_body(status: int) -> None:
    assert next_step(status, None, FIRST, FIRST, 1, None) == Answer(status)


@pytest.mark.parametrize("status", [300, 304, 305, 306, 301, 302])
def test_3xx_without_a_followable_redirect_answers_200(status: int) -> None:
    assert next_step(status, None, FIRST, FIRST, 1, None) == Answer(200, pass_body=False)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_same_host_redirects_are_followed(status: int) -> None:
    assert next_step(status, "/other", FIRST, FIRST, 1, "web:8080") == Follow("http://10.0.0.5:8080/other", "web:8080")
    # An absolute same-host location (another port or scheme is still the same host) drops a custom Host.
    assert next_step(status, "https://10.0.0.5:8443/x", FIRST, FIRST, 1, "web:8080") == Follow(
        "https://10.0.0.5:8443/x", None)


def test_redirect_to_another_host_is_success_without_following() -> None:
    assert next_step(302, "http://elsewhere.example/login", FIRST, FIRST, 1, None) == Answer(200, pass_body=False)
    # The host is compared with the first request's, not the current one.
    assert next_step(302, "http://10.0.0.6/x", "http://10.0.0.5:8080/a", FIRST, 3, None) == Answer(200, False)


def test_redirect_loop_fails_at_the_tenth_request() -> None:
    assert isinstance(next_step(302, "/loop", FIRST, FIRST, MAX_REQUESTS - 1, None), Follow)
    step = next_step(302, "/loop", FIRST, FIRST, MAX_REQUESTS, None)
    assert isinstance(step, Fail)
    assert "10 redirects" in step.reason


def test_redirect_to_an_unusable_location_fails() -> None:
    assert isinstance(next_step(302, "ftp://10.0.0.5/x", FIRST, FIRST, 1, None), Fail)
    assert isinstance(next_step(302, "http://10.0.0.5:99999/x", FIRST, FIRST, 1, None), Fail)


# ---- grpc.health.v1 messages: loaded by the first gRPC probe, not at agent start ---------------------------------
