"""The effective ProxyConfig checked as upstream checks it at start (ValidateMeshConfigProxyConfig).

Upstream's agent runs this check after layering mesh config, PROXY_CONFIG, the
flags and the statsd lookup, and before the two pod annotations it applies last;
any error stops the start. Every error is collected, as upstream collects them,
so one run names every problem.

Beyond upstream, three values are checked against what Envoy's command line
takes (its flags are uint32): a negative `concurrency`, a `drainDuration` over
2^32-1 s and a `fileFlushInterval` over 2^32-1 ms would otherwise start an Envoy
that dies on its arguments, leaving only its usage text as the explanation.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping
from typing import Any

from istio_agent.config.durations import parse_duration
from istio_agent.config.errors import ConfigError
from istio_agent.config.proxyconfig import ProxyConfig

log = logging.getLogger(__name__)

UINT32_MAX = 2**32 - 1
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CONFIGMAP_PREFIX = "configmap://"


def validate_proxy_config(config: ProxyConfig) -> None:
    """ConfigError listing every problem (field and value); warnings are logged."""
    errors = proxy_config_errors(config.values)
    for warning in proxy_config_warnings(config.values):
        log.warning("ProxyConfig: %s", warning)
    if errors:
        raise ConfigError("invalid ProxyConfig: " + "; ".join(errors))


def proxy_config_errors(pc: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    if not pc.get("configPath"):
        errors.append("configPath must be set")
    if not pc.get("binaryPath"):
        errors.append("binaryPath must be set")
    if "tracingServiceName" not in pc and not pc.get("serviceCluster"):
        errors.append("serviceCluster must be specified")
    errors += _drain_duration_errors(float(pc.get("drainDuration") or 0.0))
    discovery = str(pc.get("discoveryAddress") or "")
    if not discovery:
        errors.append("discoveryAddress must be set to the proxy discovery service")
    else:
        errors += _prefixed(f"invalid discoveryAddress {discovery!r}:", proxy_address_error(discovery))
    errors += _tracing_errors(_message(pc, "tracing"))
    statsd = str(pc.get("statsdUdpAddress") or "")
    if statsd:
        errors += _prefixed(f"invalid statsdUdpAddress {statsd!r}:", proxy_address_error(statsd))
    metrics = str(pc.get("envoyMetricsServiceAddress") or "")
    if metrics:
        errors += _prefixed(f"invalid envoyMetricsServiceAddress {metrics!r}:", proxy_address_error(metrics))
    for name in ("envoyMetricsService", "envoyAccessLogService"):
        address = str(_message(pc, name).get("address") or "")
        if address:
            errors += _prefixed(f"invalid {name}.address {address!r}:", proxy_address_error(address))
    for name in ("proxyAdminPort", "statusPort"):
        errors += _prefixed(f"invalid {name}:", port_error(int(pc.get(name) or 0)))
    policy = pc.get("controlPlaneAuthPolicy", "NONE")
    if policy not in ("NONE", "MUTUAL_TLS"):
        errors.append(f"invalid controlPlaneAuthPolicy: unrecognized control plane auth policy {policy!r}")
    if "privateKeyProvider" in pc:
        provider = _message(pc, "privateKeyProvider")
        errors += _prefixed("invalid privateKeyProvider:", _private_key_provider_error(provider))
    errors += _envoy_flag_errors(pc)
    return errors


def proxy_config_warnings(pc: Mapping[str, Any]) -> list[str]:
    warnings: list[str] = []
    if pc.get("envoyMetricsServiceAddress") and not proxy_address_error(str(pc["envoyMetricsServiceAddress"])):
        warnings.append("envoyMetricsServiceAddress is deprecated, use envoyMetricsService instead")
    if "ISTIO_META_DNS_AUTO_ALLOCATE" in (pc.get("proxyMetadata") or {}):
        warnings.append("proxyMetadata ISTIO_META_DNS_AUTO_ALLOCATE is deprecated (DNS auto-allocation v2 "
                        "replaces it)")
    return warnings


# --- the pieces ---------------------------------------------------------------------------------------

def port_error(port: int) -> str:
    return "" if 1 <= port <= 65535 else f"port number {port} must be in the range 1..65535"


def fqdn_error(name: str) -> str:
    """Upstream's ValidateFQDN: 1-255 characters, DNS-1123 labels, a top-level label that is not all digits."""
    if len(name) > 255:
        return f"domain name {name!r} too long (max 255)"
    if not name:
        return "empty domain name not allowed"
    labels = name.split(".")
    if labels[-1].isdigit():
        return f"domain name {name!r} invalid (top level domain {labels[-1]!r} cannot be all-numeric)"
    for index, label in enumerate(labels):
        if index == len(labels) - 1 and label == "":
            break  # a trailing dot is allowed
        if len(label) > 63 or not _DNS1123_LABEL.fullmatch(label):
            return f"domain name {name!r} invalid (label {label!r} invalid)"
    return ""


