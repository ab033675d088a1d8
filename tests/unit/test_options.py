"""The options resolver: each cross-cutting rule once, each component's options from the same inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from istio_agent.agent.loader import load_agent_config
from istio_agent.agent.options import (
    AgentFlags,
    AgentOptions,
    HostFacts,
    metrics_options,
    resolve_agent_options,
)
from istio_agent.config import env
from istio_agent.config.errors import ConfigError
from istio_agent.status.merged_metrics.merge import ENVOY_PROMETHEUS_PORT, ScrapeTarget

POD = {"POD_NAME": "app-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "app", "INSTANCE_IP": "10.1.1.5"}


def resolve(tmp_path: Path, flags: AgentFlags | None = None, host: HostFacts | None = None,
            **environ: str) -> AgentOptions:
    """Options for a pod with POD's identity and `environ` on top."""
    flags = flags or AgentFlags()
    config = load_agent_config(env.Environment({**POD, **environ}), tmp_path, proxy_type=flags.proxy_type,
                               concurrency=flags.concurrency)
    return resolve_agent_options(config, flags, host or HostFacts())


def test_a_sidecar_by_default(tmp_path: Path) -> None:
    options = resolve(tmp_path)
    assert options.node.id == "sidecar~10.1.1.5~app-1.default~default.svc.cluster.local"
    assert options.dns is None and not options.xds.dns_enabled
    assert options.envoy is not None and options.security.run_sds_server
    assert options.status is not None and options.status.envoy_enabled and not options.status.dns_enabled
    assert options.envoy.drain_inbound_only
    assert options.envoy.launch.concurrency is None, "no default: Envoy's own (a thread per core), as upstream"
    assert options.envoy.launch.skip_deprecated_logs and options.envoy.launch.config_file == ""
    assert options.grpc_bootstrap is not None  # upstream writes it whenever GRPC_XDS_BOOTSTRAP is set (default)
    assert options.grpc_bootstrap.path == tmp_path / "etc/istio/proxy/grpc-bootstrap.json"
    assert options.xds.socket_path == tmp_path / "etc/istio/proxy/XDS"
    assert options.metadata["INSTANCE_IPS"] == "10.1.1.5,127.0.0.1,::1", "no host interfaces given: the loopbacks"


@pytest.mark.parametrize("variable", ["ISTIO_META_DNS_CAPTURE", "ISTIO_META_ENABLE_DNS_SERVER"])
def test_dns_is_on_everywhere_it_matters_or_nowhere(tmp_path: Path, variable: str) -> None:
    options = resolve(tmp_path, None, None, **{variable: "true"})
    assert options.dns is not None and options.dns.addr == "localhost:15053"
    assert options.xds.dns_enabled, "the XDS proxy consumes NDS for the DNS proxy"
    assert options.status is not None and options.status.dns_enabled, "readiness waits for a NameTable"
    assert options.metadata["DNS_PROXY_ADDR"] == "localhost:15053"
    assert (options.dns.namespace, options.dns.domain) == ("default", "default.svc.cluster.local")


def test_dns_forwarding_settings_and_the_port_53_rule(tmp_path: Path) -> None:
    options = resolve(tmp_path, ISTIO_META_DNS_CAPTURE="true", DNS_FORWARD_PARALLEL="true", DNS_FORWARD_TIMEOUT="2s")
    assert options.dns is not None and options.dns.forward_parallel and options.dns.upstream_timeout == 2.0
    as_root = resolve(tmp_path, host=HostFacts(euid=0, alt_resolv_conf_exists=True), ISTIO_META_DNS_CAPTURE="true",
                      DNS_PROXY_ADDR="127.0.0.1:53")
    assert as_root.dns is not None and as_root.dns.respond_before_sync
    assert as_root.dns.resolv_conf == "/var/lib/istio/resolv.conf"
    not_root = resolve(tmp_path, host=HostFacts(euid=1337), ISTIO_META_DNS_CAPTURE="true",
                       DNS_PROXY_ADDR="127.0.0.1:53")
    assert not_root.dns is not None and not_root.dns.addr == "localhost:15053"


