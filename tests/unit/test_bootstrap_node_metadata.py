"""Node metadata as upstream's bootstrap writes it: typed fields over the raw ISTIO_META_* / METAJSON map."""

from __future__ import annotations

from typing import Any

from istio_agent.config import env
from istio_agent.config.node import MetadataOptions, node_metadata, node_metadata_layers


def meta(environ: dict[str, str], labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         ips: list[str] | None = None, proxy_config: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    options: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value for key, value in kwargs.items()}
    return node_metadata(MetadataOptions(
        env.Environment(environ), proxy_config or {"configPath": "/x"},
        instance_ips=tuple(ips if ips is not None else ["10.0.0.1"]), labels=labels or {},
        annotations=annotations or {}, **options,
    ))


def test_defaults_and_shape() -> None:
    got = meta({}, ips=["10.3.3.3", "10.4.4.4", "10.3.3.3"], pilot_san=["spiffe://a"], outlier_log_path="/dev/stdout",
               istio_version="binary-1.0", workload_identity_socket_file="test.sock")
    assert got == {
        "ENVOY_PROMETHEUS_PORT": 15090, "ENVOY_STATUS_PORT": 15021, "INSTANCE_IPS": "10.3.3.3,10.4.4.4",
        "ISTIO_VERSION": "binary-1.0", "METADATA_DISCOVERY": "false", "OUTLIER_LOG_PATH": "/dev/stdout",
        "PILOT_SAN": ["spiffe://a"], "PROXY_CONFIG": {"configPath": "/x"}, "WORKLOAD_IDENTITY_SOCKET_FILE": "test.sock",
    }


def test_raw_keys_and_metajson_merge_at_top_level() -> None:
    got = meta({
        "ISTIO_META_INTERCEPTION_MODE": "REDIRECT",
        "ISTIO_META_ISTIO_VERSION": "release-3.1",
        "ISTIO_METAJSON_ANNOTATIONS": '{"istio.io/x": "y"}',
        "ISTIO_METAJSON_LABELS": '{"app": "test", "istio-locality": "r.z.s"}',
        "POD_NAME": "p-1", "POD_NAMESPACE": "ns", "SERVICE_ACCOUNT": "sa",
    }, istio_version="binary-1.0")
    assert got["INTERCEPTION_MODE"] == "REDIRECT"
    assert got["ISTIO_VERSION"] == "release-3.1"  # the environment overrides the binary's version
    assert got["istio.io/x"] == "y" and got["app"] == "test"
    assert got["istio-locality"] == "r.z.s"  # the raw copy keeps dots
    assert got["LABELS"] == got["STATIC_LABELS"] == {"app": "test", "istio-locality": "r/z/s"}
    assert (got["NAME"], got["NAMESPACE"], got["SERVICE_ACCOUNT"]) == ("p-1", "ns", "sa")
    assert "ANNOTATIONS" not in got  # only the annotations file fills ANNOTATIONS


def test_pod_labels_file_extends_static_labels() -> None:
    got = meta({"ISTIO_METAJSON_LABELS": '{"app": "a", "istio-locality": "r.z"}'},
               labels={"version": "v1", "pod-template-hash": "abc"})
    assert got["LABELS"] == {"app": "a", "istio-locality": "r/z", "version": "v1"}
    assert got["STATIC_LABELS"] == {"app": "a", "istio-locality": "r.z"}


def test_empty_labels_json_and_annotations_file() -> None:
    got = meta({"ISTIO_METAJSON_LABELS": "{}"}, annotations={"a/b": "c"})
    assert "LABELS" not in got and "STATIC_LABELS" not in got
    assert got["ANNOTATIONS"] == {"a/b": "c"}


def test_typed_fields_win_over_raw() -> None:
    got = meta({"ISTIO_META_INSTANCE_IPS": "1.1.1.1", "ISTIO_META_DNS_CAPTURE": "1",
                "ISTIO_META_ENABLE_HBONE": "false", "ISTIO_META_CLUSTER_ID": "c1"})
    assert got["INSTANCE_IPS"] == "10.0.0.1"
    assert got["DNS_CAPTURE"] == "true"
    assert got["ENABLE_HBONE"] == "false"
    assert got["CLUSTER_ID"] == "c1"
    assert "DNS_PROXY_ADDR" not in got, "the resolver decides it (agent.options.metadata_dns_proxy_addr)"
    assert meta({}, dns_proxy_addr="127.0.0.1:53")["DNS_PROXY_ADDR"] == "127.0.0.1:53"


