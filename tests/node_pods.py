"""Asking a local node's pods: the echo app's GET from inside a pod, a gRPC call through a pod's long-running
proxyless client, and the mTLS checks the mesh tests make on what the echo app saw.

One place for what several node-level tests (our agents on istiod-local, the Go agent beside them, the real
istiod) ask their pods, so each test module keeps only what is its own.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from support import poll

from istiod_local.node.local_node import LocalNode, Pod

PY = sys.executable
ECHO_GET = [PY, "-m", "istiod_local.node.echo_app", "get"]
CONTROL_PORT = 8081  # the gRPC client app's control port (`istiod_local.node.grpc_apps client`)


def spiffe_id(service_account: str, namespace: str = "default") -> str:
    return f"spiffe://cluster.local/ns/{namespace}/sa/{service_account}"


class PodClient:
    """The pods of one local node, asked by name."""

    def __init__(self, node: LocalNode, pods: dict[str, Pod]) -> None:
        self.node, self.pods = node, pods

    def get(self, pod: str, url: str, timeout: float = 5.0, uid: int | None = None,
            gid: int | None = None) -> dict[str, Any]:
        """The echo app's GET of `url` from inside `pod` (its JSON answer, or `{"error": stderr}`)."""
        done = self.node.exec(self.pods[pod], [*ECHO_GET, url, "--timeout", str(timeout)], uid=uid, gid=gid)
        answer: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr}
        return answer

    def answered(self, pod: str, url: str) -> dict[str, Any]:
        """The echo app's answer to a GET from `pod`, retried until a 200 (a push may still be on its way)."""
        answer: dict[str, Any] = poll(lambda: (a := self.get(pod, url)).get("status") == 200 and a,
                                      f"{url} to answer {pod}", timeout=30, interval=0.5)
        return answer

    def call(self, pod: str, target: str, fresh: bool = True) -> dict[str, Any]:
        """One RPC from the pod's long-running gRPC client, retried until it succeeds: on a new channel, or
        (`fresh=False`) on the one it keeps for `target`, whose xDS stream then stays open."""
        url = f"http://127.0.0.1:{CONTROL_PORT}/call?target={target}&fresh={int(fresh)}"

        def once() -> dict[str, Any] | None:
            answer = self.get(pod, url)
            body = answer.get("body")
            return body if answer.get("status") == 200 and isinstance(body, dict) and body.get("ok") else None

        result: dict[str, Any] = poll(once, f"{pod} to call {target}", timeout=30, interval=0.5)
        return result

    def assert_mtls(self, client: str, url: str, server_pod: str, server_sa: str, client_sa: str) -> None:
        """A GET from `client` reached `server_pod`, whose Envoy verified the client's identity (URI=) and
        presented its own (By=) in the x-forwarded-client-cert it added."""
        answer = self.answered(client, url)
        assert answer["body"]["pod"] == server_pod
        xfcc = answer["body"]["headers"]["x-forwarded-client-cert"]
        assert f"By={spiffe_id(server_sa)};" in xfcc and xfcc.endswith(f"URI={spiffe_id(client_sa)}"), xfcc

    def assert_plaintext_refused(self, client: str, server: str) -> None:
        """A plaintext connection from `client`'s capture-exempt user (1337) to `server`'s app port is refused
        (its sidecar's inbound closes it: STRICT mTLS)."""
        answer = self.get(client, f"http://{self.pods[server].ip}:8080/", timeout=3, uid=1337, gid=1337)
        assert "error" in answer and answer.get("status") != 200, answer
