"""grpclib (pure Python, on h2) against grpcio (C core) for the agent's three gRPC roles (issue 13).

The question is whether the agent's floor can move: `import grpc` is the largest
single import of the sidecar agent. Each role is served by a fresh child process
that imports only that stack (plus what the role needs either way: asyncio,
protobuf, the Envoy/Istio messages), so every figure below belongs to the stack:

- **import**: RSS and anonymous memory of a process that imports asyncio and
  protobuf (the base) and then the stack (`grpc`, `grpc.aio` or `grpclib.client`,
  `grpclib.server`), beside the base alone;
- **SDS server** on a Unix socket, with the real Envoy (`.venv/bin/envoy`)
  connecting and asking for `default` and `ROOTCA` (a TLS cluster needs both):
  time from Envoy's start until both secrets are applied, and the server's RSS
  idle and while Envoy holds its streams;
- **CA client**: a fresh process generating a key and CSR and calling
  istiod-local's `IstioCertificateService/CreateCertificate` over TLS with the
  pod's token, as `minimal_ca_client.py` (grpcio, synchronous; the baseline of
  `bench_identity.py`) does: time from spawn to the files written, and RSS once
  the certificate is in;
- **xDS relay** between a gRPC client and an ADS server
  (`bench_xds_proxy_overhead.py`'s 5,000-cluster CDS server and ACKing client,
  reused), forwarding raw bytes (no message classes) over a Unix socket: the
  median push through each relay against straight from the server (the
  push_ratio), and the relay's RSS idle, peak (VmHWM) and steady after the pushes.
  The agent's own `XdsProxy` (grpcio) is measured beside the two minimal relays.

Arms alternate within each role, medians are compared. Prints the figures and,
last, one JSON object (`*_grpclib_over_grpcio` ratios, MB deltas).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_xds_proxy_overhead's ADS server and client
from support import free_port, poll, rss_mb, stop_process

HERE = Path(__file__).resolve().parent

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
PUSH_ROUNDS = int(os.environ.get("BENCH_PUSH_ROUNDS", "9"))
STACKS = ("grpcio", "grpclib")
SDS_SERVICE = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets"
CA_METHOD = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
ENVOY = Path(sys.executable).parent / "envoy"
TRIM_INTERVAL = 2.0


def memory() -> dict[str, float]:
    """This process's RSS, anonymous and file-backed resident memory, MiB."""
    pid = os.getpid()
    return {field: round(rss_mb(pid, field), 2) for field in ("VmRSS", "RssAnon", "RssFile")}


def import_stack(stack: str) -> None:
    if stack == "grpcio":
        import grpc.aio  # noqa: F401
    elif stack == "grpclib":
        import grpclib.client
        import grpclib.server  # noqa: F401


def raw_codec() -> Any:
    """grpclib's codec for bytes that are already serialized (the relay never decodes)."""
    from grpclib.encoding.base import CodecBase

    class RawCodec(CodecBase):
        __content_subtype__ = "proto"

        def encode(self, message: Any, message_type: Any) -> bytes:
            return bytes(message)

        def decode(self, data: bytes, message_type: Any) -> Any:
            return data

    return RawCodec()


# ---- children --------------------------------------------------------------------------------------------


def child_import(stack: str) -> None:
    import asyncio  # noqa: F401

    import google.protobuf.message  # noqa: F401

    base = memory()
    import_stack(stack)
    print(json.dumps({"base": base, "after": memory()}))