def test_proxy_metadata_meta_entries_and_flags() -> None:
    got = meta({"ISTIO_META_B": "env"}, ips=[],
               proxy_config={"proxyMetadata": {"ISTIO_META_A": "pc", "ISTIO_META_B": "pc", "OTHER": "x"}},
               exit_on_zero_active_connections=True, metadata_discovery=True, sts_port=15463,
               credential_socket_exists=True)
    assert (got["A"], got["B"]) == ("pc", "env")
    assert "OTHER" not in got and "INSTANCE_IPS" not in got
    assert got["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"] == "true"
    assert got["METADATA_DISCOVERY"] == "true"
    assert got["STS_PORT"] == "15463"
    assert got["credential"] == "true"  # upstream's security.CredentialMetaDataName


def test_metadata_discovery_follows_hbone_unless_set() -> None:
    assert meta({"ISTIO_META_ENABLE_HBONE": "true"})["METADATA_DISCOVERY"] == "true"
    assert meta({"ISTIO_META_ENABLE_HBONE": "true"}, metadata_discovery=False)["METADATA_DISCOVERY"] == "false"
    assert meta({"ISTIO_META_METADATA_DISCOVERY": "true"})["METADATA_DISCOVERY"] == "false"
    assert meta({}, metadata_discovery=True)["METADATA_DISCOVERY"] == "true"


def test_secure_metrics_ports_and_option_owned_flags() -> None:
    got = meta({"ISTIO_META_ENVOY_SKIP_DEPRECATED_LOGS": "1"}, envoy_secure_metrics_port=15091,
               envoy_secure_merged_metrics_port=15092, custom_credentials_file_exists=True)
    assert (got["ENVOY_SECURE_METRICS_PORT"], got["ENVOY_SECURE_MERGED_METRICS_PORT"]) == (15091, 15092)
    assert got["ENVOY_SKIP_DEPRECATED_LOGS"] == "1", "only the agent's option makes it typed"
    assert got["file-credential"] == "true"
    assert "ENVOY_SECURE_METRICS_PORT" not in meta({})
    assert meta({}, envoy_skip_deprecated_logs=True)["ENVOY_SKIP_DEPRECATED_LOGS"] == "true"


def test_topology_locality_label_wins_and_slashes_are_kept() -> None:
    got = meta({"ISTIO_METAJSON_LABELS": '{"topology.istio.io/locality": "r.z", "istio-locality": "x.y"}'})
    assert got["LABELS"]["istio-locality"] == "r/z"
    got = meta({"ISTIO_METAJSON_LABELS": '{"istio-locality": "r/z.1/s"}'})
    assert got["LABELS"]["istio-locality"] == "r/z.1/s"


def test_bad_metajson_is_ignored() -> None:
    got = meta({"ISTIO_METAJSON_X": "{not json", "ISTIO_METAJSON_Y": "[1]"})
    assert "X" not in got and "Y" not in got


def test_an_empty_labels_file_empties_typed_labels_but_envoy_still_sees_the_raw_ones() -> None:
    """A LABELS object from an ISTIO_METAJSON_* variable other than ..._LABELS is raw only: with a labels file
    that gives none, upstream's typed LABELS is empty (left out of the gRPC bootstrap, which encodes the typed
    struct alone) while Envoy's bootstrap, the typed fields over the raw map, still carries the raw object."""
    environ = {"ISTIO_METAJSON_EXTRA": '{"LABELS": {"app": "raw"}, "OTHER": "x"}'}
    with_file = node_metadata_layers(MetadataOptions(env.Environment(environ), {}, labels={}, labels_file=True))
    assert with_file.merged()["LABELS"] == {"app": "raw"}
    assert "LABELS" not in with_file.typed_view() and with_file.typed_view()["OTHER"] == "x"
    without_file = node_metadata_layers(MetadataOptions(env.Environment(environ), {}))
    assert without_file.typed_view()["LABELS"] == without_file.merged()["LABELS"] == {"app": "raw"}
    from_file = node_metadata_layers(MetadataOptions(env.Environment(environ), {}, labels={"app": "pod"},
                                                     labels_file=True))
    assert from_file.typed_view()["LABELS"] == from_file.merged()["LABELS"] == {"app": "pod"}
