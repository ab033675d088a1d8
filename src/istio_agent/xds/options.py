"""Everything the XDS proxy needs, in one struct (upstream keeps the same facts on its `XdsProxy`).

Built once from the agent's config so the proxy never reads the environment,
and constructed directly with plain values in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from istio_agent.config import env
from istio_agent.xds.session import NodeHook
from istio_agent.xds.upstream import UpstreamSettings

if TYPE_CHECKING:
    from istio_agent.config.loader import AgentConfig
    from istio_agent.protos import nds_pb2

XDS_SOCKET_NAME = "XDS"
MOUNTED_CERTS_DIR = "./etc/certs"

NameTableHandler = Callable[["nds_pb2.NameTable"], None]
TrustBundleHandler = Callable[[list[str]], None]
# (kind, detail) for metrics: "connect"/"disconnect" (detail "sotw"|"delta"), "push" (type URL
# forwarded or consumed), "envoy_nack" / "agent_nack" (type URL), "upstream_failure" (reason).
EventHook = Callable[[str, str], None]


@dataclass(frozen=True)
class XdsProxyOptions:
    """Options of one XDS proxy.

    `on_name_table` / `on_trust_bundle` are called on the event loop with each
    NameTable / PCDS trust bundle; raising makes the agent NACK that push.
    NDS is consumed (and subscribed to after Envoy's first LDS request) only when
    `dns_enabled` and a name-table callback is given; PCDS only when
    `pcds_enabled` and a trust-bundle callback is given; otherwise those types
    are dropped as non-Envoy types, as upstream does when no handler is set.

    `node_hook` may edit the `Node` of the first request of every stream (the only
    request that must carry it) before it goes upstream; only that request is
    decoded and re-encoded.
    """

    socket_path: Path
    upstream: UpstreamSettings
    dns_enabled: bool = False
    pcds_enabled: bool = False
    on_name_table: NameTableHandler | None = None
    on_trust_bundle: TrustBundleHandler | None = None
    node_hook: NodeHook | None = None
    on_event: EventHook | None = None  # metrics hook; called on the event loop, must not block
    # How long stop() lets streams finish before cancelling them.
    stop_grace: float = 1.0

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        *,
        on_name_table: NameTableHandler | None = None,
        on_trust_bundle: TrustBundleHandler | None = None,
        node_hook: NodeHook | None = None,
        on_event: EventHook | None = None,
    ) -> XdsProxyOptions:
        """Options from the agent's loaded config (environment already overlaid with proxyMetadata)."""
        environment = config.environment
        proxy_config = config.proxy_config
        if environment.get(env.PROV_CERT):
            client_cert_dir = environment.get(env.PROV_CERT)
        elif environment.get(env.FILE_MOUNTED_CERTS):
            client_cert_dir = MOUNTED_CERTS_DIR
        else:
            client_cert_dir = ""
        headers = tuple((name.lower(), value) for name, value in environment.with_prefix(env.XDS_HEADER_PREFIX))
        upstream = UpstreamSettings(
            address=proxy_config.discovery_address,
            workdir=config.workdir,
            root_ca=environment.get(env.XDS_ROOT_CA),
            istiod_san=environment.get(env.ISTIOD_SAN),
            send_token=environment.get(env.XDS_AUTH),
            cluster_id=config.identity.cluster_id,
            headers=headers,
            client_cert_dir=client_cert_dir,
            insecure=proxy_config.get("controlPlaneAuthPolicy") == "NONE",
        )
        dns = environment.get(env.ISTIO_META_DNS_CAPTURE) or environment.get(env.ISTIO_META_ENABLE_DNS_SERVER)
        return cls(
            socket_path=config.path(proxy_config.config_path) / XDS_SOCKET_NAME,
            upstream=upstream,
            dns_enabled=dns,
            pcds_enabled=environment.get(env.PROXY_CONFIG_XDS_AGENT),
            on_name_table=on_name_table,
            on_trust_bundle=on_trust_bundle,
            node_hook=node_hook,
            on_event=on_event,
        )