def test_dns_proxy_addr_reaches_metadata_when_set_even_without_dns(tmp_path: Path) -> None:
    assert resolve(tmp_path, DNS_PROXY_ADDR="127.0.0.1:5353").metadata["DNS_PROXY_ADDR"] == "127.0.0.1:5353"
    assert "DNS_PROXY_ADDR" not in resolve(tmp_path).metadata


def test_no_envoy_means_no_sds_server_no_envoy_and_gRPC_readiness(tmp_path: Path) -> None:
    options = resolve(tmp_path, DISABLE_ENVOY="true", ISTIO_META_DNS_CAPTURE="true")
    assert options.envoy is None and not options.security.run_sds_server
    assert options.status is not None and not options.status.envoy_enabled
    assert not options.status.dns_enabled, "without Envoy readiness does not wait for a NameTable"
    assert options.status.metrics.envoy_port is None, "no Envoy stats to merge"


def test_one_node_metadata_for_both_bootstraps(tmp_path: Path) -> None:
    """One metadata computation: Envoy's bootstrap carries it whole, the gRPC bootstrap its typed view (the same
    map unless a typed field emptied a raw key: `MetadataLayers`)."""
    options = resolve(tmp_path, AgentFlags(outlier_log_path="/dev/stdout", sts_port=15463))
    assert options.envoy is not None and options.grpc_bootstrap is not None
    assert options.envoy.bootstrap.metadata is options.metadata
    assert options.grpc_bootstrap.content.metadata == options.metadata
    assert options.metadata["OUTLIER_LOG_PATH"] == "/dev/stdout" and options.metadata["STS_PORT"] == "15463"
    assert options.metadata["PILOT_SAN"] == ["istiod.istio-system.svc"]


def test_client_certificate_for_istiod(tmp_path: Path) -> None:
    def pair(**environ: str) -> tuple[str, str]:
        upstream = resolve(tmp_path, None, None, **environ).xds.upstream
        return upstream.client_key, upstream.client_chain

    assert pair() == ("", "")
    assert pair(PROV_CERT="/etc/prov") == ("/etc/prov/key.pem", "/etc/prov/cert-chain.pem")
    mounted = ('{"proxyMetadata": {"ISTIO_META_TLS_CLIENT_KEY": "/certs/k.pem", '
               '"ISTIO_META_TLS_CLIENT_CERT_CHAIN": "/certs/c.pem"}}')
    assert pair(FILE_MOUNTED_CERTS="true", PROXY_CONFIG=mounted) == ("/certs/k.pem", "/certs/c.pem")


def test_roots_for_the_ca_and_for_istiod_as_upstream(tmp_path: Path) -> None:
    def roots(host: HostFacts | None = None, **environ: str) -> tuple[str, str]:
        options = resolve(tmp_path, None, host, **environ)
        return options.security.ca_root_ca, options.xds.upstream.root_ca

    default = "./var/run/secrets/istio/root-cert.pem"
    assert roots() == (default, default)
    assert roots(CA_ROOT_CA="SYSTEM", XDS_ROOT_CA="/x.pem") == ("SYSTEM", "/x.pem"), "no fallback between the two"
    assert roots(HostFacts(mounted_root_cert=True)) == (default, "./etc/certs/root-cert.pem")
    assert roots(PILOT_CERT_PROVIDER="custom") == ("./etc/certs/root-cert.pem", default)
    assert roots(PROV_CERT="/prov") == ("/prov/root-cert.pem", "/prov/root-cert.pem")
    mounted = '{"proxyMetadata": {"ISTIO_META_TLS_CLIENT_ROOT_CERT": "/certs/root.pem"}}'
    assert roots(FILE_MOUNTED_CERTS="true", PROXY_CONFIG=mounted)[1] == "/certs/root.pem"
    with pytest.raises(ConfigError, match=r"PILOT_CERT_PROVIDER='none'.*XDS_ROOT_CA"):
        resolve(tmp_path, PILOT_CERT_PROVIDER="none")
    with pytest.raises(ConfigError, match=r"PILOT_CERT_PROVIDER='none'.*CA_ROOT_CA"):
        resolve(tmp_path, PILOT_CERT_PROVIDER="none", XDS_ROOT_CA="/xds.pem")
    assert roots(PILOT_CERT_PROVIDER="none", CA_ROOT_CA="/ca.pem", XDS_ROOT_CA="/xds.pem") == ("/ca.pem", "/xds.pem")
    # No CA client, no CA root wanted (upstream looks for it only when it makes one, for TLS): mounted workload
    # certificates, another SDS server, or the plaintext :15010.
    for host, extra in ((HostFacts(workload_credentials=True), {}), (HostFacts(workload_sds_socket_healthy=True), {}),
                        (None, {"FILE_MOUNTED_CERTS": "true"}), (None, {"CA_ADDR": "istiod.istio-system.svc:15010"})):
        assert roots(host, PILOT_CERT_PROVIDER="none", XDS_ROOT_CA="/xds.pem", **extra)[0] == "", (host, extra)


