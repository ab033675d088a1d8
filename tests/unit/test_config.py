"""Configuration: env registry parsing, ProxyConfig layering and errors, node id and metadata."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import AgentFlags, HostFacts, resolve_agent_options
from istio_agent.config import env
from istio_agent.config.durations import format_duration, parse_duration
from istio_agent.config.errors import ConfigError
from istio_agent.config.node import instance_ips, node_id
from istio_agent.config.proxyconfig import build_proxy_config, parse_annotations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86400.0), ("1h30m", 5400.0), ("20s", 20.0), ("500ms", 0.5), ("0", 0.0), ("1.5s", 1.5), ("2m0.5s", 120.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "10", "5x", "s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(45.0) == "45s"
    assert format_duration(0.5) == "0.5s"


def test_registry_declares_each_variable_once_with_description() -> None:
    assert env.REGISTRY["SECRET_TTL"].default == 86400.0
    assert env.REGISTRY["TRUST_DOMAIN"].default == "cluster.local"
    assert env.REGISTRY["DNS_PROXY_ADDR"].default == "localhost:15053"
    for var in env.REGISTRY.values():
        assert var.description, var.name


def test_environment_parses_and_names_bad_values() -> None:
    e = env.Environment({"SECRET_TTL": "20s", "DISABLE_ENVOY": "true", "WORKLOAD_RSA_KEY_SIZE": "4096"})
    assert e.get(env.SECRET_TTL) == 20.0
    assert e.get(env.DISABLE_ENVOY) is True
    assert e.get(env.WORKLOAD_RSA_KEY_SIZE) == 4096
    assert e.get(env.SECRET_GRACE_PERIOD_RATIO) == 0.5
    with pytest.raises(ConfigError, match=r"SECRET_TTL='soon'"):
        env.Environment({"SECRET_TTL": "soon"}).get(env.SECRET_TTL)
    with pytest.raises(ConfigError, match="DISABLE_ENVOY"):
        env.Environment({"DISABLE_ENVOY": "maybe"}).get(env.DISABLE_ENVOY)


def test_defaults() -> None:
    config = build_proxy_config(None, "", {})
    assert config.config_path == "./etc/istio/proxy"
    assert config.binary_path == "/usr/local/bin/envoy"
    assert config.drain_duration == 45.0
    assert config.termination_drain_duration == 5.0
    assert config.proxy_admin_port == 15000
    assert config.status_port == 15020
    assert config.discovery_address == "istiod.istio-system.svc:15012"


def test_layering_mesh_then_env_then_annotation() -> None:
    mesh = """
defaultConfig:
  discoveryAddress: mesh:15012
  drainDuration: 10s
  tracing: {zipkin: {address: z:9411}}
  proxyMetadata: {A: mesh, B: mesh}
