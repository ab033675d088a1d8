"""The gRPC xDS bootstrap (`GRPC_XDS_BOOTSTRAP`) for proxyless gRPC applications (sans-IO).

A proxyless app's gRPC library reads this file to find its xDS server (the
agent's XDS proxy on a unix socket), the node it presents (id, metadata with
`GENERATOR: grpc` so istiod uses its gRPC generator, locality), where its
mTLS certificates are (`file_watcher` over the agent's OUTPUT_CERTS) and how
server-side listeners are named. `build_bootstrap()` returns the document as
an ordered dict shaped like upstream's Go structs, including the artefacts
of Go's encoder (`"UserAgentVersionType": null`, `"locality": {}`), and
`render_bootstrap()` gives its bytes as Go writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from istio_agent.config.gopath import go_join
from istio_agent.grpcxds.metadata import sorted_json, typed_metadata

SERVER_LISTENER_NAME_PREFIX = "xds.istio.io/grpc/lds/inbound/"
SERVER_LISTENER_NAME_TEMPLATE = SERVER_LISTENER_NAME_PREFIX + "%s"
FILE_WATCHER_PLUGIN = "file_watcher"
CERT_PROVIDER_NAME = "default"
CERT_CHAIN_FILE = "cert-chain.pem"
KEY_FILE = "key.pem"
ROOT_CERT_FILE = "root-cert.pem"
REFRESH_INTERVAL = "900s"  # upstream: 15 minutes, as protojson writes a Duration
GRPC_GENERATOR = "grpc"


@dataclass(frozen=True)
class GrpcBootstrapOptions:
    """Inputs of one bootstrap; the options resolver derives them the way pilot-agent does.

    `xds_uds_path` is the XDS proxy's socket as upstream names it
    (`xds_socket_for_bootstrap`: the ProxyConfig configPath joined with `XDS`,
    not resolved against the agent's working directory); when empty, the app
    would talk to `discovery_address` directly (upstream's fallback).
    `cert_dir` is OUTPUT_CERTS, written as given; empty leaves out the
    certificate provider. `metadata` is node metadata's typed view (`MetadataLayers.typed_view`): only
    upstream's typed keys are kept and GENERATOR is forced to `grpc`.
    """

    node_id: str
    metadata: Mapping[str, Any]
    xds_uds_path: str
    locality: Mapping[str, str] | None = field(default_factory=dict)
    discovery_address: str = ""
    cert_dir: str = ""


@dataclass(frozen=True)
class GrpcBootstrapFile:
    """Where the agent writes the gRPC bootstrap (GRPC_XDS_BOOTSTRAP, resolved) and what goes in it."""

    path: Path
    content: GrpcBootstrapOptions


def xds_socket_for_bootstrap(config_path: str) -> str:
    """The XDS socket as upstream names it in the bootstrap: `filepath.Join(configPath, "XDS")`, unresolved.

    With the default `./etc/istio/proxy` that is `etc/istio/proxy/XDS`, so the server URI is
    `unix:///etc/istio/proxy/XDS`: the path an app container sees the shared volume at.
    """
    return go_join(config_path, "XDS")


def certificate_files(cert_dir: str) -> list[str]:
    """Chain, key and root paths under `cert_dir`, joined as Go's path.Join (relative stays relative)."""
    return [go_join(cert_dir, name) for name in (CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE)]


def build_bootstrap(options: GrpcBootstrapOptions) -> dict[str, Any]:
    """The bootstrap document, keys in upstream's struct order and empty fields omitted as Go's `omitempty` does."""
    server: dict[str, Any] = {}
    server_uri = f"unix:///{options.xds_uds_path}" if options.xds_uds_path else options.discovery_address
    if server_uri:
        server["server_uri"] = server_uri
    server["channel_creds"] = [{"type": "insecure"}]
    server["server_features"] = ["xds_v3"]

    metadata = typed_metadata(options.metadata)
    metadata["GENERATOR"] = GRPC_GENERATOR
    node: dict[str, Any] = {}
    if options.node_id:
        node["id"] = options.node_id
    node["metadata"] = sorted_json(metadata)
    if options.locality is not None:
        node["locality"] = {key: options.locality[key] for key in ("region", "zone", "sub_zone")
                            if options.locality.get(key)}
    node["UserAgentVersionType"] = None  # Go's encoder writes the empty oneof of envoy's Node as null

    bootstrap: dict[str, Any] = {"xds_servers": [server], "node": node}
    if options.cert_dir:
        chain, key, root = certificate_files(options.cert_dir)
        bootstrap["certificate_providers"] = {
            CERT_PROVIDER_NAME: {
                "plugin_name": FILE_WATCHER_PLUGIN,
                "config": {
                    "certificate_file": chain,
                    "private_key_file": key,
                    "ca_certificate_file": root,
                    "refresh_interval": REFRESH_INTERVAL,
                },
            },
        }
    bootstrap["server_listener_resource_name_template"] = SERVER_LISTENER_NAME_TEMPLATE
    return bootstrap


def render_bootstrap(bootstrap: Mapping[str, Any]) -> bytes:
    """The file's bytes: Go's MarshalIndent with two spaces, no trailing newline."""
    from istio_agent import gojson  # here: the options resolver imports this module for every agent

    return gojson.dumps(bootstrap).encode("utf-8")
