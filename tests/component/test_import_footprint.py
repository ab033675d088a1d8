"""What each entry point loads, checked in a fresh interpreter (start-up time and memory are features).

Each case runs a snippet in a new Python process and lists the modules it left
loaded; the lists of what must stay out are the reasons each module is split
the way it is.
"""

from __future__ import annotations

import pytest
from support import loaded_after


def test_istio_iptables_cli_path_stays_lean() -> None:
    """The per-pod CLI pulls in no click, subprocess, dataclasses, typing, ipaddress, enum, ctypes or re."""
    loaded = loaded_after(
        "import io\n"
        "from istio_agent.cli.iptables import run_cli\n"
        "assert run_cli(['-n', '--enable-ipv6=false', '-i', '*', '--redirect-dns', '--dns-servers=1.1.1.1'],"
        " {}, io.StringIO(), io.StringIO()) == 0\n"
        "import istio_agent.capture.apply, istio_agent.capture.netns\n"
    )
    heavy = {"click", "subprocess", "dataclasses", "typing", "ipaddress", "enum", "ctypes", "re"}
    assert not loaded & heavy, loaded & heavy


def test_dns_options_module_imports_nothing_heavy() -> None:
    """The options resolver imports dns.options at start-up: no sockets, threads, metrics or protobuf."""
    loaded = loaded_after("import istio_agent.dns.options")
    assert "istio_agent.dns.options" in loaded
    heavy = {"socket", "threading", "asyncio", "prometheus_client", "google.protobuf", "istio_agent.dns.proxy"}
    assert not loaded & heavy, loaded & heavy


def test_health_messages_are_not_imported_with_the_prober() -> None:
    # (`import grpc` itself imports the empty top-level `grpc_health` package when it is installed.)
    loaded = loaded_after("import istio_agent.status.probes.prober")
    assert not {m for m in loaded if m.startswith("grpc_health.")}


def test_http2_client_is_not_imported_with_the_prober() -> None:
    """h2 (ISTIO_ENABLE_HTTP2_PROBING's HTTPS client) loads when an app selects it, the probes' HTTP client on
    the first HTTP probe, not at start (h11 itself is the status server's HTTP)."""
    loaded = loaded_after("import istio_agent.status.probes.prober, istio_agent.status.server")
    heavy = {"h2", "hpack", "hyperframe", "istio_agent.status.probes.https"}
    assert not loaded & heavy, loaded & heavy


@pytest.mark.parametrize("entry", ["istio_agent.agent.loader", "istio_agent.agent.run"])
def test_resolving_options_loads_no_component(entry: str) -> None:
    """Options are resolved before anything starts; the components (and aiohttp, Envoy's protos, the DNS
    proxy, the XDS server) load only when the agent starts them, so the first CSR is not kept waiting."""
    loaded = loaded_after(f"import {entry}")
    heavy = {"aiohttp", "istio_agent.dns.proxy", "istio_agent.xds.proxy", "istio_agent.status.server",
             "istio_agent.security.sds", "istio_agent.envoy.supervisor", "envoy.config.bootstrap.v3.bootstrap_pb2"}
    assert not loaded & heavy, loaded & heavy


# A sidecar's options resolved from the injector's JSON PROXY_CONFIG, then its bootstrap rendered, in a temp dir.
SIDECAR_START = (
    "import tempfile\n"
    "from pathlib import Path\n"
    "from istio_agent.config import env\n"
    "from istio_agent.agent.loader import load_agent_config\n"
    "from istio_agent.agent.options import AgentFlags, HostFacts, resolve_agent_options\n"
    "from istio_agent.envoy.bootstrap.render import render_bootstrap\n"
    "environ = dict(POD_NAME='app-1', POD_NAMESPACE='default', SERVICE_ACCOUNT='app', INSTANCE_IP='10.1.1.5',\n"
    "               ISTIO_META_DNS_CAPTURE='true', PROXY_CONFIG=PROXY_CONFIG_VALUE)\n"
    "with tempfile.TemporaryDirectory() as tmp:\n"
    "    config = load_agent_config(env.Environment(environ), Path(tmp), proxy_type='sidecar')\n"
    "    options = resolve_agent_options(config, AgentFlags(), HostFacts())\n"
    "    assert options.envoy is not None and options.dns is not None\n"
    "    bootstrap = render_bootstrap(options.envoy.bootstrap)\n"
    "    assert bootstrap['node']['id'].startswith('sidecar~10.1.1.5~app-1.default~')\n"
    "    from istio_agent.grpcxds.bootstrap import build_bootstrap, render_bootstrap as render_grpc\n"
    "    assert options.grpc_bootstrap is not None  # upstream writes it for every agent by default\n"
    "    assert render_grpc(build_bootstrap(options.grpc_bootstrap.content)).startswith(b'{')\n"
)
# As the injector writes it (`value: |` then protoToJSON: one line and a line break).
PROXY_CONFIG_JSON = '{"discoveryAddress": "istiod:15012", "concurrency": 2, "proxyMetadata": {"A": ""}}\n'


def test_sidecar_options_and_bootstrap_load_no_yaml_metadata_or_envoy_protos() -> None:
    """PyYAML (~1 MB) only for a layer that really is YAML, importlib.metadata (~1 MB) only for `pilot-agent
    version`, decimal (gojson's) only for a gRPC bootstrap; the bootstrap is rendered from plain dicts, with
    none of Envoy's or Istio's message classes."""
    loaded = loaded_after(SIDECAR_START.replace("PROXY_CONFIG_VALUE", repr(PROXY_CONFIG_JSON)))
    assert "istio_agent.envoy.bootstrap.render" in loaded
    heavy = {"yaml", "importlib.metadata", "decimal"}
    # (The CA client's istioca_pb2 and protobuf's well-known types come with the resolver's upstream settings.)
    protos = {m for m in loaded if m.startswith("istio_agent.protos.") and ".istioca" not in m}
    assert not loaded & heavy, loaded & heavy
    assert not {m for m in loaded if m.startswith(("envoy.", "udpa.", "xds.", "validate"))}
    assert not protos, protos


def test_a_yaml_proxy_config_still_loads_yaml() -> None:
    """The other side of the JSON fast path: the probe above would pass if nothing ever loaded PyYAML."""
    loaded = loaded_after(SIDECAR_START.replace("PROXY_CONFIG_VALUE", repr("discoveryAddress: istiod:15012\n")))
    assert "yaml" in loaded
