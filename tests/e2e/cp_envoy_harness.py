"""Shared harness for the istiod-local + real Envoy tests.

Envoy runs in a network namespace of its own (`unshare --net`), so its
15001/15006 listeners really bind without touching the host's ports (an
optional shell prelude can set up loopback and capture rules in that
namespace first); it reaches the ADS server and a small test SDS server (the
`default` and `ROOTCA` secrets the generated mTLS contexts ask for) over unix
sockets, and its admin API over a third one.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from google.protobuf import any_pb2
from needs import need, need_root
from support import ENVOY, eventually, stop_process

from istio_agent.pki.certs import build_csr, cert_to_pem, load_csr, new_root_ca, sign_workload_csr
from istio_agent.pki.keys import generate_key, key_to_pem
from istiod_local.controlplane.xds.ads import AdsServer
from istiod_local.controlplane.xds.registry import Registry

NODE = "sidecar~10.244.0.5~echo-1.default~default.svc.cluster.local"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


class TestSds(sds_pb2_grpc.SecretDiscoveryServiceServicer):
    """Serves `default` and `ROOTCA` to Envoy, just enough for the mTLS contexts to become active."""

    def __init__(self) -> None:
        now = time.time()
        root = new_root_ca(generate_key("ECDSA"), "cluster.local", now, 3600)
        key = generate_key("ECDSA")
        spiffe = "spiffe://cluster.local/ns/default/sa/echo"
        leaf = sign_workload_csr(root, load_csr(build_csr(key, [spiffe])), spiffe, now, 3600)
        self.secrets = {
            "default": secret_pb2.Secret(name="default", tls_certificate=common_pb2.TlsCertificate(
                certificate_chain={"inline_bytes": (cert_to_pem(leaf) + cert_to_pem(root.cert)).encode()},
                private_key={"inline_bytes": key_to_pem(key)})),
            "ROOTCA": secret_pb2.Secret(name="ROOTCA", validation_context=common_pb2.CertificateValidationContext(
                trusted_ca={"inline_bytes": root.cert_pem})),
        }

    async def StreamSecrets(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for request in request_iterator:
            if request.response_nonce:
                continue  # ACK or NACK; nothing changes in this test
            resources = []
            for name in request.resource_names:
                packed = any_pb2.Any()
                packed.Pack(self.secrets[name])
                resources.append(packed)
            yield discovery_pb2.DiscoveryResponse(version_info="1", type_url=SECRET_TYPE, nonce="n1",
                                                  resources=resources)


def bootstrap(work: Path, delta: bool, node_id: str = NODE) -> dict[str, Any]:
    ads = {"ads": {}, "resource_api_version": "V3"}
    h2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}

    def pipe_cluster(name: str, path: Path) -> dict[str, Any]:
        return {"name": name, "type": "STATIC", "connect_timeout": "1s", "typed_extension_protocol_options": h2,
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"pipe": {"path": str(path)}}}}]}]}}

    return {
        "node": {"id": node_id, "cluster": "echo.default", "metadata": {
            "NAMESPACE": "default", "NAME": "echo-1", "SERVICE_ACCOUNT": "echo", "LABELS": {"app": "echo"}}},
        "admin": {"address": {"pipe": {"path": str(work / "admin.sock")}}},
        "dynamic_resources": {
            "ads_config": {"api_type": "DELTA_GRPC" if delta else "GRPC", "transport_api_version": "V3",
                           "set_node_on_first_message_only": True,
                           "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]},
            "cds_config": ads, "lds_config": ads,
        },
        "static_resources": {"clusters": [pipe_cluster("xds-grpc", work / "ads.sock"),
                                          pipe_cluster("sds-grpc", work / "sds.sock")]},
    }


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=5)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(str(self._path))


def _admin(work: Path, path: str) -> str:
    conn = _UnixHTTP(work / "admin.sock")
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


class EnvoyUnderTest:
    def __init__(self, work: Path, process: subprocess.Popen[bytes], ads: AdsServer) -> None:
        self.work, self.process, self.ads = work, process, ads

    def config_dump(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(_admin(self.work, "/config_dump"))
        return result

    def stats(self) -> dict[str, int]:
        out = {}
        for line in _admin(self.work, "/stats").splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

    def dump_section(self, kind: str) -> dict[str, Any]:
        for config in self.config_dump()["configs"]:
            if config["@type"].endswith("." + kind):
                section: dict[str, Any] = config
                return section
        return {}

    def active_listeners(self) -> dict[str, dict[str, Any]]:
        listeners = self.dump_section("ListenersConfigDump").get("dynamic_listeners", [])
        return {item["name"]: item for item in listeners if "active_state" in item and "warming_state" not in item}

    def active_clusters(self) -> set[str]:
        clusters = self.dump_section("ClustersConfigDump").get("dynamic_active_clusters", [])
        return {item["cluster"]["name"] for item in clusters}

    def warming_clusters(self) -> set[str]:
        clusters = self.dump_section("ClustersConfigDump").get("dynamic_warming_clusters", [])
        return {item["cluster"]["name"] for item in clusters}


@contextlib.asynccontextmanager
async def envoy_with_istiod(registry: Registry, delta: bool, node_id: str = NODE,
                            netns_prelude: str = "") -> AsyncIterator[EnvoyUnderTest]:
    need_root()
    need(ENVOY.exists(), f"needs the envoy binary at {ENVOY}")
    need(shutil.which("unshare") is not None, "needs unshare (util-linux) for Envoy's own network namespace")
    work = Path(tempfile.mkdtemp(prefix="cp-envoy-", dir="/tmp"))
    ads = AdsServer(registry)
    server = grpc.aio.server()
    ads.register(server)
    server.add_insecure_port(f"unix:{work / 'ads.sock'}")
    sds = grpc.aio.server()
    sds_pb2_grpc.add_SecretDiscoveryServiceServicer_to_server(TestSds(), sds)
    sds.add_insecure_port(f"unix:{work / 'sds.sock'}")
    await server.start()
    await sds.start()
    (work / "envoy.json").write_text(json.dumps(bootstrap(work, delta, node_id)))
    log = (work / "envoy.log").open("wb")
    envoy = f"exec {ENVOY} -c {work / 'envoy.json'} --disable-hot-restart -l warning --concurrency 1"
    process = subprocess.Popen(["unshare", "--net", "sh", "-ec", f"{netns_prelude}\n{envoy}"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        def envoy_running() -> bool:
            assert process.poll() is None, f"Envoy exited: {(work / 'envoy.log').read_text()[-2000:]}"
            return (work / "admin.sock").exists()

        # Tests join Envoy's network namespace through its pid: until `unshare` and the prelude have run,
        # that is still the host's (an app started there is never reached), so wait for Envoy itself.
        await eventually(envoy_running, "Envoy to start in its network namespace")
        yield EnvoyUnderTest(work, process, ads)
    finally:
        stop_process(process)
        log.close()
        await server.stop(None)
        await sds.stop(None)
        shutil.rmtree(work, ignore_errors=True)


def nothing_rejected(envoy: EnvoyUnderTest) -> None:
    """Envoy took every LDS/CDS update and ACKed everything istiod-local sent."""
    stats = envoy.stats()
    assert stats.get("listener_manager.lds.update_rejected") == 0, stats
    assert stats.get("cluster_manager.cds.update_rejected") == 0, stats
    assert stats.get("listener_manager.lds.update_success", 0) >= 1
    assert stats.get("cluster_manager.cds.update_success", 0) >= 1
    connections = envoy.ads.connections()
    assert connections, "Envoy holds no ADS stream to istiod-local"
    for status in connections:
        assert status["watches"], status
        assert all(not w["nacked"] for w in status["watches"].values()), status
