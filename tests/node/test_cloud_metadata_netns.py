"""Cloud platforms against metadata servers of our own, at 169.254.169.254 in a network namespace.

The namespace has 169.254.169.254 (and AWS's fd00:ec2::254: an agent with an IPv6 address, here ::1, asks
that one, as upstream's) on its loopback and `tests/cloud_metadata_server.py` listening there,
answering as GCE's, AWS's (IMDSv2) or Azure's metadata server does, or accepting and never answering.
`pilot-agent proxy` starts in the namespace as a proxyless agent (no Envoy, the CA unreachable): the gRPC
bootstrap it writes at start carries the node's PLATFORM_METADATA and locality, which must be what the
server told. Where upstream's Go pilot-agent is installed it is started the same way against the same
server, and its bootstrap must say the same. Also: nothing is asked with CLOUD_PLATFORM=none; a silent
server leaves the agent without a platform after its probe's budget (the log says so) and the agent starts;
and with CREDENTIAL_FETCHER_TYPE=GoogleComputeEngine the agent gets its certificate from istiod-local with
the identity token the GCE server hands out (the pod has no token file of its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import upstream_agent
from launchers import IstiodLocal, RegistryFile, agent_environment, echo_registry, pod_files
from needs import need_root, need_sidecar_binaries, need_tool
from support import PILOT_AGENT, ROOT, poll, stop_process

SERVER = ROOT / "tests" / "cloud_metadata_server.py"
GCP_METADATA = {
    "gcp_project": "test-project", "gcp_project_number": "123456789", "gcp_gce_instance": "vm-1",
    "gcp_gce_instance_id": "4242", "gcp_gke_cluster_name": "mesh-cluster", "gcp_location": "europe-west4",
    "gcp_gce_instance_template": "tmpl", "gcp_gce_instance_created_by": "projects/123456789/x",
    "gcp_gke_cluster_url": "https://container.googleapis.com/v1/projects/test-project/locations/europe-west4/"
                           "clusters/mesh-cluster",
}
AWS_METADATA = {"aws_region": "eu-central-1", "aws_availability_zone": "eu-central-1a",
                "aws_instance_id": "i-0123456789abcdef0"}
AZURE_METADATA = {"azure_name": "vm-azure", "azure_location": "northeurope", "azure_vmId": "0e3b-vm",
                  "azure_team": "mesh"}
GCP_LOCALITY = {"region": "europe-west4", "zone": "europe-west4-b"}
# id, server, variables, PLATFORM_METADATA, locality, compared with upstream's agent
CASES = [
    # Detected by its answer to http://169.254.169.254/. Upstream's metadata client also looks up
    # metadata.google.internal at once and believes whichever answers first: here (no DNS) the failed lookup,
    # so its agent finds no platform in this namespace, where on GCE both say yes. Not compared.
    ("gcp-detected", "gcp", {}, GCP_METADATA, GCP_LOCALITY, False),
    # GCE_METADATA_HOST: both take it that they are on GCE, and ask it.
    ("gcp-metadata-host", "gcp", {"GCE_METADATA_HOST": "169.254.169.254"}, GCP_METADATA, GCP_LOCALITY, True),
    ("aws-detected", "aws", {}, AWS_METADATA, {"region": "eu-central-1", "zone": "eu-central-1a"}, True),
    # Azure is detected by the DMI vendor file, which a namespace cannot fake: named.
    ("azure", "azure", {"CLOUD_PLATFORM": "azure"}, AZURE_METADATA, {"region": "northeurope", "zone": "3"}, True),
]


class Namespace:
    """A network namespace whose loopback holds the metadata address; servers and agents run in it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.name = f"s27b-md-{uuid.uuid4().hex[:8]}"
        self.prefix = ["ip", "netns", "exec", self.name]
        self.processes: list[subprocess.Popen[Any]] = []
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=30)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, timeout=30)
        for address in ("169.254.169.254/32", "fd00:ec2::254/128"):  # AWS's IMDS has an IPv6 address too
            subprocess.run(["ip", "-n", self.name, "addr", "add", address, "dev", "lo"], check=True, timeout=30)

    def server(self, cloud: str, token_file: Path | None = None) -> Path:
        """Start the metadata server for `cloud`; the path of its request log."""
        log = self.base / f"{cloud}-{uuid.uuid4().hex[:6]}-requests.jsonl"
        argv = [*self.prefix, sys.executable, str(SERVER), "--cloud", cloud, "--log", str(log)]
        if token_file is not None:
            argv += ["--token-file", str(token_file)]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.processes.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "serving", line + process.stdout.read()
        return log

    def close(self) -> None:
        for process in self.processes:
            stop_process(process, 5)
        for pid in subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid], check=False)
        subprocess.run(["ip", "netns", "del", self.name], check=False, timeout=30)


def requests(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line]


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[Namespace]:
    need_root()
    need_tool("ip")
    need_sidecar_binaries()
    namespace = Namespace(tmp_path)
    try:
        yield namespace
    finally:
        namespace.close()


