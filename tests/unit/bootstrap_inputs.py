"""Bootstrap inputs as pilot-agent builds them, for the per-option tests.

`options()` parses the ProxyConfig layer as the agent does (so values have the
shape upstream's parser gives them), builds node metadata from an environment
and annotations, and returns `BootstrapOptions`; `both()` renders it both ways,
the built-in bootstrap and the parameter map a custom template sees.
"""

from __future__ import annotations

from typing import Any

from envoy_types import as_envoy_bootstrap

from istio_agent.config import env
from istio_agent.config.node import MetadataOptions, node_metadata
from istio_agent.config.proxyconfig import ProxyConfig, parse_layer
from istio_agent.envoy.bootstrap.options import BootstrapOptions
from istio_agent.envoy.bootstrap.params import template_params
from istio_agent.envoy.bootstrap.render import render_bootstrap

NODE = "sidecar~10.1.1.1~p.ns~ns.svc.cluster.local"
def as_envoy_proto(bootstrap: dict[str, Any]) -> Any:
    """The bootstrap parsed by Envoy's own protos (every field and typed_config must be known)."""
    return as_envoy_bootstrap(bootstrap)


def options(pc: dict[str, Any] | None = None, environ: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, ips: tuple[str, ...] = ("10.1.1.1",),
            node_id: str = NODE, metadata: dict[str, Any] | None = None, **kwargs: Any) -> BootstrapOptions:
    """BootstrapOptions from a ProxyConfig layer (checked as upstream's parser checks it) over the defaults.

    `metadata` passes MetadataOptions fields (ports, outlier log path, ...); other keywords go
    to BootstrapOptions (dual_stack, compliance_policy, host_ip, ...).
    """
    config = ProxyConfig()
    config.apply(parse_layer(pc or {}, "test"))
    environment = env.Environment(environ or {})
    meta = node_metadata(MetadataOptions(
        environment, config.to_json(), instance_ips=ips, annotations=annotations or {},
        exit_on_zero_active_connections=environment.get(env.EXIT_ON_ZERO_ACTIVE_CONNECTIONS),
        **(metadata or {}),
    ))
    return BootstrapOptions(node_id, config.to_json(), meta, instance_ips=tuple(dict.fromkeys(ips)),
                            delta_xds=environment.get(env.ISTIO_DELTA_XDS), **kwargs)


def both(opts: BootstrapOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the built-in bootstrap, the custom-template parameters) for `opts`."""
    return render_bootstrap(opts), template_params(opts)


def clusters(bootstrap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}


def listeners(bootstrap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in bootstrap["static_resources"]["listeners"]}


def endpoint(cluster: dict[str, Any]) -> dict[str, Any]:
    return dict(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"])


def http_filters(listener: dict[str, Any]) -> list[str]:
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return [f["name"] for f in manager["http_filters"]]
