"""What the XDS proxy is (options) and whom it tells about what it consumes (hooks).

`XdsProxyOptions` is resolved once by the options resolver (`agent/options.py`)
from the environment and ProxyConfig, so the proxy never reads the environment;
tests construct it directly with plain values. `XdsProxyHooks` is wiring, not
configuration: the agent's assembly passes the DNS proxy's and the secret
cache's entry points, and the metrics hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from istio_agent.xds.upstream import UpstreamSettings

if TYPE_CHECKING:
    from istio_agent.protos import nds_pb2
    from istio_agent.xds.core.session import NodeHook

XDS_SOCKET_NAME = "XDS"
MOUNTED_CERTS_DIR = "./etc/certs"
# Upstream serves Envoy with istiod's gRPC server options, whose receive limit is ISTIO_GPRC_MAXRECVMSGSIZE
# (4 MiB by default): a larger request is refused by its length prefix, before it is buffered.
MAX_RECEIVE_MESSAGE_SIZE = 4 * 1024 * 1024

NameTableHandler = Callable[["nds_pb2.NameTable"], None]
TrustBundleHandler = Callable[[list[str]], None]
# (kind, detail) for metrics: "connect"/"disconnect" (detail "sotw"|"delta"), "push" (type URL
# forwarded or consumed), "envoy_nack" / "agent_nack" (type URL), "upstream_failure" (reason),
# "upstream_end" / "downstream_end" (istiod's / Envoy's side of a stream ended: "cancelled" | "error").
EventHook = Callable[[str, str], None]


class EcdsHook(Protocol):
    """Rewrites ECDS responses before Envoy sees them (the Wasm module cache: `wasm/ecds.py`).

    `needs_rewrite` is asked of every ECDS response and must be cheap: a response it declines is forwarded as
    is. `rewrite` returns the response to forward to Envoy, or (True) the NACK to send istiod instead.
    """

    def needs_rewrite(self, data: bytes) -> bool: ...

    async def rewrite(self, data: bytes, delta: bool, version_info: str) -> tuple[bytes, bool]: ...


@dataclass(frozen=True)
class XdsProxyOptions:
    """Options of one XDS proxy.

    NDS is consumed (and subscribed to after Envoy's first LDS request) only when
    `dns_enabled` and a name-table hook is given; PCDS only when `pcds_enabled` and
    a trust-bundle hook is given; otherwise those types are dropped as non-Envoy
    types, as upstream does when no handler is set.
    """

    socket_path: Path
    upstream: UpstreamSettings
    dns_enabled: bool = False
    pcds_enabled: bool = False
    # How long stop() lets streams finish before cancelling them.
    stop_grace: float = 1.0
    # The largest request accepted from Envoy, in bytes (responses from istiod are never capped).
    max_receive_message_size: int = MAX_RECEIVE_MESSAGE_SIZE
    max_concurrent_streams: int = 100000  # per connection (ISTIO_GPRC_MAXSTREAMS)


@dataclass(frozen=True)
class XdsProxyHooks:
    """Callbacks of one XDS proxy, all called on the event loop.

    `on_name_table` / `on_trust_bundle` get each NameTable / PCDS trust bundle; raising
    makes the agent NACK that push. `node_hook` may edit the `Node` of the first
    request of every stream (the only request that must carry it) before it goes
    upstream; only that request is decoded and re-encoded. `on_event` feeds metrics
    and must not block. `ecds` rewrites ECDS responses (remote Wasm modules to local files); without it ECDS is
    forwarded untouched.
    """

    on_name_table: NameTableHandler | None = None
    on_trust_bundle: TrustBundleHandler | None = None
    node_hook: NodeHook | None = None
    on_event: EventHook | None = None
    ecds: EcdsHook | None = None
