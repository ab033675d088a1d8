"""`istiod-local` as a real process: serve (listen log, SIGTERM, restart keeps the root), pod-files, token."""

from __future__ import annotations

import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import LineCollector, serving_addresses

from istio_agent.pki.certs import build_csr, load_pem_chain, uri_sans, verify_signed_by
from istio_agent.pki.keys import generate_key
from istio_agent.protos import istioca_pb2, istioca_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
ISTIOD_LOCAL = str(ROOT / ".venv" / "bin" / "istiod-local")
SLEEP_ID = "spiffe://cluster.local/ns/default/sa/sleep"


class Served:
    """A running `istiod-local serve` whose stderr is collected by a reader thread."""

    def __init__(self, state: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [ISTIOD_LOCAL, "serve", "--state-dir", str(state), "--grpc-addr", "127.0.0.1:0",
             "--secure-grpc-addr", "127.0.0.1:0", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.out = LineCollector(self.proc.stderr)
        try:
            self.plain, self.secure = serving_addresses(self.proc, self.out)
        except AssertionError:
            self.kill()
            raise

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=20)
        self.out.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.kill()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ISTIOD_LOCAL, *args], capture_output=True, text=True, timeout=60)


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
def test_serve_signs_with_pod_files_and_stops_cleanly(tmp_path: Path, served: list[Served], sig: int) -> None:
    state, pod = tmp_path / "state", tmp_path / "pod"
    s = Served(state)
    served.append(s)
    done = _run("pod-files", "--state-dir", str(state), "--namespace", "default", "--service-account", "sleep",
                "--pod", "sleep-1", "--token-ttl", "10m", "--out", str(pod))
    assert done.returncode == 0, done.stderr
    root_file = pod / "var/run/secrets/istio/root-cert.pem"
    token_file = pod / "var/run/secrets/tokens/istio-token"
    assert root_file.read_bytes() == (state / "root-cert.pem").read_bytes()
    for f in (root_file, token_file):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644

    chain = _sign_over_tls(s.secure, root_file.read_bytes(), token_file.read_text())
    leaf, root = (load_pem_chain(c)[0] for c in chain)
    assert uri_sans(leaf) == [SLEEP_ID]
    assert verify_signed_by(leaf, root)
    assert root == load_pem_chain(root_file.read_bytes())[0]

    assert s.stop(sig) == 0
    log = s.out.text()
    assert "issued " + SLEEP_ID in log
    assert "stopped" in log


def test_restart_reuses_root_and_old_tokens_still_work(tmp_path: Path, served: list[Served]) -> None:
    state = tmp_path / "state"
    first = Served(state)
    served.append(first)
    root_before = (state / "root-cert.pem").read_bytes()
    token = _run("token", "--state-dir", str(state), "--namespace", "default", "--service-account", "sleep").stdout
    assert first.stop() == 0

    second = Served(state)
    served.append(second)
    assert (state / "root-cert.pem").read_bytes() == root_before
    chain = _sign_over_tls(second.secure, root_before, token.strip())
    assert load_pem_chain(chain[-1])[0] == load_pem_chain(root_before)[0]
    assert second.stop() == 0


def test_plaintext_port_refuses_another_identity(tmp_path: Path, served: list[Served]) -> None:
    state = tmp_path / "state"
    s = Served(state)
    served.append(s)
    token = _run("token", "--state-dir", str(state), "--namespace", "default", "--service-account", "other").stdout
    with grpc.insecure_channel(s.plain) as channel:
        stub = istioca_pb2_grpc.IstioCertificateServiceStub(channel)
        request = istioca_pb2.IstioCertificateRequest(csr=build_csr(generate_key("ECDSA"), [SLEEP_ID]).decode())
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateCertificate(request, metadata=[("authorization", f"Bearer {token.strip()}")], timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert s.stop() == 0
    assert "PERMISSION_DENIED" in s.out.text()


def test_bad_arguments_fail_with_a_message(tmp_path: Path) -> None:
    done = _run("serve", "--state-dir", str(tmp_path / "s"), "--max-cert-ttl", "soon")
    assert done.returncode != 0 and "soon" in done.stderr
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "root-key.pem").write_text("x")
    done = _run("pod-files", "--state-dir", str(tmp_path / "s"), "--namespace", "a", "--service-account", "b",
                "--out", str(tmp_path / "p"))
    assert done.returncode != 0 and "root-cert.pem" in done.stderr