"""
    env_layer = '{"discoveryAddress": "env:15012", "tracing": {"sampling": 5}, "proxyMetadata": {"B": "env"}}'
    annotations = {"proxy.istio.io/config": "drainDuration: 1m\nproxyMetadata:\n  C: pod\n"}
    config = build_proxy_config(mesh, env_layer, annotations)
    assert config.discovery_address == "env:15012"
    assert config.drain_duration == 60.0
    # A later layer replaces a whole field; no deep merge of tracing.
    assert config.get("tracing") == {"sampling": 5}
    # proxyMetadata merges key by key.
    assert config.proxy_metadata == {"A": "mesh", "B": "env", "C": "pod"}


def test_snake_case_fields_accepted() -> None:
    config = build_proxy_config(None, '{"discovery_address": "x:15010"}', {})
    assert config.discovery_address == "x:15010"


@pytest.mark.parametrize(
    ("layer", "needle"),
    [
        ('{"drainDuration": "forever"}', "drainDuration"),
        ('{"statusPort": 70000}', "statusPort"),
        ('{"proxyAdminPort": "abc"}', "proxyAdminPort"),
        ('{"interceptionMode": "MAGIC"}', "MAGIC"),
        ('{"holdApplicationUntilProxyStarts": "perhaps"}', "holdApplicationUntilProxyStarts"),
        ("discoveryAddress: [unclosed", "PROXY_CONFIG"),
        ("[1, 2]", "expected an object"),
    ],
)
def test_malformed_proxy_config_names_field_and_value(layer: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_proxy_config(None, layer, {})
    assert needle in str(info.value)
    assert "PROXY_CONFIG" in str(info.value)


def test_malformed_mesh_file_names_field() -> None:
    with pytest.raises(ConfigError, match=r"mesh config defaultConfig: field terminationDrainDuration"):
        build_proxy_config("defaultConfig:\n  terminationDrainDuration: nope\n", "", {})


def test_unknown_fields_ignored_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        config = build_proxy_config(None, '{"noSuchField": 1, "statusPort": 15021}', {})
    assert config.status_port == 15021
    assert "noSuchField" in caplog.text


def test_parse_annotations_file() -> None:
    text = 'proxy.istio.io/config="discoveryAddress: a:1\\nconcurrency: 3\\n"\nfoo="bar"\n'
    assert parse_annotations(text) == {"proxy.istio.io/config": "discoveryAddress: a:1\nconcurrency: 3\n", "foo": "bar"}


def test_node_id_and_ips() -> None:
    assert node_id("sidecar", "10.1.1.0", "v0", "default", "default.svc.cluster.local") == (
        "sidecar~10.1.1.0~v0.default~default.svc.cluster.local"
    )
    # No address on any interface: 127.0.0.1 and ::1, as upstream's initProxy.
    assert instance_ips(env.Environment({})) == ["127.0.0.1", "::1"]
    e = env.Environment({"INSTANCE_IP": "10.0.0.2", "INSTANCE_IPS": "10.0.0.2,fd00::2,bogus"})
    assert instance_ips(e) == ["10.0.0.2", "fd00::2", "127.0.0.1", "::1"]
    waypoint = node_id("waypoint", "1.1.1.1", "w", "ns", "ns.svc.cluster.local")
    assert waypoint == "waypoint~1.1.1.1~w.ns~ns.svc.cluster.local"
    with pytest.raises(ConfigError, match="supported types: sidecar, router, waypoint"):
        node_id("ztunnel", "1.1.1.1", "a", "b", "c")
    with pytest.raises(ConfigError, match="invalid proxy type 'gateway'"):
        node_id("gateway", "1.1.1.1", "a", "b", "c")


def test_instance_ips_from_the_host_interfaces_as_upstream() -> None:
    interfaces = [("eth0", "10.244.0.5"), ("eth0", "fd00::5"), ("eth0", "fe80::1"), ("net1", "192.168.9.9"),
                  ("eth0", "10.244.0.5")]
    pod = env.Environment({"INSTANCE_IP": "10.244.0.5"})
    assert instance_ips(pod, interfaces) == ["10.244.0.5", "fd00::5", "192.168.9.9"], "link-local skipped, deduped"
    assert instance_ips(pod, interfaces, excluded_interfaces=["net1"]) == ["10.244.0.5", "fd00::5"]
    assert instance_ips(env.Environment({}), [("eth0", "::ffff:10.1.1.1")]) == ["10.1.1.1"], "IPv4-mapped unwrapped"
    assert instance_ips(env.Environment({"INSTANCE_IP": "not-an-ip"}), [("eth0", "10.0.0.9")]) == ["10.0.0.9"]


def test_load_agent_config_from_pod_files(tmp_path: Path) -> None:
    (tmp_path / "etc/istio/pod").mkdir(parents=True)
    (tmp_path / "etc/istio/pod/labels").write_text('app="echo"\npod-template-hash="abc"\n')
    (tmp_path / "etc/istio/pod/annotations").write_text(
        'proxy.istio.io/config="proxyMetadata:\\n  ISTIO_META_DNS_CAPTURE: \\"true\\"\\n"\n'
    )
    (tmp_path / "etc/istio/config").mkdir(parents=True)
    (tmp_path / "etc/istio/config/mesh").write_text("defaultConfig:\n  discoveryAddress: localhost:15012\n")
    environment = env.Environment(
        {"POD_NAME": "echo-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "echo", "INSTANCE_IP": "10.0.0.5",
         "ISTIO_META_FOO": "bar", "ISTIO_METAJSON_EXTRA": '{"K": {"x": 1}}'}
    )
    config = load_agent_config(environment, tmp_path)
    assert config.identity.id == "sidecar~10.0.0.5~echo-1.default~default.svc.cluster.local"
    assert config.identity.spiffe_id == "spiffe://cluster.local/ns/default/sa/echo"
    assert config.proxy_config.discovery_address == "localhost:15012"
    # proxyMetadata fills the environment, so DNS capture turns on.
    assert config.environment.get(env.ISTIO_META_DNS_CAPTURE) is True
    metadata = resolve_agent_options(config, AgentFlags(), HostFacts()).metadata
    assert metadata["FOO"] == "bar"
    assert metadata["K"] == {"x": 1}
    assert metadata["LABELS"] == {"app": "echo"}
    assert metadata["DNS_PROXY_ADDR"] == "localhost:15053"


def test_proxy_metadata_never_overrides_container_env(tmp_path: Path) -> None:
    environment = env.Environment({"PROXY_CONFIG": '{"proxyMetadata": {"TRUST_DOMAIN": "other"}}',
                                   "TRUST_DOMAIN": "mine"})
    assert load_agent_config(environment, tmp_path).identity.trust_domain == "mine"
    environment = env.Environment({"PROXY_CONFIG": '{"proxyMetadata": {"TRUST_DOMAIN": "other"}}'})
    assert load_agent_config(environment, tmp_path).identity.trust_domain == "other"


def test_flags_and_annotation_overrides(tmp_path: Path) -> None:
    (tmp_path / "etc/istio/pod").mkdir(parents=True)
    (tmp_path / "etc/istio/pod/annotations").write_text(
        'sidecar.istio.io/discoveryAddress="other:15012"\nstatus.sidecar.istio.io/port="15030"\n'
    )
    config = load_agent_config(env.Environment({}), tmp_path, concurrency=4)
    assert config.proxy_config.discovery_address == "other:15012"
    assert config.proxy_config.status_port == 15030
    assert config.proxy_config.concurrency == 4
    # Upstream's default ProxyConfig sets no concurrency, for any proxy type.
    assert load_agent_config(env.Environment({}), tmp_path / "x", proxy_type="router").proxy_config.concurrency is None
    assert load_agent_config(env.Environment({}), tmp_path / "x").proxy_config.concurrency is None


def test_service_cluster_and_tracing_service_name_are_one_oneof(tmp_path: Path) -> None:
    """A later layer's tracingServiceName clears serviceCluster, and --serviceCluster then fills nothing."""
    annotations = tmp_path / "etc/istio/pod/annotations"
    annotations.parent.mkdir(parents=True)
    annotations.write_text('proxy.istio.io/config="tracingServiceName: CANONICAL_NAME_ONLY"\n')
    environment = env.Environment({"PROXY_CONFIG": '{"serviceCluster": "from-env"}'})
    config = load_agent_config(environment, tmp_path, service_cluster="flag").proxy_config
    assert config.get("tracingServiceName") == "CANONICAL_NAME_ONLY"
    assert "serviceCluster" not in config.values
    assert load_agent_config(env.Environment({}), tmp_path / "none", service_cluster="flag").proxy_config.get(
        "serviceCluster") == "istio-proxy"
    empty = env.Environment({"PROXY_CONFIG": '{"serviceCluster": ""}'})
    assert load_agent_config(empty, tmp_path / "none", service_cluster="flag").proxy_config.get(
        "serviceCluster") == "flag"