def test_workload_key_format_file_modes_debounce_and_keepalive(tmp_path: Path) -> None:
    default = resolve(tmp_path)
    assert (default.security.pkcs8_keys, default.security.output_file_mode) == (False, 0o600)
    assert default.security.file_debounce == 0.1
    assert (default.xds.upstream.keepalive_interval, default.xds.upstream.keepalive_timeout) == (30.0, 10.0)
    tuned = resolve(tmp_path, PKCS8_KEY="true", KUBERNETES_SERVICE_HOST="10.96.0.1", FILE_DEBOUNCE_DURATION="250ms",
                    GRPC_KEEPALIVE_INTERVAL="5s", GRPC_KEEPALIVE_TIMEOUT="2s")
    assert (tuned.security.pkcs8_keys, tuned.security.output_file_mode) == (True, 0o644)
    assert tuned.security.file_debounce == 0.25
    assert (tuned.security.keepalive_interval, tuned.security.keepalive_timeout) == (5.0, 2.0)
    assert (tuned.xds.upstream.keepalive_interval, tuned.xds.upstream.keepalive_timeout) == (5.0, 2.0)


def test_concurrency_from_proxy_config_then_the_cpu_limit(tmp_path: Path) -> None:
    def launch_concurrency(flags: AgentFlags | None = None, **environ: str) -> int | None:
        envoy = resolve(tmp_path, flags, None, **environ).envoy
        assert envoy is not None
        return envoy.launch.concurrency

    assert launch_concurrency(ISTIO_CPU_LIMIT="3") == 3
    assert launch_concurrency(ISTIO_CPU_LIMIT="3", PROXY_CONFIG='{"concurrency": 1}') == 1
    assert launch_concurrency(ISTIO_CPU_LIMIT="3", PROXY_CONFIG='{"concurrency": 0}') == 0, "0 is configured"
    assert launch_concurrency(AgentFlags(concurrency=5), ISTIO_CPU_LIMIT="3") == 5


def test_probes_go_to_localhost_with_the_legacy_switch(tmp_path: Path) -> None:
    assert resolve(tmp_path).status is not None
    assert resolve(tmp_path).status.probes.pod_ip == "10.1.1.5"  # type: ignore[union-attr]
    legacy = resolve(tmp_path, REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION="true").status
    assert legacy is not None and legacy.probes.pod_ip == "localhost"


def test_waypoints_and_refused_types(tmp_path: Path) -> None:
    waypoint = resolve(tmp_path, AgentFlags(proxy_type="waypoint"))
    assert waypoint.node.id.startswith("waypoint~10.1.1.5~")
    assert waypoint.envoy is not None and not waypoint.envoy.drain_inbound_only
    assert waypoint.status is not None and waypoint.status.metrics.app_targets == ()
    for other in ("ztunnel", "agentgateway"):
        with pytest.raises(ConfigError, match="supported types: sidecar, router, waypoint"):
            resolve(tmp_path, AgentFlags(proxy_type=other))


