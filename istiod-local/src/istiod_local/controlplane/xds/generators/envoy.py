"""Small Envoy message builders shared by the sidecar generators (names and constants from upstream)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2, grpc_service_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2, duration_pb2, struct_pb2, wrappers_pb2
from google.protobuf.message import Message

# Cluster names istiod uses for traffic it does not route itself.
BLACKHOLE_CLUSTER = "BlackHoleCluster"
PASSTHROUGH_CLUSTER = "PassthroughCluster"
INBOUND_PASSTHROUGH_CLUSTER = "InboundPassthroughCluster"
# The bootstrap's static cluster for SDS (served by the agent over its UDS).
SDS_CLUSTER = "sds-grpc"
SDS_DEFAULT = "default"
SDS_ROOT = "ROOTCA"
# Source address for traffic the sidecar sends to its own app, which capture rules let through.
INBOUND_PASSTHROUGH_BIND_IPV4 = "127.0.0.6"
TLS_MODE_METADATA_KEY = "envoy.transport_socket_match"
STAT_PREFIX_DELIMITER = ";"
# Largest duration Envoy accepts, used to turn cleanup of inbound original-dst hosts off.
MAX_DURATION_SECONDS = 9223372035
UINT32_MAX = 4294967295


def pack(message: Message) -> any_pb2.Any:
    """Pack deterministically, so the same config always has the same bytes (and Delta version)."""
    out = any_pb2.Any()
    out.Pack(message, deterministic=True)
    return out


def duration(seconds: float) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


def uint32(value: int) -> wrappers_pb2.UInt32Value:
    return wrappers_pb2.UInt32Value(value=value)


def boolean(value: bool) -> wrappers_pb2.BoolValue:
    return wrappers_pb2.BoolValue(value=value)


def socket_address(ip: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=ip, port_value=port))


def ads_config_source() -> config_source_pb2.ConfigSource:
    """RDS/EDS over the same ADS stream; no initial fetch timeout (upstream's 0s)."""
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(), initial_fetch_timeout=duration(0),
        resource_api_version=config_source_pb2.V3,
    )


def sds_secret_config(name: str) -> secret_pb2.SdsSecretConfig:
    """SDS from the agent through the bootstrap's `sds-grpc` cluster, shaped as upstream's."""
    return secret_pb2.SdsSecretConfig(
        name=name,
        sds_config=config_source_pb2.ConfigSource(
            api_config_source=config_source_pb2.ApiConfigSource(
                api_type=config_source_pb2.ApiConfigSource.GRPC,
                set_node_on_first_message_only=True,
                transport_api_version=config_source_pb2.V3,
                grpc_services=[grpc_service_pb2.GrpcService(
                    envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=SDS_CLUSTER))],
            ),
            resource_api_version=config_source_pb2.V3,
            initial_fetch_timeout=duration(0),
        ),
    )


def exact_matchers(values: Iterable[str]) -> list[string_pb2.StringMatcher]:
    return [string_pb2.StringMatcher(exact=v) for v in values]


def struct(value: Mapping[str, object]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def metadata(filters: Mapping[str, Mapping[str, object]]) -> base_pb2.Metadata:
    return base_pb2.Metadata(filter_metadata={k: struct(v) for k, v in filters.items()})


def delimited(stat_prefix: str) -> str:
    return stat_prefix + STAT_PREFIX_DELIMITER


def outbound_cluster_name(port: int, hostname: str, subset: str = "") -> str:
    return f"outbound|{port}|{subset}|{hostname}"


def inbound_cluster_name(port: int) -> str:
    return f"inbound|{port}||"


def outbound_sni(port: int, hostname: str, subset: str = "") -> str:
    """The SNI of ISTIO_MUTUAL connections (upstream's DNS-SRV-style subset key)."""
    return f"outbound_.{port}_.{subset}_.{hostname}"


def listener_name(address: str, port: int) -> str:
    return f"{address}_{port}"
