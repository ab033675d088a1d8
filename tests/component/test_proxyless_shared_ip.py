"""Two proxyless agents on one host's loopback: two workloads share 127.0.0.1, each gets its own identity and config.

A cluster lets workloads share an address (hostNetwork pods, several on one
VM), and istiod tells them apart by the pod name and namespace in the node
id. Here two `pilot-agent proxy sidecar` processes in the grpc-agent
template's mode (DISABLE_ENVOY, ISTIO_META_GENERATOR=grpc) run for
`alpha-1` and `beta-1`, both at INSTANCE_IP 127.0.0.1, against istiod-local
serving a plain registry file that lists both at that IP. Each must hold a
certificate for its own service account, and asking istiod-local through
its own agent's XDS socket (with the node its gRPC bootstrap names) for
both workloads' server listeners must return only its own.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from fixtures import AgentStarter
from google.protobuf import json_format
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment
from support import HTTP_NOT_YET, free_port, http_request, poll

from istio_agent.pki.certs import load_pem_chain, uri_sans
from istio_agent.protos import typeurls

WORKLOADS = {"alpha-1": ("alpha", 17001), "beta-1": ("beta", 17002)}  # pod -> (service account, server port)
REGISTRY = """\
services:
- name: alpha
  selector: {app: alpha}
  ports: [{name: grpc, port: 7001, targetPort: 17001}]
- name: beta
  selector: {app: beta}
  ports: [{name: grpc, port: 7002, targetPort: 17002}]
workloads:
- {name: alpha-1, serviceAccount: alpha, labels: {app: alpha}, ip: 127.0.0.1}
- {name: beta-1, serviceAccount: beta, labels: {app: beta}, ip: 127.0.0.1}
"""
TEMPLATE_ARGS = ["proxy", "sidecar", "--domain", "default.svc.cluster.local", "--proxyLogLevel=warning",
                 "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info"]
INBOUND = "xds.istio.io/grpc/lds/inbound/127.0.0.1:"


@pytest.fixture
def registry(tmp_path: Path) -> RegistryFile:
    """Both workloads at 127.0.0.1, served by the tier's `istiod` fixture."""
    return RegistryFile(tmp_path / "mesh.yaml", REGISTRY)


@pytest.fixture
def pods() -> Iterator[dict[str, Path]]:
    """A pod directory per workload, short enough for its XDS socket path (unix sockets allow 107 bytes)."""
    made = {pod: Path(tempfile.mkdtemp(prefix=f"{pod}-", dir="/tmp")) for pod in WORKLOADS}
    try:
        yield made
    finally:
        for directory in made.values():
            shutil.rmtree(directory, ignore_errors=True)


def start(start_agent: AgentStarter, istiod: IstiodLocal, pod: str, directory: Path) -> tuple[PilotAgent, int]:
    """One agent as the grpc-agent template runs it, for `pod` at 127.0.0.1; returns it and its status port."""
    account = WORKLOADS[pod][0]
    istiod.pod_files(directory, service_account=account, pod=pod)
    status_port = free_port()
    proxy_config = {"statusPort": status_port, "configPath": str(directory / "etc/istio/proxy")}
    environment = agent_environment(
        pod=pod, service_account=account, instance_ip="127.0.0.1", discovery=istiod.secure_address,
        proxy_config=proxy_config, base={}, ISTIO_META_GENERATOR="grpc", DISABLE_ENVOY="true",
        OUTPUT_CERTS=str(directory / "var/lib/istio/data"), PILOT_CERT_PROVIDER="istiod",
        ISTIO_META_CLUSTER_ID="Kubernetes", TRUST_DOMAIN="cluster.local")
    environment["PATH"] = "/usr/bin:/bin"
    return start_agent(directory, environment, args=TEMPLATE_ARGS), status_port


def wait_ready(agent: PilotAgent, status_port: int) -> None:
    """The agent's own readiness (no Envoy: :15020 is the grpc-agent template's probe), failing fast if it exits."""
    def ready() -> bool:
        if not agent.alive():
            raise AssertionError(f"the agent exited:\n{agent.output()}")
        return http_request("127.0.0.1", status_port, "/healthz/ready", timeout=2)[0] == 200

    poll(ready, f"the agent on :{status_port} to be ready", 60, agent.output, retry_on=HTTP_NOT_YET)


def bootstrap_node(directory: Path) -> base_pb2.Node:
    """The node the app's gRPC library would send: what the agent wrote into its bootstrap."""
    bootstrap = json.loads((directory / "etc/istio/proxy/grpc-bootstrap.json").read_text())
    node = base_pb2.Node()
    json_format.ParseDict({"id": bootstrap["node"]["id"], "metadata": bootstrap["node"]["metadata"]}, node)
    return node


async def server_listeners(directory: Path) -> dict[str, Any]:
    """Both workloads' server listeners asked for through this pod's agent; what comes back, by name."""
    async with grpc.aio.insecure_channel(f"unix://{directory / 'etc/istio/proxy/XDS'}") as channel:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
        names = [f"{INBOUND}{port}" for _, port in WORKLOADS.values()]
        await call.write(discovery_pb2.DiscoveryRequest(node=bootstrap_node(directory), type_url=typeurls.LISTENER,
                                                        resource_names=names))
        response = await asyncio.wait_for(call.read(), 20)
        call.cancel()
    out = {}
    for resource in response.resources:
        listener = listener_pb2.Listener()
        assert resource.Unpack(listener)
        out[listener.name] = listener
    return out


async def test_two_proxyless_agents_sharing_127_0_0_1_get_their_own_identity_and_config(
        istiod: IstiodLocal, start_agent: AgentStarter, pods: dict[str, Path]) -> None:
    agents = {pod: start(start_agent, istiod, pod, directory) for pod, directory in pods.items()}
    for agent, status_port in agents.values():
        await asyncio.to_thread(wait_ready, agent, status_port)

    for pod, directory in pods.items():
        account, port = WORKLOADS[pod]
        chain = load_pem_chain((directory / "var/lib/istio/data/cert-chain.pem").read_bytes())  # ready: written
        assert uri_sans(chain[0]) == [f"spiffe://cluster.local/ns/default/sa/{account}"], pod

        listeners = await server_listeners(directory)
        context = f"{pod}: {sorted(listeners)}\nistiod:\n{istiod.log.tail(40)}\nagent:\n{agents[pod][0].output()}"
        assert sorted(listeners) == [f"{INBOUND}{port}"], context
        address = listeners[f"{INBOUND}{port}"].address.socket_address
        assert (address.address, address.port_value) == ("127.0.0.1", port), context
        assert agents[pod][0].alive(), context
