"""Upstream's start-up check of the effective ProxyConfig (ValidateMeshConfigProxyConfig), rule by rule."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.config.node import instance_ips
from istio_agent.config.proxyconfig import DEFAULTS, ProxyConfig
from istio_agent.config.proxyconfig_validation import (
    client_tls_errors,
    fqdn_error,
    proxy_address_error,
    proxy_config_errors,
    validate_proxy_config,
)


def errors(**fields: Any) -> list[str]:
    return proxy_config_errors({**DEFAULTS, **fields})


def test_upstreams_defaults_are_valid() -> None:
    assert errors() == []
    validate_proxy_config(ProxyConfig())


@pytest.mark.parametrize(("fields", "expected"), [
    ({"configPath": ""}, "configPath must be set"),
    ({"binaryPath": ""}, "binaryPath must be set"),
    ({"serviceCluster": ""}, "serviceCluster must be specified"),
    ({"drainDuration": 0.0005}, "duration must be greater than 1ms"),
    ({"drainDuration": 1.0005}, "only durations to ms precision"),
    ({"drainDuration": 2.5}, "drain time only supports durations to seconds precision"),
    ({"drainDuration": 2.0**32}, "more than Envoy's --drain-time-s takes (4294967295s)"),
    ({"discoveryAddress": ""}, "discoveryAddress must be set"),
    ({"discoveryAddress": "istiod:0"}, "port number 0 must be in the range 1..65535"),
    ({"discoveryAddress": "istiod:http"}, "port (http) is not a number"),
    ({"discoveryAddress": "a:b:15012"}, "too many colons"),
    ({"statsdUdpAddress": "10.0.0.1"}, "invalid statsdUdpAddress '10.0.0.1': unable to split"),
    ({"envoyMetricsServiceAddress": "m"}, "invalid envoyMetricsServiceAddress 'm'"),
    ({"envoyMetricsService": {"address": "bad host:1"}}, "invalid envoyMetricsService.address"),
    ({"envoyAccessLogService": {"address": "als"}}, "invalid envoyAccessLogService.address 'als'"),
    ({"proxyAdminPort": 0}, "invalid proxyAdminPort: port number 0"),
    ({"statusPort": 70000}, "invalid statusPort: port number 70000"),
    ({"controlPlaneAuthPolicy": "INHERIT"}, "unrecognized control plane auth policy 'INHERIT'"),
    ({"tracing": {"lightstep": {"address": "ls:8080"}}}, "access token is required"),
    ({"tracing": {"lightstep": {"accessToken": "t"}}}, "address is required"),
    ({"tracing": {"zipkin": {}}}, "invalid tracing.zipkin: unable to split ''"),
    ({"tracing": {"datadog": {"address": "dd"}}}, "invalid tracing.datadog"),
    ({"privateKeyProvider": {}}, "private key provider configuration is required"),
    ({"privateKeyProvider": {"cryptomb": {}}}, "cryptomb: pollDelay is required"),
    ({"privateKeyProvider": {"qat": {"pollDelay": "0s"}}}, "qat: pollDelay must be non zero"),
    ({"concurrency": -3}, "invalid concurrency: -3 is negative"),
    ({"fileFlushInterval": 5e6}, "more than Envoy's --file-flush-interval-msec takes"),
])
def test_each_rule(fields: dict[str, Any], expected: str) -> None:
    found = errors(**fields)
    assert found and expected in found[0], found


def test_every_problem_is_named_at_once() -> None:
    config = ProxyConfig()
    config.values.update(statusPort=0, proxyAdminPort=0, discoveryAddress="x")
    with pytest.raises(ConfigError) as caught:
        validate_proxy_config(config)
    assert str(caught.value).count(";") == 2, caught.value


def test_tracing_tls_follows_upstreams_client_tls_rules() -> None:
    assert client_tls_errors({"mode": "MUTUAL"}) == ["client certificate required for mutual tls",
                                                     "private key required for mutual tls"]
    assert client_tls_errors({"mode": "SIMPLE", "credentialName": "c", "caCertificates": "/ca"}) == [
        "cannot specify client certificates or CA certificate or CA CRL If credentialName is set"]
    assert "InsecureSkipVerify" in client_tls_errors({"mode": "SIMPLE", "insecureSkipVerify": True,
                                                      "caCertificates": "/ca"})[0]
    assert client_tls_errors({"mode": "ISTIO_MUTUAL"}) == []
    assert errors(tracing={"zipkin": {"address": "z:9411"}, "tlsSettings": {"mode": "MUTUAL"}})[0].startswith(
        "invalid tracing.tlsSettings: client certificate required")


def test_addresses_as_upstream_reads_them() -> None:
    for good in ("istiod.istio-system.svc:15012", "localhost:15010", "10.0.0.1:9125", "[fd00::1]:15012",
                 "istiod.:15012", "$(HOST_IP):9411".replace("$(HOST_IP)", "127.0.0.1")):
        assert proxy_address_error(good) == "", good
    assert "not a valid hostname" in proxy_address_error("Istiod:15012")
    assert "not a valid hostname" in proxy_address_error("a.123:1")
    assert fqdn_error("a" * 64 + ".svc") and fqdn_error("") and fqdn_error("x" * 256)
    assert errors(tracing={"zipkin": {"address": "$(HOST_IP):9411"}}) == []


def test_deprecated_settings_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    config = ProxyConfig()
    config.values.update(envoyMetricsServiceAddress="m:1", proxyMetadata={"ISTIO_META_DNS_AUTO_ALLOCATE": "true"})
    with caplog.at_level(logging.WARNING):
        validate_proxy_config(config)
    assert "envoyMetricsServiceAddress is deprecated" in caplog.text
    assert "ISTIO_META_DNS_AUTO_ALLOCATE is deprecated" in caplog.text


def test_an_instance_ip_that_is_not_an_ip_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ips = instance_ips(env.Environment({"INSTANCE_IP": "not-an-ip"}), [("eth0", "10.1.1.5")])
    assert ips == ["10.1.1.5"], "upstream goes by the host's addresses"
    assert "INSTANCE_IP='not-an-ip' is not an IP address" in caplog.text