async def child_sds(stack: str, socket: Path, cert_dir: Path) -> None:
    """An SDS server handing out `default` (chain + key) and `ROOTCA`, answering each new subscription."""
    from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    import_stack(stack)
    chain, key = (cert_dir / "cert.pem").read_bytes(), (cert_dir / "key.pem").read_bytes()
    counter = 0

    def response(names: list[str]) -> Any:
        nonlocal counter
        counter += 1
        out = discovery_pb2.DiscoveryResponse(type_url="type.googleapis.com/envoy.extensions.transport_sockets.tls"
                                              ".v3.Secret", version_info=str(counter), nonce=f"n{counter}")
        for name in names:
            secret = secret_pb2.Secret(name=name)
            if name == "ROOTCA":
                secret.validation_context.trusted_ca.inline_bytes = chain
            else:
                secret.tls_certificate.certificate_chain.inline_bytes = chain
                secret.tls_certificate.private_key.inline_bytes = key
            out.resources.add().Pack(secret)
        return out

    if stack == "grpcio":
        import grpc
        import grpc.aio

        async def handler(requests: Any, context: Any) -> None:
            async for request in requests:
                if not request.response_nonce:
                    await context.write(response(list(request.resource_names)))

        server = grpc.aio.server()
        method = grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=discovery_pb2.DiscoveryResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "envoy.service.secret.v3.SecretDiscoveryService", {"StreamSecrets": method}),))
        server.add_insecure_port(f"unix:{socket}")
        await server.start()
    else:
        from grpclib.const import Cardinality, Handler
        from grpclib.server import Server

        async def lib_handler(stream: Any) -> None:
            async for request in stream:
                if not request.response_nonce:
                    await stream.send_message(response(list(request.resource_names)))

        class Service:
            def __mapping__(self) -> dict[str, Handler]:
                return {SDS_SERVICE: Handler(lib_handler, Cardinality.STREAM_STREAM,
                                             discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse)}

        lib_server = Server([Service()])
        await lib_server.start(path=str(socket))
    await asyncio.Event().wait()


async def relay_until_first_ends(*directions: Coroutine[Any, Any, None]) -> None:
    """Run both directions of a minimal relay until one ends (a peer went away), then the other."""
    async def quietly(direction: Coroutine[Any, Any, None]) -> None:
        with contextlib.suppress(Exception):  # the peer's going away shows as an error of the other side
            await direction

    tasks = [asyncio.create_task(quietly(d)) for d in directions]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


