"""`istiod-local` as a real process: serve (listen log, SIGTERM, restart keeps the root), pod-files, token."""

from __future__ import annotations

import signal
import socket
import stat
from pathlib import Path

import grpc
import pytest
from launchers import IstiodLocal, RegistryFile, istiod_local_cli
from support import poll

from istio_agent.pki.certs import build_csr, load_pem_chain, uri_sans, verify_signed_by
from istio_agent.pki.keys import generate_key
from istio_agent.protos import istioca_pb2, istioca_pb2_grpc

SLEEP_ID = "spiffe://cluster.local/ns/default/sa/sleep"


@pytest.fixture
def registry() -> None:
    """`serve` without --registry: istiod-local's CA alone, which these tests are about."""
    return None


def _sign_over_tls(secure: str, root_pem: bytes, token: str) -> list[str]:
    creds = grpc.ssl_channel_credentials(root_certificates=root_pem)
    with grpc.secure_channel(secure, creds, options=[("grpc.ssl_target_name_override",
                                                      "istiod.istio-system.svc")]) as channel:
        stub = istioca_pb2_grpc.IstioCertificateServiceStub(channel)
        request = istioca_pb2.IstioCertificateRequest(
            csr=build_csr(generate_key("ECDSA"), [SLEEP_ID]).decode(), validity_duration=600)
        response = stub.CreateCertificate(request, metadata=[("authorization", f"Bearer {token}")], timeout=10)
    return list(response.cert_chain)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_signs_with_pod_files_and_stops_cleanly(tmp_path: Path, istiod: IstiodLocal, sig: int) -> None:
    state, pod = istiod.state_dir, tmp_path / "pod"
    istiod.pod_files(pod, service_account="sleep", pod="sleep-1", token_ttl="10m")
    root_file = pod / "var/run/secrets/istio/root-cert.pem"
    token_file = pod / "var/run/secrets/tokens/istio-token"
    assert root_file.read_bytes() == (state / "root-cert.pem").read_bytes()
    for f in (root_file, token_file):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644

    chain = _sign_over_tls(istiod.secure, root_file.read_bytes(), token_file.read_text())
    leaf, root = (load_pem_chain(c)[0] for c in chain)
    assert uri_sans(leaf) == [SLEEP_ID]
    assert verify_signed_by(leaf, root)
    assert root == load_pem_chain(root_file.read_bytes())[0]

    assert istiod.terminate(sig) == 0
    log = istiod.log_text()
    assert "issued " + SLEEP_ID in log
    assert "stopped" in log


def test_sigterm_stops_the_servers_in_reverse_start_order_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Every server of `serve` (gRPC, monitoring, Kubernetes API, registry watcher) on the lifecycle, for real:
    each start and stop logged (debug), the stops in reverse, then no port open and no file left beside the
    state directory's own."""
    registry = RegistryFile(tmp_path / "mesh.yaml", {"services": [], "workloads": [
        {"name": "echo-1", "namespace": "default", "serviceAccount": "echo", "ip": "10.1.0.5"}]})
    istiod = IstiodLocal(tmp_path / "state", registry=registry, kube_api_addr="127.0.0.1:0",
                         args=["--monitoring-addr", "127.0.0.1:0", "--log-level", "debug"])
    try:
        istiod.start()
        monitoring = poll(lambda: next((line.split("monitoring serving on ")[1].split()[0]
                                        for line in istiod.log_text().splitlines() if "monitoring serving on" in line),
                                       None), "the monitoring line", 20, istiod.log_text)
        state_files = sorted(p.name for p in istiod.state_dir.iterdir())
        assert istiod.terminate() == 0
    finally:
        istiod.stop()
    lines = istiod.log_text().splitlines()
    started = [line.split(": started ", 1)[1].split(":")[0] for line in lines if ": started " in line]
    stopped = [line.split(": stopped ", 1)[1] for line in lines if ": stopped " in line]
    assert started == ["CA and xDS gRPC", "monitoring", "Kubernetes API", "registry watcher"], istiod.log_text()
    assert stopped == started[::-1], istiod.log_text()
    assert "signal received, shutting down" in istiod.log_text()
    for address in (istiod.plaintext, istiod.secure, istiod.kube_api, monitoring):
        host, _, port = address.rpartition(":")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2).close()
    assert sorted(p.name for p in istiod.state_dir.iterdir()) == state_files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mesh.yaml", "state"]


def test_restart_reuses_root_and_old_tokens_still_work(istiod: IstiodLocal) -> None:
    root_before = istiod.root_pem()
    token = istiod.token(service_account="sleep")
    assert istiod.terminate() == 0

    istiod.start()  # the same state directory (and ports)
    assert istiod.root_pem() == root_before
    chain = _sign_over_tls(istiod.secure, root_before, token)
    assert load_pem_chain(chain[-1])[0] == load_pem_chain(root_before)[0]
    assert istiod.terminate() == 0


def test_plaintext_port_refuses_another_identity(istiod: IstiodLocal) -> None:
    token = istiod.token(service_account="other")
    with grpc.insecure_channel(istiod.plaintext) as channel:
        stub = istioca_pb2_grpc.IstioCertificateServiceStub(channel)
        request = istioca_pb2.IstioCertificateRequest(csr=build_csr(generate_key("ECDSA"), [SLEEP_ID]).decode())
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateCertificate(request, metadata=[("authorization", f"Bearer {token}")], timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert istiod.terminate() == 0
    assert "PERMISSION_DENIED" in istiod.log_text()


def test_bad_arguments_fail_with_a_message(tmp_path: Path) -> None:
    done = istiod_local_cli("serve", "--max-cert-ttl", "soon", state_dir=tmp_path / "s", check=False)
    assert done.returncode != 0 and "soon" in done.stderr
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "root-key.pem").write_text("x")
    done = istiod_local_cli("pod-files", "--namespace", "a", "--service-account", "b", "--out", str(tmp_path / "p"),
                            state_dir=tmp_path / "s", check=False)
    assert done.returncode != 0 and "root-cert.pem" in done.stderr


@pytest.mark.parametrize("args", [["--kube-api-addr", "127.0.0.1:6443"], ["--kube-api-addr=127.0.0.1:6443"]])
def test_the_kube_api_address_is_not_taken_through_args(tmp_path: Path, args: list[str]) -> None:
    """Through `args` start() would not wait for the API to serve, and a test would race its listener."""
    with pytest.raises(ValueError, match="kube_api_addr="):
        IstiodLocal(tmp_path / "state", args=args)