def test_envoy_launch_flags_and_drain(tmp_path: Path) -> None:
    flags = AgentFlags(proxy_type="router", proxy_log_level="info,misc:error", proxy_component_log_level="rbac:debug",
                       template_file="/t.json")
    options = resolve(tmp_path, flags, ISTIO_ENVOY_ENABLE_CORE_DUMP="true", EXIT_ON_ZERO_ACTIVE_CONNECTIONS="true",
                      MINIMUM_DRAIN_DURATION="7s", ISTIO_BOOTSTRAP_OVERRIDE="/o.yaml", HOST_IP="10.0.0.9",
                      ISTIO_AGENT_ENVOY_UID="1337")
    envoy = options.envoy
    assert envoy is not None
    assert (envoy.launch.log_level, envoy.launch.component_log_level) == ("info,misc:error", "rbac:debug")
    assert envoy.launch.enable_core_dump and envoy.launch.concurrency is None, "gateways use every core"
    assert not envoy.drain_inbound_only
    assert envoy.drain.exit_on_zero_active_connections and envoy.drain.minimum_drain_duration == 7.0
    assert (envoy.source.template_file, envoy.source.override_path, envoy.source.host_ip) == (
        "/t.json", "/o.yaml", "10.0.0.9")
    assert envoy.run_as == (1337, 1337)
    assert envoy.bootstrap.host_ip == "10.0.0.9"


def test_bootstrap_switches_from_the_environment(tmp_path: Path) -> None:
    options = resolve(tmp_path, ISTIO_DELTA_XDS="false", ISTIO_DUAL_STACK="true", COMPLIANCE_POLICY="fips-140-2",
                      HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED="false")
    assert options.envoy is not None
    bootstrap = options.envoy.bootstrap
    assert (bootstrap.delta_xds, bootstrap.dual_stack, bootstrap.compliance_policy, bootstrap.strip_fragment) == (
        False, True, "fips-140-2", False)


def test_merged_metrics_options(tmp_path: Path) -> None:
    annotations = '{"scrape":"true","port":"9090","path":"/m"}'

    def metrics(proxy_type: str = "sidecar", **environ: str):  # type: ignore[no-untyped-def]
        config = load_agent_config(env.Environment({**POD, **environ}), tmp_path, proxy_type=proxy_type)
        return metrics_options(config)

    options = metrics(ISTIO_PROMETHEUS_ANNOTATIONS=annotations)
    assert options.envoy_port == ENVOY_PROMETHEUS_PORT and options.app_targets == (ScrapeTarget(9090, "/m"),)
    assert metrics(PILOT_AGENT_MERGE_ENVOY_STATS="false").envoy_port is None
    assert metrics(DISABLE_ENVOY="true").envoy_port is None
    assert metrics("router", ISTIO_PROMETHEUS_ANNOTATIONS=annotations).app_targets == (), "no app scraping on gateways"
    with pytest.raises(ConfigError, match="15090 is reserved"):
        metrics(ISTIO_PROMETHEUS_ANNOTATIONS='{"port":"15090"}')


def test_status_port_zero_means_no_status_server_but_probes_are_still_checked(tmp_path: Path) -> None:
    """Upstream refuses statusPort 0 in ProxyConfig; the status annotation, applied after its check, may say 0."""
    with pytest.raises(ConfigError, match=r"invalid statusPort: port number 0 must be in the range 1\.\.65535"):
        resolve(tmp_path, PROXY_CONFIG='{"statusPort": 0}')
    annotations = tmp_path / "etc/istio/pod/annotations"
    annotations.parent.mkdir(parents=True)
    annotations.write_text('status.sidecar.istio.io/port="0"\n')
    assert resolve(tmp_path).status is None
    with pytest.raises(ConfigError, match="ISTIO_KUBE_APP_PROBERS"):
        resolve(tmp_path, ISTIO_KUBE_APP_PROBERS="{not json")