async def child_relay(stack: str, socket: Path, port: int) -> None:
    """A pass-through ADS relay: one upstream stream per downstream stream, raw bytes both ways."""
    from istio_agent.xds.core import routing

    if stack == "xdsproxy":
        # As in the agent: malloc arenas capped before any thread starts, the heap trimmer running (every
        # TRIM_INTERVAL seconds here rather than 15, so that "steady" comes after a trim in a short run).
        from istio_agent import memory
        from istio_agent.xds import XdsProxy, XdsProxyOptions
        from istio_agent.xds.upstream import UpstreamSettings

        memory.limit_malloc_arenas()
        await memory.MemoryTrimmer(interval=TRIM_INTERVAL).start()
        settings = UpstreamSettings(f"127.0.0.1:{port}", insecure=True, send_token=False)
        await XdsProxy(XdsProxyOptions(socket, settings)).start()
        await asyncio.Event().wait()
        return
    import_stack(stack)
    if stack == "grpcio":
        import grpc
        import grpc.aio

        async def handler(_requests: Any, context: Any) -> None:
            options = [("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
                call: Any = channel.stream_stream(routing.SOTW_METHOD)()

                async def down() -> None:
                    while (data := await context.read()) is not grpc.aio.EOF:
                        await call.write(data)

                async def up() -> None:
                    while (data := await call.read()) is not grpc.aio.EOF:
                        await context.write(data)

                await relay_until_first_ends(down(), up())
                call.cancel()

        server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            routing.ADS_SERVICE, {"StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(handler)}),))
        server.add_insecure_port(f"unix:{socket}")
        await server.start()
    else:
        from grpclib.client import Channel
        from grpclib.const import Cardinality, Handler
        from grpclib.server import Server

        codec = raw_codec()

        async def lib_handler(stream: Any) -> None:
            channel = Channel("127.0.0.1", port, codec=codec)
            try:
                request: Any = channel.request
                async with request(routing.SOTW_METHOD, Cardinality.STREAM_STREAM, None, None) as call:
                    await call.send_request()

                    async def down() -> None:
                        async for data in stream:
                            await call.send_message(data)

                    async def up() -> None:
                        async for data in call:
                            await stream.send_message(data)

                    await relay_until_first_ends(down(), up())
                    await call.cancel()
            finally:
                channel.close()

        class Service:
            def __mapping__(self) -> dict[str, Handler]:
                return {routing.SOTW_METHOD: Handler(lib_handler, Cardinality.STREAM_STREAM, None, None)}

        lib_server = Server([Service()], codec=codec)
        await lib_server.start(path=str(socket))
    await asyncio.Event().wait()


def child_ca(stack: str, pod: Path, out: Path, address: str) -> None:
    """minimal_ca_client.py's work (key, CSR, one call, three files) on asyncio with `stack`; prints RSS."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from istio_agent.eventloop import run
    from istio_agent.protos import istioca_pb2

    import_stack(stack)
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://cluster.local/ns/default/sa/sleep")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).add_extension(san, False)
    csr_pem = csr.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()
    root = (pod / "var/run/secrets/istio/root-cert.pem").read_bytes()
    token = (pod / "var/run/secrets/tokens/istio-token").read_text().strip()
    metadata = [("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes")]
    request = istioca_pb2.IstioCertificateRequest(csr=csr_pem, validity_duration=3600)
    server_name = "istiod.istio-system.svc"

    async def call() -> Any:
        if stack == "grpcio":
            import grpc.aio

            creds = grpc.ssl_channel_credentials(root_certificates=root)
            options = [("grpc.ssl_target_name_override", server_name)]
            async with grpc.aio.secure_channel(address, creds, options=options) as channel:
                rpc = channel.unary_unary(CA_METHOD, request_serializer=istioca_pb2.IstioCertificateRequest
                                          .SerializeToString,
                                          response_deserializer=istioca_pb2.IstioCertificateResponse.FromString)
                return await rpc(request, metadata=metadata)
        import ssl

        from grpclib.client import Channel
        from grpclib.config import Configuration
        from grpclib.const import Cardinality

        context = ssl.create_default_context(cadata=root.decode())
        context.set_alpn_protocols(["h2"])
        host, port = address.rsplit(":", 1)
        channel = Channel(host, int(port), ssl=context, config=Configuration(ssl_target_name_override=server_name))
        try:
            async with channel.request(CA_METHOD, Cardinality.UNARY_UNARY, istioca_pb2.IstioCertificateRequest,
                                       istioca_pb2.IstioCertificateResponse, metadata=metadata) as stream:
                await stream.send_message(request, end=True)
                reply = await stream.recv_message()
                await stream.recv_trailing_metadata()
                return reply
        finally:
            channel.close()

    response = run(call())
    out.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    (out / "key.pem").write_bytes(key_pem)
    (out / "root-cert.pem").write_text(response.cert_chain[-1])
    (out / "cert-chain.pem").write_text("".join(response.cert_chain[:-1]))
    print(json.dumps(memory()))


# ---- the parent ------------------------------------------------------------------------------------------


def me(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def measure_imports() -> dict[str, dict[str, float]]:
    """Median over ROUNDS fresh processes of what each stack's import adds to asyncio + protobuf."""
    out: dict[str, dict[str, float]] = {}
    for stack in ("none", *STACKS):
        runs = [json.loads(subprocess.run(me("--child-import", stack), check=True, capture_output=True,
                                          text=True).stdout) for _ in range(ROUNDS)]
        after = {field: statistics.median(r["after"][field] for r in runs) for field in ("VmRSS", "RssAnon", "RssFile")}
        out[stack] = after
    base = out["none"]
    for stack in STACKS:
        figures = out[stack]
        print(f"import {stack:8s}: RSS {figures['VmRSS']:.1f} MB (+{figures['VmRSS'] - base['VmRSS']:.1f}), "
              f"anonymous {figures['RssAnon']:.1f} MB (+{figures['RssAnon'] - base['RssAnon']:.1f}), "
              f"file-backed {figures['RssFile']:.1f} MB (+{figures['RssFile'] - base['RssFile']:.1f}); "
              f"asyncio + protobuf alone: RSS {base['VmRSS']:.1f}, anonymous {base['RssAnon']:.1f}")
    return out


def self_signed(directory: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bench")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))


def sds_bootstrap(admin_port: int, socket: Path) -> dict[str, Any]:
    """Envoy with one TLS cluster whose certificate and validation context come from SDS on `socket`."""
    def sds(name: str) -> dict[str, Any]:
        return {"name": name, "sds_config": {"resource_api_version": "V3", "api_config_source": {
            "api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}]}}}

    def endpoint(address: dict[str, Any]) -> dict[str, Any]:
        return {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]}

    return {
        "node": {"id": "sidecar~127.0.0.1~bench.default~default.svc.cluster.local", "cluster": "bench"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"clusters": [
            {"name": "sds-grpc", "type": "STATIC", "connect_timeout": "1s",
             "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                 "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                 "explicit_http_config": {"http2_protocol_options": {}}}},
             "load_assignment": {"cluster_name": "sds-grpc", **endpoint({"pipe": {"path": str(socket)}})}},
            {"name": "mtls", "type": "STATIC", "connect_timeout": "1s",
             "load_assignment": {"cluster_name": "mtls",
                                 **endpoint({"socket_address": {"address": "127.0.0.1", "port_value": 9}})},
             "transport_socket": {"name": "tls", "typed_config": {
                 "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                 "common_tls_context": {"tls_certificate_sds_secret_configs": [sds("default")],
                                        "validation_context_sds_secret_config": sds("ROOTCA")}}}},
        ]},
    }


def envoy_stat(admin_port: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats?filter=^{name}$", timeout=2) as reply:
        text = reply.read().decode()
    return int(text.split(": ")[1]) if ": " in text else 0


def secrets_applied(admin_port: int) -> Callable[[], bool]:
    """Whether the Envoy on `admin_port` has applied both `default` and `ROOTCA`."""
    return lambda: (envoy_stat(admin_port, r"sds\.default\.update_success") >= 1
                    and envoy_stat(admin_port, r"sds\.ROOTCA\.update_success") >= 1)


def tail_of(log: Path) -> Callable[[], str]:
    return lambda: log.read_text()[-2000:]


def wait_socket(path: Path, proc: subprocess.Popen[Any], what: str) -> None:
    def made() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        return path.is_socket()

    poll(made, what, 30, interval=0.01)


def measure_sds(base: Path) -> dict[str, dict[str, float]]:
    """Per stack: Envoy start → both secrets applied (median), server RSS idle and serving."""
    certs = base / "certs"
    certs.mkdir()
    self_signed(certs)
    times: dict[str, list[float]] = {s: [] for s in STACKS}
    idle: dict[str, list[float]] = {s: [] for s in STACKS}
    serving: dict[str, list[float]] = {s: [] for s in STACKS}
    anon: dict[str, list[float]] = {s: [] for s in STACKS}
    for round_no in range(ROUNDS):
        for stack in STACKS if round_no % 2 == 0 else reversed(STACKS):
            work = base / f"sds-{stack}-{round_no}"
            work.mkdir()
            socket = work / "sds.sock"
            server = subprocess.Popen(me("--child-sds", stack, str(socket), str(certs)))
            envoy = None
            try:
                wait_socket(socket, server, f"the {stack} SDS server")
                time.sleep(0.3)
                idle[stack].append(rss_mb(server.pid))
                admin = free_port()
                (work / "envoy.json").write_text(json.dumps(sds_bootstrap(admin, socket)))
                start = time.perf_counter()
                envoy = subprocess.Popen([str(ENVOY), "-c", str(work / "envoy.json"), "--base-id", str(admin),
                                          "-l", "error", "--disable-hot-restart"],
                                         stdout=subprocess.DEVNULL, stderr=(work / "envoy.log").open("w"))
                poll(secrets_applied(admin), "Envoy's SDS secrets", 30, tail_of(work / "envoy.log"), interval=0.005,
                     retry_on=(OSError,))
                times[stack].append(time.perf_counter() - start)
                time.sleep(0.5)
                serving[stack].append(rss_mb(server.pid))
                anon[stack].append(rss_mb(server.pid, "RssAnon"))
            finally:
                stop_process(envoy)
                stop_process(server)
    out = {}
    for stack in STACKS:
        out[stack] = {"secrets_ms": statistics.median(times[stack]) * 1000, "rss_idle": statistics.median(idle[stack]),
                      "rss_serving": statistics.median(serving[stack]), "anon_serving": statistics.median(anon[stack])}
        f = out[stack]
        print(f"SDS server {stack:8s}: Envoy start to both secrets {f['secrets_ms']:.0f} ms; server RSS idle "
              f"{f['rss_idle']:.1f} MB, serving Envoy {f['rss_serving']:.1f} MB (anonymous {f['anon_serving']:.1f})")
    return out


def measure_ca(base: Path) -> dict[str, dict[str, float]]:
    """Per stack (and minimal_ca_client.py): spawn → certificate files, median; RSS with the certificate."""
    from launchers import IstiodLocal

    arms = ("minimal", *STACKS)
    times: dict[str, list[float]] = {a: [] for a in arms}
    rss: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    with IstiodLocal(base / "state") as server:
        pod = server.pod_files(base / "pod", service_account="sleep", pod="sleep-1")
        address = server.secure_address
        for round_no in range(ROUNDS + 1):
            for arm in arms if round_no % 2 == 0 else reversed(arms):
                out = base / f"ca-{arm}-{round_no}"
                if arm == "minimal":
                    argv = [sys.executable, str(HERE / "minimal_ca_client.py"), str(pod), str(out), address, "ECDSA"]
                else:
                    argv = me("--child-ca", arm, str(pod), str(out), address)
                start = time.perf_counter()
                done = subprocess.run(argv, check=True, capture_output=True, text=True)
                elapsed = time.perf_counter() - start
                assert (out / "cert-chain.pem").read_text().startswith("-----BEGIN CERTIFICATE")
                if round_no == 0:
                    continue  # warm-up: istiod-local's first signatures, the page cache
                times[arm].append(elapsed)
                if arm != "minimal":
                    rss[arm].append(json.loads(done.stdout.splitlines()[-1]))
    result: dict[str, dict[str, float]] = {}
    for arm in arms:
        result[arm] = {"cert_ms": statistics.median(times[arm]) * 1000}
        if rss[arm]:
            result[arm]["rss"] = statistics.median(r["VmRSS"] for r in rss[arm])
            result[arm]["anon"] = statistics.median(r["RssAnon"] for r in rss[arm])
    minimal = result["minimal"]["cert_ms"]
    for arm in STACKS:
        f = result[arm]
        print(f"CA client {arm:8s} (asyncio): spawn to certificate {f['cert_ms']:.0f} ms "
              f"({f['cert_ms'] / minimal:.2f}x minimal_ca_client.py's {minimal:.0f} ms); RSS with the certificate "
              f"{f['rss']:.1f} MB (anonymous {f['anon']:.1f})")
    return result


def minor_faults(pid: int) -> int:
    """Minor page faults of `pid` so far (/proc/PID/stat field 10): pages mapped anew, e.g. for freed buffers."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


async def rss_with_stream_open(target: str, pid: int) -> tuple[float, float]:
    """(RSS, anonymous) of the relay `pid` once a stream that received two pushes has been idle for a trim.

    Envoy keeps its stream for good: whatever the relay keeps of the last push stays for as long.
    """
    import grpc.aio
    from bench_xds_proxy_overhead import CDS, SOTW

    from istio_agent.xds.core import messages

    async with grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)]) as channel:
        call: Any = channel.stream_stream(SOTW)()
        await call.write(messages.encode_request(CDS, delta=False))
        head = messages.response_head(await call.read(), delta=False)
        await call.write(messages.encode_request(CDS, delta=False, response_nonce=head.nonce))
        await call.read()  # the second push; not ACKed, so the server sends no third
        await asyncio.sleep(TRIM_INTERVAL + 1.0)
        figures = rss_mb(pid), rss_mb(pid, "RssAnon")
        call.cancel()
    return figures


async def measure_relay_async(base: Path) -> dict[str, dict[str, float]]:
    from bench_xds_proxy_overhead import CLUSTERS, cds_response, push_times

    arms = tuple(os.environ.get("BENCH_RELAYS", "grpcio,grpclib,xdsproxy").split(","))
    port_file = base / "ads-port"
    ads = subprocess.Popen([sys.executable, str(HERE / "bench_xds_proxy_overhead.py"), "--serve-ads", str(port_file)])
    relays: dict[str, subprocess.Popen[bytes]] = {}
    try:
        poll(lambda: port_file.is_file() and port_file.stat().st_size > 0, "the ADS server", 30, interval=0.01)
        port = int(port_file.read_text())
        sockets = {arm: base / f"relay-{arm}.sock" for arm in arms}
        for arm in arms:
            relays[arm] = subprocess.Popen(me("--child-relay", arm, str(sockets[arm]), str(port)))
        for arm in arms:
            wait_socket(sockets[arm], relays[arm], f"the {arm} relay")
        await asyncio.sleep(0.5)
        idle = {arm: rss_mb(relays[arm].pid) for arm in arms}
        idle_anon = {arm: rss_mb(relays[arm].pid, "RssAnon") for arm in arms}
        pushes: dict[str, list[float]] = {arm: [] for arm in ("direct", *arms)}
        faults: dict[str, int] = dict.fromkeys(arms, 0)  # the relay's minor page faults during its pushes
        for round_no in range(3):
            order = ["direct", *arms]
            if round_no % 2:
                order.reverse()
            for arm in order:
                target = f"127.0.0.1:{port}" if arm == "direct" else f"unix:{sockets[arm]}"
                if arm != "direct":
                    faults[arm] -= minor_faults(relays[arm].pid)
                pushes[arm] += await push_times(target, PUSH_ROUNDS // 3)
                if arm != "direct":
                    faults[arm] += minor_faults(relays[arm].pid)
        await asyncio.sleep(TRIM_INTERVAL + 1.0)
        open_steady = {arm: await rss_with_stream_open(f"unix:{sockets[arm]}", relays[arm].pid) for arm in arms}
        result: dict[str, dict[str, float]] = {}
        direct_ms = statistics.median(pushes["direct"]) * 1000
        size = len(cds_response(CLUSTERS))
        print(f"xDS relay: {CLUSTERS}-cluster CDS push of {size / 1e6:.2f} MB, {len(pushes['direct'])} pushes per arm; "
              f"straight from the server {direct_ms:.1f} ms median")
        for arm in arms:
            pid = relays[arm].pid
            ms = statistics.median(pushes[arm]) * 1000
            result[arm] = {"push_ms": ms, "push_ratio": ms / direct_ms, "rss_idle": idle[arm],
                           "faults_per_push": faults[arm] / len(pushes[arm]),
                           "anon_idle": idle_anon[arm], "rss_peak": rss_mb(pid, "VmHWM"), "rss_steady": rss_mb(pid),
                           "anon_steady": rss_mb(pid, "RssAnon"), "rss_open": open_steady[arm][0],
                           "anon_open": open_steady[arm][1]}
            f = result[arm]
            print(f"xDS relay {arm:8s}: push {ms:.1f} ms, ratio {f['push_ratio']:.2f}x, "
                  f"{f['faults_per_push']:.0f} minor page faults per push; "
                  f"RSS idle {f['rss_idle']:.1f} MB "
                  f"(anonymous {f['anon_idle']:.1f}), peak {f['rss_peak']:.1f}, steady after {f['rss_steady']:.1f} "
                  f"(anonymous {f['anon_steady']:.1f}); with a stream open after its push {f['rss_open']:.1f} "
                  f"(anonymous {f['anon_open']:.1f})")
        result["direct"] = {"push_ms": direct_ms}
        return result
    finally:
        for proc in (*relays.values(), ads):
            stop_process(proc)


def main() -> None:
    if not ENVOY.exists():
        print(f"bench_grpc_stacks needs Envoy at {ENVOY}", file=sys.stderr)
        sys.exit(2)
    base = Path(tempfile.mkdtemp(prefix="bench-grpc-stacks-"))
    try:
        imports = measure_imports()
        sds = measure_sds(base)
        ca = measure_ca(base)
        from istio_agent.eventloop import run

        relay = run(measure_relay_async(base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    gio, glib = "grpcio", "grpclib"
    figures = {
        "import_rss_mb_grpcio": round(imports[gio]["VmRSS"] - imports["none"]["VmRSS"], 1),
        "import_rss_mb_grpclib": round(imports[glib]["VmRSS"] - imports["none"]["VmRSS"], 1),
        "import_anon_mb_grpcio": round(imports[gio]["RssAnon"] - imports["none"]["RssAnon"], 1),
        "import_anon_mb_grpclib": round(imports[glib]["RssAnon"] - imports["none"]["RssAnon"], 1),
        "sds_secrets_ms_grpclib_over_grpcio": round(sds[glib]["secrets_ms"] / sds[gio]["secrets_ms"], 3),
        "sds_rss_serving_mb_grpcio": round(sds[gio]["rss_serving"], 1),
        "sds_rss_serving_mb_grpclib": round(sds[glib]["rss_serving"], 1),
        "sds_anon_serving_mb_grpcio": round(sds[gio]["anon_serving"], 1),
        "sds_anon_serving_mb_grpclib": round(sds[glib]["anon_serving"], 1),
        "ca_cert_ratio_grpcio_over_minimal": round(ca[gio]["cert_ms"] / ca["minimal"]["cert_ms"], 3),
        "ca_cert_ratio_grpclib_over_minimal": round(ca[glib]["cert_ms"] / ca["minimal"]["cert_ms"], 3),
        "ca_rss_mb_grpcio": round(ca[gio]["rss"], 1),
        "ca_rss_mb_grpclib": round(ca[glib]["rss"], 1),
        "ca_anon_mb_grpcio": round(ca[gio]["anon"], 1),
        "ca_anon_mb_grpclib": round(ca[glib]["anon"], 1),
        "relay_push_ratio_grpcio": round(relay[gio]["push_ratio"], 3),
        "relay_push_ratio_grpclib": round(relay[glib]["push_ratio"], 3),
        "relay_push_ratio_xdsproxy": round(relay["xdsproxy"]["push_ratio"], 3),
        "relay_rss_idle_mb_grpcio": round(relay[gio]["rss_idle"], 1),
        "relay_rss_idle_mb_grpclib": round(relay[glib]["rss_idle"], 1),
        "relay_rss_peak_mb_grpcio": round(relay[gio]["rss_peak"], 1),
        "relay_rss_peak_mb_grpclib": round(relay[glib]["rss_peak"], 1),
        "relay_rss_steady_mb_grpcio": round(relay[gio]["rss_steady"], 1),
        "relay_rss_steady_mb_grpclib": round(relay[glib]["rss_steady"], 1),
        "relay_anon_steady_mb_grpcio": round(relay[gio]["anon_steady"], 1),
        "relay_anon_steady_mb_grpclib": round(relay[glib]["anon_steady"], 1),
        "relay_rss_steady_mb_xdsproxy": round(relay["xdsproxy"]["rss_steady"], 1),
        "relay_rss_open_mb_grpcio": round(relay[gio]["rss_open"], 1),
        "relay_rss_open_mb_grpclib": round(relay[glib]["rss_open"], 1),
        "relay_rss_open_mb_xdsproxy": round(relay["xdsproxy"]["rss_open"], 1),
        "relay_anon_open_mb_xdsproxy": round(relay["xdsproxy"]["anon_open"], 1),
        "relay_faults_per_push_xdsproxy": round(relay["xdsproxy"]["faults_per_push"]),
        "relay_rss_peak_mb_xdsproxy": round(relay["xdsproxy"]["rss_peak"], 1),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "--child-import":
        child_import(sys.argv[2])
    elif mode == "--child-sds":
        from istio_agent.eventloop import run as run_loop

        run_loop(child_sds(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])))
    elif mode == "--child-relay":
        from istio_agent.eventloop import run as run_loop

        run_loop(child_relay(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])))
    elif mode == "--child-ca":
        child_ca(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5])
    else:
        main()