def split_go_host_port(address: str) -> tuple[str, str]:
    """Go's net.SplitHostPort: `host:port` or `[host]:port`; ValueError as Go refuses."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ValueError("missing ']' in address")
        if end + 1 >= len(address) or address[end + 1] != ":":
            raise ValueError("missing port in address")
        host, port = address[1:end], address[end + 2:]
        if "[" in host or "]" in port or "[" in port:
            raise ValueError("unexpected '[' or ']' in address")
        return host, port
    host, colon, port = address.rpartition(":")
    if not colon:
        raise ValueError("missing port in address")
    if ":" in host:
        raise ValueError("too many colons in address")
    if "[" in address or "]" in address:
        raise ValueError("unexpected '[' or ']' in address")
    return host, port


def proxy_address_error(address: str) -> str:
    """Upstream's ValidateProxyAddress: host:port, the port 1-65535, the host a DNS name or an IP."""
    try:
        host, port_text = split_go_host_port(address)
    except ValueError as exc:
        return f"unable to split {address!r}: {exc}"
    body = port_text[1:] if port_text[:1] in "+-" else port_text
    if not body.isdigit():
        return f"port ({port_text}) is not a number"
    problem = port_error(int(port_text))
    if problem:
        return problem
    if fqdn_error(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"{host!r} is not a valid hostname or an IP address"
    return ""


def _message(pc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = pc.get(name)
    return value if isinstance(value, Mapping) else {}


def _prefixed(prefix: str, problem: str | list[str]) -> list[str]:
    problems = [problem] if isinstance(problem, str) else problem
    return [f"{prefix} {text}" for text in problems if text]


def _drain_duration_errors(seconds: float) -> list[str]:
    nanos = round(seconds * 1e9)
    if nanos < 1_000_000:
        return ["invalid drainDuration: duration must be greater than 1ms"]
    if nanos % 1_000_000:
        return ["invalid drainDuration: only durations to ms precision are supported"]
    if nanos % 1_000_000_000:
        return ["invalid drainDuration: drain time only supports durations to seconds precision"]
    if seconds > UINT32_MAX:
        return [f"invalid drainDuration: {seconds:.0f}s is more than Envoy's --drain-time-s takes ({UINT32_MAX}s)"]
    return []


def _tracing_errors(tracing: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    lightstep = tracing.get("lightstep")
    if isinstance(lightstep, Mapping):
        address = str(lightstep.get("address") or "")
        if not address:
            errors.append("invalid tracing.lightstep: address is required")
        errors += _prefixed("invalid tracing.lightstep: invalid lightstep address:", proxy_address_error(address))
        if not lightstep.get("accessToken"):
            errors.append("invalid tracing.lightstep: access token is required")
    for name in ("zipkin", "datadog"):
        tracer = tracing.get(name)
        if isinstance(tracer, Mapping):
            # $(HOST_IP) is filled in by Envoy's environment; upstream checks the rest with an IP in its place.
            address = str(tracer.get("address") or "").replace("$(HOST_IP)", "127.0.0.1", 1)
            errors += _prefixed(f"invalid tracing.{name}:", proxy_address_error(address))
    tls = tracing.get("tlsSettings")
    if isinstance(tls, Mapping):
        errors += _prefixed("invalid tracing.tlsSettings:", client_tls_errors(tls))
    return errors


def client_tls_errors(settings: Mapping[str, Any]) -> list[str]:
    """Upstream's ValidateTLS for settings outside any namespace (the mesh's own)."""
    errors: list[str] = []
    mode = settings.get("mode", "DISABLE")
    credential = str(settings.get("credentialName") or "")
    if credential.startswith(_CONFIGMAP_PREFIX):
        errors.append("invalid configmap:// credentialName: namespace must match the configuration namespace ''")
    if settings.get("insecureSkipVerify") is True:
        if mode == "SIMPLE" and (settings.get("caCertificates") or credential or settings.get("subjectAltNames")):
            errors.append("cannot specify CaCertificates or CredentialName or SubjectAltNames when "
                          "InsecureSkipVerify is set true")
        if mode == "MUTUAL" and (settings.get("caCertificates") or settings.get("subjectAltNames")):
            errors.append("cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true")
    if mode in ("SIMPLE", "MUTUAL") and credential:
        if any(settings.get(k) for k in ("clientCertificate", "caCertificates", "privateKey", "caCrl")):
            errors.append("cannot specify client certificates or CA certificate or CA CRL If credentialName is set")
        return errors
    if mode == "MUTUAL":
        if not settings.get("clientCertificate"):
            errors.append("client certificate required for mutual tls")
        if not settings.get("privateKey"):
            errors.append("private key required for mutual tls")
    return errors


def _private_key_provider_error(provider: Mapping[str, Any]) -> list[str]:
    for name in ("cryptomb", "qat"):
        if name in provider:
            settings = provider[name] if isinstance(provider[name], Mapping) else {}
            delay = settings.get("pollDelay")
            if delay is None:
                return [f"{name}: pollDelay is required"]
            if parse_duration(str(delay)) == 0:
                return [f"{name}: pollDelay must be non zero"]
            return []
    return ["private key provider configuration is required"]


def _envoy_flag_errors(pc: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    concurrency = pc.get("concurrency")
    if concurrency is not None and int(concurrency) < 0:
        errors.append(f"invalid concurrency: {concurrency} is negative (0 means one worker per core)")
    flush = pc.get("fileFlushInterval")
    if flush is not None and float(flush) * 1000 > UINT32_MAX:
        errors.append(f"invalid fileFlushInterval: {float(flush):.0f}s is more than Envoy's "
                      f"--file-flush-interval-msec takes ({UINT32_MAX}ms)")
    return errors
