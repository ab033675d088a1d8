"""An SDS client that runs as another user: one StreamSecrets request, its answer printed as one JSON line.

Usage: python sds_caller.py <uid> <gid> <groups,comma-separated or -> <socket> <name>...

It starts as root (the venv's interpreter lives under a 0700 home that other uids
cannot enter), imports everything it needs, then drops to the given uid, gid and
supplementary groups before it connects, so the agent sees it as that user. It
prints {"secrets": {name: {"chain": ..., "key": ..., "root": ...}}} for a response,
or {"code": ..., "details": ...} when the stream ends with an error.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator

import grpc
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
NODE_ID = "sidecar~127.0.0.1~sleep-1.default~default.svc.cluster.local"


def drop_privileges(uid: int, gid: int, groups: list[int]) -> None:
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    assert os.geteuid() == uid and os.getegid() == gid


def ask(channel: grpc.Channel, names: list[str]) -> dict[str, object]:
    answered = threading.Event()

    def requests() -> Iterator[discovery_pb2.DiscoveryRequest]:
        request = discovery_pb2.DiscoveryRequest(type_url=SECRET_TYPE, resource_names=names)
        request.node.id = NODE_ID
        yield request
        answered.wait(30)  # keep the stream open until the answer is in

    try:
        for response in sds_pb2_grpc.SecretDiscoveryServiceStub(channel).StreamSecrets(requests(), timeout=30):
            answered.set()
            out: dict[str, dict[str, str]] = {}
            for resource in response.resources:
                secret = secret_pb2.Secret()
                resource.Unpack(secret)
                out[secret.name] = {
                    "chain": secret.tls_certificate.certificate_chain.inline_bytes.decode(),
                    "key": secret.tls_certificate.private_key.inline_bytes.decode(),
                    "root": secret.validation_context.trusted_ca.inline_bytes.decode(),
                }
            return {"secrets": out}
        return {"code": "EOF", "details": "the stream ended without a response"}
    except grpc.RpcError as exc:
        return {"code": exc.code().name, "details": exc.details()}
    finally:
        answered.set()
        channel.close()


def main() -> None:
    uid, gid, groups, socket_path, *names = sys.argv[1:]
    # The channel (and the grpc modules it imports lazily) is made while the venv is still readable;
    # it connects only on the first call, after the drop, so the agent still sees the new uid.
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    drop_privileges(int(uid), int(gid), [] if groups == "-" else [int(g) for g in groups.split(",")])
    print(json.dumps(ask(channel, names)), flush=True)


if __name__ == "__main__":
    main()