@pytest.fixture
def only_accepted(monkeypatch: pytest.MonkeyPatch) -> str:
    """A variable only accepted (every one upstream's agent reads does something here now): one of the test's."""
    from istio_agent.config import envvar
    from istio_agent.config.settings import ACCEPTED, EnvVar, text

    var = EnvVar("ONLY_ACCEPTED_HERE", "", "A variable of the test's.", text, "string", ACCEPTED, "why it does nothing")
    monkeypatch.setitem(envvar.REGISTRY, var.name, var)
    return var.name


def test_variables_without_effect_are_named(tmp_path: Path, only_accepted: str) -> None:
    variables = {"XDS_AUTH_PROVIDER": "gcp", "CA_PROVIDER": "Citadel", "ENVOY_STATUS_PORT": "15021",
                 "WASM_INSECURE_REGISTRIES": "localhost:5000", only_accepted: "x"}
    options = resolve(tmp_path, **variables)  # type: ignore[arg-type]
    assert [var.name for var in options.without_effect] == [only_accepted], (
        "set to their defaults, CA_PROVIDER and ENVOY_STATUS_PORT change nothing anyway; the Wasm variables and "
        "XDS_AUTH_PROVIDER (which upstream reads and leaves unused) are honoured")
    assert options.without_effect[0].note == "why it does nothing"


def test_proxy_metadata_variables_count_as_set(tmp_path: Path, only_accepted: str) -> None:
    options = resolve(tmp_path, PROXY_CONFIG='{"proxyMetadata": {"ISTIO_META_DNS_CAPTURE": "true", '
                                             f'"{only_accepted}": "gcp"}}}}')
    assert options.dns is not None
    assert [var.name for var in options.without_effect] == [only_accepted]


def test_a_fips_policy_limits_grpcs_ciphers_for_envoy_and_the_agent(tmp_path: Path) -> None:
    plain = resolve(tmp_path)
    assert plain.grpc_cipher_suites == "" and plain.envoy is not None and plain.envoy.extra_env == ()
    fips = resolve(tmp_path, COMPLIANCE_POLICY="fips-140-2")
    assert fips.envoy is not None
    assert dict(fips.envoy.extra_env)["GRPC_SSL_CIPHER_SUITES"] == fips.grpc_cipher_suites
    assert fips.grpc_cipher_suites.split(":") == ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
                                                  "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384"]


def test_status_switches_and_mutually_exclusive_client_certificates(tmp_path: Path) -> None:
    tuned = resolve(tmp_path, METRICS_LOCALHOST_ACCESS_ONLY="true", ENABLE_PROBE_KEEPALIVE_CONNECTIONS="true")
    assert tuned.status is not None
    assert tuned.status.metrics.localhost_only and tuned.status.probes.keepalive
    plain = resolve(tmp_path).status
    assert plain is not None and not plain.metrics.localhost_only and not plain.probes.keepalive
    assert plain.metrics.created_series
    quiet = resolve(tmp_path, PROMETHEUS_DISABLE_CREATED_SERIES="true").status
    assert quiet is not None and not quiet.metrics.created_series
    with pytest.raises(ConfigError, match="PROV_CERT and FILE_MOUNTED_CERTS"):
        resolve(tmp_path, PROV_CERT="/prov", FILE_MOUNTED_CERTS="true")
    with pytest.raises(ConfigError, match="CA_PROVIDER='GoogleCA'"):
        resolve(tmp_path, CA_PROVIDER="GoogleCA")


def test_another_sds_server_on_the_workload_socket_means_files_only(tmp_path: Path) -> None:
    """Upstream's ServeOnlyFiles: no CA, our server on the files socket, file-credential in metadata."""
    options = resolve(tmp_path, None, HostFacts(workload_sds_socket_healthy=True, credential_socket_healthy=True))
    assert options.security.serve_only_files
    assert options.security.sds_listen_path == tmp_path / "var/run/secrets/credential-uds/files-socket"
    assert options.metadata["file-credential"] == "true" and options.metadata["credential"] == "true"
    plain = resolve(tmp_path)
    assert not plain.security.serve_only_files and "file-credential" not in plain.metadata
    assert plain.security.sds_listen_path == tmp_path / "var/run/secrets/workload-spiffe-uds/socket"