def test_statsd_address_is_resolved_at_start_or_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Upstream resolves statsdUdpAddress once (Envoy's statsd sink takes no host name), preferring IPv4."""
    names = {"statsd.istio-system": ["fd00::7", "10.0.0.7"], "v6only": ["fd00::8"]}

    def lookup(host: str) -> list[str]:
        if host not in names:
            raise OSError(f"no such host {host}")
        return names[host]

    def statsd(address: str) -> object:
        environment = env.Environment({"PROXY_CONFIG": f'{{"statsdUdpAddress": "{address}"}}'})
        return load_agent_config(environment, tmp_path, lookup=lookup).proxy_config.get("statsdUdpAddress")

    assert statsd("statsd.istio-system:9125") == "10.0.0.7:9125"
    assert statsd("v6only:9125") == "[fd00::8]:9125"
    assert statsd("10.1.1.1:9125") == "10.1.1.1:9125"
    assert statsd("nowhere:9125") == ""
    assert statsd("no-port") == ""
    assert "resolve StatsdUdpAddress failed" in caplog.text


def test_the_mesh_files_default_config_is_validated_before_later_layers_replace_it(tmp_path: Path) -> None:
    """As upstream (its mesh config is validated when read): an invalid defaultConfig in the mesh file stops the
    agent even when PROXY_CONFIG replaces the field; an invalid later layer is still caught at the end."""
    mesh = tmp_path / "etc/istio/config/mesh"
    mesh.parent.mkdir(parents=True)
    mesh.write_text("defaultConfig:\n  drainDuration: 0.5s\n")
    with pytest.raises(ConfigError, match=r"mesh config .*drainDuration.*seconds precision"):
        load_agent_config(env.Environment({"PROXY_CONFIG": "drainDuration: 7s"}), tmp_path)
    mesh.write_text("defaultConfig:\n  drainDuration: 7s\n")
    assert load_agent_config(env.Environment({}), tmp_path).proxy_config.get("drainDuration") == 7.0
    with pytest.raises(ConfigError, match=r"drainDuration"):
        load_agent_config(env.Environment({"PROXY_CONFIG": "drainDuration: 0.5s"}), tmp_path)