def proxyless_bootstrap(netns: Namespace, pod: Path, binary: Path, variables: dict[str, str]) -> tuple[dict[str, Any],
                                                                                                         str]:
    """Start the agent in `pod` (proxyless, the CA unreachable); the gRPC bootstrap it wrote, and its log."""
    pod_files(netns.base / "state", pod)
    bootstrap = pod / "etc/istio/proxy/grpc-bootstrap.json"
    environment = agent_environment(discovery="127.0.0.1:1", DISABLE_ENVOY="true", GRPC_XDS_BOOTSTRAP=str(bootstrap))
    environment.update(variables)
    log = pod / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen([*netns.prefix, str(binary), "proxy", "sidecar"], cwd=pod, env=environment,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        poll(bootstrap.is_file, f"{binary.name} to write its gRPC bootstrap", 60,
             lambda: log.read_text(errors="replace")[-3000:])
        poll(lambda: bootstrap.read_text().strip().endswith("}"), "the bootstrap to be whole", 10)
    finally:
        stop_process(agent, 10)
    return json.loads(bootstrap.read_text()), log.read_text(errors="replace")


def platform_of(bootstrap: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    node = bootstrap["node"]
    return dict(node.get("metadata", {}).get("PLATFORM_METADATA", {})), dict(node.get("locality", {}))


@pytest.mark.parametrize(("cloud", "variables", "metadata", "locality", "compared"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_platform_is_what_its_metadata_server_says(netns: Namespace, cloud: str, variables: dict[str, str],
                                                       metadata: dict[str, str], locality: dict[str, str],
                                                       compared: bool) -> None:
    log = netns.server(cloud)
    ours, _ = proxyless_bootstrap(netns, netns.base / "ours", PILOT_AGENT, variables)
    assert platform_of(ours) == (metadata, locality)
    asked = requests(log)
    if cloud == "aws":  # IMDSv2: a token first, sent with every read
        assert asked[0]["method"] == "PUT" or any(r["method"] == "PUT" for r in asked)
        assert all(r["headers"].get("x-aws-ec2-metadata-token") == "aws-session-token"
                   for r in asked if r["path"].startswith("/latest/meta-data/placement"))
    if cloud == "gcp":
        assert all(r["headers"].get("metadata-flavor") == "Google"
                   for r in asked if r["path"].startswith("/computeMetadata/"))
    if not compared or upstream_agent.missing():
        return
    upstream_agent.lay_out_pod(netns.base / "theirs")
    theirs, their_log = proxyless_bootstrap(netns, netns.base / "theirs", upstream_agent.upstream_bin() / "pilot-agent",
                                            variables)
    assert platform_of(theirs) == platform_of(ours), their_log[-3000:]


def test_nothing_is_asked_when_the_environment_says_none(netns: Namespace) -> None:
    log = netns.server("gcp")
    ours, _ = proxyless_bootstrap(netns, netns.base / "ours", PILOT_AGENT, {"CLOUD_PLATFORM": "none"})
    assert platform_of(ours) == ({}, {})
    assert requests(log) == []


@pytest.mark.parametrize(("variables", "said"), [
    ({}, "no cloud platform detected"),  # every request timed out on its own (GCE's 2 s, AWS's 100 ms)
    ({"CLOUD_PLATFORM": "azure"}, "timed out waiting for platform detection (5s), treating it as Unknown"),
], ids=["detection", "azure"])
def test_a_silent_server_gives_no_platform_within_the_probes_budget(netns: Namespace, variables: dict[str, str],
                                                                    said: str) -> None:
    log = netns.server("silent")
    ours, agent_log = proxyless_bootstrap(netns, netns.base / "ours", PILOT_AGENT, variables)
    assert platform_of(ours) == ({}, {})
    assert said in agent_log
    assert requests(log), "it was asked, and never answered"


def test_the_gce_credential_fetcher_gets_the_certificate_with_the_vms_identity_token(netns: Namespace) -> None:
    state = netns.base / "state"
    registry = RegistryFile(netns.base / "mesh.yaml", echo_registry())
    pod = pod_files(state, netns.base / "pod", pod="echo-1")
    token_file = netns.base / "identity-token"
    token = pod / "var/run/secrets/tokens/istio-token"
    token_file.write_text(token.read_text())  # what the GCE server will hand out: a token istiod-local accepts
    token.unlink()  # the pod has none of its own
    log = netns.server("gcp", token_file)
    with IstiodLocal(state, registry=registry, prefix=netns.prefix) as istiod:
        certs = pod / "var/lib/istio/data"
        environment = agent_environment(
            discovery=f"localhost:{istiod.secure_port}", DISABLE_ENVOY="true", OUTPUT_CERTS=str(certs),
            CREDENTIAL_FETCHER_TYPE="GoogleComputeEngine", CLOUD_PLATFORM="none",
            PROXY_CONFIG=json.dumps({"discoveryAddress": f"localhost:{istiod.secure_port}", "statusPort": 15020}))
        agent_log = pod / "agent.log"
        with agent_log.open("wb") as out:
            agent = subprocess.Popen([*netns.prefix, str(PILOT_AGENT), "proxy", "sidecar"], cwd=pod, env=environment,
                                     stdout=out, stderr=subprocess.STDOUT)
        try:
            poll(lambda: (certs / "cert-chain.pem").is_file(), "the workload certificate", 60,
                 lambda: agent_log.read_text(errors="replace")[-3000:])
        finally:
            stop_process(agent, 10)
    assert token.read_text() == token_file.read_text(), "the identity token is written to the token file"
    assert os.stat(token).st_mode & 0o777 == 0o640
    identity = [r for r in requests(log) if "service-accounts/default/identity" in r["path"]]
    assert identity and all("audience=cluster.local" in r["path"] and "format=full" in r["path"] for r in identity)
