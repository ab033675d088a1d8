"""`make run`: the local mesh on this machine, no Kubernetes.

Today it starts istiod-local (CA on 127.0.0.1:15010/15012) and one agent for
the pod `sleep-1` (namespace `default`, service account `sleep`) in its own
working directory laid out as a pod's, then prints where everything is. The
agent serves SDS on the pod's socket and writes its certificates to
`OUTPUT_CERTS`, rotating them. Ctrl-C stops everything it started.

Each piece runs through its real command line (`istiod-local serve`,
`istiod-local pod-files`, `pilot-agent proxy sidecar`), exactly as a user would
run them, so this is also a living example.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _wait_for(predicate: object, what: str, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                command = " ".join(map(str, proc.args))  # type: ignore[arg-type]
                raise SystemExit(f"{command} exited with {proc.returncode} while waiting for {what}")
        if callable(predicate) and predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _describe_cert(path: Path) -> str:
    from istio_agent.pki import certs

    leaf = certs.load_pem_chain(path.read_bytes())[0]
    expiry = time.strftime("%H:%M:%S", time.localtime(certs.not_after(leaf)))
    return f"SAN {', '.join(certs.uri_sans(leaf))}, serial {certs.serial_hex(leaf)}, expires {expiry}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="run", help="where state and pod directories go (default ./run)")
    parser.add_argument("--secret-ttl", default="1h", help="lifetime of workload certificates")
    parser.add_argument("--exit-after-ready", action="store_true", help="stop once the certificates exist (tests)")
    parser.add_argument("--grpc-port", type=int, default=15010)
    parser.add_argument("--secure-grpc-port", type=int, default=15012)
    args = parser.parse_args(argv)

    base = Path(args.dir).resolve()
    state = base / "istiod"
    pod = base / "pods" / "sleep-1"
    out = pod / "var/lib/istio/data"
    procs: list[subprocess.Popen[bytes]] = []

    def stop_all(*_: object) -> None:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        state.mkdir(parents=True, exist_ok=True)
        print(f"istiod-local: state in {state}, listening on 127.0.0.1:{args.grpc_port} and :{args.secure_grpc_port}")
        procs.append(subprocess.Popen([
            str(BIN / "istiod-local"), "serve", "--state-dir", str(state),
            "--grpc-addr", f"127.0.0.1:{args.grpc_port}", "--secure-grpc-addr", f"127.0.0.1:{args.secure_grpc_port}",
        ]))
        _wait_for(lambda: _port_open("127.0.0.1", args.secure_grpc_port), "istiod-local to listen", 30, procs)
        subprocess.run([
            str(BIN / "istiod-local"), "pod-files", "--state-dir", str(state), "--namespace", "default",
            "--service-account", "sleep", "--pod", "sleep-1", "--out", str(pod),
        ], check=True)
        agent_env = {
            **os.environ,
            "POD_NAME": "sleep-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "sleep",
            "INSTANCE_IP": "127.0.0.1", "CA_ADDR": f"localhost:{args.secure_grpc_port}",
            "OUTPUT_CERTS": str(out), "SECRET_TTL": args.secret_ttl,
        }
        print(f"pilot-agent: pod sleep-1 in {pod}")
        procs.append(subprocess.Popen([str(BIN / "pilot-agent"), "proxy", "sidecar"], cwd=pod, env=agent_env))
        chain = out / "cert-chain.pem"
        _wait_for(lambda: chain.exists() and (out / "root-cert.pem").exists(), "the first certificate", 60, procs)
        print(f"certificates: {out}/{{cert-chain,key,root-cert}}.pem")
        print(f"  leaf: {_describe_cert(chain)}")
        print(f"SDS socket: {pod / 'var/run/secrets/workload-spiffe-uds/socket'}")
        if args.exit_after_ready:
            return 0
        print("running; Ctrl-C stops everything")
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
        failed = [p for p in procs if p.poll() is not None]
        print(f"{' '.join(map(str, failed[0].args))} exited with {failed[0].returncode}", file=sys.stderr)  # type: ignore[arg-type]
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
