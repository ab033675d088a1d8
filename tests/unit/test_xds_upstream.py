"""How the XDS proxy reaches istiod: trust, server name, metadata, and options from the agent config."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import xds_options
from istio_agent.config import env
from istio_agent.pki import certs, keys
from istio_agent.protos import typeurls
from istio_agent.xds import upstream
from istio_agent.xds.options import XdsProxyHooks, XdsProxyOptions
from istio_agent.xds.upstream import (
    UpstreamError,
    UpstreamSettings,
    channel_options,
    root_certificates,
)


def _token(workdir: Path, text: str) -> None:
    path = workdir / "var/run/secrets/tokens/istio-token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_metadata_reads_the_token_on_every_call(tmp_path: Path) -> None:
    def call_metadata(settings: UpstreamSettings) -> list[tuple[str, str]]:
        return asyncio.run(upstream.call_metadata(settings))

    settings = UpstreamSettings("localhost:15012", workdir=tmp_path, cluster_id="c1", headers=(("x-a", "1"),))
    assert call_metadata(settings) == [("clusterid", "c1"), ("x-a", "1")]
    _token(tmp_path, "tok-1\n")
    assert call_metadata(settings)[-1] == ("authorization", "Bearer tok-1")
    _token(tmp_path, "tok-2")
    assert call_metadata(settings)[-1] == ("authorization", "Bearer tok-2")
    no_auth = UpstreamSettings("localhost:15012", workdir=tmp_path, send_token=False)
    assert all(key != "authorization" for key, _ in call_metadata(no_auth))


def test_server_name_rules() -> None:
    def override(settings: UpstreamSettings) -> str | None:
        return dict(channel_options(settings)).get("grpc.ssl_target_name_override")

    assert override(UpstreamSettings("localhost:15012")) == "istiod.istio-system.svc"
    assert override(UpstreamSettings("istiod.istio-system.svc:15012")) is None
    assert override(UpstreamSettings("10.0.0.1:15012", istiod_san="istiod.example")) == "istiod.example"
    assert override(UpstreamSettings("localhost:15010")) is None
    assert UpstreamSettings("localhost:15010").plaintext
    assert not UpstreamSettings("localhost:15012").plaintext
    assert UpstreamSettings("localhost:15012", insecure=True).plaintext
    assert dict(channel_options(UpstreamSettings("x:1")))["grpc.max_receive_message_length"] == -1


def test_root_resolution(tmp_path: Path) -> None:
    with pytest.raises(UpstreamError, match=r"root-cert\.pem"):
        root_certificates(UpstreamSettings("localhost:15012", workdir=tmp_path))
    default = tmp_path / "var/run/secrets/istio/root-cert.pem"
    default.parent.mkdir(parents=True)
    root, custom = (certs.new_root_ca(keys.generate_key("ECDSA"), org, 1e9, 3600).cert_pem for org in "ab")
    default.write_bytes(root)
    assert root_certificates(UpstreamSettings("localhost:15012", workdir=tmp_path)) == root
    (tmp_path / "custom.pem").write_bytes(custom)
    assert root_certificates(UpstreamSettings("l:1", workdir=tmp_path, root_ca="custom.pem")) == custom
    system = root_certificates(UpstreamSettings("l:1", workdir=tmp_path, root_ca="SYSTEM"))
    assert system is None or b"BEGIN CERTIFICATE" in system


def test_options_from_agent_config(tmp_path: Path) -> None:
    environment = env.Environment(
        {
            "POD_NAME": "echo-1",
            "POD_NAMESPACE": "default",
            "ISTIO_META_CLUSTER_ID": "cluster-7",
            "PROXY_CONFIG": '{"discoveryAddress": "localhost:15012", "configPath": "./etc/istio/proxy"}',
            "XDS_HEADER_X-Tenant": "blue",
            "XDS_ROOT_CA": "SYSTEM",
            "ISTIOD_SAN": "istiod.example",
            "ISTIO_META_DNS_CAPTURE": "true",
            "PROXY_CONFIG_XDS_AGENT": "true",
        }
    )
    config = load_agent_config(environment, tmp_path)
    options = xds_options(config)
    assert options.socket_path == tmp_path / "etc/istio/proxy/XDS"
    up = options.upstream
    assert (up.address, up.cluster_id, up.root_ca, up.istiod_san) == (
        "localhost:15012", "cluster-7", "SYSTEM", "istiod.example"
    )
    assert up.headers == (("x-tenant", "blue"),)
    assert up.workdir == tmp_path and up.send_token
    assert options.dns_enabled and options.pcds_enabled


def test_consumed_types_follow_options(tmp_path: Path) -> None:
    from istio_agent.xds.proxy import XdsProxy

    up = UpstreamSettings("localhost:15010")
    hooks = XdsProxyHooks(on_name_table=lambda t: None, on_trust_bundle=lambda b: None)
    both = XdsProxy(XdsProxyOptions(tmp_path / "XDS", up, dns_enabled=True, pcds_enabled=True), hooks)
    assert both.consumed == {typeurls.NAME_TABLE, typeurls.PROXY_CONFIG}
    no_hooks = XdsProxy(XdsProxyOptions(tmp_path / "XDS", up, dns_enabled=True, pcds_enabled=True))
    assert no_hooks.consumed == frozenset(), "no handler: consumed types are dropped as upstream does"
    no_dns = XdsProxy(XdsProxyOptions(tmp_path / "XDS", up, dns_enabled=False), hooks)
    assert no_dns.consumed == frozenset()