def test_a_non_default_workload_socket_needs_a_server_there(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"WORKLOAD_IDENTITY_SOCKET_FILE='spire.sock': no SDS server answers"):
        resolve(tmp_path, WORKLOAD_IDENTITY_SOCKET_FILE="spire.sock")
    options = resolve(tmp_path, None, HostFacts(workload_sds_socket_healthy=True),
                      WORKLOAD_IDENTITY_SOCKET_FILE="spire.sock")
    assert options.security.sds_socket_path.name == "spire.sock" and options.security.serve_only_files
    assert options.metadata["WORKLOAD_IDENTITY_SOCKET_FILE"] == "spire.sock"


def test_xds_server_limits_follow_istiods_grpc_variables(tmp_path: Path) -> None:
    default = resolve(tmp_path).xds
    assert (default.max_receive_message_size, default.max_concurrent_streams) == (4 * 1024 * 1024, 100000)
    tuned = resolve(tmp_path, ISTIO_GPRC_MAXRECVMSGSIZE="1048576", ISTIO_GPRC_MAXSTREAMS="50").xds
    assert (tuned.max_receive_message_size, tuned.max_concurrent_streams) == (1048576, 50)
    with pytest.raises(ConfigError, match="ISTIO_GPRC_MAXRECVMSGSIZE=0: must be positive"):
        resolve(tmp_path, ISTIO_GPRC_MAXRECVMSGSIZE="0")


def test_wasm_variables_reach_the_wasm_cache_options(tmp_path: Path) -> None:
    options = resolve(tmp_path, WASM_INSECURE_REGISTRIES="localhost:5000, *",
                      BLOCKED_CIDRS_IN_WASM_FETCH="10.0.0.0/8,x",
                      WASM_MODULE_EXPIRY="2h", WASM_PURGE_INTERVAL="10m", WASM_HTTP_REQUEST_TIMEOUT="3s",
                      WASM_HTTP_REQUEST_MAX_RETRIES="2", ISTIO_WASM_MAX_BINARY_SIZE_BYTES="1000")
    wasm = options.wasm
    assert wasm is not None and wasm.cache_dir == tmp_path / "var/lib/istio/data"
    assert wasm.insecure_registries == {"localhost:5000", "*"} and wasm.allow_insecure("any.io")
    assert [str(c) for c in wasm.blocked_cidrs] == ["10.0.0.0/8"]
    assert (wasm.module_expiry, wasm.purge_interval, wasm.http_request_timeout) == (7200, 600, 3)
    assert (wasm.http_request_max_retries, wasm.max_module_size) == (2, 1000)
    assert resolve(tmp_path, ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION="false").wasm is None


def test_istiod_san_names_the_ca_only_when_the_ca_is_the_discovery_address(tmp_path: Path) -> None:
    """Upstream's rule: ISTIOD_SAN is the CA's expected name when CA_ADDR is unset; a CA_ADDR is verified as written.
    The XDS connection to istiod takes ISTIOD_SAN either way."""
    default_ca = resolve(tmp_path, ISTIOD_SAN="istiod.example")
    assert default_ca.security.istiod_san == "istiod.example"
    own_ca = resolve(tmp_path, ISTIOD_SAN="istiod.example", CA_ADDR="10.0.0.9:15012")
    assert own_ca.security.istiod_san == "" and own_ca.security.ca_address == "10.0.0.9:15012"
    assert own_ca.xds.upstream.istiod_san == "istiod.example"


def test_upstream_flag_defaults_reach_envoy_and_the_status_server(tmp_path: Path) -> None:
    """`--proxyLogLevel` is upstream's `warning` (no component levels: Envoy gets `-l warning` alone), and
    `--profiling` (on by default) decides whether the status server serves /debug/pprof/."""
    options = resolve(tmp_path, AgentFlags())
    assert options.envoy is not None and options.status is not None
    assert (options.envoy.launch.log_level, options.envoy.launch.component_log_level) == ("warning", "")
    assert options.status.profiling
    off = resolve(tmp_path, AgentFlags(profiling=False))
    assert off.status is not None and not off.status.profiling
